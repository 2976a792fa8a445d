//! The table of the public collectives: one entry per collective gives its Python function
//! (name, parameters, defaults, signature, documentation), the stub line of `symm/__init__.pyi`
//! (tests/test_stubs.py compares both stub files with the table), the argument its profiler
//! range describes, and how its two arms parse its arguments and run it: the fast arm for the
//! common case, the full arm for every call. A new collective is an entry here, its algorithm
//! in the core and its tests.
//!
//! **The common case** a fast arm runs: every argument given as a value it recognises (`group`
//! None or a group the API already resolved, that this rank belongs to; no low-precision format;
//! an op by name or code; a rank as an `int` of the group; lists given as a `list` or `tuple`, of
//! tensors, or of counts as `int`s or one-element integer tensors; counts also as one integer
//! tensor, as HyperParallel passes them, see [`crate::tensor::Reader::counts`]) and plain
//! contiguous CPU tensors of supported dtypes whose data lies within their storage. An arm
//! returns `Ok(false)` for anything else **before anything was done** (no round joined, nothing
//! rejected, no error raised), and the call goes, with its arguments as given, to the full arm
//! ([`crate::entry::Full`]): the platform resolves the group and describes the tensors, a
//! profiler range is recorded, and an argument the binding refuses (a Python type, a freed
//! tensor, a storage check) rejects the round so that the peers fail at once. Both arms end in
//! the same core call, which checks everything else (sizes, dtypes, overlaps, counts) once,
//! with the Python argument names.
//!
//! **Asynchronous calls.** Every entry's last parameter is `async_op`. The fast arms never run
//! one that is given and not `False`, nor any call while an asynchronous operation of the
//! communicator may still be in flight ([`crate::work::AsyncOps::any`]); the full arm runs the
//! blocking core call or, with `async_op=True`, its stream form ([`Full::run`]), after the same
//! argument handling and rejections.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyInt, PyList, PySequence, PyString, PyTuple};
use symm_core::dfx::Op;
use symm_core::{Group, LocalRef, ReduceOp, StreamCollectives, Transport};

use crate::coll::async_options;
use crate::entry::{Args, Full, Given, MAX_PARAMS};
use crate::fast::{Fast, FastSpec};
use crate::tensor::int_element;
use crate::work::PyWork;

/// Declares the table: the [`Kind`] of every collective (named as its [`Op`]) with its
/// parameters, defaults, stub and profiled argument, its fast arm (`|py, spec, comm, args| {
/// ... }`, run by [`Kind::try_fast`]), its full arm (`|py, full, args| { ... }`, run by
/// [`Kind::call`]) and its `#[pyfunction]`, the *binding* whose definition the entry point
/// shares ([`crate::entry`]).
macro_rules! collectives {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident => fn $name:ident($($req:ident),+ $(; $($opt:ident = $default:literal),+)?)
            stub $stub:literal,
            profiled $profiled:ident,
            fast |$py:ident, $f:ident, $comm:ident, $a:ident| $body:block
            full |$fpy:ident, $c:ident, $fa:ident| $full:block
    )+) => {
        /// The public collectives, one per entry of the table.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Kind {
            $($kind),+
        }

        impl Kind {
            pub(crate) const ALL: &'static [Kind] = &[$(Kind::$kind),+];

            /// The entry point of each, in the order of [`Kind::ALL`].
            pub(crate) const ENTRIES: &'static [ffi::PyCFunctionFastWithKeywords] =
                &[$(crate::entry::entry::<{ Kind::$kind as usize }>),+];

            /// The core's operation (its name is the one of messages and profiler ranges).
            pub(crate) fn op(self) -> Op {
                match self { $(Kind::$kind => Op::$kind),+ }
            }

            /// The public function's name.
            pub(crate) fn function(self) -> &'static str {
                match self { $(Kind::$kind => stringify!($name)),+ }
            }

            /// The parameters of the Python function, in order.
            pub(crate) fn params(self) -> &'static [&'static str] {
                match self { $(Kind::$kind => &[$(stringify!($req),)+ $($(stringify!($opt),)+)?]),+ }
            }

            /// How many leading parameters have no default.
            pub(crate) fn required(self) -> usize {
                match self { $(Kind::$kind => [$(stringify!($req)),+].len()),+ }
            }

            /// The defaults of the parameters after the required ones, as Python expressions.
            pub(crate) fn defaults(self) -> &'static [&'static str] {
                match self { $(Kind::$kind => &[$($($default,)+)?]),+ }
            }

            /// The parameter list of its line in `symm/__init__.pyi`.
            pub(crate) fn stub(self) -> &'static str {
                match self { $(Kind::$kind => $stub),+ }
            }

            /// The Python signature, `(tensor, op='sum', ...)`.
            pub(crate) fn text_signature(self) -> String {
                let (names, required) = (self.params(), self.required());
                let defaults = names[required..].iter().zip(self.defaults()).map(|(n, d)| format!("{n}={d}"));
                let all: Vec<String> = names[..required].iter().map(|n| n.to_string()).chain(defaults).collect();
                format!("({})", all.join(", "))
            }

            /// The parameter a profiler range describes (its elements and dtype).
            pub(crate) fn profiled(self) -> &'static str {
                match self { $(Kind::$kind => stringify!($profiled)),+ }
            }

            /// Runs the call when it is the common case and returns true; returns false having
            /// done nothing otherwise.
            pub(crate) fn try_fast(self, py: Python<'_>, fast: &Fast, a: &Args<'_, '_>) -> PyResult<bool> {
                let comm = fast.comm.get();
                // `async_op` (the last parameter) given and not `False`, or asynchronous work in
                // flight, symm's or (under SYMM_VALIDATE=1) another library's (whose tensors a
                // call must not use unchecked, and whose group's host calls wait for it): the
                // full arm.
                let async_op = a[self.params().len() - 1];
                // SAFETY: `Py_False` is the address of the `False` singleton.
                if async_op.is_some_and(|v| v.as_ptr() != unsafe { ffi::Py_False() })
                    || comm.asyncs().any()
                    || crate::work::foreign_any()
                {
                    return Ok(false);
                }
                let f = &fast.spec;
                if f.profiling(py) {
                    return Ok(false);
                }
                match self {
                    $(Kind::$kind => {
                        let ($py, $f, $comm, $a) = (py, f, comm, a);
                        $body
                    })+
                }
                Ok(true)
            }

            /// The full arm: any call, its group resolved and its profiler range open.
            pub(crate) fn full(self, py: Python<'_>, c: &Full<'_>, a: &Args<'_, '_>) -> PyResult<Option<Py<PyWork>>> {
                match self {
                    $(Kind::$kind => {
                        let ($fpy, $c, $fa) = (py, c, a);
                        $full
                    })+
                }
            }
        }

        $(
            $(#[doc = $doc])*
            #[pyfunction]
            #[pyo3(signature = ($($req,)+ $($($opt = Given(None),)+)?))]
            fn $name<'py>(py: Python<'py>, $($req: Bound<'py, PyAny>,)+ $($($opt: Given<'py>,)+)?) -> PyResult<Py<PyAny>> {
                let given = [$(Some($req.as_borrowed()),)+ $($($opt.0.as_ref().map(Bound::as_borrowed),)+)?];
                let mut a: Args<'_, '_> = [None; MAX_PARAMS];
                a[..given.len()].copy_from_slice(&given);
                Kind::$kind.call(py, &a)
            }
        )+

        /// The bindings of every collective, made for module `m`.
        pub(crate) fn bindings<'py>(m: &Bound<'py, PyModule>) -> PyResult<Vec<(Kind, Bound<'py, PyCFunction>)>> {
            Ok(vec![$((Kind::$kind, wrap_pyfunction!($name, m)?)),+])
        }
    };
}

/// No format given (`None` given is none).
fn no_format(lp: &Option<Borrowed<'_, '_, PyAny>>) -> bool {
    !lp.is_some_and(|l| !l.is_none())
}

collectives! {
    /// In place: every member's ``tensor`` becomes the reduction of all members' ``tensor``.
    ///
    /// Collective over ``group``. The result is bit-identical on every member (elements are reduced
    /// in group-rank order, in float32 for 16- and 8-bit floats, float64 for float64).
    ///
    /// Args:
    ///     tensor: a contiguous CPU tensor, the same element count and dtype on every member.
    ///     op: ``"sum"``, ``"avg"`` (floating dtypes: the sum divided by the group size), ``"max"``,
    ///         ``"min"``, or their codes 0, 1, 2, 3.
    ///     group: the members (``None``: every rank symm was initialised for).
    ///     low_precision_dtype: the format data travels in (``torch.float16``, ``torch.bfloat16``,
    ///         ``torch.float8_e4m3fn``, ``torch.float8_e5m2``, or their names), for float32/64,
    ///         float16 and bfloat16 tensors; accumulation stays in full precision. ``"none"``: full
    ///         precision whatever the default. ``None``: the default from
    ///         ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`` (unset, or a tensor of another dtype: full
    ///         precision).
    ///     async_op: True: check the arguments, enqueue the operation on the communicator's stream
    ///         and return a ``symm.Work`` at once (``wait``, ``is_completed``, ``get_future``); the
    ///         tensor belongs to the operation until it has completed (the work holds it; do not
    ///         use it before ``wait()``). False (default): blocking, returns None.
    ///
    /// Raises:
    ///     InvalidArgument: a bad tensor, op or format (on this rank, at the call; the others get
    ///         PeerRejected, from ``wait()`` when asynchronous). With ``SYMM_VALIDATE=1``: a tensor
    ///         overlapping one of an asynchronous operation still in flight.
    ///     Mismatch: the members disagree on count, dtype, op or format (on every member).
    ///     GroupError: this rank is not a member. Timeout: a member did not come in time.
    ///     Asynchronously, what the collective itself finds (Mismatch, Timeout, PeerLost) is
    ///     raised by the work's ``wait()``, with the blocking form's class and message.
    AllReduce => fn shmem_allreduce(tensor; op = "'sum'", group = "None", low_precision_dtype = "None", async_op = "False")
        stub "tensor: torch.Tensor, op: ReduceOp = 'sum', group: GroupLike = None, \
              low_precision_dtype: LowPrecision = None, async_op: bool = False",
        profiled tensor,
        fast |py, f, comm, a| {
            let [Some(tensor), op, g, lp, ..] = a else { return Ok(false) };
            let Some(op) = reduce_op(op.as_deref()).filter(|_| no_format(lp)) else { return Ok(false) };
            let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
            let Some(t) = f.tensors.tensor(tensor) else { return Ok(false) };
            comm.run_allreduce(py, g.get(), t, op, Transport::Default)?;
        }
        full |py, c, a| {
            let (t, op, lp) = (c.tensor(a[0], "tensor")?, c.op(a[1])?, c.low_precision(a[3])?);
            c.run(&["tensor"], || c.comm().run_allreduce(py, c.group(), t, op, lp), |comm, s, g| {
                // SAFETY: `t` is the memory of the call's tensor, which the work holds, and which
                // nothing else uses, until the operation has completed (the caller's contract).
                unsafe { comm.allreduce_on(s, g, t.writer(), op, &async_options(lp)) }.map(|w| w.event())
            })
        }

    /// ``input_tensor`` holds ``group_size`` equal parts (in flat element order); group rank r's
    /// ``output_tensor`` becomes the reduction of part r over all members.
    ///
    /// Collective over ``group``. ``input_tensor.numel()`` must be ``group_size *
    /// output_tensor.numel()`` and both have the same dtype. ``output_tensor`` may be this rank's
    /// own part of ``input_tensor`` (in place) or disjoint from it. ``op``,
    /// ``low_precision_dtype`` and ``async_op`` as in ``shmem_allreduce``.
    ReduceScatter =>
        fn shmem_reduce_scatter(
            output_tensor, input_tensor; op = "'sum'", group = "None", low_precision_dtype = "None", async_op = "False"
        )
        stub "output_tensor: torch.Tensor, input_tensor: torch.Tensor, op: ReduceOp = 'sum', group: GroupLike = None, \
              low_precision_dtype: LowPrecision = None, async_op: bool = False",
        profiled input_tensor,
        fast |py, f, comm, a| {
            let [Some(output), Some(input), op, g, lp, _] = a else { return Ok(false) };
            let Some(op) = reduce_op(op.as_deref()).filter(|_| no_format(lp)) else { return Ok(false) };
            let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
            let (Some(o), Some(i)) = (f.tensors.tensor(output), f.tensors.tensor(input)) else { return Ok(false) };
            comm.run_reduce_scatter(py, g.get(), o, i, op, Transport::Default)?;
        }
        full |py, c, a| {
            let (o, i) = (c.tensor(a[0], "output_tensor")?, c.tensor(a[1], "input_tensor")?);
            let (op, lp) = (c.op(a[2])?, c.low_precision(a[4])?);
            c.run(&["output_tensor"], || c.comm().run_reduce_scatter(py, c.group(), o, i, op, lp), |comm, s, g| {
                // SAFETY: as in `shmem_allreduce`, for both tensors (the core checks that they are
                // identical parts or disjoint).
                unsafe { comm.reduce_scatter_on(s, g, o.writer(), i.reader(), op, &async_options(lp)) }
                    .map(|w| w.event())
            })
        }

    /// Every member's ``output_tensor`` becomes the concatenation, in group-rank order, of the
    /// members' ``input_tensor``.
    ///
    /// Collective over ``group``. ``output_tensor.numel()`` must be ``group_size *
    /// input_tensor.numel()`` (the flat layout: with contiguous tensors, the concatenation along
    /// dim 0); same dtype. ``input_tensor`` may be this rank's own part of ``output_tensor``.
    /// ``async_op`` as in ``shmem_allreduce``.
    AllGather => fn shmem_allgather(output_tensor, input_tensor; group = "None", async_op = "False")
        stub "output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: GroupLike = None, async_op: bool = False",
        profiled input_tensor,
        fast |py, f, comm, a| {
            let [Some(output), Some(input), g, ..] = a else { return Ok(false) };
            let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
            let (Some(o), Some(i)) = (f.tensors.tensor(output), f.tensors.tensor(input)) else { return Ok(false) };
            comm.run_allgather(py, g.get(), o, i)?;
        }
        full |py, c, a| {
            let (o, i) = (c.tensor(a[0], "output_tensor")?, c.tensor(a[1], "input_tensor")?);
            c.run(&["output_tensor"], || c.comm().run_allgather(py, c.group(), o, i), |comm, s, g| {
                // SAFETY: as in `shmem_reduce_scatter`.
                unsafe { comm.allgather_on(s, g, o.writer(), i.reader(), &async_options(Transport::Default)) }
                    .map(|w| w.event())
            })
        }

    /// Personalised exchange: ``send_tensor_list[i]`` goes to group rank i; what group rank i
    /// sends lands in ``receive_tensor``, packed in source-rank order.
    ///
    /// Collective over ``group``.
    ///
    /// Args:
    ///     send_tensor_list: one tensor per group rank (any sizes, ``receive_tensor``'s dtype).
    ///     receive_tensor: receives ``receive_list[i]`` elements from rank i at offset
    ///         ``sum(receive_list[:i])``; elements past ``sum(receive_list)`` are left untouched.
    ///         It must not overlap the send tensors.
    ///     receive_list: the element count received from each group rank: a sequence of ints or a
    ///         1-D integer tensor. Each must equal what that rank sends here (Mismatch, raised by
    ///         the ranks whose count disagrees, otherwise).
    ///     async_op: as in ``shmem_allreduce`` (every tensor belongs to the operation until it
    ///         has completed).
    AllToAll => fn shmem_alltoall(send_tensor_list, receive_tensor, receive_list; group = "None", async_op = "False")
        stub "send_tensor_list: Sequence[torch.Tensor], receive_tensor: torch.Tensor, \
              receive_list: Union[Sequence[IntLike], torch.Tensor], group: GroupLike = None, async_op: bool = False",
        profiled send_tensor_list,
        fast |py, f, comm, a| {
            let [Some(sends), Some(receive), Some(receive_list), g, ..] = a else { return Ok(false) };
            let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
            let n = g.get().size();
            let Some(r) = f.tensors.tensor(receive) else { return Ok(false) };
            let Some(sends) = plain_items(sends, n) else { return Ok(false) };
            let mut locals = Vec::with_capacity(n);
            for i in 0..n {
                let Some(t) = sends.get_item(i).ok().and_then(|s| f.tensors.tensor(&s)) else { return Ok(false) };
                locals.push(t);
            }
            let Some(recv_counts) = counts(f, receive_list, n) else { return Ok(false) };
            comm.run_alltoall(py, g.get(), &locals, r, &recv_counts)?;
        }
        full |py, c, a| {
            let sends = c.tensors(a[0], "send_tensor_list")?;
            let (r, counts) = (c.tensor(a[1], "receive_tensor")?, c.counts(a[2], "receive_list")?);
            c.run(&["receive_tensor"], || c.comm().run_alltoall(py, c.group(), &sends, r, &counts), |comm, s, g| {
                // SAFETY: as in `shmem_allreduce`, for every tensor (the core checks that the
                // receive tensor overlaps no send tensor and that the counts fit it).
                let refs: Vec<LocalRef<'_>> = sends.iter().map(|t| unsafe { t.reader() }).collect();
                // SAFETY: as above.
                let out = unsafe { r.writer() };
                // SAFETY: as above.
                unsafe { comm.alltoall_on(s, g, &refs, out, &counts, &async_options(Transport::Default)) }
                    .map(|w| w.event())
            })
        }

    /// Every member's ``tensor`` becomes group rank ``src_rank``'s ``tensor``. Collective over
    /// ``group``; ``src_rank`` is a rank of ``group`` (global when ``group`` is None). ``async_op``
    /// as in ``shmem_allreduce``.
    Broadcast => fn shmem_broadcast(tensor, src_rank; group = "None", async_op = "False")
        stub "tensor: torch.Tensor, src_rank: IntLike, group: GroupLike = None, async_op: bool = False",
        profiled tensor,
        fast |py, f, comm, a| {
            let Some((g, t, root)) = tensor_rank(f, a) else { return Ok(false) };
            comm.run_broadcast(py, g.get(), t, root)?;
        }
        full |py, c, a| {
            let (t, root) = (c.tensor(a[0], "tensor")?, c.rank(a[1], "src_rank")?);
            c.run(&["tensor"], || c.comm().run_broadcast(py, c.group(), t, root), |comm, s, g| {
                // SAFETY: as in `shmem_allreduce`.
                unsafe { comm.broadcast_on(s, g, t.writer(), root, &async_options(Transport::Default)) }
                    .map(|w| w.event())
            })
        }

    /// Sends ``tensor`` to ``dst_rank`` (a rank of ``group``), which receives it with
    /// ``shmem_recv`` of the same element count and dtype. Messages between two ranks arrive in
    /// the order they were sent.
    ///
    /// Returns once the data is out of ``tensor``: small messages (up to about 256 KiB) are
    /// buffered at the receiver, larger ones stream as the receiver takes them, so two ranks
    /// that both send a large message to each other before receiving wait for each other (order
    /// them: one sends first). The first call in a group allocates its workspace collectively
    /// (see the README). ``async_op`` as in ``shmem_allreduce`` (the send runs on the stream,
    /// in order with this rank's other asynchronous operations).
    Send => fn shmem_send(tensor, dst_rank; group = "None", async_op = "False")
        stub "tensor: torch.Tensor, dst_rank: IntLike, group: GroupLike = None, async_op: bool = False",
        profiled tensor,
        fast |py, f, comm, a| {
            let Some((g, t, dst)) = tensor_rank(f, a) else { return Ok(false) };
            comm.run_send(py, g.get(), t, dst)?;
        }
        full |py, c, a| {
            let (t, dst) = (c.tensor(a[0], "tensor")?, c.rank(a[1], "dst_rank")?);
            c.run(&["tensor"], || c.comm().run_send(py, c.group(), t, dst), |comm, s, g| {
                // SAFETY: as in `shmem_allreduce` (the tensor is only read).
                unsafe { comm.send_on(s, g, t.reader(), dst, &async_options(Transport::Default)) }.map(|w| w.event())
            })
        }

    /// Receives the next message from ``src_rank`` (a rank of ``group``) into ``tensor``.
    ///
    /// The message must have ``tensor``'s element count and dtype; otherwise Mismatch names both
    /// (the message is consumed, and the pair stays usable). ``async_op`` as in ``shmem_allreduce``.
    Recv => fn shmem_recv(tensor, src_rank; group = "None", async_op = "False")
        stub "tensor: torch.Tensor, src_rank: IntLike, group: GroupLike = None, async_op: bool = False",
        profiled tensor,
        fast |py, f, comm, a| {
            let Some((g, t, src)) = tensor_rank(f, a) else { return Ok(false) };
            comm.run_recv(py, g.get(), t, src)?;
        }
        full |py, c, a| {
            let (t, src) = (c.tensor(a[0], "tensor")?, c.rank(a[1], "src_rank")?);
            c.run(&["tensor"], || c.comm().run_recv(py, c.group(), t, src), |comm, s, g| {
                // SAFETY: as in `shmem_allreduce`.
                unsafe { comm.recv_on(s, g, t.writer(), src, &async_options(Transport::Default)) }.map(|w| w.event())
            })
        }

    /// Sends ``send_tensor`` to ``dst_rank`` and receives the next message from ``src_rank`` into
    /// ``recv_tensor``, both at once (ranks of ``group``; global when ``group`` is None).
    ///
    /// The two directions move together, so a ring of ranks that each send to the next and receive
    /// from the previous needs no ordering, at any size. The messages pair with ``shmem_send`` and
    /// ``shmem_recv`` as well: what ``dst_rank`` receives with either, and what ``src_rank`` sent with
    /// either. ``recv_tensor`` must not overlap ``send_tensor``; the incoming message must have
    /// ``recv_tensor``'s element count and dtype (otherwise Mismatch names both, after the send is
    /// complete; the message is consumed and the pair stays usable). ``dst_rank`` and ``src_rank``
    /// may be equal, and may be this rank. ``async_op`` as in ``shmem_allreduce``.
    SendRecv => fn shmem_sendrecv(send_tensor, dst_rank, recv_tensor, src_rank; group = "None", async_op = "False")
        stub "send_tensor: torch.Tensor, dst_rank: IntLike, recv_tensor: torch.Tensor, src_rank: IntLike, \
              group: GroupLike = None, async_op: bool = False",
        profiled send_tensor,
        fast |py, f, comm, a| {
            let [Some(send), Some(dst), Some(recv), Some(src), g, _] = a else { return Ok(false) };
            let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
            let (Some(dst), Some(src)) = (group_rank(dst, g.get()), group_rank(src, g.get())) else {
                return Ok(false);
            };
            let (Some(s), Some(r)) = (f.tensors.tensor(send), f.tensors.tensor(recv)) else { return Ok(false) };
            comm.run_sendrecv(py, g.get(), s, dst, r, src)?;
        }
        full |py, c, a| {
            let (s, dst) = (c.tensor(a[0], "send_tensor")?, c.rank(a[1], "dst_rank")?);
            let (r, src) = (c.tensor(a[2], "recv_tensor")?, c.rank(a[3], "src_rank")?);
            c.run(&["recv_tensor"], || c.comm().run_sendrecv(py, c.group(), s, dst, r, src), |comm, st, g| {
                // SAFETY: as in `shmem_allreduce`, for both tensors (the core refuses overlapping
                // ones).
                unsafe { comm.sendrecv_on(st, g, s.reader(), dst, r.writer(), src, &async_options(Transport::Default)) }
                    .map(|w| w.event())
            })
        }
}

/// The group, tensor and rank of a call whose parameters are `(tensor, <rank>, group=None)`.
fn tensor_rank<'a, 'py>(
    f: &'a FastSpec,
    a: &Args<'_, 'py>,
) -> Option<(crate::fast::FastGroup<'a, 'py>, crate::comm::Local, usize)> {
    let [Some(tensor), Some(rank), g, ..] = a else { return None };
    let g = f.member_group(g.as_deref())?;
    let rank = group_rank(rank, g.get())?;
    let t = f.tensors.tensor(tensor)?;
    Some((g, t, rank))
}

/// The items of `list` when it is a plain `list` or `tuple` (exact types) of `n` items.
fn plain_items<'py>(list: &Bound<'py, PyAny>, n: usize) -> Option<Bound<'py, PySequence>> {
    // Checked first: casting anything else runs `isinstance(list, collections.abc.Sequence)`, which
    // cost a tensor of counts more than the collective (docs/performance.md, "Python API").
    if !(list.is_exact_instance_of::<PyList>() || list.is_exact_instance_of::<PyTuple>()) {
        return None;
    }
    let seq = list.cast::<PySequence>().ok()?;
    (seq.len().ok()? == n).then(|| seq.clone())
}

/// An alltoall's `receive_list` for a group of `n`, in every form the full arm reads
/// ([`Full::counts`]): a plain `list` or `tuple` of `n` items, each an `int` or a one-element
/// integer tensor, or one integer tensor of `n` counts ([`crate::tensor::Reader::counts`]).
/// `None` for anything else, including a negative count (the full arm reports it).
fn counts(f: &FastSpec, list: &Bound<'_, PyAny>, n: usize) -> Option<Vec<usize>> {
    let Some(items) = plain_items(list, n) else { return f.tensors.counts(list, n) };
    (0..n)
        .map(|i| {
            let c = items.get_item(i).ok()?;
            if c.is_exact_instance_of::<PyInt>() {
                return usize::try_from(c.extract::<u64>().ok()?).ok();
            }
            f.tensors.tensor(&c).filter(|t| t.len == 1).and_then(|t| int_element(t, 0))
        })
        .collect()
}

/// A rank of group `g` given as a plain `int` (not a bool, a tensor, ...); `None` for anything
/// else, including a rank outside the group (the full arm reports it).
fn group_rank(rank: &Bound<'_, PyAny>, g: &Group) -> Option<usize> {
    if !rank.is_exact_instance_of::<PyInt>() {
        return None;
    }
    usize::try_from(rank.extract::<i64>().ok()?).ok().filter(|&r| r < g.size())
}

/// A reduction given by name (as spelled by [`ReduceOp::name`], or any spelling the core
/// parses) or by code, `Sum` when not given; `None` for anything else.
fn reduce_op(op: Option<&Bound<'_, PyAny>>) -> Option<ReduceOp> {
    let Some(op) = op else { return Some(ReduceOp::Sum) };
    // The names as interned strings and the codes as CPython's cached small ints: a literal
    // in the caller's code is one of them, found by identity (reading a str's text costs more).
    static KNOWN: PyOnceLock<Vec<(Py<PyAny>, ReduceOp)>> = PyOnceLock::new();
    let known = KNOWN.get_or_init(op.py(), || {
        let py = op.py();
        let names = ReduceOp::ALL.iter().map(|&o| (PyString::intern(py, o.name()).into_any().unbind(), o));
        let codes = ReduceOp::ALL.iter().map(|&o| (PyInt::new(py, o.code()).into_any().unbind(), o));
        names.chain(codes).collect()
    });
    if let Some((_, o)) = known.iter().find(|(k, _)| k.as_ptr() == op.as_ptr()) {
        return Some(*o);
    }
    if let Ok(s) = op.cast::<PyString>() {
        let s = s.to_str().ok()?;
        return ReduceOp::ALL.iter().copied().find(|o| o.name() == s).or_else(|| s.parse().ok());
    }
    let code = op.cast::<PyInt>().ok()?.extract::<i64>().ok()?;
    ReduceOp::from_code(code).ok()
}

/// The table as Python sees it (`_symm.COLLECTIVES`): per collective, `(function, operation,
/// parameters, defaults of the trailing parameters, stub parameter list)`, for the test that
/// keeps the stub files in step with the table.
pub(crate) fn table(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows =
        Kind::ALL.iter().map(|k| (k.function(), k.op().name(), k.params().to_vec(), k.defaults().to_vec(), k.stub()));
    PyTuple::new(py, rows)
}
