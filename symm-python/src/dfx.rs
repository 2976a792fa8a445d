//! Diagnostics from Python: log lines into `logging`, per-operation statistics, the
//! flight-recorder dump and records, the SIGUSR1 dump.
//!
//! ## The log sink and the GIL
//!
//! The core calls its sink from whatever thread logs: a Python thread inside a blocking call
//! (the GIL released by `detach`, or by a collective's own hook while it waits, which PyO3
//! does not know of: the sink then takes the GIL through the C API), a Python thread holding
//! the GIL, or a background thread of the core (`symm-*`: the signal-dump reader, the store
//! server). Every line is queued first;
//! then a thread that may take the GIL drains the queue into the Python callback
//! (`symm._diag._forward`), in order. A background `symm-*` thread never waits for the GIL (it
//! might hold something a Python thread waits for): its lines stay queued until the next line
//! of a Python thread, or [`flush_log`] (called by `symm.stats`, `symm.dump`, ...). The queue
//! is bounded; lines over the bound are counted and reported. After the interpreter starts
//! shutting down (or once the sink is removed by the `atexit` hook) lines go to stderr.
//!
//! The core holds its sink lock (shared) while a sink runs, and takes it exclusively to
//! replace the sink: installing and removing therefore happen with the GIL released, so that
//! a thread waiting for the GIL inside the sink cannot block the installer forever.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use symm_core::dfx::{self, Level};
use symm_core::Rank;

use crate::comm::PyCommunicator;
use crate::errors::{self, IntoPyResult};

/// Lines kept while no thread can hand them to Python; older ones are dropped beyond this.
const QUEUE_LIMIT: usize = 10_000;

/// The Python callback `(level: int, line: str) -> None` (set once).
static CALLBACK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// Whether the installed sink forwards to Python (false: it writes to stderr).
static FORWARDING: AtomicBool = AtomicBool::new(false);
/// Lines waiting for the GIL, and how many were dropped because the queue was full.
static QUEUE: Mutex<(VecDeque<(Level, String)>, u64)> = Mutex::new((VecDeque::new(), 0));

fn queue() -> std::sync::MutexGuard<'static, (VecDeque<(Level, String)>, u64)> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this thread is one of the core's background threads (never waits for the GIL).
fn background_thread() -> bool {
    std::thread::current().name().is_some_and(|n| n.starts_with("symm-"))
}

/// The sink installed into the core.
fn sink(level: Level, line: &str) {
    {
        let mut q = queue();
        if q.0.len() >= QUEUE_LIMIT {
            q.0.pop_front();
            q.1 += 1;
        }
        q.0.push_back((level, line.to_string()));
    }
    if !FORWARDING.load(Ordering::Acquire) {
        drain_to_stderr();
        return;
    }
    if background_thread() {
        return;
    }
    if crate::coll::gil_released_by_hook() {
        // Inside a collective that released the GIL by hand while it waits: PyO3 still counts
        // this thread as attached, so take the GIL through the C API (the thread has its
        // Python thread state, saved by the collective; `PyGILState_Ensure` restores it and
        // `PyGILState_Release` saves it again).
        // SAFETY: the interpreter is running (the sink forwards only between `install_log_sink`
        // and the `atexit` hook that removes it) and this thread does not hold the GIL.
        let state = unsafe { pyo3::ffi::PyGILState_Ensure() };
        // SAFETY: the GIL is held until the release below.
        drain(unsafe { Python::assume_attached() });
        // SAFETY: pairs with the `PyGILState_Ensure` above, on the same thread.
        unsafe { pyo3::ffi::PyGILState_Release(state) };
        return;
    }
    // `try_attach`: no GIL once the interpreter is shutting down; the lines then go to stderr.
    if Python::try_attach(drain).is_none() {
        drain_to_stderr();
    }
}

fn take() -> (Vec<(Level, String)>, u64) {
    let mut q = queue();
    let lines = q.0.drain(..).collect();
    let dropped = std::mem::take(&mut q.1);
    (lines, dropped)
}

fn drain_to_stderr() {
    let (lines, dropped) = take();
    if dropped > 0 {
        eprintln!("[symm] warn: {dropped} log line(s) dropped (queue full)");
    }
    for (_, l) in lines {
        eprintln!("{l}");
    }
}

/// Hands every queued line to the Python callback (the queue lock is not held while Python runs).
fn drain(py: Python<'_>) {
    let Some(cb) = CALLBACK.get(py) else {
        drain_to_stderr();
        return;
    };
    loop {
        let (lines, dropped) = take();
        if lines.is_empty() && dropped == 0 {
            return;
        }
        if dropped > 0 {
            let text = format!("[symm] warn: {dropped} log line(s) dropped (queue full)");
            if let Err(e) = cb.call1(py, (Level::Warn as u8, text)) {
                e.write_unraisable(py, None);
            }
        }
        for (level, line) in lines {
            if let Err(e) = cb.call1(py, (level as u8, line)) {
                e.write_unraisable(py, None);
            }
        }
    }
}

/// Routes the core's log lines to `callback(level, line)` (levels: 1 error ... 5 trace).
/// Idempotent; the first callback stays.
#[pyfunction]
pub fn install_log_sink(py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
    if !callback.bind(py).is_callable() {
        return Err(errors::unranked_invalid(
            py,
            &format!("callback = {}: expected a callable (level, line)", crate::comm::repr(callback.bind(py))),
        ));
    }
    let _ = CALLBACK.get_or_init(py, || callback);
    FORWARDING.store(true, Ordering::Release);
    py.detach(|| dfx::set_log_sink(Box::new(sink)));
    Ok(())
}

/// Sends the core's log lines to stderr again (called at exit, before the interpreter goes).
#[pyfunction]
pub fn remove_log_sink(py: Python<'_>) {
    flush_log(py);
    FORWARDING.store(false, Ordering::Release);
    py.detach(dfx::reset_log_sink);
}

/// Hands lines queued by background threads to Python now.
#[pyfunction]
pub fn flush_log(py: Python<'_>) {
    if FORWARDING.load(Ordering::Acquire) {
        drain(py);
    } else {
        drain_to_stderr();
    }
}

/// Sets the core's log level: `off`, `error`, `warn`, `info`, `debug` or `trace`.
#[pyfunction]
pub fn set_log_level(py: Python<'_>, level: &Bound<'_, PyAny>) -> PyResult<()> {
    let bad = || {
        errors::unranked_invalid(
            py,
            &format!("level = {}: expected one of off, error, warn, info, debug, trace", crate::comm::repr(level)),
        )
    };
    let text: String = level.extract().map_err(|_| bad())?;
    let parsed = Level::parse(&text).map_err(|_| bad())?;
    dfx::set_log_level(parsed);
    Ok(())
}

/// The core's log level in effect (`"off"` when nothing is logged).
#[pyfunction]
pub fn log_level() -> &'static str {
    dfx::log_level().map_or("off", Level::name)
}

/// Per-operation statistics of `comm`: one dict per operation with at least one call.
#[pyfunction]
pub fn stats<'py>(py: Python<'py>, comm: &PyCommunicator) -> PyResult<Bound<'py, PyList>> {
    flush_log(py);
    let out = PyList::empty(py);
    for s in dfx::stats(comm.comm()) {
        let d = PyDict::new(py);
        d.set_item("op", s.op)?;
        d.set_item("calls", s.calls)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("time", s.total_ns as f64 / 1e9)?;
        d.set_item("time_ns", s.total_ns)?;
        d.set_item("errors", s.errors)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Sets `comm`'s statistics back to zero.
#[pyfunction]
pub fn reset_stats(comm: &PyCommunicator) {
    dfx::reset_stats(comm.comm());
}

/// The node-wide flight-recorder dump as seen from `comm`.
#[pyfunction]
pub fn dump(py: Python<'_>, comm: &PyCommunicator) -> String {
    flush_log(py);
    let c = comm.comm();
    py.detach(|| dfx::dump(c))
}

/// The dumps of every communicator of this process (what SIGUSR1 prints).
#[pyfunction]
pub fn dump_all(py: Python<'_>) -> String {
    py.detach(dfx::dump_all)
}

fn ranks(r: &[Rank]) -> Vec<u32> {
    r.iter().map(|r| r.0).collect()
}

/// The flight-recorder records of every rank of the node, as dicts (the caller's rank first).
#[pyfunction]
pub fn flight_records<'py>(py: Python<'py>, comm: &PyCommunicator) -> PyResult<Bound<'py, PyList>> {
    let c = comm.comm();
    let all = py.detach(|| dfx::records(c)).py(py)?;
    let out = PyList::empty(py);
    for rr in all {
        let d = PyDict::new(py);
        d.set_item("rank", rr.rank.0)?;
        d.set_item("pid", rr.pid)?;
        d.set_item("total", rr.total)?;
        d.set_item("unreadable", rr.unreadable)?;
        let recs = PyList::empty(py);
        for r in &rr.records {
            let e = PyDict::new(py);
            e.set_item("index", r.index)?;
            e.set_item("op", r.op)?;
            e.set_item("group", r.group_ranks.as_deref().map(ranks))?;
            e.set_item("group_id", r.group_id)?;
            e.set_item("group_size", r.group_size)?;
            e.set_item("seq", r.seq)?;
            e.set_item("count", r.count)?;
            e.set_item("dtype", r.dtype.map(|d| d.name()))?;
            e.set_item("state", r.state.name())?;
            e.set_item("timed", r.timed)?;
            e.set_item("start_ns", r.start_ns)?;
            e.set_item("end_ns", r.end_ns)?;
            recs.append(e)?;
        }
        d.set_item("records", recs)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Installs the SIGUSR1 handler that prints [`dump_all`] to stderr (idempotent).
#[pyfunction]
pub fn install_dump_on_signal(py: Python<'_>) -> PyResult<()> {
    py.detach(dfx::install_dump_on_signal).map_err(|e| {
        let err =
            symm_core::Error::System { rank: Rank(u32::MAX), what: "installing the SIGUSR1 dump".into(), source: e };
        errors::to_py(py, &err)
    })
}

/// The stable error codes of the core (`Error::CODES`).
#[pyfunction]
pub fn error_codes() -> Vec<&'static str> {
    symm_core::Error::CODES.to_vec()
}

/// Adds the diagnostics functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(install_log_sink, m)?)?;
    m.add_function(wrap_pyfunction!(remove_log_sink, m)?)?;
    m.add_function(wrap_pyfunction!(flush_log, m)?)?;
    m.add_function(wrap_pyfunction!(set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(log_level, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_stats, m)?)?;
    m.add_function(wrap_pyfunction!(dump, m)?)?;
    m.add_function(wrap_pyfunction!(dump_all, m)?)?;
    m.add_function(wrap_pyfunction!(flight_records, m)?)?;
    m.add_function(wrap_pyfunction!(install_dump_on_signal, m)?)?;
    m.add_function(wrap_pyfunction!(error_codes, m)?)?;
    Ok(())
}
