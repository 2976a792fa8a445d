//! The fast path of the public collectives: `symm.shmem_allreduce` is this module's native
//! function, which runs the common case itself and hands every other call to the full path in
//! Python (`symm._api`).
//!
//! The full path checks the profiler, resolves the group, asks the platform adapter to describe
//! each tensor as a [`Desc`](crate::comm::Desc) tuple (dtype and device as strings), and the
//! communicator converts and checks that before running the core. For a tiny message that
//! argument handling costs many times the collective itself (a 2-rank allreduce of 8 bytes
//! takes about 0.4 us in Rust). The fast path does the same in one native call with the fewest
//! reads: the tensor's exact type is compared by identity with the types the platform handed
//! over once ([`FastSpec`]); its layout, device, dtype, contiguity, size and address are read
//! through torch's stable C shim ([`Shim`]: one attribute read, then C calls), or, where the
//! shim is missing or does not read the probe tensors right, by calling the C functions behind
//! the tensor type's descriptors ([`Attr`]: what `Tensor.data_ptr(t)` calls, without an
//! attribute lookup per call; an instance attribute shadowing one of those methods is not
//! consulted); the op is matched by name or code; the group by identity in the API's own cache
//! of native groups.
//!
//! **The common case**: the fast path enabled (by `symm.init`), no profiler recording, every
//! argument given as a value it recognises (`group` None or a group the API already resolved,
//! that this rank belongs to; no low-precision format; an op by name or code) and plain
//! contiguous CPU tensors of supported dtypes. Anything else goes to the full path **before
//! anything was done** (no round joined, nothing rejected, no error raised) with the arguments
//! as given, so every error keeps its class and message, a rejected round still lets the peers
//! fail at once instead of waiting, and profiler ranges are recorded. Errors of the collective
//! itself (Mismatch, Timeout, PeerRejected, ...) come from the core call both paths end in.
//!
//! The collective runs exactly as on the full path: the same core call, with the GIL released
//! (a collective waits for its peers; holding the GIL there would stall every other Python
//! thread for as long as the slowest peer takes; releasing and retaking it costs about 40 ns).
//!
//! The table of operations is [`Kind`]: its parameters, the Python function of its full path
//! (registered by `symm._api` with [`set_full_path`]) and how its common case runs. Another
//! collective gets a fast path by a variant there, its public function below, and the
//! registration of its full path.

use std::ffi::c_void;
use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyString, PyTuple, PyType};
use symm_core::{DType, Group, ReduceOp};

use crate::comm::{Local, PyCommunicator, PyGroup};

/// One attribute of the framework's tensors, read by calling the C function behind the
/// descriptor the tensor type has for it (looked up once): what `tensor.<name>` or
/// `tensor.<name>()` calls, without the per-call lookup in the type's and the instance's
/// dictionaries and the generic descriptor and call machinery around it.
#[derive(Debug)]
struct Attr {
    /// The descriptor: it keeps the C function's definition (`PyGetSetDef`, `PyMethodDef`)
    /// alive.
    descr: Py<PyAny>,
    call: Call,
}

/// How an [`Attr`] is read.
#[derive(Debug)]
enum Call {
    /// A property implemented in C (`getset_descriptor`): its getter and closure.
    Getter(ffi::getter, *mut c_void),
    /// A method implemented in C taking no argument (`METH_NOARGS`).
    NoArgs(ffi::PyCFunction),
    /// A method implemented in C taking `(args, kwargs)` (`METH_VARARGS | METH_KEYWORDS`),
    /// called with no argument.
    VarArgsKw(ffi::PyCFunctionWithKeywords, Py<PyTuple>),
}

// SAFETY: the raw pointer in `Call::Getter` is the closure of a getset definition, an opaque
// value that the getter receives back; it is never dereferenced here, and the definition it
// belongs to lives as long as the descriptor `Attr` holds. Everything else is `Send + Sync`.
unsafe impl Send for Call {}
// SAFETY: as for `Send`: the pointer is only passed back to the getter, with the GIL held.
unsafe impl Sync for Call {}

impl Attr {
    /// The descriptor of `name` on `ty`: a property (`method` false) or a method, implemented
    /// in C as CPython's own descriptors are (a getter; a method taking no argument, or
    /// `(args, kwargs)`); `None` otherwise (the platform's tensors then have no fast path).
    fn find(ty: &Bound<'_, PyType>, name: &str, method: bool) -> Option<Attr> {
        let py = ty.py();
        let descr = ty.getattr(name).ok()?;
        let raw = descr.as_ptr();
        // SAFETY: `raw` is a live object (held by `descr`); its type object, and for the two
        // descriptor types checked, the descriptor's fields are CPython's documented layouts
        // (`PyGetSetDescrObject`, `PyMethodDescrObject`), and the definitions they point to
        // live as long as the descriptor does. `addr_of_mut!` takes the type objects' address
        // without reading them.
        let call = unsafe {
            let ty_of = ffi::Py_TYPE(raw);
            if !method && ty_of == std::ptr::addr_of_mut!(ffi::PyGetSetDescr_Type) {
                let def = (*raw.cast::<ffi::PyGetSetDescrObject>()).d_getset;
                (*def).get.map(|get| Call::Getter(get, (*def).closure))
            } else if method && ty_of == std::ptr::addr_of_mut!(ffi::PyMethodDescr_Type) {
                let def = (*raw.cast::<ffi::PyMethodDescrObject>()).d_method;
                match (*def).ml_flags & !ffi::METH_COEXIST {
                    ffi::METH_NOARGS => Some(Call::NoArgs((*def).ml_meth.PyCFunction)),
                    f if f == ffi::METH_VARARGS | ffi::METH_KEYWORDS => {
                        Some(Call::VarArgsKw((*def).ml_meth.PyCFunctionWithKeywords, PyTuple::empty(py).unbind()))
                    }
                    _ => None,
                }
            } else {
                None
            }
        }?;
        Some(Attr { descr: descr.unbind(), call })
    }

    /// The attribute's value for `tensor`, an instance of (a subclass of) the type the
    /// descriptor was found on: the caller checks the exact type against the types whose
    /// lookup gave this descriptor.
    fn read<'py>(&self, tensor: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = tensor.py();
        let t = tensor.as_ptr();
        // SAFETY: each C function is called as CPython calls it for `tensor.<name>` /
        // `tensor.<name>()` (getset_get, method_vectorcall_NOARGS / _VARARGS_KEYWORDS): the
        // GIL is held, `t` is a live instance of a type that has this descriptor (the
        // descriptor's own type check is what the caller's exact-type check guarantees), the
        // getter gets its definition's closure, a NOARGS method a NULL argument, a VARARGS one
        // the empty tuple and no keywords. Each returns a new reference or NULL with an
        // exception set, which `from_owned_ptr_or_err` takes over.
        unsafe {
            let value = match &self.call {
                Call::Getter(get, closure) => get(t, *closure),
                Call::NoArgs(meth) => meth(t, std::ptr::null_mut()),
                Call::VarArgsKw(meth, empty) => meth(t, empty.as_ptr(), std::ptr::null_mut()),
            };
            Bound::from_owned_ptr_or_err(py, value)
        }
    }
}

/// The tensor attributes the fast path reads, in the order it reads them.
///
/// No `layout`: tensors of every other layout fail on the way, as torch gives them
/// (`is_contiguous()` is false or raises for the sparse layouts, `data_ptr()` raises for every
/// tensor without strided storage, mkldnn included), and go to the full path, which names
/// their layout in its error.
#[derive(Debug)]
struct Attrs {
    dtype: Attr,
    is_cpu: Attr,
    is_contiguous: Attr,
    numel: Attr,
    data_ptr: Attr,
}

impl Attrs {
    fn find(ty: &Bound<'_, PyType>) -> Option<Attrs> {
        Some(Attrs {
            dtype: Attr::find(ty, "dtype", false)?,
            is_cpu: Attr::find(ty, "is_cpu", false)?,
            is_contiguous: Attr::find(ty, "is_contiguous", true)?,
            numel: Attr::find(ty, "numel", true)?,
            data_ptr: Attr::find(ty, "data_ptr", true)?,
        })
    }

    /// Whether `other`'s descriptors are these (a subclass that overrides none of them).
    fn same(&self, other: &Attrs) -> bool {
        let pairs = [
            (&self.dtype, &other.dtype),
            (&self.is_cpu, &other.is_cpu),
            (&self.is_contiguous, &other.is_contiguous),
            (&self.numel, &other.numel),
            (&self.data_ptr, &other.data_ptr),
        ];
        pairs.iter().all(|(a, b)| a.descr.is(&b.descr))
    }
}

/// A function of torch's stable C shim (`torch/csrc/inductor/aoti_torch/c/shim.h`, the C ABI
/// that AOTInductor-compiled code calls, exported by libtorch): `(tensor, &mut out) -> error`.
type ShimRead<T> = unsafe extern "C" fn(*mut c_void, *mut T) -> i32;

/// Reads a tensor's metadata through torch's stable C shim: one attribute read (`_cdata`, the
/// address of the tensor's `TensorImpl`), then plain C calls that read its layout, device,
/// dtype, contiguity, size and address, without torch's Python binding around each (about 35 ns
/// a read through the descriptors, a few ns through the shim).
///
/// The shim takes an `AtenTensorHandle`, which is an `at::Tensor*`; an `at::Tensor` is one
/// pointer to its `TensorImpl` (a `c10::intrusive_ptr`), so a word holding the address
/// `_cdata` gives is a borrowed `at::Tensor` that the reads below only read (they take and
/// release no reference). [`FastSpec::new`] checks that this reads every probe tensor the way
/// the descriptors do, and leaves the shim out otherwise.
#[derive(Debug)]
struct Shim {
    /// The tensor type's `_cdata` getter (the `TensorImpl` address).
    cdata: Attr,
    layout: ShimRead<i32>,
    device_type: ShimRead<i32>,
    dtype: ShimRead<i32>,
    is_contiguous: ShimRead<bool>,
    numel: ShimRead<i64>,
    data_ptr: ShimRead<*mut c_void>,
    /// The shim's codes of the strided layout and of the CPU device type.
    strided: i32,
    cpu: i32,
    /// The shim's dtype codes and the dtypes they are.
    dtypes: Vec<(i32, DType)>,
}

/// The shim functions [`Shim`] calls, by their names in shim.h (without `aoti_torch_`).
const SHIM_FUNCTIONS: [&str; 6] =
    ["get_layout", "get_device_type", "get_dtype", "is_contiguous", "get_numel", "get_data_ptr"];

impl Shim {
    /// The shim described by the platform (`FastPath.shim`): `functions` (name -> address),
    /// `strided`, `cpu` and `dtypes` (code -> name); `None` when something is missing.
    fn new(ty: &Bound<'_, PyType>, spec: &Bound<'_, PyDict>) -> PyResult<Option<Shim>> {
        let Some(cdata) = Attr::find(ty, "_cdata", false) else { return Ok(None) };
        let item = |key: &str| spec.get_item(key);
        let (Some(functions), Some(strided), Some(cpu), Some(dtypes)) =
            (item("functions")?, item("strided")?, item("cpu")?, item("dtypes")?)
        else {
            return Ok(None);
        };
        let functions = functions.cast_into::<PyDict>()?;
        let mut addr = [0usize; SHIM_FUNCTIONS.len()];
        for (a, name) in addr.iter_mut().zip(SHIM_FUNCTIONS) {
            match functions.get_item(name)? {
                Some(v) if v.extract::<usize>().is_ok_and(|v| v != 0) => *a = v.extract()?,
                _ => return Ok(None),
            }
        }
        let mut table = Vec::new();
        for (code, name) in dtypes.cast_into::<PyDict>()?.iter() {
            if let Ok(d) = name.extract::<String>()?.parse::<DType>() {
                table.push((code.extract::<i32>()?, d));
            }
        }
        // SAFETY: each address is that of the shim function of the same name, which the platform
        // looked up in the libtorch this process loaded (the contract of `enable_fast_path`);
        // their C signatures are those of `ShimRead` (shim.h: `AOTITorchError f(AtenTensorHandle,
        // T* out)`, `AOTITorchError` being `int32_t`). Non-null, checked above.
        let f = |i: usize| unsafe { std::mem::transmute::<*const (), ShimRead<i32>>(addr[i] as *const ()) };
        // SAFETY: as above, for the functions whose output is not an `int32_t`.
        let (is_contiguous, numel, data_ptr) = unsafe {
            (
                std::mem::transmute::<*const (), ShimRead<bool>>(addr[3] as *const ()),
                std::mem::transmute::<*const (), ShimRead<i64>>(addr[4] as *const ()),
                std::mem::transmute::<*const (), ShimRead<*mut c_void>>(addr[5] as *const ()),
            )
        };
        Ok(Some(Shim {
            cdata,
            layout: f(0),
            device_type: f(1),
            dtype: f(2),
            is_contiguous,
            numel,
            data_ptr,
            strided: strided.extract()?,
            cpu: cpu.extract()?,
            dtypes: table,
        }))
    }

    /// As [`FastSpec::tensor`], through the shim (the tensor's type is already checked).
    fn tensor(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        let imp = self.cdata.read(tensor).ok()?.extract::<i64>().ok()?;
        if imp == 0 {
            return None;
        }
        // The borrowed `at::Tensor`: one word, the `TensorImpl` address.
        let mut at_tensor = imp as usize as *mut c_void;
        let handle = std::ptr::addr_of_mut!(at_tensor).cast::<c_void>();
        let (mut code, mut contiguous, mut numel, mut ptr) = (0i32, false, 0i64, std::ptr::null_mut());
        // SAFETY: `handle` points to a live `at::Tensor` (see the type's documentation): the
        // `TensorImpl` it names belongs to `tensor`, which the caller holds for the call, and the
        // word lives until the end of this function. Each read writes its one output, which
        // points to a local of the right type, and returns 0 on success (a C++ exception is
        // turned into a non-zero code, never thrown through). Layout and device are checked
        // first: the later reads are then those of a dense CPU tensor.
        unsafe {
            if (self.layout)(handle, &mut code) != 0 || code != self.strided {
                return None;
            }
            if (self.device_type)(handle, &mut code) != 0 || code != self.cpu {
                return None;
            }
            if (self.dtype)(handle, &mut code) != 0 {
                return None;
            }
            let dtype = self.dtypes.iter().find(|(c, _)| *c == code)?.1;
            if (self.is_contiguous)(handle, &mut contiguous) != 0 || !contiguous {
                return None;
            }
            if (self.numel)(handle, &mut numel) != 0 {
                return None;
            }
            let len = usize::try_from(numel).ok()?;
            len.checked_mul(dtype.size())?;
            if (self.data_ptr)(handle, &mut ptr) != 0 {
                return None;
            }
            Some(Local { ptr: ptr as usize, len, dtype })
        }
    }
}

/// What the platform hands over once (`Platform.fast_path()`), so that the fast path can read
/// its tensors without the adapter.
#[derive(Debug)]
pub(crate) struct FastSpec {
    /// Tensor types read directly (exact type match; other types take the full path).
    types: Vec<Py<PyType>>,
    /// How tensors of those types are read (the same descriptors for every type).
    attrs: Attrs,
    /// The faster way, through torch's C shim, when the platform offers it and it reads the
    /// probe tensors right.
    shim: Option<Shim>,
    /// The framework's dtype objects and the dtypes they are.
    dtypes: Vec<(Py<PyAny>, DType)>,
    /// The profiler's flag, `(mapping, key)`: true while the framework's profiler records.
    profiler: Option<(Py<PyDict>, Py<PyString>)>,
    /// The API's native groups by framework group object, when the platform keys groups by the
    /// object itself (`None` in a call is the world, always known).
    groups: Option<Py<PyDict>>,
    /// The world group (what `group=None` means).
    world: Group,
}

impl FastSpec {
    /// Builds the spec from the platform's values, or `None` when the tensor types do not read
    /// the torch way (the fast path then stays off). Dtype names that do not parse are left
    /// out (their tensors take the full path, which reports them). The shim is kept only when
    /// it reads each of `probes` exactly as the descriptors do.
    #[allow(clippy::too_many_arguments)] // the platform's description, field by field
    pub(crate) fn new(
        types: Vec<Bound<'_, PyType>>,
        dtypes: &Bound<'_, PyDict>,
        profiler: Option<(Bound<'_, PyDict>, Bound<'_, PyString>)>,
        groups: Option<Bound<'_, PyDict>>,
        shim: Option<Bound<'_, PyDict>>,
        probes: &[Bound<'_, PyAny>],
        world: Group,
    ) -> PyResult<Option<FastSpec>> {
        let Some(first) = types.first().cloned() else { return Ok(None) };
        let Some(attrs) = Attrs::find(&first) else { return Ok(None) };
        let types = types.into_iter().filter(|t| Attrs::find(t).is_some_and(|a| a.same(&attrs)));
        let mut table = Vec::with_capacity(dtypes.len());
        for (obj, name) in dtypes.iter() {
            if let Ok(d) = name.extract::<String>()?.parse::<DType>() {
                table.push((obj.unbind(), d));
            }
        }
        let shim = match shim {
            Some(spec) => Shim::new(&first, &spec)?,
            None => None,
        };
        let mut spec = FastSpec {
            types: types.map(Bound::unbind).collect(),
            attrs,
            shim: None,
            dtypes: table,
            profiler: profiler.map(|(o, k)| (o.unbind(), k.unbind())),
            groups: groups.map(Bound::unbind),
            world,
        };
        if let Some(shim) = shim {
            let agrees = |t: &Bound<'_, PyAny>| {
                let ty = t.get_type_ptr();
                let known = spec.types.iter().any(|k| k.as_ptr().cast() == ty);
                !known || shim.tensor(t) == spec.by_descriptors(t)
            };
            if !probes.is_empty() && probes.iter().all(agrees) {
                spec.shim = Some(shim);
            }
        }
        Ok(Some(spec))
    }

    /// How tensors are read: `"shim"` (torch's C shim) or `"descriptors"`.
    pub(crate) fn reader(&self) -> &'static str {
        if self.shim.is_some() {
            "shim"
        } else {
            "descriptors"
        }
    }

    /// Whether the framework's profiler records now (calls then take the full path, which
    /// opens the profiler range). A flag that cannot be read counts as recording.
    fn profiling(&self, py: Python<'_>) -> bool {
        match &self.profiler {
            None => false,
            Some((map, key)) => match map.bind(py).get_item(key.bind(py)) {
                Ok(Some(v)) => v.is_truthy().unwrap_or(true),
                _ => true,
            },
        }
    }

    /// The native group of `group` when it is the world (`None`) or already cached by the API.
    fn group<'a, 'py>(&'a self, group: Option<&Bound<'py, PyAny>>) -> Option<FastGroup<'a, 'py>> {
        let Some(group) = group.filter(|g| !g.is_none()) else { return Some(FastGroup::World(&self.world)) };
        let cached = self.groups.as_ref()?.bind(group.py()).get_item(group).ok()??;
        cached.cast_into::<PyGroup>().ok().map(FastGroup::Cached)
    }

    /// `tensor` as a checked local range when it is a plain contiguous CPU tensor of a supported
    /// dtype (what `Platform.describe` and the communicator check on the full path); `None`
    /// for anything else, including a tensor whose attributes raise (the exception is dropped:
    /// the full path reads the tensor again and reports it).
    fn tensor(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        let ty = tensor.get_type_ptr();
        if !self.types.iter().any(|t| t.as_ptr().cast() == ty) {
            return None;
        }
        match &self.shim {
            Some(shim) => shim.tensor(tensor),
            None => self.by_descriptors(tensor),
        }
    }

    /// As [`FastSpec::tensor`], through the descriptors (the tensor's type is already checked).
    fn by_descriptors(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        let a = &self.attrs;
        let dtype = a.dtype.read(tensor).ok()?;
        let dtype = self.dtypes.iter().find(|(d, _)| d.is(&dtype))?.1;
        if !a.is_cpu.read(tensor).ok()?.is_truthy().ok()? || !a.is_contiguous.read(tensor).ok()?.is_truthy().ok()? {
            return None;
        }
        // As i64 (`PyLong_AsLong`, faster than the unsigned conversion for large values).
        let len = usize::try_from(a.numel.read(tensor).ok()?.extract::<i64>().ok()?).ok()?;
        len.checked_mul(dtype.size())?;
        let ptr = usize::try_from(a.data_ptr.read(tensor).ok()?.extract::<i64>().ok()?).ok()?;
        Some(Local { ptr, len, dtype })
    }
}

/// The group a fast call runs on: the world, or a cached native group (held for the call).
enum FastGroup<'a, 'py> {
    World(&'a Group),
    Cached(Bound<'py, PyGroup>),
}

impl FastGroup<'_, '_> {
    fn get(&self) -> &Group {
        match self {
            FastGroup::World(g) => g,
            FastGroup::Cached(b) => b.get().group(),
        }
    }
}

/// A reduction given by name (as spelled by [`ReduceOp::name`], or any spelling the core
/// parses) or by code, `Sum` when not given; `None` for anything else.
fn reduce_op(op: Option<&Bound<'_, PyAny>>) -> Option<ReduceOp> {
    let Some(op) = op else { return Some(ReduceOp::Sum) };
    if let Ok(s) = op.cast::<PyString>() {
        let s = s.to_str().ok()?;
        return ReduceOp::ALL.iter().copied().find(|o| o.name() == s).or_else(|| s.parse().ok());
    }
    let code = op.cast::<PyInt>().ok()?.extract::<i64>().ok()?;
    ReduceOp::from_code(code).ok()
}

/// The communicator the fast path runs on and what it knows of the platform: set once, by
/// `symm.init` (one runtime per process).
#[derive(Debug)]
struct Fast {
    comm: Py<PyCommunicator>,
    spec: FastSpec,
}

static FAST: PyOnceLock<Fast> = PyOnceLock::new();

/// Enables the fast path on `comm` (the first call wins: `symm.init` runs once per process).
pub(crate) fn enable(py: Python<'_>, comm: Py<PyCommunicator>, spec: FastSpec) {
    let _ = FAST.set(py, Fast { comm, spec });
}

/// The operations with a fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
}

/// The most parameters of a [`Kind`].
const MAX_PARAMS: usize = 4;

/// A call's arguments by parameter position (`None`: not given, the default applies).
type Args<'py> = [Option<Bound<'py, PyAny>>; MAX_PARAMS];

impl Kind {
    const ALL: [Kind; 1] = [Kind::AllReduce];

    /// The name `set_full_path` registers the full path under.
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "allreduce",
        }
    }

    /// The parameters of the Python function, in order (the full path declares the same).
    fn params(self) -> &'static [&'static str] {
        match self {
            Kind::AllReduce => &["tensor", "op", "group", "low_precision_dtype"],
        }
    }

    /// Where the Python function of the full path is kept (registered by `symm._api`).
    fn full_path(self) -> &'static Mutex<Option<Py<PyAny>>> {
        static FULL: [Mutex<Option<Py<PyAny>>>; Kind::ALL.len()] = [const { Mutex::new(None) }; Kind::ALL.len()];
        &FULL[self as usize]
    }

    /// Runs the call when it is the common case and returns true; returns false having done
    /// nothing otherwise.
    fn try_fast(self, py: Python<'_>, fast: &Fast, a: &Args<'_>) -> PyResult<bool> {
        let f = &fast.spec;
        if f.profiling(py) {
            return Ok(false);
        }
        let comm = fast.comm.get();
        match self {
            Kind::AllReduce => {
                let [Some(tensor), op, group, lp] = a else { return Ok(false) };
                if lp.as_ref().is_some_and(|l| !l.is_none()) {
                    return Ok(false);
                }
                let Some(op) = reduce_op(op.as_ref()) else { return Ok(false) };
                let Some(g) = f.group(group.as_ref()) else { return Ok(false) };
                let g = g.get();
                if g.member().is_err() {
                    return Ok(false);
                }
                let Some(t) = f.tensor(tensor) else { return Ok(false) };
                comm.run_allreduce(py, g, t, op, None)?;
            }
        }
        Ok(true)
    }

    /// The public function's body: the fast path, or the full path with the arguments given.
    fn call(self, py: Python<'_>, a: Args<'_>) -> PyResult<()> {
        if let Some(fast) = FAST.get(py) {
            if self.try_fast(py, fast, &a)? {
                return Ok(());
            }
        }
        // The lock is held only to take a reference: never while Python code runs.
        let full = self.full_path().lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|f| f.clone_ref(py));
        let Some(full) = full else {
            return Err(PyRuntimeError::new_err(format!("symm: the full path of {} is not registered", self.name())));
        };
        // The leading arguments given by position, the others (after an omitted one) by name.
        let leading = a.iter().take_while(|v| v.is_some()).count();
        let args = PyTuple::new(py, a[..leading].iter().flatten().collect::<Vec<_>>())?;
        let rest: Vec<_> =
            self.params().iter().zip(&a).skip(leading).filter_map(|(n, v)| Some((*n, v.as_ref()?))).collect();
        if rest.is_empty() {
            full.bind(py).call1(args)?;
        } else {
            let kwargs = PyDict::new(py);
            for (name, value) in rest {
                kwargs.set_item(name, value)?;
            }
            full.bind(py).call(args, Some(&kwargs))?;
        }
        Ok(())
    }
}

/// Registers `function` as the full path of collective `kind` (`"allreduce"`): the public
/// function calls it for every call that is not the common case. Called by `symm._api` when
/// it is imported (tests may swap in a wrapper). Returns the function registered before, or
/// None.
#[pyfunction]
pub(crate) fn set_full_path(kind: &str, function: Py<PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let Some(k) = Kind::ALL.into_iter().find(|k| k.name() == kind) else {
        let known = Kind::ALL.map(Kind::name).join(", ");
        return Err(PyValueError::new_err(format!("kind = {kind:?}: no fast path (known: {known})")));
    };
    let mut slot = k.full_path().lock().unwrap_or_else(|e| e.into_inner());
    Ok(slot.replace(function))
}

/// An argument as given, `None` when omitted (so that an explicit `None` reaches the full path
/// as the caller wrote it).
#[derive(Debug)]
pub(crate) struct Given<'py>(Option<Bound<'py, PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(obj.to_owned())))
    }
}

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
///         float16 and bfloat16 tensors; accumulation stays in full precision. ``None``: the
///         default from ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`` (unset: full precision).
///
/// Raises:
///     InvalidArgument: a bad tensor, op or format (on this rank; the others get PeerRejected).
///     Mismatch: the members disagree on count, dtype, op or format (on every member).
///     GroupError: this rank is not a member. Timeout: a member did not come in time.
#[pyfunction]
#[pyo3(
    signature = (tensor, op = Given(None), group = Given(None), low_precision_dtype = Given(None)),
    text_signature = "(tensor, op='sum', group=None, low_precision_dtype=None)"
)]
pub(crate) fn shmem_allreduce<'py>(
    py: Python<'py>,
    tensor: Bound<'py, PyAny>,
    op: Given<'py>,
    group: Given<'py>,
    low_precision_dtype: Given<'py>,
) -> PyResult<()> {
    Kind::AllReduce.call(py, [Some(tensor), op.0, group.0, low_precision_dtype.0])
}
