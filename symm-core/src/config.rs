//! Every environment variable symm reads, and [`Config`]: their values, parsed in one place
//! with one policy.
//!
//! [`VARS`] lists each variable with what it accepts, its default, who reads it and whether it
//! must be the same on every rank; the README's table of environment variables is tested
//! against it. [`Config::from_env`] parses every variable a communicator uses when the
//! communicator is created: a value that is not accepted is a [`ConfigError`] naming the
//! variable, the value and what is accepted (never ignored, never replaced by a default), and a
//! blank value counts as unset. The values marked [`Var::agree`] are compared between ranks at
//! start-up ([`Config::agreed`], [`check_agreement`]), so that a disagreement is reported by
//! name there instead of surfacing later as an allocation-size mismatch or a hang.
//!
//! Settings that exist before any communicator (the log level, the SIGUSR1 dump) stay
//! process-wide, but are parsed by the same parsers: a communicator's start-up refuses a bad
//! value of them too.

use std::time::Duration;

use crate::dfx::Level;
use crate::dtype::DType;
use crate::error::{ArgError, BootstrapError};
use crate::rank::Rank;

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBy {
    /// Parsed into [`Config`] when a communicator is created.
    Communicator,
    /// Read by `SimComm::from_env` (set by the launcher, `spawn_ranks`).
    Launcher,
    /// Read by the Python package only.
    Python,
    /// Read by the conformance suite only, not by the library.
    Tests,
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    pub name: &'static str,
    /// What is accepted, as error messages say it.
    pub accepted: &'static str,
    /// The value when unset (or blank), as the README says it.
    pub default: &'static str,
    /// Whether every rank must set it alike (compared at start-up).
    pub agree: bool,
    pub read_by: ReadBy,
}

const fn var(name: &'static str, accepted: &'static str, default: &'static str, agree: bool, read_by: ReadBy) -> Var {
    Var { name, accepted, default, agree, read_by }
}

use ReadBy::{Communicator as C, Launcher as L, Python as P, Tests as T};

const SIZE: &str = "a byte size such as 4096, 64K, 16M or 1G (suffixes K, M, G, T: powers of 1024)";
const SWITCH: &str = "1, true, yes, on or 0, false, no, off";

/// Declares each variable as a constant, and [`VARS`] listing them in this order.
macro_rules! vars {
    ($($name:ident = $var:expr;)*) => {
        $(pub const $name: Var = $var;)*
        /// Every variable symm reads, in the README's order.
        pub const VARS: &[Var] = &[$($name),*];
    };
}

vars! {
    HEAP_SIZE = var("SYMMETRIC_MEMORY_HEAP_SIZE", SIZE, "1G", true, C);
    TIMEOUT = var("SYMMETRIC_MEMORY_TIMEOUT", "seconds from 0.001 to 1e9 (fractions allowed)", "120", false, C);
    // Not compared by value: ranks that name different backends never meet in one start-up.
    BACKEND = var(
        "SYMM_BACKEND",
        "the name of a backend compiled in (lower-case letters, digits, '-' and '_'; sim, ascend)",
        "the first compiled in (sim)",
        false,
        C,
    );
    RANK = var("SYMM_RANK", "an integer from 0 to SYMM_WORLD_SIZE - 1", "none (required)", false, L);
    WORLD_SIZE = var("SYMM_WORLD_SIZE", "an integer from 1 to 1048576", "none (required)", false, L);
    RENDEZVOUS = var("SYMM_RENDEZVOUS", "host:port of the start-up store", "none (required)", false, L);
    RENDEZVOUS_HOSTED = var("SYMM_RENDEZVOUS_HOSTED", "1 or 0", "0", false, L);
    // Ranks agree on it without ever sending it: a record made under another secret fails its MAC.
    JOB_SECRET = var(
        "SYMM_JOB_SECRET",
        "any text of at least 16 bytes (the same on every rank); empty counts as unset",
        "none (Python: shared over the process group)",
        false,
        L,
    );
    SPIN_US = var("SYMM_SPIN_US", "microseconds from 0 to 1000000", "by placement", false, C);
    YIELD_US = var("SYMM_YIELD_US", "microseconds from 0 to 1000000", "by placement", false, C);
    TEST_NAP_MS = var("SYMM_TEST_NAP_MS", "milliseconds from 1 to 3600000", "100", false, C);
    LIGHT_SIGNALS = var("SYMM_LIGHT_SIGNALS", SWITCH, "1", false, C);
    HOST_ID = var("SYMM_HOST_ID", "any text without a line break", "hostname + boot id", false, C);
    LOW_PRECISION = var(
        "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE",
        "float16, bfloat16, float8_e4m3fn, float8_e5m2, none",
        "none",
        true,
        C,
    );
    COLL_WORKSPACE =
        var("SYMM_COLL_WORKSPACE", "a byte size from 64K (suffixes K, M, G, T: powers of 1024)", "16M", true, C);
    ALLREDUCE_LL_MAX = var("SYMM_ALLREDUCE_LL_MAX", "a byte size, or 0 (never)", "1K", true, C);
    ALLREDUCE_ONESHOT_MAX = var("SYMM_ALLREDUCE_ONESHOT_MAX", "a byte size, or 0 (never)", "8K", true, C);
    P2P_CHUNK = var(
        "SYMM_P2P_CHUNK",
        "a byte size from 128 to 16M (suffixes K, M: powers of 1024), rounded up to a multiple of 64",
        "16K",
        true,
        C,
    );
    BCAST_EAGER_MAX = var("SYMM_BCAST_EAGER_MAX", "a byte size up to 8K, or 0 (never)", "by placement", true, C);
    LL_MAX = var("SYMM_LL_MAX", "a byte size up to 4K, or 0 (never)", "2K", false, C);
    STREAM_STORES_MIN = var("SYMM_STREAM_STORES_MIN", "a byte size, or 0 (always)", "16M", false, C);
    COLL_ACCESS = var("SYMM_COLL_ACCESS", "auto or get", "auto", false, C);
    LOG_LEVEL = var("SYMM_LOG_LEVEL", "off, error, warn, info, debug, trace", "error", false, C);
    VALIDATE = var("SYMM_VALIDATE", SWITCH, "0", true, C);
    FLIGHT_RECORDER_ENTRIES = var("SYMM_FLIGHT_RECORDER_ENTRIES", "a number of records from 0 to 65536", "64", true, C);
    STATS = var("SYMM_STATS", SWITCH, "1", false, C);
    TIMING = var("SYMM_TIMING", SWITCH, "0", false, C);
    DUMP_ON_SIGNAL = var("SYMM_DUMP_ON_SIGNAL", SWITCH, "0", false, C);
    FAST_PATH = var("SYMM_FAST_PATH", SWITCH, "1", false, C);
    EXECUTION = var("SYMM_EXECUTION", "host or stream", "host", false, C);
    STREAM_DELAY_US = var("SYMM_STREAM_DELAY_US", "microseconds from 0 to 1000000", "0", false, C);
    COLLECTIVES = var("SYMM_COLLECTIVES", "host or reference", "host", true, C);
    PLATFORM = var("SYMM_PLATFORM", "the name of a registered platform (torch, ...)", "torch", false, P);
    TEST_SEED = var("SYMM_TEST_SEED", "a non-negative integer", "fixed per case", false, T);
    TEST_CASES = var("SYMM_TEST_CASES", "a non-negative integer", "64 and 24", false, T);
    TEST_HEAP_ONLY = var("SYMM_TEST_HEAP_ONLY", "1 or 0", "0", false, T);
}

/// A setting that is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A value its parser refuses.
    #[error("environment variable {var} = {value:?}: {reason}; accepted: {accepted}")]
    Invalid { var: &'static str, value: String, reason: String, accepted: &'static str },
    /// A required variable that is not set.
    #[error("environment variable {var} is not set; accepted: {accepted}")]
    Missing { var: &'static str, accepted: &'static str },
    /// A value that must be the same on every rank and is not.
    #[error("environment variable {var} differs between ranks ({}); it must be set alike on every rank", shown(.values))]
    Disagree { var: &'static str, values: Vec<(Rank, Option<String>)> },
}

fn shown(values: &[(Rank, Option<String>)]) -> String {
    let one = |(r, v): &(Rank, Option<String>)| match v {
        Some(v) => format!("rank {r}: {v:?}"),
        None => format!("rank {r}: unset"),
    };
    values.iter().map(one).collect::<Vec<_>>().join(", ")
}

impl ConfigError {
    /// The variable it names.
    pub fn var(&self) -> &'static str {
        match self {
            ConfigError::Invalid { var, .. } | ConfigError::Missing { var, .. } | ConfigError::Disagree { var, .. } => {
                var
            }
        }
    }

    /// As the error of a bad argument (what the collectives' settings raise).
    pub fn into_arg(self) -> ArgError {
        match self {
            ConfigError::Invalid { var, value, reason, accepted } => {
                ArgError::invalid(var, format!("{value:?}"), format!("{reason}; accepted: {accepted}"))
            }
            e => ArgError::invalid(e.var(), "", e.to_string()),
        }
    }
}

/// Start-up refuses a bad setting as a bootstrap error (`SYMM_E_BOOTSTRAP`) naming it.
impl From<ConfigError> for BootstrapError {
    fn from(e: ConfigError) -> BootstrapError {
        match e {
            ConfigError::Invalid { var, value, reason, accepted } => {
                BootstrapError::Env { var, value: Some(value), reason: format!("{reason}; accepted: {accepted}") }
            }
            ConfigError::Missing { var, accepted } => {
                BootstrapError::Env { var, value: None, reason: format!("required; accepted: {accepted}") }
            }
            // Shown with the value this rank's environment gives it.
            ConfigError::Disagree { var, ref values } => BootstrapError::Env {
                var,
                value: environment(var),
                reason: format!("differs between ranks ({}); it must be set alike on every rank", shown(values)),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsers: each returns why a value is refused; the caller adds the variable and what it accepts.
// ---------------------------------------------------------------------------------------------

/// A byte size such as `1073741824`, `512M`, `1G`, `64KiB` (0 allowed).
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err("not a number of bytes".into());
    }
    let n: usize = num.parse().map_err(|_| "too large".to_string())?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err("unknown suffix".into()),
    };
    n.checked_mul(1usize << shift).ok_or_else(|| "too large".to_string())
}

fn bytes_in(text: &str, min: usize, max: usize) -> Result<usize, String> {
    let b = parse_bytes(text)?;
    if b < min {
        Err(format!("{b} bytes is below the minimum of {min}"))
    } else if b > max {
        Err(format!("{b} bytes is above the maximum of {max}"))
    } else {
        Ok(b)
    }
}

/// An on/off value: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case).
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("not an on/off value".into()),
    }
}

fn integer_in(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let n: u64 = text.trim().parse().map_err(|_| "not a non-negative integer".to_string())?;
    if n < min || n > max {
        return Err(format!("{n} is outside {min}..={max}"));
    }
    Ok(n)
}

/// Seconds, fractions allowed, from 1 ms (shorter bounds cannot even complete a start-up) to
/// 1e9 s (about 31 years: practically unbounded, and still an `Instant` away from now).
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let s: f64 = text.trim().parse().map_err(|_| "not a number of seconds".to_string())?;
    if !(s.is_finite() && (0.001..=1e9).contains(&s)) {
        return Err(format!("{s} s is outside 0.001..=1e9 seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A log level; `Ok(None)` turns logging off.
pub fn parse_log_level(text: &str) -> Result<Option<Level>, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" | "none" => Ok(None),
        "error" => Ok(Some(Level::Error)),
        "warn" | "warning" => Ok(Some(Level::Warn)),
        "info" => Ok(Some(Level::Info)),
        "debug" => Ok(Some(Level::Debug)),
        "trace" => Ok(Some(Level::Trace)),
        _ => Err("not a log level".into()),
    }
}

/// A transport format; `Ok(None)`: `none` (full precision).
pub fn parse_low_precision(text: &str) -> Result<Option<DType>, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match text.trim().parse::<DType>() {
        Ok(d) if crate::coll::lowp::FORMATS.contains(&d) => Ok(Some(d)),
        Ok(d) => Err(format!("{d} is not a transport format")),
        Err(_) => Err("not a transport format".into()),
    }
}

/// The value of `var` read through `get`, with blank values counted as unset.
fn value_of(get: &dyn Fn(&str) -> Option<String>, var: &Var) -> Option<String> {
    get(var.name).filter(|v| !v.trim().is_empty())
}

/// Parses `var` (unset or blank: `None`); a refused value is an error naming it.
pub fn read<T>(
    get: &dyn Fn(&str) -> Option<String>,
    var: &Var,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, ConfigError> {
    match value_of(get, var) {
        None => Ok(None),
        Some(v) => parse(&v).map(Some).map_err(|reason| ConfigError::Invalid {
            var: var.name,
            value: v,
            reason,
            accepted: var.accepted,
        }),
    }
}

/// The process environment, as [`Config::from_lookup`] takes it. A value that is not UTF-8 is
/// read with replacement characters, so that its parser refuses it instead of it reading as
/// unset.
pub fn environment(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// The process environment's value of `var` as bytes, for [`JOB_SECRET`] (any bytes; empty
/// counts as unset).
pub fn environment_bytes(var: &Var) -> Option<Vec<u8>> {
    std::env::var_os(var.name).map(std::os::unix::ffi::OsStringExt::into_vec).filter(|v| !v.is_empty())
}

/// [`TEST_SEED`], [`TEST_CASES`] or [`TEST_HEAP_ONLY`], the conformance suite's settings
/// (`None`: unset).
pub fn test_number(get: &dyn Fn(&str) -> Option<String>, var: &Var) -> Result<Option<u64>, ConfigError> {
    read(get, var, |t| t.trim().parse::<u64>().map_err(|_| "not a non-negative integer".into()))
}

/// `SYMM_RENDEZVOUS` and `SYMM_RENDEZVOUS_HOSTED` (what the launcher sets): the store's
/// address and whether the launcher serves it.
pub fn rendezvous(get: &dyn Fn(&str) -> Option<String>) -> Result<(String, bool), ConfigError> {
    let hosted = read(get, &RENDEZVOUS_HOSTED, |t| match t.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err("expected 1 (the launcher serves the store) or 0".into()),
    })?;
    let addr = read(get, &RENDEZVOUS, |t| {
        let t = t.trim();
        match t.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(t.to_string()),
            _ => Err("not host:port".into()),
        }
    })?
    .ok_or(ConfigError::Missing { var: RENDEZVOUS.name, accepted: RENDEZVOUS.accepted })?;
    Ok((addr, hosted.unwrap_or(false)))
}

/// `SYMM_BACKEND`: the backend's name as spelled (`None`: unset), checked for its spelling only.
pub fn backend(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, ConfigError> {
    read(get, &BACKEND, |t| {
        let t = t.trim();
        if t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            Ok(t.to_string())
        } else {
            Err("not a backend name".into())
        }
    })
}

/// `SYMM_RANK` and `SYMM_WORLD_SIZE` (what the launcher sets), checked together.
pub fn rank_and_world_size(get: &dyn Fn(&str) -> Option<String>) -> Result<(usize, usize), ConfigError> {
    let n = read(get, &WORLD_SIZE, |t| integer_in(t, 1, 1 << 20))?
        .ok_or(ConfigError::Missing { var: WORLD_SIZE.name, accepted: WORLD_SIZE.accepted })?;
    let rank = read(get, &RANK, |t| integer_in(t, 0, n - 1).map_err(|e| format!("{e} (SYMM_WORLD_SIZE = {n})")))?
        .ok_or(ConfigError::Missing { var: RANK.name, accepted: RANK.accepted })?;
    Ok((rank as usize, n as usize))
}

/// Every setting a communicator uses, parsed once when it is created.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `SYMMETRIC_MEMORY_HEAP_SIZE`, bytes.
    pub heap_size: usize,
    /// `SYMMETRIC_MEMORY_TIMEOUT`.
    pub timeout: Duration,
    /// `SYMM_BACKEND` (`None`: the first backend compiled in); which names exist is the
    /// registry's to say (`symm-registry`), this only checks the spelling.
    pub backend: Option<String>,
    /// `SYMM_SPIN_US` (`None`: by placement).
    pub spin: Option<Duration>,
    /// `SYMM_YIELD_US` (`None`: by placement).
    pub yield_for: Option<Duration>,
    /// `SYMM_TEST_NAP_MS` (`None`: the default nap).
    pub nap: Option<Duration>,
    /// `SYMM_LIGHT_SIGNALS`.
    pub light_signals: bool,
    /// `SYMM_HOST_ID`.
    pub host_id: Option<String>,
    /// `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`.
    pub low_precision: Option<DType>,
    /// `SYMM_COLL_WORKSPACE`, bytes.
    pub coll_workspace: usize,
    /// `SYMM_ALLREDUCE_LL_MAX`, bytes.
    pub allreduce_ll_max: usize,
    /// `SYMM_ALLREDUCE_ONESHOT_MAX`, bytes.
    pub allreduce_oneshot_max: usize,
    /// `SYMM_P2P_CHUNK`, bytes, a multiple of 64.
    pub p2p_chunk: usize,
    /// `SYMM_BCAST_EAGER_MAX`, bytes (`None`: by placement).
    pub bcast_eager_max: Option<usize>,
    /// `SYMM_LL_MAX`, bytes.
    pub ll_max: usize,
    /// `SYMM_STREAM_STORES_MIN`, bytes.
    pub stream_stores_min: usize,
    /// `SYMM_COLL_ACCESS=get`.
    pub coll_access_get: bool,
    /// `SYMM_LOG_LEVEL` (`None`: unset, the process's level stays; `Some(None)`: off).
    pub log_level: Option<Option<Level>>,
    /// `SYMM_VALIDATE`.
    pub validate: bool,
    /// `SYMM_FLIGHT_RECORDER_ENTRIES`.
    pub recorder_entries: usize,
    /// `SYMM_STATS`.
    pub stats: bool,
    /// `SYMM_TIMING`.
    pub timing: bool,
    /// `SYMM_DUMP_ON_SIGNAL`.
    pub dump_on_signal: bool,
    /// `SYMM_FAST_PATH` (read by the Python package).
    pub fast_path: bool,
    /// `SYMM_EXECUTION=stream`: every blocking call runs in stream order (see `symm_sim`).
    pub stream_execution: bool,
    /// `SYMM_STREAM_DELAY_US`: the most a stream waits, at random, before each operation (tests).
    pub stream_delay: Duration,
    /// `SYMM_COLLECTIVES`: which implementation serves a backend's collectives.
    pub collectives: CollectiveEngine,
}

/// Which implementation serves the collectives (`SYMM_COLLECTIVES`), on a backend that has both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectiveEngine {
    /// The backend's own (the host engine on the CPU backend).
    #[default]
    Host,
    /// The reference collectives on the stream-ordered primitives (`coll::reference`).
    Reference,
}

/// Default heap size: 1 GiB, as HyperParallel and NVSHMEM.
pub const DEFAULT_HEAP_SIZE: usize = 1 << 30;
/// Default wait bound: 120 s, as Ascend SHMEM's init timeouts.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest `SYMM_LL_MAX`: what the host engine's small-message slots hold (bytes).
pub const LL_LIMIT: usize = 4096;
/// Default of `SYMM_LL_MAX` (bytes); why this size: the host engine's `ll` module.
pub const LL_DEFAULT_MAX_BYTES: usize = 2048;
/// Largest `SYMM_BCAST_EAGER_MAX`: what the host engine's eager-broadcast slots hold (bytes).
pub const BCAST_EAGER_LIMIT: usize = 8 << 10;

impl Default for Config {
    fn default() -> Config {
        Config {
            heap_size: DEFAULT_HEAP_SIZE,
            timeout: DEFAULT_TIMEOUT,
            backend: None,
            spin: None,
            yield_for: None,
            nap: None,
            light_signals: true,
            host_id: None,
            low_precision: None,
            coll_workspace: 16 << 20,
            allreduce_ll_max: 1 << 10,
            allreduce_oneshot_max: 8 << 10,
            p2p_chunk: 16 << 10,
            bcast_eager_max: None,
            ll_max: LL_DEFAULT_MAX_BYTES,
            stream_stores_min: 16 << 20,
            coll_access_get: false,
            log_level: None,
            validate: false,
            recorder_entries: crate::dfx::recorder::DEFAULT_ENTRIES,
            stats: true,
            timing: false,
            dump_on_signal: false,
            fast_path: true,
            stream_execution: false,
            stream_delay: Duration::ZERO,
            collectives: CollectiveEngine::Host,
        }
    }
}

impl Config {
    /// From the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(&environment)
    }

    /// From `get` (a variable's value, `None` when unset); the first refused value is the error.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let d = Config::default();
        let size = |v: &Var, min: usize, max: usize, default: usize| -> Result<usize, ConfigError> {
            Ok(read(get, v, |t| bytes_in(t, min, max))?.unwrap_or(default))
        };
        let switch = |v: &Var, default: bool| -> Result<bool, ConfigError> {
            Ok(read(get, v, parse_switch)?.unwrap_or(default))
        };
        let micros = |v: &Var| read(get, v, |t| integer_in(t, 0, 1_000_000).map(Duration::from_micros));
        Ok(Config {
            heap_size: size(&HEAP_SIZE, 1, usize::MAX, d.heap_size)?,
            timeout: read(get, &TIMEOUT, parse_timeout)?.unwrap_or(d.timeout),
            backend: backend(get)?,
            spin: micros(&SPIN_US)?,
            yield_for: micros(&YIELD_US)?,
            nap: read(get, &TEST_NAP_MS, |t| integer_in(t, 1, 3_600_000).map(Duration::from_millis))?,
            light_signals: switch(&LIGHT_SIGNALS, d.light_signals)?,
            // The start-up exchange separates its fields with line breaks.
            host_id: read(get, &HOST_ID, |t| {
                if t.contains(['\n', '\r']) {
                    Err("contains a line break".into())
                } else {
                    Ok(t.to_string())
                }
            })?,
            low_precision: read(get, &LOW_PRECISION, parse_low_precision)?.flatten(),
            coll_workspace: size(&COLL_WORKSPACE, 64 << 10, usize::MAX, d.coll_workspace)?,
            allreduce_ll_max: size(&ALLREDUCE_LL_MAX, 0, usize::MAX, d.allreduce_ll_max)?,
            allreduce_oneshot_max: size(&ALLREDUCE_ONESHOT_MAX, 0, usize::MAX, d.allreduce_oneshot_max)?,
            // Whole cache lines: every slot's flag is aligned and starts a line; at least a
            // line of header and a line of payload (see the host engine's `p2p` module).
            p2p_chunk: size(&P2P_CHUNK, 128, 16 << 20, d.p2p_chunk)?.next_multiple_of(64),
            bcast_eager_max: read(get, &BCAST_EAGER_MAX, |t| bytes_in(t, 0, BCAST_EAGER_LIMIT))?,
            ll_max: size(&LL_MAX, 0, LL_LIMIT, d.ll_max)?,
            stream_stores_min: size(&STREAM_STORES_MIN, 0, usize::MAX, d.stream_stores_min)?,
            coll_access_get: read(get, &COLL_ACCESS, |t| match t.trim() {
                "auto" => Ok(false),
                "get" => Ok(true),
                _ => Err("not an access mode".into()),
            })?
            .unwrap_or(false),
            log_level: read(get, &LOG_LEVEL, parse_log_level)?,
            validate: switch(&VALIDATE, d.validate)?,
            recorder_entries: read(get, &FLIGHT_RECORDER_ENTRIES, |t| {
                integer_in(t, 0, crate::dfx::recorder::MAX_ENTRIES as u64).map(|n| n as usize)
            })?
            .unwrap_or(d.recorder_entries),
            stats: switch(&STATS, d.stats)?,
            timing: switch(&TIMING, d.timing)?,
            dump_on_signal: switch(&DUMP_ON_SIGNAL, d.dump_on_signal)?,
            fast_path: switch(&FAST_PATH, d.fast_path)?,
            stream_execution: read(get, &EXECUTION, |t| match t.trim() {
                "host" => Ok(false),
                "stream" => Ok(true),
                _ => Err("not an execution model".into()),
            })?
            .unwrap_or(d.stream_execution),
            stream_delay: micros(&STREAM_DELAY_US)?.unwrap_or(d.stream_delay),
            collectives: read(get, &COLLECTIVES, |t| match t.trim() {
                "host" => Ok(CollectiveEngine::Host),
                "reference" => Ok(CollectiveEngine::Reference),
                _ => Err("not an implementation of the collectives".into()),
            })?
            .unwrap_or(d.collectives),
        })
    }

    /// The values every rank must agree on ([`Var::agree`] among [`ReadBy::Communicator`]),
    /// as `(variable, value)` in a canonical spelling: what [`check_agreement`] compares.
    pub fn agreed(&self) -> Vec<(&'static str, String)> {
        let bytes = |b: usize| b.to_string();
        vec![
            (HEAP_SIZE.name, bytes(self.heap_size)),
            (LOW_PRECISION.name, self.low_precision.map_or("none".into(), |d| d.to_string())),
            (COLL_WORKSPACE.name, bytes(self.coll_workspace)),
            (ALLREDUCE_LL_MAX.name, bytes(self.allreduce_ll_max)),
            (ALLREDUCE_ONESHOT_MAX.name, bytes(self.allreduce_oneshot_max)),
            (P2P_CHUNK.name, bytes(self.p2p_chunk)),
            (BCAST_EAGER_MAX.name, self.bcast_eager_max.map_or("by placement".into(), bytes)),
            (VALIDATE.name, if self.validate { "1" } else { "0" }.into()),
            (FLIGHT_RECORDER_ENTRIES.name, self.recorder_entries.to_string()),
            (COLLECTIVES.name, format!("{:?}", self.collectives).to_lowercase()),
        ]
    }

    /// [`Config::agreed`] as the bytes of the start-up round that compares them: one
    /// `NAME=value` line each (values hold no line break).
    pub fn agreed_record(&self) -> Vec<u8> {
        self.agreed().iter().map(|(k, v)| format!("{k}={v}\n")).collect::<String>().into_bytes()
    }
}

/// Compares the records of [`Config::agreed_record`] of every rank (by rank): the first
/// variable whose values differ is an error naming it and every rank's value; a record that
/// cannot be read is `Err(Err(why))`.
pub fn check_agreement(records: &[Vec<u8>]) -> Result<(), Result<ConfigError, String>> {
    let mut parsed: Vec<Vec<(String, String)>> = Vec::with_capacity(records.len());
    for (r, bytes) in records.iter().enumerate() {
        let text = std::str::from_utf8(bytes).map_err(|_| Err(format!("rank {r} sent settings that are not UTF-8")))?;
        let mut lines = Vec::new();
        for line in text.lines() {
            let (k, v) =
                line.split_once('=').ok_or_else(|| Err(format!("rank {r} sent an unreadable setting {line:?}")))?;
            lines.push((k.to_string(), v.to_string()));
        }
        parsed.push(lines);
    }
    let Some(first) = parsed.first() else { return Ok(()) };
    for v in VARS.iter().filter(|v| v.agree && v.read_by == ReadBy::Communicator) {
        let value = |lines: &Vec<(String, String)>| lines.iter().find(|(k, _)| k == v.name).map(|(_, x)| x.clone());
        let mine = value(first);
        if parsed.iter().any(|p| value(p) != mine) {
            let values = parsed.iter().enumerate().map(|(r, p)| (Rank(r as u32), value(p))).collect();
            return Err(Ok(ConfigError::Disagree { var: v.name, values }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(&move |name: &str| owned.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    /// The error for `name = value`, which must name that variable and value and say what is
    /// accepted.
    fn refused(name: &str, value: &str) -> ConfigError {
        let e = with(&[(name, value)]).expect_err(&format!("{name}={value} accepted"));
        let text = e.to_string();
        let accepted = VARS.iter().find(|v| v.name == name).unwrap().accepted;
        assert_eq!(e.var(), name, "{text}");
        assert!(text.contains(name) && text.contains(&format!("{value:?}")) && text.contains(accepted), "{text}");
        e
    }

    #[test]
    fn every_bad_value_of_the_issue_names_its_own_variable() {
        for (name, value) in [
            ("SYMM_COLL_WORKSPACE", "abc"),
            ("SYMM_P2P_CHUNK", "0"),
            ("SYMM_ALLREDUCE_LL_MAX", "garbage"),
            ("SYMM_STREAM_STORES_MIN", "abc"),
            ("SYMM_ALLREDUCE_ONESHOT_MAX", "abc"),
            ("SYMM_LOG_LEVEL", "garbage"),
            ("SYMM_SPIN_US", "abc"),
            ("SYMM_YIELD_US", "-5"),
            ("SYMM_VALIDATE", "garbage"),
            ("SYMM_DUMP_ON_SIGNAL", "garbage"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "1e-9"),
            ("SYMMETRIC_MEMORY_HEAP_SIZE", "12Q"),
        ] {
            let e = refused(name, value);
            assert!(
                !e.to_string().contains("SYMMETRIC_MEMORY_HEAP_SIZE") || name == "SYMMETRIC_MEMORY_HEAP_SIZE",
                "{e}"
            );
        }
    }

    #[test]
    fn every_communicator_variable_refuses_garbage() {
        for v in VARS.iter().filter(|v| v.read_by == ReadBy::Communicator && v.name != HOST_ID.name) {
            refused(v.name, "garbage!");
        }
        refused(HOST_ID.name, "a\nb");
    }

    #[test]
    fn bounds_are_enforced_with_the_accepted_range() {
        for (name, value) in [
            ("SYMMETRIC_MEMORY_TIMEOUT", "0"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "0.0009"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "-1"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "inf"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "NaN"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "2e9"),
            ("SYMMETRIC_MEMORY_HEAP_SIZE", "0"),
            ("SYMMETRIC_MEMORY_HEAP_SIZE", "99999999999999999999T"),
            ("SYMM_COLL_WORKSPACE", "1K"),
            ("SYMM_P2P_CHUNK", "64"),
            ("SYMM_P2P_CHUNK", "1G"),
            ("SYMM_LL_MAX", "8K"),
            ("SYMM_BCAST_EAGER_MAX", "9K"),
            ("SYMM_SPIN_US", "1000001"),
            ("SYMM_TEST_NAP_MS", "0"),
            ("SYMM_FLIGHT_RECORDER_ENTRIES", "65537"),
        ] {
            refused(name, value);
        }
    }

    #[test]
    fn accepted_values_and_defaults() {
        assert_eq!(with(&[]).unwrap(), Config::default());
        // Blank is unset.
        assert_eq!(with(&[("SYMM_COLL_WORKSPACE", " "), ("SYMM_LOG_LEVEL", "")]).unwrap(), Config::default());
        let c = with(&[
            ("SYMMETRIC_MEMORY_HEAP_SIZE", "2GiB"),
            ("SYMMETRIC_MEMORY_TIMEOUT", "0.001"),
            ("SYMM_COLL_WORKSPACE", "64K"),
            ("SYMM_P2P_CHUNK", "130"),
            ("SYMM_ALLREDUCE_ONESHOT_MAX", "0"),
            ("SYMM_BCAST_EAGER_MAX", "0"),
            ("SYMM_LL_MAX", "4K"),
            ("SYMM_SPIN_US", "0"),
            ("SYMM_YIELD_US", "5"),
            ("SYMM_LOG_LEVEL", "OFF"),
            ("SYMM_VALIDATE", "yes"),
            ("SYMM_DUMP_ON_SIGNAL", "1"),
            ("SYMM_COLL_ACCESS", "get"),
            ("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "bfloat16"),
            ("SYMM_BACKEND", " sim "),
        ])
        .unwrap();
        assert_eq!(c.backend.as_deref(), Some("sim"));
        assert_eq!(c.heap_size, 2 << 30);
        assert_eq!(c.timeout, Duration::from_millis(1));
        assert_eq!((c.coll_workspace, c.p2p_chunk, c.allreduce_oneshot_max), (64 << 10, 192, 0));
        assert_eq!((c.bcast_eager_max, c.ll_max), (Some(0), 4096));
        assert_eq!((c.spin, c.yield_for), (Some(Duration::ZERO), Some(Duration::from_micros(5))));
        assert_eq!(c.log_level, Some(None));
        assert!(c.validate && c.dump_on_signal && c.coll_access_get);
        assert_eq!(c.low_precision, Some(DType::BF16));
        assert_eq!(with(&[("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "none")]).unwrap().low_precision, None);
        refused("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "int8");
        refused("SYMM_BACKEND", "Sim");
    }

    #[test]
    fn rank_parsing_names_the_variable() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(rank_and_world_size(&get(&[("SYMM_RANK", "1"), ("SYMM_WORLD_SIZE", "2")])), Ok((1, 2)));
        for (pairs, var) in [
            (&[("SYMM_RANK", "abc"), ("SYMM_WORLD_SIZE", "2")][..], "SYMM_RANK"),
            (&[("SYMM_RANK", "2"), ("SYMM_WORLD_SIZE", "2")][..], "SYMM_RANK"),
            (&[("SYMM_RANK", "-1"), ("SYMM_WORLD_SIZE", "2")][..], "SYMM_RANK"),
            (&[("SYMM_WORLD_SIZE", "2")][..], "SYMM_RANK"),
            (&[("SYMM_RANK", "0"), ("SYMM_WORLD_SIZE", "0")][..], "SYMM_WORLD_SIZE"),
            (&[("SYMM_RANK", "0")][..], "SYMM_WORLD_SIZE"),
        ] {
            let pairs: &'static [(&str, &str)] = pairs;
            let e = rank_and_world_size(&get(pairs)).unwrap_err();
            assert_eq!(e.var(), var, "{e}");
            assert!(!e.to_string().contains("4294967295"), "{e}");
        }
        let e = rank_and_world_size(&get(&[("SYMM_RANK", "abc"), ("SYMM_WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.to_string().contains("\"abc\""), "{e}");
    }

    #[test]
    fn the_collectives_are_the_host_engine_unless_the_reference_is_asked_for() {
        assert_eq!(with(&[]).unwrap().collectives, CollectiveEngine::Host);
        assert_eq!(with(&[("SYMM_COLLECTIVES", "host")]).unwrap().collectives, CollectiveEngine::Host);
        assert_eq!(with(&[("SYMM_COLLECTIVES", " reference ")]).unwrap().collectives, CollectiveEngine::Reference);
        let e = with(&[("SYMM_COLLECTIVES", "fast")]).unwrap_err();
        assert!(e.var() == "SYMM_COLLECTIVES" && e.to_string().contains("\"fast\""), "{e}");
        // The ranks must agree on it.
        let reference = with(&[("SYMM_COLLECTIVES", "reference")]).unwrap();
        let e = check_agreement(&[Config::default().agreed_record(), reference.agreed_record()]).unwrap_err().unwrap();
        assert_eq!(e.var(), "SYMM_COLLECTIVES", "{e}");
    }

    #[test]
    fn agreement_names_the_variable_and_every_ranks_value() {
        let a = with(&[("SYMM_COLL_WORKSPACE", "1M")]).unwrap();
        let b = with(&[("SYMM_COLL_WORKSPACE", "1024K")]).unwrap();
        let c = with(&[("SYMM_COLL_WORKSPACE", "2M")]).unwrap();
        assert_eq!(check_agreement(&[a.agreed_record(), b.agreed_record()]), Ok(()), "same value, other spelling");
        let e = check_agreement(&[a.agreed_record(), b.agreed_record(), c.agreed_record()]).unwrap_err().unwrap();
        let text = e.to_string();
        assert_eq!(e.var(), "SYMM_COLL_WORKSPACE");
        assert!(text.contains("rank 0: \"1048576\"") && text.contains("rank 2: \"2097152\""), "{text}");
        let d = with(&[("SYMM_BCAST_EAGER_MAX", "0")]).unwrap();
        let e = check_agreement(&[Config::default().agreed_record(), d.agreed_record()]).unwrap_err().unwrap();
        assert_eq!(e.var(), "SYMM_BCAST_EAGER_MAX", "{e}");
        assert!(check_agreement(&[a.agreed_record(), b"garbage".to_vec()]).unwrap_err().is_err());
        // Every variable marked `agree` is in the record.
        let record = String::from_utf8(a.agreed_record()).unwrap();
        for v in VARS.iter().filter(|v| v.agree && v.read_by == ReadBy::Communicator) {
            assert!(record.contains(&format!("{}=", v.name)), "{} missing from {record}", v.name);
        }
    }

    /// The names in the first column of every table of environment variables in `text`.
    fn table_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut in_table = false;
        for line in text.lines() {
            if line.starts_with("| Variable") {
                in_table = true;
                continue;
            }
            if !line.starts_with('|') {
                in_table = false;
            }
            if in_table && !line.starts_with("|---") {
                let first = line.split('|').nth(1).unwrap_or_default();
                for part in first.split('`').skip(1).step_by(2) {
                    names.push(part.to_string());
                }
            }
        }
        names
    }

    #[test]
    fn the_readme_table_lists_exactly_the_variables_of_the_config() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
        let names = table_names(&readme);
        for v in VARS {
            assert!(
                names.iter().any(|n| n == v.name),
                "{} is not in the README's table of environment variables",
                v.name
            );
        }
        for n in &names {
            assert!(VARS.iter().any(|v| v.name == n), "the README's table lists {n}, which config::VARS does not");
        }
        // The variables that must agree say so in their row.
        for line in readme.lines().filter(|l| l.starts_with("| `")) {
            let first = line.split('|').nth(1).unwrap_or_default();
            for v in VARS.iter().filter(|v| v.agree && first.contains(&format!("`{}`", v.name))) {
                assert!(
                    line.contains("same on every rank"),
                    "the README's row of {} must say it is the same on every rank",
                    v.name
                );
            }
        }
    }
}
