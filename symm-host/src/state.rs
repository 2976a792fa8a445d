//! Per-group collective state and the round protocol every collective is built from.
//!
//! # Workspace (allocated collectively in the group on its first collective)
//! - `flags`: one record of [`RECORD_WORDS`] `i64` words per member. Member `j` writes record
//!   `j` of the other members' copies; each record is written by one writer only, and sits on
//!   its own 128-byte line pairs. Words: `READY` ([`ready`]: one word for even rounds, one
//!   for odd rounds), [`DONE`], [`REDUCED`] (monotonic round numbers), two sets (even and odd
//!   rounds) of facts [`SRC`], [`RED`], [`SIG`], [`LEN`], [`MAX`] (about the writer's round,
//!   written before `READY`, on the same cache line), [`ACK`]
//!   (point-to-point acknowledgements), [`CALLS`] (the writer's collective call number, validation
//!   mode only), [`EAGER_WAIT`], [`EAGER_SIG`], [`EAGER_LEN`] (small broadcasts, see
//!   [`eager`](super::eager)), and, alone on the record's last line, [`FAILED`] (the writer
//!   found the members out of step, see [`wait`](super::wait)).
//! - `ll`: two small-message slots per member (see [`ll`](super::ll)).
//! - `eager`: a ring of small-broadcast slots per member (see [`eager`](super::eager)).
//! - `stage`: staging area for inputs that are not in the heap, encoded low-precision data,
//!   and results other members read.
//! - `mail`: one point-to-point mailbox per sender, [`MAIL_SLOTS`] chunks deep.
//!
//! # A round
//! Every collective call takes one or more rounds, numbered by `seq`, identical on every
//! member because members call the same collectives in the same order. In a round a member
//! publishes where its data is and what it was asked to do (`SRC`, `SIG`, ...) followed by
//! `READY = seq` (one put-with-signal per peer: the facts are visible before the flag), waits
//! for every peer's `READY >= seq`, checks that all were asked the same thing, moves data by
//! reading peers' memory (direct loads when the backend maps peers' heaps, `get` otherwise),
//! and signals `DONE = seq` when it no longer reads peers' memory. A member overwrites memory
//! that peers read only after their `DONE` for the round that used it.
//!
//! # Rounds follow each other
//! In every round, of this protocol or of the small-message path, every member waits for
//! something each peer sent in that round (its `READY`, or its message). So a member that has
//! finished round `s` knows that every peer has started round `s`, hence finished round
//! `s - 1`. Memory used once every two rounds (the facts of even and odd rounds, the
//! small-message slots) is therefore free again when its writer gets to reuse it, without a
//! DONE flag; a round that ends in an error still waits for every peer first.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use symm_core::backend::{HostMapped, SignalWidth, WaitSite};
use symm_core::buffer::SymmBuffer;
use symm_core::comm::SymmetricHeap;
use symm_core::dfx::Started;
use symm_core::dtype::DType;
use symm_core::error::{ArgError, AtRank, Error, Result};
use symm_core::group::Group;
use symm_core::op::{CmpOp, SignalOp};

use super::try_lock::TryLock;
pub use super::wait::Flag;

/// Words per member record (32 words: 256 bytes, two 128-byte line pairs).
///
/// Layout, by 64-byte line: (0) `READY` of even rounds, the facts of even rounds, [`DONE`],
/// [`REDUCED`]; (1) `READY` of odd rounds, the facts of odd rounds; (2) the point-to-point
/// counters, [`CALLS`] and the small-broadcast words; (3) [`FAILED`], written at most once, so
/// that the line stays in its readers' caches (every call reads it). A round's flag and facts share one line, so a reader that sees the
/// flag has the facts in the same transfer.
pub const RECORD_WORDS: usize = 32;
/// Round number of the writer's published data, for even rounds (see [`ready`]).
const READY_EVEN: usize = 0;
/// Round number of the writer's published data, for odd rounds.
const READY_ODD: usize = 8;
/// Facts of a round follow its `READY` word: a writer may be one round ahead of a reader (it
/// only waits for the reader's DONE of the round before), so it must not overwrite the facts
/// of the round the reader is still in; even and odd rounds use different words.
const FACTS_OFFSET: usize = 1;
/// Round number up to which the writer has finished reading the reader's memory.
pub const DONE: usize = 6;
/// Round number of the writer's reduced part (two-shot allreduce).
pub const REDUCED: usize = 7;
/// Heap offset of the writer's source data for the round (index into the facts).
pub const SRC: usize = 0;
/// Heap offset of the writer's result data for the round.
pub const RED: usize = 1;
/// The writer's call signature (kind, dtype, op, format, root); -1: the writer rejected its
/// arguments.
pub const SIG: usize = 2;
/// An element count of the writer's call (what a peer must agree with).
pub const LEN: usize = 3;
/// A second count (alltoall: the writer's largest segment; reduce_scatter: part stride).
pub const MAX: usize = 4;
/// Number of published fact words (SRC..=MAX), sent with READY in one put.
pub const FACT_WORDS: usize = 5;
/// Chunks of the reader's the writer has consumed (point-to-point).
pub const ACK: usize = 17;
/// The writer's current collective call number in the group, independent of rounds (written
/// in validation mode only, see [`validate`](super::validate)).
pub const CALLS: usize = 18;
/// The small broadcast the writer has entered as a member (see [`eager`](super::eager)).
pub const EAGER_WAIT: usize = 19;
/// The writer's signature and count in that broadcast (written before [`EAGER_WAIT`]).
pub const EAGER_SIG: usize = 20;
pub const EAGER_LEN: usize = 21;
/// Nonzero once the writer takes no more collectives in the group: it found the members out of
/// step (a peer in another collective, or that disagrees on a small broadcast's root), or its
/// collective timed out. Its collective call number (bits 16 and up), why (bits 8-15) and op
/// code (bits 0-7). See [`wait`](super::wait).
pub const FAILED: usize = 24;
const _: () = assert!(READY_EVEN + FACTS_OFFSET + FACT_WORDS <= DONE && READY_ODD + FACTS_OFFSET + FACT_WORDS <= 16);
const _: () = assert!(REDUCED < READY_ODD && EAGER_LEN < 24 && EAGER_LEN < RECORD_WORDS);
const _: () = assert!(FAILED.is_multiple_of(8) && FAILED < RECORD_WORDS);

/// The word that carries `READY = seq` (the round's published data).
pub const fn ready(seq: u64) -> usize {
    if seq.is_multiple_of(2) {
        READY_EVEN
    } else {
        READY_ODD
    }
}

/// The first fact word of round `seq`.
const fn facts_word(seq: u64) -> usize {
    ready(seq) + FACTS_OFFSET
}

/// Reads of a flag before a wait falls back to the backend's blocking wait (about a
/// microsecond), while every rank has a core.
const FAST_SPINS: u32 = 512;
/// The same where waiters share cores with the peers they wait for: the peer may need this
/// very core, so the wait hands it over (the backend's wait yields) almost at once.
const FAST_SPINS_SHARED: u32 = 16;

/// Reads of a flag before a wait blocks, for `b`'s placement of ranks on cores.
pub fn fast_spins<B: HostMapped + ?Sized>(b: &B) -> u32 {
    if b.waiters_share_cores() {
        FAST_SPINS_SHARED
    } else {
        FAST_SPINS
    }
}

/// Chunks in flight per point-to-point pair. Many small chunks (64 of 16 KiB by default) rather
/// than a few large ones: the receiver copies one chunk out while the sender copies the next in,
/// so a message of a few chunks takes little more than one copy (docs/performance-log.md,
/// "Send/recv").
pub const MAIL_SLOTS: usize = 64;
/// Bytes of a mailbox chunk's flag and header (total message bytes, dtype code), before the
/// payload of a small message (larger ones start theirs on the next line; see
/// [`p2p`](super::p2p)).
pub const MAIL_HEADER: usize = 24;

/// The collectives' settings: those of the communicator's [`Config`](symm_core::config::Config),
/// fixed when it was created (the environment's, for a backend that keeps none).
#[derive(Clone, Debug)]
pub struct Tunables {
    /// Bytes of the staging area (`SYMM_COLL_WORKSPACE`, default 16 MiB).
    pub stage_bytes: usize,
    /// Largest allreduce (bytes) done one-shot (`SYMM_ALLREDUCE_ONESHOT_MAX`, default 8 KiB).
    pub oneshot_max: usize,
    /// Bytes of one mailbox chunk (`SYMM_P2P_CHUNK`, default 16 KiB, rounded up to 64).
    pub mail_chunk: usize,
    /// Calls moving at least this many bytes per member write their outputs with streaming
    /// (non-temporal) stores (`SYMM_STREAM_STORES_MIN`, default 16 MiB: half the L3 of the
    /// machines measured; smaller outputs stay in the cache for the caller).
    pub stream_min: usize,
    /// Largest message (bytes per member pair) that travels in the small-message slots
    /// (`SYMM_LL_MAX`, default [`ll::DEFAULT_MAX_BYTES`](super::ll::DEFAULT_MAX_BYTES), at most
    /// [`ll::MAX_BYTES`](super::ll::MAX_BYTES); 0: never).
    /// Members that disagree still complete: see [`ll`](super::ll).
    pub ll_max: usize,
    /// Largest allreduce (bytes) on the small-message path, within `ll_max`
    /// (`SYMM_ALLREDUCE_LL_MAX`, default 1 KiB). Above it the one-shot, which reads heap inputs
    /// in place, is faster (docs/performance-log.md, "The allreduce's small-message limit").
    /// The other collectives keep `ll_max`: theirs cross over elsewhere.
    pub allreduce_ll_max: usize,
    /// Largest broadcast sent eagerly (`SYMM_BCAST_EAGER_MAX`, at most
    /// [`eager::SHARED_MAX_BYTES`](super::eager::SHARED_MAX_BYTES); 0: never). `None`: by the
    /// placement ([`eager::max_bytes`](super::eager::max_bytes)). The same on every rank.
    pub bcast_eager_max: Option<usize>,
    /// Read peers with `get` even when their heaps are mapped (`SYMM_COLL_ACCESS=get`), to
    /// exercise the path device backends without load/store access take.
    pub force_get: bool,
    /// The default transport format (`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`), or the error its
    /// value gives (raised by the reductions that would use it).
    pub default_low_precision: std::result::Result<Option<DType>, ArgError>,
    /// Cross-rank validation of every collective (`SYMM_VALIDATE=1`).
    pub validate: bool,
}

impl Tunables {
    /// From the environment (bad values are errors naming the variable).
    pub fn from_env() -> std::result::Result<Tunables, ArgError> {
        symm_core::config::Config::from_env().map(|c| Tunables::from_config(&c)).map_err(|e| e.into_arg())
    }

    /// From a communicator's settings.
    pub fn from_config(c: &symm_core::config::Config) -> Tunables {
        Tunables {
            stage_bytes: c.coll_workspace,
            oneshot_max: c.allreduce_oneshot_max,
            mail_chunk: c.p2p_chunk,
            stream_min: c.stream_stores_min,
            ll_max: c.ll_max,
            allreduce_ll_max: c.allreduce_ll_max,
            bcast_eager_max: c.bcast_eager_max,
            force_get: c.coll_access_get,
            default_low_precision: Ok(c.low_precision),
            validate: c.validate,
        }
    }
}

/// Mutable per-group progress, behind the state's lock (a second thread that finds it taken
/// gets `Error::ConcurrentUse`).
#[derive(Debug, Default)]
pub struct Progress {
    /// The last round number used.
    pub seq: u64,
    /// Collective calls made in the group (the sequence number of the latest one): the same on
    /// every member, since every member makes the same collective calls.
    pub colls: u64,
    /// Point-to-point calls (send, recv) this rank made in the group.
    pub p2p_calls: u64,
    /// Rounds whose readers must be done before each half of `stage` may be overwritten
    /// (one-shot rounds alternate halves; other rounds use the whole area and set both).
    pub stage_round: [u64; 2],
    /// Chunks sent to each member (point-to-point), by group rank.
    pub sent: Vec<u64>,
    /// Chunks received from each member.
    pub received: Vec<u64>,
    /// The highest acknowledgement seen from each member (point-to-point).
    pub acked: Vec<u64>,
    /// Small broadcasts made in the group (see [`eager`](super::eager)): the same on every
    /// member.
    pub bcasts: u64,
    /// The latest `EAGER_WAIT` seen from each member (a root's view of which slots are free).
    pub eager_seen: Vec<u64>,
    /// Small broadcast `bcasts` as this member ran it: its root and its signature and count
    /// (see [`wait`](super::wait): a peer that wrote that broadcast's message too disagrees on
    /// the root).
    pub last_bcast: Option<LastBcast>,
    /// Where small-message reductions gather the peers' messages (grown on demand).
    pub inbox: Vec<u8>,
    /// Why the group takes no more collectives: one timed out, or lost a peer, on this member
    /// (the message its later collectives fail with).
    pub out_of_step: Option<String>,
}

/// A small broadcast as one member ran it ([`Progress::last_bcast`]; `None` there: none yet, or
/// its root is unknown to this member).
#[derive(Clone, Copy, Debug, Default)]
pub struct LastBcast {
    pub root: usize,
    pub sig: i64,
    pub count: usize,
}

/// The collectives' state for one group on one rank.
#[derive(Debug)]
pub struct CollState {
    pub flags: SymmBuffer,
    pub stage: SymmBuffer,
    pub mail: SymmBuffer,
    /// Small-message slots (see [`ll`](super::ll)): two per member, written by that member.
    pub ll: SymmBuffer,
    /// Small-broadcast slots (see [`eager`](super::eager)): a ring per member, written by it.
    pub eager: SymmBuffer,
    /// The largest broadcast sent through `eager` ([`eager::max_bytes`](super::eager::max_bytes)).
    pub eager_max: usize,
    pub tun: Tunables,
    pub progress: TryLock<Progress>,
    /// The call holding `progress`: op code (bits 0-7) and sequence number (above), for the
    /// message a second thread gets.
    pub busy: AtomicU64,
    /// Heap bases of the members when every member's heap is mapped here and direct loads
    /// are allowed (computed once: mappings never change).
    pub mapped: Option<Vec<SendPtr>>,
    /// The caller's own heap base ([`Backend::local_heap_base`], which never changes) and
    /// group rank, looked up once.
    pub base: SendPtr,
    pub me: usize,
}

/// A peer heap address that may cross threads (the mapping outlives the state).
#[derive(Clone, Copy, Debug)]
pub struct SendPtr(pub *mut u8);

// SAFETY: the pointer is only an address into a shared mapping that lives as long as the
// communicator; every access through it follows the round protocol.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl CollState {
    /// The state of `group`, allocating the workspace collectively on first use (calling
    /// `before_blocking` first: see [`CollOptions::before_blocking`](symm_core::CollOptions)).
    pub fn of<'g, B: HostMapped + ?Sized>(
        b: &B,
        group: &'g Group,
        before_blocking: Option<fn()>,
    ) -> Result<&'g CollState> {
        group.engine_state(b.rank(), || {
            // Collective allocations and a barrier follow: they wait for every member.
            if let Some(f) = before_blocking {
                f();
            }
            let rank = b.rank();
            let me = group.member().at(rank)?.index();
            let mut tun = match b.settings() {
                Some(c) => Tunables::from_config(c),
                None => Tunables::from_env().at(rank)?,
            };
            let n = group.size();
            // Large groups need more than the smallest `SYMM_COLL_WORKSPACE` for one block per
            // member (reduce-scatter + allgather, reduce_scatter's per-member windows).
            tun.stage_bytes = tun.stage_bytes.max(super::algo::min_stage_bytes(n));
            let eager_max = tun.bcast_eager_max.unwrap_or_else(|| super::eager::max_bytes(b.waiters_share_cores()));
            // Every member fails a collective allocation the same way, so a failure here can
            // give back what was taken and leave the group as it was.
            let sizes = [
                (n * RECORD_WORDS, DType::I64),
                (tun.stage_bytes, DType::U8),
                (n * MAIL_SLOTS * tun.mail_chunk, DType::U8),
                (super::ll::buffer_bytes(n), DType::U8),
                (super::eager::buffer_bytes(n, eager_max), DType::U8),
            ];
            let mut bufs = Vec::with_capacity(sizes.len());
            for (len, dtype) in sizes {
                match b.alloc(group, len, dtype) {
                    Ok(buf) => bufs.push(buf),
                    Err(e) => {
                        for buf in bufs.into_iter().rev() {
                            b.free(buf)?;
                        }
                        return Err(e);
                    }
                }
            }
            let [flags, stage, mail, ll, eager]: [SymmBuffer; 5] = bufs.try_into().expect("five buffers");
            // Fresh allocations may reuse memory: flags and slots start at zero (round 0 =
            // nothing yet).
            let base = b.local_heap_base();
            for buf in [&flags, &ll, &eager] {
                // SAFETY: the caller's copy of `buf` is `bytes()` long; nobody else writes it
                // until this rank has published something (the barrier below orders that).
                unsafe { std::ptr::write_bytes(base.add(buf.heap_offset()), 0, buf.bytes()) };
            }
            // And every mailbox slot's flag (its first word).
            for slot in 0..n * MAIL_SLOTS {
                // SAFETY: inside the caller's copy of `mail` (slots of `mail_chunk` bytes,
                // 8-aligned); nobody else writes it before the barrier below.
                unsafe { base.add(mail.heap_offset() + slot * tun.mail_chunk).cast::<u64>().write(0) };
            }
            // The pages this member reads when it receives: its own mailboxes (the
            // small-message slots were written above); peers write them only after the barrier.
            // SAFETY: the caller's own `mail` buffer.
            unsafe { touch_pages(base.add(mail.heap_offset()), mail.bytes()) };
            b.barrier_group(group, b.default_timeout())?;
            let mapped = if tun.force_get {
                None
            } else {
                group.ranks().iter().map(|&r| b.peer_heap_base(r).map(SendPtr)).collect::<Option<Vec<_>>>()
            };
            if let Some(bases) = &mapped {
                // The pages this member writes when it sends: its small-message slots and its
                // mailbox in every peer's heap (see `touch_pages`). Only this member writes them,
                // and only once this set-up is over.
                let (mail_each, ll_each) = (MAIL_SLOTS * tun.mail_chunk, super::ll::buffer_bytes(1));
                let eager_each = super::eager::ring_bytes(eager_max);
                for peer in bases {
                    // SAFETY: the ranges lie inside the peer's `mail`, `ll` and `eager` buffers,
                    // mapped.
                    unsafe {
                        touch_pages(peer.0.add(ll.heap_offset() + me * ll_each), ll_each);
                        touch_pages(peer.0.add(eager.heap_offset() + me * eager_each), eager_each);
                        touch_pages(peer.0.add(mail.heap_offset() + me * mail_each), mail_each);
                    }
                }
            }
            Ok::<_, Error>(CollState {
                mapped,
                base: SendPtr(base),
                me,
                flags,
                stage,
                mail,
                ll,
                eager,
                progress: TryLock::new(Progress {
                    eager_seen: vec![0; n],
                    sent: vec![0; n],
                    received: vec![0; n],
                    acked: vec![0; n],
                    ..Progress::default()
                }),
                busy: AtomicU64::new(0),
                eager_max,
                tun,
            })
        })
    }
}

/// One collective call's view of the group: who, where, how long to wait.
pub struct Ctx<'a, B: HostMapped + ?Sized> {
    pub b: &'a B,
    pub group: &'a Group,
    pub st: &'a CollState,
    pub me: usize,
    pub n: usize,
    pub timeout: Duration,
    pub op: &'static str,
    /// Heap bases of the members, when every member's heap is mapped and loads are allowed.
    pub mapped: Option<&'a [SendPtr]>,
    /// The caller's own heap ([`Backend::local_heap_base`], read once: flag polls use it).
    pub base: *mut u8,
    /// The call's sequence number in the group ([`Progress::colls`], or
    /// [`Progress::p2p_calls`] for send/recv); 0 outside a call.
    pub call: u64,
    /// Whether the call is point-to-point (its waits concern one peer only).
    pub p2p: bool,
    /// The call's flight record, told when a wait blocks ([`Ctx::blocking`]).
    pub record: Started,
    /// The caller's [`CollOptions::before_blocking`](symm_core::CollOptions).
    pub before_blocking: Option<fn()>,
    /// Small broadcasts made in the group before this call ([`Progress::bcasts`]) and the last
    /// of them: what the call's waits compare peers' small-broadcast slots with.
    pub bcasts: u64,
    pub last_bcast: Option<LastBcast>,
    /// Whether the call's waits look at peers' small-broadcast slots (not in small broadcasts,
    /// whose own waits do, nor in point-to-point calls or rejections).
    pub watch_eager: bool,
    /// Set when the call found the members out of step ([`Ctx::news`]): the group then takes
    /// no more collectives here, and the peers are told.
    pub diverged: std::cell::Cell<bool>,
}

impl<'a, B: HostMapped + ?Sized> Ctx<'a, B> {
    /// A context for `op` in `group` (whose collective state is `st`).
    pub fn new(b: &'a B, group: &'a Group, st: &'a CollState, timeout: Duration, op: &'static str) -> Self {
        let (me, mapped, base) = (st.me, st.mapped.as_deref(), st.base.0);
        Ctx {
            b,
            group,
            st,
            me,
            n: group.size(),
            timeout,
            op,
            mapped,
            base,
            call: 0,
            p2p: false,
            record: Started::NONE,
            before_blocking: None,
            bcasts: 0,
            last_bcast: None,
            watch_eager: false,
            diverged: std::cell::Cell::new(false),
        }
    }

    /// Called by a wait of the call that stops spinning: runs the caller's callback
    /// ([`Ctx::about_to_block`]) and stamps an untimed flight record with the moment.
    pub fn blocking(&self) {
        self.about_to_block();
        self.record.blocked(self.b);
    }

    /// Runs the caller's [`CollOptions::before_blocking`](symm_core::CollOptions), if any.
    #[inline]
    pub fn about_to_block(&self) {
        if let Some(f) = self.before_blocking {
            f();
        }
    }

    /// Heap offset of word `word` of member `writer`'s record (the same in every copy).
    pub fn word_offset(&self, writer: usize, word: usize) -> usize {
        self.st.flags.heap_offset() + (writer * RECORD_WORDS + word) * 8
    }

    /// Reads fact `fact` of round `seq` from `writer`'s record in the caller's own copy.
    pub fn read_fact(&self, writer: usize, seq: u64, fact: usize) -> i64 {
        self.read_word(writer, facts_word(seq) + fact)
    }

    /// Reads word `word` of `writer`'s record in the caller's own copy.
    pub fn read_word(&self, writer: usize, word: usize) -> i64 {
        self.read_at(self.word_offset(writer, word))
    }

    /// Reads the flag word at heap offset `offset` of the caller's own heap.
    pub fn read_at(&self, offset: usize) -> i64 {
        let p = self.base.wrapping_add(offset);
        // SAFETY: callers pass the offset of a flag word of the workspace (the flags records,
        // the small-message slots) of the caller's heap, 8-aligned (the buffers are
        // granule-aligned); peers write it atomically, so read it atomically.
        let a = unsafe { &*p.cast::<std::sync::atomic::AtomicI64>() };
        // Acquire: what the writer wrote before the flag (facts, a line's data) is read after it.
        a.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Publishes this member's facts for round `seq` and `READY = seq` to every peer.
    pub fn publish(&self, seq: u64, facts: [i64; FACT_WORDS]) -> Result<()> {
        for j in (0..self.n).filter(|&j| j != self.me) {
            self.publish_to(j, seq, facts)?;
        }
        Ok(())
    }

    /// Publishes facts and `READY = seq` to member `j` only (one put-with-signal: the facts
    /// are visible before the flag). The last round that used the same fact words is `seq - 2`,
    /// which `j` has finished: the caller finished round `seq - 1`, in which it heard from `j`
    /// (see "Rounds follow each other" in the module documentation).
    pub fn publish_to(&self, j: usize, seq: u64, facts: [i64; FACT_WORDS]) -> Result<()> {
        let mut bytes = [0u8; FACT_WORDS * 8];
        for (dst, w) in bytes.chunks_exact_mut(8).zip(facts) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
        // SAFETY: `bytes` lives across the call; the destination words are inside member j's
        // flags buffer (record `me`, words SRC..=MAX).
        unsafe {
            self.b.put_signal_bytes(
                self.group.ranks()[j],
                self.word_offset(self.me, facts_word(seq)),
                bytes.as_ptr(),
                bytes.len(),
                self.word_offset(self.me, ready(seq)),
                SignalWidth::W64,
                SignalOp::Set,
                seq as i64,
            )
        }
    }

    /// Sets word `word` of this member's record to `value` on member `j`.
    pub fn signal(&self, j: usize, word: usize, value: u64) -> Result<()> {
        self.b.signal_at(
            self.group.ranks()[j],
            self.word_offset(self.me, word),
            SignalWidth::W64,
            SignalOp::Set,
            value as i64,
        )
    }

    /// Sets word `word` of this member's record to `value` on every peer.
    pub fn signal_all(&self, word: usize, value: u64) -> Result<()> {
        for j in (0..self.n).filter(|&j| j != self.me) {
            self.signal(j, word, value)?;
        }
        Ok(())
    }

    /// Waits until `writer`'s word `word` in the caller's copy is at least `value`.
    pub fn wait_word(&self, writer: usize, word: usize, value: u64, what: &'static str) -> Result<()> {
        let flag = Flag { writer, offset: self.word_offset(writer, word), value, what };
        self.wait_flag(flag, &|k| self.word_offset(k, word))
    }

    /// Waits until `flag` reaches its value. `same_word(k)` is the offset of the word of the
    /// same meaning that member `k` writes: a timeout lists the members whose word arrived
    /// and those still pending.
    pub fn wait_flag(&self, flag: Flag, same_word: &dyn Fn(usize) -> usize) -> Result<()> {
        // Fast path: peers usually arrive within a microsecond or two of each other; watch the
        // word briefly before paying for the diagnostics a blocking wait carries.
        for spin in 0..fast_spins(self.b) {
            if flag.reached(self) {
                return Ok(());
            }
            if spin % 64 == 63 {
                std::hint::spin_loop();
            }
        }
        self.blocking();
        // Sharing cores, the awaited peer usually needs this one: hand it over a while before
        // the backend's wait (whose diagnostics cost more than a small call where every wait
        // comes here: 4 ranks on 2 cores).
        if self.b.waiters_share_cores() && self.poll(&|| flag.reached(self)) {
            return Ok(());
        }
        let writer = flag.writer;
        let site = || WaitSite {
            op: format!("{} (round {})", self.op, flag.value),
            group: Some(self.group.ranks().to_vec()),
            location: format!(
                "the {} flag of group rank {writer} (global rank {})",
                flag.what,
                self.group.ranks()[writer]
            ),
            // Collective waits watch every member: a member waiting on another that lost a
            // third is stuck too. Point-to-point waits concern their one peer.
            watch: if self.p2p { vec![self.group.ranks()[writer]] } else { Vec::new() },
            waiting_on: Some(self.group.ranks()[writer]),
        };
        let deadline = std::time::Instant::now() + self.timeout;
        // With the words that tell that the writer will not send it (see `wait`): the backend
        // wakes on any of them.
        // Point-to-point calls have no news: the backend's wait on the flag alone.
        let news = if self.p2p {
            Err(Error::Unsupported { rank: self.b.rank(), backend: "symm-core", what: String::new() })
        } else {
            self.wait_with_news(&[(flag.offset, flag.value as i64)], &[writer], &|| flag.reached(self), deadline, &site)
        };
        let waited = match news {
            Err(Error::Unsupported { .. }) => self
                .b
                .wait_signal_at(flag.offset, SignalWidth::W64, CmpOp::Ge, flag.value as i64, self.timeout, &site)
                .map(|_| ()),
            Err(Error::Timeout(mut t)) => {
                // Described as the wait on the flag alone.
                t.condition = format!("signal >= {}", flag.value);
                t.last_observed = self.read_at(flag.offset).to_string();
                t.waited = self.timeout.saturating_sub(deadline.saturating_duration_since(std::time::Instant::now()));
                Err(Error::Timeout(t))
            }
            other => other,
        };
        match waited {
            Ok(()) => Ok(()),
            Err(Error::Timeout(mut t)) => {
                let arrived = |k: usize| self.read_at(same_word(k)) >= flag.value as i64;
                super::validate::explain_timeout(self, &mut t, writer, &arrived);
                Err(Error::Timeout(t))
            }
            Err(e) => Err(e),
        }
    }

    /// Waits for every peer's word `word` to reach `value`.
    pub fn wait_all(&self, word: usize, value: u64, what: &'static str) -> Result<()> {
        for j in (0..self.n).filter(|&j| j != self.me) {
            self.wait_word(j, word, value, what)?;
        }
        Ok(())
    }

    /// Address of the caller's staging area.
    pub fn my_stage(&self) -> *mut u8 {
        self.base.wrapping_add(self.st.stage.heap_offset())
    }

    /// The heap offset of `[ptr, ptr + bytes)` when it lies inside the caller's heap.
    pub fn heap_offset_of(&self, ptr: *const u8, bytes: usize) -> Option<usize> {
        let base = self.base as usize;
        let p = ptr as usize;
        (p >= base && p.checked_add(bytes)? <= base + self.b.heap_size()).then(|| p - base)
    }

    /// Member `j`'s bytes `[offset, offset + bytes)` of its heap, readable here: a direct
    /// pointer when mapped, else fetched with `get` into `tmp`.
    pub fn fetch(&self, j: usize, offset: usize, bytes: usize, tmp: &mut Vec<u8>) -> Result<*const u8> {
        if j == self.me {
            return Ok(self.base.wrapping_add(offset));
        }
        if let Some(bases) = self.mapped {
            return Ok(bases[j].0.wrapping_add(offset));
        }
        tmp.resize(bytes, 0);
        // SAFETY: `tmp` holds `bytes` writable bytes; the source range is inside member j's
        // heap (published by j for this round).
        unsafe { self.b.get_bytes(self.group.ranks()[j], offset, tmp.as_mut_ptr(), bytes)? };
        Ok(tmp.as_ptr())
    }
}

/// Reads one byte of every 4 KiB page of `[start, start + len)`, so that this process maps the
/// pages now: a first touch through a mapping is a page fault that would otherwise land on the
/// early messages, one per page and slot (docs/performance-log.md, "First use of a group's
/// pages"). It commits the group's mailboxes (1 MiB per member pair with the defaults) at
/// set-up instead of at first use.
///
/// # Safety
/// The range lies inside a live mapping, and nobody writes it concurrently.
unsafe fn touch_pages(start: *const u8, len: usize) {
    for page in (0..len).step_by(4096) {
        // SAFETY: caller's contract.
        unsafe { std::ptr::read_volatile(start.add(page)) };
    }
}
