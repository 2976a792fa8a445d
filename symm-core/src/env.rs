//! Settings read from the environment, parsed in one place with errors that name the variable.

use std::time::Duration;

use crate::error::HeapError;

/// Heap size per rank, in bytes (`K`/`M`/`G`/`T` suffixes, powers of 1024).
pub const HEAP_SIZE_VAR: &str = "SYMMETRIC_MEMORY_HEAP_SIZE";
/// Default bound of every wait, in seconds (fractions allowed).
pub const TIMEOUT_VAR: &str = "SYMMETRIC_MEMORY_TIMEOUT";
/// Default heap size: 1 GiB, as HyperParallel and NVSHMEM.
pub const DEFAULT_HEAP_SIZE: usize = 1 << 30;
/// Default wait bound: 120 s, as Ascend SHMEM's init timeouts.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Parses a byte size such as `1073741824`, `512M`, `1G`, `64KiB`.
pub fn parse_size(text: &str) -> Result<usize, HeapError> {
    let bad = |reason: &str| HeapError::BadHeapSize { value: text.to_string(), reason: reason.to_string() };
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let n: usize = num.parse().map_err(|_| bad("expected a number of bytes, optionally with a K, M, G or T suffix"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad("unknown suffix; use K, M, G or T")),
    };
    let bytes = n.checked_mul(1usize << shift).ok_or_else(|| bad("too large"))?;
    if bytes == 0 {
        return Err(bad("must be greater than 0"));
    }
    Ok(bytes)
}

/// The heap size from [`HEAP_SIZE_VAR`], or the default.
pub fn heap_size_from_env() -> Result<usize, HeapError> {
    match std::env::var(HEAP_SIZE_VAR) {
        Ok(v) => parse_size(&v),
        Err(_) => Ok(DEFAULT_HEAP_SIZE),
    }
}

/// The default wait bound from [`TIMEOUT_VAR`], or [`DEFAULT_TIMEOUT`]; an unparsable value is
/// an error naming the variable.
pub fn timeout_from_env() -> Result<Duration, String> {
    match std::env::var(TIMEOUT_VAR) {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 => Duration::try_from_secs_f64(s)
                .map_err(|_| format!("{TIMEOUT_VAR} = {v:?}: too large; expected a positive number of seconds")),
            _ => Err(format!("{TIMEOUT_VAR} = {v:?}: expected a positive number of seconds")),
        },
        Err(_) => Ok(DEFAULT_TIMEOUT),
    }
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
