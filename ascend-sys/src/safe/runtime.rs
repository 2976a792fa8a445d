//! Devices, streams, events, device memory and copies (AscendCL).

use std::ffi::c_void;
use std::time::Duration;

use super::acl;
use crate::result::{AscendError, Result};
use crate::sys::acl::{self as sys, aclrtEvent, aclrtStream};

/// Initialises ACL for the process; one already initialised (by torch_npu) is no error.
pub fn init() -> Result<()> {
    let api = acl()?;
    // SAFETY: a null configuration path means none.
    let code = unsafe { (api.aclInit)(std::ptr::null()) };
    if code == sys::ACL_ERROR_REPEAT_INITIALIZE {
        return Ok(());
    }
    api.check("aclInit", code)
}

/// ACL's API version (major, minor, patch): not CANN's release number.
pub fn version() -> Result<(i32, i32, i32)> {
    let api = acl()?;
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    api.check("aclrtGetVersion", unsafe { (api.aclrtGetVersion)(&mut a, &mut b, &mut c) })?;
    Ok((a, b, c))
}

/// Makes `device` the calling thread's device (ACL contexts are per thread).
pub fn set_device(device: i32) -> Result<()> {
    let api = acl()?;
    // SAFETY: plain value argument; a bad id is reported as an error.
    api.check("aclrtSetDevice", unsafe { (api.aclrtSetDevice)(device) })
}

/// A timeout as `aclrtSynchronizeStreamWithTimeout` takes it: milliseconds, at least 1 (0 would
/// poll once) and at most `i32::MAX` (-1 would wait forever): never unbounded.
pub fn timeout_ms(timeout: Duration) -> i32 {
    let ms = timeout.as_millis().max(1);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

/// Blocks until everything enqueued on `stream` has completed: `Ok(true)`, or `Ok(false)` when
/// `timeout` passed first (the work is still in flight); a failure of the stream's work is the
/// error ACL reports.
pub fn synchronize_stream(stream: &Stream, timeout: Duration) -> Result<bool> {
    let api = acl()?;
    // SAFETY: a live stream handle (`Stream` guarantees it).
    let code = unsafe { (api.aclrtSynchronizeStreamWithTimeout)(stream.raw(), timeout_ms(timeout)) };
    match api.check("aclrtSynchronizeStreamWithTimeout", code) {
        Ok(()) => Ok(true),
        Err(e) if e.is_timeout() => Ok(false),
        Err(e) => Err(e),
    }
}

/// An ACL stream: created here (destroyed on drop), or the caller's (torch_npu's current
/// stream), borrowed for as long as the caller keeps it.
#[derive(Debug)]
pub struct Stream {
    raw: aclrtStream,
    owned: bool,
}

// SAFETY: an ACL stream handle may be used from any thread whose context has its device.
unsafe impl Send for Stream {}
// SAFETY: as above; enqueueing from several threads is ordered by the runtime.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream of the calling thread's device.
    pub fn create() -> Result<Stream> {
        let api = acl()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        api.check("aclrtCreateStream", unsafe { (api.aclrtCreateStream)(&mut raw) })?;
        Ok(Stream { raw, owned: true })
    }

    /// The caller's stream `raw` (an `aclrtStream` as an address, torch_npu's
    /// `current_stream().npu_stream`). Null is refused: SHMEM would take it for its internal
    /// stream, unordered with the caller's work, and torch_npu returns 0 when its task queue
    /// failed to flush (R10).
    ///
    /// # Safety
    /// `raw` is a live stream handle for as long as the returned value is used.
    pub unsafe fn borrowed(raw: aclrtStream) -> Result<Stream> {
        if raw.is_null() {
            return Err(AscendError::Refused {
                function: "Stream::borrowed",
                argument: "stream",
                value: "0".into(),
                reason: "a null stream is the library's internal stream, unordered with the caller's work \
                         (torch_npu also returns 0 when it failed to flush its task queue)",
            });
        }
        Ok(Stream { raw, owned: false })
    }

    /// The handle.
    pub fn raw(&self) -> aclrtStream {
        self.raw
    }

    /// Orders everything enqueued on this stream from now on after `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let api = acl()?;
        // SAFETY: live handles.
        api.check("aclrtStreamWaitEvent", unsafe { (api.aclrtStreamWaitEvent)(self.raw, event.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            if let Ok(api) = acl() {
                // SAFETY: created by this value and not used after; a failure here has no caller
                // to report to (the runtime logs it).
                let _ = unsafe { (api.aclrtDestroyStream)(self.raw) };
            }
        }
    }
}

/// An ACL event.
#[derive(Debug)]
pub struct Event {
    raw: aclrtEvent,
}

// SAFETY: as for `Stream`.
unsafe impl Send for Event {}
// SAFETY: as for `Stream`.
unsafe impl Sync for Event {}

impl Event {
    /// A new event.
    pub fn create() -> Result<Event> {
        let api = acl()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        api.check("aclrtCreateEvent", unsafe { (api.aclrtCreateEvent)(&mut raw) })?;
        Ok(Event { raw })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let api = acl()?;
        // SAFETY: live handles.
        api.check("aclrtRecordEvent", unsafe { (api.aclrtRecordEvent)(self.raw, stream.raw) })
    }

    /// Whether the work it was recorded after has completed; does not block.
    pub fn query(&self) -> Result<bool> {
        let api = acl()?;
        let mut status = sys::ACL_EVENT_RECORDED_STATUS_NOT_READY;
        // SAFETY: a live handle and a valid out-pointer.
        api.check("aclrtQueryEventStatus", unsafe { (api.aclrtQueryEventStatus)(self.raw, &mut status) })?;
        Ok(status == sys::ACL_EVENT_RECORDED_STATUS_COMPLETE)
    }

    /// The handle.
    pub fn raw(&self) -> aclrtEvent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(api) = acl() {
            // SAFETY: created by this value and not used after.
            let _ = unsafe { (api.aclrtDestroyEvent)(self.raw) };
        }
    }
}

/// Device memory from `aclrtMalloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: *mut c_void,
    bytes: usize,
}

// SAFETY: a device address, usable from any thread of the device's context.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; the type gives no host access to the memory.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `bytes` (at least 1) of the calling thread's device.
    pub fn new(bytes: usize) -> Result<DeviceBuffer> {
        let api = acl()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; huge pages first, normal pages if none are left.
        let code = unsafe { (api.aclrtMalloc)(&mut ptr, bytes.max(1), sys::ACL_MEM_MALLOC_HUGE_FIRST) };
        api.check("aclrtMalloc", code)?;
        Ok(DeviceBuffer { ptr, bytes })
    }

    /// Its device address.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Its size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(api) = acl() {
            // SAFETY: allocated by this value; the owner has synchronized the work using it.
            let _ = unsafe { (api.aclrtFree)(self.ptr) };
        }
    }
}

/// Which memories a copy connects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

impl CopyKind {
    fn raw(self) -> sys::aclrtMemcpyKind {
        match self {
            CopyKind::HostToDevice => sys::ACL_MEMCPY_HOST_TO_DEVICE,
            CopyKind::DeviceToHost => sys::ACL_MEMCPY_DEVICE_TO_HOST,
            CopyKind::DeviceToDevice => sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
        }
    }
}

/// Enqueues a copy of `bytes` from `src` to `dst` on `stream`.
///
/// # Safety
/// Both ranges are valid in the memories `kind` names until the copy completes on `stream`,
/// and nothing else writes `dst` meanwhile.
pub unsafe fn copy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: CopyKind,
    stream: &Stream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let api = acl()?;
    // SAFETY: the ranges are valid (contract); `dest_max` is the copy's own size.
    let code = unsafe { (api.aclrtMemcpyAsync)(dst, bytes, src, bytes, kind.raw(), stream.raw()) };
    api.check("aclrtMemcpyAsync", code)
}

/// `total` bytes as consecutive `(offset, length)` pieces of at most `max` bytes (`max` >= 1);
/// none for 0 bytes.
pub fn chunks(total: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let max = max.max(1);
    (0..total.div_ceil(max)).map(move |i| (i * max, max.min(total - i * max)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_bounded_milliseconds() {
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_micros(10)), 1);
        assert_eq!(timeout_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(timeout_ms(Duration::from_secs(120)), 120_000);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
    }

    #[test]
    fn chunks_cover_the_range_in_order() {
        assert_eq!(chunks(0, 10).count(), 0);
        assert_eq!(chunks(10, 10).collect::<Vec<_>>(), vec![(0, 10)]);
        assert_eq!(chunks(25, 10).collect::<Vec<_>>(), vec![(0, 10), (10, 10), (20, 5)]);
        assert_eq!(chunks(3, 0).collect::<Vec<_>>(), vec![(0, 1), (1, 1), (2, 1)]);
        let big = 9usize << 30;
        let max = crate::sys::shmem::ACLSHMEM_MAX_TRANSFER;
        let pieces: Vec<_> = chunks(big, max).collect();
        assert_eq!(pieces.len(), 3);
        assert!(pieces.iter().all(|&(_, n)| n <= max));
        assert_eq!(pieces.iter().map(|p| p.1).sum::<usize>(), big);
        assert!(pieces.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    }

    #[test]
    fn a_null_stream_is_refused() {
        // SAFETY: null is refused before it could be used.
        let e = unsafe { Stream::borrowed(std::ptr::null_mut()) }.unwrap_err();
        assert!(e.to_string().contains("argument stream = 0 is refused"), "{e}");
    }
}
