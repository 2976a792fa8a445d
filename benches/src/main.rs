//! `symm-microbench`: micro-benchmarks of the CPU shared-memory backend.
//!
//! 1. Put bandwidth from rank 0 into rank 1's heap, for sizes from 8 B to `--max-bytes`
//!    (factor 4, plus the maximum itself), next to a plain `memcpy` between two host buffers of
//!    the same size measured in the same run: the ratio shows what the library adds to the copy.
//! 2. `put_with_signal` ping-pong latency between the two ranks (one-way = round trip / 2),
//!    median and 99th percentile, for 8 B, 1 KiB and 64 KiB.
//!
//! Run it in release: `cargo run --release -p symm-benches --bin symm-microbench -- [--iters N]
//! [--max-bytes SIZE]`. Started without `SYMM_RANK`, the program launches itself on two ranks
//! (one process each, through [`symm_sim::spawn_ranks`]) and prints the machine first; each
//! rank pins itself to its own CPU after start-up when it may.
//!
//! Timing: every figure is the median of [`BATCHES`] timed batches (bandwidth) or of every
//! iteration (latency), so a preemption by another process moves the result little. Copies and
//! puts alternate batch by batch so that both see the same machine state.

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::Parser;

use symm_benches::{allowed_cpus, cpu_model, pin_to};
use symm_core::{Backend, CmpOp, Communicator, DType, LocalRef, SignalOp, SymmetricHeap};
use symm_sim::launch::RANK_VAR;
use symm_sim::SimComm;

/// Ranks of the benchmark: a sender and a receiver.
const RANKS: usize = 2;
/// Timed batches per size; the median is reported.
const BATCHES: usize = 9;
/// Bytes copied per bandwidth batch (fewer iterations for larger sizes).
const BATCH_BYTES: usize = 64 << 20;
/// Untimed round trips before each latency measurement.
const WARMUP: usize = 200;
/// Ping-pong message sizes.
const LATENCY_SIZES: [usize; 3] = [8, 1 << 10, 64 << 10];
/// Heap room beyond the largest put: the world's collective workspace (staging area and
/// mailboxes, reserved at start-up, 16 MiB + 2 MiB by default) and the latency and signal
/// buffers.
const HEAP_SLACK: usize = 32 << 20;

/// Put bandwidth against memcpy and put_with_signal ping-pong latency, on two ranks.
#[derive(Clone, Copy, Debug, Parser)]
#[command(name = "symm-microbench")]
struct Options {
    /// Round trips per latency size, and the most puts per bandwidth batch
    #[arg(long, value_name = "N", default_value = "10000", value_parser = parse_iters)]
    iters: usize,
    /// Largest put, e.g. 4096, 64M, 1G
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_max_bytes)]
    max_bytes: usize,
}

fn parse_iters(v: &str) -> Result<usize, String> {
    v.parse().ok().filter(|&n| n >= 1).ok_or_else(|| "expected an integer >= 1".into())
}

fn parse_max_bytes(v: &str) -> Result<usize, String> {
    symm_core::env::parse_size(v)
        .ok()
        .filter(|&b| b >= 8)
        .ok_or_else(|| "expected a size of at least 8 bytes (K, M, G suffixes)".into())
}

/// Parses the command line (without the program's name); help is an error of its own kind.
fn parse_args(args: &[String]) -> Result<Options, clap::Error> {
    Options::try_parse_from(std::iter::once("symm-microbench").chain(args.iter().map(String::as_str)))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Help exits 0, a bad option 2.
    let opts = parse_args(&args).unwrap_or_else(|e| e.exit());
    if std::env::var_os(RANK_VAR).is_none() {
        std::process::exit(launch(&args, opts));
    }
    let comm = match SimComm::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("symm-microbench: start-up failed: {e}");
            std::process::exit(2);
        }
    };
    // Pinned only now: the backend chooses its spin budget at start-up from the CPUs this
    // process may use, and a process pinned to one CPU would make it believe the two ranks
    // share one core (and sleep after 2 us instead of spinning). The start-up threads have
    // ended, so pinning this thread pins all the work.
    let pinned = pin_self(comm.rank().index());
    if let Err(e) = rank_main(&comm, opts, &pinned) {
        eprintln!("symm-microbench: {e} ({})", e.code());
        std::process::exit(1);
    }
}

/// Prints the header, runs the two ranks, and returns the exit code.
fn launch(args: &[String], opts: Options) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("symm-microbench: cannot find this program's path to start the ranks: {e}");
            return 2;
        }
    };
    let mut env = Vec::new();
    let heap = match std::env::var(symm_core::env::HEAP_SIZE_VAR) {
        Ok(v) => format!("{v} (from {})", symm_core::env::HEAP_SIZE_VAR),
        Err(_) => {
            let bytes = opts.max_bytes + HEAP_SLACK;
            env.push((symm_core::env::HEAP_SIZE_VAR.to_string(), bytes.to_string()));
            format!("{bytes} bytes")
        }
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = cpu_model().unwrap_or_else(|| "unknown (no model name in /proc/cpuinfo)".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let spin = std::env::var("SYMM_SPIN_US")
        .map_or("default (2 ms while every rank has a core)".into(), |v| format!("{v} us"));
    println!("# symm-microbench: symm-sim (CPU shared memory), {RANKS} ranks, one process each");
    println!("# machine: {model}; nproc {cores}; Linux {}", kernel.trim());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("# load average before the run: {} (1, 5, 15 min; other processes share these CPUs)", load.join(" "));
    println!(
        "# command: symm-microbench {}",
        if args.is_empty() { "(default options)".to_string() } else { args.join(" ") }
    );
    println!("# options: --iters {} --max-bytes {}", opts.iters, opts.max_bytes);
    println!("# heap per rank: {heap}; SYMM_SPIN_US: {spin}");
    if cfg!(debug_assertions) {
        println!("# WARNING: debug build; build with --release for meaningful figures");
    }
    let _ = std::io::stdout().flush();
    symm_benches::launch("symm-microbench", RANKS, &exe, args, &env, symm_benches::rank_exit_meaning)
}

/// Pins the calling thread to the CPU of `rank`; a line saying what was done, for the output.
fn pin_self(rank: usize) -> String {
    let cpus = match allowed_cpus() {
        Ok(c) => c,
        Err(e) => return format!("not pinned (sched_getaffinity failed: {e})"),
    };
    if cpus.len() < RANKS {
        return format!("not pinned (only {} CPU(s) allowed: {cpus:?}; the ranks share them)", cpus.len());
    }
    let cpu = cpus[rank % cpus.len()];
    if let Err(e) = pin_to(cpu) {
        return format!("not pinned (sched_setaffinity to cpu {cpu} failed: {e})");
    }
    format!("pinned to cpu {cpu} (of allowed {cpus:?})")
}

fn rank_main(comm: &SimComm, opts: Options, pinned: &str) -> symm_core::Result<()> {
    let me = comm.rank().index();
    let world = comm.world();
    // The ranks report their pinning in rank order.
    for r in 0..RANKS {
        if r == me {
            println!("# rank {me}: {pinned}");
            let _ = std::io::stdout().flush();
        }
        comm.barrier(&world)?;
    }
    bandwidth(comm, opts)?;
    latency(comm, opts)?;
    Ok(())
}

/// The sizes measured: 8, 32, 128 ... up to `max`, and `max` itself.
fn sizes(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        std::iter::successors(Some(8usize), |&s| s.checked_mul(4)).take_while(|&s| s <= max).collect();
    if v.last() != Some(&max) {
        v.push(max);
    }
    v
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Byte `i` of the data rank 0 sends.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn bandwidth(comm: &SimComm, opts: Options) -> symm_core::Result<()> {
    let me = comm.rank().index();
    let world = comm.world();
    let buf = comm.alloc(&world, opts.max_bytes, DType::U8)?;
    // Host buffers of rank 0: the put's source, and the memcpy's destination. Filled (so every
    // page is present) before anything is timed.
    let (src, mut dst) = if me == 0 {
        ((0..opts.max_bytes).map(pattern).collect::<Vec<u8>>(), vec![0u8; opts.max_bytes])
    } else {
        (Vec::new(), Vec::new())
    };
    if me == 0 {
        dst.fill(1);
        println!("#");
        println!("# put bandwidth: rank 0 puts `size` bytes (uint8) into rank 1's heap; memcpy: copy_nonoverlapping");
        println!(
            "# between two host buffers of rank 0; time per operation, median of {BATCHES} batches; GB/s = 1e9 B/s"
        );
        println!(
            "# {:>12} {:>8} {:>14} {:>10} {:>16} {:>12} {:>11}",
            "size(B)", "iters", "put time(us)", "put GB/s", "memcpy time(us)", "memcpy GB/s", "put/memcpy"
        );
    }
    for size in sizes(opts.max_bytes) {
        let iters = (BATCH_BYTES / size).clamp(1, opts.iters);
        if me == 0 {
            let put_once = || comm.put(&world, &buf, 0, LocalRef::from(&src[..size]), 0, size, 1);
            let copy_once = |dst: &mut [u8]| {
                // SAFETY: both buffers hold at least `size` bytes and are distinct allocations.
                // black_box keeps the copy from being optimised away or hoisted out of the loop.
                unsafe { std::ptr::copy_nonoverlapping(black_box(src.as_ptr()), black_box(dst.as_mut_ptr()), size) };
            };
            // Warm-up: the first put faults rank 1's heap pages in.
            put_once()?;
            copy_once(&mut dst);
            let (mut puts, mut copies) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
            for _ in 0..BATCHES {
                let t = Instant::now();
                for _ in 0..iters {
                    copy_once(&mut dst);
                }
                copies.push(t.elapsed() / iters as u32);
                let t = Instant::now();
                for _ in 0..iters {
                    put_once()?;
                }
                puts.push(t.elapsed() / iters as u32);
            }
            let (p, c) = (median(puts), median(copies));
            let gbps = |d: Duration| size as f64 / d.as_secs_f64().max(1e-12) / 1e9;
            println!(
                "  {:>12} {:>8} {:>14.3} {:>10.2} {:>16.3} {:>12.2} {:>11.2}",
                size,
                iters,
                p.as_secs_f64() * 1e6,
                gbps(p),
                c.as_secs_f64() * 1e6,
                gbps(c),
                gbps(p) / gbps(c)
            );
            let _ = std::io::stdout().flush();
        }
        comm.barrier(&world)?;
        if me == 1 {
            // The data really arrived: spot-check both ends of the range.
            let base = comm.local_ptr(&buf)?;
            for i in [0, size / 2, size - 1] {
                // SAFETY: `i < size <= buf.len()`; rank 0 does not write the buffer until the
                // barrier below.
                let b = unsafe { base.add(i).read() };
                assert_eq!(b, pattern(i), "rank 1: byte {i} of the {size}-byte put from rank 0");
            }
        }
        comm.barrier(&world)?;
    }
    comm.free(buf)
}

fn latency(comm: &SimComm, opts: Options) -> symm_core::Result<()> {
    let me = comm.rank().index();
    let peer = 1 - me;
    let world = comm.world();
    let max = LATENCY_SIZES[LATENCY_SIZES.len() - 1];
    let data = comm.alloc(&world, max, DType::U8)?;
    let sig = comm.alloc(&world, 1, DType::I64)?;
    comm.write_local(&sig, 0, &[0i64])?;
    let mut src = vec![0u8; max];
    let recv = comm.local_ptr(&data)?;
    comm.barrier(&world)?;
    if me == 0 {
        println!("#");
        println!(
            "# put_with_signal ping-pong: rank 0 sends `size` bytes + signal set, rank 1 waits and answers alike;"
        );
        println!("# one-way latency = round trip / 2 over {} iterations after {WARMUP} warm-up", opts.iters);
        println!(
            "# {:>12} {:>8} {:>18} {:>15} {:>18}",
            "size(B)", "iters", "one-way p50(us)", "one-way p99(us)", "round trip p50(us)"
        );
    }
    // Byte 0 of every message carries the round trip's number, checked on arrival.
    let send = |src: &mut [u8], size: usize, seq: i64| {
        src[0] = seq as u8;
        comm.put_with_signal(&world, &data, 0, LocalRef::from(&src[..size]), 0, size, &sig, 0, seq, SignalOp::Set, peer)
    };
    let receive = |seq: i64| -> symm_core::Result<()> {
        comm.wait_until(&sig, 0, CmpOp::Ge, seq, None)?;
        // SAFETY: byte 0 of this rank's copy of `data`; the peer wrote it before the signal and
        // writes it again only after this rank's answer.
        let got = unsafe { recv.read_volatile() };
        assert_eq!(got, seq as u8, "rank {me}: round trip {seq}: the data did not arrive with its signal");
        Ok(())
    };
    // The signal only grows (never reset), so each round trip waits for its own sequence number.
    let mut seq: i64 = 0;
    for size in LATENCY_SIZES {
        let mut rtts = Vec::with_capacity(opts.iters);
        for i in 0..WARMUP + opts.iters {
            seq += 1;
            let t = Instant::now();
            if me == 0 {
                send(&mut src, size, seq)?;
                receive(seq)?;
            } else {
                receive(seq)?;
                send(&mut src, size, seq)?;
            }
            if i >= WARMUP {
                rtts.push(t.elapsed());
            }
        }
        if me == 0 {
            rtts.sort_unstable();
            let at = |q: f64| rtts[((rtts.len() as f64 * q).ceil() as usize).clamp(1, rtts.len()) - 1];
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "  {:>12} {:>8} {:>18.3} {:>15.3} {:>18.3}",
                size,
                opts.iters,
                us(at(0.5)) / 2.0,
                us(at(0.99)) / 2.0,
                us(at(0.5))
            );
            let _ = std::io::stdout().flush();
        }
        comm.barrier(&world)?;
    }
    comm.free(sig)?;
    comm.free(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sizes_grow_by_four_and_end_at_the_maximum() {
        assert_eq!(sizes(8), [8]);
        assert_eq!(sizes(100), [8, 32, 100]);
        assert_eq!(sizes(128), [8, 32, 128]);
        let big = sizes(256 << 20);
        assert_eq!((big[0], big[big.len() - 2], big[big.len() - 1]), (8, 128 << 20, 256 << 20));
    }

    #[test]
    fn options_parse_and_bad_values_name_the_option() {
        let o = parse_args(&args(&["--iters", "50", "--max-bytes", "64K"])).unwrap();
        assert_eq!((o.iters, o.max_bytes), (50, 64 << 10));
        let err = |v: &[&str]| parse_args(&args(v)).unwrap_err().to_string();
        assert!(err(&["--iters", "0"]).contains("--iters"));
        assert!(err(&["--max-bytes", "4"]).contains("--max-bytes"));
        assert!(err(&["--max-bytes"]).contains("a value is required"));
        assert!(err(&["--fast"]).contains("--fast"));
        let o = parse_args(&[]).unwrap();
        assert_eq!((o.iters, o.max_bytes), (10_000, 256 << 20));
    }
}
