//! One stream's events: which device event stands for "after operation `seq`".
//!
//! The contract's [`Event`](symm_core::stream::Event) is a number on a stream; the device's is an
//! `aclrtEvent` recorded there. Each operation enqueued gets the next number and a device event
//! recorded after it. The stream runs in order, so once an event is seen complete every earlier
//! one is too: the ledger then forgets them (it holds only the events in flight), and answers
//! "complete" for any number up to the highest seen complete.

use std::collections::BTreeMap;

/// What the ledger knows of event `seq`.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, H> {
    /// Complete (seen so, or before one seen so).
    Complete,
    /// In flight: the device event to ask.
    Pending(&'a H),
    /// After the last operation enqueued: no such point yet.
    Future,
}

/// The events of one stream, of handle type `H`.
#[derive(Debug)]
pub struct Ledger<H> {
    /// Operations enqueued so far (the number of the last one).
    enqueued: u64,
    /// Every number up to it is complete.
    completed: u64,
    in_flight: BTreeMap<u64, H>,
}

impl<H> Default for Ledger<H> {
    fn default() -> Self {
        Ledger { enqueued: 0, completed: 0, in_flight: BTreeMap::new() }
    }
}

impl<H> Ledger<H> {
    /// The number of the last operation enqueued (0: none).
    pub fn last(&self) -> u64 {
        self.enqueued
    }

    /// Counts an operation just enqueued, with the device event recorded after it; returns its
    /// number. Events seen complete by `done` (oldest first) are forgotten first, so the ledger
    /// holds only what is in flight.
    pub fn push(&mut self, event: H, done: impl Fn(&H) -> bool) -> u64 {
        while let Some(entry) = self.in_flight.first_entry() {
            if !done(entry.get()) {
                break;
            }
            self.completed = *entry.key();
            entry.remove();
        }
        self.enqueued += 1;
        self.in_flight.insert(self.enqueued, event);
        self.enqueued
    }

    /// What is known of the point after operation `seq`. A number with no event of its own
    /// (an operation that recorded none) is answered by the next one recorded after it.
    pub fn lookup(&self, seq: u64) -> Lookup<'_, H> {
        if seq <= self.completed || (seq <= self.enqueued && self.in_flight.is_empty()) {
            return Lookup::Complete;
        }
        if seq > self.enqueued {
            return Lookup::Future;
        }
        match self.in_flight.range(seq..).next() {
            Some((_, h)) => Lookup::Pending(h),
            None => Lookup::Complete,
        }
    }

    /// Everything up to `seq` has completed (a host wait saw it): forgets those events.
    pub fn completed(&mut self, seq: u64) {
        let seq = seq.min(self.enqueued);
        if seq <= self.completed {
            return;
        }
        self.completed = seq;
        self.in_flight = self.in_flight.split_off(&(seq + 1));
    }

    /// Events in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn numbers_are_complete_in_stream_order() {
        let done_up_to = Cell::new(0u32);
        let done = |h: &u32| *h <= done_up_to.get();
        let mut l = Ledger::default();
        assert_eq!(l.lookup(0), Lookup::Complete);
        assert_eq!(l.lookup(1), Lookup::Future);
        assert_eq!(l.push(10, done), 1);
        assert_eq!(l.push(20, done), 2);
        assert_eq!(l.push(30, done), 3);
        assert_eq!(l.lookup(2), Lookup::Pending(&20));
        assert_eq!(l.lookup(4), Lookup::Future);
        // The device finished the first two: the next push forgets them.
        done_up_to.set(20);
        assert_eq!(l.push(40, done), 4);
        assert_eq!(l.in_flight(), 2);
        assert_eq!(l.lookup(1), Lookup::Complete);
        assert_eq!(l.lookup(2), Lookup::Complete);
        assert_eq!(l.lookup(3), Lookup::Pending(&30));
        // A host wait saw 3 complete: 4 is still in flight.
        l.completed(3);
        assert_eq!(l.lookup(3), Lookup::Complete);
        assert_eq!(l.lookup(4), Lookup::Pending(&40));
        l.completed(99);
        assert_eq!(l.lookup(4), Lookup::Complete);
        assert_eq!(l.in_flight(), 0);
        assert_eq!(l.lookup(5), Lookup::Future);
    }

    #[test]
    fn a_number_without_an_event_is_answered_by_the_next_one() {
        let mut l: Ledger<u32> = Ledger::default();
        l.push(1, |_| false);
        l.push(2, |_| false);
        l.completed(1);
        // 2 has its own; had 1 none, 2's would answer it.
        assert_eq!(l.lookup(2), Lookup::Pending(&2));
    }
}
