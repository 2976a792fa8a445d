//! The time stamps of the flight recorder and the statistics: CLOCK_MONOTONIC nanoseconds, read
//! cheaply. Every recorded operation takes two; through the vDSO each costs about 25 ns here,
//! a tenth of a small collective, while the CPU's time-stamp counter costs about 10 ns.
//!
//! Where the counter is invariant (constant rate, running in every power state, the same on
//! every core: CPUID's "invariant TSC"), [`now_ns`] extrapolates from an *anchor*, a pair of
//! counter and clock readings taken at most [`REANCHOR_NS`] ago by the same thread, at the rate
//! measured between the thread's first anchor and the latest. So each reading is within a few
//! tens of nanoseconds of the clock itself (the rate's error over one re-anchoring interval),
//! comparable between the processes of a host like the clock, and follows the clock's own
//! adjustments. Elsewhere, and until a thread has measured the rate, it reads the clock.
//!
//! An anchor is only taken from a clock reading that two counter readings [`PAIR_TICKS`] apart
//! at most enclose: a thread preempted between its counter and clock readings (tens of
//! microseconds on a busy virtual machine) would otherwise pair them wrongly, and every reading
//! extrapolated from that anchor, and the rate measured from it, would be off by as much. The
//! pairs' own uncertainty (half of [`PAIR_TICKS`]) weighs on the rate in proportion to the
//! interval it is measured over, so an anchor extrapolates over a sixteenth of that interval at
//! most ([`REANCHOR_NS`] once it is long enough). A new anchor that disagrees with the
//! extrapolation by more than [`RESTART_NS`] (the counter ran while the clock did not: a
//! suspended machine, a paused VM) starts the rate's measurement over. Where no tight pair can
//! be had (a trapped counter, a clock read through a system call), the thread reads the clock
//! and tries again [`REANCHOR_NS`] later.

use std::cell::Cell;

use super::monotonic_ns;

/// Longest extrapolation from one anchor.
const REANCHOR_NS: u64 = 1_000_000;
/// Shortest interval between two anchors over which the rate is measured.
const RATE_INTERVAL_NS: u64 = 100_000;
/// Widest pair of counter readings an anchor's clock reading may lie between (a clock reading
/// through the vDSO takes about a hundred ticks; well under a microsecond at any rate).
const PAIR_TICKS: u64 = 2_000;
/// Largest disagreement between a new anchor and the extrapolation that keeps the rate.
const RESTART_NS: u64 = 10_000;

/// A counter reading and the clock at that moment, with the rate to extrapolate at.
#[derive(Clone, Copy)]
struct Anchor {
    tsc: u64,
    ns: u64,
    /// Nanoseconds per counter tick, in 32.32 fixed point (0: not measured yet).
    scale: u64,
    /// Ticks after `tsc` up to which the anchor is used.
    max_ticks: u64,
    /// The thread's first anchor (counter, clock), from which the rate is measured: the longer
    /// the interval, the smaller the error of the pairs weighs.
    first: (u64, u64),
    /// The clock reading before which no new pair is tried, after three failed tries (0: none).
    retry_at: u64,
}

thread_local! {
    static ANCHOR: Cell<Anchor> =
        const { Cell::new(Anchor { tsc: 0, ns: 0, scale: 0, max_ticks: 0, first: (0, 0), retry_at: 0 }) };
}

/// CLOCK_MONOTONIC in nanoseconds (see the module documentation for how it is read).
#[inline]
pub fn now_ns() -> u64 {
    match counter() {
        Some(t) => from_counter(t),
        None => monotonic_ns(),
    }
}

/// The reading of counter value `t`: inline while the anchor holds (every call but one a
/// millisecond), [`reanchor`] otherwise.
#[inline]
fn from_counter(t: u64) -> u64 {
    let a = ANCHOR.get();
    let dt = t.wrapping_sub(a.tsc);
    if a.scale != 0 && dt < a.max_ticks {
        return a.ns + ((u128::from(dt) * u128::from(a.scale)) >> 32) as u64;
    }
    reanchor(t, a)
}

/// Reads the clock (for counter value `t`, read just before) and sets a new anchor when a tight
/// pair of readings allows (`a`: the current anchor).
#[cold]
#[inline(never)]
fn reanchor(t: u64, a: Anchor) -> u64 {
    if a.retry_at != 0 {
        let ns = monotonic_ns();
        if ns < a.retry_at {
            return ns;
        }
    }
    let Some((tsc, ns)) = tight_pair(t) else {
        // Preempted at every try, or the clock is slow to read: the clock alone for a while.
        let ns = monotonic_ns();
        ANCHOR.set(Anchor { retry_at: ns + REANCHOR_NS, ..a });
        return ns;
    };
    let extrapolated = a.ns + ((u128::from(tsc.wrapping_sub(a.tsc)) * u128::from(a.scale)) >> 32) as u64;
    let restart = a.tsc == 0 || tsc <= a.tsc || ns <= a.ns || (a.scale != 0 && extrapolated.abs_diff(ns) > RESTART_NS);
    if restart {
        // First anchor of this thread, or the counter and the clock parted: start over.
        ANCHOR.set(Anchor { tsc, ns, scale: 0, max_ticks: 0, first: (tsc, ns), retry_at: 0 });
    } else if ns - a.first.1 >= RATE_INTERVAL_NS {
        let interval = ns - a.first.1;
        let scale = ((u128::from(interval) << 32) / u128::from(tsc - a.first.0)) as u64;
        let window = REANCHOR_NS.min(interval / 16);
        let max_ticks = if scale == 0 { 0 } else { ((u128::from(window) << 32) / u128::from(scale)) as u64 };
        ANCHOR.set(Anchor { tsc, ns, scale, max_ticks, first: a.first, retry_at: 0 });
    } else {
        // Keep the older anchor until the rate can be measured over a long enough interval.
        ANCHOR.set(Anchor { retry_at: 0, ..a });
    }
    ns
}

/// A clock reading and the counter at that moment: the middle of two counter readings at most
/// [`PAIR_TICKS`] apart that enclose it (the first of them `t`, then fresh ones), or `None` when
/// three tries were preempted.
fn tight_pair(mut before: u64) -> Option<(u64, u64)> {
    for _ in 0..3 {
        let ns = monotonic_ns();
        let after = counter()?;
        let gap = after.wrapping_sub(before);
        if gap <= PAIR_TICKS {
            return Some((before + gap / 2, ns));
        }
        before = counter()?;
    }
    None
}

/// The time-stamp counter, where it is invariant.
#[cfg(target_arch = "x86_64")]
#[inline]
fn counter() -> Option<u64> {
    use std::sync::OnceLock;
    static INVARIANT: OnceLock<bool> = OnceLock::new();
    let invariant = *INVARIANT.get_or_init(|| {
        // CPUID (safe to call on every x86-64 CPU): leaf 0x80000000 gives the highest extended
        // leaf, and 0x80000007 (whose EDX bit 8 is the invariant TSC) is only read when it exists.
        use std::arch::x86_64::__cpuid;
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    });
    // SAFETY: RDTSC is available on every x86-64 CPU and has no side effects.
    invariant.then(|| unsafe { std::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn counter() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_clock() {
        // Over 20 ms of readings (several re-anchorings), every reading lies between clock
        // readings taken just before and after it, within a small extrapolation error.
        let start = std::time::Instant::now();
        let mut worst = 0i64;
        while start.elapsed() < std::time::Duration::from_millis(20) {
            let before = monotonic_ns();
            let t = now_ns();
            let after = monotonic_ns();
            let err = if t < before {
                (before - t) as i64
            } else if t > after {
                (t - after) as i64
            } else {
                0
            };
            worst = worst.max(err);
        }
        // Measured: 70-220 ns at worst over 40 runs, half of them with both vCPUs loaded (it
        // was 25-217 µs in a third of the runs when anchors could pair preempted readings).
        assert!(worst < 2_000, "now_ns strayed {worst} ns from CLOCK_MONOTONIC");
    }
}
