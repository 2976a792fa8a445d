//! Two [`Store`]s: in memory (ranks as threads of one process) and over TCP (ranks as
//! processes; rank 0 or the launcher serves).
//!
//! The TCP protocol is deliberately tiny. On connecting, the server greets with `status:u8`:
//! 0 = ready, 2 = refused (followed by `len:u32, reason`), 4 = challenge (followed by 32 random
//! bytes, which the client answers with their HMAC-SHA256 under the job secret; the server then
//! greets again with 0 or 2). Then a request is `op:u8, key_len:u32, key, payload` (`SET`:
//! value_len:u32 + value; `GET`: timeout_ms:u64) and a reply is `status:u8, len:u32, bytes`
//! (status 0 = value, 1 = timed out, 2 = refused with a reason, after which the server closes
//! the connection). Little-endian throughout.
//!
//! What the server protects (with a job secret): only clients that know the secret can read or
//! write; the number of connections, the sizes of keys and values and the bytes stored are
//! bounded, and lengths are checked before anything is allocated; connections that do not
//! authenticate in [`StoreLimits::handshake_timeout`] or stay idle for
//! [`StoreLimits::idle_timeout`] are closed. Without a secret anyone who reaches the port can
//! read and write (only the bounds hold). Traffic is not encrypted.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use symm_core::bootstrap::{JobSecret, JOB_SECRET_VAR};
use symm_core::dfx::log::TARGET;
use symm_core::dfx::Level;
use symm_core::{BootstrapError, Store};

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, Vec<u8>>,
    /// Bytes of keys and values held.
    bytes: usize,
}

/// A store shared by threads of one process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<Entries>,
    changed: Condvar,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn wait_get(&self, key: &str, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        // A poisoned map is still consistent (single inserts); keep serving.
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = e.map.get(key) {
                return Some(v.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            e = self.changed.wait_timeout(e, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Sets `key`, unless the store would then hold more than `max_bytes` of keys and values.
    fn set_bounded(&self, key: &str, value: &[u8], max_bytes: usize) -> Result<(), String> {
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let old = e.map.get(key).map_or(0, |v| key.len() + v.len());
        let new = e.bytes - old + key.len() + value.len();
        if new > max_bytes {
            return Err(format!("the store would hold {new} bytes, more than its bound of {max_bytes}"));
        }
        e.bytes = new;
        e.map.insert(key.to_string(), value.to_vec());
        drop(e);
        self.changed.notify_all();
        Ok(())
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        self.set_bounded(key, value, usize::MAX)
            .map_err(|reason| BootstrapError::Refused { what: format!("setting {key:?}"), reason })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        self.wait_get(key, timeout)
            .ok_or_else(|| BootstrapError::Timeout { what: format!("store key {key:?}"), timeout })
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, BootstrapError> {
        Ok(self.entries.lock().unwrap_or_else(|e| e.into_inner()).map.get(key).cloned())
    }
}

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const STATUS_OK: u8 = 0;
const STATUS_TIMED_OUT: u8 = 1;
const STATUS_REFUSED: u8 = 2;
const STATUS_CHALLENGE: u8 = 4;
/// Domain of the clients' proofs (other MACs under the job secret use other domains).
const CLIENT_PROOF_DOMAIN: &[u8] = b"symm store client";

/// The bounds of a [`TcpStoreServer`].
#[derive(Clone, Debug)]
pub struct StoreLimits {
    /// Connections served at once; more are refused (the client retries until its timeout).
    pub max_connections: usize,
    /// Longest key, in bytes.
    pub max_key: usize,
    /// Longest value, in bytes.
    pub max_value: usize,
    /// Most bytes of keys and values the store holds.
    pub max_bytes: usize,
    /// How long a new connection may take to authenticate (and to send a whole request).
    pub handshake_timeout: Duration,
    /// How long an authenticated connection may stay silent between requests.
    pub idle_timeout: Duration,
    /// The longest wait a `GET` may ask for.
    pub max_wait: Duration,
}

impl Default for StoreLimits {
    /// Room for a few thousand ranks' start-up, nothing close to what a flood could ask.
    fn default() -> Self {
        StoreLimits {
            max_connections: 1024,
            max_key: 1024,
            max_value: 1 << 20,
            max_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            max_wait: Duration::from_secs(3600),
        }
    }
}

/// Stack of a connection thread: it only parses frames and copies values.
const CONN_STACK: usize = 128 << 10;

/// The TCP server run by rank 0 or the launcher; stops when dropped.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    store: MemoryStore,
    limits: StoreLimits,
    secret: Option<JobSecret>,
    addr: std::net::SocketAddr,
}

/// Counts a connection thread while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        // Relaxed: a counter; nothing else is published through it.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn store_log(level: Level, addr: std::net::SocketAddr, what: &str) {
    log::log!(target: TARGET, level, "start-up store {addr}: {what}");
}

impl TcpStoreServer {
    /// Binds `addr` and serves until dropped, with the default limits, authenticating clients
    /// with the secret in `SYMM_JOB_SECRET` when it is set.
    pub fn bind(addr: &str) -> io::Result<TcpStoreServer> {
        let secret = JobSecret::from_env().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Self::bind_with(addr, secret, StoreLimits::default())
    }

    /// Binds `addr` and serves until dropped: only clients that prove they know `secret` (when
    /// given) are served, within `limits`.
    pub fn bind_with(addr: &str, secret: Option<JobSecret>, limits: StoreLimits) -> io::Result<TcpStoreServer> {
        symm_core::dfx::log::init();
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let shared = Arc::new(Shared { store: MemoryStore::new(), limits, secret, addr });
        let (stop2, active2) = (stop.clone(), active.clone());
        let thread = std::thread::Builder::new().name("symm-store".into()).spawn(move || {
            for conn in listener.incoming() {
                // Acquire: pairs with the release store in Drop.
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                // Relaxed: a counter; the bound is what matters, not its exact moment.
                if active2.fetch_add(1, Ordering::Relaxed) >= shared.limits.max_connections {
                    let slot = Slot(active2.clone());
                    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                    store_log(Level::Warn, shared.addr, &format!("refused a connection from {peer}: too many"));
                    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = refuse(&mut conn, "too many connections; retry later");
                    drop(slot);
                    continue;
                }
                let slot = Slot(active2.clone());
                let shared = shared.clone();
                // Connection threads end when their client closes the socket, misbehaves, or
                // stays silent past the limits.
                let _ = std::thread::Builder::new().name("symm-store-conn".into()).stack_size(CONN_STACK).spawn(
                    move || {
                        let _slot = slot;
                        if let Err(e) = serve(conn, &shared) {
                            if e.kind() != io::ErrorKind::UnexpectedEof {
                                store_log(Level::Debug, shared.addr, &format!("connection closed: {e}"));
                            }
                        }
                    },
                );
            }
        })?;
        Ok(TcpStoreServer { addr, stop, active, thread: Some(thread) })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Connections being served now.
    pub fn connections(&self) -> usize {
        // Relaxed: a snapshot for diagnostics and tests.
        self.active.load(Ordering::Relaxed)
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        // Release: the listener thread sees the flag after the wake-up connection below.
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// A length-prefixed byte string of at most `max` bytes, refused before anything is allocated
/// when its announced length is larger.
fn read_bytes(r: &mut impl Read, max: usize, what: &str) -> io::Result<Vec<u8>> {
    let n = read_u32(r)? as usize;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} of {n} bytes announced, more than the bound of {max}"),
        ));
    }
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn write_bytes(w: &mut impl Write, b: &[u8]) -> io::Result<()> {
    let n = u32::try_from(b.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "value too large"))?;
    w.write_all(&n.to_le_bytes())?;
    w.write_all(b)
}

fn refuse(conn: &mut TcpStream, reason: &str) -> io::Result<()> {
    let mut frame = vec![STATUS_REFUSED];
    write_bytes(&mut frame, reason.as_bytes())?;
    conn.write_all(&frame)
}

fn random_bytes() -> io::Result<[u8; 32]> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// Greets a new client and, with a secret, checks its proof.
fn handshake(conn: &mut TcpStream, shared: &Shared) -> io::Result<()> {
    let Some(secret) = &shared.secret else { return conn.write_all(&[STATUS_OK]) };
    let challenge = random_bytes()?;
    conn.write_all(&[&[STATUS_CHALLENGE][..], &challenge].concat())?;
    let mut proof = [0u8; 32];
    conn.read_exact(&mut proof)?;
    if secret.verify(&[CLIENT_PROOF_DOMAIN, &challenge], &proof) {
        return conn.write_all(&[STATUS_OK]);
    }
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    store_log(Level::Warn, shared.addr, &format!("refused a client at {peer}: it does not know the job secret"));
    let _ = refuse(conn, &format!("authentication failed: the client does not know this job's {JOB_SECRET_VAR}"));
    Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("client {peer} failed authentication")))
}

fn serve(mut conn: TcpStream, shared: &Shared) -> io::Result<()> {
    let limits = &shared.limits;
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(limits.handshake_timeout))?;
    conn.set_write_timeout(Some(limits.handshake_timeout))?;
    handshake(&mut conn, shared)?;
    loop {
        conn.set_read_timeout(Some(limits.idle_timeout))?;
        let mut op = [0u8; 1];
        if conn.read(&mut op)? == 0 {
            return Ok(());
        }
        // The rest of a request follows at once: a client that stalls inside one is cut off.
        conn.set_read_timeout(Some(limits.handshake_timeout))?;
        let outcome = request(&mut conn, op[0], shared);
        match outcome {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                store_log(Level::Warn, shared.addr, &format!("refused a request: {e}"));
                let _ = refuse(&mut conn, &e.to_string());
                return Err(e);
            }
            Err(e) => return Err(e),
        }
    }
}

fn request(conn: &mut TcpStream, op: u8, shared: &Shared) -> io::Result<()> {
    let limits = &shared.limits;
    if op != OP_SET && op != OP_GET {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown store op {op}")));
    }
    let key = String::from_utf8(read_bytes(conn, limits.max_key, "a key")?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a key that is not UTF-8: {e}")))?;
    let mut reply = Vec::new();
    if op == OP_SET {
        let value = read_bytes(conn, limits.max_value, &format!("the value of {key:?}"))?;
        shared
            .store
            .set_bounded(&key, &value, limits.max_bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("setting {key:?}: {e}")))?;
        reply.push(STATUS_OK);
        write_bytes(&mut reply, &[])?;
    } else {
        let mut t = [0u8; 8];
        conn.read_exact(&mut t)?;
        let wait = Duration::from_millis(u64::from_le_bytes(t)).min(limits.max_wait);
        match shared.store.wait_get(&key, wait) {
            Some(v) => {
                reply.push(STATUS_OK);
                write_bytes(&mut reply, &v)?;
            }
            None => {
                reply.push(STATUS_TIMED_OUT);
                write_bytes(&mut reply, &[])?;
            }
        }
    }
    conn.write_all(&reply)
}

/// A client of [`TcpStoreServer`]; one connection, requests serialised.
#[derive(Debug)]
pub struct TcpStore {
    conn: Mutex<TcpStream>,
    addr: String,
    limits: StoreLimits,
}

impl TcpStore {
    /// Connects to `addr`, retrying until `timeout` (the server may start later), with the
    /// secret in `SYMM_JOB_SECRET` when it is set.
    pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStore, BootstrapError> {
        Self::connect_with(addr, timeout, JobSecret::from_env()?.as_ref())
    }

    /// Connects to `addr`, retrying until `timeout` while the server is not there yet or has
    /// no room, and proves knowledge of `secret` when the server asks.
    pub fn connect_with(addr: &str, timeout: Duration, secret: Option<&JobSecret>) -> Result<TcpStore, BootstrapError> {
        let deadline = Instant::now() + timeout;
        let what = || format!("connecting to the rendezvous {addr}");
        let io_err = |e: io::Error| BootstrapError::Io { what: what(), source: e };
        loop {
            let resolved = addr.to_socket_addrs().map_err(io_err)?.next();
            let Some(sa) = resolved else {
                return Err(io_err(io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing")));
            };
            let attempt = TcpStream::connect_timeout(&sa, Duration::from_millis(500))
                .map_err(|e| Err(io_err(e)))
                .and_then(|conn| client_handshake(conn, addr, secret, deadline));
            match attempt {
                Ok(conn) => {
                    let limits = StoreLimits::default();
                    return Ok(TcpStore { conn: Mutex::new(conn), addr: addr.to_string(), limits });
                }
                // Authentication failed: retrying cannot help.
                Err(Ok(fatal)) => return Err(fatal),
                Err(Err(e)) if Instant::now() >= deadline => return Err(e),
                Err(Err(_)) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn request(&self, op: u8, key: &str, payload: &[u8]) -> Result<(u8, Vec<u8>), BootstrapError> {
        let io_err =
            |e: io::Error| BootstrapError::Io { what: format!("talking to the rendezvous {}", self.addr), source: e };
        if key.len() > self.limits.max_key {
            return Err(BootstrapError::Refused {
                what: format!("key {key:?}"),
                reason: format!("{} bytes, more than the bound of {}", key.len(), self.limits.max_key),
            });
        }
        let mut frame = Vec::with_capacity(5 + key.len() + payload.len());
        frame.push(op);
        write_bytes(&mut frame, key.as_bytes()).map_err(io_err)?;
        frame.extend_from_slice(payload);
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.write_all(&frame).map_err(io_err)?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status).map_err(io_err)?;
        let value = read_bytes(&mut *conn, self.limits.max_value, "a reply").map_err(io_err)?;
        if status[0] == STATUS_REFUSED {
            return Err(BootstrapError::Refused {
                what: format!("a request for {key:?} at {}", self.addr),
                reason: String::from_utf8_lossy(&value).into_owned(),
            });
        }
        Ok((status[0], value))
    }
}

/// The client's half of [`handshake`]. `Err(Ok(e))`: refused for good (authentication);
/// `Err(Err(e))`: worth retrying (no room yet, connection lost).
fn client_handshake(
    mut conn: TcpStream,
    addr: &str,
    secret: Option<&JobSecret>,
    deadline: Instant,
) -> Result<TcpStream, Result<BootstrapError, BootstrapError>> {
    let retry =
        |e: io::Error| Err(BootstrapError::Io { what: format!("connecting to the rendezvous {addr}"), source: e });
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    conn.set_read_timeout(Some(left)).map_err(retry)?;
    conn.set_nodelay(true).map_err(retry)?;
    let mut status = [0u8; 1];
    conn.read_exact(&mut status).map_err(retry)?;
    let refused = |conn: &mut TcpStream| {
        let reason = read_bytes(conn, 4096, "a reason").map(|r| String::from_utf8_lossy(&r).into_owned());
        BootstrapError::Refused {
            what: format!("the connection to the rendezvous {addr}"),
            reason: reason.unwrap_or_else(|e| e.to_string()),
        }
    };
    match status[0] {
        STATUS_OK => {}
        // No room now: another attempt may find some.
        STATUS_REFUSED => return Err(Err(refused(&mut conn))),
        STATUS_CHALLENGE => {
            let mut challenge = [0u8; 32];
            conn.read_exact(&mut challenge).map_err(retry)?;
            let Some(secret) = secret else {
                return Err(Ok(BootstrapError::Env {
                    var: JOB_SECRET_VAR,
                    value: None,
                    reason: format!("the rendezvous {addr} serves only clients that know the job secret"),
                }));
            };
            conn.write_all(&secret.mac(&[CLIENT_PROOF_DOMAIN, &challenge])).map_err(retry)?;
            conn.read_exact(&mut status).map_err(retry)?;
            match status[0] {
                STATUS_OK => {}
                STATUS_REFUSED => return Err(Ok(refused(&mut conn))),
                other => {
                    return Err(Ok(BootstrapError::Protocol(format!("the rendezvous {addr} answered {other}"))));
                }
            }
        }
        other => return Err(Ok(BootstrapError::Protocol(format!("the rendezvous {addr} greeted with {other}")))),
    }
    conn.set_read_timeout(None).map_err(retry)?;
    Ok(conn)
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        if value.len() > self.limits.max_value {
            return Err(BootstrapError::Refused {
                what: format!("the value of {key:?}"),
                reason: format!("{} bytes, more than the bound of {}", value.len(), self.limits.max_value),
            });
        }
        let mut payload = Vec::with_capacity(4 + value.len());
        write_bytes(&mut payload, value).map_err(|e| BootstrapError::Io { what: "encoding".into(), source: e })?;
        self.request(OP_SET, key, &payload).map(|_| ())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match self.request(OP_GET, key, &ms.to_le_bytes())? {
            (STATUS_OK, v) => Ok(v),
            _ => Err(BootstrapError::Timeout { what: format!("store key {key:?} at {}", self.addr), timeout }),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, BootstrapError> {
        match self.request(OP_GET, key, &0u64.to_le_bytes())? {
            (STATUS_OK, v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        let conn = self.conn.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = conn.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_store_sets_and_waits() {
        let server = TcpStoreServer::bind_with("127.0.0.1:0", None, StoreLimits::default()).unwrap();
        let addr = server.local_addr().to_string();
        let a = TcpStore::connect_with(&addr, Duration::from_secs(5), None).unwrap();
        let b = TcpStore::connect_with(&addr, Duration::from_secs(5), None).unwrap();
        let t = std::thread::spawn(move || b.get("k", Duration::from_secs(5)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        a.set("k", b"value").unwrap();
        assert_eq!(t.join().unwrap(), b"value");
        let e = a.get("missing", Duration::from_millis(50)).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        assert_eq!(a.try_get("k").unwrap().as_deref(), Some(&b"value"[..]));
        assert_eq!(a.try_get("missing").unwrap(), None);
    }

    fn secret(text: &str) -> JobSecret {
        JobSecret::new(text.as_bytes()).unwrap()
    }

    #[test]
    fn only_clients_with_the_secret_are_served() {
        let s = secret("0123456789abcdef-the-job");
        let server = TcpStoreServer::bind_with("127.0.0.1:0", Some(s.clone()), StoreLimits::default()).unwrap();
        let addr = server.local_addr().to_string();
        let good = TcpStore::connect_with(&addr, Duration::from_secs(5), Some(&s)).unwrap();
        good.set("symm/0/hello/0", b"genuine").unwrap();
        // Without the secret, or with another one: refused at once, nothing read or written.
        let e = TcpStore::connect_with(&addr, Duration::from_secs(5), None).unwrap_err().to_string();
        assert!(e.contains("SYMM_JOB_SECRET"), "{e}");
        let t = Instant::now();
        let other = secret("fedcba9876543210-not-it");
        let e = TcpStore::connect_with(&addr, Duration::from_secs(5), Some(&other)).unwrap_err().to_string();
        assert!(e.contains("authentication failed"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "refused only after {:?}", t.elapsed());
        // A client speaking the protocol without a handshake gets no value either.
        let mut raw = TcpStream::connect(&addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut frame = vec![OP_GET];
        write_bytes(&mut frame, b"symm/0/hello/0").unwrap();
        frame.extend_from_slice(&0u64.to_le_bytes());
        let _ = raw.write_all(&frame);
        let _ = raw.shutdown(Shutdown::Write);
        let mut seen = Vec::new();
        let _ = raw.read_to_end(&mut seen);
        assert!(!seen.windows(7).any(|w| w == b"genuine"), "{seen:?}");
        assert_eq!(good.get("symm/0/hello/0", Duration::from_secs(1)).unwrap(), b"genuine");
    }

    fn vm_size_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn announced_lengths_are_checked_before_anything_is_allocated() {
        let server = TcpStoreServer::bind_with("127.0.0.1:0", None, StoreLimits::default()).unwrap();
        let addr = server.local_addr();
        let mut replies = Vec::new();
        // A 4 GiB key, then a 4 GiB value under a short key, each left pending: the server's
        // address space must not grow by the announced size while it waits for the bytes (other
        // tests' threads add their malloc arenas, hence the wide margin), and each is refused
        // with a reason and its connection closed.
        for frame in [
            [&[OP_SET][..], &u32::MAX.to_le_bytes()].concat(),
            [&[OP_SET][..], &1u32.to_le_bytes(), b"k", &u32::MAX.to_le_bytes()].concat(),
        ] {
            let before = vm_size_kib();
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut greeting = [0u8; 1];
            c.read_exact(&mut greeting).unwrap();
            c.write_all(&frame).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            let grown_mib = vm_size_kib().saturating_sub(before) / 1024;
            assert!(grown_mib < 2048, "VmSize grew by {grown_mib} MiB for a pending frame");
            let mut reply = Vec::new();
            let _ = c.read_to_end(&mut reply);
            replies.push(String::from_utf8_lossy(&reply).into_owned());
        }
        assert!(replies[0].contains("a key of 4294967295 bytes announced"), "{replies:?}");
        assert!(replies[1].contains("the value of \"k\" of 4294967295 bytes"), "{replies:?}");
        // The server still serves; a client refuses oversized values before sending them.
        let c = TcpStore::connect_with(&addr.to_string(), Duration::from_secs(5), None).unwrap();
        let e = c.set("big", &vec![0u8; (1 << 20) + 1]).unwrap_err().to_string();
        assert!(e.contains("\"big\"") && e.contains("1048577 bytes"), "{e}");
        c.set("small", b"v").unwrap();
    }

    fn threads() -> usize {
        std::fs::read_dir("/proc/self/task").unwrap().count()
    }

    #[test]
    fn connections_are_bounded_and_idle_ones_closed() {
        let limits = StoreLimits {
            max_connections: 8,
            handshake_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(300),
            ..StoreLimits::default()
        };
        let s = secret("0123456789abcdef-the-job");
        let server = TcpStoreServer::bind_with("127.0.0.1:0", Some(s.clone()), limits).unwrap();
        let addr = server.local_addr();
        let before = threads();
        // 300 idle connections: at most 8 are served (each with a thread); the rest are refused.
        let idle: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        let during = threads();
        // Other tests of this binary run alongside: a margin of a few threads for them.
        assert!(during <= before + 8 + 8, "{during} threads for 300 idle connections (before: {before})");
        assert!(server.connections() <= 8, "{}", server.connections());
        // Connections that never authenticate are closed after the handshake timeout; then a
        // genuine client gets in (it retries while the server has no room).
        let c = TcpStore::connect_with(&addr.to_string(), Duration::from_secs(10), Some(&s)).unwrap();
        c.set("k", b"v").unwrap();
        drop(idle);
        // An authenticated client silent past the idle timeout is dropped too.
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(server.connections(), 0);
        assert!(c.get("k", Duration::from_millis(10)).is_err());
    }
}
