//! Collectives and point-to-point messages from Python: the arguments are checked here with
//! the names of the Python API (`output_tensor`, `receive_list`, `src_rank` ...), then the
//! core's [`Collectives`] runs with the GIL released.
//!
//! Any contiguous CPU tensor is accepted: the core reads tensors inside the symmetric heap in
//! place (zero-copy) and stages the others through the group's workspace.
//!
//! A rank whose arguments fail a check here still takes part in the collective's round, only to
//! reject it (as the core does for the errors it finds itself): its peers fail at once with
//! `PeerRejected` instead of waiting for a Timeout, and the group's round numbers stay in step,
//! so the group remains usable after the error. Point-to-point calls have no rounds: a bad
//! `send` leaves its receiver waiting until `SYMMETRIC_MEMORY_TIMEOUT`.

use std::cell::Cell;

use pyo3::ffi::PyThreadState;
use pyo3::prelude::*;
use symm_core::coll::lowp::FORMATS;
use symm_core::{
    ArgError, AtRank, CollOptions, Collectives, DType, Group, LocalMut, LocalRef, Rank, ReduceOp, Transport,
};

use crate::comm::{code_arg, int_arg, repr, Desc, Local, PyCommunicator};
use crate::errors::{self, invalid, IntoPyResult};

/// An [`ArgError`] raised by `rank`, as a Python exception.
fn arg_error(py: Python<'_>, rank: Rank, e: ArgError) -> PyErr {
    errors::to_py(py, &Err::<(), _>(e).at(rank).unwrap_err())
}

/// The reduction of `op`: `"sum"`, `"avg"`, `"max"`, `"min"` or their codes 0..3.
fn op_arg(py: Python<'_>, rank: Rank, op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    code_arg(py, rank, "op", op, ReduceOp::from_code)
}

/// The transport format: None (the default, from `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`),
/// `"none"` (full precision, whatever the default), or the name of one of the low-precision
/// formats.
fn low_precision_arg(py: Python<'_>, rank: Rank, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Transport> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(Transport::Default) };
    let accepted = "accepted: float16, bfloat16, float8_e4m3fn, float8_e5m2, 'none' (full precision), or None \
                    (the default, from SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE)";
    let name = obj.extract::<String>().ok();
    if name.as_deref().is_some_and(|n| n.trim().eq_ignore_ascii_case("none")) {
        return Ok(Transport::Full);
    }
    match name.and_then(|s| s.parse::<DType>().ok()) {
        Some(d) if FORMATS.contains(&d) => Ok(Transport::Low(d)),
        _ => Err(invalid(py, rank, "low_precision_dtype", repr(obj), accepted)),
    }
}

/// A rank of `group` given by the caller as `arg` (GroupError when outside the group).
fn group_rank_arg(py: Python<'_>, me: Rank, g: &Group, arg: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let r = int_arg(py, me, arg, obj)?;
    g.resolve(arg, r).map(|(l, _)| l.index()).at(me).py(py)
}

/// A call's options: `transport`, and the GIL released should the call block
/// ([`gil_released_when_blocking`]).
fn options(transport: Transport) -> CollOptions {
    CollOptions { transport, before_blocking: Some(release_gil), ..CollOptions::default() }
}

/// Checks that `tensor` holds `want` elements; the error names `arg` and says why.
fn check_len(py: Python<'_>, me: Rank, arg: &'static str, got: &Local, want: usize, why: String) -> PyResult<()> {
    if got.len == want {
        Ok(())
    } else {
        Err(invalid(py, me, arg, format!("{} elements", got.len), &why))
    }
}

/// Checks that `other` has `base`'s dtype (`other_arg` is named; `base_arg` is the reference).
fn check_same_dtype(
    py: Python<'_>,
    me: Rank,
    other_arg: &'static str,
    other: &Local,
    base_arg: &str,
    base: &Local,
) -> PyResult<()> {
    if other.dtype == base.dtype {
        Ok(())
    } else {
        Err(arg_error(
            py,
            me,
            ArgError::DTypeMismatch {
                arg: other_arg,
                expected: format!("{base_arg}'s {}", base.dtype),
                actual: other.dtype.to_string(),
            },
        ))
    }
}

impl PyCommunicator {
    /// Takes part in `g`'s next collective round only to reject it: peers waiting in a
    /// collective of `g` fail with `PeerRejected`, and the round numbers stay in step.
    ///
    /// The core offers no public "reject" call, so this makes the core reject one of its own:
    /// an out-of-place allreduce whose output is shorter than its input, which the core turns
    /// down through a round before touching any memory.
    pub(crate) fn reject_round(&self, py: Python<'_>, g: &Group) {
        let comm = self.comm();
        py.detach(|| {
            let input = [0u8; 1];
            let mut output = [0u8; 1];
            // SAFETY: both arrays live until the call returns; the lengths (1 and 0 bytes) lie
            // within them, and the arrays are disjoint.
            let (inp, out) = unsafe {
                (
                    LocalRef::from_raw(input.as_ptr(), 1, DType::U8),
                    LocalMut::from_raw(output.as_mut_ptr(), 0, DType::U8),
                )
            };
            // The error is the expected rejection (or a failure to reach the peers at all,
            // which leaves them to their bounded waits); the caller raises its own error.
            let _ = comm.allreduce_into(g, inp, out, ReduceOp::Sum, &options(Transport::Default));
        });
    }

    /// Runs the argument checks of a collective of `g`; when they fail, rejects the round
    /// first (see [`PyCommunicator::reject_round`]).
    pub(crate) fn checked<T>(&self, py: Python<'_>, g: &Group, check: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        check().inspect_err(|_| self.reject_round(py, g))
    }

    /// Fails with GroupError unless this rank is a member of `g` (a non-member takes no part in
    /// the group's rounds, so nothing is rejected).
    pub(crate) fn member_of(&self, py: Python<'_>, g: &Group) -> PyResult<()> {
        g.member().map(|_| ()).at(self.rank_id()).py(py)
    }

    pub(crate) fn coll_allreduce(
        &self,
        py: Python<'_>,
        g: &Group,
        tensor: &Desc,
        op: &Bound<'_, PyAny>,
        low_precision: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let (t, op, lp) = self.checked(py, g, || {
            Ok((self.local(py, tensor, "tensor")?, op_arg(py, me, op)?, low_precision_arg(py, me, low_precision)?))
        })?;
        self.run_allreduce(py, g, t, op, lp)
    }

    /// The in-place allreduce of a checked tensor, the GIL released as [`gil_released`] says:
    /// what the full path and the fast path ([`crate::fast`]) both end in.
    pub(crate) fn run_allreduce(
        &self,
        py: Python<'_>,
        g: &Group,
        t: Local,
        op: ReduceOp,
        transport: Transport,
    ) -> PyResult<()> {
        let comm = self.comm();
        let run = || {
            // SAFETY: `t` describes the caller's contiguous host tensor, held by the caller for
            // the call (the `Desc` contract, which the fast path keeps too: it reads the tensor
            // object the caller passed); the call returns only when it is done writing it.
            let buf = unsafe { LocalMut::from_raw(t.ptr as *mut u8, t.len, t.dtype) };
            comm.allreduce(g, buf, op, &options(transport))
        };
        gil_released(py, t.len * t.dtype.size(), run).py(py)
    }

    #[allow(clippy::too_many_arguments)] // the Python call's arguments, checked together
    pub(crate) fn coll_reduce_scatter(
        &self,
        py: Python<'_>,
        g: &Group,
        output: &Desc,
        input: &Desc,
        op: &Bound<'_, PyAny>,
        low_precision: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let n = g.size();
        let (o, i, op, lp) = self.checked(py, g, || {
            let o = self.local(py, output, "output_tensor")?;
            let i = self.local(py, input, "input_tensor")?;
            check_same_dtype(py, me, "output_tensor", &o, "input_tensor", &i)?;
            let why = format!(
                "must hold group size {n} x output_tensor's {} elements = {} (input_tensor is split into {n} equal \
                 parts, part r is reduced into group rank r's output_tensor)",
                o.len,
                n * o.len
            );
            check_len(py, me, "input_tensor", &i, n * o.len, why)?;
            Ok((o, i, op_arg(py, me, op)?, low_precision_arg(py, me, low_precision)?))
        })?;
        self.run_reduce_scatter(py, g, o, i, op, lp)
    }

    /// The reduce_scatter of checked tensors (`i` holds the group size times `o`'s elements,
    /// same dtype): what the full path and the fast path both end in.
    pub(crate) fn run_reduce_scatter(
        &self,
        py: Python<'_>,
        g: &Group,
        o: Local,
        i: Local,
        op: ReduceOp,
        transport: Transport,
    ) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, i.len * i.dtype.size(), || {
            // SAFETY: `o` and `i` describe the caller's contiguous host tensors, held for the
            // call (the `Desc` contract, which the fast path keeps too); the core checks that
            // they are identical parts or disjoint.
            let (out, inp) = unsafe {
                (
                    LocalMut::from_raw(o.ptr as *mut u8, o.len, o.dtype),
                    LocalRef::from_raw(i.ptr as *const u8, i.len, i.dtype),
                )
            };
            comm.reduce_scatter(g, out, inp, op, &options(transport))
        })
        .py(py)
    }

    pub(crate) fn coll_allgather(&self, py: Python<'_>, g: &Group, output: &Desc, input: &Desc) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let n = g.size();
        let (o, i) = self.checked(py, g, || {
            let o = self.local(py, output, "output_tensor")?;
            let i = self.local(py, input, "input_tensor")?;
            check_same_dtype(py, me, "output_tensor", &o, "input_tensor", &i)?;
            let why = format!(
                "must hold group size {n} x input_tensor's {} elements = {} (the inputs of the group's ranks, \
                 concatenated in group-rank order)",
                i.len,
                n * i.len
            );
            check_len(py, me, "output_tensor", &o, n * i.len, why)?;
            Ok((o, i))
        })?;
        self.run_allgather(py, g, o, i)
    }

    /// The allgather of checked tensors (`o` holds the group size times `i`'s elements, same
    /// dtype): what the full path and the fast path both end in.
    pub(crate) fn run_allgather(&self, py: Python<'_>, g: &Group, o: Local, i: Local) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, o.len * o.dtype.size(), || {
            // SAFETY: as in `run_reduce_scatter`.
            let (out, inp) = unsafe {
                (
                    LocalMut::from_raw(o.ptr as *mut u8, o.len, o.dtype),
                    LocalRef::from_raw(i.ptr as *const u8, i.len, i.dtype),
                )
            };
            comm.allgather(g, out, inp, &options(Transport::Default))
        })
        .py(py)
    }

    pub(crate) fn coll_alltoall(
        &self,
        py: Python<'_>,
        g: &Group,
        send: &[Desc],
        receive: &Desc,
        receive_list: &[Bound<'_, PyAny>],
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let n = g.size();
        let (sends, r, counts) = self.checked(py, g, || {
            if send.len() != n {
                let why = format!("needs one tensor per group rank ({n}); entry i goes to group rank i");
                return Err(invalid(py, me, "send_tensor_list", format!("{} tensors", send.len()), &why));
            }
            let r = self.local(py, receive, "receive_tensor")?;
            let sends = (0..n)
                .map(|i| self.local_at(py, &send[i], "send_tensor_list", Some(i)))
                .collect::<PyResult<Vec<Local>>>()?;
            if let Some((i, s)) = sends.iter().enumerate().find(|(_, s)| s.dtype != r.dtype) {
                let e = ArgError::DTypeMismatch {
                    arg: "send_tensor_list",
                    expected: format!("receive_tensor's {}", r.dtype),
                    actual: format!("{} (entry {i})", s.dtype),
                };
                return Err(arg_error(py, me, e));
            }
            if receive_list.len() != n {
                let why = format!("needs one count per group rank ({n}): the elements received from each");
                return Err(invalid(py, me, "receive_list", format!("{} counts", receive_list.len()), &why));
            }
            let mut counts = Vec::with_capacity(n);
            for (i, c) in receive_list.iter().enumerate() {
                let count = c.extract::<i64>().ok().and_then(|v| usize::try_from(v).ok());
                let Some(count) = count else {
                    return Err(invalid(
                        py,
                        me,
                        "receive_list",
                        format!("{} (entry {i})", repr(c)),
                        "counts are integers >= 0 (elements received from each group rank)",
                    ));
                };
                counts.push(count);
            }
            match counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)) {
                Some(t) if t <= r.len => Ok((sends, r, counts)),
                total => Err(invalid(
                    py,
                    me,
                    "receive_list",
                    format!("{counts:?}"),
                    &format!(
                        "sums to {}, more than receive_tensor's {} elements",
                        total.map_or_else(|| "more than 2^64".to_string(), |t| t.to_string()),
                        r.len
                    ),
                )),
            }
        })?;
        self.run_alltoall(py, g, &sends, r, &counts)
    }

    /// The alltoall of checked tensors (one send tensor per group rank, all of `r`'s dtype;
    /// `counts`, one per group rank, summing to at most `r`'s elements): what the full path and
    /// the fast path both end in.
    pub(crate) fn run_alltoall(
        &self,
        py: Python<'_>,
        g: &Group,
        sends: &[Local],
        r: Local,
        counts: &[usize],
    ) -> PyResult<()> {
        let comm = self.comm();
        let bytes = sends.iter().map(|s| s.len).sum::<usize>().max(r.len) * r.dtype.size();
        gil_released(py, bytes, || {
            // SAFETY: every `Local` describes a contiguous host tensor the caller holds for the
            // call (the `Desc` contract, which the fast path keeps too); the receive tensor is
            // written only at the offsets of `counts`, whose sum was checked against its length.
            let refs: Vec<LocalRef<'_>> =
                sends.iter().map(|s| unsafe { LocalRef::from_raw(s.ptr as *const u8, s.len, s.dtype) }).collect();
            // SAFETY: as above.
            let out = unsafe { LocalMut::from_raw(r.ptr as *mut u8, r.len, r.dtype) };
            comm.alltoall(g, &refs, out, counts, &options(Transport::Default))
        })
        .py(py)
    }

    pub(crate) fn coll_broadcast(
        &self,
        py: Python<'_>,
        g: &Group,
        tensor: &Desc,
        src_rank: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let (t, root) = self.checked(py, g, || {
            Ok((self.local(py, tensor, "tensor")?, group_rank_arg(py, me, g, "src_rank", src_rank)?))
        })?;
        self.run_broadcast(py, g, t, root)
    }

    /// The broadcast of a checked tensor from group rank `root` (a rank of `g`): what the full
    /// path and the fast path both end in.
    pub(crate) fn run_broadcast(&self, py: Python<'_>, g: &Group, t: Local, root: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.len * t.dtype.size(), || {
            // SAFETY: as in `run_allreduce`.
            let buf = unsafe { LocalMut::from_raw(t.ptr as *mut u8, t.len, t.dtype) };
            comm.broadcast(g, buf, root, &options(Transport::Default))
        })
        .py(py)
    }

    pub(crate) fn p2p_send(
        &self,
        py: Python<'_>,
        g: &Group,
        tensor: &Desc,
        dst_rank: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let t = self.local(py, tensor, "tensor")?;
        let dst = group_rank_arg(py, me, g, "dst_rank", dst_rank)?;
        self.run_send(py, g, t, dst)
    }

    /// The send of a checked tensor to group rank `dst` (a rank of `g`): what the full path and
    /// the fast path both end in.
    pub(crate) fn run_send(&self, py: Python<'_>, g: &Group, t: Local, dst: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.len * t.dtype.size(), || {
            // SAFETY: `t` describes the caller's contiguous host tensor, held for the call; the
            // call returns once the data is out of it.
            let buf = unsafe { LocalRef::from_raw(t.ptr as *const u8, t.len, t.dtype) };
            comm.send(g, buf, dst, &options(Transport::Default))
        })
        .py(py)
    }

    pub(crate) fn p2p_sendrecv(
        &self,
        py: Python<'_>,
        g: &Group,
        send_tensor: &Desc,
        dst_rank: &Bound<'_, PyAny>,
        recv_tensor: &Desc,
        src_rank: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let s = self.local(py, send_tensor, "send_tensor")?;
        let dst = group_rank_arg(py, me, g, "dst_rank", dst_rank)?;
        let r = self.local(py, recv_tensor, "recv_tensor")?;
        let src = group_rank_arg(py, me, g, "src_rank", src_rank)?;
        if overlapping(s, r) {
            let (sb, rb) = (s.len * s.dtype.size(), r.len * r.dtype.size());
            let e = ArgError::invalid(
                "recv_tensor",
                format!("{rb} bytes at {:#x}", r.ptr),
                format!("must not overlap send_tensor ({sb} bytes at {:#x})", s.ptr),
            );
            return Err(arg_error(py, me, e));
        }
        self.run_sendrecv(py, g, s, dst, r, src)
    }

    /// The send of checked tensor `s` to group rank `dst` and the receive into `r` from group
    /// rank `src`, at once (`s` and `r` do not overlap): what the full path and the fast path
    /// both end in.
    pub(crate) fn run_sendrecv(
        &self,
        py: Python<'_>,
        g: &Group,
        s: Local,
        dst: usize,
        r: Local,
        src: usize,
    ) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, s.len * s.dtype.size() + r.len * r.dtype.size(), || {
            // SAFETY: `s` and `r` describe the caller's contiguous host tensors, held for the
            // call, and do not overlap; the call returns once the data is out of `s` and the
            // message is in `r`.
            let (send, recv) = unsafe {
                (
                    LocalRef::from_raw(s.ptr as *const u8, s.len, s.dtype),
                    LocalMut::from_raw(r.ptr as *mut u8, r.len, r.dtype),
                )
            };
            comm.sendrecv(g, send, dst, recv, src, &options(Transport::Default))
        })
        .py(py)
    }

    pub(crate) fn p2p_recv(
        &self,
        py: Python<'_>,
        g: &Group,
        tensor: &Desc,
        src_rank: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let t = self.local(py, tensor, "tensor")?;
        let src = group_rank_arg(py, me, g, "src_rank", src_rank)?;
        self.run_recv(py, g, t, src)
    }

    /// The receive into a checked tensor from group rank `src` (a rank of `g`): what the full
    /// path and the fast path both end in.
    pub(crate) fn run_recv(&self, py: Python<'_>, g: &Group, t: Local, src: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.len * t.dtype.size(), || {
            // SAFETY: `t` describes the caller's contiguous host tensor, held for the call; the
            // call returns once the message is in it.
            let buf = unsafe { LocalMut::from_raw(t.ptr as *mut u8, t.len, t.dtype) };
            comm.recv(g, buf, src, &options(Transport::Default))
        })
        .py(py)
    }
}

/// Whether the bytes of two tensors overlap (empty ones overlap nothing).
pub(crate) fn overlapping(a: Local, b: Local) -> bool {
    symm_core::coll::ranges_overlap(
        a.ptr as *const u8,
        a.len * a.dtype.size(),
        b.ptr as *const u8,
        b.len * b.dtype.size(),
    )
}

/// Calls up to this many bytes keep the GIL until they block ([`gil_released_when_blocking`]);
/// larger ones release it for the whole call, as their copies may take long enough to stall
/// other Python threads (64 KiB take a few microseconds, where the ~40 ns of a release no longer
/// count).
const GIL_HOLD_MAX_BYTES: usize = 64 << 10;

/// Runs the core call `f` of a collective moving `bytes` with the GIL released for other
/// Python threads: only once it is about to block for a small call, for the whole call for a
/// large one (see [`GIL_HOLD_MAX_BYTES`]). Inlined, as the function below: a call would move
/// the core's `Result` (88 bytes) through memory twice more, in every small collective.
#[inline(always)]
fn gil_released<R, F>(py: Python<'_>, bytes: usize, f: F) -> R
where
    F: pyo3::marker::Ungil + FnOnce() -> R,
    R: pyo3::marker::Ungil,
{
    if bytes <= GIL_HOLD_MAX_BYTES {
        gil_released_when_blocking(py, f)
    } else {
        py.detach(f)
    }
}

thread_local! {
    /// This thread's GIL inside [`gil_released_when_blocking`]: null while it is held,
    /// [`ARMED`] while it is held and to be released should the call block, else the thread
    /// state saved when [`release_gil`] released it (restoring it re-takes the GIL). One word,
    /// stored and loaded whole (a narrower store under a wider load would stall the load).
    static GIL: Cell<*mut PyThreadState> = const { Cell::new(std::ptr::null_mut()) };
}

/// See [`GIL`]: no thread state lives at its alignment's address.
const ARMED: *mut PyThreadState = std::ptr::NonNull::dangling().as_ptr();

/// Whether this thread is inside a collective that released its GIL by hand while waiting
/// ([`gil_released_when_blocking`]). PyO3 still counts such a thread as attached (the call
/// came in through a PyO3 function), so `Python::try_attach` would run Python on it without
/// the GIL: code that may run there (the log sink) takes the GIL through the C API instead.
pub(crate) fn gil_released_by_hook() -> bool {
    let state = GIL.get();
    !state.is_null() && state != ARMED
}

/// The collectives' "about to block" callback ([`CollOptions::before_blocking`]): releases the
/// GIL of a call inside [`gil_released_when_blocking`] (and does nothing elsewhere, or twice).
fn release_gil() {
    if GIL.get() == ARMED {
        // SAFETY: armed only by `gil_released_when_blocking`, on this thread, which holds the
        // GIL (its `_py` token) until it returns and re-takes the GIL there if released here;
        // nothing touches Python meanwhile, except the log sink, which sees the saved state and
        // takes the GIL through the C API.
        GIL.set(unsafe { pyo3::ffi::PyEval_SaveThread() });
    }
}

/// Runs `f` (which must not touch Python) holding the GIL while it spins and releasing it only
/// when it is about to block ([`release_gil`], passed in the call's options): a small
/// collective whose peers are already there never blocks, and releasing and re-taking the GIL
/// would cost it ~40 ns; one that waits for a late peer lets every other Python thread run
/// meanwhile, as `py.detach` would. The GIL is held again when this returns or unwinds.
#[inline(always)]
fn gil_released_when_blocking<R>(_py: Python<'_>, f: impl FnOnce() -> R) -> R {
    /// Re-takes the GIL should [`release_gil`] have released it.
    struct Reacquire<'a>(&'a Cell<*mut PyThreadState>);
    impl Drop for Reacquire<'_> {
        fn drop(&mut self) {
            let saved = self.0.replace(std::ptr::null_mut());
            if !saved.is_null() && saved != ARMED {
                // SAFETY: `saved` is this thread's state, saved by `PyEval_SaveThread` in
                // `release_gil` and not restored since: this re-takes the GIL the `_py` token
                // stands for.
                unsafe { pyo3::ffi::PyEval_RestoreThread(saved) };
            }
        }
    }
    // One look-up of the thread-local for the whole call (in a shared library each one is a
    // call into the dynamic loader, a few ns of a small collective).
    let slot: *const Cell<*mut PyThreadState> = GIL.with(|g| g as *const _);
    // SAFETY: `GIL` is const-initialised and its type needs no drop, so no destructor is
    // registered for it: this thread's slot lives as long as the thread, after this frame, and
    // is only ever shared (`&Cell`).
    let gil = unsafe { &*slot };
    gil.set(ARMED);
    let _reacquire = Reacquire(gil);
    f()
}
