//! The reference collectives: every collective of [`Collectives`](super::Collectives) written
//! once on the backend-neutral, stream-ordered primitives, for any backend that has nothing
//! better, and as the oracle the fast engines (the host engine, the `symm-host` crate) are
//! tested against.
//!
//! # What it uses
//! Only the contract: [`StreamBackend`]'s on-stream `put_signal_bytes_on`, `put_bytes_on`,
//! `get_bytes_on`, `signal_at_on`, `wait_signal_at_on`, `barrier_group_on`, events,
//! `synchronize_event` and `query_event`, its `reduce_local`, and
//! [`Backend::copy_to_heap`](crate::Backend::copy_to_heap) /
//! [`Backend::copy_from_heap`](crate::Backend::copy_from_heap) between host memory and the
//! caller's own heap. No [`HostMapped`](crate::backend::HostMapped), no peer pointers, no load
//! or store into heap memory or into the caller's buffers, so the same code serves a backend
//! whose heap and buffers are device memory:
//! - puts read the caller's buffers, or the member's *staging slot* in its own heap, where what
//!   the host makes (a descriptor, a chunk's header) is copied first; a chunk's payload joins
//!   its header there by a put to itself, ahead on the same stream;
//! - what arrived goes into the caller's buffers by a get from itself on the call's stream,
//!   ahead of the acknowledgement that frees the slot; descriptors and headers, which the host
//!   reads, by `copy_from_heap`;
//! - reductions run where the pieces arrived, by the backend's `reduce_local` (on the CPU
//!   backend the host kernel [`super::kernels::reduce`]; on a device its kernels), once every
//!   piece is in and this member's own puts have completed, before the acknowledgements.
//!
//! Low-precision transport ([`super::lowp`]'s format) is encoded by the backend's
//! `encode_local` into the member's staging slot and put from there; what arrived is decoded
//! and reduced where it is by its `reduce_encoded_local` (the host codec on the CPU backend; on
//! a device its operators).
//!
//! # Diagnostics
//! Every call is an operation of the flight recorder, the statistics and the log, like the
//! host engine's: a collective carries the group's call number, a point-to-point call this
//! member's own count; an untimed record shows when the call first blocked (a wait its stream
//! had not completed at once: always, since the stream's progress thread does the waiting); a
//! call refused (concurrent use, a group out of step) is counted and logged. Timeouts name the
//! call, the round's epoch, the flag, its peer and what it was waiting for. Two things differ
//! from the host engine: `SYMM_VALIDATE=1` adds nothing (every call's descriptor round already
//! compares what members must agree on, including every alltoall pair, on every member), so
//! members whose call numbers drifted apart after a failure are told by the group's refusal of
//! further collectives rather than by a comparison of call numbers; and a member that comes to
//! a call its peers have left waits out its own timeout (every round waits for each peer's
//! consent to reuse its slot), where the host engine's late member may still complete.
//!
//! # State
//! A [`ReferenceGroup`] is one group's state on a member. Creating it is collective: it
//! allocates its symmetric workspace with the heap allocator
//! ([`Backend::heap_alloc`](crate::Backend::heap_alloc)), creates two streams of the rank, sets
//! its own flags and joins a barrier. A [`Reference`] runs its collectives with the rank's
//! backend: owning the state ([`Reference::new`]; [`Reference::free`] releases the workspace
//! collectively, dropping it without `free` gives the range up locally
//! ([`Backend::heap_abandon`](crate::Backend::heap_abandon)), so that a member that drops it
//! never blocks), or borrowing it ([`Reference::on`]) from a backend's cache
//! ([`super::by_reference`], one state per group). One thread at a time drives a state (a
//! second gets [`Error::ConcurrentUse`]).
//!
//! Workspace of each member (the same offsets on every member), flags one 8-byte word apart
//! whatever their width:
//! ```text
//! data[j]       flag: member j's piece for this round is in slot[j]
//! ack[j]        flag: member j has consumed what this member put into j's slot[me]
//! p2p_data[j][k]  flag: member j's chunk is in place k of mail[j]
//! p2p_ack[j][k]   flag: member j has consumed this member's chunk in place k of j's mail[me]
//! slot[0..n]      one slot per member (what member j sent this member in a round)
//! mail[0..n]      one point-to-point mailbox per sender, of `mail_depth` places of a slot
//! stage           one slot this member's puts send from (read by nobody else)
//! ```
//!
//! # Algorithm
//! A collective is a sequence of *rounds*, every member in every round, each round one epoch.
//! In round `e` member i, for every member p (itself included): waits until `ack[p]` at i
//! holds epoch `e - 1` (p has consumed i's previous piece, so `slot[i]` at p is free), then
//! puts its piece for p (possibly empty) into `slot[i]` at p with `data[i] := e`
//! (`put_signal`, the data visible before the flag). Then for every member j it waits until
//! `data[j] == e` and copies `slot[j]` out of its heap (a reduction reduces the slots where
//! they are once all are in), and sets `ack[i] := e` at j. The first
//! round of every call exchanges a *descriptor* (the call, dtype, op, counts, root, format,
//! alltoall's split sizes, or "rejected"): every member sees every member's, so a
//! disagreement or a member's own rejection of its arguments fails the call on every member
//! after that round (`Mismatch`, `PeerRejected`), with the epochs still in step. The data
//! rounds follow, as many as the agreed sizes need through the bounded slots: allreduce and
//! reduce_scatter send the chunk (allreduce) or part (reduce_scatter) to every member and
//! reduce what arrived in group-rank order; allgather sends the chunk to every member;
//! broadcast's root sends, the others receive; alltoall sends each member its piece.
//! Point-to-point messages go through `mail`, a chunk at a time, each acknowledged: chunk e
//! of a channel goes in place `e mod mail_depth` once the receiver has acknowledged chunk
//! `e - mail_depth` there, so a sender runs up to `mail_depth` chunks ahead of its receiver
//! ([`ReferenceOptions::eager_max_bytes`]); a 16-byte header (size, dtype) starts every chunk, so a receiver whose buffer does not
//! match consumes the message and fails naming both. `sendrecv` waits for each direction on a
//! stream of its own and polls both ([`StreamBackend::query_event`]), moving whichever can
//! move, so any pairing completes at any size: rings, pairwise exchanges, oneself, a peer's
//! plain `send` and `recv` in either order. A `send` returns once its last chunk is in the
//! receiver's mailbox: at once for a message of up to `mail_depth` chunks into an empty one.
//!
//! Results are those of the host engine: each element reduced in group-rank order with the
//! same kernels (the same accumulator types), low-precision inputs encoded in 256-element
//! blocks aligned with the buffer's start (chunks are whole blocks), so bit-identical.
//!
//! # Signal width and the wrap
//! The flags have the backend's width
//! ([`Backend::signal_width`](crate::Backend::signal_width): 32 bits on Ascend) and hold the
//! epoch modulo 2^width ([`SignalWidth::word_of`]); every wait is for *equality*, which is
//! correct across the wrap because flow control keeps every flag within one epoch of what its
//! reader waits for:
//! - `data[j]` at i, awaited `== e` in round e: j sets it to e only in round e, and to e + 1
//!   only after i's `ack` of round e, which i sends after this wait; so it holds e - 1 or e.
//! - `ack[p]` at i, awaited `== e - 1` in round e: p sets it to e - 1 after consuming i's
//!   round e - 1 piece, and to e only after i's round e put, which follows this wait; so it
//!   holds e - 2 or e - 1.
//!
//! Two consecutive epochs differ modulo 2^width for any width of at least two bits, so an
//! equality never matches a stale value, whatever the starting epoch and however often the
//! counter wraps. The mailboxes keep per-channel epochs (one per sender and receiver) with the
//! same argument per place (d = `mail_depth`, a power of two, so that `e mod d` continues
//! across the wrap of the 64-bit counter): a sender sends chunk e after the receiver's
//! `p2p_ack == e - d` for its place, the receiver acknowledges e after taking it; the place's
//! `p2p_data` then holds e - d or e, its `p2p_ack` e - 2d or e - d, distinct modulo 2^width.
//! Creation sets every collective flag of the member to `first - 1`, and each place's mailbox
//! flags to the epoch d chunks before its first use, before a barrier ([`ReferenceOptions::first_epoch`] chooses `first`; tests start just
//! below 2^31 and 2^32).
//!
//! # Bounds and errors
//! Every wait is bounded by the call's timeout and, when it expires, names the call, its
//! number, the round, the peer and the flag it waited for. A call that failed in the middle of
//! a round (timeout, lost peer) leaves the members' epochs apart: this member's object then
//! refuses every later collective (`InvalidArgument` naming the failed call). Arguments are
//! checked with the host engine's checks (`coll::checks`), so the same arguments fail with the
//! same errors.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

use super::checks::{self, Part};
use super::{lowp, CollOptions};
use crate::backend::SignalWidth;
use crate::buffer::{LocalMut, LocalRef};
use crate::dfx::{self, Op, OpEvent, Started};
use crate::dtype::DType;
use crate::error::{ArgError, AtRank, Error, Result};
use crate::group::Group;
use crate::op::{CmpOp, ReduceOp, SignalOp};
use crate::stream::{Event, Stream, StreamBackend};

/// Bytes between two flags (a flag of either width at an 8-byte aligned offset).
const FLAG_STRIDE: usize = 8;
/// Bytes of a point-to-point chunk's header: message bytes, dtype code.
const MAIL_HEADER: usize = 16;
/// The smallest slot: whole 256-element blocks of the widest dtype.
pub const MIN_SLOT_BYTES: usize = 4096;
/// Words of a descriptor before alltoall's split sizes.
const DESC_FIXED: usize = 8;
/// A descriptor word for "none" (no reduce op, no format).
const NONE: u64 = u64::MAX;
/// Chunks per mailbox by default: a sender runs this many chunks ahead of its receiver.
pub const DEFAULT_MAIL_DEPTH: usize = 4;
/// The most chunks a mailbox may hold.
const MAX_MAIL_DEPTH: usize = 64;

/// How a [`Reference`] is set up: the same on every member (a different slot size fails the
/// allocation on every member; a different first epoch makes the first call time out).
#[derive(Clone, Copy, Debug)]
pub struct ReferenceOptions {
    /// Bound of every wait (`None`: the communicator's default).
    pub timeout: Option<Duration>,
    /// Bytes of each slot and mailbox (at least [`MIN_SLOT_BYTES`], a multiple of 8): the
    /// workspace is `(1 + mail_depth) x members + 1` of them; messages larger than a slot go in
    /// several rounds.
    pub slot_bytes: usize,
    /// The epoch of the first round (flags start at `first_epoch - 1`): any value works,
    /// since epochs wrap safely (see the module's docs).
    pub first_epoch: u64,
    /// Chunks of [`slot_bytes`](Self::slot_bytes) each mailbox holds (a power of two, 1 to
    /// 64): a sender runs up to this many chunks ahead of its receiver.
    pub mail_depth: usize,
}

impl ReferenceOptions {
    /// The largest message a `send` hands over without waiting for its receiver (when nothing
    /// sent before it is still in the mailbox): the mailbox's chunks, less their headers.
    pub fn eager_max_bytes(&self) -> usize {
        self.mail_depth * (self.slot_bytes - MAIL_HEADER)
    }
}

impl Default for ReferenceOptions {
    fn default() -> Self {
        ReferenceOptions { timeout: None, slot_bytes: 64 << 10, first_epoch: 1, mail_depth: DEFAULT_MAIL_DEPTH }
    }
}

impl std::fmt::Debug for ReferenceGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceGroup")
            .field("group", &self.group.ranks())
            .field("width", &self.width)
            .field("slot_bytes", &self.slot)
            .field("mail_depth", &self.depth)
            .field("heap_offset", &self.base)
            .finish_non_exhaustive()
    }
}

/// What changes from call to call, behind the lock one thread at a time holds.
struct Progress {
    /// The epoch of the next collective round.
    epoch: u64,
    /// Collective calls made (the same on every member).
    calls: u64,
    /// Point-to-point calls made (this member's own count: their sequence numbers).
    p2p_calls: u64,
    /// The epoch of the next chunk to each member (by group rank).
    send_epoch: Vec<u64>,
    /// The epoch of the next chunk from each member.
    recv_epoch: Vec<u64>,
    /// Why the group takes no more collectives here (a call failed mid-round).
    out_of_step: Option<String>,
    /// Events of enqueued puts and signals whose results are still to be collected.
    pending: Vec<Event>,
}

/// The state of one group's reference collectives on this member, owned by whoever keeps it
/// (a [`Reference`], or a backend's [`ReferenceCache`](super::by_reference::ReferenceCache));
/// its calls run through a [`Reference`] that pairs it with the backend of the same rank.
pub struct ReferenceGroup {
    group: Group,
    me: usize,
    width: SignalWidth,
    timeout: Duration,
    slot: usize,
    base: usize,
    bytes: usize,
    /// For collectives, point-to-point calls and the send direction of sendrecv.
    stream: Stream,
    /// For the receive direction of sendrecv.
    recv_stream: Stream,
    default_lp: std::result::Result<Option<DType>, ArgError>,
    /// Chunks per mailbox (a power of two).
    depth: usize,
    progress: Mutex<Progress>,
    /// The call holding `progress` (op code | call number << 8; 0: none yet), for the message
    /// of a thread that finds it taken.
    busy: AtomicU64,
}

/// The reference collectives of one group (see the module's docs): the backend of this rank
/// with the group's state, owned (`G = ReferenceGroup`, from [`Reference::new`]) or borrowed
/// from a cache ([`Reference::on`]).
pub struct Reference<'c, B: StreamBackend, G: Borrow<ReferenceGroup> = ReferenceGroup> {
    b: &'c B,
    g: G,
    /// Whether dropping it leaves the workspace alone (freed, or a borrowed state).
    freed: bool,
}

impl<B: StreamBackend, G: Borrow<ReferenceGroup>> std::ops::Deref for Reference<'_, B, G> {
    type Target = ReferenceGroup;

    fn deref(&self) -> &ReferenceGroup {
        self.g.borrow()
    }
}

impl<B: StreamBackend, G: Borrow<ReferenceGroup>> std::fmt::Debug for Reference<'_, B, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// The four kinds of flag; each has one word per member (see the module's layout).
#[derive(Clone, Copy)]
enum Flag {
    Data = 0,
    Ack = 1,
    MailData = 2,
    MailAck = 3,
}

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Flag::Data => "data",
            Flag::Ack => "ack",
            Flag::MailData => "p2p_data",
            Flag::MailAck => "p2p_ack",
        }
    }
}

/// One collective call as the descriptor round carries it.
struct Desc {
    op: Op,
    dtype: DType,
    reduce: Option<ReduceOp>,
    count: usize,
    root: usize,
    lp: Option<DType>,
    /// alltoall: elements this member sends each member, and expects from each.
    sends: Vec<usize>,
    recvs: Vec<usize>,
}

impl Desc {
    fn new(op: Op, dtype: DType, reduce: Option<ReduceOp>, count: usize) -> Desc {
        Desc { op, dtype, reduce, count, root: 0, lp: None, sends: Vec::new(), recvs: Vec::new() }
    }

    fn words(&self, n: usize, rejected: bool) -> Vec<u64> {
        let code = |d: Option<DType>| d.map_or(NONE, |d| u64::from(d.code()));
        let mut w = vec![
            u64::from(self.op.code()),
            u64::from(rejected),
            u64::from(self.dtype.code()),
            self.reduce.map_or(NONE, |r| u64::from(r.code())),
            self.count as u64,
            self.root as u64,
            code(self.lp),
            0,
        ];
        w.resize(DESC_FIXED + 2 * n, 0);
        for (i, &c) in self.sends.iter().enumerate() {
            w[DESC_FIXED + i] = c as u64;
        }
        for (i, &c) in self.recvs.iter().enumerate() {
            w[DESC_FIXED + n + i] = c as u64;
        }
        w
    }

    /// What a descriptor's fixed words say, for messages: in the host engine's spelling
    /// (`allreduce(count=8, dtype=float32, op=sum)`), so that a mismatch reads the same on
    /// either.
    fn describe(w: &[u64]) -> String {
        let op = Op::from_code(w[0] as u8).map_or("?", |o| o.name());
        let dtype = DType::from_code(w[2] as i64).map_or_else(|_| "?".into(), |d| d.to_string());
        let mut s = if w[0] == u64::from(Op::AllToAll.code()) {
            format!("{op}(dtype={dtype}")
        } else {
            format!("{op}(count={}, dtype={dtype}", w[4])
        };
        if w[3] != NONE {
            s += &format!(", op={}", ReduceOp::from_code(w[3] as i64).map_or("?", |r| r.name()));
        }
        if w[6] != NONE {
            let lp = DType::from_code(w[6] as i64).map_or_else(|_| "?".into(), |d| d.to_string());
            s += &format!(", low_precision={lp}");
        }
        if w[0] == u64::from(Op::Broadcast.code()) {
            s += &format!(", root={}", w[5]);
        }
        s + ")"
    }
}

/// A piece a member sends one member in a round: (pointer, bytes).
type Piece = (*const u8, usize);

impl<'c, B: StreamBackend> Reference<'c, B> {
    /// Collective over `group`: the reference collectives of `group`, every wait bounded by
    /// `timeout`, with the default slot size and first epoch.
    pub fn new(b: &'c B, group: &Group, timeout: Duration) -> Result<Self> {
        Self::with_options(b, group, ReferenceOptions { timeout: Some(timeout), ..ReferenceOptions::default() })
    }

    /// [`Reference::new`] whose first round has epoch `first_epoch` (tests start just below a
    /// wrap).
    pub fn with_first_epoch(b: &'c B, group: &Group, timeout: Duration, first_epoch: u64) -> Result<Self> {
        let opts = ReferenceOptions { timeout: Some(timeout), first_epoch, ..ReferenceOptions::default() };
        Self::with_options(b, group, opts)
    }

    /// Collective over `group`: allocates the workspace, sets this member's flags and joins a
    /// barrier (see the module's docs).
    pub fn with_options(b: &'c B, group: &Group, opts: ReferenceOptions) -> Result<Self> {
        Ok(Reference { b, g: ReferenceGroup::create(b, group, opts)?, freed: false })
    }

    /// Collective: releases the workspace on every member.
    pub fn free(mut self) -> Result<()> {
        self.freed = true;
        self.b.heap_free(&self.group, self.base, self.bytes, self.timeout)
    }
}

impl<'c, 'g, B: StreamBackend> Reference<'c, B, &'g ReferenceGroup> {
    /// The collectives of `state` (created with a handle of this rank's backend) run with `b`;
    /// dropping it leaves the workspace to its owner.
    pub fn on(b: &'c B, state: &'g ReferenceGroup) -> Self {
        Reference { b, g: state, freed: true }
    }
}

impl ReferenceGroup {
    /// Collective over `group`: allocates the workspace with `b`'s heap allocator, sets this
    /// member's flags and joins a barrier (see the module's docs). Whoever keeps it frees it
    /// with [`ReferenceGroup::free`], or gives it up locally with [`ReferenceGroup::abandon`].
    pub fn create<B: StreamBackend>(b: &B, group: &Group, opts: ReferenceOptions) -> Result<ReferenceGroup> {
        let rank = b.rank();
        let me = group.member().at(rank)?.index();
        let n = group.size();
        let desc_bytes = (DESC_FIXED + 2 * n) * 8;
        if opts.slot_bytes < MIN_SLOT_BYTES.max(desc_bytes) || !opts.slot_bytes.is_multiple_of(8) {
            return Err(ArgError::invalid(
                "slot_bytes",
                opts.slot_bytes,
                format!(
                    "must be a multiple of 8 of at least {} (whole blocks, and a descriptor of {n} members)",
                    MIN_SLOT_BYTES.max(desc_bytes)
                ),
            ))
            .at(rank);
        }
        let depth = opts.mail_depth;
        if !depth.is_power_of_two() || depth > MAX_MAIL_DEPTH {
            let why = format!("must be a power of two from 1 to {MAX_MAIL_DEPTH} (chunks per mailbox)");
            return Err(ArgError::invalid("mail_depth", depth, why)).at(rank);
        }
        let timeout = opts.timeout.unwrap_or(b.default_timeout());
        // The slots, the mailboxes, and one staging slot of this member's own.
        let bytes = flags_bytes(n, depth) + (n * (1 + depth) + 1) * opts.slot_bytes;
        let base = b.heap_alloc(group, bytes, timeout)?;
        let set_up = || -> Result<(Stream, Stream)> {
            let stream = b.create_stream()?;
            let width = b.signal_width();
            let start = width.word_of(opts.first_epoch.wrapping_sub(1));
            let mut events = Vec::with_capacity(2 * n * (1 + depth) + 1);
            for flag in [Flag::Data, Flag::Ack] {
                for j in 0..n {
                    let at = base + flag_offset(n, depth, flag, j, 0);
                    events.push(b.signal_at_on(&stream, rank, at, width, SignalOp::Set, start)?);
                }
            }
            // Mailbox chunk k's flags start at the epoch before the first that uses it (the
            // one of the `depth` epochs before `first_epoch` congruent to k).
            let before = opts.first_epoch.wrapping_sub(depth as u64);
            for flag in [Flag::MailData, Flag::MailAck] {
                for j in 0..n {
                    for k in 0..depth {
                        let at = base + flag_offset(n, depth, flag, j, k);
                        let epoch = before.wrapping_add((k as u64).wrapping_sub(before) & (depth as u64 - 1));
                        events.push(b.signal_at_on(&stream, rank, at, width, SignalOp::Set, width.word_of(epoch))?);
                    }
                }
            }
            // Every member's flags are set before any member's first put.
            events.push(b.barrier_group_on(&stream, group, timeout)?);
            for e in &events {
                b.synchronize_event(e, timeout + SYNC_GRACE)?;
            }
            Ok((stream, b.create_stream()?))
        };
        let (stream, recv_stream) = match set_up() {
            Ok(s) => s,
            Err(e) => {
                b.heap_abandon(group, base, bytes);
                return Err(e);
            }
        };
        let default_lp = match b.settings() {
            Some(c) => Ok(c.low_precision),
            None => lowp::format_from_env(),
        };
        Ok(ReferenceGroup {
            group: group.clone(),
            me,
            width: b.signal_width(),
            timeout,
            slot: opts.slot_bytes,
            base,
            bytes,
            stream,
            recv_stream,
            default_lp,
            progress: Mutex::new(Progress {
                epoch: opts.first_epoch,
                calls: 0,
                p2p_calls: 0,
                send_epoch: vec![opts.first_epoch; n],
                recv_epoch: vec![opts.first_epoch; n],
                out_of_step: None,
                pending: Vec::new(),
            }),
            depth: opts.mail_depth,
            busy: AtomicU64::new(0),
        })
    }

    /// Collective: releases the workspace on every member (`b`: a handle of the backend that
    /// created it).
    pub fn free<B: StreamBackend>(self, b: &B) -> Result<()> {
        b.heap_free(&self.group, self.base, self.bytes, self.timeout)
    }

    /// Gives the workspace up on this member alone (see
    /// [`Backend::heap_abandon`](crate::Backend::heap_abandon)); never blocks.
    pub fn abandon<B: StreamBackend>(self, b: &B) {
        b.heap_abandon(&self.group, self.base, self.bytes);
    }

    fn n(&self) -> usize {
        self.group.size()
    }

    /// The group it serves.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The width of its flags (the backend's).
    pub fn signal_width(&self) -> SignalWidth {
        self.width
    }

    /// The epoch of the next collective round.
    pub fn next_epoch(&self) -> u64 {
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).epoch
    }
}

impl<'c, B: StreamBackend, G: Borrow<ReferenceGroup>> Reference<'c, B, G> {
    // ---- the collectives ------------------------------------------------------------------

    /// [`Collectives::allreduce`](super::Collectives::allreduce).
    pub fn allreduce(&self, mut buf: LocalMut<'_>, op: ReduceOp, opts: &CollOptions) -> Result<()> {
        let (len, dtype) = (buf.len(), buf.dtype());
        let p = buf.as_mut_ptr();
        // SAFETY: `buf` is valid for reads and writes of `len` elements (LocalMut contract).
        unsafe { self.run_allreduce(p, p, len, dtype, op, opts) }
    }

    /// [`Collectives::allreduce_into`](super::Collectives::allreduce_into).
    pub fn allreduce_into(
        &self,
        input: LocalRef<'_>,
        mut output: LocalMut<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()> {
        let inp = Part::of_ref("input", &input);
        let out = Part::of_mut("output", &mut output);
        if let Some(e) = checks::allreduce_into(inp, out) {
            return self.reject(Op::AllReduce, e);
        }
        // SAFETY: both are valid for `len` elements (LocalRef/LocalMut contracts), identical or
        // disjoint (checked).
        unsafe { self.run_allreduce(input.as_ptr(), output.as_mut_ptr(), input.len(), input.dtype(), op, opts) }
    }

    /// # Safety
    /// `inp` valid for `len` reads and `out` for `len` writes of `dtype`; identical or disjoint.
    unsafe fn run_allreduce(
        &self,
        inp: *const u8,
        out: *mut u8,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()> {
        let lp = match self.transport(dtype, op, opts) {
            Ok(lp) => lp,
            Err(e) => return self.reject(Op::AllReduce, e),
        };
        let desc = Desc { lp, ..Desc::new(Op::AllReduce, dtype, Some(op), len) };
        let size = dtype.size();
        self.call(desc, opts, |r, p| {
            let chunk = chunk_elems(self.slot, dtype, lp);
            let mut lo = 0;
            while lo < len {
                let n = (len - lo).min(chunk);
                // SAFETY: `lo + n <= len` elements of both buffers (the caller's contract).
                unsafe { r.reduce_round(p, inp.add(lo * size), n, dtype, op, lp, out.add(lo * size), None)? };
                lo += n;
            }
            Ok(())
        })
    }

    /// [`Collectives::reduce_scatter`](super::Collectives::reduce_scatter).
    pub fn reduce_scatter(
        &self,
        mut output: LocalMut<'_>,
        input: LocalRef<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()> {
        let lp = match self.transport(input.dtype(), op, opts) {
            Ok(lp) => lp,
            Err(e) => return self.reject(Op::ReduceScatter, e),
        };
        let whole = Part::of_ref("input_tensor", &input);
        let part = Part::of_mut("output_tensor", &mut output);
        if let Some(e) = checks::parts(whole, part, self.n(), self.me) {
            return self.reject(Op::ReduceScatter, e);
        }
        let (m, dtype) = (output.len(), input.dtype());
        let desc = Desc { lp, ..Desc::new(Op::ReduceScatter, dtype, Some(op), m) };
        let (inp, out, size) = (input.as_ptr(), output.as_mut_ptr(), dtype.size());
        self.call(desc, opts, |r, p| {
            let chunk = chunk_elems(self.slot, dtype, lp);
            let mut lo = 0;
            while lo < m {
                let len = (m - lo).min(chunk);
                // SAFETY: part j's chunk is `(j * m + lo, len)` of `input`, `(lo, len)` of
                // `output` (sizes checked); the stride between parts is `m` elements.
                unsafe { r.reduce_round(p, inp.add(lo * size), len, dtype, op, lp, out.add(lo * size), Some(m))? };
                lo += len;
            }
            Ok(())
        })
    }

    /// [`Collectives::allgather`](super::Collectives::allgather).
    pub fn allgather(&self, mut output: LocalMut<'_>, input: LocalRef<'_>, opts: &CollOptions) -> Result<()> {
        let whole = Part::of_mut("output_tensor", &mut output);
        let part = Part::of_ref("input_tensor", &input);
        if let Some(e) = checks::parts(whole, part, self.n(), self.me) {
            return self.reject(Op::AllGather, e);
        }
        let (m, dtype) = (input.len(), input.dtype());
        let (inp, out, size, n) = (input.as_ptr(), output.as_mut_ptr(), dtype.size(), self.n());
        self.call(Desc::new(Op::AllGather, dtype, None, m), opts, |r, p| {
            let chunk = self.slot / size;
            let mut lo = 0;
            while lo < m {
                let len = (m - lo).min(chunk);
                let bytes = len * size;
                // SAFETY: `(lo, len)` lies in `input`.
                let piece = unsafe { inp.add(lo * size) };
                let sends = vec![(piece, bytes); n];
                r.round(p, &sends, &vec![bytes; n], |j, at| {
                    // SAFETY: part j of `output` holds `m` elements at `j * m`.
                    unsafe { r.take(&self.stream, at, out.add((j * m + lo) * size), bytes) }.map(Some)
                })?;
                lo += len;
            }
            Ok(())
        })
    }

    /// [`Collectives::broadcast`](super::Collectives::broadcast).
    pub fn broadcast(&self, mut buf: LocalMut<'_>, root: usize, opts: &CollOptions) -> Result<()> {
        let n = self.n();
        if let Some(e) = checks::root(root, n) {
            return self.reject(Op::Broadcast, e);
        }
        let (m, dtype) = (buf.len(), buf.dtype());
        let (at, size) = (buf.as_mut_ptr(), dtype.size());
        let desc = Desc { root, ..Desc::new(Op::Broadcast, dtype, None, m) };
        self.call(desc, opts, |r, p| {
            let chunk = self.slot / size;
            let mut lo = 0;
            while lo < m {
                let bytes = (m - lo).min(chunk) * size;
                // SAFETY: `(lo, len)` lies in `buf`.
                let piece = unsafe { at.add(lo * size) };
                let none: Piece = (std::ptr::null(), 0);
                let sends = vec![if self.me == root { (piece.cast_const(), bytes) } else { none }; n];
                let recvs: Vec<usize> = (0..n).map(|j| if j == root { bytes } else { 0 }).collect();
                r.round(p, &sends, &recvs, |j, from| {
                    if j == root && self.me != root {
                        // SAFETY: as above; the root's own buffer already holds its data.
                        unsafe { r.take(&self.stream, from, piece, bytes) }.map(Some)
                    } else {
                        Ok(None)
                    }
                })?;
                lo += bytes / size;
            }
            Ok(())
        })
    }

    /// [`Collectives::alltoall`](super::Collectives::alltoall).
    pub fn alltoall(
        &self,
        send: &[LocalRef<'_>],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()> {
        if let Some(e) = checks::alltoall_sends(send, recv.dtype(), self.n()) {
            return self.reject(Op::AllToAll, e);
        }
        let sends: Vec<(*const u8, usize)> = send.iter().map(|s| (s.as_ptr(), s.len())).collect();
        self.run_alltoall(&sends, recv, recv_counts, opts)
    }

    /// [`Collectives::alltoall_single`](super::Collectives::alltoall_single).
    pub fn alltoall_single(
        &self,
        send: LocalRef<'_>,
        send_counts: &[usize],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()> {
        if let Some(e) = checks::alltoall_single_sends(&send, send_counts, recv.dtype(), self.n()) {
            return self.reject(Op::AllToAll, e);
        }
        let size = send.dtype().size();
        let mut at = 0;
        let sends: Vec<(*const u8, usize)> = send_counts
            .iter()
            .map(|&c| {
                // The prefix sums stay within `send` (checked above).
                let piece = (send.as_ptr().wrapping_add(at * size), c);
                at += c;
                piece
            })
            .collect();
        self.run_alltoall(&sends, recv, recv_counts, opts)
    }

    fn run_alltoall(
        &self,
        sends: &[(*const u8, usize)],
        mut recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()> {
        let (n, dtype) = (self.n(), recv.dtype());
        let recv_part = Part { arg: "receive_tensor", ptr: recv.as_mut_ptr(), len: recv.len(), dtype };
        if let Some(e) = checks::alltoall_recv(sends, recv_part, recv_counts, n) {
            return self.reject(Op::AllToAll, e);
        }
        // The counts differ between members: the pairs are compared instead.
        let desc = Desc {
            sends: sends.iter().map(|s| s.1).collect(),
            recvs: recv_counts.to_vec(),
            ..Desc::new(Op::AllToAll, dtype, None, 0)
        };
        let (out, size) = (recv.as_mut_ptr(), dtype.size());
        let displ: Vec<usize> = recv_counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
        let per = self.slot / size;
        self.call_with(desc, opts, |r, p, descs| {
            // The largest piece of any pair sets the rounds (the same on every member).
            let largest = descs.iter().flat_map(|d| &d[DESC_FIXED..DESC_FIXED + n]).max().copied().unwrap_or(0);
            let rounds = (largest as usize).div_ceil(per);
            let share = |c: usize, k: usize| c.saturating_sub(k * per).min(per);
            for k in 0..rounds {
                let pieces: Vec<Piece> =
                    sends.iter().map(|&(at, c)| (at.wrapping_add(k * per * size), share(c, k) * size)).collect();
                let lens: Vec<usize> = recv_counts.iter().map(|&c| share(c, k) * size).collect();
                r.round(p, &pieces, &lens, |j, from| {
                    // SAFETY: member j's piece lands at `displ[j]` and holds `recv_counts[j]`
                    // elements (checked to fit `recv`).
                    unsafe { r.take(&self.stream, from, out.add((displ[j] + k * per) * size), lens[j]) }.map(Some)
                })?;
            }
            Ok(())
        })
    }

    /// [`Collectives::send`](super::Collectives::send).
    pub fn send(&self, buf: LocalRef<'_>, dst: usize, opts: &CollOptions) -> Result<()> {
        let rank = self.b.rank();
        self.group.resolve("dst_rank", i64::try_from(dst).unwrap_or(i64::MAX)).at(rank)?;
        let bytes = buf.len() * buf.dtype().size();
        self.p2p(Op::Send, (buf.len(), buf.dtype()), opts, |r, p| {
            let mut out = Outgoing::new(r, buf.as_ptr(), bytes, buf.dtype(), dst);
            while !out.done() {
                out.step(r, p)?;
            }
            Ok(())
        })
    }

    /// [`Collectives::recv`](super::Collectives::recv).
    pub fn recv(&self, mut buf: LocalMut<'_>, src: usize, opts: &CollOptions) -> Result<()> {
        let rank = self.b.rank();
        self.group.resolve("src_rank", i64::try_from(src).unwrap_or(i64::MAX)).at(rank)?;
        let (bytes, dtype) = (buf.len() * buf.dtype().size(), buf.dtype());
        let at = buf.as_mut_ptr();
        self.p2p(Op::Recv, (buf.len(), dtype), opts, |r, p| {
            let mut inc = Incoming::new(at, bytes, dtype, src);
            while !inc.done() {
                inc.step(r, p)?;
            }
            inc.finish(r)
        })
    }

    /// [`Collectives::sendrecv`](super::Collectives::sendrecv): one chunk out, one chunk in, in
    /// turn.
    pub fn sendrecv(
        &self,
        send: LocalRef<'_>,
        dst: usize,
        mut recv: LocalMut<'_>,
        src: usize,
        opts: &CollOptions,
    ) -> Result<()> {
        let rank = self.b.rank();
        self.group.resolve("dst_rank", i64::try_from(dst).unwrap_or(i64::MAX)).at(rank)?;
        self.group.resolve("src_rank", i64::try_from(src).unwrap_or(i64::MAX)).at(rank)?;
        let (send_bytes, recv_bytes) = (send.len() * send.dtype().size(), recv.len() * recv.dtype().size());
        let (s, rp) = (send.as_ptr(), recv.as_mut_ptr());
        if let Some(e) = checks::sendrecv(s, send_bytes, rp.cast_const(), recv_bytes) {
            return Err(e).at(rank);
        }
        self.p2p(Op::SendRecv, (send.len(), send.dtype()), opts, |r, p| {
            let mut out = Outgoing::new(r, s, send_bytes, send.dtype(), dst);
            let mut inc = Incoming::new(rp, recv_bytes, recv.dtype(), src);
            // Each direction waits on a stream of its own, polled from here, so that neither
            // holds the other up: any pairing completes (see the module's docs).
            let (outs, ins) = (&self.stream, &self.recv_stream);
            let (mut out_wait, mut in_wait): (Option<FlagWait>, Option<FlagWait>) = (None, None);
            let (mut idle, mut since) = (0u32, std::time::Instant::now());
            while !out.done() || !inc.done() {
                if !out.done() && out_wait.is_none() {
                    out_wait = Some(out.free_wait(r, p, outs)?);
                }
                if !inc.done() && in_wait.is_none() {
                    in_wait = Some(inc.arrival_wait(r, p, ins)?);
                }
                let mut moved = false;
                if let Some(w) = &out_wait {
                    if r.poll_wait(w)? {
                        out_wait = None;
                        out.put_chunk(r, p, outs)?;
                        moved = true;
                    }
                }
                if let Some(w) = &in_wait {
                    if r.poll_wait(w)? {
                        in_wait = None;
                        inc.take(r, p, ins)?;
                        moved = true;
                    }
                }
                if moved {
                    (idle, since) = (0, std::time::Instant::now());
                } else if since.elapsed() > r.timeout + SYNC_GRACE {
                    // The stream waits are bounded by the timeout: one has ended by now.
                    if let Some(w) = out_wait.as_ref().or(in_wait.as_ref()) {
                        r.finish_wait(w)?;
                    }
                } else {
                    idle += 1;
                    if idle < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(POLL_NAP);
                    }
                }
            }
            inc.finish(r)
        })
    }

    /// [`Collectives::reject`](super::Collectives::reject): takes part in this member's next
    /// collective call only to reject it; the members fail with `PeerRejected`. Returns the
    /// error (`InvalidArgument` with `e`).
    pub fn reject(&self, op: Op, e: ArgError) -> Result<()> {
        let rank = self.b.rank();
        let desc = Desc::new(op, DType::U8, None, 0);
        match self.call_inner(desc, Some(e.clone()), &CollOptions::default(), |_, _, _| Ok(())) {
            // The descriptor round went through: the error is the caller's own.
            Ok(())
            | Err(Error::InvalidArgument { .. })
            | Err(Error::PeerRejected { .. })
            | Err(Error::Mismatch { .. }) => Err(e).at(rank),
            Err(other) => Err(other),
        }
    }

    /// The reduction's checks and its transport format.
    fn transport(
        &self,
        dtype: DType,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> std::result::Result<Option<DType>, ArgError> {
        checks::reduction(&self.default_lp, dtype, op, opts.transport)
    }

    // ---- rounds ---------------------------------------------------------------------------

    /// Runs one collective call: the descriptor round, then `body`'s data rounds.
    fn call(
        &self,
        desc: Desc,
        opts: &CollOptions,
        body: impl FnOnce(&Round<'_, 'c, B>, &mut Progress) -> Result<()>,
    ) -> Result<()> {
        self.call_with(desc, opts, |r, p, _| body(r, p))
    }

    /// [`Reference::call`] whose body sees every member's descriptor words.
    fn call_with(
        &self,
        desc: Desc,
        opts: &CollOptions,
        body: impl FnOnce(&Round<'_, 'c, B>, &mut Progress, &[Vec<u64>]) -> Result<()>,
    ) -> Result<()> {
        self.call_inner(desc, None, opts, body)
    }

    fn call_inner(
        &self,
        desc: Desc,
        rejected: Option<ArgError>,
        opts: &CollOptions,
        body: impl FnOnce(&Round<'_, 'c, B>, &mut Progress, &[Vec<u64>]) -> Result<()>,
    ) -> Result<()> {
        let rank = self.b.rank();
        self.b.check_process()?;
        // As every host call on a group: after this rank's stream operations on it.
        self.group.settle_streams(rank, desc.op.name(), opts.timeout.unwrap_or(self.timeout))?;
        let mut ev = OpEvent {
            op: desc.op,
            group: Some(&self.group),
            seq: 0,
            count: desc.count as u64,
            dtype: Some(desc.dtype),
            bytes: (desc.count * desc.dtype.size()) as u64,
        };
        let mut p = self.lock(desc.op).inspect_err(|e| dfx::refused(self.b, &ev, e))?;
        before_blocking(opts, self.n());
        if let Some(why) = &p.out_of_step {
            let e = Error::InvalidArgument {
                rank,
                source: ArgError::invalid("group", format!("{:?}", self.group), why.clone()),
            };
            dfx::refused(self.b, &ev, &e);
            return Err(e);
        }
        p.calls += 1;
        ev.seq = p.calls;
        // Relaxed: read only for the message of a thread that finds the lock taken.
        self.busy.store(u64::from(desc.op.code()) | (p.calls << 8), Ordering::Relaxed);
        let record = dfx::start(self.b, &ev);
        let r = Round {
            rf: self.g.borrow(),
            b: self.b,
            op: desc.op,
            call: p.calls,
            timeout: opts.timeout.unwrap_or(self.timeout),
            record,
        };
        let result = (|| {
            let n = self.n();
            let mine = desc.words(n, rejected.is_some());
            let bytes = mine.len() * 8;
            let mut descs = vec![vec![0u64; mine.len()]; n];
            let at = descs.iter_mut().map(|d| d.as_mut_ptr().cast::<u8>()).collect::<Vec<_>>();
            let sends = vec![r.staged(mine.as_ptr().cast(), bytes)?; n];
            r.round(&mut p, &sends, &vec![bytes; n], |j, from| {
                // SAFETY: `descs[j]` holds `bytes` bytes.
                unsafe { self.b.copy_from_heap(from, at[j], bytes) }.map(|()| None)
            })?;
            if let Some(e) = self.disagreement(&r, &descs, rejected) {
                return Err(e);
            }
            body(&r, &mut p, &descs)
        })();
        let result = result.and_then(|()| r.collect(&mut p));
        if let Err(e @ (Error::Timeout(_) | Error::PeerLost { .. } | Error::PeerExited { .. } | Error::System { .. })) =
            &result
        {
            // This member left the call mid-round: its epochs no longer pair with the others'.
            p.out_of_step = Some(format!(
                "its reference collectives are out of step since {} #{} failed on this rank ({}): a late member \
                 would pair later rounds with the wrong calls",
                desc.op.name(),
                r.call,
                e.code()
            ));
            // The results of what is still enqueued are of no use any more.
            p.pending.clear();
        }
        let mut result = result;
        dfx::finish(self.b, &ev, record, &mut result);
        result
    }

    /// The error every member reports for the descriptors `descs` (one per member), if they
    /// disagree or one was rejected: this member's own rejection first, then the first member
    /// that rejected its call, then the first that called something else.
    fn disagreement(&self, r: &Round<'_, 'c, B>, descs: &[Vec<u64>], rejected: Option<ArgError>) -> Option<Error> {
        let rank = self.b.rank();
        let ranks = self.group.ranks();
        if let Some(e) = rejected {
            return Some(Error::InvalidArgument { rank, source: e });
        }
        if let Some(j) = descs.iter().position(|d| d[1] != 0) {
            return Some(Error::PeerRejected { rank, op: r.op.name().into(), peer: ranks[j] });
        }
        let mine = &descs[self.me];
        let n = self.n();
        if let Some(j) = descs.iter().position(|d| d[..DESC_FIXED] != mine[..DESC_FIXED]) {
            return Some(Error::Mismatch {
                rank,
                op: r.op.name().into(),
                peer: ranks[j],
                mine: Desc::describe(mine),
                theirs: Desc::describe(&descs[j]),
            });
        }
        if r.op != Op::AllToAll {
            return None;
        }
        // Every pair, so that every member finds the same disagreement.
        for (a, da) in descs.iter().enumerate() {
            for (b, db) in descs.iter().enumerate() {
                let (sent, expected) = (da[DESC_FIXED + b], db[DESC_FIXED + n + a]);
                if sent != expected {
                    let peer = if a == self.me { ranks[b] } else { ranks[a] };
                    return Some(Error::Mismatch {
                        rank,
                        op: r.op.name().into(),
                        peer,
                        mine: format!("group rank {b} (global rank {}): recv_counts[{a}] = {expected}", ranks[b]),
                        theirs: format!(
                            "group rank {a} (global rank {}): {sent} elements sent to group rank {b}",
                            ranks[a]
                        ),
                    });
                }
            }
        }
        None
    }

    /// Runs one point-to-point call.
    /// Runs one point-to-point call of `op` moving `count` elements of `dtype` (this member's
    /// part: a sendrecv's send).
    fn p2p(
        &self,
        op: Op,
        (count, dtype): (usize, DType),
        opts: &CollOptions,
        body: impl FnOnce(&Round<'_, 'c, B>, &mut Progress) -> Result<()>,
    ) -> Result<()> {
        self.b.check_process()?;
        self.group.settle_streams(self.b.rank(), op.name(), opts.timeout.unwrap_or(self.timeout))?;
        let mut ev = OpEvent {
            op,
            group: Some(&self.group),
            seq: 0,
            count: count as u64,
            dtype: Some(dtype),
            bytes: (count * dtype.size()) as u64,
        };
        let mut p = self.lock(op).inspect_err(|e| dfx::refused(self.b, &ev, e))?;
        before_blocking(opts, self.n());
        p.p2p_calls += 1;
        ev.seq = p.p2p_calls;
        // Relaxed: as in `call_inner`.
        self.busy.store(u64::from(op.code()) | (p.p2p_calls << 8), Ordering::Relaxed);
        let record = dfx::start(self.b, &ev);
        let r = Round {
            rf: self.g.borrow(),
            b: self.b,
            op,
            call: 0,
            timeout: opts.timeout.unwrap_or(self.timeout),
            record,
        };
        let mut result = body(&r, &mut p).and_then(|()| r.collect(&mut p));
        if result.is_err() {
            p.pending.clear();
        }
        dfx::finish(self.b, &ev, record, &mut result);
        result
    }

    fn lock(&self, op: Op) -> Result<std::sync::MutexGuard<'_, Progress>> {
        let rank = self.b.rank();
        match self.progress.try_lock() {
            Ok(p) => Ok(p),
            Err(TryLockError::WouldBlock) => Err(Error::ConcurrentUse {
                rank,
                op: op.name().into(),
                group: self.group.ranks().to_vec(),
                busy: {
                    // Relaxed: a hint for the message; the holder may have moved on since.
                    let busy = self.busy.load(Ordering::Relaxed);
                    match Op::from_code((busy & 0xff) as u8) {
                        Some(op) => format!("it is in {} #{} (reference collectives)", op.name(), busy >> 8),
                        None => "it is setting up its reference collectives".into(),
                    }
                },
            }),
            Err(TryLockError::Poisoned(_)) => Err(ArgError::invalid(
                "group",
                format!("{:?}", self.group),
                "a previous reference collective panicked in this group",
            ))
            .at(rank),
        }
    }
}

impl<B: StreamBackend, G: Borrow<ReferenceGroup>> Drop for Reference<'_, B, G> {
    /// Gives the workspace up locally unless it was freed
    /// (see [`Backend::heap_abandon`](crate::Backend::heap_abandon)).
    fn drop(&mut self) {
        if !self.freed {
            self.b.heap_abandon(&self.group, self.base, self.bytes);
        }
    }
}

/// Calls the call's [`CollOptions::before_blocking`] where a call waits for peers (`members`
/// above one): every call here blocks in a host synchronize at once, with no spin first.
fn before_blocking(opts: &CollOptions, members: usize) {
    if let (Some(f), true) = (opts.before_blocking, members > 1) {
        f();
    }
}

/// How long sendrecv sleeps between two looks at its directions once neither has moved for a
/// while.
const POLL_NAP: Duration = Duration::from_micros(50);

/// A flag wait enqueued on a stream: what its error names.
struct FlagWait {
    event: Event,
    flag: Flag,
    j: usize,
    /// The flag's heap offset.
    at: usize,
    epoch: u64,
    what: &'static str,
}

/// How long a host synchronize waits beyond the bound of the stream wait it follows, so that
/// the wait's own error (which names what it waited for) is the one reported.
const SYNC_GRACE: Duration = Duration::from_secs(1);

/// Bytes of the flags of `n` members with mailboxes of `depth` chunks (rounded to a cache
/// line): one `data` and one `ack` per member, one `p2p_data` and one `p2p_ack` per member
/// and mailbox chunk.
fn flags_bytes(n: usize, depth: usize) -> usize {
    (2 * n * (1 + depth) * FLAG_STRIDE).next_multiple_of(64)
}

/// Offset in the workspace of `flag` for member `j` (and mailbox chunk `k`, for the mailbox
/// flags).
fn flag_offset(n: usize, depth: usize, flag: Flag, j: usize, k: usize) -> usize {
    let index = match flag {
        Flag::Data => j,
        Flag::Ack => n + j,
        Flag::MailData => 2 * n + j * depth + k,
        Flag::MailAck => 2 * n + n * depth + j * depth + k,
    };
    index * FLAG_STRIDE
}

/// Elements of a reduction chunk whose piece (in the data dtype, or encoded in `lp`) fits a
/// slot of `slot` bytes: whole 256-element blocks, so that low-precision chunks encode as the
/// whole buffer would.
fn chunk_elems(slot: usize, dtype: DType, lp: Option<DType>) -> usize {
    let block = lowp::SCALE_BLOCK;
    let blocks = match lp {
        Some(l) => slot / (block * l.size() + 4),
        None => slot / (block * dtype.size()),
    };
    blocks.max(1) * block
}

/// What a round puts into every member's slot.
enum Sends<'s> {
    /// Every member's piece, made before the round.
    Ready(&'s [Piece]),
    /// Member q's piece, made by `make(q)` in this member's staging slot just before its put.
    Staged(&'s mut dyn FnMut(usize) -> Result<Piece>),
}

/// One call in progress: what its rounds and waits need.
struct Round<'r, 'c, B: StreamBackend> {
    rf: &'r ReferenceGroup,
    b: &'c B,
    op: Op,
    /// The collective call number (0: a point-to-point call).
    call: u64,
    timeout: Duration,
    /// The call's flight record, stamped when a wait of the call blocks.
    record: Started,
}

impl<B: StreamBackend> Round<'_, '_, B> {
    fn flag(&self, flag: Flag, j: usize) -> usize {
        self.mail_flag(flag, j, 0)
    }

    /// A mailbox flag of member `j`'s chunk `k`.
    fn mail_flag(&self, flag: Flag, j: usize, k: usize) -> usize {
        self.rf.base + flag_offset(self.rf.n(), self.rf.depth, flag, j, k)
    }

    fn slot(&self, j: usize) -> usize {
        self.rf.base + flags_bytes(self.rf.n(), self.rf.depth) + j * self.rf.slot
    }

    /// Chunk `k` of the mailbox of sender `j`.
    fn mail(&self, j: usize, k: usize) -> usize {
        self.slot(self.rf.n() + j * self.rf.depth + k)
    }

    /// The mailbox chunk a point-to-point chunk of `epoch` uses.
    fn mail_chunk(&self, epoch: u64) -> usize {
        (epoch & (self.rf.depth as u64 - 1)) as usize
    }

    /// Enqueues a wait until the caller's `flag` of member `j` holds `epoch`, and waits for it
    /// on the host; its timeout names the call, the flag, the peer and the epoch.
    fn wait(&self, flag: Flag, j: usize, epoch: u64, what: &'static str) -> Result<()> {
        let w = self.start_wait(&self.rf.stream, flag, j, 0, epoch, what)?;
        self.finish_wait(&w)
    }

    /// Enqueues on `stream` a wait until the caller's `flag` of member `j` (mailbox chunk `k`
    /// for the mailbox flags) holds `epoch`.
    fn start_wait(
        &self,
        stream: &Stream,
        flag: Flag,
        j: usize,
        k: usize,
        epoch: u64,
        what: &'static str,
    ) -> Result<FlagWait> {
        let rf = self.rf;
        let (at, word) = (self.mail_flag(flag, j, k), rf.width.word_of(epoch));
        // The wait needs member j's signal alone: every member is still watched for a death, but
        // only j is blamed for leaving. Another member may have done its whole part of the call
        // and closed while j is merely slow (docs/design.md, "Waits").
        let setter = Some(rf.group.ranks()[j]);
        let event = self.b.wait_signal_at_on(stream, &rf.group, setter, at, rf.width, CmpOp::Eq, word, self.timeout)?;
        Ok(FlagWait { event, flag, j, at, epoch, what })
    }

    /// Waits on the host until `w` has completed (its stream wait is bounded by the call's
    /// timeout); its error names what it waited for.
    fn finish_wait(&self, w: &FlagWait) -> Result<()> {
        if !self.poll_wait(w)? {
            // An untimed record learns when the call blocked (the dump shows it waiting).
            self.record.blocked(self.b);
        }
        self.b.synchronize_event(&w.event, self.timeout + SYNC_GRACE).map_err(|e| self.name_wait(e, w))
    }

    /// Whether `w` has completed, without blocking; its error names what it waited for.
    fn poll_wait(&self, w: &FlagWait) -> Result<bool> {
        self.b.query_event(&w.event).map_err(|e| self.name_wait(e, w))
    }

    fn name_wait(&self, e: Error, w: &FlagWait) -> Error {
        let (flag, j, epoch, what) = (w.flag, w.j, w.epoch, w.what);
        let word = self.rf.width.word_of(epoch);
        let Error::Timeout(mut t) = e else { return e };
        let (rf, peer) = (self.rf, self.rf.group.ranks()[j]);
        t.op = if self.call > 0 {
            format!("{} #{} (reference collectives, round of epoch {epoch})", self.op.name(), self.call)
        } else {
            format!("{} (reference collectives, chunk of epoch {epoch})", self.op.name())
        };
        t.location = format!(
            "this rank's {}[{j}] flag ({:?}) at heap byte {:#x}, set by group rank {j} (global rank {peer})",
            flag.name(),
            rf.width,
            w.at
        );
        t.condition = format!("== {word} (epoch {epoch} modulo 2^{}): {what}", rf.width.bytes() * 8);
        t.pending = vec![peer];
        t.sequence = (self.call > 0).then_some(self.call);
        Error::Timeout(t)
    }

    /// Collects the results of the puts and signals enqueued so far.
    fn collect(&self, p: &mut Progress) -> Result<()> {
        for e in p.pending.drain(..) {
            self.b.synchronize_event(&e, self.timeout + SYNC_GRACE)?;
        }
        Ok(())
    }

    /// One collective round (see the module's docs): sends `sends[p]` to every member p,
    /// receives `lens[j]` bytes from every member j, handed to `consume(j, heap offset)` while
    /// they are in this member's slot.
    ///
    /// Every put is followed on the stream by a wait the host synchronizes before the round
    /// returns, successfully or not: when a call returns, no operation left in the stream reads
    /// the caller's memory.
    fn round(
        &self,
        p: &mut Progress,
        sends: &[Piece],
        lens: &[usize],
        consume: impl FnMut(usize, usize) -> Result<Option<Event>>,
    ) -> Result<()> {
        debug_assert!(sends.len() == self.rf.n(), "one piece per member");
        self.round_with(p, Sends::Ready(sends), lens, consume, None::<fn() -> Result<()>>)
    }

    /// [`Round::round`], where the pieces may be made one at a time in the staging slot
    /// ([`Sends::Staged`]), `consume` may enqueue its copy (its event is collected with the
    /// round's), and `reduce`, when given, runs once every piece has arrived, before the
    /// acknowledgements release the slots: it reads the pieces where they are. This member's
    /// own puts complete first, since what `reduce` writes may be one of their sources.
    fn round_with(
        &self,
        p: &mut Progress,
        mut sends: Sends<'_>,
        lens: &[usize],
        mut consume: impl FnMut(usize, usize) -> Result<Option<Event>>,
        reduce: Option<impl FnOnce() -> Result<()>>,
    ) -> Result<()> {
        let rf = self.rf;
        let (me, ranks, width) = (rf.me, rf.group.ranks(), rf.width);
        debug_assert!(lens.len() == rf.n(), "one piece per member each way");
        let e = p.epoch;
        let word = width.word_of(e);
        for q in 0..rf.n() {
            self.wait(
                Flag::Ack,
                q,
                e.wrapping_sub(1),
                "its previous piece consumed, so that its slot for this rank is free",
            )?;
            let (src, bytes) = match sends {
                Sends::Ready(pieces) => pieces[q],
                Sends::Staged(ref mut make) => {
                    // The previous piece's put still reads the staging slot: it completes first.
                    self.collect(p)?;
                    make(q)?
                }
            };
            let (slot, flag) = (self.slot(me), self.flag(Flag::Data, me));
            let ev = if bytes > 0 {
                // SAFETY: `src` holds `bytes` bytes of the caller's (the callers' contracts),
                // valid until the event completes: the call collects it before it returns.
                unsafe {
                    self.b.put_signal_bytes_on(
                        &rf.stream,
                        ranks[q],
                        slot,
                        src,
                        bytes,
                        flag,
                        width,
                        SignalOp::Set,
                        word,
                    )?
                }
            } else {
                self.b.signal_at_on(&rf.stream, ranks[q], flag, width, SignalOp::Set, word)?
            };
            p.pending.push(ev);
        }
        for (j, &len) in lens.iter().enumerate() {
            self.wait(Flag::Data, j, e, "its piece of this round in this rank's slot")?;
            if len > 0 {
                if let Some(copy) = consume(j, self.slot(j))? {
                    p.pending.push(copy);
                }
            }
        }
        if let Some(reduce) = reduce {
            self.collect(p)?;
            reduce()?;
        }
        for &peer in ranks {
            let ev = self.b.signal_at_on(&rf.stream, peer, self.flag(Flag::Ack, me), width, SignalOp::Set, word)?;
            p.pending.push(ev);
        }
        p.epoch = e.wrapping_add(1);
        self.collect(p)
    }

    /// One reduction round: every member p gets the `len` elements at `inp + p * stride`
    /// (`stride` in elements; `None`: every member gets those at `inp`), encoded in `lp` when
    /// set, and `out` becomes what every member sent this one, reduced in group-rank order.
    ///
    /// # Safety
    /// For every member p, `inp + p * stride` holds `len` elements of `dtype`; `out` is valid
    /// for `len` writes, and is one of those pieces or disjoint from them all.
    #[allow(clippy::too_many_arguments)] // the pieces of both reductions
    unsafe fn reduce_round(
        &self,
        p: &mut Progress,
        inp: *const u8,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        lp: Option<DType>,
        out: *mut u8,
        stride: Option<usize>,
    ) -> Result<()> {
        let n = self.rf.n();
        let size = dtype.size();
        let piece = |q: usize| inp.wrapping_add(q * stride.unwrap_or(0) * size);
        let Some(l) = lp else {
            // The pieces are reduced in the slots they arrived in, by the backend (on a device,
            // by its kernels): every slot is 8-byte aligned, and `out` is none of them.
            let sends: Vec<Piece> = (0..n).map(|q| (piece(q), len * size)).collect();
            let base = self.b.local_heap_base().cast_const();
            let srcs: Vec<*const u8> = (0..n).map(|j| base.wrapping_add(self.slot(j))).collect();
            let reduce = || {
                // SAFETY: every slot holds this round's `len` elements until the acks that
                // follow; `out` holds `len` (this function's contract) and lies outside the
                // workspace.
                unsafe { self.b.reduce_local(dtype, op, &srcs, out, len) }
            };
            return self.round_with(p, Sends::Ready(&sends), &vec![len * size; n], |_, _| Ok(None), Some(reduce));
        };
        // Encoded by the backend into the staging slot (the piece of an allreduce once, each
        // member's of a reduce_scatter just before its put), reduced where they arrived.
        let bytes = lowp::encoded_bytes(l, len);
        debug_assert!(bytes <= self.rf.slot, "a chunk's encoded piece fits the staging slot");
        let base = self.b.local_heap_base();
        let stage = base.wrapping_add(self.stage());
        let mut encode = |q: usize| -> Result<Piece> {
            // SAFETY: the piece holds `len` elements (this function's contract); the staging
            // slot holds a slot, at least `encoded_bytes` (chunk_elems), 8-byte aligned, and no
            // put reads it meanwhile (the round collects the previous one first).
            unsafe { self.b.encode_local(dtype, l, piece(q), len, stage)? };
            Ok((stage.cast_const(), bytes))
        };
        let runs: Vec<*const u8> = (0..n).map(|j| base.cast_const().wrapping_add(self.slot(j))).collect();
        let reduce = || {
            // SAFETY: every slot holds this round's run of `len` encoded elements until the
            // acks that follow; `out` holds `len` (this function's contract) and lies outside
            // the workspace.
            unsafe { self.b.reduce_encoded_local(dtype, l, op, &runs, out, len) }
        };
        let lens = vec![bytes; n];
        match stride {
            None => {
                let sends = vec![encode(0)?; n];
                self.round_with(p, Sends::Ready(&sends), &lens, |_, _| Ok(None), Some(reduce))
            }
            Some(_) => self.round_with(p, Sends::Staged(&mut encode), &lens, |_, _| Ok(None), Some(reduce)),
        }
    }

    /// This member's staging slot (its own, at the end of the workspace): where what a put
    /// sends from the host (a descriptor, a chunk's header) is placed first, since a put reads
    /// the backend's memory, which on a device is not the host's.
    fn stage(&self) -> usize {
        self.slot(self.rf.n() * (1 + self.rf.depth))
    }

    /// Copies `bytes` of host memory `src` into the staging slot and returns it as a put's
    /// piece. No put of an earlier round still reads the slot (every round collects its puts).
    fn staged(&self, src: *const u8, bytes: usize) -> Result<Piece> {
        debug_assert!(bytes <= self.rf.slot, "a staged piece fits the slot");
        // SAFETY: `src` holds `bytes` (the caller's), the staging slot holds a slot's bytes and
        // only this member's own puts read it.
        unsafe { self.b.copy_to_heap(self.stage(), src, bytes)? };
        Ok((self.b.local_heap_base().wrapping_add(self.stage()).cast_const(), bytes))
    }

    /// Enqueues on `stream` the copy of `bytes` at `from` in this member's heap into local
    /// memory `dst`: a get from itself, so that a device backend copies on the device. What is
    /// enqueued on `stream` afterwards (the acknowledgement that frees the slot) follows it.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` writes, untouched by others, until the returned event completes.
    unsafe fn take(&self, stream: &Stream, from: usize, dst: *mut u8, bytes: usize) -> Result<Event> {
        let me = self.rf.group.ranks()[self.rf.me];
        // SAFETY: forwarded; `from + bytes` lies in the workspace.
        unsafe { self.b.get_bytes_on(stream, me, from, dst, bytes) }
    }
}

/// The send side of a point-to-point message, a chunk at a time.
struct Outgoing {
    src: *const u8,
    bytes: usize,
    dtype: DType,
    dst: usize,
    payload: usize,
    chunks: usize,
    sent: usize,
}

impl Outgoing {
    fn new<B: StreamBackend>(r: &Round<'_, '_, B>, src: *const u8, bytes: usize, dtype: DType, dst: usize) -> Self {
        let payload = r.rf.slot - MAIL_HEADER;
        Outgoing { src, bytes, dtype, dst, payload, chunks: bytes.div_ceil(payload).max(1), sent: 0 }
    }

    fn done(&self) -> bool {
        self.sent == self.chunks
    }

    /// Sends the next chunk once the receiver has consumed the previous one.
    fn step<B: StreamBackend>(&mut self, r: &Round<'_, '_, B>, p: &mut Progress) -> Result<()> {
        let w = self.free_wait(r, p, &r.rf.stream)?;
        r.finish_wait(&w)?;
        self.put_chunk(r, p, &r.rf.stream)
    }

    /// Enqueues on `stream` the wait until the receiver has consumed the chunk that last used
    /// the next chunk's place in its mailbox (`mail_depth` chunks earlier).
    fn free_wait<B: StreamBackend>(&self, r: &Round<'_, '_, B>, p: &Progress, stream: &Stream) -> Result<FlagWait> {
        let e = p.send_epoch[self.dst];
        let previous = e.wrapping_sub(r.rf.depth as u64);
        let what = "the chunk before in this place of its mailbox for this rank consumed, so that the place is free";
        r.start_wait(stream, Flag::MailAck, self.dst, r.mail_chunk(e), previous, what)
    }

    /// Puts the next chunk on `stream` (once its mailbox is free) and waits until it is out.
    fn put_chunk<B: StreamBackend>(&mut self, r: &Round<'_, '_, B>, p: &mut Progress, stream: &Stream) -> Result<()> {
        let rf = r.rf;
        let e = p.send_epoch[self.dst];
        let lo = self.sent * self.payload;
        let len = (self.bytes - lo).min(self.payload);
        // Header and payload go in one put from the staging slot, so that the flag publishes
        // both: the header from the host, the payload from the caller's buffer by a put to
        // itself, ahead on the same stream.
        let mut header = [0u8; MAIL_HEADER];
        header[..8].copy_from_slice(&(self.bytes as u64).to_le_bytes());
        header[8..].copy_from_slice(&u64::from(self.dtype.code()).to_le_bytes());
        let (chunk, _) = r.staged(header.as_ptr(), MAIL_HEADER)?;
        let (me, peer) = (rf.me, rf.group.ranks()[self.dst]);
        if len > 0 {
            // SAFETY: `lo + len <= bytes` of the caller's buffer, valid until the call returns
            // (it collects this event); the payload fits the slot after the header.
            let copy = unsafe {
                r.b.put_bytes_on(stream, rf.group.ranks()[me], r.stage() + MAIL_HEADER, self.src.add(lo), len)?
            };
            p.pending.push(copy);
        }
        let k = r.mail_chunk(e);
        let (at, flag, word) = (r.mail(me, k), r.mail_flag(Flag::MailData, me, k), rf.width.word_of(e));
        // SAFETY: the staging slot is not written again until the put's event has completed
        // (synchronized below).
        let ev = unsafe {
            r.b.put_signal_bytes_on(stream, peer, at, chunk, MAIL_HEADER + len, flag, rf.width, SignalOp::Set, word)?
        };
        r.b.synchronize_event(&ev, r.timeout + SYNC_GRACE)?;
        p.send_epoch[self.dst] = e.wrapping_add(1);
        self.sent += 1;
        Ok(())
    }
}

/// The receive side of a point-to-point message, a chunk at a time.
struct Incoming {
    dst: *mut u8,
    bytes: usize,
    dtype: DType,
    src: usize,
    /// Chunks of the message as its sender sent it (known from the first).
    chunks: usize,
    taken: usize,
    /// The message's size and dtype, when they differ from the buffer's.
    mismatch: Option<(usize, u64)>,
}

impl Incoming {
    fn new(dst: *mut u8, bytes: usize, dtype: DType, src: usize) -> Self {
        Incoming { dst, bytes, dtype, src, chunks: 1, taken: 0, mismatch: None }
    }

    fn done(&self) -> bool {
        self.taken == self.chunks
    }

    /// Takes the next chunk and acknowledges it.
    fn step<B: StreamBackend>(&mut self, r: &Round<'_, '_, B>, p: &mut Progress) -> Result<()> {
        let w = self.arrival_wait(r, p, &r.rf.stream)?;
        r.finish_wait(&w)?;
        self.take(r, p, &r.rf.stream)
    }

    /// Enqueues on `stream` the wait until the next chunk is in the mailbox.
    fn arrival_wait<B: StreamBackend>(&self, r: &Round<'_, '_, B>, p: &Progress, stream: &Stream) -> Result<FlagWait> {
        let e = p.recv_epoch[self.src];
        r.start_wait(stream, Flag::MailData, self.src, r.mail_chunk(e), e, "its next chunk in this rank's mailbox")
    }

    /// Takes the chunk that has arrived and acknowledges it on `stream`.
    fn take<B: StreamBackend>(&mut self, r: &Round<'_, '_, B>, p: &mut Progress, stream: &Stream) -> Result<()> {
        let rf = r.rf;
        let e = p.recv_epoch[self.src];
        let k = r.mail_chunk(e);
        let at = r.mail(self.src, k);
        let mut header = [0u8; MAIL_HEADER];
        // SAFETY: the header lies in the mailbox.
        unsafe { r.b.copy_from_heap(at, header.as_mut_ptr(), MAIL_HEADER)? };
        let msg_bytes = u64::from_le_bytes(header[..8].try_into().unwrap_or_default()) as usize;
        let msg_dtype = u64::from_le_bytes(header[8..].try_into().unwrap_or_default());
        let payload = rf.slot - MAIL_HEADER;
        if self.taken == 0 {
            self.chunks = msg_bytes.div_ceil(payload).max(1);
            if msg_bytes != self.bytes || msg_dtype != u64::from(self.dtype.code()) {
                self.mismatch = Some((msg_bytes, msg_dtype));
            }
        }
        if self.mismatch.is_none() {
            let lo = self.taken * payload;
            let len = (self.bytes - lo).min(payload);
            // SAFETY: `lo + len <= bytes` of the caller's buffer (the sizes agree), valid until
            // the call returns (it collects this event).
            p.pending.push(unsafe { r.take(stream, at + MAIL_HEADER, self.dst.add(lo), len)? });
        }
        let peer = rf.group.ranks()[self.src];
        let (flag, word) = (r.mail_flag(Flag::MailAck, rf.me, k), rf.width.word_of(e));
        let ack = r.b.signal_at_on(stream, peer, flag, rf.width, SignalOp::Set, word)?;
        p.pending.push(ack);
        p.recv_epoch[self.src] = e.wrapping_add(1);
        self.taken += 1;
        Ok(())
    }

    /// The receive's outcome: a message of another size or dtype (consumed whole) fails naming
    /// both.
    fn finish<B: StreamBackend>(self, r: &Round<'_, '_, B>) -> Result<()> {
        let Some((msg_bytes, msg_dtype)) = self.mismatch else { return Ok(()) };
        let theirs = DType::from_code(msg_dtype as i64).map_or_else(|_| "?".to_string(), |d| d.to_string());
        Err(Error::Mismatch {
            rank: r.b.rank(),
            op: r.op.name().into(),
            peer: r.rf.group.ranks()[self.src],
            mine: format!("recv of {} elements of {}", self.bytes / self.dtype.size(), self.dtype),
            theirs: format!("a message of {msg_bytes} bytes of {theirs}"),
        })
    }
}
