//! Reading the framework's tensors without the platform adapter: the exact type is compared by
//! identity with the types the platform handed over once; layout, device, dtype, contiguity,
//! size, address, and where the data lies in its storage (see [`within_storage`]) are read
//! through torch's stable C shim ([`Shim`]: C calls on the `at::Tensor` the tensor object
//! holds, at an offset found by probing at start-up, or else on one read through `_cdata`),
//! or, where the shim is missing or does not read the probe tensors right, by calling the C
//! functions behind the tensor type's descriptors ([`Attr`]: what `Tensor.data_ptr(t)` calls,
//! without an attribute lookup per call; an instance attribute shadowing one of those methods
//! is not consulted). Whatever these readers do not recognise takes the full path, which
//! describes the tensor through the platform and reports why it is refused.
//!
//! A tensor that requires grad while grad mode is on takes the full path too, which records the
//! call's backward (`symm.autograd`); [`Grad`] tells such tensors apart at the cost of one word
//! read for tensors that have never had autograd metadata.

use std::ffi::c_void;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use symm_core::DType;

use crate::comm::Local;

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
/// [`Reader::new`] checks that either way reads every probe tensor the way the descriptors
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

    /// As [`Reader::tensor`], through the shim (the tensor's type is already checked: one of
    /// the types [`Shim::find_handle`] looked at). Inlined into the call, as [`Shim::read`]
    /// and [`Reader::tensor`] (see the module documentation).
    ///
    /// With `grad`, a tensor that requires grad while grad mode is on is refused as well
    /// ([`Grad::records`]); without, the tensor is only read (the check against the probes).
    #[inline(always)]
    fn tensor(&self, tensor: &Bound<'_, PyAny>, grad: Option<&Grad>) -> Option<Local> {
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
                let imp = unsafe { handle.cast::<usize>().read() };
                if imp == 0 {
                    return None;
                }
                // SAFETY: `imp` is the `TensorImpl` of `tensor`, which the caller holds.
                if grad.is_some_and(|g| unsafe { g.records(tensor, Some(imp)) }) {
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
                // SAFETY: `imp` is the `TensorImpl` of `tensor`, which the caller holds.
                if grad.is_some_and(|g| unsafe { g.records(tensor, Some(imp as usize)) }) {
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

    /// The checked local range of the tensor `handle` points to (see [`Reader::tensor`]).
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

/// `bool aoti_torch_grad_mode_is_enabled(void)` of torch's C shim: whether grad mode is on in
/// this thread (`torch.is_grad_enabled()`).
type GradMode = unsafe extern "C" fn() -> bool;

/// The words of a `TensorImpl` searched for its autograd metadata ([`Grad::find_meta`]): the
/// first ones after the virtual table (every `TensorImpl` is far larger: its reference counts,
/// storage, autograd and extra metadata, version counter, Python object slot, sizes and
/// strides, ...).
const META_WORDS: std::ops::Range<usize> = 1..8;

/// Which tensors the fast path leaves to the full path because the call must record its
/// backward: a tensor that requires grad while grad mode is on (the full path hands such calls
/// to `symm.autograd`, which records the call as an in-place operation of autograd).
///
/// `requires_grad` is `TensorImpl::autograd_meta_ && autograd_meta_->requires_grad()` in torch:
/// a tensor without autograd metadata (a null pointer in its `TensorImpl`: every tensor a
/// factory made outside autograd, which never required grad nor is a view) cannot require
/// grad. So the fast path reads that one word, at the offset probed at start-up
/// ([`Grad::find_meta`]), in memory the shim reads anyway; only a tensor that has metadata (a
/// view, a tensor that requires or required grad) costs more: grad mode through the shim, then
/// the tensor's `requires_grad` getter (about 20 ns), only while grad mode is on.
#[derive(Debug, Default)]
pub(crate) struct Grad {
    /// The byte offset of `autograd_meta_` in a `TensorImpl`, when the probes single it out;
    /// 0: not found (every tensor is asked).
    meta_at: usize,
    /// The shim's grad-mode query.
    mode: Option<GradMode>,
    /// Where the shim has none: the framework's (`torch.is_grad_enabled`), asked after the
    /// tensor; `None` as well: every tensor that requires grad takes the full path.
    mode_call: Option<Py<PyAny>>,
    /// The tensor type's `requires_grad` getter; `None`: a tensor that may require grad while
    /// grad mode is on takes the full path (which asks it).
    requires_grad: Option<Attr>,
}

impl Grad {
    /// From the platform's shim description: `grad_mode` (the address of
    /// `aoti_torch_grad_mode_is_enabled`) and `grad_probes` (`(plain, with_grad)`: tensors
    /// without autograd metadata, and tensors that require grad), with the `requires_grad`
    /// getter of the tensor type `ty`.
    fn new(ty: &Bound<'_, PyType>, spec: Option<&Bound<'_, PyDict>>, shim: Option<&Shim>) -> PyResult<Grad> {
        let mut grad = Grad { requires_grad: Attr::find(ty, "requires_grad", false), ..Grad::default() };
        // The tensor type's framework (`torch`), loaded: its `is_grad_enabled`.
        let framework = ty.getattr("__module__").and_then(|m| ty.py().import(m.cast_into::<PyString>()?));
        grad.mode_call = framework.and_then(|m| m.getattr("is_grad_enabled")).ok().map(Bound::unbind);
        let Some(spec) = spec else { return Ok(grad) };
        if let Some(addr) = spec.get_item("grad_mode")?.and_then(|a| a.extract::<usize>().ok()).filter(|&a| a != 0) {
            // SAFETY: the address of `aoti_torch_grad_mode_is_enabled`, which the platform looked
            // up in the libtorch this process loaded (the contract of `enable_fast_path`); its C
            // signature is `bool (void)` (shim.h).
            grad.mode = Some(unsafe { std::mem::transmute::<*const (), GradMode>(addr as *const ()) });
        }
        if let (Some(shim), Some(probes)) = (shim, spec.get_item("grad_probes")?) {
            let (plain, with_grad) = probes.extract::<(Vec<Bound<'_, PyAny>>, Vec<Bound<'_, PyAny>>)>()?;
            grad.meta_at = Grad::find_meta(shim, &plain, &with_grad).unwrap_or(0);
        }
        Ok(grad)
    }

    /// The offset of `autograd_meta_` in a `TensorImpl`: the one word among [`META_WORDS`] that
    /// is null in every tensor of `plain` and set in every tensor of `with_grad` (which must all
    /// require grad); `None` unless both lists have tensors and exactly one word fits.
    fn find_meta(shim: &Shim, plain: &[Bound<'_, PyAny>], with_grad: &[Bound<'_, PyAny>]) -> Option<usize> {
        const WORD: usize = std::mem::size_of::<usize>();
        if plain.is_empty() || with_grad.is_empty() {
            return None;
        }
        let imp = |t: &Bound<'_, PyAny>| shim.cdata.read(t).ok()?.extract::<usize>().ok().filter(|&i| i != 0);
        let mut fits: Vec<usize> = META_WORDS.map(|w| w * WORD).collect();
        for (probes, set) in [(plain, false), (with_grad, true)] {
            for p in probes {
                if set && !p.getattr("requires_grad").and_then(|r| r.is_truthy()).ok()? {
                    return None;
                }
                let imp = imp(p)?;
                // SAFETY: `imp` is the live `TensorImpl` of `p` (held by `probes`), which spans
                // more than the words of `META_WORDS` (see there).
                fits.retain(|&at| (unsafe { ((imp + at) as *const usize).read() } != 0) == set);
            }
        }
        match fits[..] {
            [at] => Some(at),
            _ => None,
        }
    }

    /// Whether `tensor` requires grad while grad mode is on (the call must take the full path),
    /// answered from its `TensorImpl` at `imp` when given: no autograd metadata, no grad.
    ///
    /// # Safety
    ///
    /// `imp`, when given, is the live `TensorImpl` of `tensor`, which the caller holds.
    #[inline(always)]
    unsafe fn records(&self, tensor: &Bound<'_, PyAny>, imp: Option<usize>) -> bool {
        if let Some(imp) = imp.filter(|_| self.meta_at != 0) {
            // SAFETY: `imp` is a live `TensorImpl` (the caller's contract), which spans more
            // than the words of `META_WORDS`; `meta_at` is one of them. Another thread setting
            // `requires_grad_` on this tensor during the call is a race the caller made, as
            // with any torch operation.
            if unsafe { ((imp + self.meta_at) as *const usize).read() } == 0 {
                return false;
            }
        }
        self.asked(tensor)
    }

    /// Grad mode (the shim's), then `tensor.requires_grad`, then grad mode (the framework's,
    /// where the shim has none). A getter or query that fails counts as true (the full path asks
    /// again).
    #[cold]
    #[inline(never)]
    fn asked(&self, tensor: &Bound<'_, PyAny>) -> bool {
        // SAFETY: the shim's function (see `Grad::new`), which takes no argument and only reads
        // the calling thread's grad mode.
        if self.mode.is_some_and(|mode| !unsafe { mode() }) {
            return false;
        }
        // SAFETY: `Py_False` is the address of the `False` singleton.
        let no = unsafe { ffi::Py_False() };
        let requires = |getter: &Attr| getter.read(tensor).map_or(true, |v| v.as_ptr() != no);
        if !self.requires_grad.as_ref().is_none_or(requires) {
            return false;
        }
        match (&self.mode, &self.mode_call) {
            (None, Some(call)) => call.bind(tensor.py()).call0().map_or(true, |on| on.as_ptr() != no),
            _ => true,
        }
    }
}

/// How the fast path reads the platform's tensors: what the platform handed over once
/// (`Platform.fast_path()`), checked against its probe tensors.
#[derive(Debug)]
pub(crate) struct Reader {
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
    /// ([`Reader::counts`]); `None`: such tensors are measured with `len()`.
    shape: Option<Attr>,
    /// Which tensors must record a backward (they take the full path).
    grad: Grad,
}

impl Reader {
    /// The reader of the platform's `types`, or `None` when they do not read the torch way (the
    /// fast path then stays off). Dtype names that do not parse are left out (their tensors take
    /// the full path, which reports them). The shim is kept only when it reads each of `probes`
    /// exactly as the descriptors do.
    pub(crate) fn new(
        types: Vec<Bound<'_, PyType>>,
        dtypes: &Bound<'_, PyDict>,
        shim: Option<Bound<'_, PyDict>>,
        probes: &[Bound<'_, PyAny>],
    ) -> PyResult<Option<Reader>> {
        let Some(first) = types.first().cloned() else { return Ok(None) };
        let Some(attrs) = Attrs::find(&first) else { return Ok(None) };
        let types = types.into_iter().filter(|t| Attrs::find(t).is_some_and(|a| a.same(&attrs)));
        let mut table = Vec::with_capacity(dtypes.len());
        for (obj, name) in dtypes.iter() {
            if let Ok(d) = name.extract::<String>()?.parse::<DType>() {
                table.push((obj.unbind(), d));
            }
        }
        let shim_spec = shim;
        let shim = match &shim_spec {
            Some(spec) => Shim::new(&first, spec)?,
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
        let shape = Attr::find(&first, "shape", false);
        let grad = Grad::new(&first, shim_spec.as_ref(), shim.as_ref())?;
        let mut reader = Reader { types, attrs, storage, shim: None, dtypes: table, shape, grad };
        if let Some(mut shim) = shim {
            let agrees = |shim: &Shim| {
                !probes.is_empty()
                    && probes.iter().all(|t| {
                        let ty = t.get_type_ptr();
                        let known = reader.types.iter().any(|k| k.as_ptr().cast() == ty);
                        !known || shim.tensor(t, None) == reader.by_descriptors(t)
                    })
            };
            if agrees(&shim) {
                shim.handle_at = shim.find_handle(&reader.types, probes);
                if shim.handle_at.is_some() && !agrees(&shim) {
                    shim.handle_at = None;
                }
                reader.shim = Some(shim);
            }
        }
        Ok(Some(reader))
    }

    /// How tensors are read: `"handle"` (torch's C shim on the `at::Tensor` in the object),
    /// `"shim"` (torch's C shim, through `_cdata`) or `"descriptors"`.
    pub(crate) fn kind(&self) -> &'static str {
        match &self.shim {
            Some(Shim { handle_at: Some(_), .. }) => "handle",
            Some(_) => "shim",
            None => "descriptors",
        }
    }

    /// `tensor` as a checked local range when it is a plain contiguous CPU tensor of a supported
    /// dtype whose data lies within its storage (what `Platform.describe` and the communicator
    /// check on the full path); `None`
    /// for anything else, including a tensor whose attributes raise (the exception is dropped:
    /// the full path reads the tensor again and reports it).
    #[inline(always)]
    pub(crate) fn tensor(&self, tensor: &Bound<'_, PyAny>) -> Option<Local> {
        let ty = tensor.get_type_ptr();
        if !self.types.iter().any(|t| t.as_ptr().cast() == ty) {
            return None;
        }
        match &self.shim {
            Some(shim) => shim.tensor(tensor, Some(&self.grad)),
            // Rebuilt field by field: taken as the call returns it (through memory), the two
            // arms would meet in memory, where the shim's answer is written with a byte store
            // and copied with a word load (a store-forwarding stall in every call).
            None => {
                // SAFETY: no `TensorImpl` given.
                if unsafe { self.grad.records(tensor, None) } {
                    return None;
                }
                let l = self.by_descriptors(tensor)?;
                Some(Local { ptr: l.ptr, len: l.len, dtype: l.dtype })
            }
        }
    }

    /// As [`Reader::tensor`], through the descriptors (the tensor's type is already checked).
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

    /// `n` element counts given as one integer tensor with `n` elements whose first dimension
    /// is `n` (1-D, or `(n, 1, ...)`), as HyperParallel passes them; `None` for anything else,
    /// including a negative count (the full path reports it).
    pub(crate) fn counts(&self, tensor: &Bound<'_, PyAny>, n: usize) -> Option<Vec<usize>> {
        let t = self.tensor(tensor)?;
        // The first dimension (none for a 0-d tensor), what `len()` gives, read through `shape`
        // (a getter in C; `len()` is Python code and `size()` parses its arguments, each of them
        // costing more than the collective).
        let first = match &self.shape {
            Some(shape) => shape.read(tensor).ok()?.cast_into::<PyTuple>().ok()?.get_item(0).ok()?.extract().ok()?,
            None => tensor.len().ok()?,
        };
        if t.len != n || first != n {
            return None;
        }
        (0..n).map(|i| int_element(t, i)).collect()
    }
}

/// Element `i` (< `t.len`) of the integer tensor `t`, when it is a count (`>= 0`); `None` for a
/// floating dtype or a negative value.
pub(crate) fn int_element(t: Local, i: usize) -> Option<usize> {
    let at = (t.ptr + i * t.dtype.size()) as *const u8;
    // SAFETY: `t` is a tensor the fast path read ([`Reader::tensor`]): `t.len` elements of
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
