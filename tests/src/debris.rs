//! What fault tests check after a job: nothing left in `/dev/shm`, no rank process left.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The names in `/dev/shm` (empty when there is none: nothing can be left there either).
pub fn shm_entries() -> BTreeSet<String> {
    match std::fs::read_dir("/dev/shm") {
        Ok(dir) => dir.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// Processes whose environment holds `entry` (`NAME=value`); only those of this user are
/// readable, which includes every rank a test started.
pub fn processes_with_env(entry: &str) -> Vec<u32> {
    let Ok(proc_dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    proc_dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|kv| kv == entry.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// What a job of rank processes ended with.
#[derive(Debug)]
pub struct Job {
    /// Every rank's exit status, by rank.
    pub statuses: Vec<ExitStatus>,
    /// How long the job took, start-up included.
    pub took: Duration,
}

/// Runs `ranks` processes of `exe args` with `env` through [`symm_registry::spawn_ranks`] (which
/// kills ranks still running `grace` after the first one ended), each tagged in its environment
/// with a value unique to the job; then checks that the job left no new entry in `/dev/shm` and
/// no process (a rank that lingers is gone once `spawn_ranks` returned). `what` names the job
/// in the messages.
pub fn run_job(what: &str, ranks: usize, exe: &Path, args: &[String], env: &[(&str, &str)], grace: Duration) -> Job {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let tag = format!("{}-{nanos}", std::process::id());
    let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    env.push(("SYMM_TEST_JOB".to_string(), tag.clone()));
    let shm_before = shm_entries();
    let start = Instant::now();
    let statuses = symm_registry::spawn_ranks(ranks, exe, args, &env, grace).expect("starting ranks");
    let took = start.elapsed();
    let new: Vec<String> = shm_entries().difference(&shm_before).cloned().collect();
    assert!(
        new.is_empty(),
        "{what}: the job left new entries in /dev/shm: {new:?} (the backend must use anonymous memfds; if another \
         program created them meanwhile, rerun)"
    );
    let left = processes_with_env(&format!("SYMM_TEST_JOB={tag}"));
    assert!(left.is_empty(), "{what}: processes of the job are still running after it ended: pids {left:?}");
    Job { statuses, took }
}
