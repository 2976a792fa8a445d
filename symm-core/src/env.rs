//! The start-up settings' names, defaults and parsers in the form the public API keeps; every
//! one is a view of [`config`](crate::config), which lists and parses all variables.

use std::time::Duration;

use crate::config;
use crate::error::HeapError;

/// Heap size per rank, in bytes (`K`/`M`/`G`/`T` suffixes, powers of 1024).
pub const HEAP_SIZE_VAR: &str = config::HEAP_SIZE.name;
/// Default bound of every wait, in seconds (fractions allowed).
pub const TIMEOUT_VAR: &str = config::TIMEOUT.name;
pub use config::{DEFAULT_HEAP_SIZE, DEFAULT_TIMEOUT};

/// Parses a heap size such as `1073741824`, `512M`, `1G`, `64KiB` (more than 0 bytes).
pub fn parse_size(text: &str) -> Result<usize, HeapError> {
    let bad = |reason: String| HeapError::BadHeapSize {
        value: text.to_string(),
        reason: format!("{reason}; accepted: {}", config::HEAP_SIZE.accepted),
    };
    match config::parse_bytes(text) {
        Ok(0) => Err(bad("must be greater than 0".into())),
        Ok(n) => Ok(n),
        Err(e) => Err(bad(e)),
    }
}

/// The heap size from [`HEAP_SIZE_VAR`], or the default.
pub fn heap_size_from_env() -> Result<usize, HeapError> {
    match config::environment(HEAP_SIZE_VAR) {
        Some(v) if !v.trim().is_empty() => parse_size(&v),
        _ => Ok(DEFAULT_HEAP_SIZE),
    }
}

/// The default wait bound from [`TIMEOUT_VAR`], or [`DEFAULT_TIMEOUT`]; a refused value is an
/// error naming the variable, the value and the accepted range.
pub fn timeout_from_env() -> Result<Duration, String> {
    config::read(&config::environment, &config::TIMEOUT, config::parse_timeout)
        .map(|t| t.unwrap_or(DEFAULT_TIMEOUT))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        for bad in ["", "0", "-1", "1X", "G", "99999999999999999999T"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains(HEAP_SIZE_VAR), "{bad}: {e}");
        }
    }
}
