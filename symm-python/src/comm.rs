//! The native communicator, its groups and its heap blocks, framework-neutral.
//!
//! The native module never sees a framework tensor: the platform adapter (`symm/platform/*.py`)
//! describes each tensor as a [`Desc`] tuple and wraps heap blocks into tensors itself, so a
//! second framework (MindSpore) needs no change here. Every check that can name an argument is
//! done here, with the names of the Python API, so every framework gets the same messages.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyType};
use symm_core::backend::MemorySpace;
use symm_core::bootstrap::JobSecret;
use symm_core::buffer::{check_dtype, check_range};
use symm_core::{
    ArgError, AtRank, Backend, Bootstrap, CmpOp, Communicator, DType, Error, Event, Group, GroupError, HeapError,
    LocalMut, LocalRef, Rank, SignalOp, Stream, StreamBackend, StreamCommunicator, SymmBuffer, SymmetricHeap,
};
use symm_registry::{BackendControl, Comm, CommConfig};

use crate::errors::{self, invalid, IntoPyResult};
use crate::fast::{self, FastSpec};
use crate::registry::{Miss, Registry};
use crate::store::PyStore;
use crate::work::{AsyncOps, Held, PyWork};

/// A communicator and the allocations reachable from Python. Heap blocks hold it too, so the
/// heap stays mapped while any tensor still points into it.
#[derive(Debug)]
pub(crate) struct Shared {
    comm: Comm,
    registry: Registry,
    /// The asynchronous operations (`async_op=True`) and their stream.
    asyncs: AsyncOps,
}

/// A tensor as the platform adapter describes it:
/// `(data_ptr, numel, dtype, is_contiguous, device, layout, (storage_ptr, storage_nbytes))`.
///
/// `dtype` is the framework's spelling (`"torch.bfloat16"`, `"bfloat16"`); `device` the device
/// type (`"cpu"`); `layout` a description of shape and strides, given for non-contiguous
/// tensors so that the error can show it; the storage is the memory the tensor's data lies in
/// as the framework allocated it (read from the framework's own tensor, not from methods a
/// subclass may override): `(0, 0)` for a tensor without real storage (a FakeTensor, a wrapper
/// subclass, storage freed by `untyped_storage().resize_(0)`).
///
/// SAFETY contract of the private native API: for as long as the call runs, the storage range
/// is host memory (when `device` is `"cpu"`) that the tensor object the public function's
/// caller holds (the argument itself) keeps alive. [`PyCommunicator::local`] accepts
/// `data_ptr` for `numel` elements of `dtype` only when they lie within that range (see
/// [`check_storage`]), so a descriptor that misreports the pointer or the element count is
/// refused instead of read.
#[derive(Debug, FromPyObject)]
pub(crate) struct Desc(usize, usize, String, bool, String, Option<String>, (usize, usize));

/// Why `bytes` bytes at `ptr` are not memory a tensor may be read or written at, given the
/// storage range `storage` (address, bytes) it must lie in; `None` when they are (an empty
/// range always is: nothing is read or written).
///
/// A null pointer with elements is a tensor without real storage (FakeTensor, meta and wrapper
/// subclasses, storage freed with `resize_(0)`); a range past its storage is a view whose
/// storage shrank, or metadata (`numel`, `data_ptr`, `storage_offset`) that misreports it.
pub(crate) fn check_storage(ptr: usize, bytes: usize, storage: (usize, usize)) -> Option<String> {
    if bytes == 0 {
        return None;
    }
    let (base, size) = storage;
    if ptr == 0 {
        return Some(
            "has no memory behind it (data pointer 0 with elements to move): a tensor without real storage \
             (a FakeTensor as torch.compile traces with, a meta tensor, a wrapper subclass such as DTensor: pass \
             its local tensor; or storage freed with untyped_storage().resize_(0)) cannot be communicated"
                .into(),
        );
    }
    let start = ptr.wrapping_sub(base);
    if ptr < base || start > size || bytes > size - start {
        return Some(format!(
            "reaches outside its storage: bytes [{ptr:#x}, {:#x}) against a storage of {size} bytes at {base:#x} \
             (a view whose storage was shrunk or freed with untyped_storage().resize_(), or a tensor whose \
             numel()/data_ptr()/storage_offset() misreport)",
            ptr as u128 + bytes as u128
        ));
    }
    None
}

/// The device type of the memory `comm` moves, as the platform names it: `"cpu"` for a host
/// heap, `"npu"` for the Ascend backend's device heap.
fn device_type(comm: &Comm) -> &'static str {
    match (comm.heap_space(), comm.backend_name()) {
        (MemorySpace::Host, _) => "cpu",
        (MemorySpace::Device, "ascend") => "npu",
        (MemorySpace::Device, other) => other,
    }
}

/// A checked local memory range: address, elements, dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Local {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl Local {
    pub(crate) fn bytes(self) -> usize {
        self.len * self.dtype.size()
    }

    /// The range as a buffer the core reads.
    ///
    /// # Safety
    /// The range is the memory of a tensor held for as long as the buffer is used (the [`Desc`]
    /// contract), which nothing writes meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn reader<'a>(self) -> LocalRef<'a> {
        // SAFETY: host memory of `len` elements of `dtype` (checked by `PyCommunicator::local`),
        // held and unwritten as the caller promises.
        unsafe { LocalRef::from_raw(self.ptr as *const u8, self.len, self.dtype) }
    }

    /// The range as a buffer the core writes.
    ///
    /// # Safety
    /// As [`Local::reader`], and nothing else reads or writes the range while the buffer is used.
    #[inline(always)]
    pub(crate) unsafe fn writer<'a>(self) -> LocalMut<'a> {
        // SAFETY: as in `reader`, and used by nothing else, as the caller promises.
        unsafe { LocalMut::from_raw(self.ptr as *mut u8, self.len, self.dtype) }
    }
}

/// The symmetric-memory communicator of this process (created by [`init`]).
///
/// Ranks and groups are *native* ranks: positions in the job `init` was called for. Offsets
/// and sizes are elements; every blocking call releases the GIL.
#[pyclass(frozen, module = "symm._symm", name = "Communicator")]
#[derive(Debug)]
pub struct PyCommunicator {
    sh: Arc<Shared>,
}

/// A group of native ranks, in group order (cached: the same list gives the same group).
#[pyclass(frozen, module = "symm._symm", name = "Group")]
#[derive(Debug)]
pub struct PyGroup {
    g: Group,
}

/// One collective allocation: this rank's copy, exported through the buffer protocol
/// (writable bytes), so a framework can wrap it without copying.
///
/// The block keeps the heap mapped while it lives. When it is garbage-collected without
/// `Communicator.free`, the rank drops the allocation (locally, without waiting: see
/// `SymmetricHeap::abandon`); the group's next collective allocation or free reclaims its
/// range once every member has dropped it.
#[pyclass(frozen, module = "symm._symm", name = "HeapBlock")]
#[derive(Debug)]
pub struct HeapBlock {
    sh: Arc<Shared>,
    id: u64,
    offset: usize,
    numel: usize,
    dtype: DType,
    group: Group,
}

/// A dtype's name; `at` prefixes the value the error shows (the entry of a list argument).
fn dtype_arg(py: Python<'_>, rank: Rank, arg: &'static str, text: &str, at: &str) -> PyResult<DType> {
    text.parse::<DType>().map_err(|_| {
        let accepted = DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ");
        invalid(py, rank, arg, format!("{at}{text}"), &format!("unsupported dtype; supported: {accepted}"))
    })
}

pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "<unprintable>".into())
}

/// An integer argument (a Python int, or anything with `__index__`).
pub(crate) fn int_arg(py: Python<'_>, rank: Rank, arg: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| invalid(py, rank, arg, repr(obj), "expected an integer that fits in int64"))
}

/// A non-negative element offset or count.
fn count_arg(py: Python<'_>, rank: Rank, arg: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let v = int_arg(py, rank, arg, obj)?;
    usize::try_from(v).map_err(|_| invalid(py, rank, arg, v, "must be >= 0 (offsets and sizes count elements)"))
}

/// An op code given as its number or its name.
pub(crate) fn code_arg<T: std::str::FromStr<Err = ArgError>>(
    py: Python<'_>,
    rank: Rank,
    arg: &'static str,
    obj: &Bound<'_, PyAny>,
    from_code: impl Fn(i64) -> Result<T, ArgError>,
) -> PyResult<T> {
    let parsed = if let Ok(s) = obj.cast::<PyString>() {
        s.to_str()?.parse::<T>()
    } else {
        from_code(int_arg(py, rank, arg, obj)?)
    };
    parsed.map_err(|e| invalid(py, rank, arg, repr(obj), &e.to_string()))
}

/// The longest wait accepted (about 31 years): a deadline further away could overflow the
/// clock arithmetic of the wait, and no caller means it.
const MAX_WAIT: Duration = Duration::from_secs(1_000_000_000);

/// A timeout: None (the default bound), seconds (int or float), or a `datetime.timedelta`.
pub(crate) fn timeout_arg(py: Python<'_>, rank: Rank, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let parsed = match obj.extract::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).ok(),
        Err(_) => obj.extract::<Duration>().ok(),
    };
    match parsed {
        Some(d) if d <= MAX_WAIT => Ok(Some(d)),
        _ => Err(invalid(
            py,
            rank,
            "timeout",
            repr(obj),
            "expected seconds (0 to 1e9) or a non-negative datetime.timedelta",
        )),
    }
}

impl PyCommunicator {
    pub(crate) fn comm(&self) -> &Comm {
        &self.sh.comm
    }

    /// The device type of the memory this communicator moves ([`device_type`]).
    pub(crate) fn device_type(&self) -> &'static str {
        device_type(self.comm())
    }

    /// The stream a call runs on: for a device communicator, the caller's `stream` (the
    /// platform's current stream as an address, which every call on device memory passes),
    /// adopted, so that the call is ordered with the caller's own device work; `None` for the
    /// CPU backend, whose calls take no stream.
    pub(crate) fn caller_stream(&self, py: Python<'_>, stream: Option<usize>) -> PyResult<Option<Stream>> {
        let me = self.rank_id();
        match (self.comm().heap_space(), stream) {
            (MemorySpace::Host, None) => Ok(None),
            (MemorySpace::Host, Some(raw)) => Err(invalid(
                py,
                me,
                "stream",
                format!("{raw:#x}"),
                "the CPU backend runs its calls on its own streams: pass no stream",
            )),
            (MemorySpace::Device, None) => Err(invalid(
                py,
                me,
                "stream",
                "None",
                "a call on device memory runs on the caller's stream (the platform's current stream): pass it",
            )),
            (MemorySpace::Device, Some(raw)) => {
                // SAFETY: the platform's streams (torch_npu's default and pooled streams) live as
                // long as the process's device context, which outlives the communicator; a null
                // handle is refused by the backend.
                unsafe { self.comm().adopt_stream(raw as *mut c_void) }.map(Some).py(py)
            }
        }
    }

    /// A call on device memory, enqueued by `enqueue` on the caller's `stream`: with `held`
    /// (`async_op`), an asynchronous operation whose work holds those tensors; otherwise the
    /// call waits for it with the GIL released and raises its error, so that it returns once
    /// the data has moved, as on the CPU, and in the caller's stream order.
    #[allow(clippy::too_many_arguments)] // the operation, its stream, tensors and enqueue
    pub(crate) fn run_on_stream(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        stream: Stream,
        op: &'static str,
        held: Option<Vec<Held>>,
        outputs: &[&str],
        enqueue: impl FnOnce(&Comm, &Stream) -> symm_core::Result<Event>,
    ) -> PyResult<Option<Py<PyWork>>> {
        let this = slf.get();
        if let Some(held) = held {
            return this.asyncs().start_on(slf, Some(stream), op, held, outputs, enqueue).map(Some);
        }
        let comm = this.comm();
        let event = enqueue(comm, &stream).py(py)?;
        // Twice the bound of the operation's own waits, which fail first with what they waited
        // for: this one only catches a stream that never reaches the operation.
        let bound = comm.default_timeout().saturating_mul(2);
        py.detach(|| comm.synchronize_event(&event, bound)).py(py).map(|()| None)
    }

    pub(crate) fn rank_id(&self) -> Rank {
        self.sh.comm.rank()
    }

    /// What this communicator shares with its heap blocks (for objects that must keep the
    /// heaps mapped while they live).
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.sh.clone()
    }

    /// The live allocation holding the `bytes` bytes at heap offset `offset`: its heap offset
    /// and its size in bytes.
    pub(crate) fn allocation_at(&self, offset: usize, bytes: usize) -> Option<(usize, usize)> {
        self.sh.registry.find(offset, bytes).ok().map(|f| (f.start, f.bytes))
    }

    /// Its asynchronous operations.
    #[inline(always)]
    pub(crate) fn asyncs(&self) -> &AsyncOps {
        &self.sh.asyncs
    }

    /// The tensors an asynchronous put, get or put-with-signal holds (`hold`: `src`, its work's
    /// result, then `target` and `signal`), `src`'s memory as `local`: the only memory of this
    /// rank the operation touches (the symmetric ones are written or read on the peer).
    fn held(&self, hold: Vec<Bound<'_, PyAny>>, local: Local) -> Vec<Held> {
        let remote = Local { len: 0, ..local };
        let held = |(i, (obj, arg)): (usize, (Bound<'_, PyAny>, &'static str))| Held {
            arg,
            entry: None,
            obj: obj.unbind(),
            local: if i == 0 { local } else { remote },
        };
        hold.into_iter().zip(["src", "target", "signal"]).enumerate().map(held).collect()
    }

    /// Checks a tensor the operation reads or writes locally: host memory, contiguous, a
    /// supported dtype, its elements within its storage ([`check_storage`]).
    pub(crate) fn local(&self, py: Python<'_>, d: &Desc, arg: &'static str) -> PyResult<Local> {
        self.local_at(py, d, arg, None)
    }

    /// As [`PyCommunicator::local`] for entry `entry` of a list argument (the message names
    /// the entry).
    pub(crate) fn local_at(
        &self,
        py: Python<'_>,
        d: &Desc,
        arg: &'static str,
        entry: Option<usize>,
    ) -> PyResult<Local> {
        let rank = self.rank_id();
        let Desc(ptr, len, dtype, contiguous, device, layout, storage) = d;
        let at = entry.map(|i| format!("entry {i}: ")).unwrap_or_default();
        let mine = self.device_type();
        if device != mine {
            let moves = if mine == "cpu" {
                "this backend moves host memory: pass CPU tensors".to_string()
            } else {
                format!("this communicator moves {mine} memory: every tensor of a call on one device")
            };
            let err = Error::Unsupported {
                rank,
                backend: self.comm().backend_name(),
                what: format!(
                    "{arg}{} on device {device:?} ({moves})",
                    entry.map(|i| format!("[{i}]")).unwrap_or_default()
                ),
            };
            return Err(errors::to_py(py, &err));
        }
        // The error for the tensor shown as `shown`, refused for `why`.
        let refused = |shown: &dyn std::fmt::Display, why: &str| -> PyResult<Local> {
            Err(invalid(py, rank, arg, format!("{at}{shown}"), why))
        };
        if !contiguous {
            let shown = layout.as_deref().unwrap_or("a non-contiguous tensor");
            return refused(&shown, "must be contiguous (call .contiguous() first)");
        }
        let dtype = dtype_arg(py, rank, arg, dtype, &at)?;
        let Some(bytes) = len.checked_mul(dtype.size()) else { return refused(len, "too many elements") };
        if let Some(why) = check_storage(*ptr, bytes, *storage) {
            return refused(&format_args!("{len} x {dtype} at {ptr:#x}"), &why);
        }
        Ok(Local { ptr: *ptr, len: *len, dtype })
    }

    /// Checks a tensor that must be symmetric memory and returns the buffer it covers (a view
    /// of one live allocation, with the tensor's own dtype, offset and length).
    pub(crate) fn symmetric(&self, py: Python<'_>, d: &Desc, arg: &'static str) -> PyResult<SymmBuffer> {
        let rank = self.rank_id();
        let l = self.local(py, d, arg)?;
        let bytes = l.bytes();
        let base = self.comm().local_heap_base() as usize;
        let heap = self.comm().heap_size();
        // The error for this tensor, refused for `why`.
        let refused = |why: &str| -> PyResult<SymmBuffer> {
            Err(invalid(py, rank, arg, format!("tensor at {:#x} ({} x {})", l.ptr, l.len, l.dtype), why))
        };
        let offset = match l.ptr.checked_sub(base) {
            Some(off) if off < heap => off,
            _ => {
                return refused(&format!(
                    "not a symmetric tensor: its memory lies outside this rank's symmetric heap \
                     [{base:#x}, {:#x}); allocate it with symm.empty()",
                    base + heap
                ))
            }
        };
        if offset % l.dtype.size() != 0 {
            return refused("is not aligned to its dtype inside the symmetric heap");
        }
        match self.sh.registry.find(offset, bytes) {
            Ok(found) => Ok(SymmBuffer::from_parts(self.comm().instance_id(), found.group, offset, l.len, l.dtype)),
            Err(Miss::NotAllocated) => {
                refused("lies in the symmetric heap but in no live allocation (was it freed with symm.free()?)")
            }
            Err(Miss::Overruns { start, bytes: len }) => refused(&format!(
                "runs past the end of its symmetric allocation ({len} bytes at heap offset {start:#x})"
            )),
        }
    }

    /// The arguments a put, get or put-with-signal share, converted and checked with the names
    /// of the Python arguments (the core checks again, with its own names, and then finds
    /// nothing to reject).
    #[allow(clippy::too_many_arguments)] // the transfer's own arguments, checked together
    fn transfer(
        &self,
        py: Python<'_>,
        group: &Group,
        target: &Desc,
        target_offset: &Bound<'_, PyAny>,
        src: &Desc,
        src_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        target_rank: &Bound<'_, PyAny>,
    ) -> PyResult<Transfer> {
        let me = self.rank_id();
        let t = Transfer {
            target: self.symmetric(py, target, "target")?,
            src: self.local(py, src, "src")?,
            target_offset: count_arg(py, me, "target_offset", target_offset)?,
            src_offset: count_arg(py, me, "src_offset", src_offset)?,
            size: count_arg(py, me, "size", size)?,
            target_rank: int_arg(py, me, "target_rank", target_rank)?,
        };
        let check = || -> Result<(), Error> {
            group.member().at(me)?;
            let (_, peer) = group.resolve("target_rank", t.target_rank).at(me)?;
            if t.target.group().to_local(peer).is_none() {
                return Err(GroupError::BufferNotOnRank {
                    arg: "target",
                    alloc_ranks: t.target.group().ranks().to_vec(),
                    target: peer,
                })
                .at(me);
            }
            check_dtype("src", t.src.dtype, t.target.dtype()).at(me)?;
            check_range("target_offset/size", t.target_offset, t.size, t.target.len()).at(me)?;
            check_range("src_offset/size", t.src_offset, t.size, t.src.len).at(me)
        };
        check().py(py)?;
        self.asyncs().check(py, self.comm(), "src", None, &t.src)?;
        Ok(t)
    }
}

/// The checked arguments of a put, get or put-with-signal.
struct Transfer {
    target: SymmBuffer,
    src: Local,
    target_offset: usize,
    src_offset: usize,
    size: usize,
    /// Checked to be a rank of the group (so it converts to `usize`).
    target_rank: i64,
}

#[pymethods]
impl PyCommunicator {
    /// This process's native rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank_id().0
    }

    /// Number of native ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.comm().world_size()
    }

    /// Bytes of symmetric heap per rank (`SYMMETRIC_MEMORY_HEAP_SIZE`).
    #[getter]
    fn heap_size(&self) -> usize {
        self.comm().heap_size()
    }

    /// The backend's name (`"sim"`: CPU shared memory; `"ascend"`).
    #[getter]
    fn backend(&self) -> &'static str {
        self.comm().backend_name()
    }

    /// The device type of the tensors it moves, as the platform names it (`"cpu"`, `"npu"`).
    #[getter]
    fn device(&self) -> &'static str {
        self.device_type()
    }

    /// Whether calls check their tensors against the operations in flight, symm's and other
    /// libraries' (`SYMM_VALIDATE=1`).
    #[getter]
    fn validates(&self) -> bool {
        self.comm().settings().is_some_and(|s| s.validate)
    }

    /// How symm's asynchronous operation still in flight whose memory overlaps the `nbytes`
    /// bytes at address `ptr` is shown, or `None`: the interop guard's check before another
    /// library's call (`symm._interop`).
    fn in_flight_clash(&self, ptr: usize, nbytes: usize) -> Option<String> {
        self.asyncs().clash(self.comm(), ptr, nbytes)
    }

    /// The bound of waits given no timeout, in seconds (`SYMMETRIC_MEMORY_TIMEOUT`).
    #[getter]
    fn default_timeout(&self) -> f64 {
        self.comm().default_timeout().as_secs_f64()
    }

    /// Each native rank's host identity (hostname and boot id, or `SYMM_HOST_ID`), as the ranks
    /// exchanged at start-up: ranks with the same identity share a node (`symm.hier`).
    #[getter]
    fn hosts(&self) -> Vec<String> {
        self.comm().hosts().to_vec()
    }

    /// `op` (a name or a code) checked as the collectives check it, by its name (`"avg"`):
    /// InvalidArgument naming `op` otherwise. For the calls `symm.hier` composes.
    fn reduce_op(&self, py: Python<'_>, op: &Bound<'_, PyAny>) -> PyResult<&'static str> {
        crate::coll::op_arg(py, self.rank_id(), op).map(|o| o.name())
    }

    /// The group of every rank.
    #[getter]
    fn world(&self) -> PyGroup {
        PyGroup { g: self.comm().world() }
    }

    /// This rank's use of its symmetric heap, in bytes (rounded up to the allocation granule):
    /// `heap_size`, `reserved` (= `in_use` + `dropped`), `in_use` (held by live tensors),
    /// `dropped` (tensors garbage-collected on this rank whose group's other members still
    /// hold theirs), `free`, `largest_free` (longest free range), `allocations`, and `groups`:
    /// a list of `(native ranks, {reserved, in_use, dropped, allocations})`.
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let comm = self.comm();
        let s = py.detach(|| comm.heap_stats()).py(py)?;
        let d = PyDict::new(py);
        for (k, v) in [
            ("heap_size", s.heap_size),
            ("reserved", s.reserved),
            ("in_use", s.in_use),
            ("dropped", s.dropped),
            ("free", s.free),
            ("largest_free", s.largest_free),
            ("allocations", s.allocations),
        ] {
            d.set_item(k, v)?;
        }
        let mut groups = Vec::with_capacity(s.groups.len());
        for g in &s.groups {
            let gd = PyDict::new(py);
            for (k, v) in
                [("reserved", g.reserved), ("in_use", g.in_use), ("dropped", g.dropped), ("allocations", g.allocations)]
            {
                gd.set_item(k, v)?;
            }
            let ranks: Vec<u32> = g.ranks.iter().map(|r| r.0).collect();
            groups.push((ranks, gd));
        }
        d.set_item("groups", groups)?;
        Ok(d)
    }

    /// The group of these native ranks, in this order (cached; no communication).
    ///
    /// Args:
    ///     ranks: native ranks, no repeats.
    ///
    /// Returns:
    ///     Group: usable by its members on this host; a group spanning hosts raises GroupError
    ///     when used.
    fn group(&self, py: Python<'_>, ranks: Vec<i64>) -> PyResult<PyGroup> {
        let me = self.rank_id();
        let global: Option<Vec<Rank>> = ranks.iter().map(|&r| u32::try_from(r).ok().map(Rank)).collect();
        let Some(global) = global else {
            return Err(GroupError::BadRankList { ranks, reason: "a rank is outside the world" }).at(me).py(py);
        };
        self.comm().group_of(&global).map(|g| PyGroup { g }).py(py)
    }

    /// Whether `ptr` lies inside a live symmetric allocation of this rank.
    fn is_symmetric(&self, ptr: usize) -> bool {
        let base = self.comm().local_heap_base() as usize;
        ptr.checked_sub(base).is_some_and(|off| off < self.comm().heap_size() && self.sh.registry.find(off, 0).is_ok())
    }

    /// Collective over `group`: allocates `shape` elements of `dtype` at the same heap offset
    /// on every member. Every member must ask for the same number of bytes.
    ///
    /// Args:
    ///     group: the members that allocate together (all of them call, in the same order).
    ///     shape: an int or a sequence of ints >= 0.
    ///     dtype: the dtype's name (`"torch.bfloat16"`, `"float8_e4m3fn"` ...).
    ///
    /// Returns:
    ///     HeapBlock: this rank's copy.
    fn alloc(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        shape: &Bound<'_, PyAny>,
        dtype: &str,
    ) -> PyResult<HeapBlock> {
        let me = self.rank_id();
        let dims: Vec<i64> = if let Ok(n) = shape.extract::<i64>() {
            vec![n]
        } else {
            shape
                .extract::<Vec<i64>>()
                .map_err(|_| invalid(py, me, "shape", repr(shape), "expected an int or a sequence of ints"))?
        };
        let mut numel: usize = 1;
        for &d in &dims {
            let d = usize::try_from(d)
                .map_err(|_| invalid(py, me, "shape", format!("{dims:?}"), "dimensions must be >= 0"))?;
            numel = numel
                .checked_mul(d)
                .ok_or_else(|| invalid(py, me, "shape", format!("{dims:?}"), "too many elements"))?;
        }
        let dtype = dtype_arg(py, me, "dtype", dtype, "")?;
        let g = group.get().g.clone();
        let comm = self.comm();
        match py.detach(|| comm.alloc(&g, numel, dtype)) {
            Ok(buf) => {
                let offset = buf.heap_offset();
                let id = self.sh.registry.insert(buf);
                Ok(HeapBlock { sh: self.sh.clone(), id, offset, numel, dtype, group: g })
            }
            Err(e) => {
                let hint = if matches!(e, Error::Heap { source: HeapError::Exhausted { .. }, .. }) {
                    let (live, count) = self.sh.registry.live();
                    format!(
                        "; this rank's live symmetric tensors hold {live} bytes in {count} allocations \
                         (symm.memory_stats() shows the heap's use)"
                    )
                } else {
                    String::new()
                };
                Err(errors::to_py_with(py, &e, &hint))
            }
        }
    }

    /// Collective over the allocation's group: releases the allocation that `tensor` lies in.
    /// Every member calls it for the same allocation, in the same order (members that name
    /// different allocations all get `HeapError`, and nothing is freed); the memory must not be
    /// used afterwards.
    fn free(&self, py: Python<'_>, tensor: Desc) -> PyResult<()> {
        let buf = self.symmetric(py, &tensor, "tensor")?;
        let whole = Local { ptr: tensor.0, len: buf.len(), dtype: buf.dtype() };
        self.asyncs().check(py, self.comm(), "tensor", None, &whole)?;
        let Some((id, live)) =
            self.sh.registry.find(buf.heap_offset(), 0).ok().and_then(|f| self.sh.registry.take(f.start))
        else {
            return Err(invalid(py, self.rank_id(), "tensor", tensor.0, "was freed concurrently"));
        };
        let (group, offset, len, dtype) = (live.group().clone(), live.heap_offset(), live.len(), live.dtype());
        let comm = self.comm();
        match py.detach(|| comm.free(live)) {
            Ok(()) => Ok(()),
            Err(e) => {
                // Nothing was released: keep the allocation reachable so the caller may retry.
                self.sh.registry.restore(id, SymmBuffer::from_parts(comm.instance_id(), group, offset, len, dtype));
                Err(errors::to_py(py, &e))
            }
        }
    }

    /// Blocks until every member of `group` has called `barrier`; everything issued before it
    /// by any member is then visible to every member.
    #[pyo3(signature = (group, stream=None))]
    fn barrier(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let this = slf.get();
        let g = &group.get().g;
        if let Some(s) = this.caller_stream(py, stream)? {
            let enqueue = |c: &Comm, s: &Stream| c.barrier_on(s, g).map(|w| w.event());
            return Self::run_on_stream(slf, py, s, "barrier", None, &[], enqueue).map(drop);
        }
        let comm = this.comm();
        py.detach(|| comm.barrier(g)).py(py)
    }

    /// Copies `size` elements of local `src` (from `src_offset`) into `target_rank`'s copy of
    /// the symmetric `target` at `target_offset`. Returns once the data is in the peer's heap;
    /// with `hold` (the tensors `src`, then `target`, which the work holds), at once with the
    /// work of the copy, enqueued on the communicator's stream.
    #[allow(clippy::too_many_arguments)] // shmem_put's six arguments plus the group and hold
    #[pyo3(signature = (group, target, target_offset, src, src_offset, size, target_rank, hold=None, stream=None))]
    fn put(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        target: Desc,
        target_offset: &Bound<'_, PyAny>,
        src: Desc,
        src_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        target_rank: &Bound<'_, PyAny>,
        hold: Option<Vec<Bound<'_, PyAny>>>,
        stream: Option<usize>,
    ) -> PyResult<Option<Py<PyWork>>> {
        let this = slf.get();
        let g = &group.get().g;
        let x = this.transfer(py, g, &target, target_offset, &src, src_offset, size, target_rank)?;
        let comm = this.comm();
        let (to, so, n, tr) = (x.target_offset, x.src_offset, x.size, x.target_rank as usize);
        let enqueue = |c: &Comm, s: &Stream| {
            // SAFETY: `x.src` describes the `src` tensor, which the work holds (or the caller,
            // while the call waits for it) until the copy has completed (the caller neither
            // writes nor resizes it meanwhile: the contract of an operation in flight); the copy
            // only reads it.
            unsafe { c.put_on(s, g, &x.target, to, x.src.reader(), so, n, tr) }.map(|w| w.event())
        };
        if let Some(s) = this.caller_stream(py, stream)? {
            return Self::run_on_stream(slf, py, s, "put", hold.map(|h| this.held(h, x.src)), &["src"], enqueue);
        }
        if let Some(hold) = hold {
            return this.asyncs().start(slf, "put", this.held(hold, x.src), &["src"], enqueue).map(Some);
        }
        py.detach(|| {
            // SAFETY: `x.src` describes the `src` tensor, held by the caller for this call (the
            // `Desc` contract), which the copy only reads.
            let src = unsafe { x.src.reader() };
            comm.put(g, &x.target, x.target_offset, src, x.src_offset, x.size, x.target_rank as usize)
        })
        .py(py)
        .map(|()| None)
    }

    /// Copies `size` elements of `target_rank`'s copy of the symmetric `target` (from
    /// `target_offset`) into local `src` at `src_offset` (`src` is the destination, as in
    /// HyperParallel's `shmem_get`). Returns once the data is in `src`; with `hold`, at once
    /// with its work (as `put`).
    #[allow(clippy::too_many_arguments)] // shmem_get's six arguments plus the group and hold
    #[pyo3(signature = (group, target, target_offset, src, src_offset, size, target_rank, hold=None, stream=None))]
    fn get(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        target: Desc,
        target_offset: &Bound<'_, PyAny>,
        src: Desc,
        src_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        target_rank: &Bound<'_, PyAny>,
        hold: Option<Vec<Bound<'_, PyAny>>>,
        stream: Option<usize>,
    ) -> PyResult<Option<Py<PyWork>>> {
        let this = slf.get();
        let g = &group.get().g;
        let x = this.transfer(py, g, &target, target_offset, &src, src_offset, size, target_rank)?;
        let comm = this.comm();
        let (to, so, n, tr) = (x.target_offset, x.src_offset, x.size, x.target_rank as usize);
        let enqueue = |c: &Comm, s: &Stream| {
            // SAFETY: `x.src` describes the `src` tensor, which the work holds (or the caller,
            // while the call waits for it), and which nothing else uses, until the copy into it
            // has completed (the contract of an operation in flight).
            unsafe { c.get_on(s, g, x.src.writer(), so, &x.target, to, n, tr) }.map(|w| w.event())
        };
        if let Some(s) = this.caller_stream(py, stream)? {
            return Self::run_on_stream(slf, py, s, "get", hold.map(|h| this.held(h, x.src)), &["src"], enqueue);
        }
        if let Some(hold) = hold {
            return this.asyncs().start(slf, "get", this.held(hold, x.src), &["src"], enqueue).map(Some);
        }
        py.detach(|| {
            // SAFETY: `x.src` describes the `src` tensor, held by the caller for this call (the
            // `Desc` contract); the caller does not touch it while the call copies into it (the
            // GIL is released, but the call returns only after the copy).
            let dst = unsafe { x.src.writer() };
            comm.get(g, dst, x.src_offset, &x.target, x.target_offset, x.size, x.target_rank as usize)
        })
        .py(py)
        .map(|()| None)
    }

    /// Atomically sets (`signal_op` 0 / `"set"`) or adds (1 / `"add"`) `signal_value` to
    /// `target_rank`'s word `signal[signal_offset]` (an int32 or int64 symmetric tensor).
    #[allow(clippy::too_many_arguments)] // shmem_signal_op's five arguments plus the group
    #[pyo3(signature = (group, signal, signal_offset, signal_value, signal_op, target_rank, stream=None))]
    fn signal_op(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        signal: Desc,
        signal_offset: &Bound<'_, PyAny>,
        signal_value: &Bound<'_, PyAny>,
        signal_op: &Bound<'_, PyAny>,
        target_rank: &Bound<'_, PyAny>,
        stream: Option<usize>,
    ) -> PyResult<()> {
        let this = slf.get();
        let me = this.rank_id();
        let g = &group.get().g;
        let sig = this.symmetric(py, &signal, "signal")?;
        let off = count_arg(py, me, "signal_offset", signal_offset)?;
        let value = int_arg(py, me, "signal_value", signal_value)?;
        let op = code_arg(py, me, "signal_op", signal_op, SignalOp::from_code)?;
        let tr = int_arg(py, me, "target_rank", target_rank)?;
        let tr = group_rank(py, me, g, tr)?;
        if let Some(s) = this.caller_stream(py, stream)? {
            let enqueue = |c: &Comm, s: &Stream| c.signal_op_on(s, g, &sig, off, value, op, tr).map(|w| w.event());
            return Self::run_on_stream(slf, py, s, "signal_op", None, &[], enqueue).map(drop);
        }
        this.comm().signal_op(g, &sig, off, value, op, tr).py(py)
    }

    /// `put`, then `signal_op` on the same target rank; the data is visible to the target
    /// before the signal is. With `hold` (`src`, `target`, `signal`), at once with its work
    /// (as `put`).
    #[allow(clippy::too_many_arguments)] // shmem_put_with_signal's ten arguments plus the group and hold
    #[pyo3(signature = (group, target, target_offset, src, src_offset, size, signal, signal_offset, signal_value, signal_op, target_rank, hold=None, stream=None))]
    fn put_with_signal(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        target: Desc,
        target_offset: &Bound<'_, PyAny>,
        src: Desc,
        src_offset: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        signal: Desc,
        signal_offset: &Bound<'_, PyAny>,
        signal_value: &Bound<'_, PyAny>,
        signal_op: &Bound<'_, PyAny>,
        target_rank: &Bound<'_, PyAny>,
        hold: Option<Vec<Bound<'_, PyAny>>>,
        stream: Option<usize>,
    ) -> PyResult<Option<Py<PyWork>>> {
        let this = slf.get();
        let me = this.rank_id();
        let g = &group.get().g;
        let x = this.transfer(py, g, &target, target_offset, &src, src_offset, size, target_rank)?;
        let sig = this.symmetric(py, &signal, "signal")?;
        let off = count_arg(py, me, "signal_offset", signal_offset)?;
        let value = int_arg(py, me, "signal_value", signal_value)?;
        let op = code_arg(py, me, "signal_op", signal_op, SignalOp::from_code)?;
        let comm = this.comm();
        let (to, so, n, tr) = (x.target_offset, x.src_offset, x.size, x.target_rank as usize);
        let enqueue = |c: &Comm, s: &Stream| {
            // SAFETY: as in `put`.
            unsafe { c.put_with_signal_on(s, g, &x.target, to, x.src.reader(), so, n, &sig, off, value, op, tr) }
                .map(|w| w.event())
        };
        if let Some(s) = this.caller_stream(py, stream)? {
            let held = hold.map(|h| this.held(h, x.src));
            return Self::run_on_stream(slf, py, s, "put_with_signal", held, &["src"], enqueue);
        }
        if let Some(hold) = hold {
            return this.asyncs().start(slf, "put_with_signal", this.held(hold, x.src), &["src"], enqueue).map(Some);
        }
        py.detach(|| {
            // SAFETY: as in `put`: `x.src` describes the caller's tensor `src`, only read.
            let src = unsafe { x.src.reader() };
            let (to, so, n, tr) = (x.target_offset, x.src_offset, x.size, x.target_rank as usize);
            comm.put_with_signal(g, &x.target, to, src, so, n, &sig, off, value, op, tr)
        })
        .py(py)
        .map(|()| None)
    }

    /// Blocks until this rank's `signal[signal_offset] <compare_op> compare_value` holds, or
    /// `timeout` passes (Timeout). Does not change the signal. Returns the value seen.
    #[allow(clippy::too_many_arguments)] // shmem_wait_for_signal's arguments plus group and timeout
    #[pyo3(signature = (group, signal, signal_offset, compare_value, compare_op, timeout=None, stream=None))]
    fn wait_for_signal(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        signal: Desc,
        signal_offset: &Bound<'_, PyAny>,
        compare_value: &Bound<'_, PyAny>,
        compare_op: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        stream: Option<usize>,
    ) -> PyResult<i64> {
        let this = slf.get();
        let me = this.rank_id();
        let g = &group.get().g;
        g.member().at(me).py(py)?;
        let sig = this.symmetric(py, &signal, "signal")?;
        let off = count_arg(py, me, "signal_offset", signal_offset)?;
        let value = int_arg(py, me, "compare_value", compare_value)?;
        let cmp = code_arg(py, me, "compare_op", compare_op, CmpOp::from_code)?;
        let timeout = timeout_arg(py, me, timeout)?;
        if let Some(s) = this.caller_stream(py, stream)? {
            // On the caller's stream, then the word as it stands once the stream has passed.
            let enqueue = |c: &Comm, s: &Stream| c.wait_until_on(s, &sig, off, cmp, value, timeout).map(|w| w.event());
            Self::run_on_stream(slf, py, s, "wait_until", None, &[], enqueue)?;
            // The wait checked the offset and the dtype (int32 or int64).
            let size = sig.dtype().size();
            let word = SymmBuffer::from_parts(
                sig.owner(),
                sig.group().clone(),
                sig.heap_offset() + off * size,
                1,
                sig.dtype(),
            );
            let comm = this.comm();
            let seen = match sig.dtype() {
                DType::I32 => comm.read_local::<i32>(&word).map(|v| i64::from(v[0])),
                _ => comm.read_local::<i64>(&word).map(|v| v[0]),
            };
            return seen.py(py);
        }
        let comm = this.comm();
        py.detach(|| comm.wait_until(&sig, off, cmp, value, timeout)).py(py)
    }

    /// Makes this communicator the one the fast path of the public collectives runs on
    /// (`symm._symm.shmem_allreduce`), with what it needs to read the platform's tensors
    /// itself. Called once, by `symm.init` (one runtime per process); later calls are ignored.
    ///
    /// Args:
    ///     tensor_types: the tensor types read directly (exact types; others take the full path).
    ///     dtypes: the framework's dtype objects -> their names (`torch.float32: "torch.float32"`).
    ///     profiler: `(mapping, key)` whose value is true while the profiler records.
    ///     groups: the API's cache of native groups by group object, when the platform keys
    ///         groups by the object itself (the fast path only reads it).
    ///     shim: torch's stable C shim: `{"functions": {name: address}, "strided": code,
    ///         "cpu": code, "dtypes": {code: name}, "tensor_in_object": bool}` with the
    ///         addresses of `aoti_torch_<name>` for `get_layout`, `get_device_type`,
    ///         `get_dtype`, `is_contiguous`, `get_numel`, `get_data_ptr` in the libtorch this
    ///         process loaded; `tensor_in_object` (optional, default false): the tensor objects
    ///         hold their `at::Tensor` inline (torch's `THPVariable`), at an offset the fast
    ///         path may find by comparing the probes' memory with their `_cdata`. Used only
    ///         when it reads each of `probes` as the descriptors do.
    ///     probes: tensors of every kind the fast path must tell apart (dtypes, views, devices,
    ///         layouts), to check the shim against.
    ///
    /// Returns:
    ///     Optional[str]: how tensors are read: `"handle"` (the shim, on the `at::Tensor` in
    ///     the object), `"shim"` (the shim, on the `TensorImpl` address `_cdata` gives),
    ///     `"descriptors"` (the tensor types' C attributes `dtype`, `is_cpu`,
    ///     `is_contiguous()`, `numel()`, `data_ptr()`), or None when the tensor types have no
    ///     such attributes (no fast path). A later call changes nothing but still says how it
    ///     would read.
    #[pyo3(signature = (tensor_types, dtypes, profiler=None, groups=None, shim=None, probes=Vec::new()))]
    #[allow(clippy::too_many_arguments)] // the platform's description, field by field
    fn enable_fast_path(
        slf: &Bound<'_, Self>,
        tensor_types: Vec<Bound<'_, PyType>>,
        dtypes: &Bound<'_, PyDict>,
        profiler: Option<(Bound<'_, PyDict>, Bound<'_, PyString>)>,
        groups: Option<Bound<'_, PyDict>>,
        shim: Option<Bound<'_, PyDict>>,
        probes: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Option<&'static str>> {
        let world = slf.get().comm().world();
        let Some(spec) = FastSpec::new(tensor_types, dtypes, profiler, groups, shim, &probes, world)? else {
            return Ok(None);
        };
        let reader = spec.tensors.kind();
        fast::enable(slf.py(), slf.clone().unbind(), spec);
        Ok(Some(reader))
    }

    /// Collective over `group`: checks that every member passes the same view of one symmetric
    /// allocation that every member of `group` took part in, and the same `pad_bytes`
    /// (Mismatch on every member otherwise); returns the view's `(heap_offset, bytes)`. See
    /// `rendezvous.rs`.
    fn rendezvous(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        tensor: Desc,
        pad_bytes: usize,
    ) -> PyResult<(usize, usize)> {
        self.coll_rendezvous(py, &group.get().g, &tensor, pad_bytes)
    }

    /// The live allocation the symmetric tensor `tensor` lies in: `(the tensor's byte offset
    /// from the allocation's start, the allocation's size in bytes)`. Local.
    fn allocation(&self, py: Python<'_>, tensor: Desc) -> PyResult<(usize, usize)> {
        self.allocation_of(py, &tensor).map(|(_, offset, nbytes)| (offset, nbytes))
    }

    /// The address at which this process reaches member `rank`'s copy of the first element of
    /// the symmetric tensor `tensor` (`rank`: a rank of `group`). Local. Raises Unsupported
    /// where the backend does not map its peers' heaps (a device backend), GroupError for a
    /// rank outside `group` or one that did not take part in the allocation, InvalidArgument
    /// for a tensor that is not live symmetric memory. See `peer.rs`.
    fn peer_address(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        rank: &Bound<'_, PyAny>,
        tensor: Desc,
    ) -> PyResult<usize> {
        self.peer_place(py, &group.get().g, rank, &tensor).map(|p| p.ptr + p.offset)
    }

    /// Member `rank`'s copy of the whole allocation the symmetric tensor `tensor` lies in, as
    /// writable bytes (buffer protocol), holding `keep` while it lives. Local; errors as
    /// `peer_address`. See `peer.rs`.
    #[pyo3(signature = (group, rank, tensor, keep=None))]
    fn peer_buffer(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyGroup>,
        rank: &Bound<'_, PyAny>,
        tensor: Desc,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<crate::peer::PeerBuffer> {
        self.peer_buffer_of(py, &group.get().g, rank, &tensor, keep)
    }

    /// Takes part in `group`'s next collective round only to reject it (recorded as an
    /// allreduce), so that members waiting in a collective fail with PeerRejected (for
    /// argument errors found in Python; see `Collectives::reject`).
    fn reject(&self, py: Python<'_>, group: &Bound<'_, PyGroup>) {
        let g = &group.get().g;
        if g.member().is_ok() {
            let why = ArgError::invalid("arguments", "rejected", "refused by the Python API");
            let comm = self.comm();
            // The caller raises its own error; this one is the expected rejection.
            let _ = py.detach(|| symm_core::Collectives::reject(comm, g, symm_core::dfx::Op::AllReduce, why));
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(backend={:?}, rank={}, world_size={}, heap_size={})",
            self.comm().backend_name(),
            self.rank_id(),
            self.comm().world_size(),
            self.comm().heap_size()
        )
    }
}

/// Validates a group-local rank (the error names `target_rank`) and returns it as an index.
fn group_rank(py: Python<'_>, me: Rank, g: &Group, r: i64) -> PyResult<usize> {
    g.resolve("target_rank", r).map(|(l, _)| l.index()).at(me).py(py)
}

impl PyGroup {
    /// The core's group.
    pub(crate) fn group(&self) -> &Group {
        &self.g
    }
}

#[pymethods]
impl PyGroup {
    /// The members' native ranks, in group order.
    #[getter]
    fn ranks(&self) -> Vec<u32> {
        self.g.ranks().iter().map(|r| r.0).collect()
    }

    /// Number of members.
    #[getter]
    fn size(&self) -> usize {
        self.g.size()
    }

    /// This process's rank inside the group, or None if it is not a member.
    #[getter]
    fn rank(&self) -> Option<u32> {
        self.g.my_rank().map(|r| r.0)
    }

    /// Whether its members lie on more than one host: symmetric memory cannot serve it, its
    /// collectives run hierarchically (`symm.hier`) and its one-sided calls are refused.
    #[getter]
    fn spans_hosts(&self) -> bool {
        matches!(self.g.member(), Err(GroupError::SpansHosts { .. }))
    }

    /// The group's identity (a hash of its ordered rank list, the same on every rank).
    #[getter]
    fn id(&self) -> u64 {
        self.g.id().0
    }

    fn __repr__(&self) -> String {
        format!("Group(ranks={:?})", self.ranks())
    }
}

#[pymethods]
impl HeapBlock {
    /// Address of this rank's copy.
    #[getter]
    fn ptr(&self) -> usize {
        self.addr() as usize
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.numel * self.dtype.size()
    }

    /// Number of elements allocated.
    #[getter]
    fn numel(&self) -> usize {
        self.numel
    }

    /// The dtype allocated (canonical name).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Byte offset in every member's heap.
    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    /// The group that allocated it.
    #[getter]
    fn group(&self) -> PyGroup {
        PyGroup { g: self.group.clone() }
    }

    /// The device type of its memory, as the platform names it (`"cpu"`, `"npu"`).
    #[getter]
    fn device(&self) -> &'static str {
        device_type(&self.sh.comm)
    }

    /// Exports this rank's copy as writable bytes (format `B`); host memory only (a device's
    /// memory is wrapped by the platform from `ptr`).
    ///
    /// # Safety
    /// Called by the interpreter with a `view` to fill (or null).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is null"));
        }
        let this = slf.get();
        if this.sh.comm.heap_space() != MemorySpace::Host {
            return Err(PyBufferError::new_err(format!(
                "{} is device memory: the host cannot read it through a buffer",
                this.__repr__()
            )));
        }
        let len = isize::try_from(this.nbytes()).map_err(|_| PyBufferError::new_err("block too large"))?;
        let buf = this.addr();
        // SAFETY: `view` is non-null and points to a Py_buffer the interpreter gives us to fill.
        // `buf` is this rank's heap at the block's range, which stays mapped while the block
        // lives (it holds the communicator), and the view holds a strong reference to the block
        // (`obj`) until it is released.
        unsafe { fill_bytes_view(view, slf.into_any(), buf, len, flags) };
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "HeapBlock({} x {} at heap+{:#x} in group {:?})",
            self.numel,
            self.dtype,
            self.offset,
            self.group.ranks()
        )
    }
}

impl HeapBlock {
    fn addr(&self) -> *mut u8 {
        // The offset lies inside the heap (a successful allocation); wrapping_add needs no
        // unsafe and gives the same address.
        self.sh.comm.local_heap_base().wrapping_add(self.offset)
    }
}

impl Drop for HeapBlock {
    /// The last tensor of the block is gone without `free`: the rank drops the allocation
    /// (local and non-blocking, as a finalizer must be; nothing waits for the other members).
    fn drop(&mut self) {
        if let Some(buf) = self.sh.registry.drop_block(self.id, self.offset) {
            // Only a buffer of another communicator is refused, which a registry entry is not.
            let _ = self.sh.comm.abandon(buf);
        }
    }
}

/// Starts this process's rank: exchanges start-up data through `store` and maps the heaps of
/// the ranks on this host. Collective over all `world_size` ranks.
///
/// Args:
///     rank: this process's native rank, in `[0, world_size)`.
///     world_size: number of ranks.
///     store: a c10d-style key-value store shared by the ranks (`set`, `get`, optional `wait`).
///     prefix: keeps these keys apart from other users of the store; the same on every rank and
///         new for every `init` on the same store.
///     secret: the job secret that authenticates the records (the same on every rank, at
///         least 16 bytes); `SYMM_JOB_SECRET`, when set, takes its place. None: unauthenticated.
///     backend: the backend by name (`"sim"`, `"ascend"`; see `BACKENDS`); None: `SYMM_BACKEND`,
///         else the first compiled in.
///     device: the device a device backend runs on (the framework's current device); None: the
///         rank's place among the ranks of its host.
///
/// Returns:
///     Communicator: heap size from `SYMMETRIC_MEMORY_HEAP_SIZE`, wait bound from
///     `SYMMETRIC_MEMORY_TIMEOUT`.
#[pyfunction]
#[pyo3(signature = (rank, world_size, store, *, prefix = "symm", secret = None, backend = None, device = None))]
#[allow(clippy::too_many_arguments)] // the job, the store and the communicator's options
pub fn init(
    py: Python<'_>,
    rank: i64,
    world_size: i64,
    store: &Bound<'_, PyAny>,
    prefix: &str,
    secret: Option<&[u8]>,
    backend: Option<&str>,
    device: Option<i32>,
) -> PyResult<PyCommunicator> {
    let n = usize::try_from(world_size).ok().filter(|&n| n > 0 && u32::try_from(n).is_ok());
    let Some(n) = n else {
        return Err(errors::unranked_invalid(py, &format!("world_size = {world_size}: must be >= 1")));
    };
    let r = u32::try_from(rank).ok().filter(|&r| (r as usize) < n);
    let Some(r) = r else {
        return Err(errors::unranked_invalid(py, &format!("rank = {rank}: must lie in [0, world_size = {n})")));
    };
    let me = Rank(r);
    let store: Arc<PyStore> =
        Arc::new(PyStore::new(store).map_err(|reason| invalid(py, me, "store", repr(store), &reason))?);
    let secret = match JobSecret::from_env().at(me).py(py)? {
        Some(s) => Some(s),
        None => {
            secret.map(JobSecret::new).transpose().map_err(|e| invalid(py, me, "secret", "<bytes>", &e.to_string()))?
        }
    };
    let config = match CommConfig::from_env().at(me) {
        Ok(mut c) => {
            if let Some(name) = backend {
                c.settings.backend = Some(name.to_string());
            }
            c.device = device;
            c
        }
        Err(e) => {
            // Tell the peers, whose waits would otherwise last their whole timeout.
            let boot = Bootstrap::new(me, n, store, prefix, symm_core::env::DEFAULT_TIMEOUT).with_secret(secret);
            py.detach(|| boot.abort(&e.to_string()));
            return Err(e).py(py);
        }
    };
    let boot = Bootstrap::new(me, n, store, prefix, config.settings.timeout).with_secret(secret);
    let comm = py.detach(|| Comm::init(&boot, config)).py(py)?;
    Ok(PyCommunicator { sh: Arc::new(Shared { comm, registry: Registry::default(), asyncs: AsyncOps::default() }) })
}

/// The dtype names the library moves (canonical spelling).
pub(crate) fn dtype_names(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    PyTuple::new(py, DType::ALL.iter().map(|d| d.name()))
}

/// Fills `view` as a writable 1-D view of `len` bytes (format `B`) at `buf`, owned by `obj`
/// (the buffer protocol of `HeapBlock` and `PeerBuffer`).
///
/// # Safety
/// `view` is the non-null `Py_buffer` the interpreter gave to fill; `buf` holds `len` bytes
/// that stay valid while `obj` lives (the view keeps a strong reference to it until released).
pub(crate) unsafe fn fill_bytes_view(
    view: *mut pyo3::ffi::Py_buffer,
    obj: Bound<'_, PyAny>,
    buf: *mut u8,
    len: isize,
    flags: c_int,
) {
    use pyo3::ffi;
    // SAFETY: `view` is valid for writes (contract). `format` points to a static C string,
    // never freed; `shape` and `strides` point into the view itself, as the buffer protocol
    // allows.
    unsafe {
        (*view).obj = obj.into_ptr();
        (*view).buf = buf.cast();
        (*view).len = len;
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            c"B".as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
        (*view).strides =
            if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { &mut (*view).itemsize } else { std::ptr::null_mut() };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}

#[cfg(test)]
mod tests {
    use super::check_storage;

    #[test]
    fn data_must_lie_within_its_storage() {
        let storage = (0x1000, 64);
        // Within: the whole storage, a part at its end, anything empty (even at address 0).
        assert_eq!(check_storage(0x1000, 64, storage), None);
        assert_eq!(check_storage(0x1030, 16, storage), None);
        assert_eq!(check_storage(0, 0, (0, 0)), None);
        assert_eq!(check_storage(0x5000, 0, storage), None);
        // No memory behind it: a null pointer with elements, whatever the storage says.
        assert!(check_storage(0, 4, (0, 0)).is_some_and(|w| w.contains("no memory behind it")));
        assert!(check_storage(0, 4, (0, 64)).is_some_and(|w| w.contains("no memory behind it")));
        // Outside: past the end, before the start, a storage freed to 0 bytes, no overflow.
        for (ptr, bytes) in [(0x1030, 17), (0x1040, 1), (0xfff, 2), (0x2000, 4), (usize::MAX, 2)] {
            let why = check_storage(ptr, bytes, storage);
            assert!(why.as_deref().is_some_and(|w| w.contains("reaches outside its storage")), "{ptr:#x} {bytes}");
        }
        assert!(check_storage(0x1000, 4, (0x1000, 0)).is_some());
    }
}
