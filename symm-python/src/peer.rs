//! Peers' copies of a symmetric allocation by address: what PyTorch's symmetric-memory handle
//! (`symm.SymmetricMemory`: `buffer_ptrs`, `get_buffer`, `signal_pad_ptrs`, `get_signal_pad`)
//! is built on.
//!
//! On a backend whose ranks map each other's heaps (`HostMapped`: the CPU backend), every
//! member's copy of an allocation is ordinary memory of this process, at the address
//! [`PeerMemory::peer_ptr`] gives. [`PeerBuffer`] exports one member's copy of a whole
//! allocation through the buffer protocol, so the platform wraps it into a tensor without
//! copying, as it wraps this rank's own copy ([`crate::comm::HeapBlock`]). A backend that does
//! not map its peers' heaps (Ascend: device memory) answers `Unsupported`, naming itself.

use std::ffi::c_int;
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use symm_core::{AtRank, Backend, DType, Error, Group, GroupError, PeerMemory, Rank, SymmBuffer};

use crate::comm::{int_arg, Desc, PyCommunicator, Shared};
use crate::errors::{invalid, IntoPyResult};

/// Member `rank`'s copy of one symmetric allocation, as this process maps it: writable bytes
/// through the buffer protocol (the whole allocation, from its first byte).
///
/// It keeps the heaps mapped while it lives (it holds the communicator), and holds `keep`
/// (the Python API passes the handle's own tensor of the allocation, whose storage keeps the
/// allocation reserved on this rank, so that no member's range is reused while a view of it
/// lives). After `symm.free` of the allocation its bytes belong to the heap again, as for any
/// other view of freed symmetric memory.
#[pyclass(frozen, module = "symm._symm", name = "PeerBuffer")]
#[derive(Debug)]
pub struct PeerBuffer {
    /// Keeps every heap mapping (this rank's and its peers') alive.
    _sh: Arc<Shared>,
    /// Address of the member's copy of the allocation's first byte.
    ptr: usize,
    /// Size of the allocation in bytes.
    nbytes: usize,
    /// Byte offset, from the allocation's start, of the tensor it was asked for.
    offset: usize,
    /// The member, as a rank of the group it was asked in, and its global rank.
    rank: usize,
    global: Rank,
    /// What the caller asked to keep alive with it.
    keep: Option<Py<PyAny>>,
}

/// Where a member keeps the allocation a symmetric tensor lies in, as this process maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerPlace {
    /// Address of the member's copy of the allocation's first byte.
    pub(crate) ptr: usize,
    /// Size of the allocation in bytes.
    pub(crate) nbytes: usize,
    /// Byte offset of the tensor from the allocation's start.
    pub(crate) offset: usize,
    /// The member: group rank and global rank.
    pub(crate) rank: usize,
    pub(crate) global: Rank,
}

/// The address `ptr` of global rank `peer`'s copy, or `Unsupported` naming `backend` where the
/// backend maps no peer heap into this process (`PeerMemory::peer_ptr` answered `None`).
pub(crate) fn mapped(ptr: Option<*mut u8>, me: Rank, backend: &'static str, peer: Rank) -> Result<*mut u8, Error> {
    ptr.ok_or_else(|| Error::Unsupported {
        rank: me,
        backend,
        what: format!(
            "reaching global rank {peer}'s copy of a symmetric allocation by address (buffer_ptrs, \
             signal_pad_ptrs, get_buffer, get_signal_pad: its ranks do not map each other's heaps; move \
             data with shmem_put/shmem_get and the signal calls instead)"
        ),
    })
}

impl PyCommunicator {
    /// The live allocation the symmetric tensor `tensor` lies in: `(the tensor's byte offset
    /// from the allocation's start, the allocation's bytes)`, with the tensor's own buffer.
    pub(crate) fn allocation_of(&self, py: Python<'_>, tensor: &Desc) -> PyResult<(SymmBuffer, usize, usize)> {
        let buf = self.symmetric(py, tensor, "tensor")?;
        match self.allocation_at(buf.heap_offset(), buf.bytes()) {
            Some((start, nbytes)) => {
                let offset = buf.heap_offset() - start;
                Ok((buf, offset, nbytes))
            }
            None => {
                let shown = format!("tensor at heap offset {:#x}", buf.heap_offset());
                Err(invalid(py, self.rank_id(), "tensor", shown, "was freed concurrently"))
            }
        }
    }

    /// Where member `rank` (a rank of `g`) keeps the allocation `tensor` lies in, checked with
    /// the names of the Python API: `rank` (GroupError outside the group), `tensor`
    /// (InvalidArgument when it is not a live symmetric tensor; GroupError when the member did
    /// not take part in its allocation); Unsupported where the backend maps no peer heap.
    pub(crate) fn peer_place(
        &self,
        py: Python<'_>,
        g: &Group,
        rank: &Bound<'_, PyAny>,
        tensor: &Desc,
    ) -> PyResult<PeerPlace> {
        let me = self.rank_id();
        let (buf, offset, nbytes) = self.allocation_of(py, tensor)?;
        let r = int_arg(py, me, "rank", rank)?;
        g.member().at(me).py(py)?;
        let (local, global) = g.resolve("rank", r).at(me).py(py)?;
        if buf.group().to_local(global).is_none() {
            let source = GroupError::BufferNotOnRank {
                arg: "tensor",
                alloc_ranks: buf.group().ranks().to_vec(),
                target: global,
            };
            return Err(source).at(me).py(py);
        }
        let comm = self.comm();
        let start = buf.heap_offset() - offset;
        let whole = SymmBuffer::from_parts(comm.instance_id(), buf.group().clone(), start, nbytes, DType::U8);
        let ptr = comm.peer_ptr(g, &whole, local.index()).py(py)?;
        let ptr = mapped(ptr, me, comm.backend_name(), global).py(py)?;
        Ok(PeerPlace { ptr: ptr as usize, nbytes, offset, rank: local.index(), global })
    }

    /// [`PyCommunicator::peer_place`] as a [`PeerBuffer`] holding `keep`.
    pub(crate) fn peer_buffer_of(
        &self,
        py: Python<'_>,
        g: &Group,
        rank: &Bound<'_, PyAny>,
        tensor: &Desc,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<PeerBuffer> {
        let p = self.peer_place(py, g, rank, tensor)?;
        Ok(PeerBuffer {
            _sh: self.shared(),
            ptr: p.ptr,
            nbytes: p.nbytes,
            offset: p.offset,
            rank: p.rank,
            global: p.global,
            keep,
        })
    }
}

#[pymethods]
impl PeerBuffer {
    /// Address, in this process, of the member's copy of the allocation's first byte.
    #[getter]
    fn ptr(&self) -> usize {
        self.ptr
    }

    /// Size of the allocation in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Byte offset, from the allocation's start, of the tensor it was asked for.
    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    /// The member, as a rank of the group it was asked in.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The member's global (native) rank.
    #[getter]
    fn global_rank(&self) -> u32 {
        self.global.0
    }

    /// What it keeps alive (the tensor the Python API passed), or None.
    #[getter]
    fn keep(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.keep.as_ref().map(|k| k.clone_ref(py))
    }

    /// Exports the member's copy of the allocation as writable bytes (format `B`).
    ///
    /// # Safety
    /// Called by the interpreter with a `view` to fill (or null).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is null"));
        }
        let this = slf.get();
        let len = isize::try_from(this.nbytes).map_err(|_| PyBufferError::new_err("allocation too large"))?;
        let buf = this.ptr as *mut u8;
        // SAFETY: `view` is non-null and points to a Py_buffer the interpreter gives us to fill.
        // `buf` is the member's copy of a live allocation in a heap this process maps (checked by
        // `peer_place` through `PeerMemory::peer_ptr`), which stays mapped while this object
        // lives (it holds the communicator), and the view holds a strong reference to this
        // object (`obj`) until it is released.
        unsafe { crate::comm::fill_bytes_view(view, slf.into_any(), buf, len, flags) };
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "PeerBuffer({} bytes of group rank {} (global rank {}) at {:#x}, tensor at byte {})",
            self.nbytes, self.rank, self.global, self.ptr, self.offset
        )
    }
}

#[cfg(test)]
mod tests {
    use super::mapped;
    use symm_core::{Error, Rank};

    #[test]
    fn an_unmapped_peer_is_unsupported_naming_the_backend() {
        let p = 0x1000 as *mut u8;
        assert_eq!(mapped(Some(p), Rank(0), "sim", Rank(1)).ok(), Some(p));
        let e = mapped(None, Rank(0), "ascend", Rank(1)).unwrap_err();
        assert!(matches!(e, Error::Unsupported { backend: "ascend", .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("rank 0") && text.contains("ascend backend") && text.contains("global rank 1"), "{text}");
        assert!(text.contains("get_buffer") && text.contains("buffer_ptrs"), "{text}");
        assert_eq!(e.code(), "SYMM_E_UNSUPPORTED");
    }
}
