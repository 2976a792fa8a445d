//! Waiting: spin while the rank has a core, then sleep on the rank's doorbell (a futex).
//!
//! A flag written by a peer is seen by a spinning waiter within a line transfer, but a futex
//! wake-up costs tens of microseconds, so spinning pays while every rank has a core; with more
//! ranks than cores a spinning waiter steals the core its peer needs, so the spin budget shrinks
//! to almost nothing (docs/performance-log.md, "Waiting").
//!
//! Lost wake-ups are impossible: a waiter announces itself in `sleepers` (SeqCst, then a
//! fence), reads the doorbell, re-checks its condition and only then sleeps while the doorbell
//! still has the value it read. A writer makes its change, then reads `sleepers` and, if it sees a sleeper,
//! bumps the doorbell and wakes. Either the writer sees the sleeper, or the waiter sees the
//! change. That needs each side's write ordered before its read (a store-load barrier): on
//! x86 a full fence, which makes a writer's store wait until it owns the line, typically one
//! the waiter is polling (tens of nanoseconds on every signal of every small message).
//!
//! # Light signals: the sleeper pays for the barrier
//! Where the kernel offers `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` ([`light_signals`]),
//! writers publish with a release store and read `sleepers` with no fence, and the waiter,
//! after announcing itself, issues that system call (only on the way to sleep): it
//! runs a full barrier on every CPU running a thread of a registered process before it returns.
//! A writer whose read of `sleepers` comes after that barrier sees the announcement; one whose
//! read came before it had its change, which precedes the read, made visible by it, so the
//! waiter's re-check sees the change. (A writer not running at that moment passed through the
//! scheduler's barrier.) Every process registers when its communicator starts; a process that
//! cannot, or runs with `SYMM_LIGHT_SIGNALS=0`, keeps full fences for its own signals, and its
//! sleepers still issue the barrier wherever the kernel offers it (peers may signal lightly).
//! A sleeper whose barrier fails naps 1 ms at a time instead of 100. The barrier interrupts
//! every CPU running a registered process; sleepers issue it only after their spinning and
//! yielding, a few times per millisecond at most.
//!
//! # Lost wake-ups are counted
//! A lost wake-up does not fail anything: the sleeper's nap ends and it finds its condition
//! met, up to a nap late. So that tests can tell, a full nap that ends by its timeout with the
//! condition met and the doorbell unchanged is counted ([`lost_wakeups`]): a writer made the
//! change and did not wake the sleeper. (Or is about to: a writer held up longer than the nap
//! between its change and its look at `sleepers`; with the long naps tests set through
//! `SYMM_TEST_NAP_MS`, seconds, that does not happen.) The count can miss one: all waits of a
//! rank share its doorbell, so any other ring during the nap ends it early. It catches a writer
//! path that never rings, or a protocol that loses wake-ups, when the sleeper has nothing else
//! coming.

use std::sync::atomic::{compiler_fence, fence, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::control::Header;
use crate::sys;

#[cfg(all(test, loom))]
mod model;

/// The orderings of the doorbell protocol (the module documentation says why), named so that
/// its loom model (`wait/model.rs`) checks the ones used here.
mod order {
    use std::sync::atomic::Ordering::{self, Relaxed, Release, SeqCst};
    /// The sleeper's announcement in `sleepers`, its read of the doorbell and its retirement.
    pub const SLEEPER: Ordering = SeqCst;
    /// The writer's bump of the doorbell: a sleeper's futex compares against the value it read.
    pub const BUMP: Ordering = SeqCst;
    /// A signal's store and the writer's look at `sleepers`, with full fences.
    pub const FULL: (Ordering, Ordering) = (SeqCst, SeqCst);
    /// The same with light signals: the sleeper's barrier orders the two for the processor.
    pub const LIGHT: (Ordering, Ordering) = (Release, Relaxed);
}

/// How long a waiter spins before sleeping.
#[derive(Clone, Copy, Debug)]
pub struct SpinPolicy {
    /// Whether the host's ranks outnumber its cores (waiters then share cores with the peers
    /// they wait for).
    pub shared_cores: bool,
    /// Busy-wait budget.
    pub spin: Duration,
    /// After spinning, how long to keep checking between `sched_yield`s before sleeping. When
    /// ranks outnumber cores the awaited peer is usually runnable on this very core: yielding
    /// hands it the core at once, where a futex sleep would add a wake-up per wait.
    pub yield_for: Duration,
    /// Longest sleep between two looks at the condition while asleep (100 ms; tests set it
    /// with `SYMM_TEST_NAP_MS`, see [`lost_wakeups`]).
    pub nap: Duration,
}

impl SpinPolicy {
    /// The budget for `ranks_on_host` ranks sharing `cores` cores, unless `SYMM_SPIN_US` and
    /// `SYMM_YIELD_US` set it (`SYMM_TEST_NAP_MS` sets the naps, for tests), as parsed into
    /// `settings`.
    pub fn for_host(ranks_on_host: usize, cores: usize, settings: &symm_core::config::Config) -> SpinPolicy {
        let oversubscribed = ranks_on_host > cores;
        // Sharing cores, a waiter yields at once: the peer it waits for is usually runnable on
        // this very core, and a spin would only delay it (docs/performance-log.md, "Waiting").
        let spin = match settings.spin {
            Some(us) => us,
            None if oversubscribed => Duration::ZERO,
            None => Duration::from_millis(2),
        };
        let yield_for = match settings.yield_for {
            Some(us) => us,
            None if oversubscribed => Duration::from_micros(200),
            None => Duration::ZERO,
        };
        let nap = settings.nap.unwrap_or(DEFAULT_NAP);
        SpinPolicy { shared_cores: oversubscribed, spin, yield_for, nap }
    }
}

/// Longest sleep of a waiter between two looks at its condition, by default: a wake-up ends it
/// early; the looks also run the periodic health check.
const DEFAULT_NAP: Duration = Duration::from_millis(100);
/// Longest sleep where the light writers' barrier could not be issued (such a writer may not
/// have seen the sleeper).
const NAP_WITHOUT_BARRIER: Duration = Duration::from_millis(1);

/// Naps that ended by their timeout although the awaited change had been made and nobody rang:
/// see "Lost wake-ups are counted" in the module documentation.
static LOST_WAKEUPS: AtomicU64 = AtomicU64::new(0);

/// Lost wake-ups counted in this process so far (see the module documentation).
pub fn lost_wakeups() -> u64 {
    // Relaxed: a count read after the waits it counts have returned.
    LOST_WAKEUPS.load(Ordering::Relaxed)
}

/// This process's signal mode, chosen once: 0 not yet; otherwise [`MODE_CHOSEN`] plus
/// [`MODE_LIGHT`] (its signals are light) and [`MODE_BARRIER`] (its sleepers can issue the
/// barrier, whatever its own signals are: other processes may signal lightly).
static SIGNAL_MODE: AtomicU8 = AtomicU8::new(0);
const MODE_CHOSEN: u8 = 1;
const MODE_LIGHT: u8 = 2;
const MODE_BARRIER: u8 = 4;

/// Chooses this process's signal mode (every communicator start calls it; the first choice
/// stays): light signals when `light` allows them and this process could register for
/// `membarrier` (see the module documentation).
pub fn choose_signal_mode(light: bool) {
    // Relaxed: the mode is chosen before this process signals or waits, and stays.
    if SIGNAL_MODE.load(Ordering::Relaxed) == 0 {
        let mut mode = MODE_CHOSEN;
        if sys::membarrier_offered() {
            mode |= MODE_BARRIER;
            if light && sys::membarrier_register() {
                mode |= MODE_LIGHT;
            }
        }
        // Relaxed: as above; of two threads choosing at once, the first choice stays.
        let _ = SIGNAL_MODE.compare_exchange(0, mode, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Whether signals are light here: a release store, with the sleepers paying for the barrier.
#[inline]
pub fn light_signals() -> bool {
    // Relaxed: set once at start-up (see `choose_signal_mode`).
    SIGNAL_MODE.load(Ordering::Relaxed) & MODE_LIGHT != 0
}

/// The sleeper's half of light signals, on its way to sleep: false when it could not be
/// issued (the sleeper then naps briefly: a light writer may not have seen it).
fn sleeper_barrier() -> bool {
    // Relaxed: set once at start-up (see `choose_signal_mode`).
    SIGNAL_MODE.load(Ordering::Relaxed) & MODE_BARRIER == 0 || sys::membarrier_global()
}

/// The ordering of a signal's store (see the module documentation).
#[inline]
pub fn signal_store_order() -> Ordering {
    if light_signals() {
        order::LIGHT.0
    } else {
        order::FULL.0
    }
}

/// Rings `owner`'s doorbell: call after a change to anything the owner may wait for (stored
/// with [`signal_store_order`] or stronger).
///
/// When nobody sleeps the doorbell is left alone (no contended read-modify-write on the hot
/// path): a waiter that announced itself after this read is guaranteed to see the change when
/// it re-checks (the module documentation says why, in either mode).
pub fn ring(owner: &Header) {
    let sleeping = if light_signals() {
        // The read of `sleepers` stays after the change in program order; the sleeper's
        // membarrier orders it for the processor.
        compiler_fence(Ordering::SeqCst);
        // Relaxed: see above.
        owner.sleepers.0.load(order::LIGHT.1)
    } else {
        // SeqCst: the writer half of the lost-wake-up argument (change, then read `sleepers`).
        owner.sleepers.0.load(order::FULL.1)
    };
    if sleeping > 0 {
        // SeqCst: a sleeper's futex_wait compares against the value it read after announcing
        // itself; bumping makes that comparison fail, so it cannot sleep through this wake.
        owner.doorbell.0.fetch_add(1, order::BUMP);
        sys::futex_wake_all(&owner.doorbell.0);
    }
}

/// Why a wait ended without its condition.
#[derive(Debug)]
pub enum WaitEnd<E> {
    /// The deadline passed.
    TimedOut,
    /// The periodic health check failed.
    Failed(E),
}

/// Waits on `me` (the caller's own header) until `check` returns `Some`, the deadline passes,
/// or `health` fails (called while asleep, at the end of a nap, at most every 100 ms: with the
/// default naps every 100 ms, with `SYMM_TEST_NAP_MS` once a nap).
pub fn wait_until<T, E>(
    me: &Header,
    policy: SpinPolicy,
    deadline: Instant,
    mut check: impl FnMut() -> Option<T>,
    mut health: impl FnMut() -> Result<(), E>,
) -> Result<T, WaitEnd<E>> {
    if let Some(v) = check() {
        return Ok(v);
    }
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < policy.spin {
        // Check between single pauses: a pause takes tens to over a hundred cycles, so
        // checking only after a batch of them would add up to microseconds to every wake-up.
        // The check reads a line that stays in this core's cache until the writer changes it.
        for _ in 0..64 {
            if let Some(v) = check() {
                return Ok(v);
            }
            std::hint::spin_loop();
        }
        rounds += 1;
        if rounds.is_multiple_of(16) {
            // Let a peer sharing this core run now and then even while spinning.
            std::thread::yield_now();
        }
    }
    let yielding = Instant::now();
    while yielding.elapsed() < policy.yield_for && Instant::now() < deadline {
        std::thread::yield_now();
        if let Some(v) = check() {
            return Ok(v);
        }
    }
    let mut next_health = Instant::now();
    loop {
        // SeqCst: announce the sleeper before reading the doorbell and re-checking (the waiter
        // half of the lost-wake-up argument).
        me.sleepers.0.fetch_add(1, order::SLEEPER);
        // SeqCst: the re-check below is an acquire load, which the memory model orders after
        // the announcement only through a fence; without it a writer's look at `sleepers` can
        // miss the announcement while the re-check reads the old value (a lost wake-up the
        // loom model in `wait/model.rs` finds). On x86 the locked add above is one already.
        fence(Ordering::SeqCst);
        // The light writers' store-load barrier, run on their CPUs (see the module
        // documentation), whatever this process's own signals are.
        let barrier = sleeper_barrier();
        // SeqCst: read after announcing; a later bump makes the futex return at once.
        let bell = me.doorbell.0.load(order::SLEEPER);
        let ready = check();
        let now = Instant::now();
        // Whether this nap, if it runs out, tells a lost wake-up: a full nap (not cut short by
        // the deadline) with the writers' barrier issued (without it, light writers may miss a
        // sleeper by design, and the nap is short).
        let mut slept_out = false;
        if ready.is_none() && now < deadline {
            let longest = if barrier { policy.nap } else { NAP_WITHOUT_BARRIER.min(policy.nap) };
            let nap = (deadline - now).min(longest);
            let timed_out = sys::futex_wait(&me.doorbell.0, bell, nap);
            slept_out = timed_out && barrier && nap == policy.nap;
        }
        let found = ready.or_else(&mut check);
        // SeqCst: a writer that saw this sleeper bumped the doorbell before waking it; one that
        // made its change and did not is the lost wake-up (or is held up between its change and
        // its look at `sleepers` for a whole nap: see the module documentation).
        if found.is_some() && slept_out && me.doorbell.0.load(Ordering::SeqCst) == bell {
            // Relaxed: a statistic.
            LOST_WAKEUPS.fetch_add(1, Ordering::Relaxed);
        }
        // SeqCst: pairs with the increment above.
        me.sleepers.0.fetch_sub(1, order::SLEEPER);
        if let Some(v) = found {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitEnd::TimedOut);
        }
        if now >= next_health {
            if let Err(e) = health() {
                // A peer that did its part and then ended is no failure: look once more.
                return check().ok_or(WaitEnd::Failed(e));
            }
            next_health = now + Duration::from_millis(100);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Padded;
    use std::sync::atomic::AtomicU32;

    fn header() -> Header {
        Header {
            magic: AtomicU64::new(0),
            rank: AtomicU64::new(0),
            pid: AtomicU64::new(0),
            heap_size: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            doorbell: Padded(AtomicU32::new(0)),
            sleepers: Padded(AtomicU32::new(0)),
        }
    }

    /// A waiter that sleeps at once (no spinning, no yielding) for naps of `nap`, on `flag`
    /// reaching 1; after it has gone to sleep, `change` sets the flag (and rings, or not).
    /// Returns how long the wait took and the lost wake-ups it added.
    fn sleep_through(nap: Duration, change: impl Fn(&Header, &AtomicU64) + Sync) -> (Duration, u64) {
        let (h, flag) = (header(), AtomicU64::new(0));
        let policy = SpinPolicy { shared_cores: false, spin: Duration::ZERO, yield_for: Duration::ZERO, nap };
        let before = lost_wakeups();
        let took = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let start = Instant::now();
                // Acquire: pairs with the release store of `change`.
                let check = || (flag.load(Ordering::Acquire) == 1).then_some(());
                let r = wait_until(&h, policy, start + Duration::from_secs(30), check, || Ok::<(), ()>(()));
                assert!(r.is_ok(), "the wait failed");
                start.elapsed()
            });
            // SeqCst: pairs with the waiter's announcement; then give it time to reach the futex.
            while h.sleepers.0.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(100));
            change(&h, &flag);
            waiter.join().expect("the waiter panicked")
        });
        (took, lost_wakeups() - before)
    }

    #[test]
    fn a_change_that_does_not_ring_is_counted_as_a_lost_wakeup_one_that_rings_is_not() {
        let nap = Duration::from_millis(1000);
        // Without a ring the waiter sleeps its nap out and then finds the change: counted.
        // (Retried if the waiter had not gone to sleep before the change: it then saw the
        // change at once and nothing could be told.)
        let mut outcome = None;
        for _ in 0..3 {
            // Release: the change a waiter looks for.
            let (took, lost) = sleep_through(nap, |_, flag| flag.store(1, Ordering::Release));
            if took >= nap / 2 {
                outcome = Some(lost);
                break;
            }
        }
        let outcome = outcome.expect("in three tries the waiter never fell asleep before the change");
        assert_eq!(outcome, 1, "a nap that ended by its timeout with the change made was not counted");
        // With a ring the waiter wakes at once: not counted.
        let (took, lost) = sleep_through(nap, |h, flag| {
            flag.store(1, signal_store_order());
            ring(h);
        });
        assert!(took < nap / 2, "the ring did not wake the sleeper ({took:?})");
        assert_eq!(lost, 0, "a rung wake-up was counted as lost");
    }
}
