//! [`SimComm`]: the CPU shared-memory backend.
//!
//! Every rank owns one segment (a memfd): control area, then heap. At start-up every rank maps
//! the segments of all ranks on its host, receiving their file descriptors over an abstract
//! Unix socket (no file-system name, nothing left behind). From then on a put is a `memcpy`
//! into the peer's mapping, a signal is an atomic on it, and a wait watches the caller's own
//! memory.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use symm_core::backend::HostMapped;
use symm_core::bootstrap::JobSecret;
use symm_core::coll::by_reference::{self, ReferenceCache};
use symm_core::config::{self, CollectiveEngine, Config, ConfigError};
use symm_core::dfx::{self, FlightRing, Op, Registration, StatsTable};
use symm_core::stream::{Event, HostTask, Stream, StreamBackend, StreamCollectives};
use symm_core::{
    AtRank, Backend, Bootstrap, BootstrapError, CmpOp, DescribeWait, Error, Group, GroupError, GroupId, GroupRegistry,
    HeapError, Rank, Result, SignalOp, SignalWidth, TimeoutError, WaitSite,
};
use symm_core::{CollOptions, Collectives, GroupHeapStats, HeapStats, LocalMut, LocalRef, ReduceOp};
use symm_host as host;

use crate::alloc;
use crate::control::{
    Control, GroupSlot, Layout, CLOSED, EXITED, GRANULE, MAGIC, MAX_GROUPS, OPEN, REQ_ALLOC, REQ_FREE,
};
use crate::recorder::SimNode;
use crate::stream::Streams;
use crate::sys::{self, Mapping};
use crate::wait::{self, ring, SpinPolicy, WaitEnd};

/// Settings of the CPU backend.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Heap bytes per rank (same on every rank).
    pub heap_size: usize,
    /// Default bound of every wait.
    pub timeout: Duration,
    /// Host identity override; ranks with different identities are treated as different
    /// hosts (used to test the one-node rule on one machine). `None`: hostname + boot id.
    pub host_id: Option<String>,
    /// Flight-recorder records per rank (0: no recorder); the same on every rank.
    pub recorder_entries: usize,
    /// Whether the rank keeps per-operation statistics (`SYMM_STATS`).
    pub stats: bool,
    /// Whether collectives and point-to-point calls are timed (`SYMM_TIMING`, default off).
    pub timing: bool,
    /// Whether signals may be light where the kernel allows (`SYMM_LIGHT_SIGNALS`, default on;
    /// see `wait`). Chosen once per process, by its first communicator.
    pub light_signals: bool,
    /// Every other setting (collectives, waits, diagnostics), parsed once from the
    /// environment; the fields above take precedence over their namesakes in it.
    pub settings: Config,
    /// A refused environment value [`SimConfig::with_heap_size`] met: start-up reports it.
    refused: Option<ConfigError>,
}

impl SimConfig {
    /// From the environment: every variable of [`symm_core::config::VARS`] a communicator reads;
    /// a refused value is an error naming the variable, the value and what is accepted.
    pub fn from_env() -> std::result::Result<SimConfig, BootstrapError> {
        Ok(SimConfig::from_settings(Config::from_env()?))
    }

    /// The backend's settings from parsed ones.
    pub fn from_settings(settings: Config) -> SimConfig {
        SimConfig {
            heap_size: settings.heap_size,
            timeout: settings.timeout,
            host_id: settings.host_id.clone(),
            recorder_entries: settings.recorder_entries,
            stats: settings.stats,
            timing: settings.timing,
            light_signals: settings.light_signals,
            settings,
            refused: None,
        }
    }

    /// A config with the given heap size and the environment's other settings. A refused
    /// value among those is not dropped: [`SimComm::init`] fails with it.
    pub fn with_heap_size(heap_size: usize) -> SimConfig {
        let others = |name: &str| if name == config::HEAP_SIZE.name { None } else { config::environment(name) };
        let mut c = match Config::from_lookup(&others) {
            Ok(settings) => SimConfig::from_settings(settings),
            Err(e) => SimConfig { refused: Some(e), ..SimConfig::from_settings(Config::default()) },
        };
        c.heap_size = heap_size;
        c
    }

    /// The settings in effect: [`SimConfig::settings`] with the fields of this config.
    fn effective(&self) -> Config {
        Config {
            heap_size: self.heap_size,
            timeout: self.timeout,
            host_id: self.host_id.clone(),
            recorder_entries: self.recorder_entries,
            stats: self.stats,
            timing: self.timing,
            light_signals: self.light_signals,
            ..self.settings.clone()
        }
    }
}

/// Per-group state of this rank.
#[derive(Debug)]
struct GroupState {
    group: Group,
    /// Index of this rank's slot for the group.
    my_slot: usize,
    /// Slot index of each member (group order), found lazily by scanning its table.
    peer_slots: Vec<OnceLock<usize>>,
    /// Allocations done in the group so far.
    alloc_seq: AtomicU64,
}

/// This rank's record of its heap, kept under `SimComm::alloc_lock` (what the bitmaps do not
/// say: which group each range belongs to, and which ones this rank has dropped).
#[derive(Debug, Default)]
struct HeapBook {
    /// Live allocations (dropped ones included) by group: heap offset -> bytes.
    allocs: HashMap<GroupId, BTreeMap<usize, usize>>,
    /// Allocations this rank has dropped and published in its dropped bitmap, by group.
    dropped: HashMap<GroupId, BTreeMap<usize, usize>>,
}

/// A request of one round of the allocation protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeapRequest {
    Alloc { bytes: usize },
    Free { offset: usize, bytes: usize },
}

impl HeapRequest {
    fn read(slot: &GroupSlot) -> HeapRequest {
        // Relaxed: made visible by the acquire loads of `alloc_seq` in wait_members.
        let bytes = slot.alloc_bytes.load(Ordering::Relaxed) as usize;
        match slot.req_kind.load(Ordering::Relaxed) {
            REQ_FREE => HeapRequest::Free { offset: slot.req_offset.load(Ordering::Relaxed) as usize, bytes },
            _ => HeapRequest::Alloc { bytes },
        }
    }

    fn describe(self) -> String {
        match self {
            HeapRequest::Alloc { bytes } => format!("alloc of {bytes} bytes"),
            HeapRequest::Free { offset, bytes } => format!("free of {bytes} bytes at heap offset {offset:#x}"),
        }
    }
}

/// A rank of the CPU shared-memory backend.
///
/// Its state is shared with the threads of its streams ([`StreamBackend`]), which run their
/// operations with handles of their own; the state goes when the last handle does, and the
/// streams end (after what was queued on them) when the application's handle is dropped.
#[derive(Debug)]
pub struct SimComm {
    shared: Arc<SimState>,
    /// The application's handle (false: a stream thread's).
    primary: bool,
    /// How this handle's blocking calls run, decided when the handle is made. Kept here, not
    /// read from the shared settings, because the host engine's every signal and every
    /// collective checks it, once.
    mode: Mode,
}

/// How a handle's blocking calls run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// On the calling thread, collectives by the host engine.
    Host,
    /// On the calling thread, collectives by the reference collectives (`SYMM_COLLECTIVES`).
    Reference,
    /// Enqueued on the rank's default stream and waited for (`SYMM_EXECUTION=stream`; never a
    /// stream thread's handle, whose calls are the stream's own operations: those run in the
    /// mode of `SYMM_COLLECTIVES`).
    Stream,
}

impl Mode {
    /// The mode of a handle whose calls run on the calling thread.
    fn on_thread(settings: &Config) -> Mode {
        match settings.collectives {
            CollectiveEngine::Host => Mode::Host,
            CollectiveEngine::Reference => Mode::Reference,
        }
    }
}

/// What every handle of a [`SimComm`] shares.
#[derive(Debug)]
pub struct SimState {
    rank: Rank,
    world_size: usize,
    instance: u64,
    config: SimConfig,
    /// The settings in effect ([`SimConfig::effective`]), for the layers above.
    settings: Config,
    layout: Layout,
    hosts: Vec<String>,
    pids: Vec<u32>,
    /// Mappings by global rank; `None` for ranks on other hosts. Never changes after start-up.
    /// Shared with `node`, which the process-wide diagnostics hold.
    maps: Arc<[Option<Mapping>]>,
    registry: GroupRegistry,
    groups: RwLock<HashMap<GroupId, Arc<GroupState>>>,
    /// Serialises this rank's changes to its own allocation and dropped bitmaps and group
    /// table; holds the record of its allocations.
    alloc_lock: Mutex<HeapBook>,
    /// Allocations dropped (abandoned) since the last allocation round: (group, offset,
    /// bytes). A separate lock, never held across a wait, so dropping never blocks.
    pending_drops: Mutex<Vec<(GroupId, usize, usize)>>,
    policy: SpinPolicy,
    world: Group,
    /// What the diagnostics (dumps, exit hook) need; registered with `symm_core::dfx`.
    node: Arc<SimNode>,
    /// Keeps `node` registered until this communicator is dropped.
    _registration: Option<Registration>,
    /// Per-operation statistics.
    stats: StatsTable,
    /// The process's fork generation when this communicator was created: a call from a child
    /// of `fork()` (another generation) is refused (see [`Backend::check_process`]).
    generation: u64,
    /// The communicator's streams.
    streams: Streams<SimComm>,
    /// The stream blocking calls run on under `SYMM_EXECUTION=stream`, created at the first.
    default_stream: Mutex<Option<Stream>>,
    /// Each group's reference collectives, under `SYMM_COLLECTIVES=reference`.
    references: ReferenceCache,
}

impl std::ops::Deref for SimComm {
    type Target = SimState;

    #[inline]
    fn deref(&self) -> &SimState {
        &self.shared
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    u64::from_le_bytes(b)
}

fn socket_name(job: u64, rank: usize) -> String {
    format!("symm-{job:016x}-{rank}")
}

impl SimComm {
    /// Starts this rank: exchanges identities through `boot`, creates its segment and maps the
    /// segments of every rank on its host. Collective over the world. If this rank fails, it
    /// says so in the store first, so that its peers fail at once too
    /// ([`BootstrapError::PeerFailed`]) instead of at the timeout.
    pub fn init(boot: &Bootstrap, config: SimConfig) -> Result<SimComm> {
        let started = Self::start(boot, config);
        if let Err(e) = &started {
            // A peer's failure is already in the store: keep its reason there.
            if !matches!(e, Error::Bootstrap { source: BootstrapError::PeerFailed { .. }, .. }) {
                boot.abort(&e.to_string());
            }
        }
        started
    }

    fn start(boot: &Bootstrap, config: SimConfig) -> Result<SimComm> {
        let rank = boot.rank();
        let n = boot.world_size();
        let berr = |what: String, source: std::io::Error| Error::Bootstrap {
            rank,
            source: BootstrapError::Io { what, source },
        };
        if let Some(e) = &config.refused {
            return Err(BootstrapError::from(e.clone())).at(rank);
        }
        let layout = Layout::new(config.heap_size, config.recorder_entries);
        // The heap size as the ranks use it (rounded up to whole pages) is what they compare.
        let settings = Config { heap_size: layout.heap_size, ..config.effective() };
        let host = config.host_id.clone().unwrap_or_else(symm_core::group::host_identity);
        let pid = std::process::id();
        let nonce = random_u64();
        let hello = format!("{host}\n{pid}\n{nonce}\n{}\n{}", layout.heap_size, layout.recorder_entries);
        let replies = boot.allgather("hello", hello.as_bytes()).at(rank)?;
        let (mut hosts, mut pids, mut sizes, mut entries) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut job = 0;
        for (r, bytes) in replies.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            let fields: Vec<&str> = text.split('\n').collect();
            let parsed = (fields.len() == 5)
                .then(|| {
                    Some((
                        fields[1].parse::<u32>().ok()?,
                        fields[2].parse::<u64>().ok()?,
                        fields[3].parse::<usize>().ok()?,
                        fields[4].parse::<usize>().ok()?,
                    ))
                })
                .flatten();
            let Some((p, nc, size, e)) = parsed else {
                return Err(BootstrapError::Protocol(format!("rank {r} sent an unreadable hello {text:?}"))).at(rank);
            };
            if r == 0 {
                job = nc;
            }
            hosts.push(fields[0].to_string());
            pids.push(p);
            sizes.push((Rank(r as u32), size));
            entries.push((Rank(r as u32), e));
        }
        if sizes.iter().any(|&(_, s)| s != layout.heap_size) {
            return Err(HeapError::HeapSizeMismatch { sizes }).at(rank);
        }
        // Peers' rings are read with this rank's layout: it must be the same everywhere.
        if entries.iter().any(|&(_, e)| e != layout.recorder_entries) {
            return Err(BootstrapError::Env {
                var: dfx::ENTRIES_VAR,
                value: config::environment(dfx::ENTRIES_VAR),
                reason: format!(
                    "differs between ranks (records per global rank: {entries:?}); set it alike everywhere"
                ),
            })
            .at(rank);
        }

        // The settings every rank must share, by name: a round of their own after the hello.
        let records = boot.allgather("settings", &settings.agreed_record()).at(rank)?;
        match config::check_agreement(&records) {
            Ok(()) => {}
            Err(Ok(e)) => return Err(BootstrapError::from(e)).at(rank),
            Err(Err(why)) => return Err(BootstrapError::Protocol(why)).at(rank),
        }

        let fd: OwnedFd = sys::memfd(&format!("symm-heap-r{}", rank.0), layout.total)
            .map_err(|e| berr(format!("creating the {}-byte heap segment", layout.total), e))?;
        let mine = Mapping::map(&fd, layout.total).map_err(|e| berr("mapping the heap segment".into(), e))?;
        let h = Control::of(&mine, layout).header();
        // Relaxed for the plain fields: published by the release store of `magic`.
        h.rank.store(u64::from(rank.0), Ordering::Relaxed);
        h.pid.store(u64::from(pid), Ordering::Relaxed);
        h.heap_size.store(layout.heap_size as u64, Ordering::Relaxed);
        if let Some(ring) = Control::of(&mine, layout).ring() {
            ring.init(rank, pid);
        }
        h.magic.store(MAGIC, Ordering::Release);

        let local: Vec<usize> = (0..n).filter(|&r| r != rank.index() && hosts[r] == host).collect();
        let addr = SocketAddr::from_abstract_name(socket_name(job, rank.index()))
            .map_err(|e| berr("naming the start-up socket".into(), e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| berr("binding the start-up socket".into(), e))?;
        boot.allgather("listening", b"").at(rank)?;

        let deadline = Instant::now() + boot.timeout();
        let heap_key = heap_key(boot, job, &replies);
        let server = {
            let raw = fd.as_fd();
            let handshake = HeapHandshake { rank, job, pids: &pids, key: &heap_key, deadline, boot };
            listener.set_nonblocking(true).map_err(|e| berr("configuring the start-up socket".into(), e))?;
            std::thread::scope(|s| {
                let server = s.spawn(|| handshake.serve(&listener, raw, &local));
                let mut maps: Vec<Option<Mapping>> = (0..n).map(|_| None).collect();
                let mut result = Ok(());
                for &p in &local {
                    match handshake.fetch(p, layout) {
                        Ok(m) => maps[p] = Some(m),
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                let served = server.join().unwrap_or_else(|_| {
                    Err(berr("handing the heap segment to peers".into(), std::io::Error::other("server panicked")))
                });
                result.and(served).map(|_| maps)
            })
        };
        let mut maps = server?;
        drop(listener);
        drop(fd);
        maps[rank.index()] = Some(mine);
        boot.allgather("mapped", b"").at(rank)?;

        let policy = SpinPolicy::for_host(local.len() + 1, sys::host_cores(), &settings);
        wait::choose_signal_mode(config.light_signals);
        let registry = GroupRegistry::new(n, rank);
        let placeholder = Group::new(n, rank, &[rank], Ok(())).at(rank)?;
        let maps: Arc<[Option<Mapping>]> = maps.into();
        let node = |world: Group| Arc::new(SimNode { rank, world_size: n, layout, maps: maps.clone(), world });
        let instance = random_u64();
        let streams = Streams::new(instance, rank, settings.stream_delay.as_micros() as u64);
        let state = SimState {
            rank,
            world_size: n,
            instance,
            config,
            settings,
            layout,
            hosts,
            pids,
            maps: maps.clone(),
            registry,
            groups: RwLock::new(HashMap::new()),
            alloc_lock: Mutex::new(HeapBook::default()),
            pending_drops: Mutex::new(Vec::new()),
            policy,
            world: placeholder.clone(),
            node: node(placeholder),
            _registration: None,
            stats: StatsTable::default(),
            generation: dfx::process_generation(),
            streams,
            default_stream: Mutex::new(None),
            references: ReferenceCache::default(),
        };
        let mode = if state.settings.stream_execution { Mode::Stream } else { Mode::on_thread(&state.settings) };
        let mut comm = SimComm { shared: Arc::new(state), primary: true, mode };
        let all: Vec<Rank> = (0..n as u32).map(Rank).collect();
        let world = comm.group_of(&all)?;
        let st = Arc::get_mut(&mut comm.shared).expect("no other handle exists during start-up");
        st.world = world;
        st.node = node(st.world.clone());
        st._registration = Some(dfx::register(st.node.clone()));
        if comm.settings.dump_on_signal {
            dfx::install_dump_on_signal_logged();
        }
        comm.node.mark(Op::Init);
        // Set up the world's collective workspace now, while every rank is here: send/recv in
        // the world then never waits for ranks that take no part in it. A heap too small for
        // it only defers the set-up to the world's first collective.
        if comm.world.member().is_ok() {
            let prepared = match comm.settings.collectives {
                CollectiveEngine::Host => symm_host::prepare(&comm, &comm.world),
                CollectiveEngine::Reference => by_reference::prepare(&comm, &comm.references, &comm.world),
            };
            match prepared {
                Ok(()) => {}
                Err(Error::Heap { source, .. }) => symm_core::symm_log!(
                    dfx::Level::Warn,
                    rank,
                    "collective workspace of the world not set up at start-up ({source}); it will be at the first collective"
                ),
                Err(e) => return Err(e),
            }
        }
        symm_core::symm_log!(
            dfx::Level::Info,
            rank,
            "started: world of {n}, {} rank(s) on this host, heap {} bytes, flight recorder {} records, validation {}",
            local.len() + 1,
            layout.heap_size,
            layout.recorder_entries,
            if comm.settings.validate { "on" } else { "off" }
        );
        Ok(comm)
    }

    /// This rank's control area.
    #[inline]
    fn me(&self) -> Control<'_> {
        self.ctrl(self.rank).expect("own segment is always mapped")
    }

    /// The control area of `r`, when `r` is on this host.
    #[inline]
    fn ctrl(&self, r: Rank) -> Option<Control<'_>> {
        self.maps.get(r.index())?.as_ref().map(|m| Control::of(m, self.layout))
    }

    /// The host identity of every rank.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The settings in use.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Each group's reference collectives, which serve this communicator's collectives under
    /// `SYMM_COLLECTIVES=reference` (the world's set up at start-up), and a wrapper of it
    /// that serves its own with `symm_core::collectives_by_reference!`.
    pub fn reference_cache(&self) -> &ReferenceCache {
        &self.references
    }

    /// A handle for a stream's thread.
    fn stream_handle(&self) -> SimComm {
        SimComm { shared: self.shared.clone(), primary: false, mode: Mode::on_thread(&self.settings) }
    }

    /// Another handle of this rank for work run on its behalf, such as a stream operation that
    /// a layer above gives its own view of the communicator (`symm-registry`'s `Comm`). It
    /// shares the rank's state; unlike the application's handle, dropping it does not end the
    /// streams.
    pub fn task_handle(&self) -> SimComm {
        self.stream_handle()
    }

    /// A blocking call in the stream-ordered model (`SYMM_EXECUTION=stream`): `on_stream`
    /// enqueues its stream form on the rank's default stream and waits for it. On a stream's own
    /// thread, where the call is the stream's operation, `here` runs it with a handle whose
    /// calls run on the calling thread. Callers test `self.mode == Mode::Stream` inline and
    /// return this call's result, so that the host forms keep no stack frame for the stream path
    /// (it cost a small put 26 of its 33 instructions, callgrind).
    #[cold]
    #[inline(never)]
    fn in_stream_model(
        &self,
        on_stream: impl FnOnce(&Stream) -> Result<()>,
        here: impl FnOnce(&SimComm) -> Result<()>,
    ) -> Result<()> {
        match self.blocking_stream()? {
            Some(s) => on_stream(&s),
            None => here(&self.stream_handle()),
        }
    }

    /// The stream a blocking call runs on in the stream-ordered model: the rank's default
    /// stream; `None` on a stream's own thread, whose calls are the stream's operation.
    #[cold]
    fn blocking_stream(&self) -> Result<Option<Stream>> {
        if symm_core::stream::on_executor_thread() {
            return Ok(None);
        }
        self.default_stream().map(Some)
    }

    #[cold]
    fn default_stream(&self) -> Result<Stream> {
        let mut slot = self.default_stream.lock().unwrap_or_else(|p| p.into_inner());
        match *slot {
            Some(s) => Ok(s),
            None => Ok(*slot.insert(self.create_stream()?)),
        }
    }

    /// Waits for the operation a blocking call enqueued (`event`), and returns its result. The
    /// operation's own waits are bounded, so this wait is too; it never returns while the
    /// operation may still use the caller's buffers: past `timeout` it says so and waits on.
    fn finish(&self, event: &Event, timeout: Duration) -> Result<()> {
        loop {
            match self.streams.synchronize(event, timeout) {
                Err(Error::Timeout(t)) if !self.streams.query(event).unwrap_or(true) => symm_core::symm_log!(
                    dfx::Level::Warn,
                    self.rank,
                    "{t}; the blocking call waits on, since the operation uses the caller's buffers until it ends"
                ),
                r => return r,
            }
        }
    }

    /// In the stream-ordered model: a host-side wait first lets the default stream finish
    /// what was enqueued before it.
    fn drain(&self) -> Result<()> {
        if self.mode != Mode::Stream {
            return Ok(());
        }
        self.in_stream_model(|s| self.finish(&self.streams.record(s)?, self.default_timeout()), |_| Ok(()))
    }

    fn state(&self, group: &Group) -> Result<Arc<GroupState>> {
        self.check_process()?;
        group.member().at(self.rank)?;
        let found = self.groups.read().unwrap_or_else(|e| e.into_inner()).get(&group.id()).cloned();
        found.ok_or_else(|| Error::Group {
            rank: self.rank,
            source: GroupError::NotMember { ranks: group.ranks().to_vec() },
        })
    }

    fn locality(&self, ranks: &[Rank]) -> std::result::Result<(), GroupError> {
        let mine = &self.hosts[self.rank.index()];
        let remote: Vec<Rank> = ranks.iter().copied().filter(|r| &self.hosts[r.index()] != mine).collect();
        if remote.is_empty() {
            Ok(())
        } else {
            Err(GroupError::SpansHosts { ranks: ranks.to_vec(), remote, local_rank: self.rank, host: mine.clone() })
        }
    }

    /// Takes a free slot in this rank's table for `group` and records the group's state.
    fn register(&self, group: &Group) -> std::result::Result<(), GroupError> {
        let me = self.me();
        let _lock = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Relaxed: only this process writes its own keys, under `alloc_lock`.
        let free = (0..MAX_GROUPS).find(|&i| me.slot(i).key.load(Ordering::Relaxed) == 0);
        let slot = free.ok_or(GroupError::TooManyGroups { limit: MAX_GROUPS })?;
        let s = me.slot(slot);
        s.nranks.store(group.size() as u64, Ordering::Relaxed);
        // Release: publishes `nranks` (and the zeroed counters) to peers that find the key.
        s.key.store(group.id().0, Ordering::Release);
        let state = GroupState {
            group: group.clone(),
            my_slot: slot,
            peer_slots: (0..group.size()).map(|_| OnceLock::new()).collect(),
            alloc_seq: AtomicU64::new(0),
        };
        let _ = state.peer_slots[group.my_rank().map_or(0, |g| g.index())].set(slot);
        self.groups.write().unwrap_or_else(|e| e.into_inner()).insert(group.id(), Arc::new(state));
        Ok(())
    }

    /// The slot of member `i` (group order) of `st`'s group, waiting (bounded) for the member
    /// to create the group if it has not yet.
    fn peer_slot(&self, st: &GroupState, i: usize, deadline: Instant) -> Result<&GroupSlot> {
        let global = st.group.ranks()[i];
        let ctrl = self.ctrl(global).ok_or_else(|| Error::Group {
            rank: self.rank,
            source: GroupError::SpansHosts {
                ranks: st.group.ranks().to_vec(),
                remote: vec![global],
                local_rank: self.rank,
                host: self.hosts[self.rank.index()].clone(),
            },
        })?;
        if let Some(&k) = st.peer_slots[i].get() {
            return Ok(ctrl.slot(k));
        }
        let (id, size) = (st.group.id().0, st.group.size() as u64);
        let started = Instant::now();
        let mut nap = Duration::from_micros(50);
        // Acquire: pairs with the release store of `key` in `register`, making `nranks` and the
        // slot's zeroed counters visible.
        let find = || {
            (0..MAX_GROUPS).find(|&k| {
                ctrl.slot(k).key.load(Ordering::Acquire) == id && ctrl.slot(k).nranks.load(Ordering::Relaxed) == size
            })
        };
        loop {
            if let Some(k) = find() {
                let _ = st.peer_slots[i].set(k);
                return Ok(ctrl.slot(k));
            }
            if Instant::now() >= deadline {
                return Err(self.timeout_error(
                    &WaitSite {
                        op: "group set-up".into(),
                        group: Some(st.group.ranks().to_vec()),
                        location: format!("the group table of rank {global}"),
                        watch: Vec::new(),
                        waiting_on: None,
                    },
                    format!("rank {global} to create the group"),
                    "group not created".into(),
                    vec![global],
                    started.elapsed(),
                ));
            }
            if let Err(e) = self.check_alive(&[global], &[global], "group set-up") {
                // The peer may have registered the group and ended since the last look.
                let k = find().ok_or(e)?;
                let _ = st.peer_slots[i].set(k);
                return Ok(ctrl.slot(k));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    fn timeout_error(
        &self,
        site: &WaitSite,
        condition: String,
        last_observed: String,
        pending: Vec<Rank>,
        waited: Duration,
    ) -> Error {
        Error::Timeout(Box::new(TimeoutError::new(
            self.rank,
            site.op.clone(),
            site.group.clone(),
            site.location.clone(),
            condition,
            last_observed,
            pending,
            waited,
        )))
    }

    /// Waits on this rank's doorbell until `check` gives a value or `deadline` passes (`None`),
    /// failing early when a peer `site` watches ends (see [`Self::check_alive`]). The site is
    /// described at the first health check, once the wait sleeps: a wait that ends while it
    /// spins allocates nothing.
    fn wait_at_site<T>(
        &self,
        site: DescribeWait<'_>,
        deadline: Instant,
        check: impl FnMut() -> Option<T>,
    ) -> Result<Option<T>> {
        let mut described: Option<(WaitSite, Vec<Rank>, Vec<Rank>)> = None;
        let health = || {
            let (site, watched, needed) = described.get_or_insert_with(|| {
                let site = site();
                let watched: Vec<Rank> =
                    if site.watch.is_empty() { site.group.clone().unwrap_or_default() } else { site.watch.clone() };
                let needed: Vec<Rank> = site.waiting_on.map_or_else(|| watched.clone(), |r| vec![r]);
                (site, watched, needed)
            });
            self.check_alive(watched, needed, &site.op)
        };
        match wait::wait_until(self.me().header(), self.policy, deadline, check, health) {
            Ok(v) => Ok(Some(v)),
            Err(WaitEnd::Failed(e)) => Err(e),
            Err(WaitEnd::TimedOut) => Ok(None),
        }
    }

    /// `PeerLost` if one of `ranks` (on this host) has ended.
    /// `PeerExited` if one of `needed` left on purpose (its closed mark: it dropped its
    /// communicator or its process exited normally); `PeerLost` if one of `ranks` ended without
    /// leaving (its process is gone, its mark still open).
    ///
    /// The two lists differ for collectives: a member that died leaves every member stuck
    /// (they all wait on each other), so the whole group is watched for that; a member that
    /// left on purpose may have done its whole part already (another member may merely be
    /// slow), so only the member a wait needs is blamed for leaving.
    fn check_alive(&self, ranks: &[Rank], needed: &[Rank], op: &str) -> Result<()> {
        let closed = |r: Rank| {
            // Acquire: pairs with the SeqCst mark of the leaving rank (nothing else is read
            // through it; the mark alone is the news).
            self.ctrl(r).map_or(OPEN, |c| c.header().closed.load(Ordering::Acquire))
        };
        for &r in needed.iter().filter(|&&r| r != self.rank) {
            let how = closed(r);
            if how == CLOSED || how == EXITED {
                return Err(Error::PeerExited {
                    rank: self.rank,
                    peer: r,
                    op: op.to_string(),
                    detail: if how == CLOSED {
                        "it dropped its communicator".into()
                    } else {
                        format!("its process {} exited without dropping it", self.pids[r.index()])
                    },
                });
            }
        }
        for &r in ranks.iter().filter(|&&r| r != self.rank && closed(r) == OPEN) {
            if self.pids[r.index()] != std::process::id() && !dfx::process_alive(self.pids[r.index()]) {
                return Err(Error::PeerLost {
                    rank: self.rank,
                    peer: r,
                    op: op.to_string(),
                    detail: format!("process {} no longer exists", self.pids[r.index()]),
                });
            }
        }
        Ok(())
    }

    /// Waits until every member's `counter(slot) >= target`; the slowest members are named on
    /// timeout.
    fn wait_members(
        &self,
        st: &GroupState,
        op: &str,
        what: &str,
        counter: impl Fn(&GroupSlot) -> &AtomicU64,
        target: u64,
        timeout: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut slots = Vec::with_capacity(st.group.size());
        for i in 0..st.group.size() {
            slots.push(self.peer_slot(st, i, deadline)?);
        }
        // Acquire: pairs with the members' SeqCst increments, making what they did before
        // arriving visible to this rank.
        let behind = || -> Vec<Rank> {
            slots
                .iter()
                .zip(st.group.ranks())
                .filter(|(s, _)| counter(s).load(Ordering::Acquire) < target)
                .map(|(_, &r)| r)
                .collect()
        };
        let all_there = || slots.iter().all(|s| counter(s).load(Ordering::Acquire) >= target).then_some(());
        let health = || {
            let b = behind();
            self.check_alive(&b, &b, op)
        };
        match wait::wait_until(self.me().header(), self.policy, deadline, all_there, health) {
            Ok(()) => Ok(()),
            Err(WaitEnd::Failed(e)) => Err(e),
            Err(WaitEnd::TimedOut) => {
                let pending = behind();
                let seen: Vec<String> = slots.iter().map(|s| counter(s).load(Ordering::Acquire).to_string()).collect();
                let mut e = self.timeout_error(
                    &WaitSite {
                        op: op.to_string(),
                        group: Some(st.group.ranks().to_vec()),
                        location: what.to_string(),
                        watch: Vec::new(),
                        waiting_on: None,
                    },
                    format!("every member to reach #{target}"),
                    format!("[{}] per member", seen.join(", ")),
                    pending.clone(),
                    start.elapsed(),
                );
                if let Error::Timeout(t) = &mut e {
                    // The barrier's (or allocation's) number in the group, the same on every member.
                    t.sequence = Some(target);
                    t.arrived =
                        st.group.ranks().iter().copied().filter(|r| *r != self.rank && !pending.contains(r)).collect();
                }
                Err(e)
            }
        }
    }

    /// One round of the allocation protocol in `group`, for an allocation or a free: every
    /// member publishes its request (and the allocations it has dropped since its last round),
    /// waits for every member's, and all of them decide alike from what they all read:
    ///
    /// - the requests must agree (same kind, size and, for a free, offset), else every member
    ///   fails the same way and nothing changes;
    /// - the group's allocations that every member has dropped are released (reclaimed), and
    ///   an allocation may take their ranges right away;
    /// - an allocation takes the first range free on every member.
    ///
    /// Nobody changes its bitmaps until every member has read them (the closing barrier).
    /// Returns the allocation's offset (a free: the freed offset).
    fn heap_round(&self, group: &Group, req: HeapRequest, timeout: Duration) -> Result<usize> {
        let st = self.state(group)?;
        let me = self.me();
        let mut book = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.publish_drops(&mut book, me);
        // Relaxed: only this thread (under alloc_lock) advances the group's sequence.
        let seq = st.alloc_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let my = me.slot(st.my_slot);
        let (kind, bytes, offset) = match req {
            HeapRequest::Alloc { bytes } => (REQ_ALLOC, bytes, 0),
            HeapRequest::Free { offset, bytes } => (REQ_FREE, bytes, offset),
        };
        // Relaxed: published by the SeqCst store of `alloc_seq` just below.
        my.alloc_bytes.store(bytes as u64, Ordering::Relaxed);
        my.req_kind.store(kind, Ordering::Relaxed);
        my.req_offset.store(offset as u64, Ordering::Relaxed);
        // SeqCst: publishes the request and (being inside alloc_lock) stable bitmaps.
        my.alloc_seq.0.store(seq, Ordering::SeqCst);
        self.ring_members(group);
        let op = if matches!(req, HeapRequest::Alloc { .. }) { "alloc" } else { "free" };
        self.wait_members(&st, op, "the members' allocation requests", |s| &s.alloc_seq.0, seq, timeout)?;

        let deadline = Instant::now() + timeout;
        let mut slots = Vec::with_capacity(group.size());
        for i in 0..group.size() {
            slots.push(self.peer_slot(&st, i, deadline)?);
        }
        let requests: Vec<(Rank, HeapRequest)> =
            slots.iter().zip(group.ranks()).map(|(s, &r)| (r, HeapRequest::read(s))).collect();
        let controls: Vec<Control<'_>> =
            group.ranks().iter().map(|&r| self.ctrl(r).expect("member on this host")).collect();
        // The group's allocations every member has dropped: each member reads the same dropped
        // bitmaps (stable until the barrier), so each finds the same ones.
        let reclaim: Vec<(usize, usize)> = book
            .dropped
            .get(&group.id())
            .map(|d| {
                d.iter()
                    .filter(|&(&off, _)| controls.iter().all(|c| alloc::is_set(c.dropped(), off / GRANULE)))
                    .map(|(&off, &b)| (off, b))
                    .collect()
            })
            .unwrap_or_default();
        let total = self.layout.heap_size / GRANULE;
        let heap_err = |source| Error::Heap { rank: self.rank, source };
        let outcome = if requests.iter().any(|&(_, r)| r != req) {
            if requests.iter().all(|(_, r)| matches!(r, HeapRequest::Alloc { .. })) {
                let sizes = requests
                    .iter()
                    .map(|&(r, q)| (r, if let HeapRequest::Alloc { bytes } = q { bytes } else { 0 }))
                    .collect();
                Err(heap_err(HeapError::SizeMismatch { group: group.ranks().to_vec(), sizes }))
            } else {
                let requests = requests.iter().map(|&(r, q)| (r, q.describe())).collect();
                Err(heap_err(HeapError::FreeMismatch { group: group.ranks().to_vec(), requests }))
            }
        } else {
            match req {
                HeapRequest::Alloc { bytes: 0 } => Ok(0),
                HeapRequest::Alloc { bytes } => {
                    let bitmaps: Vec<_> = controls.iter().map(|c| c.bitmap()).collect();
                    let freed = (!reclaim.is_empty()).then(|| {
                        alloc::mask(
                            self.layout.bitmap_words,
                            reclaim.iter().map(|&(o, b)| (o / GRANULE, alloc::granules(b))),
                        )
                    });
                    let need = alloc::granules(bytes);
                    alloc::find_common_free_with(&bitmaps, freed.as_deref(), total, need).map(|g| g * GRANULE).map_err(
                        |longest| {
                            let reclaimed: usize = reclaim.iter().map(|&(_, b)| alloc::granules(b)).sum();
                            let dropped: usize =
                                book.dropped.values().flat_map(|d| d.values()).map(|&b| alloc::granules(b)).sum();
                            heap_err(HeapError::Exhausted {
                                requested: bytes,
                                group: group.ranks().to_vec(),
                                largest_common_free: longest * GRANULE,
                                free: (alloc::free_granules(me.bitmap(), total) + reclaimed) * GRANULE,
                                heap_size: self.layout.heap_size,
                                awaiting_reclaim: (dropped - reclaimed) * GRANULE,
                            })
                        },
                    )
                }
                HeapRequest::Free { offset, .. } => Ok(offset),
            }
        };
        self.barrier_group(group, timeout)?;
        for &(off, b) in &reclaim {
            self.release(&mut book, me, group.id(), off, b);
        }
        match (outcome, req) {
            (Ok(offset), HeapRequest::Alloc { bytes }) if bytes > 0 => {
                alloc::mark(me.bitmap(), offset / GRANULE, alloc::granules(bytes), true);
                book.allocs.entry(group.id()).or_default().insert(offset, bytes);
                Ok(offset)
            }
            (Ok(offset), HeapRequest::Free { bytes, .. }) if bytes > 0 => {
                self.release(&mut book, me, group.id(), offset, bytes);
                Ok(offset)
            }
            (outcome, _) => outcome,
        }
    }

    /// Moves the allocations dropped since the last round into the dropped bitmap and the
    /// book (under `alloc_lock`, before this round's request is published).
    fn publish_drops(&self, book: &mut HeapBook, me: Control<'_>) {
        let drained = std::mem::take(&mut *self.pending_drops.lock().unwrap_or_else(|e| e.into_inner()));
        for (gid, off, bytes) in drained {
            // Only live allocations of this rank (a stale entry would mark a range it never had).
            if book.allocs.get(&gid).and_then(|a| a.get(&off)) == Some(&bytes) {
                alloc::mark(me.dropped(), off / GRANULE, 1, true);
                book.dropped.entry(gid).or_default().insert(off, bytes);
            }
        }
    }

    /// Releases this rank's range `off` of `gid` (freed or reclaimed).
    fn release(&self, book: &mut HeapBook, me: Control<'_>, gid: GroupId, off: usize, bytes: usize) {
        alloc::mark(me.bitmap(), off / GRANULE, alloc::granules(bytes), false);
        alloc::mark(me.dropped(), off / GRANULE, 1, false);
        if let Some(a) = book.allocs.get_mut(&gid) {
            a.remove(&off);
        }
        if let Some(d) = book.dropped.get_mut(&gid) {
            d.remove(&off);
        }
    }

    /// This rank's use of its heap: reserved, in use, dropped and waiting for other members,
    /// free, the largest free range, per group. Waits for an allocation round of another
    /// thread of this rank to finish.
    pub fn heap_stats(&self) -> HeapStats {
        let book = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let pending = self.pending_drops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let total = self.layout.heap_size / GRANULE;
        let bitmap = self.me().bitmap();
        let groups_known = self.groups.read().unwrap_or_else(|e| e.into_inner());
        let mut stats = HeapStats {
            heap_size: self.layout.heap_size,
            free: alloc::free_granules(bitmap, total) * GRANULE,
            largest_free: alloc::largest_free_run(bitmap, total) * GRANULE,
            ..HeapStats::default()
        };
        let mut ids: Vec<&GroupId> = book.allocs.iter().filter(|(_, a)| !a.is_empty()).map(|(g, _)| g).collect();
        ids.sort_by_key(|g| g.0);
        for gid in ids {
            let allocs = &book.allocs[gid];
            let dropped_here = |off: &usize| {
                book.dropped.get(gid).is_some_and(|d| d.contains_key(off))
                    || pending.iter().any(|&(g, o, _)| g == *gid && o == *off)
            };
            let mut g = GroupHeapStats {
                ranks: groups_known.get(gid).map(|s| s.group.ranks().to_vec()).unwrap_or_default(),
                allocations: allocs.len(),
                ..GroupHeapStats::default()
            };
            for (off, &b) in allocs {
                let taken = alloc::granules(b) * GRANULE;
                g.reserved += taken;
                if dropped_here(off) {
                    g.dropped += taken;
                } else {
                    g.in_use += taken;
                }
            }
            stats.reserved += g.reserved;
            stats.in_use += g.in_use;
            stats.dropped += g.dropped;
            stats.allocations += g.allocations;
            stats.groups.push(g);
        }
        stats
    }

    fn ring_members(&self, group: &Group) {
        for &r in group.ranks() {
            if r != self.rank {
                if let Some(c) = self.ctrl(r) {
                    ring(c.header());
                }
            }
        }
    }

    #[inline]
    fn peer_base(&self, peer: Rank) -> *mut u8 {
        self.ctrl(peer).expect("validated: peers are on this host").heap()
    }

    /// The signal word at `offset` of `peer`'s heap.
    #[inline]
    fn signal_word(&self, peer: Rank, offset: usize, width: SignalWidth) -> SignalWord<'_> {
        let p = self.peer_base(peer);
        // SAFETY: `offset` is inside the heap and aligned to the width (validated by the core:
        // signal buffers are int32/int64 allocations at granule-aligned offsets); the heap is
        // shared memory that lives as long as `self`, accessed only atomically at this address.
        unsafe {
            match width {
                SignalWidth::W32 => SignalWord::W32(&*p.add(offset).cast::<AtomicI32>()),
                SignalWidth::W64 => SignalWord::W64(&*p.add(offset).cast::<AtomicI64>()),
            }
        }
    }
}

/// A signal word in shared memory.
enum SignalWord<'a> {
    W32(&'a AtomicI32),
    W64(&'a AtomicI64),
}

impl SignalWord<'_> {
    fn load(&self) -> i64 {
        // Acquire: a waiter that sees the value also sees the data put before it.
        match self {
            SignalWord::W32(a) => i64::from(a.load(Ordering::Acquire)),
            SignalWord::W64(a) => a.load(Ordering::Acquire),
        }
    }

    fn update(&self, op: SignalOp, value: i64) {
        // Release (light signals) or SeqCst: release for the data written before
        // (put_with_signal), ordered before the doorbell check that follows (lost-wake-up
        // argument in `wait`); additions are read-modify-writes, full fences on every target
        // measured. Values of 32-bit signals were checked to fit.
        let order = wait::signal_store_order();
        match (self, op) {
            (SignalWord::W32(a), SignalOp::Set) => a.store(value as i32, order),
            (SignalWord::W32(a), SignalOp::Add) => {
                a.fetch_add(value as i32, Ordering::SeqCst);
            }
            (SignalWord::W64(a), SignalOp::Set) => a.store(value, order),
            (SignalWord::W64(a), SignalOp::Add) => {
                a.fetch_add(value, Ordering::SeqCst);
            }
        }
    }
}

impl Backend for SimComm {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    fn rank(&self) -> Rank {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn instance_id(&self) -> u64 {
        self.instance
    }

    fn default_timeout(&self) -> Duration {
        self.config.timeout
    }

    fn world(&self) -> Group {
        self.world.clone()
    }

    fn group_of(&self, ranks: &[Rank]) -> Result<Group> {
        // Creating a group writes this rank's group table, which a forked child shares.
        self.check_process()?;
        self.registry.get_or_create(ranks, |r| self.locality(r), |g| self.register(g)).at(self.rank)
    }

    fn heap_size(&self) -> usize {
        self.layout.heap_size
    }

    #[inline]
    fn check_process(&self) -> Result<()> {
        if self.in_creator() {
            return Ok(());
        }
        Err(Error::Unsupported {
            rank: self.rank,
            backend: self.backend_name(),
            what: format!(
                "using the communicator of process {} in process {}, a child of fork() (symm's state cannot be \
                 shared with a forked child: fork before symm starts, or start a new job in the child)",
                self.pids[self.rank.index()],
                std::process::id()
            ),
        })
    }

    fn heap_alloc(&self, group: &Group, bytes: usize, timeout: Duration) -> Result<usize> {
        self.drain()?;
        self.heap_round(group, HeapRequest::Alloc { bytes }, timeout)
    }

    fn heap_free(&self, group: &Group, offset: usize, bytes: usize, timeout: Duration) -> Result<()> {
        self.drain()?;
        self.heap_round(group, HeapRequest::Free { offset, bytes }, timeout).map(|_| ())
    }

    fn heap_abandon(&self, group: &Group, offset: usize, bytes: usize) {
        if bytes > 0 {
            self.pending_drops.lock().unwrap_or_else(|e| e.into_inner()).push((group.id(), offset, bytes));
        }
    }

    fn local_heap_base(&self) -> *mut u8 {
        self.me().heap()
    }

    fn settings(&self) -> Option<&Config> {
        Some(&self.settings)
    }

    unsafe fn put_bytes(&self, peer: Rank, dst_offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        if self.mode == Mode::Stream {
            return self.in_stream_model(
                move |s| {
                    // SAFETY: `finish` returns once the operation has ended, within `src`'s contract.
                    let e = unsafe { self.put_bytes_on(s, peer, dst_offset, src, bytes)? };
                    self.finish(&e, self.default_timeout())
                },
                // SAFETY: this function's contract.
                move |c| unsafe { c.put_bytes(peer, dst_offset, src, bytes) },
            );
        }
        let dst = self.peer_base(peer);
        // SAFETY: the destination range lies inside the peer's heap (validated by the core);
        // `src` is valid for `bytes` reads (caller's contract). `copy` tolerates overlap (a put
        // to oneself from the same buffer).
        unsafe { std::ptr::copy(src, dst.add(dst_offset), bytes) };
        Ok(())
    }

    unsafe fn get_bytes(&self, peer: Rank, src_offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        if self.mode == Mode::Stream {
            return self.in_stream_model(
                move |s| {
                    // SAFETY: as in `put_bytes`.
                    let e = unsafe { self.get_bytes_on(s, peer, src_offset, dst, bytes)? };
                    self.finish(&e, self.default_timeout())
                },
                // SAFETY: this function's contract.
                move |c| unsafe { c.get_bytes(peer, src_offset, dst, bytes) },
            );
        }
        let src = self.peer_base(peer);
        // SAFETY: the source range lies inside the peer's heap (validated); `dst` is valid for
        // `bytes` writes (caller's contract); `copy` tolerates overlap.
        unsafe { std::ptr::copy(src.add(src_offset), dst, bytes) };
        Ok(())
    }

    unsafe fn put_signal_bytes(
        &self,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
        signal_offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<()> {
        if self.mode == Mode::Stream {
            return self.in_stream_model(
                move |s| {
                    // SAFETY: as in `put_bytes`.
                    let e = unsafe {
                        self.put_signal_bytes_on(s, peer, dst_offset, src, bytes, signal_offset, width, op, value)?
                    };
                    self.finish(&e, self.default_timeout())
                },
                // SAFETY: this function's contract.
                move |c| unsafe { c.put_signal_bytes(peer, dst_offset, src, bytes, signal_offset, width, op, value) },
            );
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.put_bytes(peer, dst_offset, src, bytes)? };
        // No separate fence: the signal update is a release (or stronger), which orders the
        // plain stores of the copy before it.
        self.signal_at(peer, signal_offset, width, op, value)
    }

    fn signal_at(&self, peer: Rank, offset: usize, width: SignalWidth, op: SignalOp, value: i64) -> Result<()> {
        if self.mode == Mode::Stream {
            return self.in_stream_model(
                move |s| self.finish(&self.signal_at_on(s, peer, offset, width, op, value)?, self.default_timeout()),
                move |c| c.signal_at(peer, offset, width, op, value),
            );
        }
        self.signal_word(peer, offset, width).update(op, value);
        ring(self.ctrl(peer).expect("validated: peer on this host").header());
        Ok(())
    }

    fn wait_signal_at(
        &self,
        offset: usize,
        width: SignalWidth,
        cmp: CmpOp,
        value: i64,
        timeout: Duration,
        site: DescribeWait<'_>,
    ) -> Result<i64> {
        self.drain()?;
        let word = self.signal_word(self.rank, offset, width);
        let check = || {
            let v = word.load();
            cmp.holds(v, value).then_some(v)
        };
        // A signal already there costs no clock reading.
        if let Some(v) = check() {
            return Ok(v);
        }
        let start = Instant::now();
        match self.wait_at_site(site, start + timeout, check)? {
            Some(v) => Ok(v),
            None => Err(self.timeout_error(
                &site(),
                format!("signal {} {value}", cmp.symbol()),
                word.load().to_string(),
                Vec::new(),
                start.elapsed(),
            )),
        }
    }

    fn fence(&self) -> Result<()> {
        // SeqCst fence: puts are plain stores, signals release (or stronger) atomics; the fence
        // orders both before anything issued after it.
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }

    fn quiet(&self) -> Result<()> {
        // Every call completes before it returns; only the store ordering remains to enforce.
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }

    #[inline]
    fn flight_ring(&self, rank: Rank) -> Option<FlightRing<'_>> {
        self.node.ring(rank)
    }

    #[inline]
    fn op_stats(&self) -> Option<&StatsTable> {
        self.config.stats.then_some(&self.stats)
    }

    #[inline]
    fn timing(&self) -> bool {
        self.config.timing
    }

    fn barrier_group(&self, group: &Group, timeout: Duration) -> Result<()> {
        if self.mode == Mode::Stream {
            return self.in_stream_model(
                // After the group's work on the rank's other streams, as a collective.
                move |s| {
                    group.settle_streams(self.rank, "barrier", timeout)?;
                    self.finish(&self.barrier_group_on(s, group, timeout)?, timeout)
                },
                move |c| c.barrier_group(group, timeout),
            );
        }
        let st = self.state(group)?;
        let my = self.me().slot(st.my_slot);
        // SeqCst: release for everything this rank did before the barrier, and ordered before
        // the doorbell bumps.
        let epoch = my.barrier.0.fetch_add(1, Ordering::SeqCst) + 1;
        self.ring_members(group);
        self.wait_members(&st, "barrier", "the members' barrier counters", |s| &s.barrier.0, epoch, timeout)
    }
}

impl SimState {
    /// Whether this process is the one that created the communicator (not a child of fork()).
    #[inline]
    fn in_creator(&self) -> bool {
        self.generation == dfx::current_generation()
    }
}

impl Drop for SimComm {
    /// The application's handle lets the streams finish what is queued on them and ends their
    /// threads (which do not exist in a child of `fork()`).
    fn drop(&mut self) {
        if self.primary && self.in_creator() {
            self.streams.close();
        }
    }
}

impl HostMapped for SimComm {
    fn peer_heap_base(&self, peer: Rank) -> Option<*mut u8> {
        self.ctrl(peer).map(|c| c.heap())
    }

    fn waiters_share_cores(&self) -> bool {
        self.policy.shared_cores
    }

    fn wait_any_signal_at(&self, words: &[(usize, i64)], timeout: Duration, site: DescribeWait<'_>) -> Result<usize> {
        let signals: Vec<(SignalWord<'_>, i64)> = words
            .iter()
            .map(|&(offset, value)| (self.signal_word(self.rank, offset, SignalWidth::W64), value))
            .collect();
        let start = Instant::now();
        // Any signal to this rank rings its doorbell: a sleeper wakes and checks every word.
        let check = || signals.iter().position(|(word, value)| word.load() >= *value);
        match self.wait_at_site(site, start + timeout, check)? {
            Some(i) => Ok(i),
            None => {
                let conditions: Vec<String> = words.iter().map(|(_, v)| format!("signal >= {v}")).collect();
                let seen: Vec<String> = signals.iter().map(|(w, _)| w.load().to_string()).collect();
                Err(self.timeout_error(&site(), conditions.join(" / "), seen.join(" / "), Vec::new(), start.elapsed()))
            }
        }
    }
}

/// A collective of the host engine (`symm_host`) or, under
/// `SYMM_COLLECTIVES=reference`, of the reference collectives
/// ([`symm_core::coll::by_reference`]), in the host model; in the stream-ordered one
/// (`SYMM_EXECUTION=stream`), its stream form on the default stream, waited for (the progress
/// thread then runs it with a handle in the mode of `SYMM_COLLECTIVES`), after the group's work
/// on the rank's other streams, as every host collective (`symm_core::stream`). One match on
/// the handle's mode chooses.
macro_rules! collectives_in_either_model {
    ($($name:ident / $on:ident ($group:ident: $gty:ty, $($arg:ident: $ty:ty),*);)*) => {
        $(
            #[inline]
            fn $name(&self, $group: $gty, $($arg: $ty),*) -> Result<()> {
                match self.mode {
                    Mode::Host => host::$name(self, $group, $($arg),*),
                    Mode::Reference => by_reference::$name(self, &self.references, $group, $($arg),*),
                    Mode::Stream => match self.blocking_stream()? {
                        Some(s) => {
                            // The default stream runs it on its own thread, where the group's
                            // other stream work is not waited for: the caller waits here.
                            $group.settle_streams(self.rank, stringify!($name), self.default_timeout())?;
                            // SAFETY: `finish` returns once the operation has ended, so the
                            // buffers the call borrows outlive it.
                            let w = unsafe { self.$on(&s, $group, $($arg),*)? };
                            self.finish(&w.event(), self.default_timeout())
                        }
                        // A stream's own thread: the call is the stream's operation.
                        None => match self.settings.collectives {
                            CollectiveEngine::Host => host::$name(self, $group, $($arg),*),
                            CollectiveEngine::Reference => {
                                by_reference::$name(self, &self.references, $group, $($arg),*)
                            }
                        },
                    },
                }
            }
        )*
    };
}

/// The collectives of the host engine (every member maps its peers' heaps), or the reference
/// collectives (`SYMM_COLLECTIVES=reference`).
impl Collectives for SimComm {
    collectives_in_either_model! {
        allreduce / allreduce_on (group: &Group, buf: LocalMut<'_>, op: ReduceOp, opts: &CollOptions);
        allreduce_into / allreduce_into_on
            (group: &Group, input: LocalRef<'_>, output: LocalMut<'_>, op: ReduceOp, opts: &CollOptions);
        reduce_scatter / reduce_scatter_on
            (group: &Group, output: LocalMut<'_>, input: LocalRef<'_>, op: ReduceOp, opts: &CollOptions);
        allgather / allgather_on (group: &Group, output: LocalMut<'_>, input: LocalRef<'_>, opts: &CollOptions);
        alltoall / alltoall_on
            (group: &Group, send: &[LocalRef<'_>], recv: LocalMut<'_>, recv_counts: &[usize], opts: &CollOptions);
        alltoall_single / alltoall_single_on (
            group: &Group,
            send: LocalRef<'_>,
            send_counts: &[usize],
            recv: LocalMut<'_>,
            recv_counts: &[usize],
            opts: &CollOptions
        );
        broadcast / broadcast_on (group: &Group, buf: LocalMut<'_>, root: usize, opts: &CollOptions);
        send / send_on (group: &Group, buf: LocalRef<'_>, dst: usize, opts: &CollOptions);
        recv / recv_on (group: &Group, buf: LocalMut<'_>, src: usize, opts: &CollOptions);
        sendrecv / sendrecv_on
            (group: &Group, send: LocalRef<'_>, dst: usize, recv: LocalMut<'_>, src: usize, opts: &CollOptions);
    }

    /// In either model on the calling thread: its round starts once the group's stream work
    /// has completed (host collectives wait for it).
    fn reject(&self, group: &Group, op: Op, e: symm_core::ArgError) -> Result<()> {
        match self.settings.collectives {
            CollectiveEngine::Host => symm_host::reject(self, group, op, e),
            CollectiveEngine::Reference => by_reference::reject(self, &self.references, group, op, e),
        }
    }
}

impl StreamBackend for SimComm {
    fn create_stream(&self) -> Result<Stream> {
        self.check_process()?;
        self.streams.create(self.stream_handle())
    }

    fn enqueue(&self, stream: &Stream, op: &'static str, group: Option<&Group>, task: HostTask<Self>) -> Result<Event> {
        self.check_process()?;
        self.streams.enqueue(stream, op, group, task)
    }

    fn record_event(&self, stream: &Stream) -> Result<Event> {
        self.check_process()?;
        self.streams.record(stream)
    }

    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.check_process()?;
        self.streams.wait_event(stream, event, self.default_timeout())
    }

    fn query_event(&self, event: &Event) -> Result<bool> {
        self.check_process()?;
        self.streams.query(event)
    }

    fn synchronize_event(&self, event: &Event, timeout: Duration) -> Result<()> {
        self.check_process()?;
        self.streams.synchronize(event, timeout)
    }
}

impl Drop for SimState {
    /// Marks this rank closed in its header, so that peers still waiting on it fail with
    /// `PeerExited` at their next health check instead of waiting for the timeout. The
    /// mappings themselves go when the last of this communicator and its registered node does.
    /// In a child of `fork()` it leaves the header alone (it is the parent's).
    fn drop(&mut self) {
        if !self.in_creator() {
            // A child of fork() dropping its copy: the parent still runs this rank, and the
            // shared header is the parent's. Only the child's own mappings go.
            return;
        }
        self.node.mark(Op::Close);
        self.node.close(CLOSED);
        symm_core::symm_log!(dfx::Level::Info, self.rank, "communicator closed");
    }
}

/// The key of the heap hand-over's proofs: derived from the job secret (when there is one) and
/// from every rank's hello, so that it is fresh for every start-up.
fn heap_key(boot: &Bootstrap, job: u64, replies: &[Vec<u8>]) -> JobSecret {
    let base =
        boot.secret().cloned().unwrap_or_else(|| JobSecret::new(b"symm without a job secret").expect("long enough"));
    let mut parts: Vec<&[u8]> = vec![b"symm heap key"];
    let job = job.to_le_bytes();
    parts.push(&job);
    parts.extend(replies.iter().map(Vec::as_slice));
    JobSecret::new(&base.mac(&parts)).expect("a MAC is long enough")
}

/// Domain of the proof a rank sends for a peer's heap.
const HEAP_PROOF_DOMAIN: &[u8] = b"symm heap request";
/// How long an accepted connection may take to send its proof.
const PROOF_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the hand-over looks for a peer's failure in the store.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// The hand-over of heap segments between the ranks of one host. A rank's segment goes only to
/// a connection that (1) comes from a process of this user whose pid a rank announced in the
/// exchange (`SO_PEERCRED`: kernel-recorded, unforgeable), (2) names that rank, and (3) proves
/// knowledge of the heap key. A rank takes a segment only from the process its owner announced.
struct HeapHandshake<'a> {
    rank: Rank,
    job: u64,
    pids: &'a [u32],
    key: &'a JobSecret,
    deadline: Instant,
    boot: &'a Bootstrap,
}

impl HeapHandshake<'_> {
    fn err(&self, what: String, source: std::io::Error) -> Error {
        Error::Bootstrap { rank: self.rank, source: BootstrapError::Io { what, source } }
    }

    /// What a rank's request for `owner`'s segment proves: that `client` knows the heap key.
    fn proof_parts(client: usize, owner: usize) -> [Vec<u8>; 3] {
        [HEAP_PROOF_DOMAIN.to_vec(), (client as u64).to_le_bytes().to_vec(), (owner as u64).to_le_bytes().to_vec()]
    }

    /// Serves this rank's segment `fd` to each rank of `peers` once; refuses (and logs) every
    /// other connection, and keeps serving until every peer is served or the deadline.
    fn serve(&self, listener: &UnixListener, fd: BorrowedFd<'_>, peers: &[usize]) -> Result<()> {
        let mut waiting: Vec<usize> = peers.to_vec();
        let mut polled = Instant::now();
        while !waiting.is_empty() {
            match listener.accept() {
                Ok((stream, _)) => match self.admit(&stream, &waiting) {
                    Ok(peer) => {
                        sys::send_fd(&stream, fd)
                            .map_err(|e| self.err(format!("handing the heap segment to rank {peer}"), e))?;
                        waiting.retain(|&p| p != peer);
                    }
                    Err(why) => symm_core::symm_log!(
                        dfx::Level::Warn,
                        self.rank,
                        "refused a connection for this rank's heap segment: {why}"
                    ),
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return Err(self.err(
                            "handing the heap segment to peers".into(),
                            std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("rank(s) {waiting:?} never came for the heap segment"),
                            ),
                        ));
                    }
                    if polled.elapsed() >= ABORT_POLL {
                        self.boot.check_abort().at(self.rank)?;
                        polled = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(self.err("accepting on the start-up socket".into(), e)),
            }
        }
        Ok(())
    }

    /// The rank of `waiting` that `stream` comes from, or why it is refused.
    fn admit(&self, stream: &UnixStream, waiting: &[usize]) -> std::result::Result<usize, String> {
        let cred = sys::peer_cred(stream).map_err(|e| format!("its credentials are unknown ({e})"))?;
        let who = format!("pid {} (uid {})", cred.pid, cred.uid);
        let uid = sys::effective_uid();
        if cred.uid != uid {
            return Err(format!("{who} is another user than this rank's (uid {uid})"));
        }
        if !waiting.iter().any(|&p| self.pids[p] == cred.pid) {
            return Err(format!("{who} is no rank of this job still waiting for it (ranks {waiting:?})"));
        }
        let mut request = [0u8; 40];
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(PROOF_TIMEOUT)))
            .and_then(|()| (&*stream).read_exact(&mut request))
            .map_err(|e| format!("{who} sent no request ({e})"))?;
        let claimed = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
        let peer = usize::try_from(claimed).ok().filter(|p| waiting.contains(p));
        let Some(peer) = peer.filter(|&p| self.pids[p] == cred.pid) else {
            return Err(format!("{who} claims to be rank {claimed}, whose pid is not its own"));
        };
        let parts = Self::proof_parts(peer, self.rank.index());
        if !self.key.verify(&parts.each_ref().map(Vec::as_slice), &request[8..]) {
            return Err(format!("{who} (rank {peer}) does not prove knowledge of this job's exchange"));
        }
        Ok(peer)
    }

    /// Maps the segment of `peer`, received from the process it announced.
    fn fetch(&self, peer: usize, layout: Layout) -> Result<Mapping> {
        let what = || format!("mapping the heap of rank {peer}");
        let io = |e: std::io::Error| self.err(what(), e);
        let addr = SocketAddr::from_abstract_name(socket_name(self.job, peer)).map_err(io)?;
        let mut polled = Instant::now();
        let stream = loop {
            match UnixStream::connect_addr(&addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= self.deadline => return Err(io(e)),
                Err(_) => {
                    if polled.elapsed() >= ABORT_POLL {
                        self.boot.check_abort().at(self.rank)?;
                        polled = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        // The socket's owner is the kernel's record of who listens on it: a squatter that took
        // the name first is refused before anything is sent or mapped.
        let cred = sys::peer_cred(&stream).map_err(io)?;
        let uid = sys::effective_uid();
        if cred.uid != uid || cred.pid != self.pids[peer] {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "its socket is held by pid {} (uid {}), not by the pid {} (uid {uid}) rank {peer} announced",
                    cred.pid, cred.uid, self.pids[peer]
                ),
            )));
        }
        let left = self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let mut request = [0u8; 40];
        request[..8].copy_from_slice(&(self.rank.index() as u64).to_le_bytes());
        let parts = Self::proof_parts(self.rank.index(), peer);
        request[8..].copy_from_slice(&self.key.mac(&parts.each_ref().map(Vec::as_slice)));
        (&stream).write_all(&request).map_err(io)?;
        let fd = sys::recv_fd(&stream).map_err(|e| {
            let refused = e.kind() == std::io::ErrorKind::UnexpectedEof || e.kind() == std::io::ErrorKind::InvalidData;
            io(if refused {
                std::io::Error::new(e.kind(), format!("rank {peer} refused this rank's request ({e}); see its log"))
            } else {
                e
            })
        })?;
        let map = Mapping::map(&fd, layout.total).map_err(io)?;
        let ctrl = Control::of(&map, layout);
        // Acquire: pairs with the owner's release store of the magic after initialising its header.
        let ok = ctrl.header().magic.load(Ordering::Acquire) == MAGIC
            && ctrl.header().rank.load(Ordering::Relaxed) == peer as u64;
        if !ok {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "segment header does not match the rank",
            )));
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_environment_value_is_named_once_with_what_is_accepted() {
        let refused = ConfigError::Invalid {
            var: config::HEAP_SIZE.name,
            value: "12Q".into(),
            reason: "unknown suffix".into(),
            accepted: config::HEAP_SIZE.accepted,
        };
        let e = BootstrapError::from(refused.clone());
        assert_eq!(
            e.to_string(),
            format!(
                "environment variable SYMMETRIC_MEMORY_HEAP_SIZE = \"12Q\": unknown suffix; accepted: {}",
                config::HEAP_SIZE.accepted
            )
        );
        // A refused value that `with_heap_size` met fails the start-up instead of being dropped.
        let c = SimConfig { refused: Some(refused), ..SimConfig::from_settings(Config::default()) };
        let boot = Bootstrap::new(Rank(0), 1, Arc::new(crate::store::MemoryStore::new()), "t", c.timeout);
        let e = SimComm::init(&boot, c).unwrap_err();
        assert_eq!(e.code(), "SYMM_E_BOOTSTRAP");
        assert!(e.to_string().contains("SYMMETRIC_MEMORY_HEAP_SIZE = \"12Q\""), "{e}");
    }
}
