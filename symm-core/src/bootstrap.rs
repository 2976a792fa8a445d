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
pub const JOB_SECRET_VAR: &str = crate::config::JOB_SECRET.name;

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
        crate::config::environment_bytes(&crate::config::JOB_SECRET).map(|v| JobSecret::new(&v)).transpose()
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
        crate::dfx::log::init();
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

    /// Every rank of `members` (global ranks, this one among them) contributes `data` to the
    /// exchange `tag`; returns the contributions in `members` order. For agreements after
    /// start-up among some ranks (the Ascend backend's heap allocations): `tag` must be unique
    /// to the exchange among its members (a group's id and call number), since this round
    /// counter is the world's. Bounded by `timeout`; a peer's start-up failure ends it early.
    pub fn exchange(
        &self,
        tag: &str,
        members: &[Rank],
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let key = |r: Rank| format!("{}/x/{tag}/{}", self.prefix, r.0);
        let mine = key(self.rank);
        self.store.set(&mine, &self.seal(&mine, data))?;
        let deadline = Instant::now() + timeout;
        members.iter().map(|&r| self.wait_record(&key(r), deadline)).collect()
    }

    /// A second handle on the same job's exchanges (same store, prefix, secret and timeout), for
    /// a backend that keeps exchanging after start-up ([`Bootstrap::exchange`]).
    pub fn handle(&self) -> Bootstrap {
        Bootstrap {
            rank: self.rank,
            world_size: self.world_size,
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            // Relaxed: start-up is driven by one thread; the copy only uses `exchange`.
            round: AtomicU64::new(self.round.load(Ordering::Relaxed)),
            timeout: self.timeout,
            secret: self.secret.clone(),
            forged_abort_logged: AtomicBool::new(false),
        }
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Condvar, Mutex};

    use super::*;

    /// A store anyone can write to, as torch's TCPStore is.
    #[derive(Default)]
    struct OpenStore {
        map: Mutex<HashMap<String, Vec<u8>>>,
        changed: Condvar,
    }

    impl Store for OpenStore {
        fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
            self.map.lock().unwrap().insert(key.into(), value.into());
            self.changed.notify_all();
            Ok(())
        }

        fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
            let deadline = Instant::now() + timeout;
            let mut map = self.map.lock().unwrap();
            loop {
                if let Some(v) = map.get(key) {
                    return Ok(v.clone());
                }
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    return Err(BootstrapError::Timeout { what: format!("store key {key:?}"), timeout });
                };
                map = self.changed.wait_timeout(map, left).unwrap().0;
            }
        }
    }

    fn secret(text: &str) -> Option<JobSecret> {
        Some(JobSecret::new(text.as_bytes()).unwrap())
    }

    fn boot(store: &Arc<OpenStore>, rank: u32, s: Option<JobSecret>, timeout: Duration) -> Bootstrap {
        Bootstrap::new(Rank(rank), 2, store.clone(), "symm", timeout).with_secret(s)
    }

    #[test]
    fn a_forged_record_is_not_taken_and_the_genuine_one_is() {
        let store = Arc::new(OpenStore::default());
        let s = secret("a secret of this job, 32 bytes..");
        // Someone writes rank 1's hello before rank 1 is there.
        store.set("symm/0/hello/1", b"forged").unwrap();
        let b0 = boot(&store, 0, s.clone(), Duration::from_secs(10));
        let b1 = boot(&store, 1, s, Duration::from_secs(10));
        let t = std::thread::spawn(move || b0.allgather("hello", b"zero"));
        std::thread::sleep(Duration::from_millis(200));
        let got1 = b1.allgather("hello", b"one").unwrap();
        let got0 = t.join().unwrap().unwrap();
        assert_eq!(got0, [b"zero".to_vec(), b"one".to_vec()]);
        assert_eq!(got1, got0);
    }

    #[test]
    fn an_exchange_among_some_ranks_returns_their_records_in_member_order_and_is_bounded() {
        let store = Arc::new(OpenStore::default());
        let s = secret("a secret of this job, 32 bytes..");
        let ranks: Vec<Bootstrap> = (0..3)
            .map(|r| Bootstrap::new(Rank(r), 3, store.clone(), "symm", Duration::from_secs(10)).with_secret(s.clone()))
            .collect();
        // Members 2 and 0 (in that order); rank 1 takes no part. A second handle exchanges alike.
        let members = [Rank(2), Rank(0)];
        let two = ranks[2].handle();
        let t = std::thread::spawn(move || two.exchange("heap/g/1", &members, b"from two", Duration::from_secs(10)));
        let got0 = ranks[0].exchange("heap/g/1", &members, b"from zero", Duration::from_secs(10)).unwrap();
        assert_eq!(got0, [b"from two".to_vec(), b"from zero".to_vec()]);
        assert_eq!(t.join().unwrap().unwrap(), got0);
        // Another tag is another exchange: a member that never comes ends it at the timeout.
        let start = Instant::now();
        let e = ranks[0].exchange("heap/g/2", &members, b"again", Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, BootstrapError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_record_that_stays_forged_is_an_error_naming_it() {
        let other = boot(&Arc::new(OpenStore::default()), 1, secret("another job's secret!"), Duration::ZERO);
        // Garbage, then a record sealed under another secret.
        for forged in [b"garbage".to_vec(), other.seal("symm/0/hello/1", b"x")] {
            let store = Arc::new(OpenStore::default());
            let b0 = boot(&store, 0, secret("a secret of this job, 32 bytes.."), Duration::from_millis(300));
            store.set("symm/0/hello/1", &forged).unwrap();
            let e = b0.allgather("hello", b"zero").unwrap_err();
            assert!(matches!(e, BootstrapError::Forged { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains("\"symm/0/hello/1\"") && text.contains("SYMM_JOB_SECRET"), "{text}");
        }
    }

    #[test]
    fn a_record_under_another_key_does_not_verify() {
        let store = Arc::new(OpenStore::default());
        let s = secret("a secret of this job, 32 bytes..");
        let b1 = boot(&store, 1, s.clone(), Duration::from_millis(200));
        // A genuine record replayed under another key is not genuine there.
        let replayed = b1.seal("symm/0/hello/0", b"rank 0's hello");
        store.set("symm/0/hello/1", &replayed).unwrap();
        let b0 = boot(&store, 0, s, Duration::from_millis(200));
        assert!(matches!(b0.allgather("hello", b"zero"), Err(BootstrapError::Forged { .. })));
    }

    #[test]
    fn a_peers_failure_ends_the_wait_at_once_and_a_forged_one_does_not() {
        let store = Arc::new(OpenStore::default());
        let s = secret("a secret of this job, 32 bytes..");
        let b0 = boot(&store, 0, s.clone(), Duration::from_secs(1));
        // A forged failure record is ignored: the wait runs to its timeout.
        store.set("symm/abort", b"rank 1: forged").unwrap();
        let e = b0.allgather("hello", b"zero").unwrap_err();
        assert!(matches!(e, BootstrapError::Timeout { .. }), "{e:?}");
        // A genuine one ends it within a slice.
        boot(&store, 1, s, Duration::from_secs(1)).abort("rank 1: bad SYMMETRIC_MEMORY_HEAP_SIZE");
        let b0 = Bootstrap::new(Rank(0), 2, store.clone(), "symm", Duration::from_secs(60))
            .with_secret(secret("a secret of this job, 32 bytes.."));
        let t = Instant::now();
        let e = b0.allgather("hello", b"zero").unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(e.to_string(), "a peer failed during start-up: rank 1: bad SYMMETRIC_MEMORY_HEAP_SIZE");
    }

    #[test]
    fn ranks_that_disagree_on_having_a_secret_are_told_so() {
        let store = Arc::new(OpenStore::default());
        let with = boot(&store, 1, secret("a secret of this job, 32 bytes.."), Duration::from_millis(200));
        let without = boot(&store, 0, None, Duration::from_millis(200));
        let t = std::thread::spawn(move || with.allgather("hello", b"one"));
        let e = without.allgather("hello", b"zero").unwrap_err().to_string();
        assert!(e.contains("SYMM_JOB_SECRET") && e.contains("this rank has none"), "{e}");
        let e = t.join().unwrap().unwrap_err();
        assert!(matches!(e, BootstrapError::Forged { .. }), "{e:?}");
    }

    #[test]
    fn short_secrets_are_refused_without_showing_them() {
        let e = JobSecret::new(b"short").unwrap_err().to_string();
        assert!(e.contains("SYMM_JOB_SECRET") && e.contains("<5 bytes>") && !e.contains("short\""), "{e}");
        let g = JobSecret::generate().unwrap();
        assert_eq!(g.env_value().unwrap().len(), 64);
        assert!(!format!("{g:?}").contains(g.env_value().unwrap()));
    }
}
