//! `symm-bench`: an nccl-tests-style benchmark of symm's collectives, on the backend
//! `SYMM_BACKEND` names (the CPU backend by default; `ascend` on an Ascend node, in a build with
//! that feature).
//!
//! ```text
//! symm-bench <op> [-b minbytes] [-e maxbytes] [-f factor] [-g ranks] [-d dtype] [-o redop]
//!                 [-n iters] [-w warmup] [-c 0|1] [--pin 0|1] [--host 0|1] [--copies 0|1] [--csv]
//! ```
//! `<op>`: `all_reduce`, `reduce_scatter`, `all_gather`, `alltoall`, `sendrecv`, `broadcast`
//! (the collectives of nccl-tests), and the primitives `put` (rank 0 puts into rank 1's heap)
//! and `pingpong` (`put_with_signal` between ranks 0 and 1; the time is the one-way latency).
//!
//! Started without `SYMM_RANK`, the program is its own launcher: it measures the machine's
//! memory rates, prints the header and starts itself once per rank through
//! [`symm_registry::spawn_ranks`] (with `SYMMETRIC_MEMORY_HEAP_SIZE` set large enough unless the
//! caller set it). Rank 0 prints the table.
//!
//! # What is measured
//! Buffers live in the symmetric heap (allocated once, in the world group, for the largest
//! size), which is the library's zero-copy path; `--host 1` uses ordinary vectors instead (the
//! staged path). Where the heap is device memory the buffers are filled and checked through the
//! backend's copies, never loaded from or stored into (`--copies 1` does the same on the CPU),
//! and `--host` and `--touch` are refused. Per size, every rank runs `-w` untimed warm-ups and then `-n` timed iterations
//! of the out-of-place form, then the same for the in-place form; the time of a form is the
//! average per iteration, the maximum over ranks (gathered with an allreduce after the timed
//! loop). Large sizes run fewer iterations (see [`iters_for`]) so that one size stays well under
//! a second. `broadcast` has only the in-place API (`broadcast(buf)`); it is reported in the
//! out-of-place columns, like every op without a second form, whose in-place columns say N/A.
//!
//! Columns follow nccl-tests (`doc/PERFORMANCE.md`): size S in bytes (for all_gather,
//! reduce_scatter and alltoall the total over the ranks' parts, rounded down to whole parts;
//! `count` is then the elements of one part), `algbw = S / time`, `busbw = algbw x factor` with
//! the factor 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter, all_gather and alltoall, and
//! 1 for broadcast, sendrecv, put and pingpong; GB/s are 1e9 bytes per second.
//!
//! # Correctness (`-c 1`, the default)
//! After the timed loop of each form, untimed: every rank fills its inputs with small integers
//! that depend on its rank and the element index, fills its outputs with a poison byte (0xA5,
//! never a valid result), runs the operation once more and compares every output element with
//! the value computed here. Reductions are computed like the library documents them (in
//! group-rank order in f64 here; the data are small integers, so sums are exact in the f32
//! accumulator of narrow floats, and the single rounding to the dtype is reproduced; `avg`
//! divides in the accumulator type); the comparison is exact. With
//! `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` set, reductions of float data travel in that format,
//! and the values stay exact in it too: smaller integers, sums of at most its exact integers
//! (with more ranks than that, the later ranks contribute zeros), and for `avg` (whose mean the
//! check must state exactly) a common mean with rank offsets that cancel. `#wrong` is the number of
//! mismatching elements summed over the ranks; any mismatch makes the program exit with status 3
//! (1: a call failed; 2: the ranks could not start).
//!
//! # Memory-bandwidth bound
//! The launcher measures the host's memory rates ([`symm_registry::host::membw::Limits::measure`]: reading,
//! writing, copying and summing, streaming and cached stores, one thread and `min(ranks, CPUs)` threads,
//! by working-set size from 4 KiB to 256 MiB) and prints them. For each size and form, the
//! `bound` column is [`symm_registry::host::membw::Limits::bound`] of the op's least traffic
//! ([`symm_registry::host::membw::traffic`]: each input byte read once, each output byte written once, the
//! work shared by the ranks): no call can take less. `%oop`, `%ip` = bound / time. The model is
//! described in docs/performance.md, "The memory-bandwidth bound"; `python -m symm.perf` reports
//! the same one.
//!
//! # Pinning
//! With `--pin 1` (default) rank r pins itself to allowed CPU number `r % CPUs`, after it has
//! joined the job: `symm-sim` sizes its spin budget from the CPUs a rank may use when it starts,
//! and a rank pinned beforehand would believe it shares a single core with every other rank.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::time::Instant;

use clap::{ArgAction, CommandFactory, Parser};

use symm_core::backend::{MemorySpace, SignalWidth};
use symm_core::coll::lowp;
use symm_core::{
    bf16, f16, AtRank, Backend, CmpOp, CollOptions, Collectives, Communicator, DType, Element, Group, LocalMut,
    LocalRef, ReduceOp, SignalOp, Stream, StreamBackend, StreamCollectives, StreamCommunicator, SymmBuffer,
    SymmetricHeap, F8E4M3, F8E5M2,
};
use symm_registry::host::membw::{self, Limits};
use symm_registry::host::sys::{allowed_cpus, pin_to};
use symm_registry::Comm;
use symm_registry::RANK_VAR;

/// Environment variable through which the launcher hands the measured memory rates to the
/// ranks ([`Limits::encode`]).
const LIMITS_VAR: &str = "SYMM_BENCH_MEMORY_LIMITS";
/// Poison byte of outputs before a checked run.
const POISON: u8 = 0xA5;
/// Heap slack beyond the benchmark's buffers (collective workspace, mailboxes, signals).
const HEAP_SLACK: usize = 64 << 20;

// The benchmarked operation: the memory-bandwidth model's own list of operations.
use symm_registry::host::membw::Coll as Op;

/// What the benchmark needs to know of an operation beyond the model.
trait OpFacts: Sized {
    fn parse(s: &str) -> Option<Op>;
    fn reduces(self) -> bool;
    fn has_in_place(self) -> bool;
    fn split(self) -> bool;
    fn min_ranks(self) -> usize;
    fn bus_factor(self, n: usize) -> f64;
    fn root(self) -> i64;
}

impl OpFacts for Op {
    /// Accepts the names above, without underscores, and nccl-tests' binary names (`_perf`).
    fn parse(s: &str) -> Option<Op> {
        let norm = |t: &str| t.trim_end_matches("_perf").replace(['_', '-'], "").to_ascii_lowercase();
        let want = norm(s);
        Op::ALL.into_iter().find(|op| norm(op.name()) == want)
    }

    fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter)
    }

    /// Whether the op has a separate in-place form.
    fn has_in_place(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::AllGather)
    }

    /// Whether a size is split into one part per rank (S is the total of the parts).
    fn split(self) -> bool {
        matches!(self, Op::ReduceScatter | Op::AllGather | Op::AllToAll)
    }

    fn min_ranks(self) -> usize {
        match self {
            Op::SendRecv | Op::Put | Op::PingPong => 2,
            _ => 1,
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather | Op::AllToAll => (n - 1.0) / n,
            Op::SendRecv | Op::Broadcast | Op::Put | Op::PingPong => 1.0,
        }
    }

    /// The `root` column (-1: no root).
    fn root(self) -> i64 {
        if self == Op::Broadcast {
            0
        } else {
            -1
        }
    }
}

/// nccl-tests' name of a dtype (the `type` column).
fn type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::F8E4M3 => "f8e4m3",
        DType::F8E5M2 => "f8e5m2",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}

/// Benchmarks one symm operation over a range of sizes, with nccl-tests' options and columns.
#[derive(Clone, Debug, Parser)]
#[command(name = "symm-bench")]
struct Options {
    /// all_reduce | reduce_scatter | all_gather | alltoall | sendrecv | broadcast | put | pingpong
    /// (also without underscores, or as nccl-tests' binary names: all_reduce_perf)
    #[arg(value_name = "op", value_parser = parse_op)]
    op: Op,
    /// Smallest size in bytes, K/M/G suffixes
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", default_value = "8", value_parser = parse_bytes)]
    min_bytes: usize,
    /// Largest size in bytes
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", default_value = "64M", value_parser = parse_bytes)]
    max_bytes: usize,
    /// Size multiplication factor
    #[arg(short = 'f', long = "stepfactor", value_name = "FACTOR", default_value = "2", value_parser = at_least(2))]
    factor: usize,
    /// Number of ranks
    #[arg(short = 'g', long = "ngpus", visible_alias = "ranks", default_value = "2", value_parser = at_least(1))]
    ranks: usize,
    /// float, half, bfloat16, double, int8, uint8, int16, int32, int64, f8e4m3, f8e5m2
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    dtype: DType,
    /// sum, avg, max, min (reductions only)
    #[arg(short = 'o', long = "op", value_name = "OP", default_value = "sum", value_parser = parse_redop)]
    redop: ReduceOp,
    /// Timed iterations per size (fewer from 1 MiB up)
    #[arg(short = 'n', long = "iters", default_value = "20", value_parser = at_least(1))]
    iters: usize,
    /// Warm-up iterations per size (fewer from 16 MiB up)
    #[arg(short = 'w', long = "warmup_iters", default_value = "5", value_parser = at_least(0))]
    warmup: usize,
    /// Check results
    #[arg(short = 'c', long = "check", value_name = "0|1", default_value = "1", value_parser = zero_one, action = ArgAction::Set)]
    check: bool,
    /// Pin rank r to CPU r % nproc
    #[arg(long, value_name = "0|1", default_value = "1", value_parser = zero_one, action = ArgAction::Set)]
    pin: bool,
    /// 1: ordinary host vectors instead of symmetric-heap buffers
    #[arg(long, value_name = "0|1", default_value = "0", value_parser = zero_one, action = ArgAction::Set)]
    host: bool,
    /// 1: heap buffers are filled and read only through the backend's copies, never loaded
    /// from or stored into (what a backend whose heap is device memory needs, and gets
    /// without asking)
    #[arg(long, value_name = "0|1", default_value = "0", value_parser = zero_one, action = ArgAction::Set)]
    copies: bool,
    /// 1: rewrite one byte per 64-byte line of this rank's input before every call, as a
    /// training step produces new inputs (timed; 0 is like nccl-tests)
    #[arg(long, value_name = "0|1", default_value = "0", value_parser = zero_one, action = ArgAction::Set)]
    touch: bool,
    /// 1: every call goes through the stream-ordered path: enqueued on a stream of the rank
    /// and waited for (the cost of one operation in flight, next to the blocking path)
    #[arg(long, value_name = "0|1", default_value = "0", value_parser = zero_one, action = ArgAction::Set)]
    stream: bool,
    /// Machine-readable rows on stdout (comments go to stderr)
    #[arg(long)]
    csv: bool,
}

impl Options {
    /// The `redop` column.
    fn redop_name(&self) -> &'static str {
        if self.op.reduces() {
            self.redop.name()
        } else {
            "none"
        }
    }
}

fn parse_op(s: &str) -> Result<Op, String> {
    Op::parse(s).ok_or_else(|| {
        let known: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
        format!("unknown op; known: {}", known.join(", "))
    })
}

fn parse_bytes(v: &str) -> Result<usize, String> {
    symm_core::env::parse_size(v).map_err(|_| "expected a size in bytes >= 1 (K, M, G suffixes)".into())
}

fn at_least(min: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |v| v.parse::<usize>().ok().filter(|&x| x >= min).ok_or_else(|| format!("expected an integer >= {min}"))
}

fn parse_dtype(v: &str) -> Result<DType, String> {
    match v.to_ascii_lowercase().as_str() {
        "bool" => Err("not a benchmark dtype".into()),
        "uint32" | "uint64" => Err("not a symm dtype".into()),
        other => other.parse::<DType>().map_err(|e| e.to_string()),
    }
}

fn parse_redop(v: &str) -> Result<ReduceOp, String> {
    v.parse::<ReduceOp>().map_err(|e| e.to_string())
}

fn zero_one(v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("expected 0 or 1".into()),
    }
}

/// Parses the command line (without the program's name); help is an error of its own kind.
fn parse_args(args: &[String]) -> Result<Options, clap::Error> {
    let o = Options::try_parse_from(std::iter::once("symm-bench").chain(args.iter().map(String::as_str)))?;
    let conflict = |m: String| Err(Options::command().error(clap::error::ErrorKind::ArgumentConflict, m));
    if o.min_bytes > o.max_bytes {
        return conflict(format!("-b {} is larger than -e {}", o.min_bytes, o.max_bytes));
    }
    if o.ranks < o.op.min_ranks() {
        return conflict(format!("{} needs at least {} ranks (-g)", o.op.name(), o.op.min_ranks()));
    }
    if o.op.reduces() && o.redop == ReduceOp::Avg && !o.dtype.is_float() {
        return conflict(format!("-o avg needs a floating-point dtype, not {}", type_name(o.dtype)));
    }
    Ok(o)
}

/// The sizes: min, min x f, min x f^2 ... up to max.
fn sizes(o: &Options) -> Vec<usize> {
    std::iter::successors(Some(o.min_bytes), |&s| s.checked_mul(o.factor)).take_while(|&s| s <= o.max_bytes).collect()
}

/// What a requested size means for an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    /// The reported size S (rounded down to whole elements, or whole parts for split ops).
    bytes: usize,
    /// Elements per call unit: of each part for split ops, of the whole buffer otherwise.
    count: usize,
}

fn shape(op: Op, size: usize, n: usize, dtype: DType) -> Shape {
    let unit = if op.split() { n * dtype.size() } else { dtype.size() };
    let count = size / unit;
    Shape { bytes: count * unit, count }
}

/// Capacity in elements of buffers `a` and `b` for a count (see [`Bench::once`] for their roles).
fn capacities(op: Op, count: usize, n: usize) -> (usize, usize) {
    match op {
        Op::AllReduce | Op::SendRecv | Op::Put | Op::PingPong => (count, count),
        Op::ReduceScatter => (n * count, count),
        Op::AllGather => (count, n * count),
        Op::AllToAll => (n * count, n * count),
        Op::Broadcast => (count, 0),
    }
}

/// Timed iterations for a size: `-n`, scaled down from 1 MiB so that a size moves about
/// 256 MiB per form (at least 3 iterations).
fn iters_for(o: &Options, bytes: usize) -> usize {
    if bytes < 1 << 20 {
        o.iters
    } else {
        o.iters.min(((1usize << 28) / bytes).max(3))
    }
}

/// Warm-up iterations for a size: `-w`, scaled down from 16 MiB (at least 1 if `-w` > 0).
fn warmup_for(o: &Options, bytes: usize) -> usize {
    o.warmup.min(((1usize << 26) / bytes.max(1)).max(1))
}

/// Heap bytes per rank the launcher asks for: 4 x the largest size + slack, in whole MiB.
fn heap_bytes(max_bytes: usize) -> usize {
    (4 * max_bytes + HEAP_SLACK).div_ceil(1 << 20) << 20
}

/// The memory-bandwidth bound of one call of `form` (`in_place`) on `s` bytes, seconds.
fn bound(limits: &Limits, op: Op, in_place: bool, s: f64, n: usize) -> f64 {
    limits.bound(membw::traffic(op, in_place, s, n))
}

/// The rates the launcher measured and handed down (None when another launcher started the
/// ranks: rank 0 then measures them itself).
fn limits_from_env() -> Option<Limits> {
    Limits::decode(&std::env::var(LIMITS_VAR).ok()?)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Help exits 0, a bad option 2.
    let o = parse_args(&args).unwrap_or_else(|e| e.exit());
    let Ok(rank) = std::env::var(RANK_VAR).map(|v| v.parse::<usize>()) else {
        std::process::exit(launch(&args, &o));
    };
    let rank = rank.unwrap_or(0);
    // Rank 0 prints; if no launcher measured the memory rates, it measures them before it
    // joins (the others wait for its rendezvous meanwhile).
    let limits = limits_from_env().or_else(|| (rank == 0).then(|| Limits::measure(o.ranks, o.pin)));
    let comm = match Comm::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("symm-bench: start-up failed: {e}");
            std::process::exit(2);
        }
    };
    if o.pin {
        let cpus = allowed_cpus().unwrap_or_default();
        if cpus.is_empty() {
            eprintln!("symm-bench: rank {rank}: not pinned (sched_getaffinity failed)");
        } else if let Err(e) = pin_to(cpus[rank % cpus.len()]) {
            eprintln!("symm-bench: rank {rank}: not pinned to cpu {}: {e}", cpus[rank % cpus.len()]);
        }
    }
    let out = Out { csv: o.csv, quiet: false };
    match rank_main(&comm, &o, limits.as_ref(), &out) {
        Ok(rows) => {
            let wrong: u64 = rows.iter().flat_map(|r| r.wrong.iter().flatten()).sum();
            std::process::exit(if wrong > 0 { 3 } else { 0 });
        }
        Err(e) => {
            eprintln!("symm-bench: rank {rank}: {e} ({})", e.code());
            std::process::exit(1);
        }
    }
}

/// Measures the copy bandwidth, prints the header, runs the ranks; the exit code.
/// The CPU model named in /proc/cpuinfo, or `None`.
fn cpu_model() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
}

/// What a rank's exit code means, for the launcher's report of a failed run: 1 when a call
/// failed, 2 when the rank could not start (bad arguments, or the backend's start-up, such as a
/// bad environment variable), 3 when a check found wrong results. The rank's own message,
/// printed above the report, says which call or value.
fn rank_exit_meaning(code: i32) -> Option<&'static str> {
    match code {
        1 => Some("a call failed"),
        2 => Some("could not start"),
        3 => Some("wrong results"),
        _ => None,
    }
}

fn launch(args: &[String], o: &Options) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("symm-bench: cannot find this program's path to start the ranks: {e}");
            return 2;
        }
    };
    let out = Out { csv: o.csv, quiet: false };
    let start = Instant::now();
    let limits = Limits::measure(o.ranks, o.pin);
    let mut env = vec![(LIMITS_VAR.to_string(), limits.encode())];
    let heap = match std::env::var(symm_core::env::HEAP_SIZE_VAR) {
        Ok(v) => format!("{v} (from {})", symm_core::env::HEAP_SIZE_VAR),
        Err(_) => {
            let bytes = heap_bytes(o.max_bytes);
            env.push((symm_core::env::HEAP_SIZE_VAR.to_string(), bytes.to_string()));
            format!("{} MiB", bytes >> 20)
        }
    };
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = cpu_model().unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let yes = |b: bool| if b { "yes" } else { "no" };
    out.note(&format!(
        "# symm-bench {}: ranks {}, dtype {}, op {}, iters {}, warmup {}, pinned {}, buffers {}, inputs {}, path {}",
        o.op.name(),
        o.ranks,
        type_name(o.dtype),
        o.redop_name(),
        o.iters,
        o.warmup,
        yes(o.pin),
        if o.host { "host" } else { "heap" },
        if o.touch { "rewritten before every call (--touch 1)" } else { "unchanged between calls" },
        if o.stream { "stream-ordered, each call waited for (--stream 1)" } else { "blocking" }
    ));
    out.note(&format!("# machine: nproc {nproc}, cpu {model}, Linux {}", kernel.trim()));
    out.note(&format!("# command: symm-bench {}", args.join(" ")));
    for line in limits.to_string().lines() {
        out.note(&format!("# {line}"));
    }
    out.note(
        "# bound: least time of the bytes the op must read and write at those rates (docs/performance.md, \
         \"The memory-bandwidth bound\"); %oop, %ip = bound / time",
    );
    let spin = std::env::var("SYMM_SPIN_US").map_or("default".into(), |v| format!("{v} us"));
    out.note(&format!(
        "# sizes {} .. {} B x{}, iters scaled from 1 MiB (min(n, max(3, 2^28/size))), check {}, heap per rank \
         {heap}, SYMM_SPIN_US {spin}",
        o.min_bytes,
        o.max_bytes,
        o.factor,
        yes(o.check)
    ));
    match o.op {
        Op::Broadcast => out.note("# broadcast: root 0; one form only (the API is in place), in the first columns"),
        Op::PingPong => out.note("# pingpong: time = one-way latency (round trip / 2) of put_with_signal + wait"),
        Op::Put => out.note("# put: rank 0 puts into rank 1's heap; other ranks idle"),
        _ => {}
    }
    if std::env::var_os(lowp::LOW_PRECISION_VAR).is_some() {
        out.note(&format!(
            "# WARNING: {} is set: reductions of float data travel in low precision (the checks use values it carries exactly)",
            lowp::LOW_PRECISION_VAR
        ));
    }
    if cfg!(debug_assertions) {
        out.note("# WARNING: debug build; build with --release for meaningful figures");
    }
    let _ = std::io::stdout().flush();
    let code = symm_registry::run_job("symm-bench", o.ranks, &exe, args, &env, rank_exit_meaning);
    out.note(&format!("# wall time: {:.2} s", start.elapsed().as_secs_f64()));
    code
}

/// Where output goes: rows to stdout; comments to stdout, or stderr with `--csv`.
#[derive(Clone, Copy, Debug)]
struct Out {
    csv: bool,
    quiet: bool,
}

impl Out {
    fn data(&self, line: &str) {
        if !self.quiet {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        }
    }

    fn note(&self, line: &str) {
        if self.csv && !self.quiet {
            eprintln!("{line}");
        } else {
            self.data(line);
        }
    }
}

/// One size's results (identical on every rank after the reductions).
#[derive(Clone, Debug)]
struct Row {
    shape: Shape,
    iters: usize,
    warmup: usize,
    /// Seconds per iteration, out of place and in place (`None`: no such form).
    time: [Option<f64>; 2],
    /// Wrong elements summed over ranks (`None`: not checked or no such form).
    wrong: [Option<u64>; 2],
}

/// The two forms of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    OutOfPlace,
    InPlace,
}

/// Memory of one buffer role on this rank, sized for the largest size.
#[derive(Debug)]
struct Region<'c> {
    ptr: *mut u8,
    /// Elements.
    cap: usize,
    dtype: DType,
    sym: Option<SymmBuffer>,
    /// Backing store of a host region (8-byte aligned for every dtype).
    _host: Vec<u64>,
    /// The communicator whose copies fill and read a heap region this rank does not load from
    /// or store into (a device's heap, or `--copies 1`).
    copies: Option<&'c Comm>,
}

impl<'c> Region<'c> {
    fn heap(comm: &'c Comm, world: &Group, cap: usize, dtype: DType, copies: bool) -> symm_core::Result<Region<'c>> {
        let buf = comm.alloc(world, cap, dtype)?;
        let ptr = comm.local_ptr(&buf)?;
        Ok(Region { ptr, cap, dtype, sym: Some(buf), _host: Vec::new(), copies: copies.then_some(comm) })
    }

    fn host(cap: usize, dtype: DType) -> Region<'c> {
        let mut v = vec![0u64; (cap * dtype.size()).div_ceil(8)];
        // The vector's heap memory does not move when the vector is moved into the region.
        let ptr = v.as_mut_ptr().cast::<u8>();
        Region { ptr, cap, dtype, sym: None, _host: v, copies: None }
    }

    /// Writes `bytes` at element `at` through the backend's copy into the heap.
    fn copy_in(&self, comm: &Comm, at: usize, bytes: &[u8]) -> symm_core::Result<()> {
        let _ = self.at(at, bytes.len() / self.dtype.size());
        // SAFETY: the range lies in the region's allocation (checked by `at`), which no
        // operation uses now.
        unsafe { comm.copy_to_heap(self.sym().heap_offset() + at * self.dtype.size(), bytes.as_ptr(), bytes.len()) }
    }

    fn at(&self, at: usize, len: usize) -> *mut u8 {
        assert!(at + len <= self.cap, "elements {at}..{} of a {}-element region", at + len, self.cap);
        self.ptr.wrapping_add(at * self.dtype.size())
    }

    /// Elements `at..at + len` as a source.
    fn r(&self, at: usize, len: usize) -> LocalRef<'_> {
        // SAFETY: the range lies within the region (checked by `at`), which stays allocated
        // while `self` is borrowed; this rank writes it only between operations.
        unsafe { LocalRef::from_raw(self.at(at, len), len, self.dtype) }
    }

    /// Elements `at..at + len` as a destination. Overlapping uses are only the in-place forms
    /// the library defines (output = the caller's part of the input, or the input itself).
    fn m(&self, at: usize, len: usize) -> LocalMut<'_> {
        // SAFETY: as in `r`; the memory is this rank's alone (its heap copy or its vector) and
        // nothing else touches it while the operation runs.
        unsafe { LocalMut::from_raw(self.at(at, len), len, self.dtype) }
    }

    fn sym(&self) -> &SymmBuffer {
        self.sym.as_ref().expect("put and pingpong targets live in the heap")
    }

    /// Rewrites one byte (with its own value) in every 64-byte line of elements `at..at + len`:
    /// the lines become modified in this core's cache, as freshly computed inputs are, so a
    /// peer reading them pays the transfer (unchanged inputs stay shared in both caches after
    /// the first call, which flatters libraries that read peers' inputs in place).
    fn touch(&self, at: usize, len: usize) {
        let (p, bytes) = (self.at(at, len), len * self.dtype.size());
        for i in (0..bytes).step_by(64) {
            // SAFETY: inside the region (checked by `at`); this rank's memory, which no call
            // is using now (between operations).
            unsafe { p.add(i).write_volatile(p.add(i).read_volatile()) };
        }
    }

    /// Writes `f(i)` into elements `at + i`, `i < len`.
    fn fill<T: Val>(&self, at: usize, len: usize, f: impl Fn(usize) -> T) -> symm_core::Result<()> {
        assert_eq!(T::DTYPE, self.dtype);
        if let Some(comm) = self.copies {
            let values: Vec<T> = (0..len).map(f).collect();
            // SAFETY: `T` is a plain element type of `len * size` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), len * self.dtype.size()) };
            return self.copy_in(comm, at, bytes);
        }
        let p = self.at(at, len).cast::<T>();
        for i in 0..len {
            // SAFETY: within the region (checked by `at`), aligned (heap offsets and vectors are
            // 8-byte aligned, and T matches the dtype); no operation uses the memory now.
            unsafe { p.add(i).write(f(i)) };
        }
        Ok(())
    }

    fn poison(&self, at: usize, len: usize) -> symm_core::Result<()> {
        if let Some(comm) = self.copies {
            return self.copy_in(comm, at, &vec![POISON; len * self.dtype.size()]);
        }
        let p = self.at(at, len);
        // SAFETY: within the region (checked by `at`); no operation uses the memory now.
        unsafe { p.write_bytes(POISON, len * self.dtype.size()) };
        Ok(())
    }

    /// Number of elements `at + i`, `i < len`, that differ from `f(i)`.
    fn count_wrong<T: Val>(&self, at: usize, len: usize, f: impl Fn(usize) -> T) -> symm_core::Result<u64> {
        assert_eq!(T::DTYPE, self.dtype);
        let p = self.at(at, len).cast::<T>();
        if let Some(comm) = self.copies {
            let mut got: Vec<T> = Vec::with_capacity(len);
            // SAFETY: the range lies in the allocation (checked by `at`); `got` has room for
            // `len` elements, which the copy initialises before `set_len`; the operation that
            // wrote them has completed.
            unsafe {
                let offset = self.sym().heap_offset() + at * self.dtype.size();
                comm.copy_from_heap(offset, got.as_mut_ptr().cast(), len * self.dtype.size())?;
                got.set_len(len);
            }
            return Ok(got.iter().enumerate().filter(|&(i, &g)| g != f(i)).count() as u64);
        }
        // SAFETY: as in `fill`; the operation that wrote the memory has completed.
        Ok((0..len).filter(|&i| unsafe { p.add(i).read() } != f(i)).count() as u64)
    }
}

/// A dtype's values for checks.
trait Val: Element {
    /// Every integer up to this one is exact in the type.
    const EXACT: u32;
    /// The element for `x` (a small integer, or an average already in the accumulator type).
    fn of(x: f64) -> Self;
    /// `sum / n` as the library computes it: in the f32 accumulator of narrow floats.
    fn avg(sum: f64, n: usize) -> f64 {
        f64::from(sum as f32 / n as f32)
    }
}

macro_rules! val {
    ($($t:ty, $exact:expr, |$x:ident| $of:expr;)*) => {$(
        impl Val for $t {
            const EXACT: u32 = $exact;
            fn of($x: f64) -> Self {
                $of
            }
        }
    )*};
}

val!(
    f32, 1 << 24, |x| x as f32;
    f16, 2048, |x| f16::from_f32(x as f32);
    bf16, 256, |x| bf16::from_f32(x as f32);
    F8E4M3, 16, |x| F8E4M3::from_f32(x as f32);
    F8E5M2, 8, |x| F8E5M2::from_f32(x as f32);
    i8, 127, |x| x as i8;
    i16, 32767, |x| x as i16;
    i32, 1 << 24, |x| x as i32;
    i64, 1 << 24, |x| x as i64;
    u8, 255, |x| x as u8;
);

impl Val for f64 {
    const EXACT: u32 = 1 << 24;
    fn of(x: f64) -> Self {
        x
    }
    fn avg(sum: f64, n: usize) -> f64 {
        sum / n as f64
    }
}

/// Runs `$body` with `$t` the Rust type of dtype `$d` (bool is rejected by `parse_args`).
macro_rules! by_dtype {
    ($d:expr, $t:ident => $body:expr) => {
        by_dtype!(@ $d, $t, $body; F32 f32, F64 f64, F16 f16, BF16 bf16, F8E4M3 F8E4M3, F8E5M2 F8E5M2,
            I8 i8, I16 i16, I32 i32, I64 i64, U8 u8)
    };
    (@ $d:expr, $t:ident, $body:expr; $($v:ident $ty:ty),*) => {
        match $d {
            $(DType::$v => {
                type $t = $ty;
                $body
            })*
            DType::Bool => unreachable!("bool is not a benchmark dtype"),
        }
    };
}

/// Input value number `i` of `rank`: a small integer below `m`.
fn pattern(m: u32, salt: u32, rank: usize, i: usize) -> u32 {
    ((rank as u64 * 7 + i as u64 * 13 + u64::from(salt) * 29 + 1) % u64::from(m)) as u32
}

/// The reduction of `v(0) .. v(n-1)` in rank order, rounded once to T.
fn reduced<T: Val>(op: ReduceOp, n: usize, v: impl Fn(usize) -> f64) -> T {
    let mut acc = v(0);
    for r in 1..n {
        let x = v(r);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x,
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        };
    }
    if op == ReduceOp::Avg {
        acc = T::avg(acc, n);
    }
    T::of(acc)
}

/// One rank's benchmark state.
#[derive(Debug)]
struct Bench<'c> {
    comm: &'c Comm,
    world: Group,
    o: Options,
    n: usize,
    me: usize,
    /// sendrecv's ring neighbours, next and previous (worked out once, as the peer benchmark
    /// does: two 64-bit divisions per call were a few percent of an 8-byte sendrecv).
    ring: (usize, usize),
    /// Roles by op: all_reduce send/recv; reduce_scatter input/output; all_gather
    /// input/output; alltoall send/recv; broadcast buffer/-; sendrecv send/recv; put and
    /// pingpong target (heap)/source.
    a: Region<'c>,
    b: Region<'c>,
    /// Pingpong's signal word.
    sig: Option<SymmBuffer>,
    /// Pingpong's round trips so far (the signal's next value).
    seq: Cell<i64>,
    /// alltoall's per-rank counts at the size being timed (built once per size, not in the
    /// timed loop: the peer benchmark allocates nothing per call either).
    counts: RefCell<Vec<usize>>,
    copts: CollOptions,
    /// The stream every call goes through (`--stream 1`).
    stream: Option<Stream>,
    /// The low-precision format the measured reductions travel in, from the environment
    /// (`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`, where it suits the dtype): the checks then use
    /// values the format carries exactly ([`Bench::modulus`], [`Bench::value`]).
    lp: Option<DType>,
}

impl<'c> Bench<'c> {
    fn new(comm: &'c Comm, o: &Options) -> symm_core::Result<Bench<'c>> {
        let world = comm.world();
        let n = world.size();
        let me = world.member().at(comm.rank())?.index();
        let max = sizes(o).into_iter().map(|s| shape(o.op, s, n, o.dtype).count).max().unwrap_or(0);
        let (ca, cb) = capacities(o.op, max, n);
        let d = o.dtype;
        let targets_in_heap = matches!(o.op, Op::Put | Op::PingPong);
        // A device's heap is reached through the backend's copies alone, and its buffers live
        // there: no host regions, no touching of cache lines.
        let device = comm.heap_space() == MemorySpace::Device;
        let copies = device || o.copies;
        if (device && o.host) || (copies && o.touch) {
            let what = "--host 1 or --touch 1 (host memory options) with buffers reached only through copies \
                        (a device's heap, or --copies 1)";
            return Err(symm_core::Error::Unsupported {
                rank: comm.rank(),
                backend: comm.backend_name(),
                what: what.into(),
            });
        }
        let a =
            if o.host && !targets_in_heap { Region::host(ca, d) } else { Region::heap(comm, &world, ca, d, copies)? };
        let b = if o.host { Region::host(cb, d) } else { Region::heap(comm, &world, cb, d, copies)? };
        let sig = if o.op == Op::PingPong {
            // Of the backend's signal width (Ascend SHMEM's signals are int32).
            let s = if comm.signal_width() == SignalWidth::W32 {
                let s = comm.alloc(&world, 1, DType::I32)?;
                comm.write_local(&s, 0, &[0i32])?;
                s
            } else {
                let s = comm.alloc(&world, 1, DType::I64)?;
                comm.write_local(&s, 0, &[0i64])?;
                s
            };
            Some(s)
        } else {
            None
        };
        comm.barrier(&world)?;
        Ok(Bench {
            comm,
            world,
            o: o.clone(),
            n,
            me,
            ring: ((me + 1) % n, (me + n - 1) % n),
            a,
            b,
            sig,
            seq: Cell::new(0),
            counts: RefCell::new(Vec::new()),
            copts: CollOptions::default(),
            stream: if o.stream { Some(comm.create_stream()?) } else { None },
            lp: lowp::format_from_env()
                .ok()
                .flatten()
                .filter(|&lp| o.op.reduces() && lowp::check_format(lp, o.dtype).is_ok()),
        })
    }

    fn free(self) -> symm_core::Result<()> {
        for buf in [self.a.sym, self.b.sym, self.sig].into_iter().flatten() {
            self.comm.free(buf)?;
        }
        Ok(())
    }

    /// One call of the op on `c` elements per unit (see [`Shape::count`]).
    fn once(&self, form: Form, c: usize) -> symm_core::Result<()> {
        if self.o.touch {
            if let Some((region, at, len)) = self.input(form, c) {
                region.touch(at, len);
            }
        }
        match &self.stream {
            Some(s) => self.once_on(s, form, c),
            None => self.once_blocking(form, c),
        }
    }

    // Inlined into `once`, its one caller: the timed loop's own code is part of every cell, and
    // as a call of its own it made an 8-128 B put up to 5 ns (17 %) slower (paired A/B).
    #[inline(always)]
    fn once_blocking(&self, form: Form, c: usize) -> symm_core::Result<()> {
        let (comm, g, opts, op) = (self.comm, &self.world, &self.copts, self.o.redop);
        let (a, b, n, me) = (&self.a, &self.b, self.n, self.me);
        match (self.o.op, form) {
            (Op::AllReduce, Form::OutOfPlace) => comm.allreduce_into(g, a.r(0, c), b.m(0, c), op, opts),
            (Op::AllReduce, Form::InPlace) => comm.allreduce(g, a.m(0, c), op, opts),
            (Op::ReduceScatter, Form::OutOfPlace) => comm.reduce_scatter(g, b.m(0, c), a.r(0, n * c), op, opts),
            (Op::ReduceScatter, Form::InPlace) => comm.reduce_scatter(g, a.m(me * c, c), a.r(0, n * c), op, opts),
            (Op::AllGather, Form::OutOfPlace) => comm.allgather(g, b.m(0, n * c), a.r(0, c), opts),
            (Op::AllGather, Form::InPlace) => comm.allgather(g, b.m(0, n * c), b.r(me * c, c), opts),
            (Op::AllToAll, _) => {
                let mut counts = self.counts.borrow_mut();
                if counts.len() != n || counts.first() != Some(&c) {
                    *counts = vec![c; n];
                }
                comm.alltoall_single(g, a.r(0, n * c), &counts, b.m(0, n * c), &counts, opts)
            }
            (Op::Broadcast, _) => comm.broadcast(g, a.m(0, c), 0, opts),
            (Op::SendRecv, _) => {
                // A ring, like nccl-tests' sendrecv: every rank sends to the next and receives
                // from the previous one, both at once (with 2 ranks: both directions of one pair).
                let (next, prev) = self.ring;
                comm.sendrecv(g, a.r(0, c), next, b.m(0, c), prev, opts)
            }
            (Op::Put, _) if me == 0 => comm.put(g, a.sym(), 0, b.r(0, c), 0, c, 1),
            (Op::PingPong, _) if me < 2 => {
                let seq = self.seq.get() + 1;
                self.seq.set(seq);
                let sig = self.sig.as_ref().expect("pingpong allocates its signal");
                let send = |peer: usize| {
                    comm.put_with_signal(g, a.sym(), 0, b.r(0, c), 0, c, sig, 0, seq, SignalOp::Set, peer)
                };
                let wait = || comm.wait_until(sig, 0, CmpOp::Ge, seq, None).map(|_| ());
                if me == 0 {
                    send(1)?;
                    wait()
                } else {
                    wait()?;
                    send(0)
                }
            }
            (Op::Put | Op::PingPong, _) => Ok(()),
        }
    }

    /// [`Bench::once_blocking`] through the stream forms, each call enqueued on `s` and waited
    /// for.
    fn once_on(&self, s: &Stream, form: Form, c: usize) -> symm_core::Result<()> {
        let (comm, g, opts, op) = (self.comm, &self.world, &self.copts, self.o.redop);
        let (a, b, n, me) = (&self.a, &self.b, self.n, self.me);
        // SAFETY: every call's buffers are the bench's regions, which outlive it, and the call
        // is waited for before the next touches them.
        let work = unsafe {
            match (self.o.op, form) {
                (Op::AllReduce, Form::OutOfPlace) => comm.allreduce_into_on(s, g, a.r(0, c), b.m(0, c), op, opts)?,
                (Op::AllReduce, Form::InPlace) => comm.allreduce_on(s, g, a.m(0, c), op, opts)?,
                (Op::ReduceScatter, Form::OutOfPlace) => {
                    comm.reduce_scatter_on(s, g, b.m(0, c), a.r(0, n * c), op, opts)?
                }
                (Op::ReduceScatter, Form::InPlace) => {
                    comm.reduce_scatter_on(s, g, a.m(me * c, c), a.r(0, n * c), op, opts)?
                }
                (Op::AllGather, Form::OutOfPlace) => comm.allgather_on(s, g, b.m(0, n * c), a.r(0, c), opts)?,
                (Op::AllGather, Form::InPlace) => comm.allgather_on(s, g, b.m(0, n * c), b.r(me * c, c), opts)?,
                (Op::AllToAll, _) => {
                    let counts = vec![c; n];
                    comm.alltoall_single_on(s, g, a.r(0, n * c), &counts, b.m(0, n * c), &counts, opts)?
                }
                (Op::Broadcast, _) => comm.broadcast_on(s, g, a.m(0, c), 0, opts)?,
                (Op::Put, _) if me == 0 => comm.put_on(s, g, a.sym(), 0, b.r(0, c), 0, c, 1)?,
                (Op::PingPong, _) if me < 2 => {
                    let seq = self.seq.get() + 1;
                    self.seq.set(seq);
                    let sig = self.sig.as_ref().expect("pingpong allocates its signal");
                    let send = |peer: usize| {
                        comm.put_with_signal_on(s, g, a.sym(), 0, b.r(0, c), 0, c, sig, 0, seq, SignalOp::Set, peer)
                    };
                    let wait = || comm.wait_until_on(s, sig, 0, CmpOp::Ge, seq, None);
                    // The stream runs them in order: the last one's wait covers both.
                    if me == 0 {
                        let _sent = send(1)?;
                        wait()?
                    } else {
                        let _seen = wait()?;
                        send(0)?
                    }
                }
                (Op::SendRecv, _) => {
                    let (next, prev) = self.ring;
                    comm.sendrecv_on(s, g, a.r(0, c), next, b.m(0, c), prev, opts)?
                }
                (Op::Put | Op::PingPong, _) => return Ok(()),
            }
        };
        work.wait(None)
    }

    /// The input of one call of `form` at count `c` on this rank (region, first element,
    /// elements), if it has one.
    fn input(&self, form: Form, c: usize) -> Option<(&Region<'c>, usize, usize)> {
        let (a, b, n, me) = (&self.a, &self.b, self.n, self.me);
        match (self.o.op, form) {
            (Op::AllReduce | Op::SendRecv, _) | (Op::AllGather, Form::OutOfPlace) => Some((a, 0, c)),
            (Op::ReduceScatter | Op::AllToAll, _) => Some((a, 0, n * c)),
            (Op::AllGather, Form::InPlace) => Some((b, me * c, c)),
            (Op::Broadcast, _) => (me == 0).then_some((a, 0, c)),
            (Op::Put, _) => (me == 0).then_some((b, 0, c)),
            (Op::PingPong, _) => (me < 2).then_some((b, 0, c)),
        }
    }

    /// Seconds per iteration of `form` (one-way for pingpong), on this rank.
    fn time(&self, form: Form, c: usize, iters: usize, warmup: usize) -> symm_core::Result<f64> {
        self.comm.barrier(&self.world)?;
        for _ in 0..warmup {
            self.once(form, c)?;
        }
        self.comm.quiet()?;
        self.comm.barrier(&self.world)?;
        let t0 = Instant::now();
        for _ in 0..iters {
            self.once(form, c)?;
        }
        self.comm.quiet()?;
        let per_iter = t0.elapsed().as_secs_f64() / iters as f64;
        Ok(if self.o.op == Op::PingPong { per_iter / 2.0 } else { per_iter })
    }

    /// Modulus of the input values: sums stay exact and within range, in the dtype and in the
    /// low-precision format the reduction travels in (whose per-block power-of-two scales keep
    /// integers exact: [`lowp::exact_integers`]).
    fn modulus<T: Val>(&self) -> u32 {
        let sums = self.o.op.reduces() && matches!(self.o.redop, ReduceOp::Sum | ReduceOp::Avg);
        let exact = self.exact::<T>();
        let m = if self.low_precision_average() {
            // A mean and offsets that cancel: every input, at most 2 (m - 1), is exact. Only
            // inputs travel encoded; sums stay in the accumulator, results in the dtype.
            exact / 2
        } else if sums {
            exact / self.n as u32
        } else {
            exact
        };
        m.clamp(2, 97)
    }

    /// The largest integer every reduction of `T` carries exactly: the dtype's, and the
    /// low-precision format's where the reduction travels in one.
    fn exact<T: Val>(&self) -> u32 {
        self.lp.map_or(T::EXACT, |lp| T::EXACT.min(lowp::exact_integers(lp)))
    }

    /// An average whose inputs travel in low precision: the exact check needs inputs the format
    /// carries and an average it can state exactly (that of arbitrary values, 1/3 say, is not),
    /// so the ranks' inputs are a common mean with offsets that cancel ([`Bench::value`]).
    fn low_precision_average(&self) -> bool {
        self.lp.is_some() && self.o.redop == ReduceOp::Avg
    }

    /// Input element `i` of rank `r` (modulus `m`, `salt`): the pattern, except under low
    /// precision, where every result must be one the format carries exactly:
    /// - an average: a mean `x` plus `d` on even ranks and minus `d` on odd ones (the pairs'
    ///   offsets differ; an odd last rank takes `x`), so the average is `x`;
    /// - a sum with more ranks than the largest exact integer: values (0 or 1) from the first
    ///   `exact` ranks only.
    fn value<T: Val>(&self, m: u32, salt: u32, r: usize, i: usize) -> f64 {
        if self.low_precision_average() {
            let mean = f64::from(pattern(m, salt, 0, i));
            let d = f64::from(pattern(m, salt, r / 2 + 1, i));
            let sign = if r % 2 == 1 {
                -1.0
            } else if r + 1 == self.n {
                0.0
            } else {
                1.0
            };
            return mean + sign * d;
        }
        let sums = self.o.op.reduces() && self.o.redop == ReduceOp::Sum;
        let exact = self.exact::<T>() as usize;
        if self.lp.is_some() && sums && self.n > exact && r >= exact {
            return 0.0;
        }
        f64::from(pattern(m, salt, r, i))
    }

    /// Fills every buffer used at count `c` with rank-dependent values (untimed; also faults
    /// the pages in before the warm-ups).
    fn prepare(&self, c: usize) -> symm_core::Result<()> {
        by_dtype!(self.o.dtype, T => {
            let m = self.modulus::<T>();
            let (ca, cb) = capacities(self.o.op, c, self.n);
            let me = self.me;
            self.a.fill::<T>(0, ca, |i| T::of(self.value::<T>(m, 0, me, i)))?;
            self.b.fill::<T>(0, cb, |i| T::of(self.value::<T>(m, 0, me, i)))
        })
    }

    /// Runs `form` once on fresh inputs and poisoned outputs; this rank's wrong elements.
    fn check(&self, form: Form, c: usize, salt: u32) -> symm_core::Result<u64> {
        by_dtype!(self.o.dtype, T => self.check_typed::<T>(form, c, salt))
    }

    fn check_typed<T: Val>(&self, form: Form, c: usize, salt: u32) -> symm_core::Result<u64> {
        let (a, b, n, me, redop) = (&self.a, &self.b, self.n, self.me, self.o.redop);
        let m = self.modulus::<T>();
        let v = |r: usize, i: usize| self.value::<T>(m, salt, r, i);
        let pat = |r: usize, i: usize| T::of(v(r, i));
        let red = |i: usize| reduced::<T>(redop, n, |r| v(r, i));
        match (self.o.op, form) {
            (Op::AllReduce, Form::OutOfPlace) | (Op::ReduceScatter, Form::OutOfPlace) => {
                a.fill(0, capacities(self.o.op, c, n).0, |i| pat(me, i))?;
                b.poison(0, c)?;
            }
            (Op::AllReduce, Form::InPlace) => a.fill(0, c, |i| pat(me, i))?,
            (Op::ReduceScatter, Form::InPlace) => a.fill(0, n * c, |i| pat(me, i))?,
            (Op::AllGather, Form::OutOfPlace) => {
                a.fill(0, c, |j| pat(me, j))?;
                b.poison(0, n * c)?;
            }
            (Op::AllGather, Form::InPlace) => {
                b.poison(0, n * c)?;
                b.fill(me * c, c, |j| pat(me, j))?;
            }
            (Op::AllToAll, _) => {
                a.fill(0, n * c, |i| pat(me, i))?;
                b.poison(0, n * c)?;
            }
            (Op::Broadcast, _) if me == 0 => a.fill(0, c, |i| pat(0, i))?,
            (Op::Broadcast, _) => a.poison(0, c)?,
            (Op::SendRecv, _) | (Op::PingPong, _) => {
                let (src, dst) = if self.o.op == Op::SendRecv { (a, b) } else { (b, a) };
                src.fill(0, c, |i| pat(me, i))?;
                dst.poison(0, c)?;
            }
            (Op::Put, _) => {
                if me == 0 {
                    b.fill(0, c, |i| pat(0, i))?;
                }
                a.poison(0, c)?;
            }
        }
        // Every rank's inputs and poisoned outputs are in place before anyone starts.
        self.comm.barrier(&self.world)?;
        self.once(form, c)?;
        self.comm.quiet()?;
        self.comm.barrier(&self.world)?;
        match (self.o.op, form) {
            (Op::AllReduce, Form::OutOfPlace) => b.count_wrong(0, c, red),
            (Op::AllReduce, Form::InPlace) => a.count_wrong(0, c, red),
            (Op::ReduceScatter, Form::OutOfPlace) => b.count_wrong(0, c, |j| red(me * c + j)),
            (Op::ReduceScatter, Form::InPlace) => a.count_wrong(me * c, c, |j| red(me * c + j)),
            (Op::AllGather, _) => b.count_wrong(0, n * c, |i| pat(i / c, i % c)),
            (Op::AllToAll, _) => b.count_wrong(0, n * c, |i| pat(i / c, me * c + i % c)),
            (Op::Broadcast, _) => a.count_wrong(0, c, |i| pat(0, i)),
            (Op::SendRecv, _) => b.count_wrong(0, c, |i| pat((me + n - 1) % n, i)),
            (Op::Put, _) if me == 1 => a.count_wrong(0, c, |i| pat(0, i)),
            (Op::PingPong, _) if me < 2 => a.count_wrong(0, c, |i| pat(1 - me, i)),
            (Op::Put | Op::PingPong, _) => Ok(0),
        }
    }

    /// Measures one size on every rank; the row (agreed by all ranks).
    fn measure(&self, size: usize, index: usize) -> symm_core::Result<Row> {
        let shape = shape(self.o.op, size, self.n, self.o.dtype);
        let (iters, warmup) = (iters_for(&self.o, shape.bytes), warmup_for(&self.o, shape.bytes));
        let c = shape.count;
        self.prepare(c)?;
        let forms: &[Form] =
            if self.o.op.has_in_place() { &[Form::OutOfPlace, Form::InPlace] } else { &[Form::OutOfPlace] };
        let (mut times, mut wrong) = (vec![0.0f64; 2], vec![0i64; 2]);
        for (k, &form) in forms.iter().enumerate() {
            times[k] = self.time(form, c, iters, warmup)?;
            if self.o.check {
                let salt = 1 + 2 * index as u32 + k as u32;
                wrong[k] = self.check(form, c, salt)? as i64;
            }
        }
        // Outside the timed loops: the slowest rank's time, the total of wrong elements.
        // The bookkeeping in full precision: a transport format from the environment is for
        // the measured calls.
        let exact = CollOptions::full_precision();
        self.comm.allreduce(&self.world, LocalMut::from(&mut times), ReduceOp::Max, &exact)?;
        self.comm.allreduce(&self.world, LocalMut::from(&mut wrong), ReduceOp::Sum, &exact)?;
        let has = |k: usize| k < forms.len();
        Ok(Row {
            shape,
            iters,
            warmup,
            time: [0, 1].map(|k| has(k).then_some(times[k])),
            wrong: [0, 1].map(|k| (has(k) && self.o.check).then_some(wrong[k] as u64)),
        })
    }
}

/// nccl-tests' time format: fewer decimals for longer times, and a third one below a
/// microsecond, where calls differ by nanoseconds.
fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else if us >= 1.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.3}")
    }
}

/// Table header lines (nccl-tests layout plus the bound columns).
fn table_header() -> [String; 3] {
    const WIDTHS: [usize; 16] = [11, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6, 9, 6, 6];
    let line = |names: &str| {
        let cols: Vec<String> = names.split(',').zip(WIDTHS).map(|(name, w)| format!("{name:>w$}")).collect();
        format!("#{}", cols.join("  "))
    };
    [
        format!("#{:50}{:^38}{:^38}{:^25}", "", "out-of-place", "in-place", "memory bound"),
        line("size,count,type,redop,root,time,algbw,busbw,#wrong,time,algbw,busbw,#wrong,bound,%oop,%ip"),
        line("(B),(elements),,,,(us),(GB/s),(GB/s),,(us),(GB/s),(GB/s),,(us),,"),
    ]
}

const CSV_HEADER: &str = "op,ranks,dtype,redop,root,size_bytes,count,iters,warmup,oop_time_us,oop_algbw_gbps,\
oop_busbw_gbps,oop_wrong,ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong,oop_bound_us,ip_bound_us,oop_pct_bound,\
ip_pct_bound,buffers,pinned";

/// Derived figures of one form: time (us), algbw, busbw, bound (us), %bound.
fn figures(o: &Options, n: usize, row: &Row, k: usize, limits: Option<&Limits>) -> Option<[f64; 5]> {
    let t = row.time[k]?;
    let s = row.shape.bytes as f64;
    let algbw = s / t.max(1e-12) / 1e9;
    let bound = limits.map_or(f64::NAN, |l| bound(l, o.op, k == 1, s, n));
    Some([t * 1e6, algbw, algbw * o.op.bus_factor(n), bound * 1e6, 100.0 * bound / t.max(1e-12)])
}

fn table_line(o: &Options, n: usize, row: &Row, limits: Option<&Limits>) -> String {
    let mut line = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        row.shape.bytes,
        row.shape.count,
        type_name(o.dtype),
        o.redop_name(),
        o.op.root()
    );
    let mut pct = [String::from("N/A"), String::from("N/A")];
    let mut bound = String::from("N/A");
    for (k, pct) in pct.iter_mut().enumerate() {
        match figures(o, n, row, k, limits) {
            Some([t, algbw, busbw, b, p]) => {
                let wrong = row.wrong[k].map_or("N/A".to_string(), |w| w.to_string());
                line += &format!("  {:>7}  {algbw:>6.2}  {busbw:>6.2}  {wrong:>6}", fmt_time(t));
                if k == 0 && b.is_finite() {
                    bound = fmt_time(b);
                }
                if p.is_finite() {
                    *pct = format!("{p:.1}");
                }
            }
            None => line += &format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A"),
        }
    }
    line += &format!("  {bound:>9}  {:>6}  {:>6}", pct[0], pct[1]);
    line
}

fn csv_line(o: &Options, n: usize, row: &Row, limits: Option<&Limits>) -> String {
    let mut f: Vec<String> = vec![
        o.op.name().into(),
        n.to_string(),
        type_name(o.dtype).into(),
        o.redop_name().into(),
        o.op.root().to_string(),
        row.shape.bytes.to_string(),
        row.shape.count.to_string(),
        row.iters.to_string(),
        row.warmup.to_string(),
    ];
    let figs = [0, 1].map(|k| figures(o, n, row, k, limits));
    let num = |x: f64| if x.is_finite() { format!("{x:.4}") } else { String::new() };
    for (k, fig) in figs.iter().enumerate() {
        match fig {
            Some([t, algbw, busbw, ..]) => {
                f.extend([num(*t), num(*algbw), num(*busbw)]);
                f.push(row.wrong[k].map_or(String::new(), |w| w.to_string()));
            }
            None => f.extend([String::new(), String::new(), String::new(), String::new()]),
        }
    }
    for i in [3, 4] {
        for fig in &figs {
            f.push(fig.map_or(String::new(), |x| num(x[i])));
        }
    }
    f.push(if o.host { "host" } else { "heap" }.into());
    f.push(if o.pin { "1" } else { "0" }.into());
    f.join(",")
}

/// One rank's run: every size, printed by rank 0; the rows.
fn rank_main(comm: &Comm, o: &Options, limits: Option<&Limits>, out: &Out) -> symm_core::Result<Vec<Row>> {
    let bench = Bench::new(comm, o)?;
    let (n, me) = (bench.n, bench.me);
    let print = me == 0;
    if print {
        if o.csv {
            out.data(CSV_HEADER);
        } else {
            out.note("#");
            for l in table_header() {
                out.note(&l);
            }
        }
    }
    let mut rows = Vec::new();
    for (index, size) in sizes(o).into_iter().enumerate() {
        let row = bench.measure(size, index)?;
        if print {
            out.data(&if o.csv { csv_line(o, n, &row, limits) } else { table_line(o, n, &row, limits) });
        }
        rows.push(row);
    }
    bench.free()?;
    if print {
        let wrong: u64 = rows.iter().flat_map(|r| r.wrong.iter().flatten()).sum();
        let busbw: Vec<f64> =
            rows.iter().flat_map(|r| (0..2).filter_map(|k| figures(o, n, r, k, None).map(|f| f[2]))).collect();
        let avg = if busbw.is_empty() { 0.0 } else { busbw.iter().sum::<f64>() / busbw.len() as f64 };
        out.note(&format!("# Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" }));
        out.note(&format!("# Avg bus bandwidth    : {avg:.4} "));
        out.note("#");
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_default_like_nccl_tests_and_parse_every_flag() {
        let o = parse_args(&args(&["all_reduce"])).unwrap();
        assert_eq!((o.op, o.min_bytes, o.max_bytes, o.factor, o.ranks), (Op::AllReduce, 8, 64 << 20, 2, 2));
        assert_eq!((o.dtype, o.redop, o.iters, o.warmup), (DType::F32, ReduceOp::Sum, 20, 5));
        assert!(o.check && o.pin && !o.host && !o.csv);
        let flags =
            "-b 1K -e 2M -f 4 -g 8 -d bfloat16 -o max -n 7 -w 0 -c 0 --pin 0 --host 1 --csv reduce_scatter_perf";
        let o = parse_args(&args(&flags.split(' ').collect::<Vec<_>>())).unwrap();
        assert_eq!((o.op, o.min_bytes, o.max_bytes, o.factor, o.ranks), (Op::ReduceScatter, 1024, 2 << 20, 4, 8));
        assert_eq!((o.dtype, o.redop, o.iters, o.warmup), (DType::BF16, ReduceOp::Max, 7, 0));
        assert!(!o.check && !o.pin && o.host && o.csv);
        for (name, d) in [("half", DType::F16), ("double", DType::F64), ("int8", DType::I8), ("uint8", DType::U8)] {
            assert_eq!(parse_args(&args(&["allgather", "-d", name])).unwrap().dtype, d);
        }
        for op in Op::ALL {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
    }

    #[test]
    fn bad_arguments_are_errors_naming_them() {
        let err = |v: &[&str]| parse_args(&args(v)).unwrap_err().to_string();
        assert!(err(&[]).contains("<op>"));
        assert!(err(&["reduce"]).contains("unknown op"));
        assert!(err(&["all_reduce", "-o", "avg", "-d", "int32"]).contains("avg"));
        assert!(err(&["all_reduce", "-d", "bool"]).contains("bool"));
        assert!(err(&["sendrecv", "-g", "1"]).contains("at least 2"));
        assert!(err(&["put", "-b", "1M", "-e", "1K"]).contains("larger"));
        assert!(err(&["put", "-f", "1"]).contains("--stepfactor"));
        assert!(err(&["put", "-c", "2"]).contains("0 or 1"));
        assert!(err(&["put", "-n"]).contains("a value is required for '--iters"));
        assert!(err(&["put", "--fast", "1"]).contains("--fast"));
        assert_eq!(parse_args(&args(&["-h"])).unwrap_err().kind(), clap::error::ErrorKind::DisplayHelp);
    }

    #[test]
    fn sizes_shapes_and_iterations() {
        let o = parse_args(&args(&["all_gather", "-b", "8", "-e", "100"])).unwrap();
        assert_eq!(sizes(&o), [8, 16, 32, 64]);
        // Split ops round down to whole parts; the count is one part's.
        assert_eq!(shape(Op::AllGather, 100, 4, DType::F32), Shape { bytes: 96, count: 6 });
        assert_eq!(shape(Op::AllGather, 8, 8, DType::F32), Shape { bytes: 0, count: 0 });
        assert_eq!(shape(Op::AllReduce, 10, 4, DType::F32), Shape { bytes: 8, count: 2 });
        let o = parse_args(&args(&["all_reduce"])).unwrap();
        assert_eq!((iters_for(&o, 4096), iters_for(&o, 1 << 20), iters_for(&o, 64 << 20)), (20, 20, 4));
        assert_eq!(iters_for(&o, 1 << 30), 3);
        assert_eq!((warmup_for(&o, 8), warmup_for(&o, 64 << 20)), (5, 1));
        assert_eq!(heap_bytes(64 << 20), 320 << 20);
    }

    /// Rates of 1 GB/s per thread, 2 GB/s for two threads, at every working set.
    fn limits() -> Limits {
        Limits::decode("2;0;4096:1e9,1e9:2e9,2e9").unwrap()
    }

    #[test]
    fn the_bound_column_is_the_shared_model() {
        let o = parse_args(&args(&["all_gather"])).unwrap();
        let row = Row {
            shape: Shape { bytes: 1 << 20, count: 1 << 17 },
            iters: 20,
            warmup: 5,
            time: [Some(1e-3), Some(1e-3)],
            wrong: [Some(0), Some(0)],
        };
        let l = limits();
        for (k, in_place) in [(0, false), (1, true)] {
            let want = l.bound(membw::traffic(Op::AllGather, in_place, (1 << 20) as f64, 2));
            assert_eq!(figures(&o, 2, &row, k, Some(&l)).unwrap()[3], want * 1e6);
        }
        // Out of place on 2 ranks: 2 MiB written, 1 MiB by one rank at 1 GB/s, 2 by both at 2.
        assert_eq!(bound(&l, Op::AllGather, false, (1 << 20) as f64, 2), (1 << 20) as f64 / 1e9);
        assert_eq!(limits_from_env(), None);
    }

    #[test]
    fn expected_reductions_round_like_the_library() {
        assert_eq!(reduced::<f32>(ReduceOp::Sum, 3, |r| r as f64 + 1.0), 6.0);
        assert_eq!(reduced::<i8>(ReduceOp::Max, 3, |r| 5.0 - r as f64), 5);
        assert_eq!(reduced::<u8>(ReduceOp::Min, 3, |r| 5.0 - r as f64), 3);
        assert_eq!(reduced::<f64>(ReduceOp::Avg, 3, |r| r as f64), 1.0);
        assert_eq!(reduced::<f16>(ReduceOp::Avg, 3, |r| r as f64 + 1.0), f16::from_f32(6.0 / 3.0));
        // 9 is not representable in e5m2: one rounding from the exact sum.
        assert_eq!(reduced::<F8E5M2>(ReduceOp::Sum, 9, |_| 1.0), F8E5M2::from_f32(9.0));
    }

    fn run(op: &str, extra: &[&str], ranks: usize) -> Vec<Row> {
        let mut v = vec![op, "-e", "4K", "-n", "2", "-w", "1", "--pin", "0"];
        v.extend_from_slice(extra);
        let o = parse_args(&args(&v)).unwrap();
        let l = limits();
        let out = Out { csv: false, quiet: true };
        let config = symm_registry::CommConfig::with_heap_size(48 << 20);
        let mut results = symm_registry::run_in_process(ranks, config, |comm| rank_main(&comm, &o, Some(&l), &out));
        let rows = results.remove(0).and_then(|r| r).unwrap_or_else(|e| panic!("{op} {extra:?}: {e}"));
        for r in results {
            r.and_then(|r| r).unwrap_or_else(|e| panic!("{op} {extra:?}: {e}"));
        }
        rows
    }

    fn assert_all_right(rows: &[Row], what: &str) {
        assert!(!rows.is_empty(), "{what}");
        for row in rows {
            assert!(row.time[0].is_some(), "{what}: {row:?}");
            for w in row.wrong.iter().flatten() {
                assert_eq!(*w, 0, "{what}: {row:?}");
            }
        }
    }

    #[test]
    fn every_op_checks_clean_on_heap_and_host_buffers() {
        // Heap buffers loaded and stored directly, host vectors, and heap buffers reached only
        // through the backend's copies (as on a device).
        for op in Op::ALL {
            for args in [["--host", "0"], ["--host", "1"], ["--copies", "1"]] {
                let rows = run(op.name(), &args, 2);
                assert_all_right(&rows, &format!("{} {args:?}", op.name()));
                assert_eq!(rows[0].wrong[1].is_some(), op.has_in_place(), "{}", op.name());
            }
        }
    }

    #[test]
    fn every_op_with_a_stream_form_checks_clean_through_it() {
        for op in Op::ALL {
            let rows = run(op.name(), &["--stream", "1"], 3.max(op.min_ranks()));
            assert_all_right(&rows, &format!("{} --stream 1", op.name()));
        }
    }

    #[test]
    fn reductions_check_clean_for_every_dtype_and_op_on_three_ranks() {
        for dtype in ["float", "double", "half", "bfloat16", "f8e4m3", "f8e5m2", "int8", "uint8", "int16", "int64"] {
            for redop in ["sum", "max", "min", "avg"] {
                if redop == "avg" && dtype.starts_with(['i', 'u']) {
                    continue;
                }
                for op in ["all_reduce", "reduce_scatter"] {
                    let rows = run(op, &["-d", dtype, "-o", redop, "-b", "64"], 3);
                    assert_all_right(&rows, &format!("{op} {dtype} {redop}"));
                }
            }
        }
    }

    #[test]
    fn data_movement_ops_check_clean_on_three_ranks() {
        for op in ["all_gather", "alltoall", "broadcast", "sendrecv", "put", "pingpong"] {
            let rows = run(op, &["-d", "half", "-b", "64"], 3);
            assert_all_right(&rows, op);
        }
    }

    #[test]
    fn a_wrong_result_is_counted() {
        // The check's own counter: a poisoned region compares wrong everywhere.
        let r = Region::host(16, DType::F32);
        r.poison(0, 16).unwrap();
        assert_eq!(r.count_wrong::<f32>(0, 16, |_| 0.0).unwrap(), 16);
        r.fill::<f32>(0, 16, |i| i as f32).unwrap();
        assert_eq!(r.count_wrong::<f32>(0, 16, |i| i as f32).unwrap(), 0);
    }

    #[test]
    fn table_and_csv_lines_have_every_column() {
        let o = parse_args(&args(&["all_reduce"])).unwrap();
        let row = Row {
            shape: Shape { bytes: 1 << 20, count: 1 << 18 },
            iters: 20,
            warmup: 5,
            time: [Some(1e-3), Some(2e-3)],
            wrong: [Some(0), Some(0)],
        };
        let l = limits();
        let line = table_line(&o, 2, &row, Some(&l));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 16, "{line}");
        assert_eq!(&cols[..9], ["1048576", "262144", "float", "sum", "-1", "1000.0", "1.05", "1.05", "0"]);
        assert_eq!(csv_line(&o, 2, &row, Some(&l)).split(',').count(), CSV_HEADER.split(',').count());
        let header = table_header();
        assert_eq!(header[1].split_whitespace().count(), 17); // '#' + 16 names
        let o = parse_args(&args(&["alltoall"])).unwrap();
        let row = Row { time: [Some(1e-3), None], wrong: [Some(0), None], ..row };
        assert!(table_line(&o, 2, &row, None).contains("N/A"));
    }
}
