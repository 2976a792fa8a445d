//! The communicator: HCCL's `HcclComm`, created from a root info on every rank, destroyed on
//! drop, and bound to one ACL stream on which all its work is enqueued.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use ascend_sys::safe::{synchronize_stream, Stream};
use symm_core::{DType, ReduceOp};

use super::dtype::{movement_type, reduction};
use super::order::{Producer, StreamOrder};
use super::{hccl, RootInfo};
use crate::result::{HcclError, Result};
use crate::sys;

/// How long dropping a communicator waits for its stream's work before destroying it.
pub const DRAIN_ON_DROP: Duration = Duration::from_secs(60);

/// An HCCL communicator of `ranks` ranks, this one being `rank`, whose collectives are enqueued
/// on one ACL stream.
///
/// Every method that enqueues work returns once it is enqueued: completion is the stream's
/// (`ascend_sys::safe::synchronize_stream`, or another stream ordered after it with
/// [`HcclComm::order_before`]). Its errors are those HCCL reports when enqueueing; a failure of
/// the work itself shows in the stream's synchronization.
///
/// `Send` but not `Sync`: HCCL does not promise that one communicator may be driven from two
/// threads at once (risk R12 of the reference note). A thread that uses it, or drops it, has
/// the communicator's device set (`ascend_sys::safe::set_device`).
#[derive(Debug)]
pub struct HcclComm {
    raw: sys::HcclComm,
    rank: u32,
    ranks: u32,
    order: StreamOrder,
    stream: Arc<Stream>,
}

// SAFETY: the handle is HCCL's, usable from any thread whose context has the communicator's
// device (the type's documented requirement); `Sync` is not claimed.
unsafe impl Send for HcclComm {}

impl HcclComm {
    /// Creates this rank's communicator: `ranks` ranks, this one `rank`, meeting at `root`
    /// (from [`RootInfo::get`] on the root rank, the same bytes on every rank). Blocks until
    /// every rank has joined or HCCL's connection timeout (`HCCL_CONNECT_TIMEOUT`, 120 s by
    /// default) passes. The calling thread's device must be set; HCCL allows one thread per
    /// device to initialise at a time.
    pub fn init(root: &RootInfo, ranks: u32, rank: u32, stream: Arc<Stream>) -> Result<HcclComm> {
        const F: &str = "HcclCommInitRootInfo";
        if ranks == 0 {
            return Err(HcclError::Refused {
                function: F,
                argument: "ranks",
                value: "0".into(),
                reason: "a communicator has at least one rank",
            });
        }
        check_rank(F, "rank", rank, ranks)?;
        let api = hccl()?;
        let raw_root = root.to_raw();
        let mut raw = std::ptr::null_mut();
        // SAFETY: a root info of the header's layout, read during the call, and a valid
        // out-pointer.
        api.check(F, unsafe { (api.HcclCommInitRootInfo)(ranks, &raw_root, rank, &mut raw) })?;
        Ok(HcclComm { raw, rank, ranks, order: StreamOrder::new(), stream })
    }

    /// This rank's place in the communicator.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// The stream its work is enqueued on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The `HcclComm` handle (for a library that takes one); it stays owned by this value.
    pub fn raw(&self) -> sys::HcclComm {
        self.raw
    }

    /// The rank count and this rank, as HCCL reports them (a check of what was asked at init).
    pub fn query(&self) -> Result<(u32, u32)> {
        let api = hccl()?;
        let (mut ranks, mut rank) = (0, 0);
        // SAFETY: a live communicator and valid out-pointers.
        api.check("HcclGetRankSize", unsafe { (api.HcclGetRankSize)(self.raw, &mut ranks) })?;
        // SAFETY: as above.
        api.check("HcclGetRankId", unsafe { (api.HcclGetRankId)(self.raw, &mut rank) })?;
        Ok((ranks, rank))
    }

    /// Makes this communicator's later work wait for `producer`: the work enqueued so far on
    /// another stream (symm's, torch's), or the point an event was recorded at. The host does
    /// not wait.
    pub fn order_after<'a>(&self, producer: impl Into<Producer<'a>>) -> Result<()> {
        self.order.after(&self.stream, producer)
    }

    /// Makes `consumer`'s later work wait for this communicator's work enqueued so far: the
    /// way back, from an HCCL result to the stream that reads it. The host does not wait.
    pub fn order_before(&self, consumer: &Stream) -> Result<()> {
        self.order.after(consumer, &*self.stream)
    }

    /// Enqueues an allreduce of `count` elements of `dtype` from `send` into `recv` with `op`.
    /// `avg`, and dtypes HCCL does not reduce, are refused ([`reduction`]).
    ///
    /// # Safety
    /// - `send` and `recv` are device memory of this communicator's device, valid for `count`
    ///   elements of `dtype` and aligned to the element size, until the allreduce has completed
    ///   on the stream; they may be the same buffer (in place);
    /// - nothing else writes them, or reads `recv`, meanwhile, except work ordered after it;
    /// - every rank enqueues the same collectives in the same order with the same `count`,
    ///   `dtype` and `op` (HCCL's documentation requires it and does not say that it checks:
    ///   a mismatch may hang, or write past a buffer).
    pub unsafe fn all_reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const F: &str = "HcclAllReduce";
        let (data_type, hccl_op) = reduction(F, dtype, op)?;
        let api = hccl()?;
        // SAFETY: the buffers are valid (this function's contract); HCCL only reads `send`.
        let code = unsafe {
            (api.HcclAllReduce)(send.cast_mut(), recv, elements(count), data_type, hccl_op, self.raw, self.stream.raw())
        };
        api.check(F, code)
    }

    /// Enqueues a reduce-scatter: `send` holds `recv_count * ranks` elements, reduced with `op`
    /// across the ranks; this rank's `recv` gets the `recv_count` of its place.
    ///
    /// # Safety
    /// As for [`HcclComm::all_reduce`], `send` being valid for `recv_count * ranks` elements and
    /// `recv` for `recv_count`, the two not overlapping.
    pub unsafe fn reduce_scatter(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const F: &str = "HcclReduceScatter";
        let (data_type, hccl_op) = reduction(F, dtype, op)?;
        let api = hccl()?;
        // SAFETY: the buffers are valid (this function's contract); HCCL only reads `send`.
        let code = unsafe {
            (api.HcclReduceScatter)(
                send.cast_mut(),
                recv,
                elements(recv_count),
                data_type,
                hccl_op,
                self.raw,
                self.stream.raw(),
            )
        };
        api.check(F, code)
    }

    /// Enqueues an allgather: every rank's `send_count` elements, in rank order, into every
    /// rank's `recv`.
    ///
    /// # Safety
    /// As for [`HcclComm::all_reduce`] (without `op`), `send` being valid for `send_count`
    /// elements and `recv` for `send_count * ranks`, the two not overlapping.
    pub unsafe fn all_gather(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: DType,
    ) -> Result<()> {
        const F: &str = "HcclAllGather";
        let api = hccl()?;
        // SAFETY: the buffers are valid (this function's contract); HCCL only reads `send`.
        let code = unsafe {
            (api.HcclAllGather)(
                send.cast_mut(),
                recv,
                elements(send_count),
                movement_type(dtype),
                self.raw,
                self.stream.raw(),
            )
        };
        api.check(F, code)
    }

    /// Enqueues a broadcast of `count` elements of `buf` from rank `root` into every other
    /// rank's `buf`.
    ///
    /// # Safety
    /// As for [`HcclComm::all_reduce`] (without `op`, with the same `root` on every rank),
    /// `buf` being valid for `count` elements.
    pub unsafe fn broadcast(&self, buf: *mut c_void, count: usize, dtype: DType, root: u32) -> Result<()> {
        const F: &str = "HcclBroadcast";
        check_rank(F, "root", root, self.ranks)?;
        let api = hccl()?;
        // SAFETY: the buffer is valid (this function's contract).
        let code = unsafe {
            (api.HcclBroadcast)(buf, elements(count), movement_type(dtype), root, self.raw, self.stream.raw())
        };
        api.check(F, code)
    }

    /// Enqueues a send of `count` elements of `buf` to rank `peer`, matched by `peer`'s
    /// [`HcclComm::recv`].
    ///
    /// # Safety
    /// `buf` is device memory of this communicator's device, valid for `count` elements of
    /// `dtype` until the send has completed on the stream, and not written meanwhile; `peer`
    /// enqueues the matching receive with the same `count` and `dtype`.
    pub unsafe fn send(&self, buf: *const c_void, count: usize, dtype: DType, peer: u32) -> Result<()> {
        const F: &str = "HcclSend";
        check_rank(F, "peer", peer, self.ranks)?;
        let api = hccl()?;
        // SAFETY: the buffer is valid (this function's contract); HCCL only reads it.
        let code = unsafe {
            (api.HcclSend)(buf.cast_mut(), elements(count), movement_type(dtype), peer, self.raw, self.stream.raw())
        };
        api.check(F, code)
    }

    /// Enqueues a receive of `count` elements into `buf` from rank `peer`'s [`HcclComm::send`].
    ///
    /// # Safety
    /// `buf` is device memory of this communicator's device, valid for `count` elements of
    /// `dtype` until the receive has completed on the stream, and neither read nor written by
    /// other work meanwhile; `peer` enqueues the matching send with the same `count` and `dtype`.
    pub unsafe fn recv(&self, buf: *mut c_void, count: usize, dtype: DType, peer: u32) -> Result<()> {
        const F: &str = "HcclRecv";
        check_rank(F, "peer", peer, self.ranks)?;
        let api = hccl()?;
        // SAFETY: the buffer is valid (this function's contract).
        let code =
            unsafe { (api.HcclRecv)(buf, elements(count), movement_type(dtype), peer, self.raw, self.stream.raw()) };
        api.check(F, code)
    }

    /// Enqueues an alltoallv: `send_counts[r]` elements from `send` at `send_displs[r]` to rank
    /// `r`, and `recv_counts[r]` elements from rank `r` into `recv` at `recv_displs[r]` (all in
    /// elements of `dtype`, one entry per rank). The arrays are read during the call, as
    /// torch_npu relies on too.
    ///
    /// # Safety
    /// - `send` and `recv` are distinct device buffers of this communicator's device, valid for
    ///   every range the counts and displacements name, until the operation has completed on
    ///   the stream; nothing else writes them, or reads `recv`, meanwhile;
    /// - every rank enqueues it in the same order, and rank `r`'s `send_counts[me]` equals this
    ///   rank's `recv_counts[r]`.
    #[allow(clippy::too_many_arguments)] // HCCL's own argument list, each named as there.
    pub unsafe fn all_to_all_v(
        &self,
        send: *const c_void,
        send_counts: &[u64],
        send_displs: &[u64],
        recv: *mut c_void,
        recv_counts: &[u64],
        recv_displs: &[u64],
        dtype: DType,
    ) -> Result<()> {
        const F: &str = "HcclAlltoAllV";
        for (argument, list) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            check_per_rank(F, argument, list, self.ranks)?;
        }
        if std::ptr::eq(send, recv.cast_const()) {
            return Err(HcclError::Refused {
                function: F,
                argument: "recv",
                value: format!("{recv:p}"),
                reason: "HCCL's alltoallv needs a receive buffer distinct from the send buffer",
            });
        }
        let api = hccl()?;
        let data_type = movement_type(dtype);
        // SAFETY: the buffers are valid (this function's contract); the four arrays hold one
        // `u64` per rank (checked above) and live through the call.
        let code = unsafe {
            (api.HcclAlltoAllV)(
                send,
                send_counts.as_ptr().cast(),
                send_displs.as_ptr().cast(),
                data_type,
                recv.cast_const(),
                recv_counts.as_ptr().cast(),
                recv_displs.as_ptr().cast(),
                data_type,
                self.raw,
                self.stream.raw(),
            )
        };
        api.check(F, code)
    }

    /// Enqueues a barrier of the communicator's ranks on its stream.
    pub fn barrier(&self) -> Result<()> {
        let api = hccl()?;
        // SAFETY: live handles; a barrier touches no memory of the caller's.
        api.check("HcclBarrier", unsafe { (api.HcclBarrier)(self.raw, self.stream.raw()) })
    }

    /// Waits up to `timeout` for the stream's work, then destroys the communicator, reporting
    /// what failed (dropping it does the same with [`DRAIN_ON_DROP`], and only logs).
    pub fn close(mut self, timeout: Duration) -> Result<()> {
        self.destroy(timeout)
    }

    /// Drains the stream (HCCL ends an operation still running on a destroyed communicator with
    /// an error), then destroys the communicator, once.
    fn destroy(&mut self, timeout: Duration) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let drained = match synchronize_stream(&self.stream, timeout) {
            Ok(true) => Ok(()),
            Ok(false) => Err(HcclError::Timeout {
                function: "HcclCommDestroy",
                what: "the work enqueued on the communicator's stream",
                timeout,
            }),
            Err(e) => Err(e.into()),
        };
        // Loaded: the communicator was created through it.
        let api = hccl()?;
        // SAFETY: created by `init`, destroyed once (the handle is cleared below).
        let code = unsafe { (api.HcclCommDestroy)(self.raw) };
        self.raw = std::ptr::null_mut();
        drained.and(api.check("HcclCommDestroy", code))
    }
}

impl Drop for HcclComm {
    fn drop(&mut self) {
        if let Err(e) = self.destroy(DRAIN_ON_DROP) {
            log::warn!("dropping HCCL communicator (rank {} of {}): {e}", self.rank, self.ranks);
        }
    }
}

/// An element count as HCCL takes it (`uint64_t`; `usize` is at most 64 bits wherever CANN runs).
fn elements(count: usize) -> u64 {
    count as u64
}

/// `Ok` when `value` names a rank of a communicator of `ranks` ranks.
fn check_rank(function: &'static str, argument: &'static str, value: u32, ranks: u32) -> Result<()> {
    if value < ranks {
        return Ok(());
    }
    Err(HcclError::Refused {
        function,
        argument,
        value: value.to_string(),
        reason: "not a rank of the communicator (ranks are numbered from 0 to the rank count - 1)",
    })
}

/// `Ok` when `list` has one entry per rank.
fn check_per_rank(function: &'static str, argument: &'static str, list: &[u64], ranks: u32) -> Result<()> {
    if list.len() == ranks as usize {
        return Ok(());
    }
    Err(HcclError::Refused {
        function,
        argument,
        value: format!("{} entries", list.len()),
        reason: "HCCL reads one entry per rank of the communicator",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_outside_the_communicator_are_refused_by_name() {
        assert!(check_rank("HcclSend", "peer", 3, 4).is_ok());
        let e = check_rank("HcclSend", "peer", 4, 4).unwrap_err();
        assert!(e.to_string().starts_with("HcclSend: argument peer = 4 is refused: not a rank"), "{e}");
        let e = check_rank("HcclBroadcast", "root", u32::MAX, 8).unwrap_err();
        assert!(e.to_string().starts_with("HcclBroadcast: argument root = 4294967295 is refused"), "{e}");
    }

    #[test]
    fn per_rank_arrays_of_another_length_are_refused_by_name() {
        assert!(check_per_rank("HcclAlltoAllV", "send_counts", &[1, 2, 3], 3).is_ok());
        let e = check_per_rank("HcclAlltoAllV", "recv_displs", &[0, 1], 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "HcclAlltoAllV: argument recv_displs = 2 entries is refused: HCCL reads one entry per rank of the communicator"
        );
    }

    #[test]
    fn init_refuses_a_rank_outside_the_count_before_loading_hccl() {
        // A stream handle that is never used: the arguments are refused before any call.
        // SAFETY: the handle is not null (so accepted) and never passed to ACL or HCCL.
        let stream = Arc::new(unsafe { Stream::borrowed(std::ptr::NonNull::<c_void>::dangling().as_ptr()) }.unwrap());
        let root = RootInfo::from_bytes(&[0; RootInfo::BYTES]).unwrap();
        let e = HcclComm::init(&root, 4, 4, stream.clone()).unwrap_err();
        assert!(e.to_string().starts_with("HcclCommInitRootInfo: argument rank = 4 is refused"), "{e}");
        let e = HcclComm::init(&root, 0, 0, stream).unwrap_err();
        assert!(e.to_string().starts_with("HcclCommInitRootInfo: argument ranks = 0 is refused"), "{e}");
    }
}
