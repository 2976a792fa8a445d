//! The public API: [`SymmetricHeap`] and [`Communicator`], validated once for every backend.
//!
//! Both traits are implemented for every [`Backend`] by blanket impls, so every backend gets
//! the same argument checks and the same errors: the calling rank rejects a bad argument before
//! any byte moves, and peers are never touched by a call that fails validation.

use std::time::Duration;

use crate::backend::{Backend, HostMapped, SignalWidth, WaitSite};
use crate::buffer::{check_dtype, check_range, LocalMut, LocalRef, SymmBuffer};
use crate::dfx::{self, Op, OpEvent};
use crate::dtype::{DType, Element};
use crate::error::{ArgError, AtRank, GroupError, HeapError, Result};
use crate::group::Group;
use crate::op::{CmpOp, SignalOp};
use crate::rank::Rank;

/// Collective allocation of symmetric memory.
pub trait SymmetricHeap: Backend {
    /// Collective over `group`: `len` elements of `dtype` at the same heap offset on every
    /// member; every member must ask for the same number of bytes (a mismatch is an error on
    /// every member). Zero-length buffers are allowed and take no heap space (the call is still
    /// collective, so a member asking for 0 while others ask for more is a mismatch too).
    fn alloc(&self, group: &Group, len: usize, dtype: DType) -> Result<SymmBuffer> {
        self.check_process()?;
        let rank = self.rank();
        group.member().at(rank)?;
        let bytes = len
            .checked_mul(dtype.size())
            .filter(|&b| b <= self.heap_size())
            .ok_or_else(|| HeapError::TooLarge {
                requested: len.saturating_mul(dtype.size()),
                group: group.ranks().to_vec(),
                heap_size: self.heap_size(),
            })
            .at(rank)?;
        let ev = OpEvent {
            op: Op::Alloc,
            group: Some(group),
            seq: 0,
            count: len as u64,
            dtype: Some(dtype),
            bytes: bytes as u64,
        };
        let offset = dfx::traced(self, &ev, || self.heap_alloc(group, bytes, self.default_timeout()))?;
        Ok(SymmBuffer::from_parts(self.instance_id(), group.clone(), offset, len, dtype))
    }

    /// Collective over the buffer's group: releases it once every member has stopped using it.
    /// Every member frees the same allocation, in the same order: members that name different
    /// allocations (or free while others allocate) all get `HeapError::FreeMismatch`, and
    /// nothing is freed.
    fn free(&self, buf: SymmBuffer) -> Result<()> {
        self.check_process()?;
        check_owner(self, &buf, "buf")?;
        let ev = OpEvent {
            op: Op::Free,
            group: Some(&buf.group),
            seq: 0,
            count: buf.len as u64,
            dtype: Some(buf.dtype),
            bytes: buf.bytes() as u64,
        };
        dfx::traced(self, &ev, || self.heap_free(&buf.group, buf.offset, buf.bytes(), self.default_timeout()))
    }

    /// Local and non-blocking: gives `buf` up without the collective [`free`](Self::free), as
    /// a garbage collector can (it cannot wait for the other members). The range stays reserved
    /// until every member of the buffer's group has abandoned (or dropped) its copy; the group's
    /// next collective allocation or free then releases it on every member at once. On a
    /// backend that does not reclaim, the range stays reserved until the communicator ends.
    fn abandon(&self, buf: SymmBuffer) -> Result<()> {
        check_owner(self, &buf, "buf")?;
        self.heap_abandon(&buf.group, buf.offset, buf.bytes());
        Ok(())
    }

    /// Address of the caller's copy of `buf` (host memory for `symm-sim`).
    fn local_ptr(&self, buf: &SymmBuffer) -> Result<*mut u8> {
        self.check_process()?;
        check_owner(self, buf, "buf")?;
        // SAFETY: the buffer lies inside the heap (allocated by this communicator), so the
        // offset stays within the heap mapping.
        Ok(unsafe { self.local_heap_base().add(buf.offset) })
    }

    /// The caller's copy of `buf` as a local source for puts.
    fn local_ref<'a>(&self, buf: &'a SymmBuffer) -> Result<LocalRef<'a>> {
        let ptr = self.local_ptr(buf)?;
        // SAFETY: the heap range stays mapped while `buf` lives (borrowed for 'a).
        Ok(unsafe { LocalRef::from_raw(ptr, buf.len, buf.dtype) })
    }

    /// Copies the caller's copy of `buf` into a vector (through the backend's copies: any
    /// memory space).
    fn read_local<T: Element>(&self, buf: &SymmBuffer) -> Result<Vec<T>> {
        self.check_process()?;
        check_owner(self, buf, "buf")?;
        check_dtype("buf", buf.dtype, T::DTYPE).at(self.rank())?;
        let mut out = Vec::<T>::with_capacity(buf.len);
        // SAFETY: the buffer's range lies in the heap (allocated by this communicator); the
        // vector has room for `buf.len` elements of T (the dtype checked), set once written.
        unsafe {
            self.copy_from_heap(buf.offset, out.as_mut_ptr().cast(), buf.bytes())?;
            out.set_len(buf.len);
        }
        Ok(out)
    }

    /// Writes `data` into the caller's copy of `buf` at element `offset` (through the backend's
    /// copies: any memory space).
    fn write_local<T: Element>(&self, buf: &SymmBuffer, offset: usize, data: &[T]) -> Result<()> {
        self.check_process()?;
        check_owner(self, buf, "buf")?;
        let rank = self.rank();
        check_dtype("buf", buf.dtype, T::DTYPE).at(rank)?;
        check_range("offset", offset, data.len(), buf.len).at(rank)?;
        let at = buf.offset + offset * buf.dtype.size();
        // SAFETY: the range was checked against the buffer, which lies in the heap; `data` is
        // a separate slice.
        unsafe { self.copy_to_heap(at, data.as_ptr().cast(), std::mem::size_of_val(data)) }
    }
}

/// One-sided communication and synchronisation, group-aware.
///
/// Offsets and counts are in **elements** of the buffers' dtype. `target_rank` / `source_rank`
/// are ranks inside `group`. Completion follows [`Backend`]'s execution model.
pub trait Communicator: SymmetricHeap {
    /// Creates (or returns the cached) group of `ranks`, given as ranks of `parent`, in the
    /// order given. Cheap and local: no communication. Non-members get a handle too, which
    /// they cannot use for communication.
    fn new_group(&self, parent: &Group, ranks: &[usize]) -> Result<Group> {
        self.check_process()?;
        let me = self.rank();
        let mut global = Vec::with_capacity(ranks.len());
        for &r in ranks {
            let (_, g) = parent.resolve("ranks", rank_arg(r)).at(me)?;
            global.push(g);
        }
        self.group_of(&global)
    }

    /// Copies `count` elements of `src` (from `src_offset`) into `target_rank`'s copy of
    /// `target` at `target_offset`.
    #[allow(clippy::too_many_arguments)] // mirrors shmem_put(target, target_offset, src, src_offset, size, target_rank) plus group
    fn put(
        &self,
        group: &Group,
        target: &SymmBuffer,
        target_offset: usize,
        src: LocalRef<'_>,
        src_offset: usize,
        count: usize,
        target_rank: usize,
    ) -> Result<()> {
        let (peer, dst, srcp, bytes) =
            check_transfer(self, group, target, target_offset, &src, src_offset, count, target_rank)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `srcp` points into `src` at a checked range (valid per LocalRef's contract).
        unsafe { self.put_bytes(peer, dst, srcp, bytes) }
    }

    /// Copies `count` elements of `source_rank`'s copy of `source` (from `source_offset`) into
    /// `dst` at `dst_offset`.
    #[allow(clippy::too_many_arguments)] // mirrors shmem_get plus group
    fn get(
        &self,
        group: &Group,
        dst: LocalMut<'_>,
        dst_offset: usize,
        source: &SymmBuffer,
        source_offset: usize,
        count: usize,
        source_rank: usize,
    ) -> Result<()> {
        let (peer, src, dstp, bytes) =
            check_get(self, group, dst, dst_offset, source, source_offset, count, source_rank)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dstp` is valid for `bytes` writes (checked range of an exclusive borrow).
        unsafe { self.get_bytes(peer, src, dstp, bytes) }
    }

    /// Atomically sets or adds `value` to `target_rank`'s signal word `signal[signal_offset]`.
    fn signal_op(
        &self,
        group: &Group,
        signal: &SymmBuffer,
        signal_offset: usize,
        value: i64,
        op: SignalOp,
        target_rank: usize,
    ) -> Result<()> {
        let (peer, offset, width) = check_signal_op(self, group, signal, signal_offset, value, target_rank)?;
        self.signal_at(peer, offset, width, op, value)
    }

    /// `put`, then `signal_op` on the same target, with the data visible to the target before
    /// the signal is.
    #[allow(clippy::too_many_arguments)] // mirrors shmem_put_with_signal's ten arguments plus group
    fn put_with_signal(
        &self,
        group: &Group,
        target: &SymmBuffer,
        target_offset: usize,
        src: LocalRef<'_>,
        src_offset: usize,
        count: usize,
        signal: &SymmBuffer,
        signal_offset: usize,
        signal_value: i64,
        signal_op: SignalOp,
        target_rank: usize,
    ) -> Result<()> {
        let (peer, dst, srcp, bytes) =
            check_transfer(self, group, target, target_offset, &src, src_offset, count, target_rank)?;
        let (sig, width) = check_signal(self, signal, signal_offset, Some(signal_value), peer)?;
        // SAFETY: as in `put`.
        unsafe { self.put_signal_bytes(peer, dst, srcp, bytes, sig, width, signal_op, signal_value) }
    }

    /// Blocks until the caller's own `signal[signal_offset] <cmp> value` holds; returns the
    /// value seen. Does not reset the signal. `timeout: None` uses the default bound. A waiter
    /// that has gone to sleep is woken by `signal_op` and `put_with_signal`; a plain `put` into
    /// the signal word is seen at its next look (on the CPU backend up to 100 ms later).
    fn wait_until(
        &self,
        signal: &SymmBuffer,
        signal_offset: usize,
        cmp: CmpOp,
        value: i64,
        timeout: Option<Duration>,
    ) -> Result<i64> {
        self.check_process()?;
        let me = self.rank();
        let (offset, width) = check_signal(self, signal, signal_offset, None, me)?;
        let timeout = timeout.unwrap_or(self.default_timeout());
        let site = || WaitSite {
            op: "wait_until".into(),
            group: Some(signal.group.ranks().to_vec()),
            location: format!("signal[{signal_offset}] ({} buffer at heap byte {offset:#x})", signal.dtype),
            watch: Vec::new(),
            waiting_on: None,
        };
        let ev = OpEvent { op: Op::WaitUntil, group: Some(&signal.group), seq: 0, count: 0, dtype: None, bytes: 0 };
        dfx::traced(self, &ev, || self.wait_signal_at(offset, width, cmp, value, timeout, &site))
    }

    /// Blocks until every member of `group` has called `barrier` (see the ordering rules).
    fn barrier(&self, group: &Group) -> Result<()> {
        self.check_process()?;
        group.member().at(self.rank())?;
        group.settle_streams(self.rank(), "barrier", self.default_timeout())?;
        let ev = OpEvent { op: Op::Barrier, group: Some(group), seq: 0, count: 0, dtype: None, bytes: 0 };
        dfx::traced(self, &ev, || self.barrier_group(group, self.default_timeout()))
    }
}

impl<B: Backend + ?Sized> SymmetricHeap for B {}

/// Direct access to peers' copies, on backends whose ranks map each other's heaps.
pub trait PeerMemory: SymmetricHeap + HostMapped {
    /// Address of `rank`'s copy of `buf` in the caller's address space (`None` where that
    /// rank's heap is not mapped). `rank` is group-local to `group`.
    fn peer_ptr(&self, group: &Group, buf: &SymmBuffer, rank: usize) -> Result<Option<*mut u8>> {
        self.check_process()?;
        let me = self.rank();
        check_owner(self, buf, "buf")?;
        group.member().at(me)?;
        let (_, global) = group.resolve("rank", rank_arg(rank)).at(me)?;
        check_on_rank(buf, "buf", global).at(me)?;
        // SAFETY: as in `local_ptr`, the offset lies inside the peer's heap mapping.
        Ok(self.peer_heap_base(global).map(|base| unsafe { base.add(buf.offset) }))
    }
}

impl<B: HostMapped + ?Sized> PeerMemory for B {}
impl<B: Backend + ?Sized> Communicator for B {}

/// A user's rank number as the signed value errors print.
fn rank_arg(r: usize) -> i64 {
    i64::try_from(r).unwrap_or(i64::MAX)
}

fn check_owner<B: Backend + ?Sized>(b: &B, buf: &SymmBuffer, arg: &'static str) -> Result<()> {
    if buf.owner == b.instance_id() {
        Ok(())
    } else {
        Err(HeapError::ForeignBuffer { arg }).at(b.rank())
    }
}

fn check_on_rank(buf: &SymmBuffer, arg: &'static str, global: Rank) -> Result<(), GroupError> {
    if buf.group.to_local(global).is_some() {
        Ok(())
    } else {
        Err(GroupError::BufferNotOnRank { arg, alloc_ranks: buf.group.ranks().to_vec(), target: global })
    }
}

/// The checks every one-sided call on `group` starts with: the process and the caller's
/// membership.
fn check_caller<B: Backend + ?Sized>(b: &B, group: &Group) -> Result<Rank> {
    b.check_process()?;
    let me = b.rank();
    group.member().at(me)?;
    Ok(me)
}

/// Validates a put; returns (peer, destination heap byte offset, source pointer, bytes).
#[allow(clippy::too_many_arguments)] // the arguments of `put`, checked together
pub(crate) fn check_transfer<B: Backend + ?Sized>(
    b: &B,
    group: &Group,
    target: &SymmBuffer,
    target_offset: usize,
    src: &LocalRef<'_>,
    src_offset: usize,
    count: usize,
    target_rank: usize,
) -> Result<(Rank, usize, *const u8, usize)> {
    let me = check_caller(b, group)?;
    check_owner(b, target, "target")?;
    let (_, peer) = group.resolve("target_rank", rank_arg(target_rank)).at(me)?;
    check_on_rank(target, "target", peer).at(me)?;
    check_dtype("src", src.dtype(), target.dtype).at(me)?;
    check_range("target_offset/count", target_offset, count, target.len).at(me)?;
    check_range("src_offset/count", src_offset, count, src.len()).at(me)?;
    let size = target.dtype.size();
    // SAFETY: `src_offset` is within `src` (checked above), so the pointer stays in bounds.
    let srcp = unsafe { src.as_ptr().add(src_offset * size) };
    Ok((peer, target.offset + target_offset * size, srcp, count * size))
}

/// Validates a get; returns (peer, source heap byte offset, destination pointer, bytes).
#[allow(clippy::too_many_arguments)] // the arguments of `get`, checked together
pub(crate) fn check_get<B: Backend + ?Sized>(
    b: &B,
    group: &Group,
    mut dst: LocalMut<'_>,
    dst_offset: usize,
    source: &SymmBuffer,
    source_offset: usize,
    count: usize,
    source_rank: usize,
) -> Result<(Rank, usize, *mut u8, usize)> {
    let me = check_caller(b, group)?;
    check_owner(b, source, "source")?;
    let (_, peer) = group.resolve("source_rank", rank_arg(source_rank)).at(me)?;
    check_on_rank(source, "source", peer).at(me)?;
    check_dtype("dst", dst.dtype(), source.dtype).at(me)?;
    check_range("source_offset/count", source_offset, count, source.len).at(me)?;
    check_range("dst_offset/count", dst_offset, count, dst.len()).at(me)?;
    let size = source.dtype.size();
    // SAFETY: `dst_offset` is within `dst` (checked above), so the pointer stays in bounds.
    let dstp = unsafe { dst.as_mut_ptr().add(dst_offset * size) };
    Ok((peer, source.offset + source_offset * size, dstp, count * size))
}

/// Validates a signal_op; returns (peer, heap byte offset of the word, width).
pub(crate) fn check_signal_op<B: Backend + ?Sized>(
    b: &B,
    group: &Group,
    signal: &SymmBuffer,
    signal_offset: usize,
    value: i64,
    target_rank: usize,
) -> Result<(Rank, usize, SignalWidth)> {
    let me = check_caller(b, group)?;
    let (_, peer) = group.resolve("target_rank", rank_arg(target_rank)).at(me)?;
    let (offset, width) = check_signal(b, signal, signal_offset, Some(value), peer)?;
    Ok((peer, offset, width))
}

/// Validates a signal word; returns (heap byte offset, width).
pub(crate) fn check_signal<B: Backend + ?Sized>(
    b: &B,
    signal: &SymmBuffer,
    signal_offset: usize,
    value: Option<i64>,
    peer: Rank,
) -> Result<(usize, SignalWidth)> {
    let me = b.rank();
    check_owner(b, signal, "signal")?;
    check_on_rank(signal, "signal", peer).at(me)?;
    let width = match signal.dtype {
        DType::I32 => SignalWidth::W32,
        DType::I64 => SignalWidth::W64,
        other => {
            return Err(ArgError::DTypeMismatch {
                arg: "signal",
                expected: "int32 or int64".into(),
                actual: other.to_string(),
            })
            .at(me)
        }
    };
    check_range("signal_offset", signal_offset, 1, signal.len).at(me)?;
    if let (SignalWidth::W32, Some(v)) = (width, value) {
        if i32::try_from(v).is_err() {
            return Err(ArgError::invalid("signal_value", v, "does not fit the int32 signal")).at(me);
        }
    }
    Ok((signal.offset + signal_offset * signal.dtype.size(), width))
}
