//! The actors of the start-up security tests (`tests/tests/security.rs`), in one binary:
//!
//! - `rank`: one rank started from the environment (as `spawn_ranks` or a scenario sets it);
//!   it starts, runs one barrier and exits 0. With `SYMM_TEST_BAD_ENV_RANK=r`, rank r starts
//!   with a malformed heap size. Exit 2: start-up failed, 17: it failed because a peer did.
//! - `steal-heap`: the attacker of a heap: connects to the first `@symm-*-0` socket it finds
//!   in `/proc/net/unix`, says `CONNECTED`, then waits for a file descriptor: `STOLEN` or
//!   `REFUSED`.
//! - `forge-store ADDR KEY`: the attacker of the store: tries to write a garbage record under
//!   KEY: `WROTE` or `REFUSED`.
//! - `scenario-heap` / `scenario-store`: a 2-rank job with its store, rank 0 started first,
//!   the attacker (run as uid `nobody` through `setpriv`) let loose on it before rank 1
//!   starts. Meant to run as root in a private network namespace (abstract sockets and the
//!   loopback are then the job's alone). Prints what each actor did; exit 0 when the job
//!   succeeded and the attacker got nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use symm_core::{AtRank, Backend, Bootstrap, BootstrapError, Rank, Store};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("rank") => rank(),
        Some("steal-heap") => steal_heap(),
        Some("forge-store") => forge_store(&args[1], &args[2]),
        Some("scenario-heap") => std::process::exit(scenario(false)),
        Some("scenario-store") => std::process::exit(scenario(true)),
        other => panic!("unknown mode {other:?}"),
    }
}

fn rank() {
    if let (Ok(bad), Ok(me)) = (std::env::var("SYMM_TEST_BAD_ENV_RANK"), std::env::var("SYMM_RANK")) {
        if bad == me {
            // Single-threaded here: nothing reads the environment concurrently.
            std::env::set_var("SYMMETRIC_MEMORY_HEAP_SIZE", "garbage");
        }
    }
    let t = Instant::now();
    let started = match std::env::var_os("SYMM_TEST_HOLD_LISTENING") {
        Some(gate) => start_held(gate.into()),
        None => symm_registry::Comm::from_env(),
    };
    let comm = match started {
        Ok(c) => c,
        Err(e) => {
            let text = e.to_string();
            eprintln!("start-up failed after {:.1} s: {text}", t.elapsed().as_secs_f64());
            std::process::exit(if text.contains("a peer failed during start-up") { 17 } else { 2 });
        }
    };
    comm.barrier_group(&comm.world(), Duration::from_secs(30)).expect("barrier");
    println!("rank {} ok", comm.rank());
}

/// A store whose writes of this rank's "listening" record wait until the file `gate` exists:
/// the rank has bound its heap socket but its peer does not come for the heap until the test
/// lets it.
struct HeldStore {
    inner: symm_registry::store::TcpStore,
    gate: std::path::PathBuf,
}

impl Store for HeldStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        if key.contains("/listening/") {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !self.gate.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.inner.set(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        self.inner.get(key, timeout)
    }
}

/// What `Comm::from_env` does at a launcher's store, with the store held at `gate`.
fn start_held(gate: std::path::PathBuf) -> symm_core::Result<symm_registry::Comm> {
    let rank: u32 = std::env::var("SYMM_RANK").unwrap().parse().unwrap();
    let n: usize = std::env::var("SYMM_WORLD_SIZE").unwrap().parse().unwrap();
    let addr = std::env::var("SYMM_RENDEZVOUS").unwrap();
    let config = symm_registry::CommConfig::from_env().unwrap();
    let store = symm_registry::store::TcpStore::connect(&addr, config.settings.timeout).at(Rank(rank))?;
    let store: Arc<dyn Store> = Arc::new(HeldStore { inner: store, gate });
    let secret = symm_core::bootstrap::JobSecret::from_env().at(Rank(rank))?;
    let boot = Bootstrap::new(Rank(rank), n, store, "symm.0", config.settings.timeout).with_secret(secret);
    symm_registry::Comm::init(&boot, config)
}

fn say(what: &str) {
    println!("{what}");
    let _ = std::io::stdout().flush();
}

fn steal_heap() {
    let deadline = Instant::now() + Duration::from_secs(30);
    let name = loop {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        let found = table
            .lines()
            .filter_map(|l| l.split_whitespace().nth(7))
            .find(|p| p.starts_with("@symm-") && p.ends_with("-0"))
            .map(|p| p[1..].to_string());
        if let Some(n) = found {
            break n;
        }
        assert!(Instant::now() < deadline, "no symm socket appeared");
        std::thread::sleep(Duration::from_millis(1));
    };
    let addr = SocketAddr::from_abstract_name(&name).unwrap();
    let sock = UnixStream::connect_addr(&addr).expect("connecting to the heap socket");
    say(&format!("CONNECTED {name} as uid {}", unsafe_uid()));
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // A client of the old protocol sends nothing; one of the new would have to prove a secret
    // it does not have: send garbage of the size of a request.
    let _ = (&sock).write_all(&[0u8; 40]);
    match symm_registry::host::sys::recv_fd(&sock) {
        Ok(fd) => {
            let len = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|m| m.len()).unwrap_or(0);
            say(&format!("STOLEN a descriptor of {len} bytes"));
        }
        Err(e) => say(&format!("REFUSED ({e})")),
    }
}

fn unsafe_uid() -> u32 {
    symm_registry::host::sys::effective_uid()
}

fn forge_store(addr: &str, key: &str) {
    let mut c = TcpStream::connect(addr).expect("connecting to the store");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Servers that authenticate greet first; the old one waits for a request.
    let mut greeting = [0u8; 1];
    c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    match c.read(&mut greeting) {
        Ok(1) if greeting[0] == 4 => {
            // A challenge: answer with garbage (the secret is unknown to us).
            let mut challenge = [0u8; 32];
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.read_exact(&mut challenge).unwrap();
            let _ = c.write_all(&[0u8; 32]);
        }
        Ok(1) if greeting[0] == 0 => {}
        _ => {}
    }
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let garbage = b"not a hello";
    let mut frame = vec![1u8];
    frame.extend_from_slice(&(key.len() as u32).to_le_bytes());
    frame.extend_from_slice(key.as_bytes());
    frame.extend_from_slice(&(garbage.len() as u32).to_le_bytes());
    frame.extend_from_slice(garbage);
    let _ = c.write_all(&frame);
    let mut reply = Vec::new();
    let mut b = [0u8; 1];
    // The reply to a SET is status 0 and an empty value; anything else is a refusal.
    while reply.len() < 5 {
        match c.read(&mut b) {
            Ok(1) => reply.push(b[0]),
            _ => break,
        }
    }
    if reply == [0, 0, 0, 0, 0] {
        say(&format!("WROTE {key:?}"));
    } else {
        say(&format!("REFUSED (reply {reply:?})"));
    }
}

fn start_rank(exe: &std::path::Path, r: usize, rendezvous: &str, gate: &std::path::Path) -> Child {
    Command::new(exe)
        .arg("rank")
        .env("SYMM_TEST_HOLD_LISTENING", gate)
        .env("SYMM_RANK", r.to_string())
        .env("SYMM_WORLD_SIZE", "2")
        .env("SYMM_RENDEZVOUS", rendezvous)
        .env("SYMM_RENDEZVOUS_HOSTED", "1")
        .env("SYMMETRIC_MEMORY_HEAP_SIZE", "64M")
        .env("SYMMETRIC_MEMORY_TIMEOUT", "20")
        .env("SYMM_LOG_LEVEL", "warn")
        .spawn()
        .expect("starting a rank")
}

/// Runs the attacker as uid `nobody`, from a copy of this binary that uid can execute.
fn start_attacker(exe: &std::path::Path, args: &[&str]) -> Child {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the attacker with setpriv")
}

fn scenario(store: bool) -> i32 {
    // A fresh secret for the job, in the environment the ranks inherit (single-threaded here).
    let secret: String = {
        let mut b = [0u8; 16];
        std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut b).unwrap();
        b.iter().map(|x| format!("{x:02x}")).collect()
    };
    std::env::set_var("SYMM_JOB_SECRET", &secret);
    // The store's refusals are logged at warn.
    std::env::set_var("SYMM_LOG_LEVEL", "warn");
    let server = symm_registry::store::TcpStoreServer::bind("127.0.0.1:0").expect("serving the store");
    let rendezvous = server.local_addr().to_string();
    let me = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("symm-security-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("probe");
    std::fs::copy(&me, &copy).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();

    let gate = dir.join("go");
    let mut rank0 = start_rank(&me, 0, &rendezvous, &gate);
    let (mut attacker, mut rank1) = if store {
        // Rank 1's hello of the first start-up at a launcher's store, before rank 1 is there.
        (start_attacker(&copy, &["forge-store", &rendezvous, "symm.0/0/hello/1"]), None)
    } else {
        // Both ranks bind their heap sockets, then wait at the gate before they come for each
        // other's heap: the attacker is queued on rank 0's socket first.
        (start_attacker(&copy, &["steal-heap"]), Some(start_rank(&me, 1, &rendezvous, &gate)))
    };
    let mut out = BufReader::new(attacker.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    println!("attacker: {}", first.trim());
    let mut rank1 = rank1.take().unwrap_or_else(|| start_rank(&me, 1, &rendezvous, &gate));
    std::fs::write(&gate, b"").unwrap();
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let _ = attacker.wait();
    for l in rest.lines() {
        println!("attacker: {l}");
    }
    let s0 = rank0.wait().unwrap();
    let s1 = rank1.wait().unwrap();
    println!("rank 0: {s0}; rank 1: {s1}");
    let _ = std::fs::remove_dir_all(&dir);
    let attacker_won = first.starts_with("WROTE") || rest.contains("STOLEN");
    i32::from(!(s0.success() && s1.success()) || attacker_won)
}
