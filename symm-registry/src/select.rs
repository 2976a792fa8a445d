//! Which backend a communicator is made with: the backends compiled in, `SYMM_BACKEND`, and the
//! settings a communicator is made from.

use symm_core::config::{self, Config, ConfigError};
use symm_core::{AtRank, BootstrapError, Error, Rank, Result};

/// A backend compiled into this build, in the order a default picks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU shared-memory backend (`symm-sim`).
    #[cfg(feature = "sim")]
    Sim,
    /// The Ascend backend (`symm-ascend`).
    #[cfg(feature = "ascend")]
    Ascend,
}

/// Every backend of the registry by name, with the cargo feature that compiles it in.
const KNOWN: &[(&str, &str)] = &[("sim", "sim"), ("ascend", "ascend")];

impl BackendKind {
    /// The backends compiled in; the first is the default.
    pub const COMPILED: &'static [BackendKind] = &[
        #[cfg(feature = "sim")]
        BackendKind::Sim,
        #[cfg(feature = "ascend")]
        BackendKind::Ascend,
    ];

    /// Its name, as `SYMM_BACKEND` spells it.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "sim")]
            BackendKind::Sim => "sim",
            #[cfg(feature = "ascend")]
            BackendKind::Ascend => symm_ascend::NAME,
        }
    }

    /// The backend `name` (`SYMM_BACKEND`'s value; `None`: the default) names, for `rank`. A
    /// name no backend has, or one not compiled in, is a start-up error naming `SYMM_BACKEND`
    /// and the value; a build without backends fails with `Unsupported`.
    pub fn select(name: Option<&str>, rank: Rank) -> Result<BackendKind> {
        let compiled = || {
            let names: Vec<&str> = Self::COMPILED.iter().map(|k| k.name()).collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let Some(name) = name else {
            return Self::COMPILED.first().copied().ok_or_else(|| Error::Unsupported {
                rank,
                backend: "none",
                what: format!(
                    "making a communicator: no backend is compiled in (build symm-registry with one of its \
                     features: {})",
                    KNOWN.iter().map(|(_, f)| *f).collect::<Vec<_>>().join(", ")
                ),
            });
        };
        if let Some(&kind) = Self::COMPILED.iter().find(|k| k.name() == name) {
            return Ok(kind);
        }
        let reason = match KNOWN.iter().find(|(n, _)| *n == name) {
            Some((_, feature)) => format!(
                "backend {name} is not compiled in (cargo feature `{feature}` of symm-registry); compiled in: {}",
                compiled()
            ),
            None => format!(
                "no backend has that name (known: {}); compiled in: {}",
                KNOWN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
                compiled()
            ),
        };
        let refused = ConfigError::Invalid {
            var: config::BACKEND.name,
            value: name.to_string(),
            reason,
            accepted: config::BACKEND.accepted,
        };
        Err(BootstrapError::from(refused)).at(rank)
    }
}

/// The settings a communicator is made from: every variable of [`config::VARS`] a communicator
/// reads, `SYMM_BACKEND` among them ([`Config::backend`]).
#[derive(Clone, Debug)]
pub struct CommConfig {
    /// The settings; a backend takes what it uses from them.
    pub settings: Config,
    /// The device a device backend runs on (its index on the host); `None`: the rank's place
    /// among the ranks of its host. The CPU backend has none and ignores it.
    pub device: Option<i32>,
    /// A refused environment value [`CommConfig::with_heap_size`] met: start-up reports it.
    refused: Option<ConfigError>,
}

impl CommConfig {
    /// From the environment; a refused value is an error naming the variable, the value and
    /// what is accepted.
    pub fn from_env() -> std::result::Result<CommConfig, BootstrapError> {
        Ok(CommConfig::from_settings(Config::from_env()?))
    }

    /// From parsed settings.
    pub fn from_settings(settings: Config) -> CommConfig {
        CommConfig { settings, device: None, refused: None }
    }

    /// The given heap size and the environment's other settings. A refused value among those
    /// is not dropped: making the communicator fails with it.
    pub fn with_heap_size(heap_size: usize) -> CommConfig {
        let others = |name: &str| if name == config::HEAP_SIZE.name { None } else { config::environment(name) };
        let mut c = match Config::from_lookup(&others) {
            Ok(settings) => CommConfig::from_settings(settings),
            Err(e) => CommConfig { settings: Config::default(), device: None, refused: Some(e) },
        };
        c.settings.heap_size = heap_size;
        c
    }

    /// The backend these settings name, for `rank` (see [`BackendKind::select`]), or the
    /// refused value they were made with.
    pub fn backend(&self, rank: Rank) -> Result<BackendKind> {
        if let Some(e) = &self.refused {
            return Err(BootstrapError::from(e.clone())).at(rank);
        }
        BackendKind::select(self.settings.backend.as_deref(), rank)
    }
}
