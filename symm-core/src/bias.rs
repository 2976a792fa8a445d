//! A claim biased to one thread: state that one thread of a process uses, and others may, without
//! a locked read-modify-write on the owner's path.
//!
//! # Why
//! On x86 a locked instruction (`lock cmpxchg`, `lock xadd`) waits until every store before it
//! has reached the cache. At the start of a call those are the previous call's stores into a
//! peer's heap, into lines the peer is polling: each waits for the peer's copy to be
//! invalidated. A small broadcast or send between two ranks spent 5-10 ns of its 80-170 ns
//! in that wait. Training processes drive a communicator from one thread, so the thread that
//! first takes a claim (the *owner*) enters and leaves it with plain stores; another thread that
//! comes along later *revokes* the bias once, and from then on every thread takes the caller's
//! own read-modify-write path.
//!
//! # How (an asymmetric Dekker handshake)
//! The owner enters by storing `inside = 1` and then re-reading `owner`, with no fence between
//! them; a revoker stores `owner = REVOKING`, issues
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (a full barrier on every CPU running a thread
//! of this process, before the system call returns), stores `REVOKED` and reads `inside`. Either
//! the owner's re-read comes after its barrier, and it sees the revocation and backs off, or
//! its store to `inside` came before the barrier, and the revoker (and anyone who sees
//! `REVOKED`) sees the owner inside. So the owner and a thread on the shared path are never
//! both inside. Threads that see `REVOKING` wait the system call out (about a microsecond).
//!
//! The barrier needs the process registered (once, at the first claim) and Linux 4.14 or later;
//! without it no claim is ever biased.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicU64, Ordering};
use std::sync::OnceLock;

/// No thread has claimed the bias yet.
const UNCLAIMED: u64 = 0;
/// A revoker is issuing the barrier.
const REVOKING: u64 = u64::MAX - 1;
/// The bias is gone: every thread takes the shared path.
const REVOKED: u64 = u64::MAX;

/// Where a thread stands after [`Bias::enter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the bias and is now inside: plain stores suffice until
    /// [`Bias::leave`].
    Owner,
    /// The caller takes its read-modify-write path (the owner is not inside).
    Shared,
    /// The owner is inside (another thread, or the caller itself a second time): the caller
    /// does not enter.
    OwnerInside,
}

/// The owner's token and whether it is inside. Zero-filled memory is a valid unclaimed bias
/// (it may live in memory the backend maps; only this process's threads use it).
#[repr(C)]
#[derive(Debug, Default)]
pub struct Bias {
    /// The owner's thread token, or `UNCLAIMED`, `REVOKING`, `REVOKED`.
    owner: AtomicU64,
    /// 1 while the owner is inside (written only by the owner).
    inside: AtomicU64,
}

impl Bias {
    /// An unclaimed bias.
    pub const fn new() -> Bias {
        Bias { owner: AtomicU64::new(UNCLAIMED), inside: AtomicU64::new(0) }
    }

    /// Enters the claim: see [`Claim`]. After `Owner`, call [`Bias::leave`] on the same thread.
    #[inline]
    pub fn enter(&self) -> Claim {
        let me = thread_token();
        // Relaxed: the owner's own token is stored once; a revocation is ordered for the
        // owner by the revoker's barrier (see the module documentation).
        if self.owner.load(Ordering::Relaxed) == me {
            // Relaxed: only the owner writes `inside`.
            if self.inside.load(Ordering::Relaxed) != 0 {
                return Claim::OwnerInside;
            }
            // Relaxed: the revoker's barrier orders this store before the re-read below.
            self.inside.store(1, Ordering::Relaxed);
            // Keeps the re-read after the store in program order; the processor is ordered by
            // the revoker's barrier.
            compiler_fence(Ordering::SeqCst);
            // Relaxed: see above.
            if self.owner.load(Ordering::Relaxed) == me {
                return Claim::Owner;
            }
            // Revoked meanwhile: back off.
            self.leave();
        }
        self.enter_slow(me)
    }

    /// Enters a claim whose owner only ever stays inside for a few stores that nothing can
    /// block: true as its owner (call [`Bias::leave`] after), false for the shared path. An
    /// owner inside is waited out (yielding lets it run should it have been preempted there).
    #[inline]
    pub fn enter_short(&self) -> bool {
        loop {
            match self.enter() {
                Claim::Owner => return true,
                Claim::Shared => return false,
                Claim::OwnerInside => std::thread::yield_now(),
            }
        }
    }

    /// Leaves the claim entered as [`Claim::Owner`].
    #[inline]
    pub fn leave(&self) {
        // Release: what the owner did inside happens before a shared-path thread's acquire
        // load of `inside` that reads 0.
        self.inside.store(0, Ordering::Release);
    }

    #[cold]
    fn enter_slow(&self, me: u64) -> Claim {
        loop {
            // Acquire: pairs with the revoker's release store of `REVOKED`.
            match self.owner.load(Ordering::Acquire) {
                REVOKED => {
                    // Acquire: pairs with the owner's release in `leave`. The barrier made an
                    // owner's entry before it visible.
                    return if self.inside.load(Ordering::Acquire) != 0 { Claim::OwnerInside } else { Claim::Shared };
                }
                REVOKING => std::thread::yield_now(),
                UNCLAIMED => {
                    let to = if barrier_registered() { me } else { REVOKED };
                    // Relaxed: the owner's later stores are its own; others that read `me`
                    // revoke, which the barrier orders.
                    if self.owner.compare_exchange(UNCLAIMED, to, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                        return if to == me { self.enter() } else { Claim::Shared };
                    }
                }
                owner if owner == me => return self.enter(),
                owner => {
                    // Relaxed: the barrier below orders it for the owner.
                    if self.owner.compare_exchange(owner, REVOKING, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                        // Should the barrier fail (it does not once registered), the owner
                        // may not have seen the revocation yet: wait long enough for any store
                        // it buffered to drain before anyone reads `inside`.
                        if !private_barrier() {
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                        // Release: a thread that reads `REVOKED` reads `inside` after the barrier.
                        self.owner.store(REVOKED, Ordering::Release);
                    }
                }
            }
        }
    }

    /// Whether the bias is held by a thread now (for tests).
    #[cfg(test)]
    fn is_biased(&self) -> bool {
        !matches!(self.owner.load(Ordering::Relaxed), UNCLAIMED | REVOKING | REVOKED)
    }
}

/// The calling thread's token: distinct for every thread of the process, never reused, never
/// one of the reserved values.
#[inline]
fn thread_token() -> u64 {
    thread_local! {
        // No destructor: readable while the thread's other thread-locals are destroyed.
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    TOKEN.with(|t| {
        if t.get() == 0 {
            // Relaxed: only distinctness matters.
            t.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// `membarrier` commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Whether this process is registered for the private expedited barrier (registers it at the
/// first call).
fn barrier_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let needed = MEMBARRIER_CMD_PRIVATE_EXPEDITED | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED;
        // SAFETY: membarrier takes no pointers; QUERY returns the supported commands.
        let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
        supported >= 0
            && supported & needed == needed
            // SAFETY: membarrier takes no pointers; registering only adds this process to the
            // barrier's targets.
            && unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) } == 0
            && private_barrier()
    })
}

/// A full memory barrier on every CPU running a thread of this process, before this returns.
fn private_barrier() -> bool {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn the_first_thread_owns_it_until_another_comes() {
        let b = Bias::new();
        let biased = barrier_registered();
        let first = b.enter();
        assert_eq!(first, if biased { Claim::Owner } else { Claim::Shared });
        if first == Claim::Owner {
            assert_eq!(b.enter(), Claim::OwnerInside, "the owner twice");
            // Another thread while the owner is inside: revokes, does not enter.
            std::thread::scope(|s| s.spawn(|| assert_eq!(b.enter(), Claim::OwnerInside)).join().unwrap());
            b.leave();
            assert!(!b.is_biased());
            // Everyone takes the shared path now, the old owner included.
            assert_eq!(b.enter(), Claim::Shared);
            std::thread::scope(|s| s.spawn(|| assert_eq!(b.enter(), Claim::Shared)).join().unwrap());
        }
    }

    #[test]
    fn the_owner_and_a_shared_thread_are_never_inside_together() {
        // Many times over: one thread claims a fresh bias and keeps entering, a second comes
        // along and revokes it at a random moment; each entry (as owner, or on the shared path
        // under a lock word) flags that it is inside, and a second one inside at once would
        // find the flag set.
        if !barrier_registered() {
            return;
        }
        for _ in 0..500 {
            let b = Bias::new();
            let word = AtomicU64::new(0);
            let occupied = AtomicBool::new(false);
            // Stays inside a while, so that a broken exclusion shows.
            let occupy = || {
                assert!(!occupied.swap(true, Ordering::SeqCst), "two inside");
                for _ in 0..100 {
                    std::hint::spin_loop();
                }
                occupied.store(false, Ordering::SeqCst);
            };
            let enter = |owner_allowed: bool| match b.enter() {
                Claim::Owner => {
                    assert!(owner_allowed, "the second thread got the bias");
                    occupy();
                    b.leave();
                }
                Claim::Shared => {
                    // The shared path's own lock.
                    if word.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        occupy();
                        word.store(0, Ordering::Release);
                    }
                }
                Claim::OwnerInside => {}
            };
            let claimed = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    assert_eq!(b.enter(), Claim::Owner, "the first entry");
                    b.leave();
                    claimed.store(true, Ordering::Release);
                    for _ in 0..100 {
                        enter(true);
                    }
                });
                s.spawn(|| {
                    while !claimed.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    for _ in 0..100 {
                        enter(false);
                    }
                });
            });
            assert!(!b.is_biased());
        }
    }
}
