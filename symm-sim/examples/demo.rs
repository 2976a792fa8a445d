//! The demo job: four ranks exercise every primitive, in the world and in sub-groups, print
//! what they do and check the results.
//!
//! Run it with `cargo run --release -p symm-sim --example demo` (or `scripts/demo.sh`). Started
//! without `SYMM_RANK`, the program is its own launcher: it starts itself once per rank through
//! [`symm_sim::spawn_ranks`] and exits non-zero if any rank failed. Started with `SYMM_RANK`
//! (by the launcher), it is one rank.
//!
//! Options (launcher only): `--ranks N` (default 4, at least 2).
//!
//! Every rank collects the lines of a step and the ranks print them in rank order between
//! barriers, so the output reads the same on every run. A wrong result panics with a message
//! that names the rank, the step and the values.

use std::time::{Duration, Instant};

use symm_core::{
    Backend, CmpOp, Communicator, DType, Error, Group, GroupError, GroupRank, LocalMut, LocalRef, Rank, SignalOp,
    SymmetricHeap,
};
use symm_sim::launch::RANK_VAR;
use symm_sim::SimComm;

const DEFAULT_RANKS: usize = 4;
/// Heap per rank when the user did not set `SYMMETRIC_MEMORY_HEAP_SIZE` (the 1 GiB default is
/// far more than the demo needs).
const DEMO_HEAP: &str = "64M";

fn main() {
    if std::env::var_os(RANK_VAR).is_none() {
        std::process::exit(launch());
    }
    let comm = match SimComm::from_env() {
        Ok(c) => c,
        Err(e) => {
            report(&format!("[rank ?] start-up failed: {e}"));
            std::process::exit(2);
        }
    };
    let me = comm.rank();
    match run(&comm) {
        Ok(()) => {}
        Err(e) => {
            report(&format!("[rank {me}] failed: {e} ({})", e.code()));
            std::process::exit(1);
        }
    }
}

/// Writes one line to stderr in a single write, so that lines of ranks failing together do not
/// interleave.
fn report(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Starts this program once per rank and reports how each rank ended; the process exit code.
fn launch() -> i32 {
    let mut ranks = DEFAULT_RANKS;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a != "--ranks" {
            eprintln!("demo: unknown argument {a:?}; usage: demo [--ranks N]");
            return 2;
        }
        let value = args.next();
        match value.as_deref().map(str::parse::<usize>) {
            Some(Ok(n)) if n >= 2 => ranks = n,
            _ => {
                eprintln!(
                    "demo: --ranks expects a number of ranks >= 2, got {}",
                    value.as_deref().unwrap_or("nothing")
                );
                return 2;
            }
        }
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("demo: cannot find this program's path to start the ranks: {e}");
            return 2;
        }
    };
    let mut env = Vec::new();
    if std::env::var_os(symm_core::env::HEAP_SIZE_VAR).is_none() {
        env.push((symm_core::env::HEAP_SIZE_VAR.to_string(), DEMO_HEAP.to_string()));
    }
    println!("demo: starting {ranks} ranks of {}", exe.display());
    let start = Instant::now();
    let code = symm_sim::launch::run_job("demo", ranks, &exe, &[], &env, |_| None);
    if code == 0 {
        println!("demo: all {ranks} ranks succeeded in {:.2} s", start.elapsed().as_secs_f64());
    }
    code
}

/// One rank's log of the current step, printed in rank order by [`Log::flush`].
struct Log {
    me: Rank,
    lines: Vec<String>,
    checks: usize,
}

impl Log {
    fn say(&mut self, line: String) {
        self.lines.push(format!("[rank {}] {line}", self.me));
    }

    /// Counts a verified result (rank 0 prints the total at the end).
    fn checked(&mut self) {
        self.checks += 1;
    }

    /// Collective over the world: prints every rank's lines, rank 0 first, under `title`.
    fn flush(&mut self, comm: &SimComm, title: &str) -> symm_core::Result<()> {
        let world = comm.world();
        if self.me.index() == 0 {
            println!("\n== {title} ==");
        }
        for r in 0..comm.world_size() {
            // Rank r prints only once every rank before it has printed (the barrier orders the
            // writes to the shared stdout; each `println!` is one write of a whole line).
            comm.barrier(&world)?;
            if r == self.me.index() {
                for l in self.lines.drain(..) {
                    println!("{l}");
                }
            }
        }
        comm.barrier(&world)
    }
}

fn run(comm: &SimComm) -> symm_core::Result<()> {
    let start = Instant::now();
    let (me, n) = (comm.rank().index(), comm.world_size());
    let mut log = Log { me: comm.rank(), lines: Vec::new(), checks: 0 };
    let world = comm.world();
    log.say(format!(
        "up: {n} ranks, heap {} MiB per rank, pid {}, wait bound {:?}",
        comm.heap_size() >> 20,
        std::process::id(),
        comm.default_timeout()
    ));
    log.flush(comm, "start-up")?;

    put_and_get(comm, &world, &mut log)?;
    log.flush(comm, "world: put and get (f64, offsets in elements)")?;
    signals(comm, &world, &mut log)?;
    log.flush(comm, "world: signal_op add and set, wait_until")?;
    put_with_signal_ring(comm, &world, &mut log)?;
    log.flush(comm, "world: put_with_signal + wait_until around the ring")?;

    let mut lists: Vec<Vec<usize>> = Vec::new();
    if n >= 4 {
        lists.push(vec![3, 1]);
        lists.push(vec![0, 2, 3]);
    }
    lists.push((0..n).step_by(2).collect());
    lists.push((1..n).step_by(2).collect());
    for list in &lists {
        let group = comm.new_group(&world, list)?;
        in_group(comm, &group, &mut log)?;
        log.flush(comm, &format!("group {list:?}: rank mapping, alloc, put, put_with_signal, barrier"))?;
    }

    let rounds = 1000;
    let t = Instant::now();
    for _ in 0..rounds {
        comm.barrier(&world)?;
    }
    let per = t.elapsed() / rounds;
    log.say(format!("{rounds} world barriers: {:.1} us each", per.as_secs_f64() * 1e6));
    log.flush(comm, "world: barrier")?;

    // Every rank reports its number of checks to rank 0 by a signal add.
    let tally = comm.alloc(&world, 1, DType::I64)?;
    comm.write_local(&tally, 0, &[0i64])?;
    comm.barrier(&world)?;
    comm.signal_op(&world, &tally, 0, log.checks as i64, SignalOp::Add, 0)?;
    // Signal updates complete before `signal_op` returns, so after the barrier rank 0's
    // counter holds every rank's contribution.
    comm.barrier(&world)?;
    if me == 0 {
        let total = comm.read_local::<i64>(&tally)?[0];
        println!(
            "\n== summary ==\n[rank 0] {n} ranks, {} groups, {total} results verified, {:.2} s",
            lists.len() + 1,
            start.elapsed().as_secs_f64()
        );
    }
    comm.barrier(&world)?;
    comm.free(tally)?;
    Ok(())
}

/// Each rank puts three values into its right neighbour's buffer at element 1, then gets them
/// back from there.
fn put_and_get(comm: &SimComm, world: &Group, log: &mut Log) -> symm_core::Result<()> {
    let (me, n) = (comm.rank().index(), comm.world_size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let buf = comm.alloc(world, 5, DType::F64)?;
    comm.write_local(&buf, 0, &[-1.0f64; 5])?;
    comm.barrier(world)?;
    log.say(format!("alloc 5 x float64 in the world at heap byte {:#x}", buf.heap_offset()));

    let values: Vec<f64> = (0..3).map(|i| (me * 100 + i) as f64).collect();
    comm.put(world, &buf, 1, LocalRef::from(&values), 0, 3, right)?;
    log.say(format!("put {values:?} -> rank {right} at elements 1..4"));
    comm.barrier(world)?;

    let got: Vec<f64> = comm.read_local(&buf)?;
    let from: Vec<f64> = (0..3).map(|i| (left * 100 + i) as f64).collect();
    let want = [vec![-1.0], from, vec![-1.0]].concat();
    assert_eq!(got, want, "[rank {me}] my buffer after rank {left}'s put");
    log.say(format!("my copy now {got:?} (rank {left}'s values at 1..4): ok"));
    log.checked();

    let mut back = [0f64; 3];
    comm.get(world, LocalMut::from(&mut back[..]), 0, &buf, 1, 3, right)?;
    assert_eq!(back[..], values[..], "[rank {me}] get from rank {right} must return what I put there");
    log.say(format!("get {back:?} <- rank {right} elements 1..4: ok"));
    log.checked();
    comm.barrier(world)?;
    comm.free(buf)
}

/// Every rank adds `rank + 1` to rank 0's counter; rank 0 waits for the total. Then rank 0 sets
/// every rank's flag to 42 and each waits for it.
fn signals(comm: &SimComm, world: &Group, log: &mut Log) -> symm_core::Result<()> {
    let (me, n) = (comm.rank().index(), comm.world_size());
    let sig = comm.alloc(world, 2, DType::I64)?; // [0]: counter, [1]: flag
    comm.write_local(&sig, 0, &[0i64, 0])?;
    comm.barrier(world)?;

    comm.signal_op(world, &sig, 0, me as i64 + 1, SignalOp::Add, 0)?;
    log.say(format!("signal_op add {} -> rank 0 signal[0]", me + 1));
    if me == 0 {
        let total = (n * (n + 1) / 2) as i64;
        let seen = comm.wait_until(&sig, 0, CmpOp::Eq, total, None)?;
        assert_eq!(seen, total, "[rank 0] the sum of every rank's add");
        log.say(format!("wait_until signal[0] == {total} (1 + ... + {n}): saw {seen}: ok"));
        log.checked();
        for t in 0..n {
            comm.signal_op(world, &sig, 1, 42, SignalOp::Set, t)?;
        }
        log.say(format!("signal_op set 42 -> signal[1] of every rank 0..{n}"));
    }
    let seen = comm.wait_until(&sig, 1, CmpOp::Eq, 42, None)?;
    assert_eq!(seen, 42, "[rank {me}] the flag rank 0 set");
    log.say(format!("wait_until signal[1] == 42: saw {seen}: ok"));
    log.checked();
    // A wait never resets a signal: a second wait sees the same value at once.
    let again = comm.wait_until(&sig, 1, CmpOp::Ge, 42, Some(Duration::from_millis(1)))?;
    assert_eq!(again, 42, "[rank {me}] waits must not reset signals");
    log.checked();
    comm.barrier(world)?;
    comm.free(sig)
}

/// Three rounds of put_with_signal to the right neighbour; the receiver checks the data as soon
/// as it sees the round's signal, then acknowledges so the sender may overwrite.
fn put_with_signal_ring(comm: &SimComm, world: &Group, log: &mut Log) -> symm_core::Result<()> {
    let (me, n) = (comm.rank().index(), comm.world_size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    const K: usize = 4096;
    let data = comm.alloc(world, K, DType::I32)?;
    let flags = comm.alloc(world, 2, DType::I64)?; // [0]: data ready (round), [1]: ack (round)
    comm.write_local(&flags, 0, &[0i64, 0])?;
    comm.barrier(world)?;
    for round in 1..=3i64 {
        comm.wait_until(&flags, 1, CmpOp::Ge, round - 1, None)?;
        let src: Vec<i32> = (0..K).map(|i| (round as usize * 100_000 + me * 10_000 + i) as i32).collect();
        comm.put_with_signal(world, &data, 0, LocalRef::from(&src), 0, K, &flags, 0, round, SignalOp::Set, right)?;
        log.say(format!(
            "round {round}: put_with_signal {K} x int32 [{}, ...] -> rank {right}, signal set {round}",
            src[0]
        ));
        let seen = comm.wait_until(&flags, 0, CmpOp::Ge, round, None)?;
        let got: Vec<i32> = comm.read_local(&data)?;
        let bad = (0..K).find(|&i| got[i] != (round as usize * 100_000 + left * 10_000 + i) as i32);
        assert_eq!(bad, None, "[rank {me}] round {round}: data from rank {left} not visible with its signal");
        log.say(format!(
            "round {round}: wait_until signal[0] >= {round} saw {seen}; all {K} values from rank {left} present: ok"
        ));
        log.checked();
        comm.signal_op(world, &flags, 1, round, SignalOp::Set, left)?;
    }
    comm.barrier(world)?;
    comm.free(flags)?;
    comm.free(data)
}

/// Inside `group`: the rank mapping, an allocation, a put from every member to every member, a
/// put_with_signal from local rank 0 to the last member, and barriers. Non-members show the
/// error they get.
fn in_group(comm: &SimComm, group: &Group, log: &mut Log) -> symm_core::Result<()> {
    let me = comm.rank().index();
    let ranks: Vec<usize> = group.ranks().iter().map(|r| r.index()).collect();
    let Some(mine) = group.my_rank() else {
        match comm.barrier(group) {
            Err(e @ Error::Group { source: GroupError::NotMember { .. }, .. }) => {
                log.say(format!("not a member; barrier refused as it must be: {e}"));
                log.checked();
                return Ok(());
            }
            other => panic!("[rank {me}] a barrier on {ranks:?}, which does not hold me, must fail; got {other:?}"),
        }
    };
    let size = group.size();
    let mapping: Vec<String> = (0..size)
        .map(|l| format!("{l}->{}", group.to_global(GroupRank(l as u32)).expect("l < size").index()))
        .collect();
    log.say(format!("I am local rank {mine} of {size}; local->global: {}", mapping.join(", ")));
    assert_eq!(group.to_local(comm.rank()), Some(mine), "[rank {me}] group {ranks:?}: local rank round trip");
    log.checked();

    // Slot i of every member's buffer receives the global rank of member i.
    let buf = comm.alloc(group, size, DType::I32)?;
    let sig = comm.alloc(group, 1, DType::I32)?;
    comm.write_local(&buf, 0, &vec![-1i32; size])?;
    comm.write_local(&sig, 0, &[0i32])?;
    comm.barrier(group)?;
    let value = [me as i32];
    for t in 0..size {
        comm.put(group, &buf, mine.index(), LocalRef::from(&value[..]), 0, 1, t)?;
    }
    log.say(format!("put [{me}] into element {mine} of every member (target_rank 0..{size} are local ranks)"));
    comm.barrier(group)?;
    let got: Vec<i32> = comm.read_local(&buf)?;
    let want: Vec<i32> = ranks.iter().map(|&r| r as i32).collect();
    assert_eq!(got, want, "[rank {me}] group {ranks:?}: element i must hold the global rank of local rank i");
    log.say(format!("after the barrier my copy holds {got:?} (global rank of each local rank): ok"));
    log.checked();
    // Nobody may overwrite a member's copy before that member has checked it.
    comm.barrier(group)?;

    // Local rank 0 tells the last member, in one call, both data and signal.
    let last = size - 1;
    if size >= 2 {
        if mine.index() == 0 {
            let payload = [1000 + me as i32];
            comm.put_with_signal(group, &buf, 0, LocalRef::from(&payload[..]), 0, 1, &sig, 0, 1, SignalOp::Add, last)?;
            log.say(format!(
                "put_with_signal [{}] + signal add 1 -> local rank {last} (global {})",
                payload[0], ranks[last]
            ));
        } else if mine.index() == last {
            let seen = comm.wait_until(&sig, 0, CmpOp::Ge, 1, None)?;
            let head: Vec<i32> = comm.read_local(&buf)?;
            assert_eq!(head[0], 1000 + ranks[0] as i32, "[rank {me}] group {ranks:?}: data before signal");
            log.say(format!("wait_until signal >= 1 saw {seen}; element 0 = {}: ok", head[0]));
            log.checked();
        }
    }
    comm.barrier(group)?;
    comm.free(sig)?;
    comm.free(buf)
}
