//! The reference collectives (`symm_core::coll::reference`) against the host engine on the CPU
//! backend, ranks as threads of this process: random dtypes, ops and sizes (larger than the
//! workspace, empty, odd), 1 to 4 ranks and a subgroup; with 32-bit signals across the wrap
//! of the epochs (at 2^31 and 2^32); argument errors; and a bounded timeout.

use std::time::Duration;

use symm_core::coll::reference::{Reference, ReferenceOptions};
use symm_core::dfx::{FlightRing, StatsTable};
use symm_core::stream::HostTask;
use symm_core::{
    Backend, CmpOp, CollOptions, Collectives, Communicator, DType, Error, Event, Group, LocalMut, LocalRef, Rank,
    ReduceOp, Result, SignalOp, SignalWidth, Stream, StreamBackend,
};
use symm_registry::{run_in_process, BackendControl, Comm, CommConfig};
use symm_tests::coll_cases::{encode, value};

/// A slot small enough that most cases take several rounds.
const SLOT: usize = 4096;

fn config() -> CommConfig {
    let mut config = CommConfig::with_heap_size(32 << 20);
    config.settings.timeout = Duration::from_secs(30);
    // The host engine chunks and pipelines at these sizes too.
    config.settings.coll_workspace = 256 << 10;
    config.settings.allreduce_oneshot_max = 16 << 10;
    config.settings.p2p_chunk = 8 << 10;
    config
}

fn ranks<R: Send>(n: usize, f: impl Fn(Comm) -> R + Sync) -> Vec<R> {
    let results = run_in_process(n, config(), f).into_iter().enumerate();
    results.map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r} failed to start: {e}"))).collect()
}

fn options(first_epoch: u64) -> ReferenceOptions {
    ReferenceOptions {
        timeout: Some(Duration::from_secs(30)),
        slot_bytes: SLOT,
        first_epoch,
        ..ReferenceOptions::default()
    }
}

/// A buffer of any dtype, 8-byte aligned.
struct Data {
    words: Vec<u64>,
    len: usize,
    dtype: DType,
}

impl Data {
    fn zeros(dtype: DType, len: usize) -> Data {
        Data { words: vec![0; (len * dtype.size()).div_ceil(8)], len, dtype }
    }

    fn of(dtype: DType, values: &[f64]) -> Data {
        let mut d = Data::zeros(dtype, values.len());
        let bytes = encode(dtype, values);
        // SAFETY: `words` holds at least `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), d.words.as_mut_ptr().cast::<u8>(), bytes.len()) };
        d
    }

    /// Rank `r`'s data of case `k`.
    fn case(dtype: DType, r: usize, k: usize, len: usize) -> Data {
        Data::of(dtype, &(0..len).map(|i| value(dtype, r, k, i)).collect::<Vec<_>>())
    }

    fn r(&self) -> LocalRef<'_> {
        // SAFETY: `words` holds `len` elements of `dtype`, borrowed for the reference's life.
        unsafe { LocalRef::from_raw(self.words.as_ptr().cast(), self.len, self.dtype) }
    }

    fn m(&mut self) -> LocalMut<'_> {
        // SAFETY: as in `r`, borrowed mutably.
        unsafe { LocalMut::from_raw(self.words.as_mut_ptr().cast(), self.len, self.dtype) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len * size` bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len * self.dtype.size()) }
    }
}

/// A small deterministic generator: the same sequence on every rank for the same seed.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Element counts: empty, single, odd, around the 256-element blocks, and several slots.
const COUNTS: [usize; 9] = [0, 1, 3, 255, 257, 511, 1000, 3001, 4500];

/// Pairwise split sizes of alltoall case `k`: what group rank `a` sends group rank `b`.
fn split(k: usize, a: usize, b: usize) -> usize {
    [0, 1, 5, 300, 1100, 2049][(k * 7 + a * 3 + b * 5) % 6]
}

fn same(what: &str, host: &Data, rf: &Data) {
    assert!(host.bytes() == rf.bytes(), "{what}: the reference's result differs from the host engine's");
}

/// `cases` random collectives on `group`, each by the host engine and by the reference, with
/// the same inputs: the results are the same bits.
fn compare(comm: &Comm, group: &Group, rf: &Reference<'_, Comm>, seed: u64, cases: usize) {
    let (n, me) = (group.size(), group.member().unwrap().index());
    let mut draw = Draw(seed);
    let full = CollOptions::full_precision();
    for k in 0..cases {
        let dtype = DType::ALL[draw.below(DType::ALL.len())];
        let ops: &[ReduceOp] =
            if dtype.is_float() { ReduceOp::ALL } else { &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] };
        let op = ops[draw.below(ops.len())];
        let m = COUNTS[draw.below(COUNTS.len())];
        let lp = matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) && draw.below(4) == 0;
        let ropts = if lp { CollOptions::low_precision(DType::BF16) } else { full };
        let kind = draw.below(8);
        let what = format!("case {k}: kind {kind}, {m} x {dtype}, {op}, low precision {lp}, {n} ranks, rank {me}");
        match kind {
            0 => {
                let (mut h, mut r) = (Data::case(dtype, me, k, m), Data::case(dtype, me, k, m));
                comm.allreduce(group, h.m(), op, &ropts).unwrap();
                rf.allreduce(r.m(), op, &ropts).unwrap();
                same(&what, &h, &r);
            }
            1 => {
                let input = Data::case(dtype, me, k, m);
                let (mut h, mut r) = (Data::zeros(dtype, m), Data::zeros(dtype, m));
                comm.allreduce_into(group, input.r(), h.m(), op, &ropts).unwrap();
                rf.allreduce_into(input.r(), r.m(), op, &ropts).unwrap();
                same(&what, &h, &r);
            }
            2 => {
                let input = Data::case(dtype, me, k, n * m);
                let (mut h, mut r) = (Data::zeros(dtype, m), Data::zeros(dtype, m));
                comm.reduce_scatter(group, h.m(), input.r(), op, &ropts).unwrap();
                rf.reduce_scatter(r.m(), input.r(), op, &ropts).unwrap();
                same(&what, &h, &r);
            }
            3 => {
                let input = Data::case(dtype, me, k, m);
                let (mut h, mut r) = (Data::zeros(dtype, n * m), Data::zeros(dtype, n * m));
                comm.allgather(group, h.m(), input.r(), &full).unwrap();
                rf.allgather(r.m(), input.r(), &full).unwrap();
                same(&what, &h, &r);
            }
            4 => {
                let root = draw.below(n);
                let (mut h, mut r) = (Data::case(dtype, me, k, m), Data::case(dtype, me, k, m));
                comm.broadcast(group, h.m(), root, &full).unwrap();
                rf.broadcast(r.m(), root, &full).unwrap();
                same(&format!("{what}, root {root}"), &h, &r);
            }
            5 => {
                let sends: Vec<usize> = (0..n).map(|b| split(k, me, b)).collect();
                let recvs: Vec<usize> = (0..n).map(|a| split(k, a, me)).collect();
                let input = Data::case(dtype, me, k, sends.iter().sum());
                let total = recvs.iter().sum();
                let (mut h, mut r) = (Data::zeros(dtype, total), Data::zeros(dtype, total));
                comm.alltoall_single(group, input.r(), &sends, h.m(), &recvs, &full).unwrap();
                rf.alltoall_single(input.r(), &sends, r.m(), &recvs, &full).unwrap();
                same(&what, &h, &r);
            }
            6 => {
                let pieces: Vec<Data> = (0..n).map(|b| Data::case(dtype, me * n + b, k, split(k, me, b))).collect();
                let refs: Vec<LocalRef<'_>> = pieces.iter().map(Data::r).collect();
                let recvs: Vec<usize> = (0..n).map(|a| split(k, a, me)).collect();
                let total = recvs.iter().sum();
                let (mut h, mut r) = (Data::zeros(dtype, total), Data::zeros(dtype, total));
                comm.alltoall(group, &refs, h.m(), &recvs, &full).unwrap();
                rf.alltoall(&refs, r.m(), &recvs, &full).unwrap();
                same(&what, &h, &r);
            }
            _ => {
                // A ring of sendrecv, then a send from group rank 0 to the last.
                let (dst, src) = ((me + 1) % n, (me + n - 1) % n);
                let out = Data::case(dtype, me, k, m);
                let (mut h, mut r) = (Data::zeros(dtype, m), Data::zeros(dtype, m));
                comm.sendrecv(group, out.r(), dst, h.m(), src, &full).unwrap();
                rf.sendrecv(out.r(), dst, r.m(), src, &full).unwrap();
                same(&format!("{what} (sendrecv)"), &h, &r);
                if n > 1 && (me == 0 || me == n - 1) {
                    let (mut h, mut r) = (Data::zeros(dtype, m), Data::zeros(dtype, m));
                    if me == 0 {
                        comm.send(group, out.r(), n - 1, &full).unwrap();
                        rf.send(out.r(), n - 1, &full).unwrap();
                    } else {
                        comm.recv(group, h.m(), 0, &full).unwrap();
                        rf.recv(r.m(), 0, &full).unwrap();
                        same(&format!("{what} (send/recv)"), &h, &r);
                    }
                }
            }
        }
    }
}

#[test]
fn the_reference_equals_the_host_engine() {
    for n in [1, 2, 3, 4] {
        ranks(n, |comm| {
            let world = comm.world();
            let rf = Reference::with_options(&comm, &world, options(1)).unwrap();
            compare(&comm, &world, &rf, 7 + n as u64, 48);
            rf.free().unwrap();
            if n >= 3 {
                // A subgroup in another order than the world's.
                let sub = comm.new_group(&world, &[n - 1, 0, 1]).unwrap();
                if sub.member().is_ok() {
                    let rf = Reference::with_options(&comm, &sub, options(1)).unwrap();
                    compare(&comm, &sub, &rf, 100 + n as u64, 24);
                    rf.free().unwrap();
                }
            }
            comm.barrier(&world).unwrap();
        });
    }
}

/// A sendrecv meets a peer's plain send and recv, in either order, with messages of several
/// slots each way: both directions progress at once, on both engines.
#[test]
fn sendrecv_meets_plain_send_and_recv() {
    ranks(2, |comm| {
        let world = comm.world();
        let me = comm.rank().index();
        let rf = Reference::with_options(&comm, &world, options(1)).unwrap();
        let full = CollOptions::full_precision();
        for (k, m) in [(0, 5000), (1, 3001), (2, 1)] {
            let out = Data::case(DType::F64, me, k, m);
            let (mut h, mut r) = (Data::zeros(DType::F64, m), Data::zeros(DType::F64, m));
            match (me, k % 2) {
                (0, _) => {
                    comm.sendrecv(&world, out.r(), 1, h.m(), 1, &full).unwrap();
                    rf.sendrecv(out.r(), 1, r.m(), 1, &full).unwrap();
                }
                (_, 0) => {
                    comm.send(&world, out.r(), 0, &full).unwrap();
                    comm.recv(&world, h.m(), 0, &full).unwrap();
                    rf.send(out.r(), 0, &full).unwrap();
                    rf.recv(r.m(), 0, &full).unwrap();
                }
                _ => {
                    comm.recv(&world, h.m(), 0, &full).unwrap();
                    comm.send(&world, out.r(), 0, &full).unwrap();
                    rf.recv(r.m(), 0, &full).unwrap();
                    rf.send(out.r(), 0, &full).unwrap();
                }
            }
            same(&format!("message {k} on rank {me}"), &h, &r);
            assert!(r.bytes() == Data::case(DType::F64, 1 - me, k, m).bytes(), "message {k} on rank {me}");
        }
        rf.free().unwrap();
    });
}

/// The mailbox holds `mail_depth` chunks: both members of a pair (or a member to itself) send
/// a message of exactly that many chunks, and others queued behind it, before either receives;
/// every send returns without its receiver. A depth that is not a power of two is refused.
#[test]
fn sends_run_a_mailbox_ahead_of_their_receivers() {
    for n in [1, 2] {
        ranks(n, |comm| {
            let world = comm.world();
            let me = comm.rank().index();
            let peer = (me + 1) % n;
            for depth in [1, 2, 4] {
                let opts = ReferenceOptions { mail_depth: depth, ..options(1) };
                let rf = Reference::with_options(&comm, &world, opts).unwrap();
                let full = CollOptions::full_precision();
                // One message filling the mailbox, then (after it is received) `depth` one-chunk
                // messages.
                let big = opts.eager_max_bytes() / 8;
                let sizes: Vec<usize> = std::iter::once(big).chain((0..depth).map(|k| 3 + k)).collect();
                let out: Vec<Data> = sizes.iter().enumerate().map(|(k, &m)| Data::case(DType::F64, me, k, m)).collect();
                rf.send(out[0].r(), peer, &full).unwrap();
                let mut got = Data::zeros(DType::F64, big);
                rf.recv(got.m(), (me + n - 1) % n, &full).unwrap();
                assert!(got.bytes() == Data::case(DType::F64, (me + n - 1) % n, 0, big).bytes(), "rank {me}");
                for o in &out[1..] {
                    rf.send(o.r(), peer, &full).unwrap();
                }
                for (k, &m) in sizes.iter().enumerate().skip(1) {
                    let mut got = Data::zeros(DType::F64, m);
                    rf.recv(got.m(), (me + n - 1) % n, &full).unwrap();
                    let want = Data::case(DType::F64, (me + n - 1) % n, k, m);
                    assert!(got.bytes() == want.bytes(), "rank {me}: depth {depth}: message {k}");
                }
                rf.free().unwrap();
            }
            let e =
                Reference::with_options(&comm, &world, ReferenceOptions { mail_depth: 3, ..options(1) }).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("mail_depth = 3"), "{e}");
        });
    }
}

/// The CPU backend with 32-bit signals, as Ascend's aclshmem has: every call forwards to
/// `Comm`, and `signal_width` answers W32.
#[repr(transparent)]
struct Narrow(Comm);

impl Backend for Narrow {
    fn backend_name(&self) -> &'static str {
        self.0.backend_name()
    }
    fn rank(&self) -> Rank {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn instance_id(&self) -> u64 {
        self.0.instance_id()
    }
    fn default_timeout(&self) -> Duration {
        self.0.default_timeout()
    }
    fn world(&self) -> Group {
        self.0.world()
    }
    fn group_of(&self, ranks: &[Rank]) -> Result<Group> {
        self.0.group_of(ranks)
    }
    fn heap_size(&self) -> usize {
        self.0.heap_size()
    }
    fn check_process(&self) -> Result<()> {
        self.0.check_process()
    }
    fn heap_alloc(&self, group: &Group, bytes: usize, timeout: Duration) -> Result<usize> {
        self.0.heap_alloc(group, bytes, timeout)
    }
    fn heap_free(&self, group: &Group, offset: usize, bytes: usize, timeout: Duration) -> Result<()> {
        self.0.heap_free(group, offset, bytes, timeout)
    }
    fn heap_abandon(&self, group: &Group, offset: usize, bytes: usize) {
        self.0.heap_abandon(group, offset, bytes)
    }
    fn local_heap_base(&self) -> *mut u8 {
        self.0.local_heap_base()
    }
    unsafe fn copy_to_heap(&self, offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.0.copy_to_heap(offset, src, bytes) }
    }
    unsafe fn copy_from_heap(&self, offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.0.copy_from_heap(offset, dst, bytes) }
    }
    fn settings(&self) -> Option<&symm_core::config::Config> {
        self.0.settings()
    }
    unsafe fn put_bytes(&self, peer: Rank, dst_offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.0.put_bytes(peer, dst_offset, src, bytes) }
    }
    unsafe fn get_bytes(&self, peer: Rank, src_offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.0.get_bytes(peer, src_offset, dst, bytes) }
    }
    fn signal_at(&self, peer: Rank, offset: usize, width: SignalWidth, op: SignalOp, value: i64) -> Result<()> {
        self.0.signal_at(peer, offset, width, op, value)
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
        // SAFETY: forwarded.
        unsafe { self.0.put_signal_bytes(peer, dst_offset, src, bytes, signal_offset, width, op, value) }
    }
    fn wait_signal_at(
        &self,
        offset: usize,
        width: SignalWidth,
        cmp: CmpOp,
        value: i64,
        timeout: Duration,
        site: symm_core::DescribeWait<'_>,
    ) -> Result<i64> {
        self.0.wait_signal_at(offset, width, cmp, value, timeout, site)
    }
    fn fence(&self) -> Result<()> {
        self.0.fence()
    }
    fn quiet(&self) -> Result<()> {
        self.0.quiet()
    }
    fn barrier_group(&self, group: &Group, timeout: Duration) -> Result<()> {
        self.0.barrier_group(group, timeout)
    }
    fn signal_width(&self) -> SignalWidth {
        SignalWidth::W32
    }
    fn flight_ring(&self, rank: Rank) -> Option<FlightRing<'_>> {
        self.0.flight_ring(rank)
    }
    fn op_stats(&self) -> Option<&StatsTable> {
        self.0.op_stats()
    }
    fn timing(&self) -> bool {
        self.0.timing()
    }
}

impl StreamBackend for Narrow {
    fn create_stream(&self) -> Result<Stream> {
        self.0.create_stream()
    }
    fn enqueue(&self, stream: &Stream, op: &'static str, group: Option<&Group>, task: HostTask<Self>) -> Result<Event> {
        let task: HostTask<Comm> = Box::new(move |c: &Comm| {
            // SAFETY: `Narrow` is a transparent wrapper of `Comm`: same layout.
            task(unsafe { &*(c as *const Comm).cast::<Narrow>() })
        });
        self.0.enqueue(stream, op, group, task)
    }
    fn record_event(&self, stream: &Stream) -> Result<Event> {
        self.0.record_event(stream)
    }
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.0.stream_wait_event(stream, event)
    }
    fn query_event(&self, event: &Event) -> Result<bool> {
        self.0.query_event(event)
    }
    fn synchronize_event(&self, event: &Event, timeout: Duration) -> Result<()> {
        self.0.synchronize_event(event, timeout)
    }
}

/// Wrapping integer sum of every rank's case-`k` values (what an int64 sum gives).
fn int_sum(n: usize, k: usize, i: usize) -> i64 {
    (0..n).map(|r| value(DType::I64, r, k, i) as i64).fold(0i64, |a, v| a.wrapping_add(v))
}

/// Calls of each kind crossing `boundary` (the epoch at which the flags wrap or change sign),
/// starting 40 rounds below it.
fn across<B: StreamBackend>(comm: &B, width: SignalWidth, boundary: u64) {
    const CALLS: usize = 60;
    let (world, me, n) = (comm.world(), comm.rank().index(), comm.world_size());
    let first = boundary.wrapping_sub(40);
    let rf = Reference::with_options(comm, &world, options(first)).unwrap();
    assert_eq!(rf.signal_width(), width);
    let full = CollOptions::full_precision();
    for k in 0..CALLS {
        // Mostly one data round per call, so that the calls cross the wrap a round at a time.
        let m = [1, 7, 600][k % 3];
        let mut buf = Data::case(DType::I64, me, k, m);
        rf.allreduce(buf.m(), ReduceOp::Sum, &full).unwrap();
        let want: Vec<f64> = (0..m).map(|i| int_sum(n, k, i) as f64).collect();
        assert!(buf.bytes() == Data::of(DType::I64, &want).bytes(), "allreduce {k} from epoch {first}");
        let input = Data::case(DType::U8, me, k, m);
        let mut out = Data::zeros(DType::U8, n * m);
        rf.allgather(out.m(), input.r(), &full).unwrap();
        for r in 0..n {
            let part = &out.bytes()[r * m..(r + 1) * m];
            assert!(part == Data::case(DType::U8, r, k, m).bytes(), "allgather {k} part {r}");
        }
        // Point-to-point channels wrap too (one epoch per chunk).
        let (dst, src) = ((me + 1) % n, (me + n - 1) % n);
        let out = Data::case(DType::I32, me, k, m);
        let mut got = Data::zeros(DType::I32, m);
        rf.sendrecv(out.r(), dst, got.m(), src, &full).unwrap();
        assert!(got.bytes() == Data::case(DType::I32, src, k, m).bytes(), "sendrecv {k}");
    }
    let rounds = rf.next_epoch().wrapping_sub(first);
    assert!(rounds >= 4 * CALLS as u64 && rounds > 40, "{rounds} rounds from {first} did not cross {boundary}");
    rf.free().unwrap();
}

/// A backend whose collectives are the reference ones through `collectives_by_reference!`:
/// `Narrow` (32-bit signals) with the CPU backend's cache, under `SYMM_COLLECTIVES=reference`
/// (whose world state the CPU backend made at start-up; the groups of `coll_groups` are
/// created by `Narrow`, with 32-bit flags), passes the collective cases.
#[test]
fn a_backend_served_by_the_macro_passes_the_collective_cases() {
    // The cases' buffers need a larger heap.
    let mut config = CommConfig::with_heap_size(64 << 20);
    config.settings.timeout = Duration::from_secs(60);
    config.settings.collectives = symm_core::config::CollectiveEngine::Reference;
    for n in [2, 3] {
        for (r, res) in run_in_process(n, config.clone(), |comm| {
            let narrow = Narrow(comm);
            // (Not the two whose sizes follow the host engine's default workspace of 16 MiB,
            // which run on the reference in `in_process.rs`.)
            let sized_by_the_workspace = ["low_precision_pipeline", "allreduce_inputs_reused"];
            for case in symm_tests::COLL_CASES.iter().filter(|c| !sized_by_the_workspace.contains(c)) {
                symm_tests::run_coll_case(case, &narrow).expect("a collective case");
            }
        })
        .into_iter()
        .enumerate()
        {
            res.unwrap_or_else(|e| panic!("rank {r} of {n} failed to start: {e}"));
        }
    }
}

impl Collectives for Narrow {
    symm_core::collectives_by_reference!(reference_cache);
}

impl Narrow {
    fn reference_cache(&self) -> &symm_core::coll::by_reference::ReferenceCache {
        self.0.reference_cache().expect("the CPU backend keeps the reference collectives' state")
    }
}

#[test]
fn thirty_two_bit_flags_wrap_safely() {
    for boundary in [1u64 << 32, 1u64 << 31] {
        for n in [2, 3] {
            ranks(n, |comm| across(&Narrow(comm), SignalWidth::W32, boundary));
        }
    }
}

#[test]
fn sixty_four_bit_flags_wrap_safely() {
    // Where the signed word changes sign, and where the counter itself wraps.
    for boundary in [1u64 << 63, 0] {
        ranks(2, |comm| across(&comm, SignalWidth::W64, boundary));
    }
}

/// The reference's correctness comes from stream order, not timing: the same comparison with
/// every stream operation delayed at random.
#[test]
fn the_reference_holds_under_stream_delays() {
    let mut config = config();
    config.settings.stream_delay = Duration::from_micros(50);
    for n in [2, 3] {
        for (r, res) in run_in_process(n, config.clone(), |comm| {
            let world = comm.world();
            let rf = Reference::with_options(&comm, &world, options(1)).unwrap();
            compare(&comm, &world, &rf, 500 + n as u64, 16);
            rf.free().unwrap();
        })
        .into_iter()
        .enumerate()
        {
            res.unwrap_or_else(|e| panic!("rank {r} failed to start: {e}"));
        }
    }
}

fn code(r: &Result<()>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(e) => e.code(),
    }
}

/// Each faulty call runs on both engines; every rank gets the same outcome from both, and
/// the group stays usable (an allreduce after it).
#[test]
fn argument_errors_are_the_host_engines() {
    for n in [2, 3] {
        ranks(n, |comm| {
            let world = comm.world();
            let me = comm.rank().index();
            let rf = Reference::with_options(&comm, &world, options(1)).unwrap();
            let full = CollOptions::full_precision();
            let mut outcomes = Vec::new();
            for case in 0..6 {
                let engines: [&dyn Fn() -> Result<()>; 2] =
                    [&|| faulty(case, me, n, &|k| host_call(&comm, &world, k)), &|| {
                        faulty(case, me, n, &|k| reference_call(&rf, k))
                    }];
                let got: Vec<&str> = engines.iter().map(|f| code(&f())).collect();
                assert_eq!(got[0], got[1], "case {case} on rank {me}: host engine vs reference");
                outcomes.push(got[0]);
                // Still in step: a correct allreduce on both.
                let mut a = Data::case(DType::I32, me, case, 5);
                comm.allreduce(&world, a.m(), ReduceOp::Sum, &full).unwrap();
                let mut b = Data::case(DType::I32, me, case, 5);
                rf.allreduce(b.m(), ReduceOp::Sum, &full).unwrap();
                same(&format!("allreduce after case {case}"), &a, &b);
            }
            // The cases meant what they say: errors where the arguments are bad.
            let bad_rank = if me == 0 { "SYMM_E_INVALID_ARGUMENT" } else { "SYMM_E_PEER_REJECTED" };
            assert_eq!(outcomes[0], bad_rank, "rank {me}: {outcomes:?}");
            assert_eq!(outcomes[1], bad_rank, "rank {me}: {outcomes:?}");
            assert_eq!(outcomes[2], "SYMM_E_INVALID_ARGUMENT", "rank {me}: {outcomes:?}");
            assert_eq!(outcomes[3], "SYMM_E_MISMATCH", "rank {me}: {outcomes:?}");
            rf.free().unwrap();
        });
    }
}

/// One call of either engine, by what it is.
enum Faulty<'a> {
    AllReduce(&'a mut Data, ReduceOp),
    AllReduceInto(&'a Data, &'a mut Data),
    Broadcast(&'a mut Data, usize),
    Send(&'a Data, usize),
    Recv(&'a mut Data, usize),
    AllToAllSingle(&'a Data, Vec<usize>, &'a mut Data, Vec<usize>),
}

fn host_call(comm: &Comm, g: &Group, f: Faulty<'_>) -> Result<()> {
    let o = CollOptions::full_precision();
    match f {
        Faulty::AllReduce(b, op) => comm.allreduce(g, b.m(), op, &o),
        Faulty::AllReduceInto(i, out) => comm.allreduce_into(g, i.r(), out.m(), ReduceOp::Sum, &o),
        Faulty::Broadcast(b, root) => comm.broadcast(g, b.m(), root, &o),
        Faulty::Send(b, dst) => comm.send(g, b.r(), dst, &o),
        Faulty::Recv(b, src) => comm.recv(g, b.m(), src, &o),
        Faulty::AllToAllSingle(s, sc, r, rc) => comm.alltoall_single(g, s.r(), &sc, r.m(), &rc, &o),
    }
}

fn reference_call(rf: &Reference<'_, Comm>, f: Faulty<'_>) -> Result<()> {
    let o = CollOptions::full_precision();
    match f {
        Faulty::AllReduce(b, op) => rf.allreduce(b.m(), op, &o),
        Faulty::AllReduceInto(i, out) => rf.allreduce_into(i.r(), out.m(), ReduceOp::Sum, &o),
        Faulty::Broadcast(b, root) => rf.broadcast(b.m(), root, &o),
        Faulty::Send(b, dst) => rf.send(b.r(), dst, &o),
        Faulty::Recv(b, src) => rf.recv(b.m(), src, &o),
        Faulty::AllToAllSingle(s, sc, r, rc) => rf.alltoall_single(s.r(), &sc, r.m(), &rc, &o),
    }
}

/// Faulty call `case` of rank `me` of `n`, made with `run`.
fn faulty(case: usize, me: usize, n: usize, run: &dyn Fn(Faulty<'_>) -> Result<()>) -> Result<()> {
    match case {
        // Rank 0 asks for avg of integers; the others make a correct call.
        0 => {
            let op = if me == 0 { ReduceOp::Avg } else { ReduceOp::Sum };
            run(Faulty::AllReduce(&mut Data::case(DType::I32, me, 0, 9), op))
        }
        // Rank 0's output is shorter than its input.
        1 => {
            let input = Data::case(DType::F32, me, 1, 9);
            let mut out = Data::zeros(DType::F32, if me == 0 { 8 } else { 9 });
            run(Faulty::AllReduceInto(&input, &mut out))
        }
        // Every rank names a root outside the group.
        2 => run(Faulty::Broadcast(&mut Data::case(DType::U8, me, 2, 4), n)),
        // Counts that differ between ranks.
        3 => run(Faulty::AllReduce(&mut Data::case(DType::I64, me, 3, 10 + me), ReduceOp::Sum)),
        // A receive of another size than sent: the receiver fails, the sender does not.
        4 => match me {
            0 => run(Faulty::Send(&Data::case(DType::I16, 0, 4, 10), 1)),
            1 => run(Faulty::Recv(&mut Data::zeros(DType::I16, 12), 0)),
            _ => Ok(()),
        },
        // Split sizes that do not add up on rank 0.
        _ => {
            let sends = vec![2; n];
            let counts = if me == 0 { vec![2; n - 1] } else { vec![2; n] };
            let input = Data::case(DType::I32, me, 5, 2 * n);
            run(Faulty::AllToAllSingle(&input, sends, &mut Data::zeros(DType::I32, 2 * n), counts))
        }
    }
}

#[test]
fn a_missing_member_is_a_bounded_timeout_naming_what_was_awaited() {
    ranks(2, |comm| {
        let world = comm.world();
        let me = comm.rank().index();
        let rf = Reference::with_options(&comm, &world, options(1)).unwrap();
        if me == 0 {
            let opts = CollOptions { timeout: Some(Duration::from_millis(500)), ..CollOptions::full_precision() };
            let mut buf = Data::case(DType::F32, 0, 0, 100);
            let start = std::time::Instant::now();
            let e = rf.allreduce(buf.m(), ReduceOp::Sum, &opts).unwrap_err();
            assert!(start.elapsed() < Duration::from_secs(5), "bounded: {:?}", start.elapsed());
            let Error::Timeout(t) = &e else { panic!("a timeout, not {e}") };
            let text = e.to_string();
            assert!(t.op.contains("allreduce #1"), "{text}");
            assert!(t.location.contains("data[1]") && t.location.contains("global rank 1"), "{text}");
            assert_eq!(t.pending, vec![Rank(1)], "{text}");
            // Its epochs are now ahead of the peer's: later calls are refused.
            let e = rf.allreduce(buf.m(), ReduceOp::Sum, &opts).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("out of step"), "{e}");
        }
        comm.barrier(&world).unwrap();
        drop(rf);
    });
}
