//! Start-up exchange: a key-value [`Store`] and the world-wide [`Bootstrap`] built on it.
//!
//! Backends need a few all-to-all exchanges at start-up (host identities, heap sizes, where to
//! find each other). The store is a trait so that each environment brings its own: a TCP store
//! from environment variables for pure Rust jobs (`symm-sim`), an in-memory one for ranks as
//! threads, and the framework's store (PyTorch's `c10d::Store`) for Python jobs.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::BootstrapError;
use crate::rank::Rank;

/// A key-value store shared by every rank of the job.
pub trait Store: Send + Sync {
    /// Publishes `value` under `key` (keys are written once).
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError>;
    /// The value under `key`, waiting up to `timeout` for it to appear.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError>;
}

/// A rank's view of the job at start-up: who it is, how many there are, where to exchange.
pub struct Bootstrap {
    rank: Rank,
    world_size: usize,
    store: Arc<dyn Store>,
    prefix: String,
    round: AtomicU64,
    timeout: Duration,
}

impl Bootstrap {
    /// A bootstrap over `store`. `prefix` keeps this job's keys apart from other users of the
    /// same store (every rank must pass the same prefix).
    pub fn new(rank: Rank, world_size: usize, store: Arc<dyn Store>, prefix: &str, timeout: Duration) -> Self {
        Bootstrap { rank, world_size, store, prefix: prefix.to_string(), round: AtomicU64::new(0), timeout }
    }

    /// The caller's rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The bound of every exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every rank contributes `data`; every rank receives all contributions in rank order.
    /// Collective: all ranks call the same sequence of `allgather`s. Keys carry a per-bootstrap
    /// round number, so exchanges never mix.
    pub fn allgather(&self, tag: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // Relaxed: the counter is only touched by the thread driving this rank's start-up.
        let round = self.round.fetch_add(1, Ordering::Relaxed);
        self.store.set(&format!("{}/{round}/{tag}/{}", self.prefix, self.rank.0), data)?;
        (0..self.world_size)
            .map(|r| self.store.get(&format!("{}/{round}/{tag}/{r}", self.prefix), self.timeout))
            .collect()
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("prefix", &self.prefix)
            .finish()
    }
}
