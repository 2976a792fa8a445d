//! Buffers: symmetric allocations ([`SymmBuffer`]) and the caller's own memory
//! ([`LocalRef`] / [`LocalMut`]).

use std::fmt;
use std::marker::PhantomData;

use crate::dtype::{DType, Element};
use crate::error::ArgError;
use crate::group::Group;

/// One collective allocation: the same byte range of the heap on every member of `group`.
///
/// Owning and not `Clone`: [`free`](crate::SymmetricHeap::free) consumes it, so a freed buffer
/// cannot be used. Dropping it without `free` keeps the range reserved until the communicator
/// ends (freeing is collective and cannot run from `Drop`, and the buffer holds no reference
/// to its communicator); [`abandon`](crate::SymmetricHeap::abandon) gives it up locally
/// instead, and the range comes back once every member has given it up.
pub struct SymmBuffer {
    pub(crate) owner: u64,
    pub(crate) group: Group,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl SymmBuffer {
    /// Built by backends after a successful collective allocation.
    pub fn from_parts(owner: u64, group: Group, offset: usize, len: usize, dtype: DType) -> Self {
        SymmBuffer { owner, group, offset, len, dtype }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Byte offset of the buffer in every member's heap.
    pub fn heap_offset(&self) -> usize {
        self.offset
    }

    /// The group the buffer was allocated in (its memory exists on these ranks only).
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Identity of the communicator that allocated it.
    pub fn owner(&self) -> u64 {
        self.owner
    }
}

impl fmt::Debug for SymmBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SymmBuffer({} x {} at heap+{:#x} in {:?})", self.len, self.dtype, self.offset, self.group)
    }
}

/// Memory of the calling rank that an operation reads: a slice, or raw memory in the
/// backend's address space (host memory for the CPU backend, device memory for devices).
#[derive(Clone, Copy)]
pub struct LocalRef<'a> {
    ptr: *const u8,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> LocalRef<'a> {
    /// Borrows a slice.
    pub fn from_slice<T: Element>(s: &'a [T]) -> Self {
        LocalRef { ptr: s.as_ptr().cast(), len: s.len(), dtype: T::DTYPE, _borrow: PhantomData }
    }

    /// Describes raw memory.
    ///
    /// # Safety
    /// - `ptr` is valid for reads of `len * dtype.size()` bytes for `'a`, in the memory space
    ///   the backend reads from (host memory for `symm-sim`);
    /// - nothing writes that memory while an operation reads it, except peers through the
    ///   symmetric heap when the caller synchronises with them.
    pub unsafe fn from_raw(ptr: *const u8, len: usize, dtype: DType) -> Self {
        LocalRef { ptr, len, dtype, _borrow: PhantomData }
    }

    /// Start of the memory.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

impl<'a, T: Element> From<&'a [T]> for LocalRef<'a> {
    fn from(s: &'a [T]) -> Self {
        LocalRef::from_slice(s)
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for LocalRef<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        LocalRef::from_slice(s)
    }
}

impl fmt::Debug for LocalRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalRef({} x {} at {:p})", self.len, self.dtype, self.ptr)
    }
}

/// Memory of the calling rank that an operation writes.
pub struct LocalMut<'a> {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> LocalMut<'a> {
    /// Borrows a mutable slice.
    pub fn from_slice<T: Element>(s: &'a mut [T]) -> Self {
        LocalMut { ptr: s.as_mut_ptr().cast(), len: s.len(), dtype: T::DTYPE, _borrow: PhantomData }
    }

    /// Describes raw writable memory.
    ///
    /// # Safety
    /// - `ptr` is valid for writes of `len * dtype.size()` bytes for `'a`, in the memory space
    ///   the backend writes to;
    /// - nothing else reads or writes that memory while an operation writes it;
    /// - for `bool`, the caller only reads back values the library wrote (0 or 1 bytes from
    ///   another bool buffer).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize, dtype: DType) -> Self {
        LocalMut { ptr, len, dtype, _borrow: PhantomData }
    }

    /// Start of the memory.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

impl<'a, T: Element> From<&'a mut [T]> for LocalMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        LocalMut::from_slice(s)
    }
}

impl<'a, T: Element> From<&'a mut Vec<T>> for LocalMut<'a> {
    fn from(s: &'a mut Vec<T>) -> Self {
        LocalMut::from_slice(s)
    }
}

impl fmt::Debug for LocalMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalMut({} x {} at {:p})", self.len, self.dtype, self.ptr)
    }
}

/// Checks that `offset + count <= len` without overflow; the byte range of the elements.
pub fn check_range(arg: &'static str, offset: usize, count: usize, len: usize) -> Result<(), ArgError> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(ArgError::OutOfBounds { arg, offset, count, len }),
    }
}

/// Checks that a buffer holds `expected`.
pub fn check_dtype(arg: &'static str, actual: DType, expected: DType) -> Result<(), ArgError> {
    if actual == expected {
        Ok(())
    } else {
        Err(ArgError::DTypeMismatch { arg, expected: expected.to_string(), actual: actual.to_string() })
    }
}
