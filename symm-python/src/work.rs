//! Asynchronous operations from Python (`async_op=True`): the communicator's stream, the work
//! objects (`symm.Work`, with `torch.distributed.Work`'s conventions) and the tensors in flight.
//!
//! Every asynchronous operation of a communicator is enqueued on one stream of it, created on
//! first use ([`symm_core::stream`]: the CPU backend runs it on a progress thread), so that a
//! rank's asynchronous operations run in the order it issued them, and its host calls on a group
//! wait for its stream work on that group (the core's contract).
//!
//! **Tensors in flight.** An operation in flight reads and writes its tensors' memory from the
//! progress thread. The communicator holds every tensor of the operation (the Python objects)
//! until its completion has been seen: by `Work.wait`, `Work.is_completed`, the thread that
//! completes futures, or the sweep a later call makes ([`AsyncOps::sweep`]). A work object that
//! is dropped unwaited does not cancel anything and does not release its tensors early. With
//! `SYMM_VALIDATE=1` every operation first checks its tensors against the memory of the
//! operations still in flight ([`AsyncOps::check`]).
//!
//! **Futures.** `Work.get_future()` returns the platform's future (`torch.futures.Future`),
//! completed with the operation's output tensors, or set to its exception, by whichever sees the
//! completion first: a `wait` or `is_completed` of the work, or the communicator's one future
//! thread (`symm._api._watch`, started on the first future that is not complete yet), which
//! waits for the watched works in order (the stream completes them in order) with the GIL
//! released. No thread per work.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyList;
use symm_core::{Backend, Error, Event, Group, Rank, Stream, StreamBackend};
use symm_registry::Comm;

use crate::comm::{timeout_arg, Local, PyCommunicator};
use crate::errors::{invalid, to_py, IntoPyResult};

/// A tensor of an operation: the argument it was given as (and its entry in a list), the
/// object, and the memory the operation reads or writes on this rank.
pub(crate) struct Held {
    pub(crate) arg: &'static str,
    pub(crate) entry: Option<usize>,
    pub(crate) obj: Py<PyAny>,
    pub(crate) local: Local,
}

/// An operation in flight, as the communicator tracks it.
struct Tracked {
    id: u64,
    event: Event,
    op: &'static str,
    held: Vec<Held>,
}

/// The asynchronous operations of one communicator.
#[derive(Default)]
pub(crate) struct AsyncOps {
    /// The stream every asynchronous operation goes on (created on first use).
    stream: Mutex<Option<Stream>>,
    /// The operations whose completion has not been seen yet, in issue order.
    in_flight: Mutex<Vec<Tracked>>,
    /// `in_flight.len()`, read without the lock by the fast arm of the collectives (which
    /// leaves calls to the full arm while it is not 0). Relaxed: it only routes calls; the
    /// full arm reads the list under its lock.
    count: AtomicUsize,
    /// The number of the next work (Relaxed: only unique).
    next_id: AtomicU64,
}

impl std::fmt::Debug for AsyncOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AsyncOps({} in flight)", self.count.load(Ordering::Relaxed))
    }
}

/// Whether two tensors' memory overlaps (empty ranges overlap nothing).
fn overlaps(a: &Local, b: &Local) -> bool {
    a.bytes() > 0 && b.bytes() > 0 && a.ptr < b.ptr + b.bytes() && b.ptr < a.ptr + a.bytes()
}

/// How a tensor is shown in messages.
fn shown(arg: &str, entry: Option<usize>, l: &Local) -> String {
    let at = entry.map(|i| format!("[{i}]")).unwrap_or_default();
    format!("{arg}{at} ({} x {} at {:#x})", l.len, l.dtype, l.ptr)
}

impl AsyncOps {
    /// Whether an asynchronous operation may still be in flight (a hint, see `count`).
    #[inline(always)]
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Tracked>> {
        // Every update of the list is one push or one retain: a panic leaves it consistent.
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stream to enqueue on, created on first use (each operation on it reports its own
    /// result, and the stream goes on after a failure).
    fn stream(&self, comm: &Comm) -> symm_core::Result<Stream> {
        let mut s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        match *s {
            Some(stream) => Ok(stream),
            None => Ok(*s.insert(comm.create_stream()?)),
        }
    }

    /// Stops tracking work `id` (its completion was seen); returns its tensors, which the
    /// caller drops after the lock (dropping a tensor may run Python code).
    fn release(&self, id: u64) -> Vec<Tracked> {
        let mut list = self.lock();
        let (done, left): (Vec<Tracked>, Vec<Tracked>) =
            std::mem::take(&mut *list).into_iter().partition(|t| t.id == id);
        *list = left;
        self.count.store(list.len(), Ordering::Relaxed);
        done
    }

    /// Stops tracking every operation that has completed (or failed), releasing its tensors.
    pub(crate) fn sweep(&self, comm: &Comm) {
        let done: Vec<Tracked> = {
            let mut list = self.lock();
            let (done, left): (Vec<Tracked>, Vec<Tracked>) =
                std::mem::take(&mut *list).into_iter().partition(|t| !matches!(comm.query_event(&t.event), Ok(false)));
            *list = left;
            self.count.store(list.len(), Ordering::Relaxed);
            done
        };
        drop(done);
    }

    /// With `SYMM_VALIDATE=1`: fails (InvalidArgument naming `arg`, the tensor and the
    /// operation) when `local` overlaps a tensor of an asynchronous operation still in flight;
    /// completed operations are released first.
    /// Also fails where `local` overlaps the memory of another library's asynchronous
    /// operation still in flight ([`foreign_started`]).
    pub(crate) fn check(
        &self,
        py: Python<'_>,
        comm: &Comm,
        arg: &'static str,
        entry: Option<usize>,
        local: &Local,
    ) -> PyResult<()> {
        if !comm.settings().is_some_and(|s| s.validate) {
            return Ok(());
        }
        if let Some(clash) = foreign_clash(py, local.ptr, local.bytes())? {
            let reason = format!(
                "its memory is {clash}: a tensor belongs to the library whose operation uses it until that \
                 work has completed, and one phase of one tensor is never split between two libraries (wait() for \
                 the other library's work first; docs/design.md, \"Interop\")"
            );
            return Err(invalid(py, comm.rank(), arg, shown(arg, entry, local), &reason));
        }
        if !self.any() {
            return Ok(());
        }
        self.sweep(comm);
        let list = self.lock();
        let clash = list.iter().find_map(|t| t.held.iter().find(|h| overlaps(&h.local, local)).map(|h| (t, h)));
        let Some((t, h)) = clash else { return Ok(()) };
        let reason = format!(
            "overlaps {} of an asynchronous {} still in flight (work #{}): a tensor in flight belongs to its \
             operation until its work has completed (wait() for it first; SYMM_VALIDATE=1 checks this)",
            shown(h.arg, h.entry, &h.local),
            t.op,
            t.id
        );
        let value = shown(arg, entry, local);
        drop(list);
        Err(invalid(py, comm.rank(), arg, value, &reason))
    }

    /// With the operations still in flight swept first: how symm's operation that uses memory
    /// overlapping `[lo, lo + bytes)` is shown, if one does (the interop guard's question
    /// before another library's call, `symm._interop`).
    pub(crate) fn clash(&self, comm: &Comm, lo: usize, bytes: usize) -> Option<String> {
        if !self.any() {
            return None;
        }
        self.sweep(comm);
        let range = Local { ptr: lo, len: bytes, dtype: symm_core::DType::U8 };
        let list = self.lock();
        list.iter().find_map(|t| {
            t.held.iter().find(|h| overlaps(&h.local, &range)).map(|h| {
                format!(
                    "{} of symm's asynchronous {} still in flight (work #{})",
                    shown(h.arg, h.entry, &h.local),
                    t.op,
                    t.id
                )
            })
        })
    }

    /// Enqueues an operation (`enqueue`, given the communicator and its stream) and returns its
    /// work, which completes its future with the tensors of `outputs` (arguments by name, in
    /// the order given). Every tensor of `held` stays held until its completion is seen.
    pub(crate) fn start(
        &self,
        comm_obj: &Bound<'_, PyCommunicator>,
        op: &'static str,
        held: Vec<Held>,
        outputs: &[&str],
        enqueue: impl FnOnce(&Comm, &Stream) -> symm_core::Result<Event>,
    ) -> PyResult<Py<PyWork>> {
        self.start_on(comm_obj, None, op, held, outputs, enqueue)
    }

    /// [`AsyncOps::start`] on `on` (a device communicator's caller stream), or on the
    /// communicator's own stream when `None`.
    pub(crate) fn start_on(
        &self,
        comm_obj: &Bound<'_, PyCommunicator>,
        on: Option<Stream>,
        op: &'static str,
        held: Vec<Held>,
        outputs: &[&str],
        enqueue: impl FnOnce(&Comm, &Stream) -> symm_core::Result<Event>,
    ) -> PyResult<Py<PyWork>> {
        let py = comm_obj.py();
        let comm = comm_obj.get().comm();
        let stream = match on {
            Some(s) => s,
            None => self.stream(comm).py(py)?,
        };
        let event = enqueue(comm, &stream).py(py)?;
        let result: Vec<Py<PyAny>> = outputs
            .iter()
            .flat_map(|o| held.iter().filter(move |h| h.arg == *o))
            .map(|h| h.obj.clone_ref(py))
            .collect();
        let result = PyList::new(py, result)?.into_any().unbind();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut list = self.lock();
            list.push(Tracked { id, event, op, held });
            self.count.store(list.len(), Ordering::Relaxed);
        }
        let work = PyWork { comm: comm_obj.clone().unbind(), event, id, op, result, state: Mutex::default() };
        Py::new(py, work)
    }
}

/// What a work knows of its end.
#[derive(Default)]
struct WorkState {
    /// Its outcome, once seen.
    outcome: Option<Result<(), Error>>,
    /// Its future, once asked for.
    future: Option<Py<PyAny>>,
}

/// An asynchronous operation (``async_op=True``), with ``torch.distributed.Work``'s methods.
///
/// The operation's tensors belong to it until it has completed: do not read, write, resize or
/// free them before ``wait()`` (or ``is_completed()``) has returned true. The communicator holds
/// them meanwhile, even when this object is dropped unwaited.
#[pyclass(frozen, module = "symm._symm", name = "Work")]
pub struct PyWork {
    comm: Py<PyCommunicator>,
    event: Event,
    id: u64,
    op: &'static str,
    /// What its future is completed with: a list of the operation's output tensors.
    result: Py<PyAny>,
    state: Mutex<WorkState>,
}

impl std::fmt::Debug for PyWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Work(#{} {})", self.id, self.op)
    }
}

impl PyWork {
    fn lock(&self) -> std::sync::MutexGuard<'_, WorkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn known(&self) -> Option<Result<(), Error>> {
        self.lock().outcome.clone()
    }

    /// Records the outcome (the first one seen), releases the operation's tensors and
    /// completes the future, if one was asked for; returns the outcome recorded.
    fn finish(&self, py: Python<'_>, outcome: Result<(), Error>) -> PyResult<Result<(), Error>> {
        let (outcome, future) = {
            let mut st = self.lock();
            if let Some(o) = &st.outcome {
                return Ok(o.clone());
            }
            st.outcome = Some(outcome.clone());
            (outcome, st.future.as_ref().map(|f| f.clone_ref(py)))
        };
        drop(self.comm.get().asyncs().release(self.id));
        if let Some(f) = future {
            self.complete(py, f.bind(py), &outcome)?;
        }
        Ok(outcome)
    }

    /// Completes `future` with the outcome.
    fn complete(&self, py: Python<'_>, future: &Bound<'_, PyAny>, outcome: &Result<(), Error>) -> PyResult<()> {
        match outcome {
            Ok(()) => future.call_method1(intern!(py, "set_result"), (self.result.bind(py),))?,
            Err(e) => future.call_method1(intern!(py, "set_exception"), (to_py(py, e).into_value(py),))?,
        };
        Ok(())
    }

    /// The outcome after `waited` (the result of a bounded wait): an error of the wait itself
    /// (a timeout) while the operation is still in flight is returned as `Err` of the outer
    /// result; otherwise the operation's outcome, recorded.
    fn after_wait(&self, py: Python<'_>, waited: symm_core::Result<()>) -> PyResult<Result<Result<(), Error>, Error>> {
        let comm = self.comm.get().comm();
        let outcome = match waited {
            Ok(()) => Ok(()),
            Err(e) => match comm.query_event(&self.event) {
                Ok(false) => return Ok(Err(e)),
                Ok(true) => Ok(()),
                Err(failure) => Err(failure),
            },
        };
        self.finish(py, outcome).map(Ok)
    }

    fn raise(py: Python<'_>, outcome: Result<(), Error>) -> PyResult<bool> {
        outcome.map(|()| true).py(py)
    }
}

#[pymethods]
impl PyWork {
    /// Blocks (the GIL released) until the operation has completed, or ``timeout`` passes.
    ///
    /// Args:
    ///     timeout: seconds or a ``datetime.timedelta``; None: ``SYMMETRIC_MEMORY_TIMEOUT``
    ///         (counted from this call: an operation that starts later and fails by its own
    ///         timeout may still be in flight when it ends; give a longer one to see its error).
    ///
    /// Returns:
    ///     bool: True; its tensors are the caller's again.
    ///
    /// Raises:
    ///     the operation's error, with the class and message of the blocking form (or the
    ///     error of an earlier asynchronous operation of this communicator that failed before
    ///     it ran, which it may depend on). Timeout: not complete in time (naming the stream
    ///     and the operation running on it); the operation stays in flight, with its tensors.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        if let Some(o) = self.known() {
            return Self::raise(py, o);
        }
        let owner = self.comm.get();
        let comm = owner.comm();
        let timeout = timeout_arg(py, owner.rank_id(), timeout)?.unwrap_or(comm.default_timeout());
        let event = self.event;
        let waited = py.detach(|| comm.synchronize_event(&event, timeout));
        match self.after_wait(py, waited)? {
            Ok(outcome) => Self::raise(py, outcome),
            Err(timed_out) => Err(to_py(py, &timed_out)),
        }
    }

    /// Whether the operation has completed (does not block); raises its error if it failed.
    fn is_completed(&self, py: Python<'_>) -> PyResult<bool> {
        if let Some(o) = self.known() {
            return Self::raise(py, o);
        }
        let outcome = match self.comm.get().comm().query_event(&self.event) {
            Ok(false) => return Ok(false),
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        let outcome = self.finish(py, outcome)?;
        Self::raise(py, outcome)
    }

    /// The platform's future (``torch.futures.Future``) of the operation: completed with the
    /// list of its output tensors (the tensor written; for ``shmem_put`` and ``shmem_get``,
    /// ``src``), or set to its exception, once it has completed. The same object every call.
    fn get_future(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(f) = &this.lock().future {
            return Ok(f.clone_ref(py));
        }
        let api = py.import(intern!(py, "symm._api"))?;
        // Made before taking the lock: no Python code runs under it.
        let made = api.call_method0(intern!(py, "_new_future"))?.unbind();
        let (future, outcome) = {
            let mut st = this.lock();
            if let Some(f) = &st.future {
                return Ok(f.clone_ref(py));
            }
            st.future = Some(made.clone_ref(py));
            (made, st.outcome.clone())
        };
        match outcome {
            Some(o) => this.complete(py, future.bind(py), &o)?,
            None => {
                api.call_method1(intern!(py, "_watch"), (slf,))?;
            }
        }
        Ok(future)
    }

    /// Waits until the operation has completed, however long that takes (each of its waits is
    /// bounded), and records its outcome: what the future thread calls. Raises nothing for the
    /// operation's own error (the future gets it).
    fn _settle(&self, py: Python<'_>) -> PyResult<()> {
        let comm = self.comm.get().comm();
        let (event, slice) = (self.event, comm.default_timeout().max(Duration::from_millis(100)));
        while self.known().is_none() {
            let waited = py.detach(|| comm.synchronize_event(&event, slice));
            self.after_wait(py, waited)?.ok();
        }
        Ok(())
    }

    /// Blocks until the operation has completed, as ``wait()`` with the default timeout
    /// (``torch.distributed.Work.synchronize``: on a CPU node there is no device stream to
    /// order after the operation, so the caller's thread waits). Raises what ``wait`` raises.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.wait(py, None).map(drop)
    }

    /// The list of the operation's output tensors (what its future is completed with), once
    /// it has completed successfully. Raises its error if it failed, and ``InvalidArgument``
    /// while it is in flight (its tensors are the operation's until then: ``wait()`` first).
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if !self.is_completed(py)? {
            return Err(invalid(
                py,
                self.comm.get().comm().rank(),
                "work",
                format!("#{} {}", self.id, self.op),
                "is still in flight: its tensors belong to it until wait() or is_completed() returns True",
            ));
        }
        Ok(self.result.clone_ref(py))
    }

    /// Whether the operation has completed without an error (does not block or raise).
    fn is_success(&self, py: Python<'_>) -> bool {
        matches!(self.is_completed(py), Ok(true))
    }

    /// The operation's error as an exception object, once it has failed; None while it is in
    /// flight and after it has completed without one (does not block or raise).
    fn exception(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match self.is_completed(py) {
            Err(e) => Some(e.into_value(py).into_any()),
            Ok(_) => None,
        }
    }

    /// The operation's name (``"allreduce"``, ``"put"`` ...).
    #[getter]
    fn op(&self) -> &'static str {
        self.op
    }

    fn __repr__(&self) -> String {
        let state = match self.known() {
            None => "in flight",
            Some(Ok(())) => "completed",
            Some(Err(_)) => "failed",
        };
        format!("Work(#{} {}, {state})", self.id, self.op)
    }
}

/// The group's stream work done before a blocking call on it, with the GIL released (the
/// core's host call waits for it too, holding whatever the caller holds): bounded by the
/// default timeout, as the core's own wait.
pub(crate) fn settle(py: Python<'_>, comm: &Comm, g: &Group, op: &str) -> PyResult<()> {
    let (rank, timeout): (Rank, Duration) = (comm.rank(), comm.default_timeout());
    py.detach(|| g.settle_streams(rank, op, timeout)).py(py)
}

/// Another library's asynchronous operation whose memory is in flight, as the interop guard
/// (`symm._interop`, installed with `SYMM_VALIDATE=1`) registers it: its tensors' storage
/// ranges, until its work reports completion.
struct Foreign {
    /// `"torch.distributed (gloo)"` and the like.
    library: String,
    op: String,
    /// The library's work object (`is_completed()`).
    work: Py<PyAny>,
    /// How each tensor is shown, and the storage range it lies in.
    ranges: Vec<(String, usize, usize)>,
}

/// Every registered operation of another library, in every communicator of the process: the
/// other library's calls are not tied to one of symm's runtimes.
static FOREIGN: Mutex<Vec<Foreign>> = Mutex::new(Vec::new());
/// `FOREIGN.len()`, read without the lock to route calls (Relaxed: a hint, as `AsyncOps::count`).
static FOREIGN_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Whether another library's operation may still be in flight (calls then take the full arm,
/// which checks their tensors).
#[inline(always)]
pub(crate) fn foreign_any() -> bool {
    FOREIGN_COUNT.load(Ordering::Relaxed) != 0
}

fn foreign() -> std::sync::MutexGuard<'static, Vec<Foreign>> {
    FOREIGN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers another library's asynchronous operation `op` of `library` in flight, its work
/// object and its tensors' `(shown, storage start, storage bytes)`. Its memory is checked by
/// every symm call until `work.is_completed()` is true.
#[pyfunction]
pub(crate) fn foreign_started(library: String, op: String, work: Py<PyAny>, ranges: Vec<(String, usize, usize)>) {
    let mut list = foreign();
    list.push(Foreign { library, op, work, ranges });
    FOREIGN_COUNT.store(list.len(), Ordering::Relaxed);
}

/// How another library's operation in flight that uses memory overlapping `[lo, lo + bytes)`
/// is shown, if one does; the completed ones (asked with `is_completed()`, outside the lock:
/// it may run Python code) are forgotten first.
pub(crate) fn foreign_clash(py: Python<'_>, lo: usize, bytes: usize) -> PyResult<Option<String>> {
    if !foreign_any() || bytes == 0 {
        return Ok(None);
    }
    let works: Vec<Py<PyAny>> = foreign().iter().map(|f| f.work.clone_ref(py)).collect();
    let mut done = Vec::new();
    for w in &works {
        if w.bind(py).call_method0(intern!(py, "is_completed"))?.is_truthy()? {
            done.push(w.as_ptr());
        }
    }
    let finished: Vec<Foreign> = {
        let mut list = foreign();
        let (finished, left) = std::mem::take(&mut *list).into_iter().partition(|f| done.contains(&f.work.as_ptr()));
        *list = left;
        FOREIGN_COUNT.store(list.len(), Ordering::Relaxed);
        finished
    };
    drop(finished);
    let list = foreign();
    Ok(list.iter().find_map(|f| {
        f.ranges.iter().find(|&&(_, start, len)| len > 0 && start < lo + bytes && lo < start + len).map(
            |(shown, _, _)| format!("the storage of {shown} of an unfinished asynchronous {} of {}", f.op, f.library),
        )
    }))
}
