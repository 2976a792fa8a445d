//! A lock that is only ever tried: a group's collective state is driven by one thread at a
//! time, and a second thread that finds it taken gets an error at once (`ConcurrentUse`), never
//! waits. So it needs neither a wait queue nor the read-modify-write a blocking mutex spends
//! on release to look for waiters: taking it is one compare-exchange, releasing it one store.
//! A holder that panics leaves it poisoned (the state may be half-updated).
//!
//! The thread that takes it first owns it through a [`Bias`]: that thread takes and releases it
//! with plain stores, and the compare-exchange is only for the threads that come after (see
//! [`symm_core::bias`] for why a locked instruction at the start of every call costs time). The one
//! wait: the first call from a second thread revokes the bias, a system call of about a
//! microsecond, and a thread arriving meanwhile waits for it to end.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, Ordering};

use symm_core::bias::{Bias, Claim};

const FREE: u8 = 0;
const HELD: u8 = 1;
const POISONED: u8 = 2;

/// `T`, behind a lock that is only tried.
pub struct TryLock<T> {
    /// `FREE`, `HELD` or `POISONED` (the owner of `bias` holds it without changing it, and
    /// poisons it like anyone).
    state: AtomicU8,
    bias: Bias,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and at most one guard exists at a time
// (the bias's owner is inside it, or the compare-exchange in `try_lock` succeeded), so sharing
// the lock between threads shares `T` only as a `Mutex` would: it must be `Send`.
unsafe impl<T: Send> Sync for TryLock<T> {}

/// Why [`TryLock::try_lock`] failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Another holder has it now.
    Busy,
    /// A holder panicked while it had it.
    Poisoned,
}

/// The lock, held: dereferences to the value; releases it when dropped.
pub struct TryGuard<'a, T> {
    lock: &'a TryLock<T>,
    /// Taken as the bias's owner (released by leaving the bias).
    owner: bool,
    /// Not `Send`: a guard taken as the bias's owner is released by the owning thread, whose
    /// later entries read `inside` relaxed.
    _thread: PhantomData<*const ()>,
}

impl<T> TryLock<T> {
    pub fn new(value: T) -> Self {
        TryLock { state: AtomicU8::new(FREE), bias: Bias::new(), value: UnsafeCell::new(value) }
    }

    /// Takes the lock if it is free. Always inlined, like the guard's drop: a few instructions
    /// on the owner's path; without this (and `checks::transport_format`'s `#[inline]`) small
    /// collectives took 6-17 % longer (paired A/B, docs/performance.md, "Counted at 2 ranks").
    #[inline(always)]
    pub fn try_lock(&self) -> Result<TryGuard<'_, T>, Taken> {
        match self.bias.enter() {
            Claim::Owner => {
                // Relaxed: only the owner writes `state` while the bias holds (the owner's own
                // earlier stores are visible to it).
                if self.state.load(Ordering::Relaxed) == POISONED {
                    self.bias.leave();
                    return Err(Taken::Poisoned);
                }
                Ok(TryGuard { lock: self, owner: true, _thread: PhantomData })
            }
            Claim::OwnerInside => Err(Taken::Busy),
            // Acquire: what the previous holder wrote to the value is visible to this one (the
            // bias's acquire load of `inside` did so for the owner's last holding).
            Claim::Shared => match self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => Ok(TryGuard { lock: self, owner: false, _thread: PhantomData }),
                Err(POISONED) => Err(Taken::Poisoned),
                Err(_) => Err(Taken::Busy),
            },
        }
    }
}

impl<T> std::fmt::Debug for TryLock<T> {
    /// Shows the lock's state, not the value: taking the lock to read it would revoke its
    /// owner's bias, and fail while a call holds it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Relaxed: a snapshot for a message.
        let state = match self.state.load(Ordering::Relaxed) {
            FREE => "free or held by its owning thread",
            HELD => "held",
            _ => "poisoned",
        };
        f.debug_struct("TryLock").field("state", &state).finish_non_exhaustive()
    }
}

impl<T> Deref for TryGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (see `try_lock`), alive as long as the borrow.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for TryGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and the borrow of the guard is unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for TryGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if self.owner {
            if panicking {
                // Relaxed: published by leaving the bias (release).
                self.lock.state.store(POISONED, Ordering::Relaxed);
            }
            self.lock.bias.leave();
        } else {
            // Release: what this holder wrote to the value is visible to the next one.
            self.lock.state.store(if panicking { POISONED } else { FREE }, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_poisoned_by_a_panic() {
        let lock = TryLock::new(1u32);
        {
            let mut g = lock.try_lock().expect("free");
            *g += 1;
            assert_eq!(lock.try_lock().err(), Some(Taken::Busy));
        }
        assert_eq!(*lock.try_lock().expect("released"), 2);
        let lock = std::sync::Arc::new(lock);
        let l2 = lock.clone();
        let _ = std::thread::spawn(move || {
            let _g = l2.try_lock().expect("free");
            panic!("inside the lock");
        })
        .join();
        assert_eq!(lock.try_lock().err(), Some(Taken::Poisoned));
    }

    #[test]
    fn the_owner_thread_holds_it_against_others_and_poisons_it_by_a_panic() {
        let lock = std::sync::Arc::new(TryLock::new(0u32));
        let l2 = lock.clone();
        // A thread takes it first (the owner, where the barrier exists) and panics inside.
        let _ = std::thread::spawn(move || {
            let mut g = l2.try_lock().expect("free");
            *g = 7;
            assert_eq!(l2.try_lock().err(), Some(Taken::Busy), "the holder again");
            let l3 = l2.clone();
            let other = std::thread::spawn(move || l3.try_lock().err()).join().expect("joins");
            assert_eq!(other, Some(Taken::Busy), "another thread while held");
            panic!("inside the lock");
        })
        .join();
        assert_eq!(lock.try_lock().err(), Some(Taken::Poisoned));
    }
}
