//! Waiting on several flags at once: a sendrecv serves both directions, a small-message round
//! watches a peer's message and its round-protocol flag (whichever the peer uses).

use std::time::{Duration, Instant};

use super::state::Ctx;
use crate::backend::{Backend, WaitSite};
use crate::error::{Error, Result, TimeoutError};

/// A flag word in the caller's own heap, set by one writer, and the value awaited: the word
/// at heap offset `offset`, written by member `writer`, at least `value`.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub writer: usize,
    pub offset: usize,
    pub value: u64,
    /// What the flag means, for messages (`ready`, `mailbox`, ...).
    pub what: &'static str,
}

impl Flag {
    /// Whether the flag has reached its value (never waits). An acquire load: what the writer
    /// made visible before the flag is ordered before what the caller does next.
    pub fn reached<B: Backend + ?Sized>(&self, ctx: &Ctx<'_, B>) -> bool {
        ctx.read_at(self.offset) >= self.value as i64
    }
}

/// Reads of the awaited flags between two looks at the clock in [`Ctx::wait_any`].
const FAST_POLLS: u32 = 512;
/// Polls before [`Ctx::wait_any`] starts yielding the core at every poll, where waiters share
/// cores with the peers they wait for.
const FAST_POLLS_SHARED: u32 = 16;
/// How long [`Ctx::wait_any`] polls the flags before it blocks, when every rank has a core /
/// when waiters share cores (as the backend reports): the CPU backend's spin budget and yield
/// window. With a core of its own the poller spins (a `sched_yield` costs about a microsecond,
/// which a small message would pay at every poll); sharing its core, it hands the core over at
/// every poll, but the peers it waits for run sooner once it sleeps.
const POLL_FOR: Duration = Duration::from_millis(2);
const POLL_FOR_SHARED: Duration = Duration::from_micros(200);
/// First and largest slice of one flag's blocking wait in [`Ctx::wait_any`]: a change of
/// another flag is noticed at the end of the slice at the latest.
const FIRST_SLICE: Duration = Duration::from_millis(1);
const MAX_SLICE: Duration = Duration::from_millis(16);
/// Every this long without progress, [`Ctx::wait_any`] blocks for one [`HEALTH_SLICE`], long
/// enough for the backend's periodic check that the awaited peer is still there (every 100 ms
/// of sleep in `symm-sim`): a peer that died fails the wait with `PeerLost` instead of the
/// timeout.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
const HEALTH_SLICE: Duration = Duration::from_millis(150);

impl<B: Backend + ?Sized> Ctx<'_, B> {
    /// Waits until any of `flags` reaches its value, without ever blocking on one alone for
    /// long (another may be the one that moves).
    ///
    /// The flags are polled, spinning while each rank has a core, yielding the core between
    /// polls where the backend says waiters share cores ([`Backend::waiters_share_cores`]: the
    /// peers run meanwhile), for [`POLL_FOR`] ([`POLL_FOR_SHARED`] when sharing); after that
    /// the wait blocks in the backend on all of them ([`Backend::wait_any_signal_at`]), or,
    /// where the backend cannot, on each flag in turn for a slice (1 ms doubling up to 16 ms,
    /// once per second of silence one [`HEALTH_SLICE`] so that the backend notices a lost peer),
    /// so an idle call sleeps instead of burning a core and a change of another flag is seen
    /// within a slice. A peer that leaves after setting a flag is no failure. The whole wait is
    /// bounded by the call's timeout; its error names every flag,
    /// and, for a collective, which members `arrived` where the caller waits (point-to-point:
    /// the one peer).
    pub fn wait_any(&self, flags: &[Flag], arrived: &dyn Fn(usize) -> bool) -> Result<()> {
        // Callers come here once their own quick checks failed: a longer wait is ahead.
        super::hook::before_blocking();
        let met = || flags.iter().any(|f| f.reached(self));
        let start = Instant::now();
        let deadline = start + self.timeout;
        if self.poll(&met) {
            return Ok(());
        }
        // The record waits for the poll: a call that waits a little reads no clock for it.
        self.record.blocked(self.b);
        // The backend's wait on every flag at once, when it has one; else one flag at a time.
        let words: Vec<(usize, i64)> = flags.iter().map(|f| (f.offset, f.value as i64)).collect();
        let site = || WaitSite {
            op: format!("{} (round {})", self.op, flags[0].value),
            group: Some(self.group.ranks().to_vec()),
            location: String::new(),
            // As `wait_flag`: a collective watches every member, point-to-point its peers.
            watch: if self.p2p { flags.iter().map(|f| self.group.ranks()[f.writer]).collect() } else { Vec::new() },
            waiting_on: (flags.iter().all(|f| f.writer == flags[0].writer))
                .then(|| self.group.ranks()[flags[0].writer]),
        };
        match self.b.wait_any_signal_at(&words, deadline.saturating_duration_since(Instant::now()), &site) {
            Ok(_) => return Ok(()),
            Err(Error::Unsupported { .. }) => {}
            Err(Error::Timeout(_)) => return Err(self.timeout_any(flags, arrived, start.elapsed())),
            // A peer that did its part and then left is no failure.
            Err(_) if met() => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut slice = FIRST_SLICE;
        let mut next_health = start + HEALTH_EVERY;
        for turn in 0.. {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let this = if now >= next_health {
                next_health = now + HEALTH_EVERY;
                HEALTH_SLICE
            } else {
                let s = slice;
                slice = (slice * 2).min(MAX_SLICE);
                s
            };
            let f = flags[turn % flags.len()];
            // The same wait as any other, bounded by the slice: a slice that runs out is no error.
            let bounded = Ctx { timeout: this.min(deadline - now), ..*self };
            match bounded.wait_flag(f, &|_| f.offset) {
                Ok(()) => return Ok(()),
                Err(Error::Timeout(_)) => {}
                Err(_) if met() => return Ok(()),
                Err(e) => return Err(e),
            }
            if met() {
                return Ok(());
            }
        }
        Err(self.timeout_any(flags, arrived, start.elapsed()))
    }

    /// Polls `met` for [`POLL_FOR`] spinning, or, where waiters share cores, for
    /// [`POLL_FOR_SHARED`] yielding the core at every poll after the first
    /// [`FAST_POLLS_SHARED`]. Whether `met` came true.
    pub(super) fn poll(&self, met: &dyn Fn() -> bool) -> bool {
        let start = Instant::now();
        let shared = self.b.waiters_share_cores();
        let poll_for = if shared { POLL_FOR_SHARED } else { POLL_FOR };
        let mut polls = 0u32;
        loop {
            if met() {
                return true;
            }
            polls += 1;
            if shared && polls >= FAST_POLLS_SHARED {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if polls % FAST_POLLS == 0 && start.elapsed() >= poll_for {
                return false;
            }
        }
    }

    /// The timeout of [`Ctx::wait_any`]: who waited for which flags, and what it saw last.
    fn timeout_any(&self, flags: &[Flag], arrived: &dyn Fn(usize) -> bool, waited: Duration) -> Error {
        let ranks = self.group.ranks();
        let join = |f: &dyn Fn(&Flag) -> String| flags.iter().map(f).collect::<Vec<_>>().join(" / ");
        let mut pending: Vec<_> = flags.iter().map(|f| ranks[f.writer]).collect();
        pending.dedup();
        let op = if self.p2p {
            format!("{} (either direction)", self.op)
        } else {
            format!("{} (round {})", self.op, flags[0].value)
        };
        let mut t = TimeoutError::new(
            self.b.rank(),
            op,
            Some(ranks.to_vec()),
            join(&|f| format!("the {} flag of group rank {} (global rank {})", f.what, f.writer, ranks[f.writer])),
            join(&|f| format!("signal >= {}", f.value)),
            join(&|f| self.read_at(f.offset).to_string()),
            pending,
            waited,
        );
        super::validate::explain_timeout(self, &mut t, flags[0].writer, arrived);
        Error::Timeout(Box::new(t))
    }
}
