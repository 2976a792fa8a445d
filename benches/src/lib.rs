//! What the benchmark binaries share: CPU affinity, the machine's description, and launching
//! the ranks of a run.

use std::path::Path;
use std::time::Duration;

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

/// The exit code of a run from its failed ranks' exit codes (`None`: killed by a signal): 0
/// when none failed; their code when they all exited with the same one, so that a script can
/// tell wrong results (3 on every rank) from a failure; else 1.
pub fn run_exit_code(failed: impl IntoIterator<Item = Option<i32>>) -> i32 {
    let mut failed = failed.into_iter();
    let Some(first) = failed.next() else { return 0 };
    match first {
        Some(code) if code != 0 && failed.all(|c| c == first) => code,
        _ => 1,
    }
}

/// Runs `exe args` on `ranks` ranks and returns the process exit code for the run
/// ([`run_exit_code`]): 0 when every rank succeeded, else the failed ranks' code; 2 when the
/// ranks could not be started. Each failed rank's status is printed, with what `meaning` says
/// its exit code stands for. A failed rank makes the others fail quickly (lost peer), so 10 s
/// of grace is ample before the rest are killed.
pub fn launch(
    name: &str,
    ranks: usize,
    exe: &Path,
    args: &[String],
    env: &[(String, String)],
    meaning: fn(i32) -> Option<&'static str>,
) -> i32 {
    match symm_sim::spawn_ranks(ranks, exe, args, env, Duration::from_secs(10)) {
        Ok(statuses) => {
            let failed: Vec<String> = statuses
                .iter()
                .enumerate()
                .filter(|(_, st)| !st.success())
                .map(|(r, st)| match st.code().and_then(meaning) {
                    Some(m) => format!("rank {r}: {st}: {m}"),
                    None => format!("rank {r}: {st}"),
                })
                .collect();
            if !failed.is_empty() {
                eprintln!("{name}: FAILED ({})", failed.join("; "));
            }
            run_exit_code(statuses.iter().filter(|st| !st.success()).map(|st| st.code()))
        }
        Err(e) => {
            eprintln!("{name}: could not start the ranks: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_exits_with_its_failed_ranks_common_code() {
        assert_eq!(run_exit_code([]), 0);
        assert_eq!(run_exit_code([Some(3), Some(3)]), 3);
        assert_eq!(run_exit_code([Some(2)]), 2);
        // Disagreeing codes, or a rank killed by a signal: a plain failure.
        assert_eq!(run_exit_code([Some(3), Some(1)]), 1);
        assert_eq!(run_exit_code([None, None]), 1);
        assert_eq!(run_exit_code([Some(3), None]), 1);
    }

    #[test]
    fn every_exit_code_of_a_rank_is_named() {
        assert_eq!(rank_exit_meaning(3), Some("wrong results"));
        assert_eq!(rank_exit_meaning(2), Some("could not start"));
        assert_eq!(rank_exit_meaning(1), Some("a call failed"));
        assert_eq!(rank_exit_meaning(101), None);
    }
}
