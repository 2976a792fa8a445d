//! Waiting on several flags at once: a sendrecv serves both directions, a small-message round
//! watches a peer's message and its round-protocol flag (whichever the peer uses).
//!
//! # News of a writer that will not send
//! A collective's wait on a peer's flag also watches, in the same backend wait (so a change
//! wakes the waiter at once, and nothing is read while the flag comes quickly), the words that
//! tell that the peer is not in this call and so will never set the flag:
//! - its [`FAILED`] word: it found the members out of step in one of its calls, or one of its
//!   calls timed out, and it takes no more collectives in the group (`Mismatch`, or `Timeout`
//!   naming it, at once);
//! - its small-broadcast slot for broadcast `bcasts + 1` (outside small broadcasts, whose own
//!   waits judge those slots, see [`eager`](super::eager)): the peer made a small broadcast, as
//!   its root, where this member makes another call. The root of a small broadcast returns
//!   without waiting, so its message is all that shows where it went. It fails the wait only
//!   after [`GRACE`]: the root may make this member's call next, and calls in different orders
//!   then pair as before (the round-based call fails on every member, naming the broadcasts
//!   made before it; the broadcast delivers; the group stays usable);
//! - its slot for broadcast `bcasts`, when the peer is not that broadcast's root here: the peer
//!   believed it was the root.
//!
//! Such a slot keeps its message until the reader has entered a later small broadcast (flow
//! control), so it cannot be a message of another broadcast. A member that finds one of these
//! raises `Mismatch` naming the peer and both calls, takes no more collectives in the group
//! and publishes its own [`FAILED`] word, so that every member learns it, each at its next wait
//! on it or at the start of its next collective of the group (which looks at the same words:
//! a small broadcast's root, which does not wait, learns it there).

use std::time::{Duration, Instant};

use super::algo::Call;
use super::eager;
use super::state::{Ctx, FAILED};
use symm_core::backend::{HostMapped, WaitSite};
use symm_core::dfx::Op;
use symm_core::error::{Error, Result, TimeoutError};

/// News words per writer at most ([`Ctx::news_words`]).
const NEWS_WORDS: usize = 3;
/// How long a root's message for the next small broadcast must have been in the caller's heap,
/// without the awaited flags, before a wait fails on it ([`Ctx::wait_with_news`]).
const GRACE: Duration = Duration::from_millis(500);

/// Why a member published its [`FAILED`] word: it found the members out of step.
pub const FAILED_OUT_OF_STEP: u64 = 0;
/// Why a member published its [`FAILED`] word: its own call timed out.
pub const FAILED_TIMEOUT: u64 = 1;

/// What a writer's news words show ([`Ctx::news`]).
enum News {
    /// It will not send: the error now.
    Now(Error),
    /// It made a small broadcast that the caller has not: the error once it has been so for
    /// [`GRACE`].
    Grace(Error),
}

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
    pub fn reached<B: HostMapped + ?Sized>(&self, ctx: &Ctx<'_, B>) -> bool {
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

impl<B: HostMapped + ?Sized> Ctx<'_, B> {
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
        self.about_to_block();
        let met = || flags.iter().any(|f| f.reached(self));
        let start = Instant::now();
        let deadline = start + self.timeout;
        if self.poll(&met) {
            return Ok(());
        }
        // The record waits for the poll: a call that waits a little reads no clock for it.
        self.record.blocked(self.b);
        // The backend's wait on every flag at once, when it has one; else one flag at a time.
        // With the news words of every writer (see the module documentation).
        let words: Vec<(usize, i64)> = flags.iter().map(|f| (f.offset, f.value as i64)).collect();
        let mut writers: Vec<usize> = flags.iter().map(|f| f.writer).collect();
        writers.sort_unstable();
        writers.dedup();
        let site = || WaitSite {
            op: format!("{} (round {})", self.op, flags[0].value),
            group: Some(self.group.ranks().to_vec()),
            location: String::new(),
            // As `wait_flag`: a collective watches every member, point-to-point its peers.
            watch: if self.p2p { flags.iter().map(|f| self.group.ranks()[f.writer]).collect() } else { Vec::new() },
            waiting_on: (flags.iter().all(|f| f.writer == flags[0].writer))
                .then(|| self.group.ranks()[flags[0].writer]),
        };
        match self.wait_with_news(&words, &writers, &met, deadline, &site) {
            Ok(()) => return Ok(()),
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
            let bounded = Ctx { timeout: this.min(deadline - now), diverged: std::cell::Cell::new(false), ..*self };
            let waited = bounded.wait_flag(f, &|_| f.offset);
            if bounded.diverged.get() {
                self.diverged.set(true);
            }
            match waited {
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

    /// Fills `out` with the news words of writer `j` (offset, value reached when there is news;
    /// see the module documentation); how many. None for point-to-point calls.
    fn news_words(&self, j: usize, out: &mut [(usize, i64)], next: bool) -> usize {
        if self.p2p || j == self.me {
            return 0;
        }
        out[0] = (self.word_offset(j, FAILED), 1);
        let mut k = 1;
        if self.watch_eager {
            if next {
                let f = eager::message(self, j, self.bcasts + 1);
                out[k] = (f.offset, f.value as i64);
                k += 1;
            }
            if self.last_bcast.is_some_and(|l| l.root != j) {
                let f = eager::message(self, j, self.bcasts);
                out[k] = (f.offset, f.value as i64);
                k += 1;
            }
        }
        k
    }

    /// The news of writer `j`, if any (see the module documentation).
    fn news(&self, j: usize, waited: Duration) -> Option<News> {
        if self.p2p || j == self.me {
            return None;
        }
        if let Some(e) = self.failed_news(j, waited, false) {
            return Some(News::Now(e));
        }
        if !self.watch_eager {
            return None;
        }
        if let Some(e) = self.root_news(j) {
            return Some(News::Now(e));
        }
        let b = self.bcasts;
        let next = eager::message(self, j, b + 1);
        next.reached(self).then(|| {
            let (sig, len) = eager::sent(self, next);
            News::Grace(self.mismatch(
                j,
                format!("{} as collective call #{} of the group, after {b} small broadcasts", self.op, self.call),
                format!("{} as small broadcast #{} of the group, as its root", Call::describe(sig, len), b + 1),
            ))
        })
    }

    /// Waits in the backend until one of `words` (the caller's flags, `met` once one is
    /// reached) is reached, or a news word of one of `writers` (see the module documentation)
    /// tells that it will not be: then the error of that news. A root's message for the next
    /// small broadcast fails the wait only once it has been there for [`GRACE`] (a quarter of
    /// the call's timeout if less) without the flags coming: the root may still make this call
    /// next (calls in different orders, a small broadcast against a round-based call, complete
    /// as before when it does). `Unsupported` where the backend cannot wait on several words.
    pub(super) fn wait_with_news(
        &self,
        words: &[(usize, i64)],
        writers: &[usize],
        met: &dyn Fn() -> bool,
        deadline: Instant,
        site: symm_core::backend::DescribeWait<'_>,
    ) -> Result<()> {
        let (grace, begun) = (GRACE.min(self.timeout / 4), Instant::now());
        // Since when a root's message for the next small broadcast has been seen.
        let mut seen: Option<Instant> = None;
        let mut all = Vec::with_capacity(words.len() + NEWS_WORDS * writers.len());
        loop {
            all.clear();
            all.extend_from_slice(words);
            for &j in writers {
                let mut news = [(0, 0); NEWS_WORDS];
                let k = self.news_words(j, &mut news, seen.is_none());
                all.extend_from_slice(&news[..k]);
            }
            let until = seen.map_or(deadline, |t0| deadline.min(t0 + grace));
            let r = self.b.wait_any_signal_at(&all, until.saturating_duration_since(Instant::now()), site);
            if let Err(Error::Unsupported { .. }) = r {
                return r.map(|_| ());
            }
            // The news first: what the writer did after it is visible once it is.
            let mut news = None;
            for &j in writers {
                match self.news(j, begun.elapsed()) {
                    Some(n @ News::Now(_)) => {
                        news = Some(n);
                        break;
                    }
                    Some(n) if news.is_none() => news = Some(n),
                    _ => {}
                }
            }
            if met() {
                return Ok(());
            }
            match (news, r) {
                (Some(News::Now(e)), _) => return Err(self.diverge(e)),
                (Some(News::Grace(e)), _) if seen.is_some_and(|t0| t0.elapsed() >= grace) => {
                    return Err(self.diverge(e))
                }
                (Some(News::Grace(_)), Ok(_) | Err(Error::Timeout(_))) if Instant::now() < deadline => {
                    seen.get_or_insert_with(Instant::now);
                }
                (_, Ok(_)) => {}
                (_, Err(e)) => return Err(e),
            }
        }
    }

    /// At the start of a collective call: the news of every peer but those of its waits alone
    /// (a message for the next small broadcast may be this very call's).
    pub(super) fn news_at_entry(&self) -> Option<Error> {
        (0..self.n)
            .filter(|&j| j != self.me)
            .find_map(|j| self.failed_news(j, Duration::ZERO, true).or_else(|| self.root_news(j)))
    }

    /// `j`'s `FAILED` word, when set: a `Mismatch` when it found the members out of step, a
    /// `Timeout` naming it when its own call timed out (this call cannot complete either;
    /// `waited`: how long this call has waited for it), except at the start (`at_entry`) of
    /// the call that timed out there.
    fn failed_news(&self, j: usize, waited: Duration, at_entry: bool) -> Option<Error> {
        let failed = self.read_word(j, FAILED);
        if failed == 0 {
            return None;
        }
        let op = Op::from_code((failed & 0xff) as u8).map_or("?", Op::name);
        let (why, call) = ((failed >> 8) & 0xff, failed >> 16);
        let peer = self.group.ranks()[j];
        if why as u64 == FAILED_TIMEOUT && at_entry && call as u64 >= self.call {
            // It timed out in this very call: it may have sent its part before it gave up (a
            // late member completes with it); the waits tell.
            return None;
        }
        if why as u64 == FAILED_TIMEOUT {
            let mut t = TimeoutError::new(
                self.b.rank(),
                self.op.into(),
                Some(self.group.ranks().to_vec()),
                format!(
                    "global rank {peer}, which gave up on the group: its collective call #{call} ({op}) timed out \
                     there, and it takes no more collectives in this group"
                ),
                "its part of the call".into(),
                "its notice of the timeout".into(),
                vec![peer],
                waited,
            );
            t.sequence = Some(self.call);
            return Some(Error::Timeout(Box::new(t)));
        }
        Some(self.mismatch(
            j,
            format!("{} as collective call #{} of the group", self.op, self.call),
            format!(
                "{op} as its collective call #{call}, in which it found the members out of step and stopped taking \
                 collectives in this group (see the error on that rank)"
            ),
        ))
    }

    /// Whether `j` also sent small broadcast `bcasts` as its root, when this member ran it with
    /// another root.
    fn root_news(&self, j: usize) -> Option<Error> {
        let last = self.last_bcast.filter(|l| l.root != j)?;
        let b = self.bcasts;
        let f = eager::message(self, j, b);
        f.reached(self).then(|| {
            let (sig, len) = eager::sent(self, f);
            self.mismatch(
                j,
                format!("{} as small broadcast #{b} of the group", Call::describe(last.sig, last.count as i64)),
                format!("{} as small broadcast #{b} of the group, as its root", Call::describe(sig, len)),
            )
        })
    }

    fn mismatch(&self, j: usize, mine: String, theirs: String) -> Error {
        Error::Mismatch { rank: self.b.rank(), op: self.op.into(), peer: self.group.ranks()[j], mine, theirs }
    }

    /// Marks the call as having found the members out of step (see [`Ctx::diverged`]).
    pub(super) fn diverge(&self, e: Error) -> Error {
        self.diverged.set(true);
        e
    }

    /// Tells every peer that this member takes no more collectives in the group since call
    /// `op` (its [`FAILED`] word, which their waits watch), and why ([`FAILED_OUT_OF_STEP`],
    /// [`FAILED_TIMEOUT`]). Best effort: the call fails anyway.
    pub(super) fn publish_failure(&self, op: Op, why: u64) {
        let word = (self.call << 16) | (why << 8) | u64::from(op.code());
        for j in (0..self.n).filter(|&j| j != self.me) {
            let _ = self.signal(j, FAILED, word);
        }
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
            if polls.is_multiple_of(FAST_POLLS) && start.elapsed() >= poll_for {
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
