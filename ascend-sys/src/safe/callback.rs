//! Host callbacks in stream order (`aclrtLaunchCallback`), run by a thread of our own that ACL
//! reports them to (`aclrtSubscribeReport` + `aclrtProcessReport`).
//!
//! ACL runs a stream's callbacks on the one thread subscribed to the stream, one at a time, in
//! the stream's order; a blocking callback holds the stream's later work until it returns. A
//! [`Reporter`] is such a thread: it sets its device (contexts are per thread, R13), then asks
//! ACL for callbacks to run until it is dropped.

use std::ffi::c_void;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use super::{acl, set_device, Stream};
use crate::result::{AscendError, Result};
use crate::sys::acl::{self as sys, aclrtStream};

/// How long the thread waits in one `aclrtProcessReport` before it looks at its stop flag: the
/// longest a drop waits for it.
const POLL: Duration = Duration::from_millis(100);

/// A thread that runs the host callbacks of the streams subscribed to it.
#[derive(Debug)]
pub struct Reporter {
    /// Its `pthread_t`, as ACL takes it.
    thread_id: u64,
    /// Its Rust identity: a drop on the thread itself (the last handle released by a callback)
    /// must not join it.
    rust_id: ThreadId,
    /// Streams subscribed, unsubscribed on drop.
    subscribed: std::sync::Mutex<Vec<aclrtStream>>,
    // Relaxed is enough: the flag carries no data, and the join orders everything after it.
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

// SAFETY: the stream handles are only passed back to ACL (unsubscribed), from any thread.
unsafe impl Send for Reporter {}
// SAFETY: as above; the list is behind a mutex.
unsafe impl Sync for Reporter {}

impl Reporter {
    /// Starts the thread `name` on `device`; `on_start` runs first on it (for the caller's own
    /// thread-local marks). Fails with ACL's error when the thread cannot take the device.
    pub fn start(name: String, device: i32, on_start: impl FnOnce() + Send + 'static) -> Result<Reporter> {
        acl()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let set = set_device(device);
                let ok = set.is_ok();
                let _ = ready_tx.send(set);
                if !ok {
                    return;
                }
                on_start();
                let Ok(api) = acl() else { return };
                while !flag.load(Ordering::Relaxed) {
                    // SAFETY: a plain timeout. The callbacks it runs are `launch`'s, whose
                    // contract keeps their data valid.
                    let code = unsafe { (api.aclrtProcessReport)(super::timeout_ms(POLL)) };
                    // A timeout with nothing to run is its usual answer. Another error (no
                    // stream subscribed yet, say) may come back at once: the thread naps rather
                    // than spin, and a stream whose callback cannot run shows it in its waits.
                    if code != sys::ACL_SUCCESS && code != sys::ACL_ERROR_RT_REPORT_TIMEOUT {
                        std::thread::sleep(POLL / 10);
                    }
                }
            })
            .map_err(|e| AscendError::Thread { what: "starting the host callbacks' thread", detail: e.to_string() })?;
        let started = ready_rx.recv().unwrap_or_else(|_| {
            Err(AscendError::Thread {
                what: "starting the host callbacks' thread",
                detail: "it ended before it had set its device".into(),
            })
        });
        // `pthread_t` is an `unsigned long`: 64 bits where CANN runs, narrower elsewhere.
        #[allow(clippy::unnecessary_cast)]
        let thread_id = thread.as_pthread_t() as u64;
        let reporter = Reporter {
            thread_id,
            rust_id: thread.thread().id(),
            subscribed: std::sync::Mutex::new(Vec::new()),
            stop,
            thread: Some(thread),
        };
        started.map(|()| reporter)
    }

    /// Makes this thread the one that runs `stream`'s callbacks (a stream has at most one).
    /// The stream must outlive the reporter, or be unsubscribed with it: drop the reporter
    /// first.
    pub fn subscribe(&self, stream: &Stream) -> Result<()> {
        let api = acl()?;
        // SAFETY: a live thread of this process and a live stream handle.
        api.check("aclrtSubscribeReport", unsafe { (api.aclrtSubscribeReport)(self.thread_id, stream.raw()) })?;
        self.subscribed.lock().unwrap_or_else(|p| p.into_inner()).push(stream.raw());
        Ok(())
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Ok(api) = acl() {
            for raw in self.subscribed.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
                // SAFETY: subscribed by this value; the stream is still alive (`subscribe`'s
                // contract). A failure has no caller to report to.
                let _ = unsafe { (api.aclrtUnSubscribeReport)(self.thread_id, raw) };
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // On its own thread (a callback released the last handle) the thread ends by
            // itself once the callback returns.
            if std::thread::current().id() != self.rust_id {
                let _ = t.join();
            }
        }
    }
}

/// Enqueues `f(data)` on `stream`, run by the thread subscribed to it when the stream reaches
/// it; with `block`, the stream's later work waits until `f` has returned.
///
/// # Safety
/// `data` stays valid until `f` has run; `f` does not unwind. A thread must be subscribed to
/// `stream` ([`Reporter::subscribe`]), or the callback never runs (and, blocking, holds the
/// stream).
pub unsafe fn launch(
    stream: &Stream,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
    block: bool,
) -> Result<()> {
    let api = acl()?;
    let kind = if block { sys::ACL_CALLBACK_BLOCK } else { sys::ACL_CALLBACK_NO_BLOCK };
    // SAFETY: a live stream; `f` and `data` as the contract says.
    api.check("aclrtLaunchCallback", unsafe { (api.aclrtLaunchCallback)(Some(f), data, kind, stream.raw()) })
}
