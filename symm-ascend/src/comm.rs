//! [`AscendComm`]: one rank of a job on an Ascend device, its heap in the SHMEM symmetric heap,
//! its streams ACL streams.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ascend_sys::safe::{self, CopyKind, DeviceBuffer, Reporter, Scalar, ShmemHeap, Team, Tensor, Workspace};
use ascend_sys::sys::shmem::{ACLSHMEM_SIGNAL_ADD, ACLSHMEM_SIGNAL_SET};
use ascend_sys::{AscendError, LoadError};
use symm_core::backend::{DescribeWait, MemorySpace, SignalWidth};
use symm_core::coll::by_reference::{self, ReferenceCache};
use symm_core::config::Config;
use symm_core::stream::{Event, HostTask, Stream, StreamBackend};
use symm_core::{
    AtRank, Backend, Bootstrap, BootstrapError, CmpOp, DType, Error, Group, GroupError, GroupHeapStats, GroupId,
    GroupRegistry, HeapError, HeapStats, HostMapped, Rank, ReduceOp, Result, SignalOp, TimeoutError,
};

use crate::alloc::{first_common_free, granular, Ranges, Request};
use crate::codec;
use crate::dtype::acl_dtype;
use crate::host_work::{run_job, HostJob, Outcomes};
use crate::ledger::{Ledger, Lookup};
use crate::pe::{pe_of, team_plan, TeamPlan};
use crate::reduce::{self, Combine, Operand, Step};
use device_codec::DeviceOps;

mod device_codec;

/// The backend's name in messages and `SYMM_BACKEND`.
pub const NAME: &str = "ascend";

/// How a rank starts on the Ascend backend.
#[derive(Clone, Debug)]
pub struct AscendConfig {
    /// The communicator's settings (heap size, timeout, ...).
    pub settings: Config,
    /// The device (NPU index on the host); `None`: the rank's place among the ranks of its host,
    /// which is what launchers give a rank on a node of one device per rank.
    pub device: Option<i32>,
}

/// One rank on an Ascend device. Cheap to clone (a handle on shared state).
#[derive(Clone)]
pub struct AscendComm {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AscendComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AscendComm")
            .field("rank", &self.inner.rank)
            .field("world_size", &self.inner.world_size)
            .field("device", &self.inner.device)
            .finish_non_exhaustive()
    }
}

struct Inner {
    rank: Rank,
    world_size: usize,
    instance_id: u64,
    settings: Config,
    hosts: Vec<String>,
    device: i32,
    world: Group,
    registry: GroupRegistry,
    /// The start-up exchange, kept for the agreements of heap calls and host barriers.
    boot: Bootstrap,
    /// Each group's number of heap calls and host barriers so far (the exchanges' tags).
    rounds: Mutex<HashMap<GroupId, u64>>,
    ranges: Mutex<Ranges>,
    /// Stream 0 is the communicator's own, on which the host forms of the primitives run.
    streams: Mutex<Vec<Arc<StreamSlot>>>,
    /// The collectives' per-group state (the framework's reference collectives).
    references: ReferenceCache,
    /// The reductions' scratch vectors and operator workspace (one reduction at a time).
    reducing: Mutex<Reducing>,
    /// Declared last: dropped after the streams (it finalizes SHMEM, collectively).
    heap: ShmemHeap,
}

/// What a reduction on the device keeps between calls: two scratch vectors of the accumulator
/// type (grown, never shrunk) and the operators' workspace.
struct Reducing {
    acc: Option<DeviceBuffer>,
    wide: Option<DeviceBuffer>,
    /// Low-precision transport's scratch ([`codec::Scratch`], then a mask of booleans).
    codec: Option<DeviceBuffer>,
    workspace: Workspace,
}

impl Reducing {
    /// Scratch vectors of at least `bytes` each (every earlier reduction has completed: each
    /// drains its stream before it returns, so the old ones may go).
    fn reserve(&mut self, bytes: usize) -> ascend_sys::Result<()> {
        if bytes == 0 || self.acc.as_ref().is_some_and(|b| b.bytes() >= bytes) {
            return Ok(());
        }
        let size = Workspace::grown(self.acc.as_ref().map_or(0, DeviceBuffer::bytes), bytes).unwrap_or(bytes);
        (self.acc, self.wide) = (None, None);
        self.acc = Some(DeviceBuffer::new(size)?);
        self.wide = Some(DeviceBuffer::new(size)?);
        Ok(())
    }

    /// The codec's scratch for a call over `len` elements and `runs` runs, and a mask of `len`
    /// booleans after it (every earlier call has completed, as above).
    fn reserve_codec(&mut self, len: usize, runs: usize) -> ascend_sys::Result<(codec::Scratch, codec::Addr)> {
        let scratch = codec::Scratch::bytes(len, runs);
        let bytes = scratch + len;
        let current = self.codec.as_ref().map_or(0, DeviceBuffer::bytes);
        if let Some(size) = Workspace::grown(current, bytes) {
            self.codec = None;
            self.codec = Some(DeviceBuffer::new(size)?);
        }
        let base = self.codec.as_ref().expect("reserved above").ptr().cast::<u8>();
        Ok((codec::Scratch::at(base, len, runs), base.wrapping_add(scratch)))
    }
}

struct StreamSlot {
    /// The thread that runs the stream's host callbacks, started by its first host task.
    /// Declared before the stream: it unsubscribes before the stream is destroyed.
    reporter: Mutex<Option<Reporter>>,
    stream: safe::Stream,
    ledger: Mutex<Ledger<safe::Event>>,
    /// The errors of its failed host tasks.
    outcomes: Arc<Outcomes>,
}

impl StreamSlot {
    fn new(stream: safe::Stream) -> StreamSlot {
        StreamSlot {
            reporter: Mutex::new(None),
            stream,
            ledger: Mutex::new(Ledger::default()),
            outcomes: Arc::default(),
        }
    }
}

/// Instance numbers of communicators in this process.
static INSTANCES: AtomicU64 = AtomicU64::new(1);

/// A failure of the libraries' loading, as a start-up error (it lists the places searched).
fn load_error(rank: Rank, e: LoadError) -> Error {
    Error::Bootstrap {
        rank,
        source: BootstrapError::Io {
            what: "loading the Ascend libraries".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        },
    }
}

/// An error of a CANN call made for `what`.
fn device_error(rank: Rank, what: &str, e: AscendError) -> Error {
    match e {
        AscendError::Load(l) => load_error(rank, l),
        other => Error::Device { rank, backend: NAME, what: what.to_string(), detail: other.to_string() },
    }
}

impl AscendComm {
    /// Starts this rank: exchanges host identities and heap sizes through `boot`, sets its
    /// device, starts SHMEM with the unique id rank 0 makes (passed through `boot`) and maps its
    /// heap. Collective over the world. A rank that fails says so in the store first, so that
    /// its peers fail at once instead of at the timeout.
    pub fn init(boot: &Bootstrap, config: AscendConfig) -> Result<AscendComm> {
        let started = Self::start(boot, config);
        if let Err(e) = &started {
            if !matches!(e, Error::Bootstrap { source: BootstrapError::PeerFailed { .. }, .. }) {
                boot.abort(&e.to_string());
            }
        }
        started
    }

    fn start(boot: &Bootstrap, config: AscendConfig) -> Result<AscendComm> {
        let rank = boot.rank();
        let n = boot.world_size();
        let settings = config.settings;
        let host = settings.host_id.clone().unwrap_or_else(symm_core::group::host_identity);
        let hello = format!("{host}\n{}", settings.heap_size);
        let replies = boot.allgather("ascend-hello", hello.as_bytes()).at(rank)?;
        let mut hosts = Vec::with_capacity(n);
        let mut sizes = Vec::with_capacity(n);
        for (r, bytes) in replies.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            let Some((h, size)) = text.split_once('\n').and_then(|(h, s)| Some((h, s.parse::<usize>().ok()?))) else {
                return Err(BootstrapError::Protocol(format!("rank {r} sent an unreadable hello {text:?}"))).at(rank);
            };
            hosts.push(h.to_string());
            sizes.push((Rank(r as u32), size));
        }
        if sizes.iter().any(|&(_, s)| s != settings.heap_size) {
            return Err(Error::Heap { rank, source: HeapError::HeapSizeMismatch { sizes } });
        }
        let device = config
            .device
            .unwrap_or_else(|| (0..rank.index()).filter(|&r| hosts[r] == hosts[rank.index()]).count() as i32);
        let dev = |what: String| move |e: AscendError| device_error(rank, &what, e);
        safe::init().map_err(dev("initialising AscendCL".into()))?;
        safe::set_device(device).map_err(dev(format!("selecting device {device}")))?;
        let uid = if rank.index() == 0 {
            ShmemHeap::unique_id().map_err(dev("making the SHMEM unique id".into()))?.to_vec()
        } else {
            Vec::new()
        };
        let ids = boot.allgather("ascend-shmem-uid", &uid).at(rank)?;
        let heap = ShmemHeap::init(rank.0 as i32, n as i32, settings.heap_size, &ids[0])
            .map_err(dev("starting Ascend SHMEM and mapping the symmetric heap".into()))?;
        let own = safe::Stream::create().map_err(dev("creating the communicator's stream".into()))?;
        let world_ranks: Vec<Rank> = (0..n as u32).map(Rank).collect();
        let world = Group::new(n, rank, &world_ranks, Ok(())).at(rank)?;
        let registry = GroupRegistry::new(n, rank);
        let timeout = settings.timeout;
        let comm = AscendComm {
            inner: Arc::new(Inner {
                rank,
                world_size: n,
                // Relaxed: a unique number, nothing else.
                instance_id: INSTANCES.fetch_add(1, Ordering::Relaxed),
                settings,
                hosts,
                device,
                world,
                registry,
                boot: boot.handle(),
                rounds: Mutex::new(HashMap::new()),
                ranges: Mutex::new(Ranges::default()),
                streams: Mutex::new(vec![Arc::new(StreamSlot::new(own))]),
                references: ReferenceCache::default(),
                reducing: Mutex::new(Reducing {
                    acc: None,
                    wide: None,
                    codec: None,
                    workspace: Workspace::new(timeout),
                }),
                heap,
            }),
        };
        // The world's collective workspace now, while every rank is here: send/recv in the world
        // then never waits for ranks that take no part. A heap too small for it only defers it.
        match by_reference::prepare(&comm, &comm.inner.references, &comm.inner.world) {
            Ok(()) | Err(Error::Heap { .. }) => Ok(comm),
            Err(e) => Err(e),
        }
    }

    /// The state of the collectives, per group.
    pub fn reference_cache(&self) -> &ReferenceCache {
        &self.inner.references
    }

    /// Each rank's host identity, by global rank.
    pub fn hosts(&self) -> &[String] {
        &self.inner.hosts
    }

    /// The device this rank runs on.
    pub fn device(&self) -> i32 {
        self.inner.device
    }

    /// This rank's use of its heap.
    pub fn heap_stats(&self) -> HeapStats {
        let ranges = self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner());
        let heap_size = self.inner.heap.bytes();
        let (reserved, allocations) = ranges.reserved();
        let groups = ranges
            .by_group()
            .into_iter()
            .map(|(id, bytes, count)| GroupHeapStats {
                ranks: self.group_ranks(id),
                reserved: bytes,
                in_use: bytes,
                dropped: 0,
                allocations: count,
            })
            .collect();
        HeapStats {
            heap_size,
            reserved,
            in_use: reserved,
            dropped: 0,
            free: heap_size - reserved,
            largest_free: ranges.largest_free(heap_size),
            allocations,
            groups,
        }
    }

    fn group_ranks(&self, id: GroupId) -> Vec<Rank> {
        if self.inner.world.id() == id {
            return self.inner.world.ranks().to_vec();
        }
        Vec::new()
    }

    fn dev(&self, what: &str) -> impl Fn(AscendError) -> Error + '_ {
        let what = what.to_string();
        move |e| device_error(self.inner.rank, &what, e)
    }

    fn slot(&self, stream: &Stream) -> Result<Arc<StreamSlot>> {
        let streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.get(stream.id() as usize).cloned().ok_or_else(|| Error::InvalidArgument {
            rank: self.inner.rank,
            source: symm_core::ArgError::invalid(
                "stream",
                stream.id(),
                "no stream of this communicator has that number",
            ),
        })
    }

    fn own_stream(&self) -> Stream {
        Stream::from_parts(self.inner.instance_id, 0)
    }

    /// Records the point after what `slot` has enqueued so far as the next event of `stream`.
    fn record(&self, stream: &Stream, slot: &StreamSlot) -> Result<Event> {
        let ev = safe::Event::create().map_err(self.dev("creating an event"))?;
        ev.record(&slot.stream).map_err(self.dev("recording an event"))?;
        let mut ledger = slot.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let seq = ledger.push(ev, |e| e.query().unwrap_or(false));
        Ok(Event::from_parts(*stream, seq))
    }

    fn width_check(&self, width: SignalWidth) -> Result<()> {
        if width == SignalWidth::W32 {
            return Ok(());
        }
        Err(Error::Unsupported {
            rank: self.inner.rank,
            backend: NAME,
            what: "64-bit signals (Ascend SHMEM signals are int32: allocate signal buffers as int32)".into(),
        })
    }

    /// The next tag of `group`'s exchanges, for `what`.
    fn next_tag(&self, group: &Group, what: &str) -> String {
        let mut rounds = self.inner.rounds.lock().unwrap_or_else(|p| p.into_inner());
        let n = rounds.entry(group.id()).or_insert(0);
        *n += 1;
        format!("{what}/{:?}/{n}", group.id())
    }

    /// One round of `group`'s heap calls: every member's request, in group order.
    fn heap_round(&self, group: &Group, mine: &Request, timeout: Duration) -> Result<Vec<Request>> {
        let tag = self.next_tag(group, "heap");
        let records = self.inner.boot.exchange(&tag, group.ranks(), &mine.encode(), timeout).at(self.inner.rank)?;
        records
            .iter()
            .zip(group.ranks())
            .map(|(r, &peer)| {
                Request::decode(r).ok_or_else(|| Error::Bootstrap {
                    rank: self.inner.rank,
                    source: BootstrapError::Protocol(format!("rank {peer} sent an unreadable heap request {r:?}")),
                })
            })
            .collect()
    }

    /// Blocks until `slot`'s stream has completed everything enqueued, or `timeout` passes.
    fn drain(&self, slot: &StreamSlot, op: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        if safe::synchronize_stream(&slot.stream, timeout).map_err(self.dev(op))? {
            let mut ledger = slot.ledger.lock().unwrap_or_else(|p| p.into_inner());
            let last = ledger.last();
            ledger.completed(last);
            return Ok(());
        }
        Err(Error::Timeout(Box::new(TimeoutError::new(
            self.inner.rank,
            op.to_string(),
            None,
            format!("ACL stream {:p} of device {}", slot.stream.raw(), self.inner.device),
            "everything enqueued on the stream to complete".into(),
            "still running".into(),
            Vec::new(),
            start.elapsed(),
        ))))
    }

    /// Runs a call of the low-precision codec over `len` elements and `runs` runs with the
    /// scratch it needs, on the communicator's stream, drained before it returns (also after a
    /// failure: the scratch must be free before a later call may grow it). One call at a time.
    fn with_codec(
        &self,
        len: usize,
        runs: usize,
        what: &str,
        call: impl FnOnce(&mut DeviceOps<'_>, codec::Scratch) -> Result<codec::HostShare>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let own = self.slot(&self.own_stream())?;
        let mut r = self.inner.reducing.lock().unwrap_or_else(|p| p.into_inner());
        let (scratch, mask) =
            r.reserve_codec(len, runs).map_err(self.dev("reserving low-precision transport's scratch"))?;
        let mut ops = DeviceOps { comm: self, slot: &own, workspace: &mut r.workspace, mask };
        let done = call(&mut ops, scratch);
        let drained = self.drain(&own, "low-precision transport", self.default_timeout());
        let share = done.and_then(|share| drained.map(|()| share))?;
        log::trace!("{what} {len} elements of {runs} run(s) in low precision: {share:?} blocks by the host codec");
        Ok(())
    }

    fn drain_own(&self, op: &str, timeout: Duration) -> Result<()> {
        let own = self.slot(&self.own_stream())?;
        self.drain(&own, op, timeout)
    }

    /// Starts `stream`'s callback thread, once.
    fn subscribe(&self, stream: &Stream, slot: &StreamSlot) -> Result<()> {
        let mut reporter = slot.reporter.lock().unwrap_or_else(|p| p.into_inner());
        if reporter.is_none() {
            let name = format!("symm-acl-callbacks-{}.{}", self.inner.rank, stream.id());
            // The thread is a stream's executor: host calls it makes never wait for its own
            // group's stream work (symm_core::stream).
            let r = Reporter::start(name, self.inner.device, symm_core::stream::mark_executor_thread)
                .map_err(self.dev("starting a stream's callback thread"))?;
            r.subscribe(&slot.stream).map_err(self.dev("subscribing the callback thread to its stream"))?;
            *reporter = Some(r);
        }
        Ok(())
    }
}

/// SHMEM's code of a signal operation.
fn shmem_signal_op(op: SignalOp) -> i32 {
    match op {
        SignalOp::Set => ACLSHMEM_SIGNAL_SET,
        SignalOp::Add => ACLSHMEM_SIGNAL_ADD,
    }
}

/// Reads the int32 at device address `at` (a blocking copy through `stream`).
fn read_word(at: *const std::ffi::c_void, stream: &safe::Stream, timeout: Duration) -> ascend_sys::Result<Option<i32>> {
    let mut word = 0i32;
    // SAFETY: `at` is a signal inside this rank's heap; `word` lives until the copy has
    // completed (synchronized below, or the stream is abandoned only on a timeout, after which
    // the caller fails and the value is not read).
    unsafe { safe::copy_async((&raw mut word).cast(), at, 4, CopyKind::DeviceToHost, stream)? };
    if safe::synchronize_stream(stream, timeout)? {
        Ok(Some(word))
    } else {
        Ok(None)
    }
}

impl Backend for AscendComm {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    fn rank(&self) -> Rank {
        self.inner.rank
    }

    fn world_size(&self) -> usize {
        self.inner.world_size
    }

    fn instance_id(&self) -> u64 {
        self.inner.instance_id
    }

    fn default_timeout(&self) -> Duration {
        self.inner.settings.timeout
    }

    fn world(&self) -> Group {
        self.inner.world.clone()
    }

    fn group_of(&self, ranks: &[Rank]) -> Result<Group> {
        let hosts = &self.inner.hosts;
        let me = self.inner.rank;
        let locality = |r: &[Rank]| {
            let mine = &hosts[me.index()];
            let remote: Vec<Rank> = r.iter().copied().filter(|x| hosts.get(x.index()) != Some(mine)).collect();
            if remote.is_empty() {
                Ok(())
            } else {
                Err(GroupError::SpansHosts { ranks: r.to_vec(), remote, local_rank: me, host: mine.clone() })
            }
        };
        self.inner.registry.get_or_create(ranks, locality, |_| Ok(())).at(me)
    }

    fn heap_size(&self) -> usize {
        self.inner.heap.bytes()
    }

    fn heap_alloc(&self, group: &Group, bytes: usize, timeout: Duration) -> Result<usize> {
        let rank = self.inner.rank;
        group.member().at(rank)?;
        let need = granular(bytes);
        let used = self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).list();
        let all = self.heap_round(group, &Request::Alloc { bytes, used }, timeout)?;
        let mut sizes = Vec::new();
        let mut lists = Vec::new();
        for (req, &peer) in all.iter().zip(group.ranks()) {
            match req {
                Request::Alloc { bytes, used } => {
                    sizes.push((peer, *bytes));
                    lists.push(used.clone());
                }
                other => {
                    let requests = all.iter().zip(group.ranks()).map(|(r, &p)| (p, r.describe())).collect();
                    let _ = other;
                    return Err(Error::Heap {
                        rank,
                        source: HeapError::FreeMismatch { group: group.ranks().to_vec(), requests },
                    });
                }
            }
        }
        if sizes.iter().any(|&(_, b)| b != bytes) {
            return Err(Error::Heap { rank, source: HeapError::SizeMismatch { group: group.ranks().to_vec(), sizes } });
        }
        let heap = self.inner.heap.bytes();
        if need > heap {
            return Err(Error::Heap {
                rank,
                source: HeapError::TooLarge { requested: bytes, group: group.ranks().to_vec(), heap_size: heap },
            });
        }
        match first_common_free(&lists, heap, need) {
            Ok(offset) => {
                self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).insert(offset, need, group.id());
                Ok(offset)
            }
            Err(largest) => {
                let stats = self.heap_stats();
                Err(Error::Heap {
                    rank,
                    source: HeapError::Exhausted {
                        requested: bytes,
                        group: group.ranks().to_vec(),
                        largest_common_free: largest,
                        free: stats.free,
                        heap_size: heap,
                        awaiting_reclaim: 0,
                    },
                })
            }
        }
    }

    fn heap_free(&self, group: &Group, offset: usize, bytes: usize, timeout: Duration) -> Result<()> {
        let rank = self.inner.rank;
        group.member().at(rank)?;
        // Every member's own use of the range is complete before it takes part.
        self.drain_own("heap free", timeout)?;
        let mine = Request::Free { offset, bytes };
        let all = self.heap_round(group, &mine, timeout)?;
        let held =
            self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).holds(offset, granular(bytes), group.id());
        if all.iter().any(|r| *r != mine) || !held {
            let requests = all.iter().zip(group.ranks()).map(|(r, &p)| (p, r.describe())).collect();
            return Err(Error::Heap {
                rank,
                source: HeapError::FreeMismatch { group: group.ranks().to_vec(), requests },
            });
        }
        self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).remove(offset, granular(bytes), group.id());
        Ok(())
    }

    fn local_heap_base(&self) -> *mut u8 {
        self.inner.heap.base().cast()
    }

    fn heap_space(&self) -> MemorySpace {
        MemorySpace::Device
    }

    unsafe fn copy_to_heap(&self, offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        let own = self.slot(&self.own_stream())?;
        let dst = self.local_heap_base().wrapping_add(offset);
        // SAFETY: `src` is host memory valid for `bytes` (contract), the range lies in the heap;
        // the copy completes before this returns (drained below).
        unsafe { safe::copy_async(dst.cast(), src.cast(), bytes, CopyKind::HostToDevice, &own.stream) }
            .map_err(self.dev("copying host memory into the heap"))?;
        self.drain(&own, "copy into the heap", self.default_timeout())
    }

    unsafe fn copy_from_heap(&self, offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        let own = self.slot(&self.own_stream())?;
        let src = self.local_heap_base().wrapping_add(offset);
        // SAFETY: as in `copy_to_heap`, the other way.
        unsafe { safe::copy_async(dst.cast(), src.cast(), bytes, CopyKind::DeviceToHost, &own.stream) }
            .map_err(self.dev("copying the heap into host memory"))?;
        self.drain(&own, "copy out of the heap", self.default_timeout())
    }

    fn settings(&self) -> Option<&Config> {
        Some(&self.inner.settings)
    }

    unsafe fn put_bytes(&self, peer: Rank, dst_offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        let own = self.slot(&self.own_stream())?;
        // SAFETY: forwarded (the contract of `put_bytes`: `src` valid until `quiet`).
        unsafe { self.inner.heap.put_on_stream(pe_of(peer), dst_offset, src.cast(), bytes, &own.stream) }
            .map_err(self.dev("put"))
    }

    unsafe fn get_bytes(&self, peer: Rank, src_offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        let own = self.slot(&self.own_stream())?;
        // SAFETY: forwarded.
        unsafe { self.inner.heap.get_on_stream(pe_of(peer), src_offset, dst.cast(), bytes, &own.stream) }
            .map_err(self.dev("get"))
    }

    fn signal_at(&self, peer: Rank, offset: usize, width: SignalWidth, op: SignalOp, value: i64) -> Result<()> {
        self.width_check(width)?;
        let own = self.slot(&self.own_stream())?;
        let op = shmem_signal_op(op);
        // A 32-bit value fits in i32 (the contract).
        self.inner
            .heap
            .signal_on_stream(pe_of(peer), offset, op, value as i32, &own.stream)
            .map_err(self.dev("signal_op"))
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
        self.width_check(width)?;
        let start = Instant::now();
        // A host wait never overtakes work issued before it.
        self.drain_own("wait_until", timeout)?;
        // The word is read from the host, a copy at a time, rather than by a device wait kernel:
        // a device wait that times out would keep spinning on its stream.
        let poll = safe::Stream::create().map_err(self.dev("creating the wait's stream"))?;
        let at = self.inner.heap.base().cast::<u8>().wrapping_add(offset).cast::<std::ffi::c_void>();
        let mut nap = Duration::from_micros(20);
        let mut last = None;
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match read_word(at, &poll, left.max(Duration::from_millis(1))).map_err(self.dev("reading a signal"))? {
                Some(word) => {
                    last = Some(word);
                    if cmp.holds(i64::from(word), value) {
                        return Ok(i64::from(word));
                    }
                }
                None => break,
            }
            if start.elapsed() >= timeout {
                break;
            }
            std::thread::sleep(nap.min(timeout.saturating_sub(start.elapsed())));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
        let s = site();
        Err(Error::Timeout(Box::new(TimeoutError::new(
            self.inner.rank,
            s.op,
            s.group,
            s.location,
            format!("signal {} {value}", cmp.symbol()),
            last.map_or_else(|| "never read".to_string(), |w| w.to_string()),
            s.waiting_on.into_iter().collect(),
            start.elapsed(),
        ))))
    }

    fn fence(&self) -> Result<()> {
        // One stream runs its operations in order, and SHMEM's on-stream copies are blocking
        // kernels: what was issued earlier is delivered first.
        Ok(())
    }

    fn quiet(&self) -> Result<()> {
        self.drain_own("quiet", self.default_timeout())
    }

    fn barrier_group(&self, group: &Group, timeout: Duration) -> Result<()> {
        let rank = self.inner.rank;
        group.member().at(rank)?;
        group.settle_streams(rank, "barrier", timeout)?;
        self.drain_own("barrier", timeout)?;
        let tag = self.next_tag(group, "barrier");
        self.inner.boot.exchange(&tag, group.ranks(), b"", timeout).at(rank)?;
        Ok(())
    }

    fn signal_width(&self) -> SignalWidth {
        SignalWidth::W32
    }
}

impl HostMapped for AscendComm {
    /// Device memory: no peer heap is mapped into the host's address space.
    fn peer_heap_base(&self, _peer: Rank) -> Option<*mut u8> {
        None
    }

    fn waiters_share_cores(&self) -> bool {
        false
    }
}

impl StreamBackend for AscendComm {
    fn create_stream(&self) -> Result<Stream> {
        let stream = safe::Stream::create().map_err(self.dev("creating a stream"))?;
        let mut streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.push(Arc::new(StreamSlot::new(stream)));
        Ok(Stream::from_parts(self.inner.instance_id, (streams.len() - 1) as u32))
    }

    /// `raw` is an `aclrtStream` (torch_npu's `current_stream().npu_stream`); null is refused
    /// (it means SHMEM's internal stream, unordered with the caller's work).
    unsafe fn adopt_stream(&self, raw: *mut std::ffi::c_void) -> Result<Stream> {
        let mut streams = self.inner.streams.lock().unwrap_or_else(|p| p.into_inner());
        let id = match streams.iter().position(|s| s.stream.raw() == raw) {
            Some(id) => id,
            None => {
                // SAFETY: live for the communicator's life (the contract).
                let borrowed = unsafe { safe::Stream::borrowed(raw) }.map_err(|e| Error::InvalidArgument {
                    rank: self.inner.rank,
                    source: symm_core::ArgError::invalid("stream", format!("{raw:p}"), e.to_string()),
                })?;
                streams.push(Arc::new(StreamSlot::new(borrowed)));
                streams.len() - 1
            }
        };
        Ok(Stream::from_parts(self.inner.instance_id, id as u32))
    }

    /// A blocking host callback on the stream ([`crate::host_work`]): the task runs on the
    /// stream's callback thread once the stream's earlier work has completed, and the stream's
    /// later work waits for it. The communicator's own stream (number 0) carries none: the
    /// host collectives the tasks run issue their work there and wait for it.
    fn enqueue(&self, stream: &Stream, op: &'static str, group: Option<&Group>, task: HostTask<Self>) -> Result<Event> {
        let rank = self.inner.rank;
        if stream.id() == 0 {
            return Err(Error::InvalidArgument {
                rank,
                source: symm_core::ArgError::invalid(
                    "stream",
                    "stream 0 (the communicator's own)",
                    format!("{op} runs host work, which issues its device work on that stream and waits for it: use a stream of create_stream"),
                ),
            });
        }
        let slot = self.slot(stream)?;
        self.subscribe(stream, &slot)?;
        let ev = safe::Event::create().map_err(self.dev("creating an event"))?;
        // The number is the job's before it is launched (it may run at once): the ledger stays
        // locked until the event after it is counted.
        let mut ledger = slot.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let seq = ledger.last() + 1;
        if let Some(g) = group {
            g.stream_op_enqueued();
        }
        let job = Box::new(HostJob {
            comm: self.clone(),
            task,
            op,
            seq,
            stream_id: stream.id(),
            rank,
            group: group.cloned(),
            outcomes: slot.outcomes.clone(),
        });
        let data = Box::into_raw(job);
        // SAFETY: the job is the callback's to take back, once, when the stream reaches it; a
        // thread is subscribed to the stream (above); `run_job` does not unwind.
        if let Err(e) = unsafe { safe::launch_callback(&slot.stream, run_job::<AscendComm>, data.cast(), true) } {
            // SAFETY: not launched: the box is still ours.
            unsafe { Box::from_raw(data) }.abandon();
            return Err(self.dev(op)(e));
        }
        // Counted even if the record fails, so that later numbers stay those of their jobs.
        let recorded = ev.record(&slot.stream).map_err(self.dev("recording an event"));
        ledger.push(ev, |e| e.query().unwrap_or(false));
        recorded.map(|()| Event::from_parts(*stream, seq))
    }

    fn record_event(&self, stream: &Stream) -> Result<Event> {
        let slot = self.slot(stream)?;
        self.record(stream, &slot)
    }

    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let slot = self.slot(stream)?;
        let from = self.slot(&event.stream())?;
        let ledger = from.ledger.lock().unwrap_or_else(|p| p.into_inner());
        match ledger.lookup(event.seq()) {
            Lookup::Complete => Ok(()),
            Lookup::Pending(ev) => slot.stream.wait_event(ev).map_err(self.dev("ordering a stream after an event")),
            Lookup::Future => Err(Error::InvalidArgument {
                rank: self.inner.rank,
                source: symm_core::ArgError::invalid(
                    "event",
                    event.seq(),
                    "no operation of its stream has that number yet",
                ),
            }),
        }
    }

    fn query_event(&self, event: &Event) -> Result<bool> {
        let slot = self.slot(&event.stream())?;
        let mut ledger = slot.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let done = match ledger.lookup(event.seq()) {
            Lookup::Complete => true,
            Lookup::Pending(ev) => ev.query().map_err(self.dev("querying an event"))?,
            Lookup::Future => false,
        };
        if done {
            ledger.completed(event.seq());
            drop(ledger);
            slot.outcomes.of(event.seq())?;
        }
        Ok(done)
    }

    fn synchronize_event(&self, event: &Event, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            if self.query_event(event)? {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout(Box::new(TimeoutError::new(
                    self.inner.rank,
                    "synchronize".into(),
                    None,
                    format!("event {} of stream {}", event.seq(), event.stream().id()),
                    "the stream's work up to the event to complete".into(),
                    "not complete".into(),
                    Vec::new(),
                    start.elapsed(),
                ))));
            }
            std::thread::sleep(nap.min(timeout.saturating_sub(start.elapsed())));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    unsafe fn put_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
    ) -> Result<Event> {
        let slot = self.slot(stream)?;
        // SAFETY: `src` stays valid until the event completes (contract).
        unsafe { self.inner.heap.put_on_stream(pe_of(peer), dst_offset, src.cast(), bytes, &slot.stream) }
            .map_err(self.dev("put"))?;
        self.record(stream, &slot)
    }

    unsafe fn get_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        src_offset: usize,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<Event> {
        let slot = self.slot(stream)?;
        // SAFETY: `dst` stays valid and untouched until the event completes (contract).
        unsafe { self.inner.heap.get_on_stream(pe_of(peer), src_offset, dst.cast(), bytes, &slot.stream) }
            .map_err(self.dev("get"))?;
        self.record(stream, &slot)
    }

    fn signal_at_on(
        &self,
        stream: &Stream,
        peer: Rank,
        offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<Event> {
        self.width_check(width)?;
        let slot = self.slot(stream)?;
        let op = shmem_signal_op(op);
        self.inner
            .heap
            .signal_on_stream(pe_of(peer), offset, op, value as i32, &slot.stream)
            .map_err(self.dev("signal_op"))?;
        self.record(stream, &slot)
    }

    unsafe fn put_signal_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
        signal_offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<Event> {
        self.width_check(width)?;
        let slot = self.slot(stream)?;
        // SAFETY: as in `put_bytes_on`. The signal follows the copy on the stream, and the copy
        // is a blocking kernel: the data is in place before the signal changes.
        unsafe { self.inner.heap.put_on_stream(pe_of(peer), dst_offset, src.cast(), bytes, &slot.stream) }
            .map_err(self.dev("put_with_signal"))?;
        let op = shmem_signal_op(op);
        self.inner
            .heap
            .signal_on_stream(pe_of(peer), signal_offset, op, value as i32, &slot.stream)
            .map_err(self.dev("put_with_signal"))?;
        self.record(stream, &slot)
    }

    /// The device's wait kernel: it spins until the word matches, without a bound of its own.
    /// The host's synchronize of a later event is bounded; a wait that never matches leaves
    /// the stream blocked, which that timeout reports.
    fn wait_signal_at_on(
        &self,
        stream: &Stream,
        _group: &Group,
        _setter: Option<Rank>,
        offset: usize,
        width: SignalWidth,
        cmp: CmpOp,
        value: i64,
        _timeout: Duration,
    ) -> Result<Event> {
        self.width_check(width)?;
        let slot = self.slot(stream)?;
        self.inner
            .heap
            .wait_on_stream(offset, cmp.ascend_shmem_code(), value as i32, &slot.stream)
            .map_err(self.dev("wait_until"))?;
        self.record(stream, &slot)
    }

    /// The world's is SHMEM's barrier on the stream. A smaller group has no team of its own
    /// yet: its barrier is the host's, once the stream has run what came before (the host
    /// waits here), so the returned event is complete.
    fn barrier_group_on(&self, stream: &Stream, group: &Group, timeout: Duration) -> Result<Event> {
        let rank = self.inner.rank;
        group.member().at(rank)?;
        let slot = self.slot(stream)?;
        if team_plan(group.ranks(), self.inner.world_size) == TeamPlan::World {
            self.inner.heap.barrier_on_stream(&Team::WORLD, &slot.stream).map_err(self.dev("barrier"))?;
        } else {
            self.drain(&slot, "barrier", timeout)?;
            let tag = self.next_tag(group, "barrier");
            self.inner.boot.exchange(&tag, group.ranks(), b"", timeout).at(rank)?;
        }
        self.record(stream, &slot)
    }

    /// The reduction as a plan of aclnn operators ([`reduce::plan`]) on the communicator's
    /// stream, drained before it returns.
    unsafe fn reduce_local(
        &self,
        dtype: DType,
        op: ReduceOp,
        srcs: &[*const u8],
        out: *mut u8,
        len: usize,
    ) -> Result<()> {
        if len == 0 || srcs.is_empty() {
            return Ok(());
        }
        let own = self.slot(&self.own_stream())?;
        let mut r = self.inner.reducing.lock().unwrap_or_else(|p| p.into_inner());
        r.reserve(reduce::scratch(dtype, len)).map_err(self.dev("reserving the reduction's scratch"))?;
        let Reducing { acc, wide, workspace, .. } = &mut *r;
        let at = |o: Operand| -> *mut std::ffi::c_void {
            match o {
                Operand::Src(j) => srcs[j].cast_mut().cast(),
                Operand::Out => out.cast(),
                Operand::Acc => acc.as_ref().map_or(std::ptr::null_mut(), DeviceBuffer::ptr),
                Operand::Wide => wide.as_ref().map_or(std::ptr::null_mut(), DeviceBuffer::ptr),
            }
        };
        // SAFETY: every operand holds `len` elements of its step's dtype: the sources and `out`
        // by this function's contract, the scratch vectors by `reserve`.
        let vector = |o: Operand, d: DType| unsafe { Tensor::vector(at(o), len, acl_dtype(d)) };
        let stream = &own.stream;
        let run = |step: Step, workspace: &mut Workspace| -> ascend_sys::Result<()> {
            match step {
                Step::Copy { from, to, dtype } => {
                    // SAFETY: both hold `len` elements of `dtype` (above), on the device.
                    unsafe { safe::copy_async(at(to), at(from), len * dtype.size(), CopyKind::DeviceToDevice, stream) }
                }
                Step::Cast { from, from_dtype, to, to_dtype } => safe::cast(
                    &vector(from, from_dtype)?,
                    acl_dtype(to_dtype),
                    &vector(to, to_dtype)?,
                    workspace,
                    stream,
                ),
                Step::Combine { combine, a, b, out, dtype } => {
                    let kind = match combine {
                        Combine::Add => safe::Elementwise::Add,
                        Combine::Max => safe::Elementwise::Maximum,
                        Combine::Min => safe::Elementwise::Minimum,
                    };
                    safe::binary(kind, &vector(a, dtype)?, &vector(b, dtype)?, &vector(out, dtype)?, workspace, stream)
                }
                Step::Divide { x, by, dtype } => {
                    let divisor = if dtype == DType::F64 { Scalar::f64(by as f64)? } else { Scalar::f32(by as f32)? };
                    let v = vector(x, dtype)?;
                    safe::divide(&v, &divisor, &v, workspace, stream)
                }
            }
        };
        let issued = reduce::plan(dtype, op, srcs.len())
            .into_iter()
            .try_for_each(|step| run(step, workspace))
            .map_err(self.dev(&format!("reducing {len} elements of {dtype} with {op}")));
        // Drained even after a failure: the scratch and workspace must be free before the next
        // reduction may grow them.
        let drained = self.drain(&own, "reduction", self.default_timeout());
        issued.and(drained)
    }

    /// The device codec ([`codec::encode`]) on the communicator's stream.
    unsafe fn encode_local(&self, dtype: DType, lp: DType, data: *const u8, len: usize, run: *mut u8) -> Result<()> {
        // SAFETY: forwarded (this function's contract is the codec's).
        self.with_codec(len, 1, "encoding", |ops, s| unsafe {
            codec::encode(ops, s, dtype, lp, data.cast_mut(), len, run)
        })
    }

    /// The device codec ([`codec::reduce`]) on the communicator's stream.
    unsafe fn reduce_encoded_local(
        &self,
        dtype: DType,
        lp: DType,
        op: ReduceOp,
        runs: &[*const u8],
        out: *mut u8,
        len: usize,
    ) -> Result<()> {
        let runs: Vec<codec::Addr> = runs.iter().map(|r| r.cast_mut()).collect();
        // SAFETY: forwarded (this function's contract is the codec's).
        self.with_codec(len, runs.len(), "reducing", |ops, s| unsafe {
            codec::reduce(ops, s, dtype, lp, op, &runs, out, len)
        })
    }
}
