//! Start-up exchange: a key-value [`Store`] and the world-wide [`Bootstrap`] built on it.
//!
//! Backends need a few all-to-all exchanges at start-up (host identities, heap sizes, where to
//! find each other). The store is a trait so that each environment brings its own: a TCP store
//! from environment variables for pure Rust jobs (`symm-sim`), an in-memory one for ranks as
//! threads, and the framework's store (PyTorch's `c10d::Store`) for Python jobs.
//!
//! A store is reachable by more than the job's ranks (a TCP port on the host, a file), so with
//! a [`JobSecret`] every record a rank writes carries an HMAC-SHA256 of its key and value, and
//! a record whose MAC does not match is not taken: the reader keeps waiting for the genuine one
//! (a rank that arrives later overwrites it) and, at the deadline, fails with
//! [`BootstrapError::Forged`] naming the record. A rank whose start-up fails publishes that in
//! the store ([`Bootstrap::abort`]), and every wait of its peers looks there too, so they fail
//! at once instead of at the timeout.

use std::fmt;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::BootstrapError;
use crate::rank::Rank;

/// A key-value store shared by every rank of the job.
pub trait Store: Send + Sync {
    /// Publishes `value` under `key` (keys are written once by the job; a later write replaces
    /// the value).
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError>;
    /// The value under `key`, waiting up to `timeout` for it to appear.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError>;
    /// The value under `key` if it is there now, without waiting.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, BootstrapError> {
        match self.get(key, Duration::from_millis(1)) {
            Ok(v) => Ok(Some(v)),
            Err(BootstrapError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The environment variable that holds the job secret: any text of at least
/// [`JobSecret::MIN_LEN`] bytes, the same on every rank (and on the launcher that serves the
/// store), known to nobody else. `symm_sim::spawn_ranks` sets a fresh one for every job.
pub const JOB_SECRET_VAR: &str = "SYMM_JOB_SECRET";

/// The secret shared by the ranks of one job: it keys the MACs of the start-up records, the
/// proof a client gives the Rust TCP store, and the proof a rank gives a peer for its heap.
#[derive(Clone)]
pub struct JobSecret(Arc<[u8]>);

type HmacSha256 = Hmac<Sha256>;

impl JobSecret {
    /// The shortest secret accepted, in bytes: 128 bits of a hex or base64 text.
    pub const MIN_LEN: usize = 16;

    /// A secret from its text (or bytes); at least [`JobSecret::MIN_LEN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<JobSecret, BootstrapError> {
        if bytes.len() < Self::MIN_LEN {
            return Err(BootstrapError::Env {
                var: JOB_SECRET_VAR,
                // Never echo a secret, not even a short one.
                value: Some(format!("<{} bytes>", bytes.len())),
                reason: format!(
                    "too short: a job secret has at least {} bytes (for example 32 random bytes in hex)",
                    Self::MIN_LEN
                ),
            });
        }
        Ok(JobSecret(bytes.into()))
    }

    /// A fresh random secret (32 bytes from the kernel's generator, as 64 hex digits).
    pub fn generate() -> std::io::Result<JobSecret> {
        let mut b = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Ok(JobSecret(hex.into_bytes().into()))
    }

    /// The secret in [`JOB_SECRET_VAR`]; `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<JobSecret>, BootstrapError> {
        match std::env::var_os(JOB_SECRET_VAR) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => JobSecret::new(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str())).map(Some),
        }
    }

    /// The text to put in [`JOB_SECRET_VAR`] for this secret (what [`JobSecret::from_env`]
    /// reads back), when it is valid UTF-8 (generated secrets are).
    pub fn env_value(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    fn hmac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        // Each part with its length first: no two different lists of parts hash alike.
        for p in parts {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        mac
    }

    /// The HMAC-SHA256 of `parts` (each length-prefixed) under this secret.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.hmac(parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `parts` (compared in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(parts).verify_slice(tag).is_ok()
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobSecret(<{} bytes>)", self.0.len())
    }
}

/// What starts an authenticated record: this marker, then the 32-byte MAC, then the value.
const MAC_MARKER: &[u8] = b"symm-mac1:";
/// Domain of the records' MACs (other MACs under the same secret use other domains).
const RECORD_DOMAIN: &[u8] = b"symm start-up record";
/// How long one store wait lasts before the wait looks for a peer's failure record.
const SLICE: Duration = Duration::from_millis(100);

/// A rank's view of the job at start-up: who it is, how many there are, where to exchange.
pub struct Bootstrap {
    rank: Rank,
    world_size: usize,
    store: Arc<dyn Store>,
    prefix: String,
    round: AtomicU64,
    timeout: Duration,
    secret: Option<JobSecret>,
    /// Whether a forged failure record was reported already (it is reported once).
    forged_abort_logged: AtomicBool,
}

impl Bootstrap {
    /// A bootstrap over `store`. `prefix` keeps this job's keys apart from other users of the
    /// same store (every rank must pass the same prefix).
    pub fn new(rank: Rank, world_size: usize, store: Arc<dyn Store>, prefix: &str, timeout: Duration) -> Self {
        Bootstrap {
            rank,
            world_size,
            store,
            prefix: prefix.to_string(),
            round: AtomicU64::new(0),
            timeout,
            secret: None,
            forged_abort_logged: AtomicBool::new(false),
        }
    }

    /// Authenticates every record with `secret` (every rank must use the same one, or none).
    pub fn with_secret(mut self, secret: Option<JobSecret>) -> Self {
        self.secret = secret;
        self
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

    /// The job secret, when the records are authenticated.
    pub fn secret(&self) -> Option<&JobSecret> {
        self.secret.as_ref()
    }

    /// Every rank contributes `data`; every rank receives all contributions in rank order.
    /// Collective: all ranks call the same sequence of `allgather`s. Keys carry a per-bootstrap
    /// round number, so exchanges never mix. Each wait also watches for a peer's failure
    /// ([`BootstrapError::PeerFailed`]).
    pub fn allgather(&self, tag: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        // Relaxed: the counter is only touched by the thread driving this rank's start-up.
        let round = self.round.fetch_add(1, Ordering::Relaxed);
        let key = |r: usize| format!("{}/{round}/{tag}/{r}", self.prefix);
        let mine = key(self.rank.index());
        self.store.set(&mine, &self.seal(&mine, data))?;
        let deadline = Instant::now() + self.timeout;
        (0..self.world_size).map(|r| self.wait_record(&key(r), deadline)).collect()
    }

    /// Tells the peers that this rank's start-up failed with `reason`: their waits in
    /// [`Bootstrap::allgather`] (and [`Bootstrap::check_abort`]) fail at once. Best effort (the
    /// store may be what failed).
    pub fn abort(&self, reason: &str) {
        let key = self.abort_key();
        let _ = self.store.set(&key, &self.seal(&key, reason.as_bytes()));
    }

    /// A peer's failure, when one has published it ([`Bootstrap::abort`]).
    pub fn check_abort(&self) -> Result<(), BootstrapError> {
        let key = self.abort_key();
        let Some(record) = self.store.try_get(&key)? else { return Ok(()) };
        match self.open(&key, &record) {
            Ok(reason) => Err(BootstrapError::PeerFailed { reason: String::from_utf8_lossy(&reason).into_owned() }),
            Err(why) => {
                // A forged failure record must not stop the job; say so once.
                // Relaxed: a flag for the log only.
                if !self.forged_abort_logged.swap(true, Ordering::Relaxed) {
                    crate::symm_log!(
                        crate::dfx::Level::Warn,
                        self.rank,
                        "ignoring the start-up failure record {key:?}: {}",
                        why.unwrap_or_else(|e| e.to_string())
                    );
                }
                Ok(())
            }
        }
    }

    fn abort_key(&self) -> String {
        format!("{}/abort", self.prefix)
    }

    /// The record stored for `value` under `key`: the value itself, or with a secret the marker,
    /// the MAC of key and value, then the value.
    fn seal(&self, key: &str, value: &[u8]) -> Vec<u8> {
        match &self.secret {
            None => value.to_vec(),
            Some(s) => {
                let tag = s.mac(&[RECORD_DOMAIN, key.as_bytes(), value]);
                [MAC_MARKER, &tag, value].concat()
            }
        }
    }

    /// The value of `record` read under `key`. `Err(Ok(why))`: the record is not genuine
    /// (forged, or written under another secret); `Err(Err(e))`: the ranks disagree on
    /// whether records are authenticated.
    fn open(&self, key: &str, record: &[u8]) -> Result<Vec<u8>, Result<String, BootstrapError>> {
        let marked = record.strip_prefix(MAC_MARKER);
        match (&self.secret, marked) {
            (None, None) => Ok(record.to_vec()),
            (None, Some(_)) => Err(Err(BootstrapError::Env {
                var: JOB_SECRET_VAR,
                value: None,
                reason: format!(
                    "record {key:?} is authenticated (its writer has a job secret) but this rank has none; \
                     set the same {JOB_SECRET_VAR} on every rank"
                ),
            })),
            (Some(_), None) => {
                Err(Ok(format!("it carries no MAC (written without {JOB_SECRET_VAR}, or not by a rank of this job)")))
            }
            (Some(s), Some(rest)) => {
                if rest.len() >= 32 && s.verify(&[RECORD_DOMAIN, key.as_bytes(), &rest[32..]], &rest[..32]) {
                    Ok(rest[32..].to_vec())
                } else {
                    Err(Ok(format!(
                        "its MAC does not match (written under another {JOB_SECRET_VAR}, or not by a rank of this job)"
                    )))
                }
            }
        }
    }

    /// Waits until `deadline` for a genuine record under `key`, looking for a peer's failure
    /// between slices of the wait.
    fn wait_record(&self, key: &str, deadline: Instant) -> Result<Vec<u8>, BootstrapError> {
        let mut forged: Option<String> = None;
        let mut waited_for = format!("store key {key:?}");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Never a zero wait: some stores read a zero timeout as "no timeout".
            match self.store.get(key, left.clamp(Duration::from_millis(1), SLICE)) {
                Ok(record) => match self.open(key, &record) {
                    Ok(value) => return Ok(value),
                    Err(Err(e)) => return Err(e),
                    Err(Ok(why)) => {
                        if forged.is_none() {
                            crate::symm_log!(
                                crate::dfx::Level::Warn,
                                self.rank,
                                "rejected the start-up record {key:?}: {why}; waiting for the genuine one"
                            );
                        }
                        forged = Some(why);
                        // The forged value stays until the genuine writer replaces it: poll.
                        std::thread::sleep(Duration::from_millis(10).min(left));
                    }
                },
                Err(BootstrapError::Timeout { what, .. }) => waited_for = what,
                Err(e) => return Err(e),
            }
            self.check_abort()?;
            if Instant::now() >= deadline {
                return Err(match forged {
                    Some(reason) => BootstrapError::Forged { key: key.to_string(), reason },
                    None => BootstrapError::Timeout { what: waited_for, timeout: self.timeout },
                });
            }
        }
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("prefix", &self.prefix)
            .field("authenticated", &self.secret.is_some())
            .finish()
    }
}
