//! Process-wide hooks: the communicators alive in this process (for dumps on a signal and for
//! marking them when the process exits), the SIGUSR1 dump, the `atexit` hook, and the fork
//! generation (how a communicator finds out that it is being used in a child of `fork()`).
//!
//! The signal handler is `signal-hook`'s: it only wakes a background thread (async-signal
//! safe), which prints the dumps.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use super::log::TARGET;

/// The environment variable that installs the SIGUSR1 dump when set to `1`.
pub const DUMP_ON_SIGNAL_VAR: &str = crate::config::DUMP_ON_SIGNAL.name;

/// Something alive in this process that diagnostics reach without a reference to it: a
/// communicator's node-wide dump, and its reaction to the process exiting.
pub trait DumpSource: Send + Sync {
    /// The node-wide flight-recorder dump as seen from this communicator.
    fn dump(&self) -> String;
    /// Called from the process's `atexit` hook while the communicator is still open (a normal
    /// exit without dropping it): tell the peers this rank is gone on purpose.
    fn process_exiting(&self) {}
}

/// A registered source: its id, the [`process_generation`] it was registered in, the source.
type Entry = (u64, u64, Arc<dyn DumpSource>);

static SOURCES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ATEXIT: Once = Once::new();

/// Number of `fork()`s between the first [`process_generation`] call and this process: 0 in the
/// process that started symm, bumped in every child by the `pthread_atfork` child handler.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

extern "C" fn on_fork_child() {
    // Relaxed: the child runs one thread when the handler runs; the value is only compared.
    // An atomic add is async-signal safe, as a handler that runs inside fork() must be.
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The process's fork generation: a communicator records it when it is created, and compares
/// it at every call (one relaxed load, no system call): a different value means the call runs
/// in a child of `fork()`, which must not touch the parent's shared state. The first call
/// installs the `pthread_atfork` handler that bumps it in children.
#[inline]
pub fn process_generation() -> u64 {
    ATFORK.call_once(|| {
        // SAFETY: the child handler is an `extern "C"` function without arguments that never
        // unwinds and only does an atomic add (allowed in a child of a multi-threaded fork).
        if unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) } != 0 {
            log::error!(target: TARGET, "pthread_atfork failed; a child of fork() is not told from its parent");
        }
    });
    current_generation()
}

/// The process's fork generation without installing the handler (for the per-call check of a
/// communicator, which installed it when it was created).
#[inline]
pub fn current_generation() -> u64 {
    // Relaxed: changes only in a child, before any of its code runs (inside fork()).
    FORK_GENERATION.load(Ordering::Relaxed)
}

/// Keeps a [`DumpSource`] registered; dropping it unregisters the source (and waits for a dump
/// in progress to finish, so that the source's memory may go right after).
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        SOURCES.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, _, _)| *id != self.0);
    }
}

/// Registers `source` for signal dumps and the exit hook (installing the hook on first use).
pub fn register(source: Arc<dyn DumpSource>) -> Registration {
    ATEXIT.call_once(|| {
        // SAFETY: `on_exit` is an `extern "C"` function without arguments that never unwinds.
        if unsafe { libc::atexit(on_exit) } != 0 {
            log::error!(target: TARGET, "atexit failed; peers will see a normal exit as a lost rank");
        }
    });
    let generation = process_generation();
    // Relaxed: only distinct ids are needed.
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    SOURCES.lock().unwrap_or_else(|e| e.into_inner()).push((id, generation, source));
    Registration(id)
}

/// The dumps of every communicator alive in this process, one after the other.
pub fn dump_all() -> String {
    let sources: Vec<Arc<dyn DumpSource>> =
        SOURCES.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, _, s)| s.clone()).collect();
    if sources.is_empty() {
        return "symm: no communicator is open in this process\n".into();
    }
    sources.iter().map(|s| s.dump()).collect::<Vec<_>>().join("\n")
}

extern "C" fn on_exit() {
    // Nothing may unwind out of an `extern "C"` function; a panic here only loses the marks.
    let _ = std::panic::catch_unwind(|| {
        // Another thread may hold the list (printing a dump) or have died holding it: wait a
        // little, never forever, so that exiting cannot hang.
        for _ in 0..200 {
            let sources = match SOURCES.try_lock() {
                Ok(s) => s,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
            };
            // A child of fork() inherited the parent's list: its communicators belong to the
            // parent, which is still running, and must not be marked exited.
            let now = current_generation();
            for (_, _, s) in sources.iter().filter(|(_, g, _)| *g == now) {
                s.process_exiting();
            }
            return;
        }
    });
}

/// The signal the dump is installed on.
static INSTALL: Mutex<Option<i32>> = Mutex::new(None);

/// Installs a handler for `signal` (SIGUSR1 by default through [`install_dump_on_signal`]) that
/// makes a background thread print [`dump_all`] to stderr. Idempotent per process: a second call
/// with the same signal does nothing; another signal is an error.
pub fn install_dump_on(signal: i32) -> io::Result<()> {
    let mut installed = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    match *installed {
        Some(s) if s == signal => return Ok(()),
        Some(s) => return Err(io::Error::other(format!("the dump is already installed on signal {s}"))),
        None => {}
    }
    let mut signals = signal_hook::iterator::Signals::new([signal])?;
    std::thread::Builder::new().name("symm-dump".into()).spawn(move || {
        // Several signals queued while dumping: one dump answers all of them.
        for _ in signals.forever() {
            use std::io::Write;
            let _ = std::io::stderr().write_all(format!("[symm] dump requested by signal\n{}", dump_all()).as_bytes());
        }
    })?;
    *installed = Some(signal);
    Ok(())
}

/// Installs the SIGUSR1 dump (see [`install_dump_on`]).
pub fn install_dump_on_signal() -> io::Result<()> {
    install_dump_on(signal_hook::consts::SIGUSR1)
}

/// Installs the SIGUSR1 dump when `SYMM_DUMP_ON_SIGNAL` is on; failures are logged, not
/// returned. A value that is not an on/off value is logged too (a communicator's start-up
/// refuses it).
pub fn install_dump_on_signal_from_env() {
    match crate::config::read(&crate::config::environment, &crate::config::DUMP_ON_SIGNAL, crate::config::parse_switch)
    {
        Ok(Some(true)) => install_dump_on_signal_logged(),
        Ok(_) => {}
        Err(e) => log::error!(target: TARGET, "{e}; no SIGUSR1 dump"),
    }
}

/// Installs the SIGUSR1 dump; a failure is logged, not returned (the dump is a diagnostic).
pub fn install_dump_on_signal_logged() {
    if let Err(e) = install_dump_on_signal() {
        log::error!(target: TARGET, "{DUMP_ON_SIGNAL_VAR} is on but the SIGUSR1 handler failed: {e}");
    }
}
