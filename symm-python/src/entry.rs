//! The entry point of the public collectives: a plain `METH_FASTCALL | METH_KEYWORDS` C function
//! per collective of the table ([`crate::ops`]) that binds the arguments in place (borrowed,
//! keywords matched by identity with the interned parameter names), without PyO3's argument
//! extraction and trampoline, and runs the fast path. Every call it does not run goes, as
//! given, to the `#[pyfunction]` PyO3 generated (the *binding*: Python's TypeErrors for calls
//! that do not bind, then [`Kind::call`], the native full path), whose name and documentation
//! the entry point shares, with the signature of the table's row.

use std::cell::RefCell;

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyDict, PyList, PyString, PyTuple, PyType};
use symm_core::{Event, Group, GroupError, ReduceOp, Stream, Transport};
use symm_registry::Comm;

use crate::coll::{group_rank_arg, low_precision_arg, op_arg};
use crate::comm::{repr, Desc, Local, PyCommunicator, PyGroup};
use crate::errors::invalid;
use crate::fast::FAST;
use crate::ops::{bindings, Kind};
use crate::work::{self, Held, PyWork};

/// The number of collectives in the table.
const KINDS: usize = Kind::ALL.len();

/// The most parameters of a [`Kind`].
pub(crate) const MAX_PARAMS: usize = 6;

/// A call's arguments by parameter position, borrowed from the caller (`None`: not given, the
/// default applies).
pub(crate) type Args<'a, 'py> = [Option<Borrowed<'a, 'py, PyAny>>; MAX_PARAMS];

impl Kind {
    /// The parameter names, interned: a keyword is matched by identity first (the names a
    /// call site writes are interned).
    fn interned(self, py: Python<'_>) -> &[Py<PyString>] {
        static NAMES: [PyOnceLock<Vec<Py<PyString>>>; KINDS] = [const { PyOnceLock::new() }; KINDS];
        NAMES[self as usize]
            .get_or_init(py, || self.params().iter().map(|n| PyString::intern(py, n).unbind()).collect())
    }

    /// The position of the parameter named `name`, a keyword of a call.
    fn param(self, name: Borrowed<'_, '_, PyAny>) -> Option<usize> {
        let names = self.interned(name.py());
        if let Some(i) = names.iter().position(|n| n.as_ptr() == name.as_ptr()) {
            return Some(i);
        }
        let name = name.cast::<PyString>().ok()?;
        let name = name.to_str().ok()?;
        self.params().iter().position(|n| *n == name)
    }

    /// The function PyO3 generated for the public function (its `#[pyfunction]` in the
    /// table): it binds the arguments as the entry point does, and raises Python's TypeError
    /// for calls that do not bind; its definition gives the entry point its name, signature
    /// and documentation.
    fn binding(self) -> &'static PyOnceLock<Py<PyCFunction>> {
        static BINDING: [PyOnceLock<Py<PyCFunction>>; KINDS] = [const { PyOnceLock::new() }; KINDS];
        &BINDING[self as usize]
    }

    /// Binds the arguments of a vectorcall to the parameters by position and by name
    /// (borrowed) into `a` (all `None` on entry); `None` when they do not bind plainly (too
    /// many, a name that is not a parameter or names one already given, a required one
    /// missing), for which the binding raises the TypeError.
    ///
    /// # Safety
    ///
    /// The arguments of a vectorcall as CPython passes them, with the GIL held: `args` holds
    /// `PyVectorcall_NARGS(nargsf)` positional arguments followed by one value per name in
    /// `kwnames` (a tuple of str, or NULL), all alive for `'a`.
    unsafe fn bind<'a, 'py>(
        self,
        py: Python<'py>,
        args: *const *mut ffi::PyObject,
        nargsf: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
        a: &mut Args<'a, 'py>,
    ) -> Option<()> {
        let n = self.params().len();
        // SAFETY: `nargsf` is the vectorcall's count (with the offset flag, which NARGS masks).
        let nargs = usize::try_from(unsafe { ffi::PyVectorcall_NARGS(nargsf as usize) }).ok().filter(|&k| k <= n)?;
        for (i, slot) in a.iter_mut().enumerate().take(nargs) {
            // SAFETY: `args[i]` is a live positional argument (the caller's contract).
            *slot = Some(unsafe { Borrowed::from_ptr(py, *args.add(i)) });
        }
        if !kwnames.is_null() {
            // SAFETY: `kwnames` is a live tuple of str (the caller's contract).
            let names = unsafe { Borrowed::from_ptr(py, kwnames).cast_unchecked::<PyTuple>() };
            for (j, name) in names.iter_borrowed().enumerate() {
                let i = self.param(name)?;
                if a[i].is_some() {
                    return None;
                }
                // SAFETY: the value of keyword `j` follows the positional arguments.
                a[i] = Some(unsafe { Borrowed::from_ptr(py, *args.add(nargs + j)) });
            }
        }
        a[..self.required()].iter().all(Option::is_some).then_some(())
    }

    /// The public function's entry point (`METH_FASTCALL | METH_KEYWORDS`): runs the common
    /// case ([`Kind::try_fast`]) with the arguments bound in place ([`Kind::bind`]: no
    /// reference taken, no object created) and returns None; hands every other call, as
    /// given, to the binding (the `#[pyfunction]`), which raises Python's TypeError for a
    /// call that does not bind, or runs [`Kind::call`] (the full path). A panic becomes a
    /// PanicException, as in PyO3's functions. It runs without PyO3's per-call bookkeeping
    /// (the thread's attach count): a `Py<T>` dropped here would be released by PyO3 later,
    /// not at once; the common case drops none.
    ///
    /// # Safety
    ///
    /// Called by CPython as a vectorcall (see [`Kind::bind`]), with the GIL held.
    unsafe fn entry(
        self,
        args: *const *mut ffi::PyObject,
        nargsf: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject {
        // SAFETY: CPython calls a function with the GIL held.
        let py = unsafe { Python::assume_attached() };
        // Whether the call ran, and its error apart: a `PyResult<bool>` passed through memory
        // is written a byte at a time and moved a word at a time (a store-forwarding stall).
        let mut failed: Option<PyErr> = None;
        let fast = std::panic::AssertUnwindSafe(|| -> bool {
            let Some(fast) = FAST.get(py) else { return false };
            // Bound in place: an `Args` returned through memory is moved with wider loads than
            // the stores that wrote it (another stall).
            let mut a: Args<'_, '_> = [None; MAX_PARAMS];
            // SAFETY: the vectorcall's arguments (this function's contract).
            if unsafe { self.bind(py, args, nargsf, kwnames, &mut a) }.is_none() {
                return false;
            }
            match self.try_fast(py, fast, &a) {
                Ok(ran) => ran,
                Err(e) => {
                    failed = Some(e);
                    true
                }
            }
        });
        let ran = std::panic::catch_unwind(fast).unwrap_or_else(|payload| {
            let msg = match (payload.downcast_ref::<String>(), payload.downcast_ref::<&str>()) {
                (Some(s), _) => s.clone(),
                (None, Some(s)) => (*s).to_owned(),
                (None, None) => "panic from Rust code".to_owned(),
            };
            failed = Some(PanicException::new_err((msg,)));
            true
        });
        if let Some(e) = failed {
            e.restore(py);
            return std::ptr::null_mut();
        }
        if ran {
            // SAFETY: a new reference to None, returned to the caller.
            return unsafe { ffi::Py_NewRef(ffi::Py_None()) };
        }
        match self.binding().get(py) {
            // SAFETY: the call's own arguments, passed on unchanged (the offset flag included:
            // the caller allowed its use for this call); the result is the binding's, a new
            // reference or NULL with an exception set.
            Some(binding) => unsafe { ffi::PyObject_Vectorcall(binding.as_ptr(), args, nargsf as usize, kwnames) },
            None => {
                PyRuntimeError::new_err(format!("symm: {} is not registered", self.function())).restore(py);
                std::ptr::null_mut()
            }
        }
    }

    /// The binding's body, for the calls the entry point hands over: a call that must record
    /// its backward goes to `symm.autograd` ([`Kind::records_grad`], [`Kind::record`]); any
    /// other gets symm's state (started on first use), the group resolved by the platform, the
    /// profiler range opened while the framework's profiler records, then the full arm of the
    /// table ([`Kind::full`]).
    pub(crate) fn call(self, py: Python<'_>, a: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
        if self.records_grad(py, a) {
            return self.record(py, a);
        }
        static API: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let api = API.get_or_try_init(py, || py.import("symm._api").map(Bound::unbind))?.bind(py);
        let param = |name| self.params().iter().position(|p| *p == name).and_then(|i| a[i]).map(|v| v.to_owned());
        // The runtime of the device the call's tensors are on (the CPU's, or a device's).
        let st = api.call_method1(intern!(py, "_current_for"), (param(self.profiled()),))?;
        let group = param("group").unwrap_or_else(|| py.None().into_bound(py));
        let g = api.call_method1(intern!(py, "_native_group"), (&st, &group))?.cast_into::<PyGroup>()?;
        let comm = st.getattr(intern!(py, "comm"))?.cast_into::<PyCommunicator>()?;
        let spans = g.get().group();
        if spans.my_rank().is_some() && matches!(spans.member(), Err(GroupError::SpansHosts { .. })) {
            // Symmetric memory is shared inside a node only: a member of a group on several
            // hosts runs the call hierarchically, symm inside each node and the platform's
            // process groups between nodes.
            return self.hierarchical(py, a);
        }
        comm.get().member_of(py, g.get().group())?;
        // A device communicator's calls run on the caller's current stream.
        let stream = if comm.get().device_type() == "cpu" {
            None
        } else {
            let raw = api.call_method1(intern!(py, "_device_stream"), (&st,))?.extract::<usize>()?;
            comm.get().caller_stream(py, Some(raw))?
        };
        let async_op = match param("async_op") {
            Some(v) => v.is_truthy()?,
            None => false,
        };
        // Completed asynchronous work releases its tensors (and lets later calls take the fast
        // arm again).
        let asyncs = comm.get().asyncs();
        if asyncs.any() {
            asyncs.sweep(comm.get().comm());
        }
        let range =
            api.call_method1(intern!(py, "_profile_range"), (&st, self.op().name(), param(self.profiled()), &group))?;
        let open = !range.is_none();
        if open {
            range.call_method0(intern!(py, "__enter__"))?;
        }
        let full = Full { kind: self, api, st, comm, group: g, async_op, stream, held: RefCell::new(Vec::new()) };
        let r = self.full(py, &full, a);
        if open {
            range.call_method1(intern!(py, "__exit__"), (py.None(), py.None(), py.None()))?;
        }
        Ok(r?.map_or_else(|| py.None(), Py::into_any))
    }
}

/// What the full arm asks of torch, once torch is loaded.
struct Torch {
    /// `torch.is_grad_enabled`.
    is_grad_enabled: Py<PyAny>,
    /// `torch.Tensor`.
    tensor: Py<PyType>,
}

impl Torch {
    /// torch's, once the process has imported torch (no tensor of torch exists before).
    fn get(py: Python<'_>) -> Option<&Torch> {
        static TORCH: PyOnceLock<Torch> = PyOnceLock::new();
        if let Some(t) = TORCH.get(py) {
            return Some(t);
        }
        let modules = py.import(intern!(py, "sys")).and_then(|s| s.getattr(intern!(py, "modules"))).ok()?;
        let torch = modules.get_item(intern!(py, "torch")).ok()?;
        let is_grad_enabled = torch.getattr(intern!(py, "is_grad_enabled")).ok()?.unbind();
        let tensor = torch.getattr(intern!(py, "Tensor")).ok()?.cast_into::<PyType>().ok()?.unbind();
        Some(TORCH.get_or_init(py, || Torch { is_grad_enabled, tensor }))
    }

    /// Whether `value` is a torch tensor that requires grad (a tensor whose attribute fails
    /// does not: the full arm reports it).
    fn requires_grad(&self, value: Borrowed<'_, '_, PyAny>) -> bool {
        let py = value.py();
        value.is_instance(self.tensor.bind(py)).unwrap_or(false)
            && value.getattr(intern!(py, "requires_grad")).and_then(|r| r.is_truthy()).unwrap_or(false)
    }
}

impl Kind {
    /// Whether the call must record its backward: grad mode is on and one of its tensors (an
    /// entry of `send_tensor_list` included) requires grad. Such calls go to `symm.autograd`
    /// ([`Kind::record`]); the fast arm leaves them to the full arm ([`crate::tensor::Grad`]).
    fn records_grad(self, py: Python<'_>, a: &Args<'_, '_>) -> bool {
        let Some(torch) = Torch::get(py) else { return false };
        if !torch.is_grad_enabled.bind(py).call0().and_then(|on| on.is_truthy()).unwrap_or(false) {
            return false;
        }
        let tensors = self.params().iter().zip(a).filter(|(name, _)| name.contains("tensor"));
        tensors.filter_map(|(name, v)| v.map(|v| (name, v))).any(|(name, v)| {
            if !name.ends_with("_list") {
                return torch.requires_grad(v);
            }
            let items = v.cast::<PyList>().map(|l| l.iter().collect::<Vec<_>>());
            let items = items.or_else(|_| v.cast::<PyTuple>().map(|t| t.iter().collect()));
            items.is_ok_and(|items| items.iter().any(|t| torch.requires_grad(t.as_borrowed())))
        })
    }

    /// Runs the call through `symm.hier._call(function, arguments)`: a group whose members lie
    /// on several hosts.
    fn hierarchical(self, py: Python<'_>, a: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
        static HIER: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let hier = HIER.get_or_try_init(py, || py.import("symm.hier").map(Bound::unbind))?.bind(py);
        hier.call_method1(intern!(py, "_call"), (self.function(), self.given(py, a)?)).map(Bound::unbind)
    }

    /// The arguments given, by parameter name.
    fn given<'py>(self, py: Python<'py>, a: &Args<'_, 'py>) -> PyResult<Bound<'py, PyDict>> {
        let given = PyDict::new(py);
        for (name, v) in self.params().iter().zip(a) {
            if let Some(v) = v {
                given.set_item(name, v)?;
            }
        }
        Ok(given)
    }

    /// Runs the call through `symm.autograd._record(function, arguments)`: an autograd
    /// Function per collective whose forward makes this call again (grad mode is off there)
    /// and marks the tensor it writes as modified in place, and whose backward runs the dual
    /// collective.
    fn record(self, py: Python<'_>, a: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
        static AUTOGRAD: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
        let autograd = AUTOGRAD.get_or_try_init(py, || py.import("symm.autograd").map(Bound::unbind))?.bind(py);
        autograd.call_method1(intern!(py, "_record"), (self.function(), self.given(py, a)?)).map(Bound::unbind)
    }
}

/// What a full arm converts its arguments with: the platform's helpers in `symm._api`
/// (describing tensors, reading one-element tensors as numbers, dtype names), then the
/// binding's own checks of what the core cannot see (Python types, freed tensors, storage).
/// An argument refused here rejects the call's round ([`PyCommunicator::reject_round`]), so
/// that the peers waiting in it fail at once; every other check is the core's.
pub(crate) struct Full<'py> {
    kind: Kind,
    api: &'py Bound<'py, PyModule>,
    st: Bound<'py, PyAny>,
    comm: Bound<'py, PyCommunicator>,
    group: Bound<'py, PyGroup>,
    /// `async_op=True`: the call enqueues the operation and returns its work.
    async_op: bool,
    /// A device communicator's call: the caller's stream it runs on.
    stream: Option<Stream>,
    /// The tensors converted so far, which an asynchronous call holds until it completes.
    held: RefCell<Vec<Held>>,
}

impl<'py> Full<'py> {
    pub(crate) fn comm(&self) -> &PyCommunicator {
        self.comm.get()
    }

    pub(crate) fn group(&self) -> &Group {
        self.group.get().group()
    }

    /// `r`, having rejected the round when it is an error of a collective (point-to-point
    /// calls have no rounds).
    fn checked<T>(&self, r: PyResult<T>) -> PyResult<T> {
        let p2p = matches!(self.kind, Kind::Send | Kind::Recv | Kind::SendRecv);
        r.map_err(|e| if p2p { e } else { self.comm().reject_round(self.comm.py(), self.group(), self.kind.op(), e) })
    }

    fn helper(&self, name: &str, value: Option<Borrowed<'_, 'py, PyAny>>, arg: &str) -> PyResult<Bound<'py, PyAny>> {
        self.api.call_method1(name, (&self.st, value, arg))
    }

    /// Runs the call: `blocking` (after the group's stream work, with the GIL released), or
    /// with `async_op=True` `enqueue` (given the communicator, its stream and the group), whose
    /// work holds every tensor converted and completes its future with those of `outputs`.
    pub(crate) fn run(
        &self,
        outputs: &[&str],
        blocking: impl FnOnce() -> PyResult<()>,
        enqueue: impl FnOnce(&Comm, &Stream, &Group) -> symm_core::Result<Event>,
    ) -> PyResult<Option<Py<PyWork>>> {
        let (py, g) = (self.comm.py(), self.group());
        if let Some(s) = self.stream {
            let held = self.async_op.then(|| self.held.take());
            let op = self.kind.op().name();
            return PyCommunicator::run_on_stream(&self.comm, py, s, op, held, outputs, |c, s| enqueue(c, s, g));
        }
        if !self.async_op {
            let (asyncs, comm) = (self.comm().asyncs(), self.comm().comm());
            if asyncs.any() {
                // The core's host call would wait for them too, holding the GIL; what has
                // completed then releases its tensors (and lets later calls take the fast arm).
                work::settle(py, comm, g, self.kind.op().name())?;
                asyncs.sweep(comm);
            }
            return blocking().map(|()| None);
        }
        let held = self.held.take();
        self.comm().asyncs().start(&self.comm, self.kind.op().name(), held, outputs, |c, s| enqueue(c, s, g)).map(Some)
    }

    /// Checks `local` (argument `arg`, entry `entry`, given as `obj`) against the tensors in
    /// flight and, for an asynchronous call, keeps it to hold.
    fn hold(
        &self,
        obj: Option<Bound<'py, PyAny>>,
        arg: &'static str,
        entry: Option<usize>,
        local: Local,
    ) -> PyResult<Local> {
        let (py, comm) = (self.comm.py(), self.comm());
        comm.asyncs().check(py, comm.comm(), arg, entry, &local)?;
        if let Some(obj) = obj.filter(|_| self.async_op) {
            self.held.borrow_mut().push(Held { arg, entry, obj: obj.unbind(), local });
        }
        Ok(local)
    }

    /// A tensor argument (`symm._api._desc`: not freed, a tensor of the platform).
    pub(crate) fn tensor(&self, value: Option<Borrowed<'_, 'py, PyAny>>, arg: &'static str) -> PyResult<Local> {
        let py = self.comm.py();
        let local = self.helper("_desc", value, arg).and_then(|d| self.comm().local(py, &d.extract()?, arg));
        self.checked(local.and_then(|l| self.hold(value.map(|v| v.to_owned()), arg, None, l)))
    }

    /// A list of tensors (`symm._api._descs`).
    pub(crate) fn tensors(&self, value: Option<Borrowed<'_, 'py, PyAny>>, arg: &'static str) -> PyResult<Vec<Local>> {
        let py = self.comm.py();
        let descs = self.helper("_descs", value, arg).and_then(|d| d.extract::<Vec<Desc>>());
        let locals = descs.and_then(|d| {
            d.iter()
                .enumerate()
                .map(|(i, d)| {
                    let l = self.comm().local_at(py, d, arg, Some(i))?;
                    // `_descs` accepts only a list or a tuple: the value has the items described.
                    self.hold(value.and_then(|v| v.get_item(i).ok()), arg, Some(i), l)
                })
                .collect()
        });
        self.checked(locals)
    }

    /// A number argument as the platform reads it (a one-element tensor is its value).
    fn scalar(&self, value: Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let py = self.comm.py();
        self.st.getattr(intern!(py, "platform"))?.call_method1(intern!(py, "scalar"), (value,))
    }

    /// A reduction (`"sum"` when not given).
    pub(crate) fn op(&self, value: Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<ReduceOp> {
        if value.is_none() {
            return Ok(ReduceOp::Sum);
        }
        let (py, me) = (self.comm.py(), self.comm().rank_id());
        self.checked(self.scalar(value).and_then(|v| op_arg(py, me, &v)))
    }

    /// A low-precision format (a dtype or its name; `symm._api._low_precision`).
    pub(crate) fn low_precision(&self, value: Option<Borrowed<'_, 'py, PyAny>>) -> PyResult<Transport> {
        let py = self.comm.py();
        let name = self.helper("_low_precision", value, "low_precision_dtype");
        self.checked(name.and_then(|n| low_precision_arg(py, self.comm().rank_id(), Some(&n))))
    }

    /// A rank of the group.
    pub(crate) fn rank(&self, value: Option<Borrowed<'_, 'py, PyAny>>, arg: &'static str) -> PyResult<usize> {
        let (py, me) = (self.comm.py(), self.comm().rank_id());
        self.checked(self.scalar(value).and_then(|v| group_rank_arg(py, me, self.group(), arg, &v)))
    }

    /// Element counts, one per group rank (`symm._api._counts`: a sequence of ints or a 1-D
    /// integer tensor); the core checks how many there are and what they sum to.
    pub(crate) fn counts(&self, value: Option<Borrowed<'_, 'py, PyAny>>, arg: &'static str) -> PyResult<Vec<usize>> {
        let (py, me) = (self.comm.py(), self.comm().rank_id());
        let items = self.helper("_counts", value, arg).and_then(|c| c.extract::<Vec<Bound<'py, PyAny>>>());
        let counts = items.and_then(|items| {
            let count = |(i, c): (usize, &Bound<'py, PyAny>)| {
                let n = c.extract::<i64>().ok().and_then(|v| usize::try_from(v).ok());
                n.ok_or_else(|| {
                    let shown = format!("{} (entry {i})", repr(c));
                    invalid(py, me, arg, shown, "counts are integers >= 0 (elements received from each group rank)")
                })
            };
            items.iter().enumerate().map(count).collect()
        });
        self.checked(counts)
    }
}

/// An argument as given, `None` when omitted (so that an explicit `None` reaches the full path
/// as the caller wrote it).
#[derive(Debug)]
pub(crate) struct Given<'py>(pub(crate) Option<Bound<'py, PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(obj.to_owned())))
    }
}

/// The entry point of collective number `K` of the table (see [`Kind::entry`]).
///
/// # Safety
///
/// Called by CPython as a `METH_FASTCALL | METH_KEYWORDS` function, with the GIL held.
pub(crate) unsafe extern "C" fn entry<const K: usize>(
    _module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: this function's contract.
    unsafe { Kind::ALL[K].entry(args, nargsf, kwnames) }
}

/// Adds the public functions to the module `m`: each is its entry point (see [`Kind::entry`]),
/// under the name and documentation of its `#[pyfunction]`, which binds the calls the entry
/// point hands over, and the signature of its row ([`Kind::text_signature`]).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (kind, binding) in bindings(m)? {
        // SAFETY: a function PyO3 made is a `PyCFunctionObject`, whose definition is static
        // (PyO3 keeps it for the life of the process): its name and documentation (with the
        // text signature) are static strings, shared by the entry point's definition.
        let mut def = unsafe { *(*binding.as_ptr().cast::<ffi::PyCFunctionObject>()).m_ml };
        def.ml_meth = ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: Kind::ENTRIES[kind as usize] };
        def.ml_flags = ffi::METH_FASTCALL | ffi::METH_KEYWORDS;
        // CPython reads the signature from the documentation's first line: PyO3's own line
        // (from the binding's parameters, whose defaults it cannot show) is replaced.
        // SAFETY: `ml_doc` is a static NUL-terminated string (a definition PyO3 made).
        let doc = unsafe { std::ffi::CStr::from_ptr(def.ml_doc) }.to_string_lossy();
        let body = doc.split_once("\n--\n\n").map_or(&*doc, |(_, body)| body);
        let doc = format!("{}{}\n--\n\n{body}", kind.function(), kind.text_signature());
        let doc = std::ffi::CString::new(doc).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        def.ml_doc = Box::leak(doc.into_boxed_c_str()).as_ptr();
        // The definition must outlive the function object: one per module initialisation,
        // which happens once per process.
        let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(def));
        // SAFETY: `def` is static (above), `m` a live module and its name a live str; the
        // result is a new reference or NULL with an exception set.
        let function =
            unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyCFunction_NewEx(def, m.as_ptr(), m.name()?.as_ptr()))? };
        m.add(def_name(def)?, function)?;
        let _ = kind.binding().set(py, binding.unbind());
    }
    Ok(())
}

/// The name of a function definition.
fn def_name(def: &ffi::PyMethodDef) -> PyResult<&'static str> {
    // SAFETY: `ml_name` is a static NUL-terminated string (a definition PyO3 made).
    let name = unsafe { std::ffi::CStr::from_ptr(def.ml_name) };
    name.to_str().map_err(|e| PyRuntimeError::new_err(e.to_string()))
}
