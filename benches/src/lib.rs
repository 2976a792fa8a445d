//! What the benchmark binaries share: CPU affinity, the machine's description, and what a
//! rank's exit code means.

pub use symm_sim::sys::{allowed_cpus, pin_to};

/// The CPU model named in /proc/cpuinfo, or `None`.
pub fn cpu_model() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
}

/// What a rank's exit code means, for the launcher's report of a failed run: the benchmarks'
/// ranks exit with 1 when a call failed, 2 when they could not start (bad arguments, or the
/// backend's start-up, such as a bad environment variable), 3 when a check found wrong results.
/// The rank's own message, printed above the report, says which call or value.
pub fn rank_exit_meaning(code: i32) -> Option<&'static str> {
    match code {
        1 => Some("a call failed"),
        2 => Some("could not start"),
        3 => Some("wrong results"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_of_a_rank_is_named() {
        assert_eq!(rank_exit_meaning(3), Some("wrong results"));
        assert_eq!(rank_exit_meaning(2), Some("could not start"));
        assert_eq!(rank_exit_meaning(1), Some("a call failed"));
        assert_eq!(rank_exit_meaning(101), None);
    }
}
