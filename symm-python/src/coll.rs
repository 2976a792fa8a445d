//! Collectives and point-to-point messages from Python: the conversions of the Python
//! arguments the core cannot see (op and rank objects, format names), and the core's
//! [`Collectives`] run with the GIL released, which checks the rest with the names of the
//! Python API (`output_tensor`, `receive_list`, `src_rank` ...).
//!
//! Any contiguous CPU tensor is accepted: the core reads tensors inside the symmetric heap in
//! place (zero-copy) and stages the others through the group's workspace.
//!
//! A rank whose arguments fail a conversion still takes part in the collective's round, only to
//! reject it ([`Collectives::reject`](symm_core::Collectives::reject), as the engines do for the
//! errors they find themselves): its peers fail at once with `PeerRejected` instead of waiting for a Timeout, and the group's
//! round numbers stay in step, so the group remains usable after the error. Point-to-point calls
//! have no rounds: a bad `send` leaves its receiver waiting until `SYMMETRIC_MEMORY_TIMEOUT`.

use std::cell::Cell;

use pyo3::ffi::PyThreadState;
use pyo3::prelude::*;
use symm_core::coll::lowp::FORMATS;
use symm_core::dfx::Op;
use symm_core::{ArgError, AtRank, CollOptions, Collectives, DType, Group, LocalRef, Rank, ReduceOp, Transport};

use crate::comm::{code_arg, int_arg, repr, Local, PyCommunicator};
use crate::errors::{invalid, IntoPyResult};

/// The reduction of `op`: `"sum"`, `"avg"`, `"max"`, `"min"` or their codes 0..3.
pub(crate) fn op_arg(py: Python<'_>, rank: Rank, op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    code_arg(py, rank, "op", op, ReduceOp::from_code)
}

/// The transport format: None (the default, from `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`),
/// `"none"` (full precision, whatever the default), or the name of one of the low-precision
/// formats.
pub(crate) fn low_precision_arg(py: Python<'_>, rank: Rank, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Transport> {
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
pub(crate) fn group_rank_arg(
    py: Python<'_>,
    me: Rank,
    g: &Group,
    arg: &'static str,
    obj: &Bound<'_, PyAny>,
) -> PyResult<usize> {
    let r = int_arg(py, me, arg, obj)?;
    g.resolve(arg, r).map(|(l, _)| l.index()).at(me).py(py)
}

/// A call's options: `transport`, and the GIL released should the call block
/// ([`gil_released_when_blocking`]).
fn options(transport: Transport) -> CollOptions {
    CollOptions { transport, before_blocking: Some(release_gil), ..CollOptions::default() }
}

/// The options of an asynchronous call: `transport`; the stream's thread holds no GIL.
pub(crate) fn async_options(transport: Transport) -> CollOptions {
    CollOptions { transport, ..CollOptions::default() }
}

impl PyCommunicator {
    /// Rejects this rank's part in `g`'s next collective (recorded as `op`) for the argument
    /// error `e` the binding found ([`Collectives::reject`](symm_core::Collectives::reject)): the
    /// members waiting in it fail with PeerRejected. Returns `e` (the core's error is the expected rejection, or a failure
    /// to reach the peers, which leaves them to their bounded waits).
    pub(crate) fn reject_round(&self, py: Python<'_>, g: &Group, op: Op, e: PyErr) -> PyErr {
        let why = ArgError::invalid("arguments", e.value(py).to_string(), "refused by the Python binding");
        let comm = self.comm();
        let _ = py.detach(|| symm_core::Collectives::reject(comm, g, op, why));
        e
    }

    /// Fails with GroupError unless this rank is a member of `g` (a non-member takes no part in
    /// the group's rounds, so nothing is rejected).
    pub(crate) fn member_of(&self, py: Python<'_>, g: &Group) -> PyResult<()> {
        g.member().map(|_| ()).at(self.rank_id()).py(py)
    }

    /// The in-place allreduce of a checked tensor, the GIL released as [`gil_released`] says:
    /// what both arms of the table ([`crate::ops`]) end in.
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
            let buf = unsafe { t.writer() };
            comm.allreduce(g, buf, op, &options(transport))
        };
        gil_released(py, t.bytes(), run).py(py)
    }

    /// The reduce_scatter of `i` into `o` (the core checks their sizes, dtypes and overlap).
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
        gil_released(py, i.bytes(), || {
            // SAFETY: `o` and `i` describe the caller's contiguous host tensors, held for the
            // call (the `Desc` contract, which the fast path keeps too); the core checks that
            // they are identical parts or disjoint.
            let (out, inp) = unsafe { (o.writer(), i.reader()) };
            comm.reduce_scatter(g, out, inp, op, &options(transport))
        })
        .py(py)
    }

    /// The allgather of `i` into `o` (the core checks their sizes, dtypes and overlap).
    pub(crate) fn run_allgather(&self, py: Python<'_>, g: &Group, o: Local, i: Local) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, o.bytes(), || {
            // SAFETY: as in `run_reduce_scatter`.
            let (out, inp) = unsafe { (o.writer(), i.reader()) };
            comm.allgather(g, out, inp, &options(Transport::Default))
        })
        .py(py)
    }

    /// The alltoall of `sends` into `r` by `counts` (the core checks that there is one of each
    /// per group rank, the dtypes, that the counts fit `r`, and that `r` overlaps no send).
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
            // written only at the offsets of `counts`, whose sum the core checks against its length.
            let refs: Vec<LocalRef<'_>> = sends.iter().map(|s| unsafe { s.reader() }).collect();
            // SAFETY: as above.
            let out = unsafe { r.writer() };
            comm.alltoall(g, &refs, out, counts, &options(Transport::Default))
        })
        .py(py)
    }

    /// The broadcast of a checked tensor from group rank `root` (a rank of `g`).
    pub(crate) fn run_broadcast(&self, py: Python<'_>, g: &Group, t: Local, root: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.bytes(), || {
            // SAFETY: as in `run_allreduce`.
            let buf = unsafe { t.writer() };
            comm.broadcast(g, buf, root, &options(Transport::Default))
        })
        .py(py)
    }

    /// The send of a checked tensor to group rank `dst` (a rank of `g`).
    pub(crate) fn run_send(&self, py: Python<'_>, g: &Group, t: Local, dst: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.bytes(), || {
            // SAFETY: `t` describes the caller's contiguous host tensor, held for the call; the
            // call returns once the data is out of it.
            let buf = unsafe { t.reader() };
            comm.send(g, buf, dst, &options(Transport::Default))
        })
        .py(py)
    }

    /// The send of `s` to group rank `dst` and the receive into `r` from group rank `src`, at
    /// once (the core checks that `s` and `r` do not overlap).
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
        gil_released(py, s.bytes() + r.bytes(), || {
            // SAFETY: `s` and `r` describe the caller's contiguous host tensors, held for the
            // call (the core refuses overlapping ones); the call returns once the data is out of `s` and the
            // message is in `r`.
            let (send, recv) = unsafe { (s.reader(), r.writer()) };
            comm.sendrecv(g, send, dst, recv, src, &options(Transport::Default))
        })
        .py(py)
    }

    /// The receive into a checked tensor from group rank `src` (a rank of `g`).
    pub(crate) fn run_recv(&self, py: Python<'_>, g: &Group, t: Local, src: usize) -> PyResult<()> {
        let comm = self.comm();
        gil_released(py, t.bytes(), || {
            // SAFETY: `t` describes the caller's contiguous host tensor, held for the call; the
            // call returns once the message is in it.
            let buf = unsafe { t.writer() };
            comm.recv(g, buf, src, &options(Transport::Default))
        })
        .py(py)
    }
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
