//! The memory-bandwidth bound of a collective on this host, the one model `symm-bench` and
//! `python -m symm.perf` report against: the least bytes a call must read and write
//! ([`traffic`]) at the rates this host's memory reads, writes and copies, measured STREAM-style
//! by working-set size ([`Limits::measure`]). A call cannot take less than [`Limits::bound`]; the
//! model and its reasons are in docs/performance.md, "The memory-bandwidth bound".

use std::fmt;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::sys::{allowed_cpus, pin_to};

/// The operations the benchmarks time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    SendRecv,
    Broadcast,
    /// One rank puts into another's heap.
    Put,
    /// One way of a `put_with_signal` ping-pong.
    PingPong,
}

impl Coll {
    pub const ALL: [Coll; 8] = [
        Coll::AllReduce,
        Coll::ReduceScatter,
        Coll::AllGather,
        Coll::AllToAll,
        Coll::SendRecv,
        Coll::Broadcast,
        Coll::Put,
        Coll::PingPong,
    ];

    /// The benchmarks' name (nccl-tests').
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllGather => "all_gather",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
            Coll::Broadcast => "broadcast",
            Coll::Put => "put",
            Coll::PingPong => "pingpong",
        }
    }

    pub fn from_name(name: &str) -> Option<Coll> {
        Coll::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The least memory traffic of one call, all ranks together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// Bytes that must be read: every input byte once.
    pub read: f64,
    /// Bytes that must be written: every output byte that changes, once.
    pub written: f64,
    /// Distinct bytes of the inputs and outputs: where repeated calls find them (cache or DRAM).
    pub footprint: f64,
    /// Ranks that can share the work: all for a collective, the caller alone for put.
    pub workers: usize,
}

/// The least traffic of `op` on `bytes` (nccl-tests' size: the buffer, or for reduce_scatter,
/// all_gather and alltoall the total over the ranks' parts) among `ranks` ranks. `in_place`
/// matters for all_reduce, reduce_scatter and all_gather; broadcast is in place by nature, the
/// others have one form. Reductions (sum, avg, ...) read each input once and write each output
/// once like any other op.
pub fn traffic(op: Coll, in_place: bool, bytes: f64, ranks: usize) -> Traffic {
    let (s, n) = (bytes, ranks.max(1) as f64);
    let nothing = ranks <= 1 && (in_place || op == Coll::Broadcast);
    let (read, written, footprint) = match op {
        _ if nothing && op != Coll::Put && op != Coll::PingPong => (0.0, 0.0, 0.0),
        Coll::AllReduce if in_place => (n * s, n * s, n * s),
        Coll::AllReduce | Coll::AllToAll | Coll::SendRecv => (n * s, n * s, 2.0 * n * s),
        Coll::ReduceScatter if in_place => (n * s, s, n * s),
        Coll::ReduceScatter => (n * s, s, n * s + s),
        Coll::AllGather if in_place => (s, (n - 1.0) * s, n * s),
        Coll::AllGather => (s, n * s, s + n * s),
        Coll::Broadcast => (s, (n - 1.0) * s, n * s),
        Coll::Put | Coll::PingPong => (s, s, 2.0 * s),
    };
    let workers = if matches!(op, Coll::Put | Coll::PingPong) { 1 } else { ranks.max(1) };
    Traffic { read, written, footprint, workers }
}

/// Rates of one working-set size, bytes per second, each the best any kernel reached: reading
/// (alone, or the reads of a copy or a sum) and writing (alone, or the writes of a copy or a
/// sum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub read: f64,
    pub write: f64,
}

impl Rates {
    /// The least seconds to read `read` and write `written` bytes: neither direction faster
    /// than any kernel went. Reading and writing count as independent: in the caches a mix
    /// moves more bytes in total than any kernel measured (docs/performance.md, "The
    /// memory-bandwidth bound").
    pub fn seconds(&self, read: f64, written: f64) -> f64 {
        (read / self.read).max(written / self.write)
    }

    fn max(self, o: Rates) -> Rates {
        Rates { read: self.read.max(o.read), write: self.write.max(o.write) }
    }
}

/// The rates of one working-set size (bytes, all threads together) for one thread and for
/// [`Limits::threads`] threads at once (the sum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Level {
    pub bytes: usize,
    pub one: Rates,
    pub all: Rates,
}

/// The host's memory rates by working-set size.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Threads of [`Level::all`].
    pub threads: usize,
    /// Whether every measuring thread ran pinned to its own CPU.
    pub pinned: bool,
    levels: Vec<Level>,
}

/// Working sets measured: every cache level's and DRAM's (256 MiB is 8x the largest L3 of
/// one die on the CPUs symm targets; larger sets run at the same DRAM rate).
const LEVELS: [usize; 9] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20];
/// Bytes one thread moves per timed round at least (small sets repeat their pass).
const ROUND_BYTES: usize = 16 << 20;
/// Timed rounds per kernel and level (the best counts), after one untimed pass.
const ROUNDS: usize = 6;

impl Limits {
    /// Levels as measured (or given); each level's rates are raised to those of any larger
    /// level, so that a rate never rises with the working set, and the rates of all threads to
    /// those of one (the others could idle).
    pub fn new(threads: usize, pinned: bool, levels: Vec<Level>) -> Option<Limits> {
        let ok = |r: &Rates| [r.read, r.write].iter().all(|x| x.is_finite() && *x > 0.0);
        let valid = threads > 0 && !levels.is_empty() && levels.iter().all(|l| ok(&l.one) && ok(&l.all));
        valid.then(|| Limits::envelope(threads, pinned, levels))
    }

    /// [`Limits::new`] for levels whose rates are known to be positive.
    fn envelope(threads: usize, pinned: bool, mut levels: Vec<Level>) -> Limits {
        levels.sort_by_key(|l| l.bytes);
        for l in &mut levels {
            l.all = l.all.max(l.one);
        }
        for i in (1..levels.len()).rev() {
            let next = levels[i];
            levels[i - 1].one = levels[i - 1].one.max(next.one);
            levels[i - 1].all = levels[i - 1].all.max(next.all);
        }
        Limits { threads, pinned, levels }
    }

    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// Measures with one thread and with `threads` (at most the CPUs this process may use), each
    /// pinned to its own CPU when `pin` and the affinity call allows.
    pub fn measure(threads: usize, pin: bool) -> Limits {
        let cpus = allowed_cpus().unwrap_or_default();
        let threads = threads.clamp(1, cpus.len().max(1));
        let pin_on: &[usize] = if pin { &cpus } else { &[] };
        let (one, pinned_one) = measure_threads(1, pin_on);
        let (all, pinned_all) = if threads == 1 { (one.clone(), pinned_one) } else { measure_threads(threads, pin_on) };
        let levels = LEVELS.iter().zip(one.iter().zip(&all)).map(|(&bytes, (&one, &all))| Level { bytes, one, all });
        Limits::envelope(threads, pin && pinned_one && pinned_all, levels.collect())
    }

    /// The rates of the level a working set of `bytes` falls in: the largest level no larger.
    fn at(&self, bytes: f64) -> &Level {
        self.levels.iter().rev().find(|l| l.bytes as f64 <= bytes).unwrap_or(&self.levels[0])
    }

    /// Seconds that `t` takes at least: the busiest rank's share on one thread (its part of the
    /// footprint deciding its level), and the whole on up to [`Limits::threads`] threads.
    pub fn bound(&self, t: Traffic) -> f64 {
        let w = t.workers.max(1) as f64;
        let one = self.at(t.footprint / w).one.seconds(t.read / w, t.written / w);
        let all = if t.workers > 1 { self.at(t.footprint).all.seconds(t.read, t.written) } else { 0.0 };
        one.max(all)
    }

    /// A compact form for the environment or a file, read back by [`Limits::decode`].
    pub fn encode(&self) -> String {
        let r = |r: &Rates| format!("{},{}", r.read, r.write);
        let levels: Vec<String> =
            self.levels.iter().map(|l| format!("{}:{}:{}", l.bytes, r(&l.one), r(&l.all))).collect();
        format!("{};{};{}", self.threads, u8::from(self.pinned), levels.join(";"))
    }

    pub fn decode(text: &str) -> Option<Limits> {
        let mut parts = text.trim().split(';');
        let threads = parts.next()?.parse().ok()?;
        let pinned = parts.next()? == "1";
        let rates = |s: &str| {
            let v: Vec<f64> = s.split(',').map(str::parse).collect::<Result<_, _>>().ok()?;
            (v.len() == 2).then(|| Rates { read: v[0], write: v[1] })
        };
        let levels = parts
            .map(|p| {
                let mut f = p.split(':');
                let level = Level { bytes: f.next()?.parse().ok()?, one: rates(f.next()?)?, all: rates(f.next()?)? };
                f.next().is_none().then_some(level)
            })
            .collect::<Option<Vec<Level>>>()?;
        Limits::new(threads, pinned, levels)
    }
}

/// The table of rates, one line per level, GB/s.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "memory rates, GB/s (STREAM-style: the best of read-only, write, copy and sum kernels, streaming and \
             cached stores): 1 thread | {} threads{}",
            self.threads,
            if self.pinned { ", pinned" } else { "" }
        )?;
        let g = |r: &Rates| format!("read {:6.1}  write {:6.1}", r.read / 1e9, r.write / 1e9);
        for l in &self.levels {
            writeln!(f, "  working set {:>7}: {} | {}", human(l.bytes), g(&l.one), g(&l.all))?;
        }
        Ok(())
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One cache line, aligned: the unit of the kernels.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// A measuring pass; `true`: with streaming (non-temporal) stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Read,
    Write(bool),
    Copy(bool),
    /// The sum of two arrays into a third: a reduction's mix.
    Add(bool),
}

const KERNELS: [Kernel; 7] = {
    use Kernel::*;
    [Read, Write(true), Write(false), Copy(true), Copy(false), Add(true), Add(false)]
};

/// Rates of every level with `threads` threads, each on its own share of the working set;
/// whether every thread was pinned.
fn measure_threads(threads: usize, cpus: &[usize]) -> (Vec<Rates>, bool) {
    let barrier = Barrier::new(threads);
    let lines_max = LEVELS[LEVELS.len() - 1] / threads / 64;
    // Per thread: per level, per kernel, the rounds' times and reps.
    let per_thread: Vec<(Vec<Vec<Duration>>, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let pinned = !cpus.is_empty() && pin_to(cpus[t % cpus.len()]).is_ok();
                    let mut buf = vec![Line([t as u64 + 1; 8]); lines_max];
                    let times = LEVELS
                        .iter()
                        .flat_map(|&level| KERNELS.map(|k| (level, k)))
                        .map(|(level, k)| {
                            let lines = (level / threads / 64).max(3);
                            let reps = (ROUND_BYTES / (lines * 64)).max(1);
                            let part = &mut buf[..lines];
                            (0..=ROUNDS)
                                .map(|_| {
                                    barrier.wait();
                                    let t0 = Instant::now();
                                    for _ in 0..reps {
                                        run(k, part);
                                    }
                                    t0.elapsed()
                                })
                                .skip(1)
                                .collect()
                        })
                        .collect();
                    (times, pinned)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let pinned = per_thread.iter().all(|(_, p)| *p);
    let rates = LEVELS
        .iter()
        .enumerate()
        .map(|(li, &level)| {
            let lines = (level / threads / 64).max(3);
            let reps = (ROUND_BYTES / (lines * 64)).max(1);
            let rate = |ki: usize| {
                // A copy moves whole halves, a sum whole thirds of the lines.
                let used = match KERNELS[ki] {
                    Kernel::Copy(_) => lines / 2 * 2,
                    Kernel::Add(_) => lines / 3 * 3,
                    _ => lines,
                };
                let moved = (threads * used * 64 * reps) as f64;
                let best = (0..ROUNDS)
                    .map(|r| per_thread.iter().map(|(t, _)| t[li * KERNELS.len() + ki][r]).max().unwrap_or_default())
                    .min()
                    .unwrap_or_default();
                moved / best.as_secs_f64().max(1e-9)
            };
            // A copy reads and writes half of what it moves, a sum two thirds and one third.
            let (copy, add) = (rate(3).max(rate(4)), rate(5).max(rate(6)));
            Rates {
                read: rate(0).max(copy / 2.0).max(add * 2.0 / 3.0),
                write: rate(1).max(rate(2)).max(copy / 2.0).max(add / 3.0),
            }
        })
        .collect();
    (rates, pinned)
}

/// One pass of `k` over `buf` (a copy reads the first half and writes the second, a sum reads
/// the first two thirds and writes the last).
fn run(k: Kernel, buf: &mut [Line]) {
    match k {
        Kernel::Read => {
            std::hint::black_box(read(std::hint::black_box(&*buf)));
        }
        Kernel::Write(streaming) => write(std::hint::black_box(buf), streaming),
        Kernel::Copy(streaming) => {
            let (src, dst) = buf.split_at_mut(buf.len() / 2);
            copy(std::hint::black_box(src), std::hint::black_box(&mut dst[..src.len()]), streaming)
        }
        Kernel::Add(streaming) => {
            let third = buf.len() / 3;
            let (a, rest) = buf.split_at_mut(third);
            let (b, c) = rest.split_at_mut(third);
            add(std::hint::black_box(a), std::hint::black_box(b), std::hint::black_box(&mut c[..third]), streaming)
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

fn read(buf: &[Line]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx() {
        // SAFETY: AVX was detected just above.
        return unsafe { avx::read(buf) };
    }
    buf.iter().fold(0, |acc, l| l.0.iter().fold(acc, |a, w| a ^ w))
}

/// Writes every line; `streaming`: with non-temporal stores where the CPU has them (and ordinary
/// stores elsewhere, the same as without).
fn write(buf: &mut [Line], streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming && has_avx() {
        // SAFETY: AVX was detected just above.
        return unsafe { avx::write_streaming(buf) };
    }
    let _ = streaming;
    buf.fill(Line([7; 8]));
}

/// Copies `src` into `dst` (same length), `streaming` as in [`write`].
fn copy(src: &[Line], dst: &mut [Line], streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming && has_avx() {
        // SAFETY: AVX was detected just above.
        return unsafe { avx::copy_streaming(src, dst) };
    }
    let _ = streaming;
    dst.copy_from_slice(src);
}

/// Writes `a + b` (lanes as integers) into `c` (all the same length), `streaming` as in [`write`].
fn add(a: &[Line], b: &[Line], c: &mut [Line], streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming && has_avx() {
        // SAFETY: AVX was detected just above.
        return unsafe { avx::add_streaming(a, b, c) };
    }
    let _ = streaming;
    for ((x, y), z) in a.iter().zip(b).zip(c) {
        for i in 0..8 {
            z.0[i] = x.0[i].wrapping_add(y.0[i]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::Line;
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_load_ps, _mm256_movemask_ps, _mm256_or_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_stream_ps, _mm_sfence,
    };

    /// # Safety
    /// The CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn read(buf: &[Line]) -> u64 {
        let (mut a, mut b): (__m256, __m256) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for line in buf {
            let p = line.0.as_ptr().cast::<f32>();
            // SAFETY: a Line is 64 bytes aligned to 64: two aligned 32-byte loads inside it.
            unsafe {
                a = _mm256_or_ps(a, _mm256_load_ps(p));
                b = _mm256_or_ps(b, _mm256_load_ps(p.add(8)));
            }
        }
        _mm256_movemask_ps(_mm256_or_ps(a, b)) as u64
    }

    /// # Safety
    /// The CPU has AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn write_streaming(buf: &mut [Line]) {
        let v = _mm256_set1_ps(1.0);
        for line in buf {
            let p = line.0.as_mut_ptr().cast::<f32>();
            // SAFETY: two aligned 32-byte stores inside one 64-aligned Line.
            unsafe {
                _mm256_stream_ps(p, v);
                _mm256_stream_ps(p.add(8), v);
            }
        }
        // The streaming stores complete before the pass is timed as done.
        _mm_sfence();
    }

    /// # Safety
    /// The CPU has AVX; `dst` is at least as long as `src`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn copy_streaming(src: &[Line], dst: &mut [Line]) {
        for (s, d) in src.iter().zip(dst) {
            let (s, d) = (s.0.as_ptr().cast::<f32>(), d.0.as_mut_ptr().cast::<f32>());
            // SAFETY: aligned 32-byte loads and stores inside two 64-aligned Lines.
            unsafe {
                _mm256_stream_ps(d, _mm256_load_ps(s));
                _mm256_stream_ps(d.add(8), _mm256_load_ps(s.add(8)));
            }
        }
        _mm_sfence();
    }

    /// # Safety
    /// The CPU has AVX; `b` and `c` are at least as long as `a`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn add_streaming(a: &[Line], b: &[Line], c: &mut [Line]) {
        for ((x, y), z) in a.iter().zip(b).zip(c) {
            let (x, y, z) = (x.0.as_ptr().cast::<f32>(), y.0.as_ptr().cast::<f32>(), z.0.as_mut_ptr().cast::<f32>());
            // SAFETY: aligned 32-byte loads and stores inside three 64-aligned Lines.
            unsafe {
                _mm256_stream_ps(z, _mm256_add_ps(_mm256_load_ps(x), _mm256_load_ps(y)));
                _mm256_stream_ps(z.add(8), _mm256_add_ps(_mm256_load_ps(x.add(8)), _mm256_load_ps(y.add(8))));
            }
        }
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: f64 = 1000.0;

    fn rw(t: Traffic) -> (f64, f64, f64, usize) {
        (t.read, t.written, t.footprint, t.workers)
    }

    #[test]
    fn traffic_is_each_input_read_once_and_each_output_written_once() {
        use Coll::*;
        // all_reduce: n inputs read, n outputs written; in place the buffers are both.
        assert_eq!(rw(traffic(AllReduce, false, S, 4)), (4.0 * S, 4.0 * S, 8.0 * S, 4));
        assert_eq!(rw(traffic(AllReduce, true, S, 4)), (4.0 * S, 4.0 * S, 4.0 * S, 4));
        // reduce_scatter: n inputs of S, n outputs of S/n.
        assert_eq!(rw(traffic(ReduceScatter, false, S, 4)), (4.0 * S, S, 5.0 * S, 4));
        assert_eq!(rw(traffic(ReduceScatter, true, S, 4)), (4.0 * S, S, 4.0 * S, 4));
        // all_gather: n inputs of S/n, n outputs of S; in place each rank's part is there already.
        assert_eq!(rw(traffic(AllGather, false, S, 4)), (S, 4.0 * S, 5.0 * S, 4));
        assert_eq!(rw(traffic(AllGather, true, S, 4)), (S, 3.0 * S, 4.0 * S, 4));
        assert_eq!(rw(traffic(AllToAll, false, S, 2)), (2.0 * S, 2.0 * S, 4.0 * S, 2));
        assert_eq!(rw(traffic(SendRecv, false, S, 3)), (3.0 * S, 3.0 * S, 6.0 * S, 3));
        // broadcast: the root's buffer read once, n - 1 copies written.
        assert_eq!(rw(traffic(Broadcast, false, S, 4)), (S, 3.0 * S, 4.0 * S, 4));
        // put: the caller alone.
        assert_eq!(rw(traffic(Put, false, S, 8)), (S, S, 2.0 * S, 1));
        assert_eq!(rw(traffic(PingPong, false, S, 2)), (S, S, 2.0 * S, 1));
        // One rank: an out-of-place call is a copy, an in-place one moves nothing.
        assert_eq!(rw(traffic(AllReduce, false, S, 1)), (S, S, 2.0 * S, 1));
        assert_eq!(rw(traffic(AllGather, false, S, 1)), (S, S, 2.0 * S, 1));
        for op in [AllReduce, ReduceScatter, AllGather, Broadcast] {
            assert_eq!(rw(traffic(op, true, S, 1)), (0.0, 0.0, 0.0, 1), "{op:?}");
        }
        for op in Coll::ALL {
            assert_eq!(Coll::from_name(op.name()), Some(op));
        }
    }

    fn rates(read: f64, write: f64) -> Rates {
        Rates { read, write }
    }

    /// Two levels: 1 MiB (cache) and 64 MiB (DRAM).
    fn limits() -> Limits {
        Limits::new(
            2,
            true,
            vec![
                Level { bytes: 1 << 20, one: rates(100e9, 50e9), all: rates(200e9, 100e9) },
                Level { bytes: 64 << 20, one: rates(20e9, 10e9), all: rates(30e9, 15e9) },
            ],
        )
        .unwrap()
    }

    #[test]
    fn seconds_cap_each_direction() {
        let r = rates(20e9, 10e9);
        assert_eq!(r.seconds(20e9, 0.0), 1.0); // reading alone
        assert_eq!(r.seconds(0.0, 10e9), 1.0); // writing alone
        assert_eq!(r.seconds(10e9, 5e9), 0.5); // both at once
        assert_eq!(r.seconds(1e9, 10e9), 1.0); // the writes dominate
    }

    /// The figure tests/test_collectives.py expects from `_symm.memory_bound` for the same limits:
    /// both benchmarks report this function.
    #[test]
    fn bound_takes_the_busiest_rank_and_the_machine_at_their_levels() {
        let l = limits();
        let mib = (1u64 << 20) as f64;
        // 16 MiB all_reduce in place, 2 ranks: footprint 32 MiB (the 1 MiB level, the largest no
        // larger), one rank 16 MiB read + 16 MiB written at (100, 50): the writes, 0.336 ms;
        // both together 32 + 32 MiB at (200, 100): 0.336 ms as well.
        let t = traffic(Coll::AllReduce, true, 16.0 * mib, 2);
        assert!((l.bound(t) - 32.0 * mib / 100e9).abs() < 1e-15);
        // 64 MiB out of place: 256 MiB footprint, DRAM; one rank's 128 MiB (its share) at 64 MiB
        // level: 64 MiB written at 10 GB/s = 6.7 ms; both: 128 MiB at 15 GB/s = 8.9 ms, the bound.
        let t = traffic(Coll::AllReduce, false, 64.0 * mib, 2);
        assert!((l.bound(t) - 128.0 * mib / 15e9).abs() < 1e-12);
        // reduce_scatter out of place, 64 MiB: 192 MiB footprint (64 MiB level); one rank's 64 MiB
        // read at 20 GB/s, 3.4 ms; both: 128 MiB read at 30 GB/s, 4.5 ms, the bound.
        let t = traffic(Coll::ReduceScatter, false, 64.0 * mib, 2);
        assert!((l.bound(t) - 128.0 * mib / 30e9).abs() < 1e-12);
        // put: one thread only; below the smallest level the smallest applies.
        let t = traffic(Coll::Put, false, 1000.0, 2);
        assert_eq!(l.bound(t), 1000.0 / 50e9);
        let encoded = "2;1;1048576:100000000000,50000000000:200000000000,100000000000;\
                       67108864:20000000000,10000000000:30000000000,15000000000";
        assert_eq!(l.encode(), encoded);
        assert_eq!(Limits::decode(encoded), Some(l));
    }

    #[test]
    fn rates_never_rise_with_the_working_set_and_bad_tables_are_refused() {
        let l = Limits::new(
            1,
            false,
            vec![
                Level { bytes: 4096, one: rates(5e9, 5e9), all: rates(5e9, 5e9) },
                Level { bytes: 1 << 20, one: rates(9e9, 1e9), all: rates(9e9, 1e9) },
            ],
        )
        .unwrap();
        assert_eq!(l.levels()[0].one, rates(9e9, 5e9));
        let faster_alone = Level { bytes: 4096, one: rates(5e9, 5e9), all: rates(4e9, 6e9) };
        assert_eq!(Limits::new(2, false, vec![faster_alone]).unwrap().levels()[0].all, rates(5e9, 6e9));
        assert_eq!(Limits::new(1, false, vec![]), None);
        assert_eq!(Limits::decode("1;0;4096:1,0:1,1"), None);
        assert_eq!(Limits::decode("1;0;4096:1,1:1,1,1"), None);
        assert_eq!(Limits::decode("x"), None);
    }

    #[test]
    fn kernels_read_write_and_copy_every_line() {
        let mut buf = vec![Line([0; 8]); 64];
        for streaming in [false, true] {
            write(&mut buf, streaming);
            assert!(buf.iter().all(|l| l.0.iter().all(|&w| w != 0)));
            let (src, dst) = buf.split_at_mut(32);
            src[5].0[3] = 42;
            copy(src, dst, streaming);
            assert_eq!(dst[5].0[3], 42);
            let (a, rest) = buf.split_at_mut(20);
            let (b, c) = rest.split_at_mut(20);
            add(a, b, &mut c[..20], streaming);
            assert!(c[..20].iter().all(|l| l.0.iter().all(|&w| w != 0)));
        }
        let mut one = vec![Line([0; 8]); 4];
        assert_eq!(read(&one), 0);
        one[3].0[7] = u64::MAX;
        assert_ne!(read(&one), 0);
    }

    #[test]
    fn measures_a_positive_rate_for_every_level() {
        let l = Limits::measure(2, true);
        assert_eq!(l.levels().len(), LEVELS.len());
        for lv in l.levels() {
            for r in [lv.one, lv.all] {
                assert!(r.read > 0.0 && r.write > 0.0, "{l}");
            }
        }
        assert!(l.to_string().contains("256 MiB"), "{l}");
    }
}
