//! Two [`Store`]s: in memory (ranks as threads of one process) and over TCP (ranks as
//! processes; rank 0 serves).
//!
//! The TCP protocol is deliberately tiny: a request is `op:u8, key_len:u32, key, payload`
//! (`SET`: value_len:u32 + value; `GET`: timeout_ms:u64) and a reply is `status:u8,
//! len:u32, bytes` (status 0 = value, 1 = timed out). Little-endian throughout.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use symm_core::{BootstrapError, Store};

/// A store shared by threads of one process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
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
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = map.get(key) {
                return Some(v.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            map = self.changed.wait_timeout(map, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        self.wait_get(key, timeout)
            .ok_or_else(|| BootstrapError::Timeout { what: format!("store key {key:?}"), timeout })
    }
}

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;

/// The TCP server run by rank 0; stops when dropped.
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpStoreServer {
    /// Binds `addr` and serves until dropped.
    pub fn bind(addr: &str) -> io::Result<TcpStoreServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let store = Arc::new(MemoryStore::new());
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new().name("symm-store".into()).spawn(move || {
            for conn in listener.incoming() {
                // Acquire: pairs with the release store in Drop.
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                if let Ok(conn) = conn {
                    let store = store.clone();
                    // Connection threads end when their client closes the socket.
                    let _ = std::thread::Builder::new().name("symm-store-conn".into()).spawn(move || {
                        let _ = serve(conn, &store);
                    });
                }
            }
        })?;
        Ok(TcpStoreServer { addr, stop, thread: Some(thread) })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
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

fn read_bytes(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let n = read_u32(r)? as usize;
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn write_bytes(w: &mut impl Write, b: &[u8]) -> io::Result<()> {
    let n = u32::try_from(b.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "value too large"))?;
    w.write_all(&n.to_le_bytes())?;
    w.write_all(b)
}

fn serve(mut conn: TcpStream, store: &MemoryStore) -> io::Result<()> {
    conn.set_nodelay(true)?;
    loop {
        let mut op = [0u8; 1];
        if conn.read(&mut op)? == 0 {
            return Ok(());
        }
        let key =
            String::from_utf8(read_bytes(&mut conn)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match op[0] {
            OP_SET => {
                let value = read_bytes(&mut conn)?;
                let _ = store.set(&key, &value);
                conn.write_all(&[0])?;
                write_bytes(&mut conn, &[])?;
            }
            OP_GET => {
                let mut t = [0u8; 8];
                conn.read_exact(&mut t)?;
                match store.wait_get(&key, Duration::from_millis(u64::from_le_bytes(t))) {
                    Some(v) => {
                        conn.write_all(&[0])?;
                        write_bytes(&mut conn, &v)?;
                    }
                    None => {
                        conn.write_all(&[1])?;
                        write_bytes(&mut conn, &[])?;
                    }
                }
            }
            other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown store op {other}"))),
        }
    }
}

/// A client of [`TcpStoreServer`]; one connection, requests serialised.
#[derive(Debug)]
pub struct TcpStore {
    conn: Mutex<TcpStream>,
    addr: String,
}

impl TcpStore {
    /// Connects to `addr`, retrying until `timeout` (the server may start later).
    pub fn connect(addr: &str, timeout: Duration) -> Result<TcpStore, BootstrapError> {
        let deadline = Instant::now() + timeout;
        let io_err =
            |e: io::Error| BootstrapError::Io { what: format!("connecting to the rendezvous {addr}"), source: e };
        loop {
            let resolved = addr.to_socket_addrs().map_err(io_err)?.next();
            let Some(sa) = resolved else {
                return Err(io_err(io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing")));
            };
            match TcpStream::connect_timeout(&sa, Duration::from_millis(500)) {
                Ok(conn) => {
                    conn.set_nodelay(true).map_err(io_err)?;
                    return Ok(TcpStore { conn: Mutex::new(conn), addr: addr.to_string() });
                }
                Err(e) if Instant::now() >= deadline => return Err(io_err(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn request(&self, op: u8, key: &str, payload: &[u8]) -> Result<(u8, Vec<u8>), BootstrapError> {
        let io_err =
            |e: io::Error| BootstrapError::Io { what: format!("talking to the rendezvous {}", self.addr), source: e };
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.write_all(&[op]).map_err(io_err)?;
        write_bytes(&mut *conn, key.as_bytes()).map_err(io_err)?;
        conn.write_all(payload).map_err(io_err)?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status).map_err(io_err)?;
        let value = read_bytes(&mut *conn).map_err(io_err)?;
        Ok((status[0], value))
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        let mut payload = Vec::with_capacity(4 + value.len());
        write_bytes(&mut payload, value).map_err(|e| BootstrapError::Io { what: "encoding".into(), source: e })?;
        self.request(OP_SET, key, &payload).map(|_| ())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match self.request(OP_GET, key, &ms.to_le_bytes())? {
            (0, v) => Ok(v),
            _ => Err(BootstrapError::Timeout { what: format!("store key {key:?} at {}", self.addr), timeout }),
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
        let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().to_string();
        let a = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
        let t = std::thread::spawn(move || b.get("k", Duration::from_secs(5)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        a.set("k", b"value").unwrap();
        assert_eq!(t.join().unwrap(), b"value");
        let e = a.get("missing", Duration::from_millis(50)).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
