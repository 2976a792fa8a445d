//! The fast path of the public collectives: `symm.shmem_allreduce`, `shmem_reduce_scatter`,
//! `shmem_allgather`, `shmem_alltoall`, `shmem_broadcast`, `shmem_send`, `shmem_recv` and
//! `shmem_sendrecv` are this module's native functions, which run the common case themselves
//! and hand every other call to the full path in Python (`symm._api`).
//!
//! The full path checks the profiler, resolves the group, asks the platform adapter to describe
//! each tensor as a [`Desc`](crate::comm::Desc) tuple (dtype and device as strings), and the
//! communicator converts and checks that before running the core. For a tiny message that
//! argument handling costs many times the collective itself (a 2-rank allreduce of 8 bytes
//! takes about 0.25-0.4 us in Rust). The fast path does the same in one native call with the
//! fewest reads:
//!
//! - the call enters through [`Kind::entry`], a plain `METH_FASTCALL | METH_KEYWORDS` C
//!   function that binds the arguments in place (borrowed, keywords matched by identity with
//!   the interned parameter names), without PyO3's argument extraction and trampoline; every
//!   call it does not run goes, as given, to the `#[pyfunction]` PyO3 generated (the
//!   *binding*: Python's TypeErrors for calls that do not bind, then [`Kind::call`]), whose
//!   name, signature and documentation the entry point shares;
//! - the tensor's exact type is compared by identity with the types the platform handed over
//!   once ([`FastSpec`]); its layout, device, dtype, contiguity, size and address, and where it
//!   lies in its storage (offset, storage size: its data must lie within the storage, see
//!   [`within_storage`]) are read through torch's stable C shim ([`Shim`]: C calls on the
//!   `at::Tensor` that the tensor object holds, at an offset found by probing at start-up, or
//!   else on one read through the `_cdata` attribute), or, where the shim is missing or does not read the probe tensors
//!   right, by calling the C functions behind the tensor type's descriptors ([`Attr`]: what
//!   `Tensor.data_ptr(t)` calls, without an attribute lookup per call; an instance attribute
//!   shadowing one of those methods is not consulted);
//! - the op is matched by identity with the interned names and cached small-int codes, then by
//!   name or code; the group by identity in the API's own cache of native groups (`None`: the
//!   world, whose membership is checked once); the profiler flag is one borrowed dict read, or
//!   none while the dict holding it has not changed since the flag was last read `False` (its
//!   version, which CPython keeps up to 3.13, is compared instead);
//! - the tensor reads are inlined into the call (a tenth of its own cost was calling them and
//!   passing their results through memory).
//!
//! **The common case**: the fast path enabled (by `symm.init`), no profiler recording, every
//! argument given as a value it recognises (`group` None or a group the API already resolved, that
//! this rank belongs to; no low-precision format; an op by name or code; a source rank as an `int`
//! of the group, and so a peer's rank; lists given as a `list` or `tuple`, of tensors, or of counts
//! as `int`s or one-element integer tensors; counts also as one integer tensor, as HyperParallel
//! passes them, see [`FastSpec::counts`]) and plain contiguous CPU tensors of supported dtypes
//! whose data lies within their storage (two tensors: the same dtype, and the element counts the
//! operation relates). Anything else goes to the full path **before anything was done** (no round
//! joined, nothing rejected, no error raised) with the arguments as given, so every error keeps its
//! class and message, a rejected round still lets the peers fail at once instead of waiting, and
//! profiler ranges are recorded. Errors of the collective itself (Mismatch, Timeout, PeerRejected, ...) come from the
//! core call both paths end in.
//!
//! The collective runs exactly as on the full path: the same core call
//! ([`PyCommunicator::run_allreduce`] and its siblings), which for small messages keeps the GIL
//! while it spins and releases it when it is about to block (a collective may wait for its peers;
//! holding the GIL then would stall every other Python thread for as long as the slowest peer
//! takes). Releasing and retaking the GIL (about 40 ns) was most of what a call cost beyond the
//! core's own work (on one rank about 60 ns, of which the GIL ~40, the shim's six reads ~15 (the
//! storage check's two more, ~3), the profiler flag ~4 before its dict's version spared the
//! look-up; the call itself and its loop in the caller's Python code, ~30-45 ns more, are the
//! interpreter's); a call whose peers are already there no longer pays it.
//!
//! The table of operations is [`Kind`]: its parameters, the Python function of its full path
//! (registered by `symm._api` with [`set_full_path`]) and how its common case runs. Another
//! collective gets a fast path by a variant there, its public function (binding and entry
//! point) below, and the registration of its full path.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCFunction, PyDict, PyInt, PyList, PySequence, PyString, PyTuple, PyType};
use symm_core::{DType, Group, ReduceOp, Transport};

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
    /// `storage_offset()` and `untyped_storage()`: the data must lie within the storage
    /// ([`within_storage`]).
    storage_offset: Attr,
    untyped_storage: Attr,
}

impl Attrs {
    fn find(ty: &Bound<'_, PyType>) -> Option<Attrs> {
        Some(Attrs {
            dtype: Attr::find(ty, "dtype", false)?,
            is_cpu: Attr::find(ty, "is_cpu", false)?,
            is_contiguous: Attr::find(ty, "is_contiguous", true)?,
            numel: Attr::find(ty, "numel", true)?,
            data_ptr: Attr::find(ty, "data_ptr", true)?,
            storage_offset: Attr::find(ty, "storage_offset", true)?,
            untyped_storage: Attr::find(ty, "untyped_storage", true)?,
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
            (&self.storage_offset, &other.storage_offset),
            (&self.untyped_storage, &other.untyped_storage),
        ];
        pairs.iter().all(|(a, b)| a.descr.is(&b.descr))
    }
}

/// Whether `len` (> 0) elements of `dtype` at `ptr`, `offset` elements into a storage of `nbytes`
/// bytes, lie within that storage: the check of every tensor the fast path reads (what
/// [`crate::comm::check_storage`] checks on the full path). A null pointer is a tensor without
/// real storage (storage freed with `untyped_storage().resize_(0)`, as FSDP frees parameters);
/// a range past the storage's end a view whose storage shrank. Either takes the full path,
/// which reads the tensor again and refuses it, naming the argument.
#[inline(always)]
fn within_storage(ptr: usize, len: usize, dtype: DType, offset: i64, nbytes: i64) -> bool {
    let (Ok(offset), Ok(nbytes)) = (usize::try_from(offset), usize::try_from(nbytes)) else { return false };
    let end = offset.checked_add(len).and_then(|e| e.checked_mul(dtype.size()));
    ptr != 0 && end.is_some_and(|e| e <= nbytes)
}

/// A function of torch's stable C shim (`torch/csrc/inductor/aoti_torch/c/shim.h`, the C ABI
/// that AOTInductor-compiled code calls, exported by libtorch): `(tensor, &mut out) -> error`.
type ShimRead<T> = unsafe extern "C" fn(*mut c_void, *mut T) -> i32;

/// Reads a tensor's metadata through torch's stable C shim: plain C calls on the tensor's
/// `at::Tensor` that read its layout, device, dtype, contiguity, size, address, storage offset
/// and storage size, without
/// torch's Python binding around each (about 35 ns a read through the descriptors, a few ns
/// through the shim).
///
/// The shim takes an `AtenTensorHandle`, which is an `at::Tensor*`; an `at::Tensor` is one
/// pointer to its `TensorImpl` (a `c10::intrusive_ptr`), and the reads below only read it
/// (they take and release no reference). The handle is found in one of two ways:
///
/// - **in the object** (`handle_at`): torch's tensor objects (`THPVariable`) hold their
///   `at::Tensor` inline, after the object header (`PyObject_HEAD` then `at::Tensor cdata` in
///   torch 2.10+, `c10::MaybeOwned<at::Tensor>` in older ones, whose tensor sits one word
///   further). [`Shim::find_handle`] finds the offset at start-up: the one word at which every
///   probe tensor holds the address its `_cdata` gives. A call then reads no attribute at all;
/// - **through `_cdata`** (when the platform does not declare the tensor in the object, or the
///   probe finds no single offset): one attribute read, whose value (the `TensorImpl`
///   address) is put in a local word, which is then a borrowed `at::Tensor`.
///
/// [`FastSpec::new`] checks that either way reads every probe tensor the way the descriptors
/// do, and leaves the shim (or the offset) out otherwise.
#[derive(Debug)]
struct Shim {
    /// The tensor type's `_cdata` getter (the `TensorImpl` address).
    cdata: Attr,
    /// Whether the platform declares the `at::Tensor` inline in its tensor objects (where
    /// [`Shim::find_handle`] may look for it).
    in_object: bool,
    /// The offset of the `at::Tensor` in the tensor objects, when found.
    handle_at: Option<usize>,
    layout: ShimRead<i32>,
    device_type: ShimRead<i32>,
    dtype: ShimRead<i32>,
    is_contiguous: ShimRead<bool>,
    numel: ShimRead<i64>,
    data_ptr: ShimRead<*mut c_void>,
    /// The element offset of the data in its storage, and the storage's size in bytes: the
    /// data must lie within the storage ([`within_storage`]).
    storage_offset: ShimRead<i64>,
    storage_size: ShimRead<i64>,
    /// The shim's codes of the strided layout and of the CPU device type.
    strided: i32,
    cpu: i32,
    /// The dtypes by shim dtype code (an index: torch's `ScalarType` values are small).
    dtypes: Vec<Option<DType>>,
}

/// The largest shim dtype code kept (torch's `ScalarType` has about 50; a dtype with a larger
/// code takes the full path).
const MAX_DTYPE_CODE: usize = 1023;

/// The shim functions [`Shim`] calls, by their names in shim.h (without `aoti_torch_`); the
/// platform looks their addresses up by this list (`_symm.SHIM_FUNCTIONS`).
pub(crate) const SHIM_FUNCTIONS: [&str; 8] = [
    "get_layout",
    "get_device_type",
    "get_dtype",
    "is_contiguous",
    "get_numel",
    "get_data_ptr",
    "get_storage_offset",
    "get_storage_size",
];

impl Shim {
    /// The shim described by the platform (`FastPath.shim`): `functions` (name -> address),
    /// `strided`, `cpu`, `dtypes` (code -> name) and optionally `tensor_in_object` (true:
    /// the tensor objects hold their `at::Tensor` inline); `None` when something is missing.
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
        let in_object = match item("tensor_in_object")? {
            Some(v) => v.is_truthy()?,
            None => false,
        };
        let mut table = Vec::new();
        for (code, name) in dtypes.cast_into::<PyDict>()?.iter() {
            if let Ok(d) = name.extract::<String>()?.parse::<DType>() {
                if let Some(code) = usize::try_from(code.extract::<i64>()?).ok().filter(|&c| c <= MAX_DTYPE_CODE) {
                    if table.len() <= code {
                        table.resize(code + 1, None);
                    }
                    table[code] = Some(d);
                }
            }
        }
        // SAFETY: each address is that of the shim function of the same name, which the platform
        // looked up in the libtorch this process loaded (the contract of `enable_fast_path`);
        // their C signatures are those of `ShimRead` (shim.h: `AOTITorchError f(AtenTensorHandle,
        // T* out)`, `AOTITorchError` being `int32_t`). Non-null, checked above.
        let f = |i: usize| unsafe { std::mem::transmute::<*const (), ShimRead<i32>>(addr[i] as *const ()) };
        // SAFETY: as above, for the functions whose output is not an `int32_t`.
        let (is_contiguous, numel, data_ptr, storage_offset, storage_size) = unsafe {
            (
                std::mem::transmute::<*const (), ShimRead<bool>>(addr[3] as *const ()),
                std::mem::transmute::<*const (), ShimRead<i64>>(addr[4] as *const ()),
                std::mem::transmute::<*const (), ShimRead<*mut c_void>>(addr[5] as *const ()),
                std::mem::transmute::<*const (), ShimRead<i64>>(addr[6] as *const ()),
                std::mem::transmute::<*const (), ShimRead<i64>>(addr[7] as *const ()),
            )
        };
        Ok(Some(Shim {
            cdata,
            in_object,
            handle_at: None,
            layout: f(0),
            device_type: f(1),
            dtype: f(2),
            is_contiguous,
            numel,
            data_ptr,
            storage_offset,
            storage_size,
            strided: strided.extract()?,
            cpu: cpu.extract()?,
            dtypes: table,
        }))
    }

    /// As [`FastSpec::tensor`], through the shim (the tensor's type is already checked: one of
    /// the types [`Shim::find_handle`] looked at). Inlined into the call, as [`Shim::read`]
    /// and [`FastSpec::tensor`] (see the module documentation).
    #[inline(always)]
    fn tensor(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        match self.handle_at {
            Some(at) => {
                // SAFETY: `tensor` is a live instance (the caller holds it) of one of the tensor
                // types, whose objects hold their `at::Tensor` at `at`, a word-aligned offset
                // within the smallest basic size of those types (`find_handle`); objects are
                // word-aligned, so `handle` points to that `at::Tensor`, which lives as long as
                // the object.
                let handle = unsafe { tensor.as_ptr().cast::<u8>().add(at) }.cast::<c_void>();
                // SAFETY: as above; its one word is the `TensorImpl` address (null for a
                // tensor object without a tensor, which the shim must not read).
                if unsafe { handle.cast::<usize>().read() } == 0 {
                    return None;
                }
                // SAFETY: `handle` is the object's own `at::Tensor`, defined (non-null), and the
                // object is held for the call.
                unsafe { self.read(handle) }
            }
            None => {
                let imp = self.cdata.read(tensor).ok()?.extract::<i64>().ok()?;
                if imp == 0 {
                    return None;
                }
                // The borrowed `at::Tensor`: one word, the `TensorImpl` address.
                let mut at_tensor = imp as usize as *mut c_void;
                // SAFETY: the local word is an `at::Tensor` naming the defined `TensorImpl` of
                // `tensor`, which the caller holds for the call; the word lives until the end
                // of this function.
                unsafe { self.read(std::ptr::addr_of_mut!(at_tensor).cast::<c_void>()) }
            }
        }
    }

    /// The checked local range of the tensor `handle` points to (see [`FastSpec::tensor`]).
    ///
    /// # Safety
    ///
    /// `handle` points to a live, defined `at::Tensor` (non-null `TensorImpl`) that stays
    /// alive and unchanged for the call.
    #[inline(always)]
    unsafe fn read(&self, handle: *mut c_void) -> Option<Local> {
        let (mut code, mut contiguous, mut numel, mut ptr) = (0i32, false, 0i64, std::ptr::null_mut());
        let (mut offset, mut nbytes) = (0i64, 0i64);
        // SAFETY: `handle` is an `AtenTensorHandle` (the caller's contract). Each read writes
        // its one output, which points to a local of the right type, and returns 0 on success
        // (a C++ exception is turned into a non-zero code, never thrown through). Layout and
        // device are checked first: the later reads are then those of a dense CPU tensor.
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
            let dtype = (*self.dtypes.get(usize::try_from(code).ok()?)?)?;
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
            // An empty tensor moves nothing: its storage is not read (two calls fewer).
            if len != 0
                && ((self.storage_offset)(handle, &mut offset) != 0
                    || (self.storage_size)(handle, &mut nbytes) != 0
                    || !within_storage(ptr as usize, len, dtype, offset, nbytes))
            {
                return None;
            }
            Some(Local { ptr: ptr as usize, len, dtype })
        }
    }

    /// Where the objects of `types` hold their `at::Tensor`: the one word-aligned offset,
    /// within the smallest basic size of those types, at which every probe of those types
    /// holds the `TensorImpl` address its `_cdata` gives; `None` unless the platform declares
    /// the tensor inline, every type has this `_cdata` getter, at least two probes name
    /// distinct `TensorImpl`s and exactly one offset fits them all.
    fn find_handle(&self, types: &[Py<PyType>], probes: &[Bound<'_, PyAny>]) -> Option<usize> {
        if !self.in_object {
            return None;
        }
        let py = probes.first()?.py();
        let mut size = usize::MAX;
        for t in types {
            let t = t.bind(py);
            if !Attr::find(t, "_cdata", false).is_some_and(|a| a.descr.is(&self.cdata.descr)) {
                return None;
            }
            // SAFETY: `t` is a live type object (held by `types`); its basic and item sizes
            // are plain fields of `PyTypeObject`.
            let (basic, item) = unsafe { ((*t.as_type_ptr()).tp_basicsize, (*t.as_type_ptr()).tp_itemsize) };
            if item != 0 {
                return None;
            }
            size = size.min(usize::try_from(basic).ok()?);
        }
        const WORD: usize = std::mem::size_of::<usize>();
        let head = std::mem::size_of::<ffi::PyObject>();
        let mut fits: Vec<usize> = (head..size.checked_sub(WORD - 1)?).step_by(WORD).collect();
        let mut seen = Vec::new();
        for p in probes {
            let ty = p.get_type_ptr();
            if !types.iter().any(|k| k.as_ptr().cast() == ty) {
                continue;
            }
            let imp = self.cdata.read(p).ok()?.extract::<usize>().ok()?;
            if imp == 0 {
                continue;
            }
            seen.push(imp);
            // SAFETY: `p` is a live instance of one of `types` (held by `probes`), so its
            // object spans at least `size` bytes; each offset is word-aligned and its word
            // ends within `size`.
            fits.retain(|&at| unsafe { p.as_ptr().cast::<u8>().add(at).cast::<usize>().read() } == imp);
        }
        seen.sort_unstable();
        seen.dedup();
        match fits[..] {
            [at] if seen.len() >= 2 => Some(at),
            _ => None,
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
    /// The exact type of the storages `untyped_storage()` gives and its `nbytes()` (found on a
    /// probe); `None`: the descriptors cannot check storages, and every tensor they read takes
    /// the full path.
    storage: Option<(Py<PyType>, Attr)>,
    /// The faster way, through torch's C shim, when the platform offers it and it reads the
    /// probe tensors right.
    shim: Option<Shim>,
    /// The framework's dtype objects and the dtypes they are.
    dtypes: Vec<(Py<PyAny>, DType)>,
    /// The tensors' `shape` property, for the first dimension of a tensor of counts
    /// ([`FastSpec::counts`]); `None`: such tensors are measured with `len()`.
    shape: Option<Attr>,
    /// The profiler's flag, `(mapping, key)`: true while the framework's profiler records.
    profiler: Option<(Py<PyDict>, Py<PyString>)>,
    /// The mapping's version ([`dict_version`]) when the flag was last read as `False`; 0:
    /// none. While the version is the same, the flag is still `False`, and a call reads one
    /// word instead of looking the key up (a tenth of the Python call's own cost).
    profiler_off_at: AtomicU64,
    /// The API's native groups by framework group object, when the platform keys groups by the
    /// object itself (`None` in a call is the world, always known).
    groups: Option<Py<PyDict>>,
    /// The world group (what `group=None` means) when this rank can use it (a group's
    /// membership and locality never change: checked once, not per call); `None`: calls on
    /// the world take the full path, which reports why.
    world: Option<Group>,
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
        let types: Vec<_> = types.map(Bound::unbind).collect();
        let storage = probes
            .iter()
            .filter(|p| types.iter().any(|k| k.as_ptr().cast() == p.get_type_ptr()))
            .find_map(|p| attrs.untyped_storage.read(p).ok())
            .and_then(|st| {
                let ty = st.get_type();
                Attr::find(&ty, "nbytes", true).map(|nbytes| (ty.unbind(), nbytes))
            });
        let mut spec = FastSpec {
            types,
            attrs,
            storage,
            shim: None,
            dtypes: table,
            shape: Attr::find(&first, "shape", false),
            profiler: profiler.map(|(o, k)| (o.unbind(), k.unbind())),
            profiler_off_at: AtomicU64::new(0),
            groups: groups.map(Bound::unbind),
            world: world.member().is_ok().then_some(world),
        };
        if let Some(mut shim) = shim {
            let agrees = |shim: &Shim| {
                !probes.is_empty()
                    && probes.iter().all(|t| {
                        let ty = t.get_type_ptr();
                        let known = spec.types.iter().any(|k| k.as_ptr().cast() == ty);
                        !known || shim.tensor(t) == spec.by_descriptors(t)
                    })
            };
            if agrees(&shim) {
                shim.handle_at = shim.find_handle(&spec.types, probes);
                if shim.handle_at.is_some() && !agrees(&shim) {
                    shim.handle_at = None;
                }
                spec.shim = Some(shim);
            }
        }
        Ok(Some(spec))
    }

    /// How tensors are read: `"handle"` (torch's C shim on the `at::Tensor` in the object),
    /// `"shim"` (torch's C shim, through `_cdata`) or `"descriptors"`.
    pub(crate) fn reader(&self) -> &'static str {
        match &self.shim {
            Some(Shim { handle_at: Some(_), .. }) => "handle",
            Some(_) => "shim",
            None => "descriptors",
        }
    }

    /// Whether the framework's profiler records now (calls then take the full path, which
    /// opens the profiler range). A flag that cannot be read counts as recording.
    ///
    /// Every access to `profiler_off_at` happens with the GIL held, which orders them: the
    /// atomic only makes the spec `Sync`, hence `Relaxed` (free-threaded builds keep no
    /// version, see [`dict_version`], and never store one).
    fn profiling(&self, py: Python<'_>) -> bool {
        let Some((map, key)) = &self.profiler else { return false };
        let version = dict_version(map);
        if version.is_some_and(|v| self.profiler_off_at.load(Ordering::Relaxed) == v) {
            return false;
        }
        // SAFETY: `map` is a dict and `key` a str, both held by `self`, the GIL held. The
        // result is borrowed (no reference counting for the common answer), or NULL: missing
        // (no exception) or failed (an exception, taken below). `version` was read before the
        // look-up: should the look-up run code that changes the dict (a stored key's `__eq__`),
        // the version kept below is an old one, which only costs a look-up more next time.
        let value = unsafe { ffi::PyDict_GetItemWithError(map.as_ptr(), key.as_ptr()) };
        if value.is_null() {
            drop(PyErr::take(py));
            return true;
        }
        // SAFETY: `Py_False` is the address of the `False` singleton.
        if value == unsafe { ffi::Py_False() } {
            if let Some(v) = version {
                self.profiler_off_at.store(v, Ordering::Relaxed);
            }
            return false;
        }
        // SAFETY: `value` is a live object borrowed from `map`; a reference is taken before its
        // `__bool__` may run code (which could drop the dict's).
        let value = unsafe { Bound::from_borrowed_ptr(py, value) };
        value.is_truthy().unwrap_or(true)
    }

    /// The native group of `group` when it is the world (`None`; one this rank can use) or
    /// already cached by the API.
    fn group<'a, 'py>(&'a self, group: Option<&Bound<'py, PyAny>>) -> Option<FastGroup<'a, 'py>> {
        let Some(group) = group.filter(|g| !g.is_none()) else { return self.world.as_ref().map(FastGroup::World) };
        let cached = self.groups.as_ref()?.bind(group.py()).get_item(group).ok()??;
        cached.cast_into::<PyGroup>().ok().map(FastGroup::Cached)
    }

    /// [`FastSpec::group`], when this rank is a member (the world's membership was checked
    /// once, in [`FastSpec::new`]).
    fn member_group<'a, 'py>(&'a self, group: Option<&Bound<'py, PyAny>>) -> Option<FastGroup<'a, 'py>> {
        let g = self.group(group)?;
        (!matches!(g, FastGroup::Cached(_)) || g.get().member().is_ok()).then_some(g)
    }

    /// `tensor` as a checked local range when it is a plain contiguous CPU tensor of a supported
    /// dtype whose data lies within its storage (what `Platform.describe` and the communicator
    /// check on the full path); `None`
    /// for anything else, including a tensor whose attributes raise (the exception is dropped:
    /// the full path reads the tensor again and reports it).
    #[inline(always)]
    fn tensor(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        let ty = tensor.get_type_ptr();
        if !self.types.iter().any(|t| t.as_ptr().cast() == ty) {
            return None;
        }
        match &self.shim {
            Some(shim) => shim.tensor(tensor),
            // Rebuilt field by field: taken as the call returns it (through memory), the two
            // arms would meet in memory, where the shim's answer is written with a byte store
            // and copied with a word load (a store-forwarding stall in every call).
            None => {
                let l = self.by_descriptors(tensor)?;
                Some(Local { ptr: l.ptr, len: l.len, dtype: l.dtype })
            }
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
        if len != 0 {
            let offset = a.storage_offset.read(tensor).ok()?.extract::<i64>().ok()?;
            let (ty, nbytes) = self.storage.as_ref()?;
            let storage = a.untyped_storage.read(tensor).ok()?;
            if storage.get_type_ptr() != ty.as_ptr().cast() {
                return None;
            }
            let nbytes = nbytes.read(&storage).ok()?.extract::<i64>().ok()?;
            if !within_storage(ptr, len, dtype, offset, nbytes) {
                return None;
            }
        }
        Some(Local { ptr, len, dtype })
    }
}

impl FastSpec {
    /// An alltoall's `receive_list` for a group of `n`, in every form the full path reads
    /// (`symm._api._counts`: the items of `list`, each an int or a one-element integer tensor):
    /// a plain `list` or `tuple` of `n` items, each an `int` or a one-element integer tensor, or
    /// an integer tensor with `n` elements whose first dimension is `n` (1-D, or `(n, 1, ...)`).
    /// `None` for anything else, including a negative count (the full path reports it).
    fn counts(&self, list: &Bound<'_, PyAny>, n: usize) -> Option<Vec<usize>> {
        if let Some(items) = plain_items(list, n) {
            return (0..n)
                .map(|i| {
                    let c = items.get_item(i).ok()?;
                    if c.is_exact_instance_of::<PyInt>() {
                        return usize::try_from(c.extract::<u64>().ok()?).ok();
                    }
                    self.tensor(&c).filter(|t| t.len == 1).and_then(|t| int_element(t, 0))
                })
                .collect();
        }
        let t = self.tensor(list)?;
        // The first dimension (none for a 0-d tensor), what `len()` gives, read through `shape`
        // (a getter in C; `len()` is Python code and `size()` parses its arguments, each of them
        // costing more than the collective).
        let first = match &self.shape {
            Some(shape) => shape.read(list).ok()?.cast_into::<PyTuple>().ok()?.get_item(0).ok()?.extract().ok()?,
            None => list.len().ok()?,
        };
        if t.len != n || first != n {
            return None;
        }
        (0..n).map(|i| int_element(t, i)).collect()
    }
}

/// Element `i` (< `t.len`) of the integer tensor `t`, when it is a count (`>= 0`); `None` for a
/// floating dtype or a negative value.
fn int_element(t: Local, i: usize) -> Option<usize> {
    let at = (t.ptr + i * t.dtype.size()) as *const u8;
    // SAFETY: `t` is a tensor the fast path read ([`FastSpec::tensor`]): `t.len` elements of
    // `t.dtype` at `t.ptr` lie within its storage, and the caller holds the tensor for the
    // call; `i < t.len`. Unaligned reads: nothing guarantees a view's alignment.
    let v = unsafe {
        match t.dtype {
            DType::I64 => at.cast::<i64>().read_unaligned(),
            DType::I32 => i64::from(at.cast::<i32>().read_unaligned()),
            DType::I16 => i64::from(at.cast::<i16>().read_unaligned()),
            DType::I8 => i64::from(at.cast::<i8>().read()),
            DType::U8 => i64::from(at.read()),
            DType::Bool => i64::from(at.read() != 0),
            _ => return None,
        }
    };
    usize::try_from(v).ok()
}

/// The version CPython keeps for `dict` (`ma_version_tag`, up to Python 3.13: a new value,
/// unique in the interpreter, at every insertion, deletion and change of a value of a dict with
/// its own table, such as a module's `vars()`, the mapping the platforms hand over), or `None`
/// where there is none: 0, Python 3.14 on (which dropped the field), a free-threaded build
/// (where another thread may be writing the field, and a reader on a weakly ordered CPU could
/// see the new version with the old value).
fn dict_version(dict: &Py<PyDict>) -> Option<u64> {
    #[cfg(not(any(Py_3_14, PyPy, GraalPy, Py_GIL_DISABLED)))]
    {
        // Deprecated for 3.12-3.13 (removed in 3.14), still maintained there.
        #[allow(deprecated)]
        // SAFETY: `dict` is a live dict (or an instance of a subclass), an object that starts
        // with CPython's `PyDictObject`; the field is a plain word, read with the GIL held.
        let v = unsafe { (*dict.as_ptr().cast::<ffi::PyDictObject>()).ma_version_tag };
        (v != 0).then_some(v)
    }
    #[cfg(any(Py_3_14, PyPy, GraalPy, Py_GIL_DISABLED))]
    {
        let _ = dict;
        None
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

/// A rank of group `g` given as a plain `int` (not a bool, a tensor, ...); `None` for anything
/// else, including a rank outside the group (the full path reports it).
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
    ReduceScatter,
    AllGather,
    AllToAll,
    Broadcast,
    Send,
    Recv,
    SendRecv,
}

/// The most parameters of a [`Kind`].
const MAX_PARAMS: usize = 5;

/// A call's arguments by parameter position, borrowed from the caller (`None`: not given, the
/// default applies).
type Args<'a, 'py> = [Option<Borrowed<'a, 'py, PyAny>>; MAX_PARAMS];

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::AllReduce,
        Kind::ReduceScatter,
        Kind::AllGather,
        Kind::AllToAll,
        Kind::Broadcast,
        Kind::Send,
        Kind::Recv,
        Kind::SendRecv,
    ];

    /// The name `set_full_path` registers the full path under.
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "allreduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "allgather",
            Kind::AllToAll => "alltoall",
            Kind::Broadcast => "broadcast",
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::SendRecv => "sendrecv",
        }
    }

    /// The parameters of the Python function, in order (the full path declares the same).
    fn params(self) -> &'static [&'static str] {
        match self {
            Kind::AllReduce => &["tensor", "op", "group", "low_precision_dtype"],
            Kind::ReduceScatter => &["output_tensor", "input_tensor", "op", "group", "low_precision_dtype"],
            Kind::AllGather => &["output_tensor", "input_tensor", "group"],
            Kind::AllToAll => &["send_tensor_list", "receive_tensor", "receive_list", "group"],
            Kind::Broadcast | Kind::Recv => &["tensor", "src_rank", "group"],
            Kind::Send => &["tensor", "dst_rank", "group"],
            Kind::SendRecv => &["send_tensor", "dst_rank", "recv_tensor", "src_rank", "group"],
        }
    }

    /// How many leading parameters have no default.
    fn required(self) -> usize {
        match self {
            Kind::AllReduce => 1,
            Kind::ReduceScatter | Kind::AllGather | Kind::Broadcast | Kind::Send | Kind::Recv => 2,
            Kind::AllToAll => 3,
            Kind::SendRecv => 4,
        }
    }

    /// The parameter names, interned: a keyword is matched by identity first (the names a
    /// call site writes are interned).
    fn interned(self, py: Python<'_>) -> &[Py<PyString>] {
        static NAMES: [PyOnceLock<Vec<Py<PyString>>>; Kind::ALL.len()] = [const { PyOnceLock::new() }; Kind::ALL.len()];
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

    /// The function PyO3 generated for the public function (`#[pyfunction]` below): it binds
    /// the arguments as the entry point does, and raises Python's TypeError for calls that do
    /// not bind; its definition gives the entry point its name, signature and documentation.
    fn binding(self) -> &'static PyOnceLock<Py<PyCFunction>> {
        static BINDING: [PyOnceLock<Py<PyCFunction>>; Kind::ALL.len()] = [const { PyOnceLock::new() }; Kind::ALL.len()];
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
                PyRuntimeError::new_err(format!("symm: {} is not registered", self.name())).restore(py);
                std::ptr::null_mut()
            }
        }
    }

    /// Where the Python function of the full path is kept (registered by `symm._api`).
    fn full_path(self) -> &'static Mutex<Option<Py<PyAny>>> {
        static FULL: [Mutex<Option<Py<PyAny>>>; Kind::ALL.len()] = [const { Mutex::new(None) }; Kind::ALL.len()];
        &FULL[self as usize]
    }

    /// Runs the call when it is the common case and returns true; returns false having done
    /// nothing otherwise.
    fn try_fast(self, py: Python<'_>, fast: &Fast, a: &Args<'_, '_>) -> PyResult<bool> {
        let f = &fast.spec;
        if f.profiling(py) {
            return Ok(false);
        }
        let comm = fast.comm.get();
        // No format given (`None` given is none).
        let no_format = |lp: &Option<Borrowed<'_, '_, PyAny>>| !lp.is_some_and(|l| !l.is_none());
        match self {
            Kind::AllReduce => {
                let [Some(tensor), op, g, lp, _] = a else { return Ok(false) };
                let Some(op) = reduce_op(op.as_deref()).filter(|_| no_format(lp)) else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let Some(t) = f.tensor(tensor) else { return Ok(false) };
                comm.run_allreduce(py, g.get(), t, op, Transport::Default)?;
            }
            Kind::ReduceScatter => {
                let [Some(output), Some(input), op, g, lp] = a else { return Ok(false) };
                let Some(op) = reduce_op(op.as_deref()).filter(|_| no_format(lp)) else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let (Some(o), Some(i)) = (f.tensor(output), f.tensor(input)) else { return Ok(false) };
                if o.dtype != i.dtype || o.len.checked_mul(g.get().size()) != Some(i.len) {
                    return Ok(false);
                }
                comm.run_reduce_scatter(py, g.get(), o, i, op, Transport::Default)?;
            }
            Kind::AllGather => {
                let [Some(output), Some(input), g, ..] = a else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let (Some(o), Some(i)) = (f.tensor(output), f.tensor(input)) else { return Ok(false) };
                if o.dtype != i.dtype || i.len.checked_mul(g.get().size()) != Some(o.len) {
                    return Ok(false);
                }
                comm.run_allgather(py, g.get(), o, i)?;
            }
            Kind::AllToAll => {
                let [Some(sends), Some(receive), Some(counts), g, _] = a else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let n = g.get().size();
                let Some(r) = f.tensor(receive) else { return Ok(false) };
                let (Some(sends), Some(recv_counts)) = (plain_items(sends, n), f.counts(counts, n)) else {
                    return Ok(false);
                };
                let mut locals = Vec::with_capacity(n);
                for i in 0..n {
                    let Ok(s) = sends.get_item(i) else { return Ok(false) };
                    match f.tensor(&s) {
                        Some(t) if t.dtype == r.dtype => locals.push(t),
                        _ => return Ok(false),
                    }
                }
                if !recv_counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).is_some_and(|t| t <= r.len) {
                    return Ok(false);
                }
                comm.run_alltoall(py, g.get(), &locals, r, &recv_counts)?;
            }
            Kind::Broadcast | Kind::Send | Kind::Recv => {
                let [Some(tensor), Some(rank), g, ..] = a else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let Some(rank) = group_rank(rank, g.get()) else { return Ok(false) };
                let Some(t) = f.tensor(tensor) else { return Ok(false) };
                match self {
                    Kind::Broadcast => comm.run_broadcast(py, g.get(), t, rank)?,
                    Kind::Send => comm.run_send(py, g.get(), t, rank)?,
                    _ => comm.run_recv(py, g.get(), t, rank)?,
                }
            }
            Kind::SendRecv => {
                let [Some(send), Some(dst), Some(recv), Some(src), g] = a else { return Ok(false) };
                let Some(g) = f.member_group(g.as_deref()) else { return Ok(false) };
                let (Some(dst), Some(src)) = (group_rank(dst, g.get()), group_rank(src, g.get())) else {
                    return Ok(false);
                };
                let (Some(s), Some(r)) = (f.tensor(send), f.tensor(recv)) else { return Ok(false) };
                // Overlapping tensors: the full path's error names them.
                if crate::coll::overlapping(s, r) {
                    return Ok(false);
                }
                comm.run_sendrecv(py, g.get(), s, dst, r, src)?;
            }
        }
        Ok(true)
    }

    /// The public function's body: the fast path, or the full path with the arguments given.
    fn call(self, py: Python<'_>, a: &Args<'_, '_>) -> PyResult<()> {
        if let Some(fast) = FAST.get(py) {
            if self.try_fast(py, fast, a)? {
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
            self.params().iter().zip(a).skip(leading).filter_map(|(n, v)| Some((*n, v.as_ref()?))).collect();
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
///         float16 and bfloat16 tensors; accumulation stays in full precision. ``"none"``: full
///         precision whatever the default. ``None``: the default from
///         ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`` (unset, or a tensor of another dtype: full
///         precision).
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
    let given = [Some(&tensor), op.0.as_ref(), group.0.as_ref(), low_precision_dtype.0.as_ref(), None];
    Kind::AllReduce.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
}

/// ``input_tensor`` holds ``group_size`` equal parts (in flat element order); group rank r's
/// ``output_tensor`` becomes the reduction of part r over all members.
///
/// Collective over ``group``. ``input_tensor.numel()`` must be ``group_size *
/// output_tensor.numel()`` and both have the same dtype. ``output_tensor`` may be this rank's
/// own part of ``input_tensor`` (in place) or disjoint from it. ``op`` and
/// ``low_precision_dtype`` as in ``shmem_allreduce``.
#[pyfunction]
#[pyo3(
    signature = (output_tensor, input_tensor, op = Given(None), group = Given(None), low_precision_dtype = Given(None)),
    text_signature = "(output_tensor, input_tensor, op='sum', group=None, low_precision_dtype=None)"
)]
pub(crate) fn shmem_reduce_scatter<'py>(
    py: Python<'py>,
    output_tensor: Bound<'py, PyAny>,
    input_tensor: Bound<'py, PyAny>,
    op: Given<'py>,
    group: Given<'py>,
    low_precision_dtype: Given<'py>,
) -> PyResult<()> {
    let given =
        [Some(&output_tensor), Some(&input_tensor), op.0.as_ref(), group.0.as_ref(), low_precision_dtype.0.as_ref()];
    Kind::ReduceScatter.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
}

/// Every member's ``output_tensor`` becomes the concatenation, in group-rank order, of the
/// members' ``input_tensor``.
///
/// Collective over ``group``. ``output_tensor.numel()`` must be ``group_size *
/// input_tensor.numel()`` (the flat layout: with contiguous tensors, the concatenation along
/// dim 0); same dtype. ``input_tensor`` may be this rank's own part of ``output_tensor``.
#[pyfunction]
#[pyo3(
    signature = (output_tensor, input_tensor, group = Given(None)),
    text_signature = "(output_tensor, input_tensor, group=None)"
)]
pub(crate) fn shmem_allgather<'py>(
    py: Python<'py>,
    output_tensor: Bound<'py, PyAny>,
    input_tensor: Bound<'py, PyAny>,
    group: Given<'py>,
) -> PyResult<()> {
    let given = [Some(&output_tensor), Some(&input_tensor), group.0.as_ref(), None, None];
    Kind::AllGather.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
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
#[pyfunction]
#[pyo3(
    signature = (send_tensor_list, receive_tensor, receive_list, group = Given(None)),
    text_signature = "(send_tensor_list, receive_tensor, receive_list, group=None)"
)]
pub(crate) fn shmem_alltoall<'py>(
    py: Python<'py>,
    send_tensor_list: Bound<'py, PyAny>,
    receive_tensor: Bound<'py, PyAny>,
    receive_list: Bound<'py, PyAny>,
    group: Given<'py>,
) -> PyResult<()> {
    let given = [Some(&send_tensor_list), Some(&receive_tensor), Some(&receive_list), group.0.as_ref(), None];
    Kind::AllToAll.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
}

/// Declares the binding of a public function whose parameters are `(tensor, <rank>, group=None)`.
macro_rules! tensor_rank_binding {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $rank:ident, $text_signature:literal) => {
        $(#[$doc])*
        #[pyfunction]
        #[pyo3(signature = (tensor, $rank, group = Given(None)), text_signature = $text_signature)]
        pub(crate) fn $name<'py>(
            py: Python<'py>,
            tensor: Bound<'py, PyAny>,
            $rank: Bound<'py, PyAny>,
            group: Given<'py>,
        ) -> PyResult<()> {
            let given = [Some(&tensor), Some(&$rank), group.0.as_ref(), None, None];
            $kind.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
        }
    };
}

tensor_rank_binding!(
    /// Every member's ``tensor`` becomes group rank ``src_rank``'s ``tensor``. Collective over
    /// ``group``; ``src_rank`` is a rank of ``group`` (global when ``group`` is None).
    shmem_broadcast,
    Kind::Broadcast,
    src_rank,
    "(tensor, src_rank, group=None)"
);

tensor_rank_binding!(
    /// Sends ``tensor`` to ``dst_rank`` (a rank of ``group``), which receives it with
    /// ``shmem_recv`` of the same element count and dtype. Messages between two ranks arrive in
    /// the order they were sent.
    ///
    /// Returns once the data is out of ``tensor``: small messages (up to about 256 KiB) are
    /// buffered at the receiver, larger ones stream as the receiver takes them, so two ranks
    /// that both send a large message to each other before receiving wait for each other (order
    /// them: one sends first). The first call in a group allocates its workspace collectively
    /// (see the README).
    shmem_send,
    Kind::Send,
    dst_rank,
    "(tensor, dst_rank, group=None)"
);

tensor_rank_binding!(
    /// Receives the next message from ``src_rank`` (a rank of ``group``) into ``tensor``.
    ///
    /// The message must have ``tensor``'s element count and dtype; otherwise Mismatch names both
    /// (the message is consumed, and the pair stays usable).
    shmem_recv,
    Kind::Recv,
    src_rank,
    "(tensor, src_rank, group=None)"
);

/// Sends ``send_tensor`` to ``dst_rank`` and receives the next message from ``src_rank`` into
/// ``recv_tensor``, both at once (ranks of ``group``; global when ``group`` is None).
///
/// The two directions move together, so a ring of ranks that each send to the next and receive
/// from the previous needs no ordering, at any size. The messages pair with ``shmem_send`` and
/// ``shmem_recv`` as well: what ``dst_rank`` receives with either, and what ``src_rank`` sent with
/// either. ``recv_tensor`` must not overlap ``send_tensor``; the incoming message must have
/// ``recv_tensor``'s element count and dtype (otherwise Mismatch names both, after the send is
/// complete; the message is consumed and the pair stays usable). ``dst_rank`` and ``src_rank``
/// may be equal, and may be this rank.
#[pyfunction]
#[pyo3(
    signature = (send_tensor, dst_rank, recv_tensor, src_rank, group = Given(None)),
    text_signature = "(send_tensor, dst_rank, recv_tensor, src_rank, group=None)"
)]
pub(crate) fn shmem_sendrecv<'py>(
    py: Python<'py>,
    send_tensor: Bound<'py, PyAny>,
    dst_rank: Bound<'py, PyAny>,
    recv_tensor: Bound<'py, PyAny>,
    src_rank: Bound<'py, PyAny>,
    group: Given<'py>,
) -> PyResult<()> {
    let given = [Some(&send_tensor), Some(&dst_rank), Some(&recv_tensor), Some(&src_rank), group.0.as_ref()];
    Kind::SendRecv.call(py, &given.map(|v| v.map(Bound::as_borrowed)))
}

/// Declares the entry point of a public function (see [`Kind::entry`]).
macro_rules! entry_point {
    ($name:ident, $kind:expr) => {
        /// The entry point of the public function of the same name (see [`Kind::entry`]).
        ///
        /// # Safety
        ///
        /// Called by CPython as a `METH_FASTCALL | METH_KEYWORDS` function, with the GIL held.
        unsafe extern "C" fn $name(
            _module: *mut ffi::PyObject,
            args: *const *mut ffi::PyObject,
            nargsf: ffi::Py_ssize_t,
            kwnames: *mut ffi::PyObject,
        ) -> *mut ffi::PyObject {
            // SAFETY: this function's contract.
            unsafe { $kind.entry(args, nargsf, kwnames) }
        }
    };
}

entry_point!(shmem_allreduce_entry, Kind::AllReduce);
entry_point!(shmem_reduce_scatter_entry, Kind::ReduceScatter);
entry_point!(shmem_allgather_entry, Kind::AllGather);
entry_point!(shmem_alltoall_entry, Kind::AllToAll);
entry_point!(shmem_broadcast_entry, Kind::Broadcast);
entry_point!(shmem_send_entry, Kind::Send);
entry_point!(shmem_recv_entry, Kind::Recv);
entry_point!(shmem_sendrecv_entry, Kind::SendRecv);

/// Adds the public functions to the module `m`: each is its entry point (see [`Kind::entry`]),
/// under the name, signature and documentation of its `#[pyfunction]`, which binds the calls
/// the entry point hands over.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let entries: [(Kind, ffi::PyCFunctionFastWithKeywords, Bound<'_, PyCFunction>); Kind::ALL.len()] = [
        (Kind::AllReduce, shmem_allreduce_entry, wrap_pyfunction!(shmem_allreduce, m)?),
        (Kind::ReduceScatter, shmem_reduce_scatter_entry, wrap_pyfunction!(shmem_reduce_scatter, m)?),
        (Kind::AllGather, shmem_allgather_entry, wrap_pyfunction!(shmem_allgather, m)?),
        (Kind::AllToAll, shmem_alltoall_entry, wrap_pyfunction!(shmem_alltoall, m)?),
        (Kind::Broadcast, shmem_broadcast_entry, wrap_pyfunction!(shmem_broadcast, m)?),
        (Kind::Send, shmem_send_entry, wrap_pyfunction!(shmem_send, m)?),
        (Kind::Recv, shmem_recv_entry, wrap_pyfunction!(shmem_recv, m)?),
        (Kind::SendRecv, shmem_sendrecv_entry, wrap_pyfunction!(shmem_sendrecv, m)?),
    ];
    for (kind, entry, binding) in entries {
        // SAFETY: a function PyO3 made is a `PyCFunctionObject`, whose definition is static
        // (PyO3 keeps it for the life of the process): its name and documentation (with the
        // text signature) are static strings, shared by the entry point's definition.
        let mut def = unsafe { *(*binding.as_ptr().cast::<ffi::PyCFunctionObject>()).m_ml };
        def.ml_meth = ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: entry };
        def.ml_flags = ffi::METH_FASTCALL | ffi::METH_KEYWORDS;
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

#[cfg(test)]
mod tests {
    use super::{int_element, within_storage};
    use crate::comm::Local;
    use symm_core::DType;

    #[test]
    fn counts_are_read_from_every_integer_dtype_and_never_negative() {
        let local = |v: &[u8], dtype: DType| Local { ptr: v.as_ptr() as usize, len: v.len() / dtype.size(), dtype };
        let i64s: Vec<u8> = [3i64, 0, -1].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let t = local(&i64s, DType::I64);
        assert_eq!([0, 1, 2].map(|i| int_element(t, i)), [Some(3), Some(0), None]);
        // unaligned: one byte into the buffer
        let i32s: Vec<u8> = [0u8].into_iter().chain([7i32, -2].iter().flat_map(|v| v.to_ne_bytes())).collect();
        let t = local(&i32s[1..], DType::I32);
        assert_eq!([0, 1].map(|i| int_element(t, i)), [Some(7), None]);
        let i16s: Vec<u8> = [300i16].iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(int_element(local(&i16s, DType::I16), 0), Some(300));
        assert_eq!(int_element(local(&[0xff], DType::I8), 0), None);
        assert_eq!(int_element(local(&[0xff], DType::U8), 0), Some(255));
        assert_eq!(int_element(local(&[1], DType::Bool), 0), Some(1));
        let f32s = 2.0f32.to_ne_bytes();
        assert_eq!(int_element(local(&f32s, DType::F32), 0), None); // floats are not counts
    }

    #[test]
    fn the_fast_path_checks_offset_and_elements_against_the_storage() {
        assert!(within_storage(0x1000, 16, DType::F32, 0, 64));
        assert!(within_storage(0x1010, 12, DType::F32, 4, 64));
        assert!(!within_storage(0x1010, 13, DType::F32, 4, 64)); // one element past the end
        assert!(!within_storage(0x1000, 16, DType::F32, 0, 0)); // storage freed by resize_(0)
        assert!(!within_storage(0, 16, DType::F32, 0, 64)); // no memory behind it
        assert!(!within_storage(0x1000, 1, DType::F32, -1, 64)); // offsets are never negative
        assert!(!within_storage(0x1000, 1, DType::F32, 0, -1));
        assert!(!within_storage(0x1000, usize::MAX, DType::F32, 1, i64::MAX)); // no overflow
    }
}
