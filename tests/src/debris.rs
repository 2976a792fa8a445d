//! What fault tests check after a job: nothing left in `/dev/shm`, no rank process left.

use std::collections::BTreeSet;

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
