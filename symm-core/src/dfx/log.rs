//! Logging through the `log` facade: one line per event, target [`TARGET`], at these levels:
//! `error`: failures that end communication in a group (timeouts but those of `wait_until`,
//! lost or exited peers), with the node's flight-recorder dump; `warn`: every other failed
//! operation (bad arguments, mismatches between ranks, `wait_until` timeouts); `info`:
//! communicators started and closed, settings in effect; `debug`: every operation when it
//! ends; `trace`: also when it starts.
//!
//! `log`'s max level is the threshold, so a disabled line costs one relaxed load. `log` leaves
//! the choice of the logger to the application, early in `main`; symm installs its own
//! ([`StderrLogger`]) only where none is set when symm first starts ([`init`]), with the max
//! level from `SYMM_LOG_LEVEL` (default `error`). Under an application's logger symm sets the
//! max level (process-wide: it filters every crate's lines) only when `SYMM_LOG_LEVEL` is set or
//! [`set_log_level`] is called.

use std::sync::Once;

pub use log::Level;
use log::{LevelFilter, Log, Metadata, Record};

/// The environment variable that sets the initial level.
pub const LOG_LEVEL_VAR: &str = crate::config::LOG_LEVEL.name;

/// The target of symm's lines (the Python bindings' `logging` logger).
pub const TARGET: &str = "symm";

static INIT: Once = Once::new();

/// symm's logger where the application has none: each line to stderr as
/// `[<target>] <level> <message>`.
#[derive(Debug)]
pub struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &Record<'_>) {
        // One piece per line, so that lines of concurrent ranks do not interleave (eprint!, not
        // a raw write, so that test harnesses capture it).
        let line = format!("[{}] {} {}\n", r.target(), r.level().as_str().to_ascii_lowercase(), r.args());
        eprint!("{line}");
    }

    fn flush(&self) {}
}

/// [`init_with`] symm's [`StderrLogger`]: called when symm first starts (a
/// [`Bootstrap`](crate::Bootstrap), a start-up store server, [`set_log_level`], [`log_level`]).
pub fn init() {
    init_with(&StderrLogger);
}

/// Once per process (later calls do nothing): makes `logger` the process's logger unless the
/// application set one, and sets `log`'s max level from `SYMM_LOG_LEVEL`, or to `error` when
/// unset and `logger` was installed.
pub fn init_with(logger: &'static dyn Log) {
    INIT.call_once(|| {
        let read =
            crate::config::read(&crate::config::environment, &crate::config::LOG_LEVEL, crate::config::parse_log_level);
        let ours = log::set_logger(logger).is_ok();
        if let Some(level) = read.as_ref().ok().copied().flatten().or(ours.then_some(Some(Level::Error))) {
            set_max(level);
        }
        if let Err(e) = read {
            log::error!(target: TARGET, "{e}; logging at error level (a communicator's start-up refuses this value)");
        }
    });
}

fn set_max(level: Option<Level>) {
    log::set_max_level(level.map_or(LevelFilter::Off, |l| l.to_level_filter()));
}

/// Sets `log`'s max level for the whole process (`None`: nothing is logged).
pub fn set_log_level(level: Option<Level>) {
    init();
    set_max(level);
}

/// The level in effect (`None`: logging is off).
pub fn log_level() -> Option<Level> {
    init();
    log::max_level().to_level()
}

/// Logs `format!(...)` as `rank <r>: ...` at `level`, target [`TARGET`], when enabled.
#[macro_export]
macro_rules! symm_log {
    ($level:expr, $rank:expr, $($arg:tt)+) => {
        $crate::__log::log!(target: $crate::dfx::log::TARGET, $level, "rank {}: {}", $rank, format_args!($($arg)+))
    };
}
