//! The facade: [`Comm`], one variant per backend compiled in, its own trait
//! [`BackendControl`] (dispatched by `enum_dispatch`), and making one.

use enum_dispatch::enum_dispatch;
#[cfg(feature = "ascend")]
use symm_ascend::{AscendComm, AscendConfig};
use symm_core::coll::by_reference::ReferenceCache;
use symm_core::config;
use symm_core::{AtRank, Bootstrap, BootstrapError, HeapStats, Rank, Result};
#[cfg(feature = "sim")]
use symm_sim::{SimComm, SimConfig};

use crate::select::{BackendKind, CommConfig};

/// What a caller asks of a backend beyond the contract of `symm-core`. A backend that has no
/// answer says so with `Error::Unsupported`.
#[enum_dispatch]
pub trait BackendControl {
    /// Each rank's host identity, by global rank (exchanged at start-up).
    fn hosts(&self) -> &[String];

    /// This rank's use of its symmetric heap.
    fn heap_stats(&self) -> Result<HeapStats>;

    /// The per-group state of the reference collectives the backend serves its collectives
    /// from (the CPU backend's, under `SYMM_COLLECTIVES=reference`), for a wrapper backend that
    /// serves its own from it with `symm_core::collectives_by_reference!`; `None` where the
    /// backend keeps none.
    fn reference_cache(&self) -> Option<&ReferenceCache>;
}

/// A rank of a job, on the backend chosen when it was made. Every trait of `symm-core` holds
/// for it (forwarded to the backend; see the crate's documentation).
#[enum_dispatch(BackendControl)]
#[derive(Debug)]
pub enum Comm {
    /// The CPU shared-memory backend.
    #[cfg(feature = "sim")]
    Sim(SimComm),
    /// The Ascend backend.
    #[cfg(feature = "ascend")]
    Ascend(AscendComm),
    /// No backend compiled in: `Comm` has no value (every constructor fails).
    #[cfg(not(any(feature = "sim", feature = "ascend")))]
    #[doc(hidden)]
    Nothing(crate::forward::NoBackend),
}

#[cfg(feature = "sim")]
impl BackendControl for SimComm {
    #[inline]
    fn hosts(&self) -> &[String] {
        SimComm::hosts(self)
    }

    #[inline]
    fn heap_stats(&self) -> Result<HeapStats> {
        Ok(SimComm::heap_stats(self))
    }

    #[inline]
    fn reference_cache(&self) -> Option<&ReferenceCache> {
        Some(SimComm::reference_cache(self))
    }
}

#[cfg(feature = "ascend")]
impl BackendControl for AscendComm {
    fn hosts(&self) -> &[String] {
        AscendComm::hosts(self)
    }

    fn heap_stats(&self) -> Result<HeapStats> {
        Ok(AscendComm::heap_stats(self))
    }

    fn reference_cache(&self) -> Option<&ReferenceCache> {
        Some(AscendComm::reference_cache(self))
    }
}

/// The Ascend backend's start-up settings: the device given (the framework's current one), or
/// else the rank's place on its host.
#[cfg(feature = "ascend")]
pub(crate) fn ascend_config(settings: symm_core::config::Config, device: Option<i32>) -> AscendConfig {
    AscendConfig { settings, device }
}

impl Comm {
    /// Starts this rank on the backend `config` names, exchanging through `boot` (any
    /// [`Bootstrap`]: the Python layer brings the framework's store). Collective over the
    /// world. If this rank cannot start, it says so in the store first, so that its peers fail
    /// at once too.
    pub fn init(boot: &Bootstrap, config: CommConfig) -> Result<Comm> {
        let kind = match config.backend(boot.rank()) {
            Ok(kind) => kind,
            Err(e) => {
                boot.abort(&e.to_string());
                return Err(e);
            }
        };
        match kind {
            #[cfg(feature = "sim")]
            BackendKind::Sim => SimComm::init(boot, SimConfig::from_settings(config.settings)).map(Comm::Sim),
            #[cfg(feature = "ascend")]
            BackendKind::Ascend => {
                AscendComm::init(boot, ascend_config(config.settings, config.device)).map(Comm::Ascend)
            }
        }
    }

    /// Starts this process as the rank the launcher's variables name (`SYMM_RANK`,
    /// `SYMM_WORLD_SIZE`, `SYMM_RENDEZVOUS`, `SYMM_RENDEZVOUS_HOSTED`, `SYMM_JOB_SECRET`), on
    /// the backend `SYMM_BACKEND` names. Collective over the world.
    pub fn from_env() -> Result<Comm> {
        // An error names the rank when `SYMM_RANK` says it, else an unknown one.
        let said = config::environment(config::RANK.name)
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map_or(Rank::UNKNOWN, Rank);
        let name = config::backend(&config::environment).map_err(BootstrapError::from).at(said)?;
        match BackendKind::select(name.as_deref(), said)? {
            #[cfg(feature = "sim")]
            BackendKind::Sim => SimComm::from_env().map(Comm::Sim),
            #[cfg(feature = "ascend")]
            BackendKind::Ascend => {
                symm_sim::launch::start_from_env(|boot, settings| AscendComm::init(boot, ascend_config(settings, None)))
                    .map(Comm::Ascend)
            }
        }
    }

    /// Which backend it runs on.
    #[inline]
    pub fn kind(&self) -> BackendKind {
        match *self {
            #[cfg(feature = "sim")]
            Comm::Sim(_) => BackendKind::Sim,
            #[cfg(feature = "ascend")]
            Comm::Ascend(_) => BackendKind::Ascend,
            #[cfg(not(any(feature = "sim", feature = "ascend")))]
            Comm::Nothing(ref n) => n.never(),
        }
    }
}
