//! Logging: one line per event, filtered by a process-wide level, written to a replaceable sink.
//!
//! The level comes from `SYMM_LOG_LEVEL` (`error`, the default, `warn`, `info`, `debug`,
//! `trace`, or `off`) on first use, or from [`set_log_level`]. The sink is stderr unless
//! [`set_log_sink`] installs another one (the Python bindings route lines into `logging`).
//!
//! A disabled event costs one relaxed load and a compare: callers test [`enabled`] before they
//! format anything (the [`symm_log!`](crate::symm_log) macro does it for them).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::RwLock;

/// The environment variable that sets the initial level.
pub const LOG_LEVEL_VAR: &str = crate::config::LOG_LEVEL.name;

/// Importance of a log line; a sink gets the lines at or above the process's level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Level {
    /// Failures that end communication in a group: timeouts (but those of `wait_until`), lost
    /// or exited peers.
    Error = 1,
    /// Every other failed operation (bad arguments, mismatches between ranks, `wait_until`
    /// timeouts).
    Warn = 2,
    /// Life cycle: communicators started and closed, settings in effect.
    Info = 3,
    /// Every operation when it ends (op, group, sequence, size, duration).
    Debug = 4,
    /// Every operation when it starts, too.
    Trace = 5,
}

impl Level {
    /// The lower-case name (`error` ... `trace`), as `SYMM_LOG_LEVEL` takes it.
    pub const fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }

    /// Parses a level name (case-insensitive); `off`/`none` give `Ok(None)`.
    pub fn parse(text: &str) -> Result<Option<Level>, String> {
        let var = crate::config::LOG_LEVEL;
        crate::config::parse_log_level(text).map_err(|_| format!("{} = {text:?}: accepted: {}", var.name, var.accepted))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A log sink: receives the level and the line (no trailing newline).
pub type LogSink = Box<dyn Fn(Level, &str) + Send + Sync>;

/// Not read from the environment yet.
const UNSET: u8 = u8::MAX;
/// Nothing is logged.
const OFF: u8 = 0;

/// The threshold: lines with `level as u8 <= THRESHOLD` are emitted.
static THRESHOLD: AtomicU8 = AtomicU8::new(UNSET);
static SINK: RwLock<Option<LogSink>> = RwLock::new(None);

/// Whether lines of `level` are emitted. The hot-path check: one relaxed load.
#[inline]
pub fn enabled(level: Level) -> bool {
    // Relaxed: the threshold is a lone setting; no other memory is published with it.
    let t = THRESHOLD.load(Ordering::Relaxed);
    let t = if t == UNSET { init_from_env() } else { t };
    level as u8 <= t
}

#[cold]
fn init_from_env() -> u8 {
    // Parsed as a communicator's start-up parses it (which refuses a bad value); a line is all
    // that can be done for a bad value here, before any communicator exists.
    let (t, bad) = match crate::config::read(
        &crate::config::environment,
        &crate::config::LOG_LEVEL,
        crate::config::parse_log_level,
    ) {
        Ok(l) => (l.unwrap_or(Some(Level::Error)).map_or(OFF, |l| l as u8), None),
        Err(e) => (Level::Error as u8, Some(e)),
    };
    // Relaxed: see `enabled`. A concurrent `set_log_level` wins (the CAS fails).
    let _ = THRESHOLD.compare_exchange(UNSET, t, Ordering::Relaxed, Ordering::Relaxed);
    if let Some(e) = bad {
        emit(
            Level::Error,
            &format!("[symm] error: {e}; logging at error level (a communicator's start-up refuses this value)"),
        );
    }
    THRESHOLD.load(Ordering::Relaxed)
}

/// Sets the level for the whole process (`None`: nothing is logged).
pub fn set_log_level(level: Option<Level>) {
    // Relaxed: see `enabled`.
    THRESHOLD.store(level.map_or(OFF, |l| l as u8), Ordering::Relaxed);
}

/// The level in effect (`None`: logging is off).
pub fn log_level() -> Option<Level> {
    [Level::Trace, Level::Debug, Level::Info, Level::Warn, Level::Error].into_iter().find(|&l| enabled(l))
}

/// Sends every line to `sink` instead of stderr, for the whole process.
pub fn set_log_sink(sink: LogSink) {
    *SINK.write().unwrap_or_else(|e| e.into_inner()) = Some(sink);
}

/// Sends lines to stderr again.
pub fn reset_log_sink() {
    *SINK.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Hands one finished line to the sink (stderr by default), whatever the level.
pub fn emit(level: Level, line: &str) {
    let sink = SINK.read().unwrap_or_else(|e| e.into_inner());
    match sink.as_ref() {
        Some(f) => f(level, line),
        // One piece per line, so that lines of concurrent ranks do not interleave (eprint!, not
        // a raw write, so that test harnesses capture it).
        None => {
            let text = format!("{line}\n");
            eprint!("{text}");
        }
    }
}

/// Logs `format!(...)` at `level`, prefixed with `[symm] <level> rank <r>`, when enabled.
#[macro_export]
macro_rules! symm_log {
    ($level:expr, $rank:expr, $($arg:tt)+) => {
        if $crate::dfx::log::enabled($level) {
            let level = $level;
            $crate::dfx::log::emit(level, &format!("[symm] {} rank {}: {}", level, $rank, format_args!($($arg)+)));
        }
    };
}
