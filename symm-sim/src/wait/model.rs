//! A loom model of the doorbell protocol of [`super`]: a waiter that goes to sleep on its
//! doorbell and writers that change what it waits for and ring, with the orderings of the real
//! code ([`super::order`]). A lost wake-up leaves the waiter asleep for ever (the model's futex
//! has no timeout), which loom reports as a deadlock in the interleaving that loses it.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p symm-sim --lib loom` (scripts/test.sh).
//!
//! Two things the model writes differently from the code, because loom cannot express them:
//! - loom treats SeqCst loads and stores as acquire/release and models only SeqCst fences
//!   (tokio-rs/loom#180). A SeqCst store followed by a SeqCst load of another word (the full
//!   signal, then the look at `sleepers`) is written as the store, a SeqCst fence, the load:
//!   the C++ memory model gives that pattern the same guarantee.
//! - `membarrier` runs a full barrier on every CPU running the writers, at some point of their
//!   programs. Only a point between a light writer's store and its look at `sleepers` needs a
//!   fence: before the store, the barrier makes the announcement visible to the look; after
//!   the look, it makes the store visible to the sleeper's re-check. The model puts a SeqCst
//!   fence there.

use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use super::order;

/// The words of one rank's header the protocol uses, its flags and the kernel's futex on the
/// doorbell (a mutex for the kernel's hash-bucket lock: `futex_wait` compares and sleeps under
/// it, `futex_wake` wakes under it).
struct Rank {
    sleepers: AtomicU32,
    doorbell: AtomicU32,
    flags: [AtomicU64; 2],
    bucket: Mutex<()>,
    woken: Condvar,
}

/// What a variant of the protocol does.
#[derive(Clone, Copy)]
struct Protocol {
    /// Light signals (release store, relaxed look, the sleeper's barrier) or full fences.
    light: bool,
    /// Whether the sleeper fences after announcing itself (the real code does).
    sleeper_fence: bool,
}

impl Rank {
    fn new() -> Rank {
        Rank {
            sleepers: AtomicU32::new(0),
            doorbell: AtomicU32::new(0),
            flags: [AtomicU64::new(0), AtomicU64::new(0)],
            bucket: Mutex::new(()),
            woken: Condvar::new(),
        }
    }

    /// `wait_until` on `flags[..writers]` all set, past its spinning: announce, fence, read the
    /// doorbell, re-check, sleep while the doorbell has the value read, re-check, retire.
    fn wait(&self, p: Protocol, writers: usize) {
        // Acquire: as the backend's signal loads.
        let check = || self.flags[..writers].iter().all(|f| f.load(Ordering::Acquire) == 1);
        loop {
            self.sleepers.fetch_add(1, order::SLEEPER);
            if p.sleeper_fence || p.light {
                // The real code's fence; with light signals also the caller's half of membarrier.
                fence(Ordering::SeqCst);
            }
            let bell = self.doorbell.load(order::SLEEPER);
            let ready = check();
            if !ready {
                let guard = self.bucket.lock().unwrap();
                // Relaxed: the bucket lock orders it against a waker's bump.
                if self.doorbell.load(Ordering::Relaxed) == bell {
                    drop(self.woken.wait(guard).unwrap());
                }
            }
            let found = ready || check();
            self.sleepers.fetch_sub(1, order::SLEEPER);
            if found {
                return;
            }
        }
    }

    /// A signal to this rank (`flags[i]` set) and `ring`.
    fn signal(&self, p: Protocol, i: usize) {
        let (store, look) = if p.light { order::LIGHT } else { order::FULL };
        self.flags[i].store(1, store);
        // Full fences: the store-load order of SeqCst accesses; light signals: where the
        // sleeper's membarrier matters (module documentation).
        fence(Ordering::SeqCst);
        if self.sleepers.load(look) > 0 {
            self.doorbell.fetch_add(1, order::BUMP);
            let _guard = self.bucket.lock().unwrap();
            self.woken.notify_all();
        }
    }
}

/// Every interleaving of one waiter and `writers` writers (1 or 2) under `p`.
fn check(p: Protocol, writers: usize) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(move || {
        let rank = Arc::new(Rank::new());
        let handles: Vec<_> = (0..writers)
            .map(|i| {
                let rank = rank.clone();
                thread::spawn(move || rank.signal(p, i))
            })
            .collect();
        rank.wait(p, writers);
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn loom_doorbell_full_fences_lose_no_wakeup() {
    check(Protocol { light: false, sleeper_fence: true }, 1);
    check(Protocol { light: false, sleeper_fence: true }, 2);
}

#[test]
fn loom_doorbell_light_signals_lose_no_wakeup() {
    check(Protocol { light: true, sleeper_fence: true }, 1);
    check(Protocol { light: true, sleeper_fence: true }, 2);
}

/// The model can fail: without the sleeper's fence, the SeqCst announcement does not keep the
/// acquire re-check from reading the flag's old value, and loom finds the waiter asleep for ever.
#[test]
fn loom_doorbell_finds_the_lost_wakeup_without_the_sleepers_fence() {
    let lost = std::panic::catch_unwind(|| check(Protocol { light: false, sleeper_fence: false }, 1));
    assert!(lost.is_err(), "loom found no lost wake-up without the sleeper's fence");
}
