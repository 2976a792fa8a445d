//! The flight recorder: the last operations of a rank, in memory that every rank of the node
//! can read, so that any rank can print what the whole node was doing.
//!
//! A [`FlightRing`] is a view of a ring of fixed-size records in memory the backend provides
//! (`symm-sim`: a region of each rank's shared control area). Only the owning rank (any of its
//! threads) writes its ring; any rank of the node reads it, also while the owner writes and after
//! the owner died.
//!
//! # Layout (all words are atomics; the memory starts zero-filled)
//! ```text
//! header   64 bytes: magic, capacity, head (records ever started), pid, rank, writers' bias
//! records  capacity x 64 bytes: seq, meta, group id, member mask, op sequence, count, start, end
//! ```
//! # Torn-free reads: a sequence lock per record
//! A record's `seq` word is `(index + 1) << 1`, plus 1 while a writer is inside the record
//! (`index` counts the records the rank ever started). A writer takes the record by a
//! compare-exchange to the odd value, issues a release fence, stores the fields (relaxed) and
//! publishes with a release store of the even value. A reader loads `seq` (acquire), loads the
//! fields (relaxed), issues an acquire fence and loads `seq` again: equal even values mean the
//! fields belong together (if a field load had seen a later writer's store, the fences would
//! make that writer's odd `seq` visible to the second load). Writers never wait for readers;
//! a record whose writer died inside it stays odd and is reported as unreadable.
//!
//! # The end of an operation: one word
//! The end is the `end` word alone, 0 while the operation runs, then its outcome, its duration
//! and a tag of its index (see `end_word`), stored once (release) without taking the record.
//! A reader sees either value, and both are whole. Should the ring wrap while an operation runs
//! and a later record take its slot, the late store lands in the later record with the wrong
//! tag, which readers ignore (that record still shows as running, as it is).
//!
//! # Untimed records: the moment an operation blocked
//! A record started without a clock reading (see [`RecordStart::timed`]) has `start` 0 until
//! its operation first blocks, when [`FlightRing::blocked`] stores the time once (a
//! compare-exchange from 0, after checking that the slot still holds the record). A reader sees
//! 0 or the time, both whole. The check and the exchange are two steps: should the ring wrap
//! between them (other threads of the rank starting a ring's worth of operations meanwhile), the
//! time may land in the untimed record that took the slot, which then shows a moment it did not
//! block at; no other field is touched.
//!
//! # One writing thread: no read-modify-write
//! The owning rank's first writing thread owns the ring through a [`Bias`] in the header: it
//! advances `head` and takes records with plain stores. A second writing thread revokes the
//! bias once (waiting for the owner to leave the few stores of a record), and from then on
//! every writer takes its index with a fetch-add and its record with a compare-exchange. (A
//! locked instruction at the start of a call waits for the previous call's stores into a peer's
//! heap; see [`crate::bias`].)
//!
//! Cost of recording an operation: about twelve plain stores, and two clock reads when it is
//! timed (with several writing threads: one fetch-add and one compare-exchange more); no
//! allocation, no lock, no system call.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::Op;
use crate::bias::Bias;
use crate::dtype::DType;
use crate::group::Group;
use crate::rank::Rank;

/// Marks an initialised ring ("symmfrc2": since records may be untimed, see [`TIMED`]; a
/// reader of another version sees no ring rather than misread records).
const MAGIC: u64 = u64::from_le_bytes(*b"symmfrc2");
/// Bytes of the ring header and of each record.
pub const RECORD_BYTES: usize = 64;
/// The environment variable that sets the number of records per rank (0 disables the recorder).
pub const ENTRIES_VAR: &str = crate::config::FLIGHT_RECORDER_ENTRIES.name;
/// Records per rank when [`ENTRIES_VAR`] is unset.
pub const DEFAULT_ENTRIES: usize = 64;
/// The largest accepted number of records per rank.
pub const MAX_ENTRIES: usize = 1 << 16;

/// The ring header.
#[repr(C, align(64))]
#[derive(Debug)]
struct Header {
    magic: AtomicU64,
    capacity: AtomicU64,
    /// Records ever started; the next record takes index `head`.
    head: AtomicU64,
    pid: AtomicU64,
    rank: AtomicU64,
    /// The writing thread that needs no read-modify-write (see the module documentation).
    writers: Bias,
}

/// One record.
#[repr(C, align(64))]
#[derive(Debug)]
struct Slot {
    /// `(index + 1) << 1`, odd while written; 0: never written.
    seq: AtomicU64,
    /// op code (bits 0-7), [`TIMED`] (bit 8), dtype code + 1 (16-23, 0: none), group size
    /// (32-63).
    meta: AtomicU64,
    group: AtomicU64,
    /// Bit r set: global rank r is a member (ranks below 64 only).
    members: AtomicU64,
    op_seq: AtomicU64,
    count: AtomicU64,
    start: AtomicU64,
    /// 0 while running, then [`end_word`].
    end: AtomicU64,
}

/// The bit of the `meta` word of a timed record (start and end read from the clock).
const TIMED: u64 = 1 << 8;

/// Bits of the `end` word: the outcome ([`RecordState`] code), the record index modulo
/// 2^[`TAG_BITS`] (more than [`MAX_ENTRIES`], so two records of one slot never share it), and
/// the duration in nanoseconds above (saturating at 2^45 ns, about 9.8 hours).
const STATE_BITS: u32 = 2;
const TAG_BITS: u32 = 17;
const _: () = assert!(1 << TAG_BITS > MAX_ENTRIES && RecordState::Failed as u64 >> STATE_BITS == 0);

/// The `end` word of record `index`, which ended in `state` after `took_ns`.
fn end_word(index: u64, state: RecordState, took_ns: u64) -> u64 {
    let took = took_ns.min((1 << (64 - STATE_BITS - TAG_BITS)) - 1);
    (took << (STATE_BITS + TAG_BITS)) | ((index & ((1 << TAG_BITS) - 1)) << STATE_BITS) | state as u64
}

/// The outcome and duration in `end` word `w` of record `index`; `None`: still running (or a
/// word another record left, see the module documentation).
fn read_end(index: u64, w: u64) -> Option<(RecordState, u64)> {
    let tag = (w >> STATE_BITS) & ((1 << TAG_BITS) - 1);
    let state = RecordState::from_code(w & ((1 << STATE_BITS) - 1))?;
    (tag == index & ((1 << TAG_BITS) - 1) && state != RecordState::Started)
        .then_some((state, w >> (STATE_BITS + TAG_BITS)))
}

const _: () = assert!(std::mem::size_of::<Header>() == RECORD_BYTES && std::mem::size_of::<Slot>() == RECORD_BYTES);

/// The state of a recorded operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordState {
    /// Started and not finished (still running, or its rank stopped inside it).
    Started = 1,
    /// Returned successfully.
    Completed = 2,
    /// Returned an error.
    Failed = 3,
}

impl RecordState {
    /// `started`, `completed` or `failed`.
    pub const fn name(self) -> &'static str {
        match self {
            RecordState::Started => "started",
            RecordState::Completed => "completed",
            RecordState::Failed => "failed",
        }
    }

    fn from_code(c: u64) -> Option<RecordState> {
        match c {
            1 => Some(RecordState::Started),
            2 => Some(RecordState::Completed),
            3 => Some(RecordState::Failed),
            _ => None,
        }
    }
}

/// What is recorded when an operation starts.
#[derive(Clone, Copy, Debug)]
pub struct RecordStart<'a> {
    /// The operation.
    pub op: Op,
    /// Its group, if any.
    pub group: Option<&'a Group>,
    /// Its sequence number in the group (collectives: the group's collective call number;
    /// send/recv: the group's point-to-point call number; 0: none).
    pub seq: u64,
    /// Elements of the caller's buffer.
    pub count: u64,
    /// Their dtype.
    pub dtype: Option<DType>,
    /// Whether the operation is timed: `start_ns` is its start and [`FlightRing::finish`] gets
    /// its end. Untimed, `start_ns` is 0 and the record learns only when the operation blocked
    /// ([`FlightRing::blocked`]).
    pub timed: bool,
    /// CLOCK_MONOTONIC nanoseconds at the start (0 when untimed).
    pub start_ns: u64,
}

/// One record, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightRecord {
    /// Position in the rank's history (0 = its first recorded operation).
    pub index: u64,
    /// The operation (`allreduce`, `barrier`, ...; `?` for an unknown code).
    pub op: &'static str,
    /// The group's id (0: no group).
    pub group_id: u64,
    /// The group's size.
    pub group_size: u32,
    /// The group's global ranks in ascending order, when all of them are below 64.
    pub group_ranks: Option<Vec<Rank>>,
    /// The sequence number in the group (see [`RecordStart::seq`]; 0: none).
    pub seq: u64,
    /// Elements of the caller's buffer.
    pub count: u64,
    /// Their dtype.
    pub dtype: Option<DType>,
    /// Started, completed or failed.
    pub state: RecordState,
    /// Whether the operation was timed (see [`RecordStart::timed`]).
    pub timed: bool,
    /// CLOCK_MONOTONIC nanoseconds at the start; for an untimed operation, when it first
    /// blocked (stopped spinning to wait), and 0 if it never did.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds at the end (0 while started, and for untimed operations).
    pub end_ns: u64,
}

impl FlightRecord {
    /// The group as `[0, 1, 2]` when its ranks are known, else `#<id> (N ranks)`; empty
    /// without a group.
    pub fn group_text(&self) -> String {
        match (&self.group_ranks, self.group_id) {
            (_, 0) => String::new(),
            (Some(r), _) => format!("{r:?}"),
            (None, id) => format!("#{id:016x} ({} ranks)", self.group_size),
        }
    }
}

/// Every record of one rank, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankRecords {
    /// The rank.
    pub rank: Rank,
    /// Its process id (0: its ring was never initialised).
    pub pid: u32,
    /// Records ever started by the rank (more than `records.len()` once the ring wrapped).
    pub total: u64,
    /// The records still in the ring, oldest first.
    pub records: Vec<FlightRecord>,
    /// Records that could not be read consistently (a writer inside them, or one that died
    /// there).
    pub unreadable: u64,
}

/// A view of one rank's ring of records.
#[derive(Clone, Copy, Debug)]
pub struct FlightRing<'a> {
    header: &'a Header,
    slots: &'a [Slot],
}

// SAFETY: every field is an atomic in memory that lives for 'a (the view's contract); sharing
// the view between threads shares only atomics.
unsafe impl Send for FlightRing<'_> {}
// SAFETY: as above.
unsafe impl Sync for FlightRing<'_> {}

impl<'a> FlightRing<'a> {
    /// Bytes of a ring of `entries` records (header included).
    pub const fn bytes_for(entries: usize) -> usize {
        if entries == 0 {
            0
        } else {
            RECORD_BYTES * (entries + 1)
        }
    }

    /// A view of the ring of `entries` records at `base` (`entries > 0`).
    ///
    /// # Safety
    /// `base` is 64-byte aligned and valid for reads and writes of `bytes_for(entries)` bytes for
    /// 'a; the memory is zero-filled or a ring of `entries` records, and is accessed only
    /// atomically by anyone (other processes included).
    pub unsafe fn from_raw(base: *mut u8, entries: usize) -> FlightRing<'a> {
        debug_assert!(entries > 0 && (base as usize).is_multiple_of(RECORD_BYTES));
        // SAFETY: the caller guarantees size, alignment, lifetime and atomic-only access; Header
        // and Slot consist only of atomics (valid for any bit pattern, including zero).
        unsafe {
            FlightRing {
                header: &*base.cast::<Header>(),
                slots: std::slice::from_raw_parts(base.add(RECORD_BYTES).cast::<Slot>(), entries),
            }
        }
    }

    /// Initialises the ring for its owner (once, before peers read it).
    pub fn init(&self, rank: Rank, pid: u32) {
        // Relaxed: published by the release store of `magic`.
        self.header.capacity.store(self.slots.len() as u64, Ordering::Relaxed);
        self.header.pid.store(u64::from(pid), Ordering::Relaxed);
        self.header.rank.store(u64::from(rank.0), Ordering::Relaxed);
        // Release: readers that see the magic see the fields above.
        self.header.magic.store(MAGIC, Ordering::Release);
    }

    /// Whether the owner has initialised the ring with this capacity.
    fn ready(&self) -> bool {
        // Acquire: pairs with the release store in `init`.
        self.header.magic.load(Ordering::Acquire) == MAGIC
            && self.header.capacity.load(Ordering::Relaxed) == self.slots.len() as u64
    }

    /// Records the start of an operation; returns its index (for [`FlightRing::finish`]).
    #[inline]
    pub fn begin(&self, ev: &RecordStart<'_>) -> u64 {
        // The owner stays inside for the dozen stores of a record.
        let owner = self.header.writers.enter_short();
        let index = if owner {
            // Relaxed: only this thread writes `head` while it owns the bias; readers validate
            // every record by its own sequence lock.
            let index = self.header.head.load(Ordering::Relaxed);
            self.header.head.store(index + 1, Ordering::Relaxed);
            index
        } else {
            // Relaxed: the counter only hands out distinct indices; the record's own sequence
            // lock orders its contents.
            self.header.head.fetch_add(1, Ordering::Relaxed)
        };
        let slot = self.slot(index);
        if owner {
            Self::take(slot, index);
        } else if !Self::lock(slot, index) {
            return index;
        }
        let (group, members, size) = match ev.group {
            Some(g) => (g.id().0, member_mask(g.ranks()), g.size() as u64),
            None => (0, 0, 0),
        };
        let dtype = ev.dtype.map_or(0, |d| u64::from(d.code()) + 1);
        let timed = if ev.timed { TIMED } else { 0 };
        let meta = u64::from(ev.op.code()) | timed | (dtype << 16) | (size << 32);
        // Relaxed: inside the sequence lock (see the module docs).
        slot.meta.store(meta, Ordering::Relaxed);
        slot.group.store(group, Ordering::Relaxed);
        slot.members.store(members, Ordering::Relaxed);
        slot.op_seq.store(ev.seq, Ordering::Relaxed);
        slot.count.store(ev.count, Ordering::Relaxed);
        slot.start.store(ev.start_ns, Ordering::Relaxed);
        slot.end.store(0, Ordering::Relaxed);
        Self::unlock(slot, index);
        if owner {
            self.header.writers.leave();
        }
        index
    }

    /// Records that untimed operation `index` blocks now (`now_ns`), unless it did before or
    /// its record has been reused (see "Untimed records" in the module documentation).
    /// The clock (`now_ns`) is read only when the record has no stamp yet.
    #[cold]
    pub fn blocked(&self, index: u64, now_ns: impl FnOnce() -> u64) {
        let slot = self.slot(index);
        // Relaxed: only skips a record already reused (a reuse after it: the documented race),
        // or already stamped (only this operation stamps it).
        if slot.seq.load(Ordering::Relaxed) == (index + 1) << 1 && slot.start.load(Ordering::Relaxed) == 0 {
            // Relaxed: a single word that readers take whole; the record's other fields are not
            // published by it.
            let _ = slot.start.compare_exchange(0, now_ns(), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Records the end of operation `index` (started at `start_ns`), unless its record has been
    /// reused meanwhile: one store (see the module documentation). An untimed operation passes
    /// 0 for both times.
    #[inline]
    pub fn finish(&self, index: u64, state: RecordState, start_ns: u64, end_ns: u64) {
        let slot = self.slot(index);
        // Relaxed: only skips a record already reused; a reuse after this load is told apart
        // by the tag.
        if slot.seq.load(Ordering::Relaxed) == (index + 1) << 1 {
            // Release: a reader that sees the end sees the record it ends (stored before).
            slot.end.store(end_word(index, state, end_ns.saturating_sub(start_ns)), Ordering::Release);
        }
    }

    /// The slot of record `index`: a mask where the capacity is a power of two (the default 64),
    /// which spares every operation two 64-bit divisions.
    #[inline]
    fn slot(&self, index: u64) -> &Slot {
        let n = self.slots.len() as u64;
        let i = if n.is_power_of_two() { index & (n - 1) } else { index % n };
        &self.slots[i as usize]
    }

    /// Takes `slot` for writing record `index` as the only writing thread (the bias's owner).
    fn take(slot: &Slot, index: u64) {
        // Relaxed: the release fence that follows orders it before the field stores (the
        // writer half of the sequence lock).
        slot.seq.store(((index + 1) << 1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Takes `slot` for writing record `index` (from any even value). False when another
    /// writer keeps it busy for long (the event is dropped rather than waiting).
    fn lock(slot: &Slot, index: u64) -> bool {
        let odd = ((index + 1) << 1) | 1;
        for _ in 0..1000 {
            // Relaxed: the compare-exchange below decides; the fence after it orders the field
            // stores.
            let cur = slot.seq.load(Ordering::Relaxed);
            if cur & 1 == 1 {
                // Another thread of this rank is inside the record: it only stores a few words.
                std::hint::spin_loop();
                continue;
            }
            // Relaxed on the exchange itself: the release fence that follows orders it before
            // the field stores (the writer half of the sequence lock).
            if slot.seq.compare_exchange(cur, odd, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                fence(Ordering::Release);
                return true;
            }
        }
        false
    }

    fn unlock(slot: &Slot, index: u64) {
        // Release: a reader that sees this value sees every field stored before it.
        slot.seq.store((index + 1) << 1, Ordering::Release);
    }

    /// Reads every record still in the ring, oldest first, without disturbing the writer.
    pub fn snapshot(&self, rank: Rank) -> RankRecords {
        let mut out = RankRecords { rank, pid: 0, total: 0, records: Vec::new(), unreadable: 0 };
        if !self.ready() {
            return out;
        }
        // Relaxed: published with the magic (acquired in `ready`).
        out.pid = self.header.pid.load(Ordering::Relaxed) as u32;
        // Relaxed: a record index; each record is validated by its own sequence lock.
        let head = self.header.head.load(Ordering::Relaxed);
        out.total = head;
        let cap = self.slots.len() as u64;
        for index in head.saturating_sub(cap)..head {
            match self.read(index) {
                Some(r) => out.records.push(r),
                None => out.unreadable += 1,
            }
        }
        out
    }

    /// Reads record `index` consistently, or None (being written, reused, or never written).
    fn read(&self, index: u64) -> Option<FlightRecord> {
        let slot = self.slot(index);
        let want = (index + 1) << 1;
        for _ in 0..100 {
            // Acquire: pairs with the writer's release store of the even value.
            let s1 = slot.seq.load(Ordering::Acquire);
            if s1 != want {
                if s1 & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                return None;
            }
            // Relaxed: validated by the sequence check below.
            let fields = [&slot.meta, &slot.group, &slot.members, &slot.op_seq, &slot.count, &slot.start, &slot.end]
                .map(|w| w.load(Ordering::Relaxed));
            // Acquire fence: orders the field loads before the second load of `seq`.
            fence(Ordering::Acquire);
            // Relaxed: ordered by the fence above.
            if slot.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            let [meta, group, members, op_seq, count, start, end] = fields;
            let timed = meta & TIMED != 0;
            let (state, end_ns) = match read_end(index, end) {
                Some((state, took)) => (state, if timed { start + took } else { 0 }),
                None => (RecordState::Started, 0),
            };
            let size = (meta >> 32) as u32;
            let ranks = (group != 0 && members.count_ones() == size)
                .then(|| (0..64u32).filter(|&r| members & (1 << r) != 0).map(Rank).collect());
            let dtype = match (meta >> 16) & 0xff {
                0 => None,
                c => DType::from_code(c as i64 - 1).ok(),
            };
            return Some(FlightRecord {
                index,
                op: Op::from_code((meta & 0xff) as u8).map_or("?", Op::name),
                group_id: group,
                group_size: size,
                group_ranks: ranks,
                seq: op_seq,
                count,
                dtype,
                state,
                timed,
                start_ns: start,
                end_ns,
            });
        }
        None
    }
}

/// Bit r for every global rank r below 64; 0 if any rank is 64 or more.
fn member_mask(ranks: &[Rank]) -> u64 {
    let mut m = 0u64;
    for r in ranks {
        if r.0 >= 64 {
            return 0;
        }
        m |= 1 << r.0;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Mem([u8; RECORD_BYTES * 5]);

    /// A timed record whose every field is derived from `v` (a torn read mixes two).
    fn derived(op: Op, v: u64) -> RecordStart<'static> {
        RecordStart { op, group: None, seq: v, count: v * 3, dtype: None, timed: true, start_ns: v * 7 }
    }

    fn ring(mem: &mut Mem) -> FlightRing<'_> {
        // SAFETY: `mem` is 64-aligned, zero-filled, 5 records long (4 + header), borrowed.
        unsafe { FlightRing::from_raw(mem.0.as_mut_ptr(), 4) }
    }

    #[test]
    fn records_wrap_and_finish_only_their_own_slot() {
        let mut mem = Mem([0; RECORD_BYTES * 5]);
        let r = ring(&mut mem);
        assert_eq!(r.snapshot(Rank(1)).records.len(), 0, "uninitialised ring reads as empty");
        r.init(Rank(1), 42);
        let g = Group::new(4, Rank(1), &[Rank(3), Rank(1)], Ok(())).unwrap();
        let ev = |seq| RecordStart {
            op: Op::AllReduce,
            group: Some(&g),
            seq,
            count: 10,
            dtype: Some(DType::F32),
            timed: true,
            start_ns: 100 + seq,
        };
        let first = r.begin(&ev(1));
        r.finish(first, RecordState::Completed, 101, 500);
        for s in 2..=6 {
            r.begin(&ev(s));
        }
        // Record 0 was reused by record 4: finishing it again changes nothing, even with its
        // end stored into the slot behind the check (the tag tells it apart).
        r.finish(first, RecordState::Failed, 101, 900);
        r.slots[0].end.store(end_word(first, RecordState::Failed, 800), Ordering::Relaxed);
        let snap = r.snapshot(Rank(1));
        assert_eq!((snap.pid, snap.total, snap.unreadable), (42, 6, 0));
        let seqs: Vec<u64> = snap.records.iter().map(|x| x.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5, 6]);
        assert!(snap.records.iter().all(|x| x.state == RecordState::Started), "{snap:?}");
        let last = snap.records.last().unwrap();
        assert_eq!(last.op, "allreduce");
        assert_eq!(last.state, RecordState::Started);
        assert_eq!(last.group_ranks, Some(vec![Rank(1), Rank(3)]));
        assert_eq!(last.group_text(), "[1, 3]");
        assert_eq!(last.dtype, Some(DType::F32));
        assert_eq!((last.count, last.start_ns, last.end_ns), (10, 106, 0));
        r.finish(last.index, RecordState::Failed, last.start_ns, 999);
        let again = r.snapshot(Rank(1));
        let last = again.records.last().unwrap();
        assert_eq!((last.state, last.end_ns), (RecordState::Failed, 999));
    }

    #[test]
    fn untimed_records_learn_when_they_blocked_once() {
        let mut mem = Mem([0; RECORD_BYTES * 5]);
        let r = ring(&mut mem);
        r.init(Rank(0), 1);
        let ev =
            |seq| RecordStart { op: Op::Broadcast, group: None, seq, count: 1, dtype: None, timed: false, start_ns: 0 };
        let quick = r.begin(&ev(1));
        r.finish(quick, RecordState::Completed, 0, 0);
        let slow = r.begin(&ev(2));
        r.blocked(slow, || 500);
        r.blocked(slow, || panic!("the clock is read only for the first stamp"));
        let snap = r.snapshot(Rank(0));
        let [a, b] = &snap.records[..] else { panic!("{snap:?}") };
        assert_eq!((a.timed, a.state, a.start_ns, a.end_ns), (false, RecordState::Completed, 0, 0), "{a:?}");
        assert_eq!((b.timed, b.state, b.start_ns, b.end_ns), (false, RecordState::Started, 500, 0), "{b:?}");
        r.finish(slow, RecordState::Failed, 0, 0);
        // A record reused by a later one is left alone.
        for s in 3..=6 {
            r.begin(&ev(s));
        }
        r.blocked(slow, || 700);
        let snap = r.snapshot(Rank(0));
        assert!(snap.records.iter().all(|x| x.start_ns == 0 && !x.timed), "{snap:?}");
    }

    #[test]
    fn concurrent_readers_never_see_torn_records() {
        let mut mem = Mem([0; RECORD_BYTES * 5]);
        let r = ring(&mut mem);
        r.init(Rank(0), 1);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..20_000u64 {
                    let idx = r.begin(&derived(Op::Barrier, i));
                    r.finish(idx, RecordState::Completed, i * 7, i * 11);
                }
                // Release: the reader that sees it also sees every record written before.
                stop.store(true, Ordering::Release);
            });
            let mut seen = 0;
            loop {
                // Acquire: pairs with the release store above.
                let done = stop.load(Ordering::Acquire);
                for rec in r.snapshot(Rank(0)).records {
                    let i = rec.seq;
                    assert_eq!((rec.count, rec.start_ns), (i * 3, i * 7), "torn record {rec:?}");
                    assert!(rec.end_ns == 0 || rec.end_ns == i * 11, "torn record {rec:?}");
                    seen += 1;
                }
                if done {
                    break;
                }
            }
            assert!(seen > 0);
        });
    }

    #[test]
    fn writing_threads_share_the_ring_without_losing_or_tearing_records() {
        // A first thread owns the ring (plain stores); a second starts writing mid-way (the
        // bias is revoked) while a reader checks every record it sees. No index is handed out
        // twice (the total is exact) and no record is torn.
        let mut mem = Mem([0; RECORD_BYTES * 5]);
        let r = ring(&mut mem);
        r.init(Rank(0), 1);
        let per_thread = 200_000u64;
        let started = std::sync::atomic::AtomicBool::new(false);
        let write = |base: u64| {
            for i in 1..=per_thread {
                let v = base + i;
                let idx = r.begin(&derived(Op::Send, v));
                r.finish(idx, RecordState::Completed, v * 7, v * 11);
                if i == 100 {
                    // Release: the second writer starts once the first owns the ring.
                    started.store(true, Ordering::Release);
                }
            }
        };
        std::thread::scope(|s| {
            let first = s.spawn(|| write(0));
            let second = s.spawn(|| {
                // Acquire: pairs with the store above.
                while !started.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                write(1 << 40)
            });
            while !(first.is_finished() && second.is_finished()) {
                std::thread::yield_now();
                for rec in r.snapshot(Rank(0)).records {
                    let v = rec.seq;
                    assert_eq!((rec.count, rec.start_ns), (v * 3, v * 7), "torn record {rec:?}");
                    assert!(rec.end_ns == 0 || rec.end_ns == v * 11, "torn record {rec:?}");
                }
            }
        });
        // No index was handed out twice, or lost.
        assert_eq!(r.snapshot(Rank(0)).total, 2 * per_thread);
        // A writer preempted inside a record may have left its slot unreadable, or its late end
        // in a reused slot (the ring's documented behaviour with several writers): one more
        // round of the ring from one thread, and every record reads back whole.
        for v in 1..=4u64 {
            let idx = r.begin(&derived(Op::Recv, v));
            r.finish(idx, RecordState::Completed, v * 7, v * 11);
        }
        let snap = r.snapshot(Rank(0));
        assert_eq!((snap.total, snap.unreadable), (2 * per_thread + 4, 0));
        assert!(snap.records.iter().all(|x| x.state == RecordState::Completed && x.op == "recv"), "{snap:?}");
    }

    #[test]
    fn a_ring_of_any_capacity_keeps_its_last_records() {
        // 5 records (not a power of two: the slot is index modulo 5) after 12 operations.
        #[repr(C, align(64))]
        struct Mem6([u8; RECORD_BYTES * 6]);
        let mut mem = Mem6([0; RECORD_BYTES * 6]);
        // SAFETY: `mem` is 64-aligned, zero-filled, 6 records long (5 + header), borrowed.
        let r = unsafe { FlightRing::from_raw(mem.0.as_mut_ptr(), 5) };
        r.init(Rank(0), 7);
        for v in 1..=12u64 {
            let idx = r.begin(&RecordStart {
                op: Op::Send,
                group: None,
                seq: v,
                count: v,
                dtype: None,
                timed: true,
                start_ns: v,
            });
            r.finish(idx, RecordState::Completed, v, v + 1);
        }
        let snap = r.snapshot(Rank(0));
        assert_eq!((snap.total, snap.unreadable), (12, 0));
        assert_eq!(snap.records.iter().map(|x| x.seq).collect::<Vec<_>>(), vec![8, 9, 10, 11, 12]);
        assert!(snap.records.iter().all(|x| x.state == RecordState::Completed && x.end_ns == x.seq + 1), "{snap:?}");
    }
}
