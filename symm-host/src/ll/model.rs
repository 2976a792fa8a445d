//! A loom model of the small-message publication of [`super`]: two members exchange a message
//! in every round, each writer storing its message into its slot for the round (`seq % 2`) in
//! the reader's heap and then the slot's flag; each reader waits for the flag and copies the
//! message out. loom checks every interleaving for a data race on a slot (a writer reusing it
//! while its reader still copies the message out: what the two slots and the rounds' order
//! rule out) and for a message read before it is whole.
//!
//! The flag's orderings are those the protocol asks of the backend: `signal_at` is a release
//! store (the weakest a backend may give), the reader's `Ctx::read_at` an acquire load.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p symm-host --lib loom` (scripts/test.sh).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Rounds: the third reuses the first's slots.
const ROUNDS: u64 = 3;

/// One writer's slot in one member's heap: the flag (the round of the message) and the rest
/// of the header line and the data, written with plain stores.
struct Slot {
    flag: AtomicU64,
    message: UnsafeCell<[u64; 2]>,
}

/// Member `me`'s heap: its peer's slots (the model has two members).
struct Heap {
    slots: [Slot; 2],
}

/// The slot of round `seq` among `slots` (the protocol has two: even and odd rounds).
fn slot_of(heap: &Heap, seq: u64, slots: u64) -> &Slot {
    &heap.slots[(seq % slots) as usize]
}

/// Member `me` runs the rounds with its peer: send (message, then flag), wait for the peer's
/// flag, copy the peer's message out and check it.
fn member(heaps: &[Heap; 2], me: usize, slots: u64) {
    let peer = 1 - me;
    for seq in 1..=ROUNDS {
        let out = slot_of(&heaps[peer], seq, slots);
        // SAFETY: loom's cell checks that no other access to it runs concurrently.
        out.message.with_mut(|m| unsafe { *m = [seq, me as u64] });
        // Release: `signal_at`, the flag after the message.
        out.flag.store(seq, Ordering::Release);
        let inbox = slot_of(&heaps[me], seq, slots);
        // Acquire: `Ctx::read_at`, the message after the flag.
        while inbox.flag.load(Ordering::Acquire) < seq {
            thread::yield_now();
        }
        // SAFETY: as above.
        let got = inbox.message.with(|m| unsafe { *m });
        assert_eq!(got, [seq, peer as u64], "member {me} read a message that was not its peer's of round {seq}");
    }
}

/// Every interleaving of the two members with `slots` slots per writer.
fn check(slots: u64) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(move || {
        let heap =
            || Heap { slots: [0, 1].map(|_| Slot { flag: AtomicU64::new(0), message: UnsafeCell::new([0; 2]) }) };
        let heaps = Arc::new([heap(), heap()]);
        let other = heaps.clone();
        let peer = thread::spawn(move || member(&other, 1, slots));
        member(&heaps, 0, slots);
        peer.join().unwrap();
    });
}

#[test]
fn loom_small_message_publication_is_race_free() {
    check(2);
}

/// The model can fail: with one slot per writer, a writer overwrites its slot while the reader
/// may still copy the previous round's message out, and loom finds the race.
#[test]
fn loom_small_message_finds_the_race_with_one_slot() {
    let race = std::panic::catch_unwind(|| check(1));
    assert!(race.is_err(), "loom found no race with one slot per writer");
}
