//! Diagnostics from Python: log lines into `logging`, per-operation statistics, the
//! flight-recorder dump and records, the SIGUSR1 dump.
//!
//! ## The logger and the GIL
//!
//! The core's `log` logger is [`Queue`] (installed when the module loads), which hands records
//! to `pyo3_log` (the `logging` logger named by the target: `symm`) from `symm.init` on, and
//! writes them to stderr before that, after the interpreter starts shutting down, and once the
//! `atexit` hook calls [`remove_log_sink`]. A record comes from whatever thread logs: a Python
//! thread inside a blocking call (the GIL released by `detach`, or by a collective's own hook
//! while it waits, which PyO3 does not know of: the GIL is then taken through the C API), a
//! Python thread holding the GIL, or a background thread of the core (`symm-*`: the
//! signal-dump reader, the store server). Every record is queued first; then a thread that may
//! take the GIL drains the queue into `pyo3_log`, in order. A background `symm-*` thread never
//! waits for the GIL (it might hold something a Python thread waits for): its records stay
//! queued until the next record of a Python thread, or [`flush_log`] (called by `symm.stats`,
//! `symm.dump`, ...). The queue is bounded; records over the bound are counted and reported.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use log::{Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use symm_core::dfx::log::{StderrLogger, TARGET};
use symm_core::dfx::{self, Level};
use symm_core::Rank;

use crate::comm::PyCommunicator;
use crate::errors::{self, IntoPyResult};

/// Records kept while no thread can hand them to Python; older ones are dropped beyond this.
const QUEUE_LIMIT: usize = 10_000;

/// The bridge into `logging` (set once, by [`install_log_sink`]).
static PYTHON: PyOnceLock<pyo3_log::Logger> = PyOnceLock::new();
/// Whether records go to Python (false: to stderr).
static FORWARDING: AtomicBool = AtomicBool::new(false);
/// Records waiting for the GIL, and how many were dropped because the queue was full.
static QUEUE: Mutex<(VecDeque<(Level, String)>, u64)> = Mutex::new((VecDeque::new(), 0));

fn queue() -> std::sync::MutexGuard<'static, (VecDeque<(Level, String)>, u64)> {
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this thread is one of the core's background threads (never waits for the GIL).
fn background_thread() -> bool {
    std::thread::current().name().is_some_and(|n| n.starts_with("symm-"))
}

/// The core's logger.
struct Queue;

impl Log for Queue {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &Record<'_>) {
        {
            let mut q = queue();
            if q.0.len() >= QUEUE_LIMIT {
                q.0.pop_front();
                q.1 += 1;
            }
            // Only symm logs in this module: the target is always symm's.
            q.0.push_back((r.level(), r.args().to_string()));
        }
        if !FORWARDING.load(Ordering::Acquire) {
            drain_to(&mut to_stderr);
            return;
        }
        if background_thread() {
            return;
        }
        if crate::coll::gil_released_by_hook() {
            // Inside a collective that released the GIL by hand while it waits: PyO3 still
            // counts this thread as attached, so take the GIL through the C API (the thread has
            // its Python thread state, saved by the collective; `PyGILState_Ensure` restores it
            // and `PyGILState_Release` saves it again).
            // SAFETY: the interpreter is running (records are forwarded only between
            // `install_log_sink` and the `atexit` hook that stops it) and this thread does not
            // hold the GIL.
            let state = unsafe { pyo3::ffi::PyGILState_Ensure() };
            // SAFETY: the GIL is held until the release below.
            drain(unsafe { Python::assume_attached() });
            // SAFETY: pairs with the `PyGILState_Ensure` above, on the same thread.
            unsafe { pyo3::ffi::PyGILState_Release(state) };
            return;
        }
        // `try_attach`: no GIL once the interpreter is shutting down; records then go to stderr.
        if Python::try_attach(drain).is_none() {
            drain_to(&mut to_stderr);
        }
    }

    fn flush(&self) {}
}

/// Hands every queued record to `to`, in order (the queue lock is not held meanwhile).
fn drain_to(to: &mut dyn FnMut(&Record<'_>)) {
    let mut hand = |level, message: &str| {
        to(&Record::builder().level(level).target(TARGET).args(format_args!("{message}")).build())
    };
    loop {
        let (records, dropped): (Vec<(Level, String)>, u64) = {
            let mut q = queue();
            (q.0.drain(..).collect(), std::mem::take(&mut q.1))
        };
        if records.is_empty() && dropped == 0 {
            return;
        }
        if dropped > 0 {
            hand(Level::Warn, &format!("{dropped} log line(s) dropped (queue full)"));
        }
        for (level, message) in records {
            hand(level, &message);
        }
    }
}

/// Writes a record to stderr, as the core's own logger does.
fn to_stderr(r: &Record<'_>) {
    StderrLogger.log(r);
}

/// Hands every queued record to Python; an exception raised by a handler is reported as
/// unraisable (`pyo3_log` leaves it set).
fn drain(py: Python<'_>) {
    let Some(to) = PYTHON.get(py) else {
        return drain_to(&mut to_stderr);
    };
    let pending = PyErr::take(py);
    drain_to(&mut |r| {
        to.log(r);
        if let Some(e) = PyErr::take(py) {
            e.write_unraisable(py, None);
        }
    });
    if let Some(e) = pending {
        e.restore(py);
    }
}

/// Hands the core's log records to `logging` from now on (idempotent).
#[pyfunction]
pub fn install_log_sink(py: Python<'_>) -> PyResult<()> {
    // Trace: the core's level (`log`'s max level) filters, then `logging`'s levels.
    PYTHON.get_or_try_init(py, || {
        pyo3_log::Logger::new(py, pyo3_log::Caching::Loggers).map(|l| l.filter(log::LevelFilter::Trace))
    })?;
    FORWARDING.store(true, Ordering::Release);
    Ok(())
}

/// Sends the core's log records to stderr again (called at exit, before the interpreter goes).
#[pyfunction]
pub fn remove_log_sink(py: Python<'_>) {
    flush_log(py);
    FORWARDING.store(false, Ordering::Release);
}

/// Hands records queued by background threads to Python now.
#[pyfunction]
pub fn flush_log(py: Python<'_>) {
    if FORWARDING.load(Ordering::Acquire) {
        drain(py);
    } else {
        drain_to(&mut to_stderr);
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
    dfx::set_log_level(symm_core::config::parse_log_level(&text).map_err(|_| bad())?);
    Ok(())
}

/// The core's log level in effect (`"off"` when nothing is logged).
#[pyfunction]
pub fn log_level() -> String {
    dfx::log_level().map_or("off", |l| l.as_str()).to_ascii_lowercase()
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
    dfx::log::init_with(&Queue);
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
