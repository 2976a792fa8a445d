//! Starting ranks on the chosen backend: as threads of one process, or as processes (the
//! launcher and its variables).

use symm_core::config;
use symm_core::{Rank, Result};

use crate::comm::Comm;
#[cfg(any(feature = "sim", feature = "ascend"))]
use crate::select::BackendKind;
use crate::select::CommConfig;

/// Rank of this process.
pub const RANK_VAR: &str = config::RANK.name;
/// Number of ranks.
pub const WORLD_SIZE_VAR: &str = config::WORLD_SIZE.name;
/// `host:port` of the start-up store.
pub const RENDEZVOUS_VAR: &str = config::RENDEZVOUS.name;
/// `1`: the launcher serves the start-up store at [`RENDEZVOUS_VAR`].
pub const RENDEZVOUS_HOSTED_VAR: &str = config::RENDEZVOUS_HOSTED.name;

/// The process launcher: starts a program once per rank with the variables above set, serving
/// the start-up store itself, and kills the rest if one fails.
#[cfg(feature = "sim")]
pub use symm_sim::launch::{job_exit_code, run_job, spawn_ranks};

/// Runs `f` on `n` ranks that are threads of this process, on the backend `config` names;
/// returns each rank's result in rank order.
#[cfg_attr(not(any(feature = "sim", feature = "ascend")), allow(unused_variables))]
pub fn run_in_process<R: Send>(n: usize, config: CommConfig, f: impl Fn(Comm) -> R + Sync) -> Vec<Result<R>> {
    match config.backend(Rank(0)) {
        // Each rank's error names it.
        Err(_) => (0..n)
            .map(|r| Err(config.backend(Rank(r as u32)).expect_err("the same settings are refused on every rank")))
            .collect(),
        #[cfg(feature = "sim")]
        Ok(BackendKind::Sim) => {
            symm_sim::run_in_process(n, symm_sim::SimConfig::from_settings(config.settings), |c| f(Comm::Sim(c)))
        }
        #[cfg(feature = "ascend")]
        Ok(BackendKind::Ascend) => {
            let timeout = config.settings.timeout;
            let start = |boot: &symm_core::Bootstrap| {
                symm_ascend::AscendComm::init(boot, crate::comm::ascend_config(config.settings.clone(), config.device))
            };
            symm_sim::launch::run_in_process_with(n, timeout, start, |c| f(Comm::Ascend(c)))
        }
    }
}
