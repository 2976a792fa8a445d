//! Starting ranks: from the environment (one process per rank), as threads of one process, and
//! a small launcher that spawns a program once per rank.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::bootstrap::{JobSecret, JOB_SECRET_VAR};
use symm_core::config::{self, Config};
use symm_core::{AtRank, Bootstrap, BootstrapError, Error, Rank, Result, Store};

use crate::comm::{SimComm, SimConfig};
use crate::store::{MemoryStore, StoreLimits, TcpStore, TcpStoreServer};

/// Rank of this process.
pub const RANK_VAR: &str = config::RANK.name;
/// Number of ranks.
pub const WORLD_SIZE_VAR: &str = config::WORLD_SIZE.name;
/// `host:port` of the start-up store: rank 0 serves it there, unless [`RENDEZVOUS_HOSTED_VAR`]
/// says that the launcher does.
pub const RENDEZVOUS_VAR: &str = config::RENDEZVOUS.name;
/// `1`: the launcher already serves the start-up store at [`RENDEZVOUS_VAR`] (as
/// [`spawn_ranks`] does), so rank 0 connects to it like every other rank. A launcher that keeps
/// its listening socket from the moment it picks the port until the job ends leaves no window in
/// which another job could take the port (a port found free and then released for rank 0 to
/// bind does).
pub const RENDEZVOUS_HOSTED_VAR: &str = config::RENDEZVOUS_HOSTED.name;

/// Start-ups through [`SimComm::from_env`] at a launcher's store made by this process so far.
static HOSTED_START_UPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a rank whose start-up failed tries to reach the store to tell its peers.
const FAILURE_NOTICE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the ranks of a job meet, as far as a rank could tell before it failed.
struct Meeting<'a> {
    addr: &'a str,
    hosted: bool,
    prefix: &'a str,
    secret: Option<&'a JobSecret>,
}

impl Meeting<'_> {
    /// Publishes `err` as this rank's start-up failure, so that its peers' waits end at once
    /// (best effort: a rank that cannot reach the store only reports its own error). Returns
    /// `err`.
    fn fail(&self, rank: Rank, n: usize, err: Error) -> Error {
        // Rank 0 of a job without a launcher serves the store itself: it has none to reach.
        if !self.hosted && rank.0 == 0 {
            return err;
        }
        if let Ok(store) = TcpStore::connect_with(self.addr, FAILURE_NOTICE_TIMEOUT, self.secret) {
            let boot = Bootstrap::new(rank, n.max(1), Arc::new(store), self.prefix, FAILURE_NOTICE_TIMEOUT)
                .with_secret(self.secret.cloned());
            boot.abort(&err.to_string());
        }
        err
    }
}

impl SimComm {
    /// Starts this process as the rank named by `SYMM_RANK` of `SYMM_WORLD_SIZE`, meeting the
    /// others at `SYMM_RENDEZVOUS` (rank 0 serves there, unless `SYMM_RENDEZVOUS_HOSTED=1`),
    /// authenticated with `SYMM_JOB_SECRET` when it is set. Collective over the world. A rank
    /// whose settings are bad tells its peers through the store (when it can reach it), so
    /// that they fail at once too.
    pub fn from_env() -> Result<SimComm> {
        start_from_env(|boot, settings| SimComm::init(boot, SimConfig::from_settings(settings)))
    }
}

/// Starts this process as a rank by the launcher's conventions ([`SimComm::from_env`]'s
/// variables and store), with `start` making the backend's communicator from the start-up
/// exchange and the environment's settings: every backend starts its ranks this way.
pub fn start_from_env<C>(start: impl FnOnce(&Bootstrap, Config) -> Result<C>) -> Result<C> {
    // An error names the rank when `SYMM_RANK` says it, else an unknown one.
    let said = config::environment(RANK_VAR).and_then(|v| v.trim().parse::<u32>().ok()).map_or(Rank::UNKNOWN, Rank);
    let rendezvous = config::rendezvous(&config::environment).map_err(BootstrapError::from);
    // A launcher's store outlives one start-up: there every start-up of this process (the
    // same sequence on every rank) takes its own keys, so a second one cannot read the
    // first's. Rank 0's own store is new for every start-up.
    let prefix = if matches!(rendezvous, Ok((_, true))) {
        // Relaxed: only distinct, ordered numbers are needed.
        format!("symm.{}", HOSTED_START_UPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    } else {
        "symm".to_string()
    };
    let secret = JobSecret::from_env();
    let (addr, hosted) = rendezvous.at(said)?;
    // Without a valid secret this rank could not reach an authenticated store anyway.
    let noticed = secret.as_ref().ok().cloned().flatten();
    let meeting = Meeting { addr: &addr, hosted, prefix: &prefix, secret: noticed.as_ref() };
    let (rank, n) = config::rank_and_world_size(&config::environment)
        .map_err(BootstrapError::from)
        .at(said)
        .map_err(|e| meeting.fail(said, 1, e))?;
    let rank_id = Rank(rank as u32);
    let secret = secret.at(rank_id)?;
    let settings =
        Config::from_env().map_err(BootstrapError::from).at(rank_id).map_err(|e| meeting.fail(rank_id, n, e))?;
    let server = if rank == 0 && !hosted {
        Some(TcpStoreServer::bind_with(&addr, secret.clone(), StoreLimits::default()).map_err(|e| {
            Error::Bootstrap {
                rank: rank_id,
                source: BootstrapError::Io { what: format!("serving the rendezvous at {addr}"), source: e },
            }
        })?)
    } else {
        None
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::connect_with(&addr, settings.timeout, secret.as_ref()).at(rank_id)?);
    let boot = Bootstrap::new(rank_id, n, store.clone(), &prefix, settings.timeout).with_secret(secret);
    let comm = start(&boot, settings)?;
    if let Some(server) = server {
        // Rank 0's server must outlive every rank's last read: wait until all are done.
        boot.allgather("done", b"").at(rank_id)?;
        drop(server);
    } else if !hosted {
        // The other ranks' half of that wait.
        boot.allgather("done", b"").at(rank_id)?;
    }
    Ok(comm)
}

/// Runs `f` on `n` ranks that are threads of this process (in-process mode); returns each
/// rank's result in rank order. Uses the same code paths as separate processes.
pub fn run_in_process<R: Send>(n: usize, config: SimConfig, f: impl Fn(SimComm) -> R + Sync) -> Vec<Result<R>> {
    let timeout = config.timeout;
    run_in_process_with(n, timeout, |boot| SimComm::init(boot, config.clone()), f)
}

/// [`run_in_process`] for any backend: each rank thread makes its communicator with `start`
/// from a start-up exchange through one in-memory store (its waits bounded by `timeout`).
pub fn run_in_process_with<C, R: Send>(
    n: usize,
    timeout: Duration,
    start: impl Fn(&Bootstrap) -> Result<C> + Sync,
    f: impl Fn(C) -> R + Sync,
) -> Vec<Result<R>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (store, start, f) = (store.clone(), &start, &f);
                std::thread::Builder::new()
                    .name(format!("symm-rank-{r}"))
                    .spawn_scoped(s, move || {
                        let boot = Bootstrap::new(Rank(r as u32), n, store, "symm", timeout);
                        start(&boot).map(f)
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Runs `program args` once per rank with the `SYMM_*` variables set (and `env` added), waits
/// for all, and returns their exit statuses in rank order. If a rank fails, the others get
/// `grace` to finish before they are killed, so a crash never leaves a job hanging.
///
/// The launcher serves the start-up store itself, on a loopback port it holds from the moment
/// it is chosen until every rank has exited (`SYMM_RENDEZVOUS_HOSTED=1`): jobs started at the
/// same time cannot meet on each other's port. It gives the job a fresh secret
/// (`SYMM_JOB_SECRET`, unless `env` sets one): only the ranks can use the store, their records
/// are authenticated, and their heaps go only to each other.
pub fn spawn_ranks(
    n: usize,
    program: &std::path::Path,
    args: &[String],
    env: &[(String, String)],
    grace: Duration,
) -> std::io::Result<Vec<ExitStatus>> {
    let given = env.iter().rev().find(|(k, _)| k == JOB_SECRET_VAR).map(|(_, v)| v.as_str());
    let secret = match given {
        // An empty secret is none: the job runs unauthenticated (for comparison only).
        Some("") => None,
        Some(text) => Some(
            JobSecret::new(text.as_bytes())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?,
        ),
        None => Some(JobSecret::generate()?),
    };
    let secret_text = secret.as_ref().and_then(JobSecret::env_value).map(str::to_string);
    let store = TcpStoreServer::bind_with("127.0.0.1:0", secret, StoreLimits::default())?;
    let rendezvous = store.local_addr().to_string();
    let mut children = Children(Vec::with_capacity(n));
    for r in 0..n {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env(RANK_VAR, r.to_string())
            .env(WORLD_SIZE_VAR, n.to_string())
            .env(RENDEZVOUS_VAR, &rendezvous)
            .env(RENDEZVOUS_HOSTED_VAR, "1");
        if let Some(text) = &secret_text {
            cmd.env(JOB_SECRET_VAR, text);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        // On an error the ranks started so far are killed (when `children` is dropped).
        children.0.push(cmd.spawn()?);
    }
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let mut failed_at: Option<Instant> = None;
    while statuses.iter().any(Option::is_none) {
        for (r, c) in children.0.iter_mut().enumerate() {
            if statuses[r].is_none() {
                if let Some(st) = c.try_wait()? {
                    if !st.success() && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                    statuses[r] = Some(st);
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > grace) {
            for (r, c) in children.0.iter_mut().enumerate() {
                if statuses[r].is_none() {
                    let _ = c.kill();
                    statuses[r] = Some(c.wait()?);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Every rank has exited: nobody reads the store any more.
    drop(store);
    Ok(statuses.into_iter().map(|s| s.expect("all ranks finished")).collect())
}

/// The rank processes of [`spawn_ranks`]: whichever are still running when it returns (an error
/// part way) are killed, so no rank outlives its launcher's store or waits for peers that will
/// never come.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if !matches!(c.try_wait(), Ok(Some(_))) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The exit code of a run from its failed ranks' exit codes (`None`: killed by a signal): 0
/// when none failed; their code when they all exited with the same one, so that a script can
/// tell wrong results (3 on every rank) from a failure; else 1.
pub fn job_exit_code(failed: impl IntoIterator<Item = Option<i32>>) -> i32 {
    let mut failed = failed.into_iter();
    let Some(first) = failed.next() else { return 0 };
    match first {
        Some(code) if code != 0 && failed.all(|c| c == first) => code,
        _ => 1,
    }
}

/// Runs `exe args` on `ranks` ranks (as [`spawn_ranks`]) and returns the process exit code for
/// the run, for a program that is its own launcher
/// ([`job_exit_code`]): 0 when every rank succeeded, else the failed ranks' code; 2 when the
/// ranks could not be started. Each failed rank's status is printed, with what `meaning` says
/// its exit code stands for. A failed rank makes the others fail quickly (lost peer), so 10 s
/// of grace is ample before the rest are killed.
pub fn run_job(
    name: &str,
    ranks: usize,
    exe: &Path,
    args: &[String],
    env: &[(String, String)],
    meaning: fn(i32) -> Option<&'static str>,
) -> i32 {
    match spawn_ranks(ranks, exe, args, env, Duration::from_secs(10)) {
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
            job_exit_code(statuses.iter().filter(|st| !st.success()).map(|st| st.code()))
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
        assert_eq!(job_exit_code([]), 0);
        assert_eq!(job_exit_code([Some(3), Some(3)]), 3);
        assert_eq!(job_exit_code([Some(2)]), 2);
        // Disagreeing codes, or a rank killed by a signal: a plain failure.
        assert_eq!(job_exit_code([Some(3), Some(1)]), 1);
        assert_eq!(job_exit_code([None, None]), 1);
        assert_eq!(job_exit_code([Some(3), None]), 1);
    }
}
