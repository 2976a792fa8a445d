//! A lock that is only ever tried: a group's collective state is driven by one thread at a
//! time, and a second thread that finds it taken gets an error at once (`ConcurrentUse`), never
//! waits. So it needs neither a wait queue nor the read-modify-write a blocking mutex spends
//! on release to look for waiters: taking it is one compare-exchange, releasing it one store.
//! A holder that panics leaves it poisoned (the state may be half-updated).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, Ordering};

const FREE: u8 = 0;
const HELD: u8 = 1;
const POISONED: u8 = 2;

/// `T`, behind a lock that is only tried.
pub struct TryLock<T> {
    state: AtomicU8,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and at most one guard exists at a time
// (the compare-exchange in `try_lock`), so sharing the lock between threads shares `T` only as
// a `Mutex` would: it must be `Send`.
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
}

impl<T> TryLock<T> {
    pub fn new(value: T) -> Self {
        TryLock { state: AtomicU8::new(FREE), value: UnsafeCell::new(value) }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Result<TryGuard<'_, T>, Taken> {
        // Acquire: what the previous holder wrote to the value is visible to this one.
        match self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Ok(TryGuard { lock: self }),
            Err(POISONED) => Err(Taken::Poisoned),
            Err(_) => Err(Taken::Busy),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for TryLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.try_lock() {
            Ok(g) => f.debug_tuple("TryLock").field(&*g).finish(),
            Err(t) => f.debug_tuple("TryLock").field(&t).finish(),
        }
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
    fn drop(&mut self) {
        let next = if std::thread::panicking() { POISONED } else { FREE };
        // Release: what this holder wrote to the value is visible to the next one.
        self.lock.state.store(next, Ordering::Release);
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
}
