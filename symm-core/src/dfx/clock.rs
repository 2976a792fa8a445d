//! The time stamps of the flight recorder and the statistics: CLOCK_MONOTONIC nanoseconds, read
//! cheaply. Every recorded operation takes two; through the vDSO each costs about 25 ns here,
//! a tenth of a small collective, while the CPU's time-stamp counter costs about 10 ns.
//!
//! Where the counter is invariant (constant rate, running in every power state, the same on
//! every core: CPUID's "invariant TSC"), [`now_ns`] extrapolates from an *anchor*, a pair of
//! counter and clock readings taken at most [`REANCHOR_NS`] ago by the same thread, at the rate
//! measured between the thread's first anchor and the latest. So each reading is close to the
//! clock itself (measured: a few hundred nanoseconds at worst, the pairs' uncertainty and the
//! rate's error over one re-anchoring interval), comparable between the processes of a host
//! like the clock, and follows the clock's own adjustments. Elsewhere, and until a thread has
//! measured the rate, it reads the clock.
//!
//! An anchor is only taken from a clock reading that two counter readings [`PAIR_TICKS`] apart
//! at most enclose: a thread preempted between its counter and clock readings (tens of
//! microseconds on a busy virtual machine) would otherwise pair them wrongly, and every reading
//! extrapolated from that anchor, and the rate measured from it, would be off by as much. The
//! pairs' own uncertainty (half of [`PAIR_TICKS`]) weighs on the rate in proportion to the
//! interval it is measured over, so an anchor extrapolates over a sixteenth of that interval at
//! most ([`REANCHOR_NS`] once it is long enough). A new anchor that disagrees with the
//! extrapolation by more than [`RESTART_NS`] (the counter ran while the clock did not: a
//! suspended machine, a paused VM) starts the rate's measurement over, and so does a
//! measured rate outside any counter's ([`MIN_SCALE`], [`MAX_SCALE`]). Where no tight pair can
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
/// The fewest nanoseconds per tick (32.32 fixed point) a measured rate may show: a 10 GHz
/// counter. Invariant counters run at the processor's base frequency, well inside the range;
/// a rate outside is a measurement across a moment when the counter and the clock parted (the
/// first measurement has no earlier rate to disagree with).
const MIN_SCALE: u64 = (1 << 32) / 10;
/// The most nanoseconds per tick a measured rate may show: a 0.2 GHz counter (see
/// [`MIN_SCALE`]).
const MAX_SCALE: u64 = 5 << 32;

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
        return a.ns + ticks_to_ns(dt, a.scale);
    }
    reanchor(t, a)
}

/// Reads the clock (for counter value `t`, read just before) and sets a new anchor when a tight
/// pair of readings allows (`a`: the current anchor).
#[cold]
#[inline(never)]
fn reanchor(mut t: u64, a: Anchor) -> u64 {
    if a.retry_at != 0 {
        let ns = monotonic_ns();
        if ns < a.retry_at {
            return ns;
        }
        // The clock reading above lies between `t` and the pair's readings: start afresh.
        t = counter().unwrap_or(t);
    }
    let Some((tsc, ns)) = tight_pair(t) else {
        // Preempted at every try, or the clock is slow to read: the clock alone for a while.
        let ns = monotonic_ns();
        ANCHOR.set(Anchor { retry_at: ns + REANCHOR_NS, ..a });
        return ns;
    };
    ANCHOR.set(advance(a, tsc, ns));
    ns
}

/// The anchor that follows `a` given a tight pair of readings (counter `tsc`, clock `ns`).
fn advance(a: Anchor, tsc: u64, ns: u64) -> Anchor {
    // Only a counter and a clock that both moved forward since the anchor can be compared.
    let parted = a.tsc == 0 || tsc <= a.tsc || ns <= a.ns || {
        let extrapolated = a.ns.saturating_add(ticks_to_ns(tsc - a.tsc, a.scale));
        a.scale != 0 && extrapolated.abs_diff(ns) > RESTART_NS
    };
    let interval = ns.saturating_sub(a.first.1);
    // Checked before it is narrowed: a quotient beyond 64 bits must not wrap into the range.
    let scale = if parted || interval < RATE_INTERVAL_NS {
        None
    } else {
        u64::try_from((u128::from(interval) << 32) / u128::from(tsc - a.first.0))
            .ok()
            .filter(|s| (MIN_SCALE..=MAX_SCALE).contains(s))
    };
    if parted || (interval >= RATE_INTERVAL_NS && scale.is_none()) {
        // First anchor of this thread, the counter and the clock parted, or the rate measured
        // against the first anchor is not a counter's (the two moved apart in between, before
        // any rate could notice): start over.
        Anchor { tsc, ns, scale: 0, max_ticks: 0, first: (tsc, ns), retry_at: 0 }
    } else if let Some(scale) = scale {
        let window = REANCHOR_NS.min(interval / 16);
        let max_ticks = ((u128::from(window) << 32) / u128::from(scale)) as u64;
        Anchor { tsc, ns, scale, max_ticks, first: a.first, retry_at: 0 }
    } else {
        // Keep the older anchor until the rate can be measured over a long enough interval.
        Anchor { retry_at: 0, ..a }
    }
}

/// Nanoseconds for `ticks` at `scale` (nanoseconds per tick, 32.32 fixed point).
#[inline]
fn ticks_to_ns(ticks: u64, scale: u64) -> u64 {
    ((u128::from(ticks) * u128::from(scale)) >> 32) as u64
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

    /// Anchors from pairs of a 3 GHz counter (3 ticks per nanosecond) and the clock.
    fn pair(ns: u64) -> (u64, u64) {
        (1_000_000 + 3 * ns, ns)
    }

    #[test]
    fn measures_the_rate_and_restarts_when_the_counter_and_the_clock_part() {
        let none = Anchor { tsc: 0, ns: 0, scale: 0, max_ticks: 0, first: (0, 0), retry_at: 0 };
        let (tsc, ns) = pair(1_000);
        let first = advance(none, tsc, ns);
        assert_eq!((first.tsc, first.ns, first.scale, first.first), (tsc, ns, 0, (tsc, ns)));
        // Too short an interval to measure over: the first anchor stays.
        let (tsc, ns) = pair(1_000 + RATE_INTERVAL_NS / 2);
        assert_eq!(advance(first, tsc, ns).tsc, first.tsc);
        // Long enough: the rate (1/3 ns per tick) and a window of a sixteenth of the interval.
        let (tsc, ns) = pair(1_000 + 2 * RATE_INTERVAL_NS);
        let measured = advance(first, tsc, ns);
        assert_eq!((measured.tsc, measured.first), (tsc, first.first));
        assert!(measured.scale.abs_diff((1 << 32) / 3) <= 1, "scale {}", measured.scale);
        assert!(ticks_to_ns(measured.max_ticks, measured.scale).abs_diff(2 * RATE_INTERVAL_NS / 16) <= 1);
        // The next anchor agrees with the extrapolation: the rate is measured over the longer
        // interval from the first anchor.
        let (tsc, ns) = pair(1_000 + 3 * RATE_INTERVAL_NS);
        let next = advance(measured, tsc, ns);
        assert_eq!((next.tsc, next.first), (tsc, first.first));
        assert_ne!(next.scale, 0);
        // The counter ran on while the clock stood still (a paused machine): start over.
        let (tsc, _) = pair(1_000 + 4 * RATE_INTERVAL_NS);
        let ns = next.ns + RATE_INTERVAL_NS / 10;
        let parted = advance(next, tsc, ns);
        assert_eq!((parted.scale, parted.first), (0, (tsc, ns)));
        // A first rate no counter has (here 100 GHz: the counter jumped between the anchors,
        // before any rate could see it): start over instead of extrapolating at it.
        let (tsc, ns) = (first.tsc + 100 * 2 * RATE_INTERVAL_NS, first.ns + 2 * RATE_INTERVAL_NS);
        let implausible = advance(first, tsc, ns);
        assert_eq!((implausible.scale, implausible.first), (0, (tsc, ns)));
        // Nor one too slow (0.1 GHz: the clock jumped ahead between the anchors).
        let (tsc, ns) = (first.tsc + 2 * RATE_INTERVAL_NS / 10, first.ns + 2 * RATE_INTERVAL_NS);
        let slow = advance(first, tsc, ns);
        assert_eq!((slow.scale, slow.first), (0, (tsc, ns)));
        // The counter went back (another core's, unsynchronised): start over, without overflow.
        let back = advance(measured, measured.tsc - 10, measured.ns + 10);
        assert_eq!((back.scale, back.tsc), (0, measured.tsc - 10));
    }

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
