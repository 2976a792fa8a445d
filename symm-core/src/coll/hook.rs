//! A hook a caller can have run once, in its own thread, just before a collective call stops
//! spinning and starts blocking: a language binding holds its interpreter lock through the
//! short spin of a small call (when the peers are already there the call never blocks) and
//! lets it go only when the call is about to wait for longer.
//!
//! Python's binding uses it: releasing and re-taking the GIL costs ~40 ns, a fifth of a small
//! allreduce, while a call that waits must still let other Python threads run.

use std::cell::Cell;

thread_local! {
    /// The hook of the call running in this thread, lifetime erased (see [`with_hook`]).
    static HOOK: Cell<Option<*mut (dyn FnMut() + 'static)>> = const { Cell::new(None) };
}

/// Runs `f` with `hook` armed in this thread: the first wait inside `f` that is about to block
/// (after its fast spins) calls `hook` once. Whether it ran is the second value returned.
pub fn with_hook<R>(hook: &mut dyn FnMut(), f: impl FnOnce() -> R) -> (R, bool) {
    type Slot = Cell<Option<*mut (dyn FnMut() + 'static)>>;
    // Disarms the hook when `f` returns or unwinds, so it never outlives its borrow.
    struct Disarm<'a>(&'a Slot, Option<*mut (dyn FnMut() + 'static)>);
    impl Drop for Disarm<'_> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    // SAFETY: only the lifetime is erased. The pointer is used solely by `before_blocking` in
    // this thread while `f` runs (the guard restores the previous value before `with_hook`
    // returns or unwinds), during which `hook` is borrowed mutably by this frame and not
    // otherwise used.
    let erased: *mut (dyn FnMut() + 'static) = unsafe { std::mem::transmute(hook as *mut dyn FnMut()) };
    // One look-up of the thread-local for the whole call (in a shared library each one is a
    // call into the dynamic loader, a few ns of a small collective's software).
    let slot: *const Slot = HOOK.with(|h| h as *const Slot);
    // SAFETY: `HOOK` is const-initialised and its type needs no drop, so no destructor is
    // registered for it: this thread's slot lives as long as the thread, after this frame, and
    // is only ever shared (`&Cell`).
    let slot = unsafe { &*slot };
    let _disarm = Disarm(slot, slot.replace(Some(erased)));
    let r = f();
    // Still armed: the hook did not run.
    let ran = slot.get().map_or(true, |p| !std::ptr::eq(p as *const u8, erased as *const u8));
    (r, ran)
}

/// Called by a wait about to block (and before a group's first collective sets up its state,
/// which waits for every member): runs this thread's armed hook, once.
pub(crate) fn before_blocking() {
    if let Some(hook) = HOOK.with(|h| h.take()) {
        // SAFETY: armed by `with_hook` in this thread, whose frame keeps the hook alive and
        // unborrowed until it returns; taken out of the cell, so it runs once.
        unsafe { (*hook)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_once_and_only_while_armed() {
        before_blocking(); // nothing armed: nothing happens
        let mut count = 0;
        let ((), ran) = with_hook(&mut || count += 1, || {
            before_blocking();
            before_blocking();
        });
        assert!(ran);
        assert_eq!(count, 1);
        let ((), ran) = with_hook(&mut || count += 1, || {});
        assert!(!ran);
        before_blocking(); // disarmed after the call
        assert_eq!(count, 1);
    }
}
