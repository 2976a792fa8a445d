//! Diagnostics with ranks as threads of this process: the flight recorder seen from every
//! rank, statistics, the log lines, and two threads driving one group.

use std::time::{Duration, Instant};

use symm_core::dfx::{self, Level, RecordState};
use symm_core::{
    Backend, CollOptions, Collectives, Communicator, DType, Error, LocalMut, LocalRef, Rank, ReduceOp, SymmetricHeap,
};
use symm_registry::{run_in_process, CommConfig};
use symm_tests::coll_cases::on_reference;
use symm_tests::on_threads;
use symm_tests::report::{captured, install_capture};

fn config() -> CommConfig {
    install_capture();
    let mut c = CommConfig::with_heap_size(32 << 20);
    c.settings.timeout = Duration::from_secs(30);
    c
}

fn allreduce<C: Collectives>(comm: &C, n: usize) -> symm_core::Result<()> {
    let mut buf = vec![1.0f32; n];
    comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default())
}

#[test]
fn every_rank_reads_the_whole_nodes_flight_recorder_and_its_own_statistics() {
    // Timed (`SYMM_TIMING=1`): records carry start and end, statistics the time.
    let mut c = config();
    c.settings.timing = true;
    on_threads("timed records", 3, c, |comm| {
        let me = comm.rank();
        let world = comm.world();
        let buf = comm.alloc(&world, 8, DType::I64).expect("alloc");
        for _ in 0..3 {
            allreduce(&comm, 10).expect("allreduce");
        }
        comm.barrier(&world).expect("barrier");
        let all = dfx::records(&comm).expect("records");
        // Read before the last barrier lets anyone go on: every rank has recorded as much.
        comm.barrier(&world).expect("barrier");
        assert_eq!(all.len(), 3, "rank {me}: one entry per rank of the node");
        assert_eq!(all[0].rank, me, "the caller's own records come first");
        for rr in &all {
            assert_eq!(rr.pid, std::process::id());
            let ops: Vec<&str> = rr.records.iter().map(|r| r.op).collect();
            assert_eq!(ops.first(), Some(&"init"), "rank {me} reading rank {}: {ops:?}", rr.rank);
            let reduces: Vec<_> = rr.records.iter().filter(|r| r.op == "allreduce").collect();
            assert_eq!(reduces.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2, 3], "{ops:?}");
            for r in &reduces {
                assert_eq!(r.state, RecordState::Completed);
                assert_eq!((r.count, r.dtype), (10, Some(DType::F32)));
                assert_eq!(r.group_ranks.as_deref(), Some(&[Rank(0), Rank(1), Rank(2)][..]));
                assert!(r.timed && r.start_ns > 0 && r.end_ns >= r.start_ns, "{r:?}");
            }
            // The allocation that set up the collectives' workspace happened inside the first
            // allreduce; the user's allocation before it.
            assert!(ops.contains(&"alloc") && ops.contains(&"barrier"), "{ops:?}");
        }
        let text = dfx::dump(&comm);
        for r in 0..3 {
            assert!(text.contains(&format!("rank {r} (pid")), "{text}");
        }
        assert!(text.contains("allreduce") && text.contains("10 x float32"), "{text}");

        let stats = dfx::stats(&comm);
        let ar = stats.iter().find(|s| s.op == "allreduce").expect("allreduce statistics");
        assert_eq!((ar.calls, ar.bytes, ar.errors), (3, 3 * 40, 0), "{stats:?}");
        assert!(ar.total_ns > 0);
        let barrier = stats.iter().find(|s| s.op == "barrier").expect("barrier statistics");
        assert_eq!(barrier.calls, 2, "{stats:?}");
        dfx::reset_stats(&comm);
        assert!(dfx::stats(&comm).is_empty());
        let e = comm.alloc(&world, usize::MAX / 2, DType::I64).unwrap_err();
        assert!(e.to_string().contains("heap"), "{e}");
        comm.free(buf).expect("free");
        let stats = dfx::stats(&comm);
        assert_eq!(stats.iter().find(|s| s.op == "free").map(|s| (s.calls, s.errors)), Some((1, 0)), "{stats:?}");
    });
}

#[test]
fn untimed_calls_read_no_clock_unless_they_block_and_then_show_since_when() {
    // The default: collectives are untimed. Rank 1 joins the allreduce 300 ms late: while it
    // sleeps, rank 0's record shows the allreduce blocked, with the moment it blocked; the
    // allreduce that follows at once on both ranks (usually without blocking) has no end time
    // and no time in the statistics, while the always-timed barrier has both.
    on_threads("untimed records", 2, untimed_config(), |comm| {
        let world = comm.world();
        // Before the barrier: every stamp of what follows it comes later, on either rank.
        let before = dfx::monotonic_ns();
        comm.barrier(&world).expect("barrier");
        if comm.rank().index() == 1 {
            std::thread::sleep(Duration::from_millis(300));
            let all = dfx::records(&comm).expect("records");
            let now = dfx::monotonic_ns();
            let rank0 = all.iter().find(|rr| rr.rank == Rank(0)).expect("rank 0's records");
            let r = rank0.records.last().expect("a record");
            assert_eq!((r.op, r.state, r.timed), ("allreduce", RecordState::Started, false), "{r:?}");
            // Stamped after this rank's `before`, and well before now (it blocked at once).
            assert!(r.start_ns >= before && r.start_ns + 100_000_000 < now, "{r:?}, before {before}, now {now}");
            let text = dfx::dump(&comm);
            let line = text.lines().find(|l| l.contains(&format!("[{:>5}] allreduce", r.index))).unwrap_or_default();
            assert!(line.contains("started   blocked at ") && line.contains(", waiting for "), "{text}");
        }
        allreduce(&comm, 10).expect("allreduce");
        allreduce(&comm, 10).expect("allreduce");
        comm.barrier(&world).expect("barrier");
        let mine = &dfx::records(&comm).expect("records")[0];
        let reduces: Vec<_> = mine.records.iter().filter(|r| r.op == "allreduce").collect();
        assert_eq!(reduces.len(), 2, "{mine:?}");
        for r in &reduces {
            assert_eq!((r.state, r.timed, r.end_ns), (RecordState::Completed, false, 0), "{r:?}");
        }
        if comm.rank().index() == 0 {
            assert!(reduces[0].start_ns >= before, "the blocked allreduce keeps its stamp: {:?}", reduces[0]);
        }
        let barrier = mine.records.iter().rfind(|r| r.op == "barrier").expect("barrier record");
        assert!(barrier.timed && barrier.start_ns > 0 && barrier.end_ns >= barrier.start_ns, "{barrier:?}");
        let stats = dfx::stats(&comm);
        let ar = stats.iter().find(|s| s.op == "allreduce").expect("allreduce statistics");
        assert_eq!((ar.calls, ar.bytes, ar.total_ns), (2, 80, 0), "{stats:?}");
        assert!(stats.iter().find(|s| s.op == "barrier").expect("barrier statistics").total_ns > 0, "{stats:?}");
    });
    // One rank never waits in the host engine: its untimed records keep no time at all. The
    // reference collectives wait for their stream's progress thread even alone, and show when.
    let results = run_in_process(1, untimed_config(), |comm| {
        allreduce(&comm, 10).expect("allreduce");
        let mine = &dfx::records(&comm).expect("records")[0];
        let r = mine.records.iter().rfind(|r| r.op == "allreduce").expect("allreduce record");
        let start_ns = if on_reference(&comm) { 0 } else { r.start_ns };
        assert_eq!((r.state, r.timed, start_ns, r.end_ns), (RecordState::Completed, false, 0, 0), "{r:?}");
    });
    results.into_iter().next().unwrap().expect("start-up");
}

fn untimed_config() -> CommConfig {
    let mut c = config();
    c.settings.timing = false;
    c
}

#[test]
fn statistics_and_recorder_switch_off_without_changing_results() {
    // Statistics off, recorder on, timing on: no statistics, records still timed.
    let mut c = config();
    (c.settings.stats, c.settings.timing) = (false, true);
    on_threads("statistics off", 2, c, |comm| {
        allreduce(&comm, 10).expect("allreduce");
        assert!(dfx::stats(&comm).is_empty());
        let mine = &dfx::records(&comm).expect("records")[0];
        let r = mine.records.iter().find(|r| r.op == "allreduce").expect("allreduce record");
        assert!(r.start_ns > 0 && r.end_ns >= r.start_ns, "{r:?}");
        comm.barrier(&comm.world()).expect("barrier");
    });
    // Both off: nothing kept, the calls' results unchanged, and a wait still ends in a clear
    // timeout (which names what it waited for, without the recorder's picture).
    let mut c = config();
    (c.settings.stats, c.settings.recorder_entries, c.settings.timeout) = (false, 0, Duration::from_millis(300));
    on_threads("both off", 2, c, |comm| {
        let mut buf = vec![comm.rank().index() as f32 + 1.0; 10];
        comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default())
            .expect("allreduce");
        assert_eq!(buf, vec![3.0; 10]);
        assert!(dfx::stats(&comm).is_empty());
        assert!(dfx::records(&comm).is_err(), "the recorder is off");
        if comm.rank().index() == 0 {
            match allreduce(&comm, 10) {
                Err(Error::Timeout(t)) => {
                    assert!(t.flight_dump.is_none() && t.to_string().contains("allreduce"), "{t}")
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
        } else {
            // Stays (without calling) past rank 0's timeout, so that rank 0 times out rather
            // than seeing this rank leave.
            std::thread::sleep(Duration::from_millis(900));
        }
    });
}

#[test]
fn a_collective_that_timed_out_leaves_its_group_refusing_collectives_on_that_rank() {
    // Rank 1 comes to call #2 after rank 0 gave up on it. Rank 0's next collective in the
    // group would be paired with a call rank 1 is still in: it is refused at once, naming the
    // call that failed; point-to-point calls and the barrier still work.
    let mut c = config();
    c.settings.timeout = Duration::from_millis(300);
    on_threads("refused after a timeout", 2, c, |comm| {
        let world = comm.world();
        allreduce(&comm, 8).expect("warm-up");
        if comm.rank().index() == 0 {
            assert!(matches!(allreduce(&comm, 8), Err(Error::Timeout(_))));
            let t0 = Instant::now();
            for _ in 0..2 {
                match allreduce(&comm, 8) {
                    Err(e @ Error::InvalidArgument { .. }) => {
                        let text = e.to_string();
                        for needle in ["out of step", "allreduce #2", "SYMM_E_TIMEOUT", "group"] {
                            assert!(text.contains(needle), "{needle:?} not in {text}");
                        }
                    }
                    other => panic!("expected the group to refuse collectives, got {other:?}"),
                }
            }
            assert!(t0.elapsed() < Duration::from_millis(100), "refused at once: {:?}", t0.elapsed());
            // A call with a bad argument still gets its own error, at once.
            let mut ints = vec![1i64; 3];
            let e = comm.allreduce(&world, LocalMut::from(&mut ints), ReduceOp::Avg, &CollOptions::default());
            assert!(matches!(&e, Err(Error::InvalidArgument { .. })) && format!("{e:?}").contains("avg"), "{e:?}");
            let msg = vec![1.5f32; 4];
            comm.send(&world, LocalRef::from(&msg), 1, &CollOptions::default()).expect("send");
            // Rank 1 answers once it is through its late call (a bound well past its delay).
            let mut ack = vec![0u8; 1];
            let patient = CollOptions { timeout: Some(Duration::from_secs(20)), ..CollOptions::default() };
            comm.recv(&world, LocalMut::from(&mut ack), 1, &patient).expect("ack");
        } else {
            std::thread::sleep(Duration::from_millis(600));
            match allreduce(&comm, 8) {
                // The host engine's late member finds rank 0's part in its heap and completes.
                Ok(()) => assert!(!on_reference(&comm), "rank 0 left the call before its last round"),
                // Every round of the reference collectives waits for each member's consent to
                // reuse its slot, which rank 0 left without giving: the late member times out,
                // naming what it waited for, and its group refuses collectives too.
                Err(Error::Timeout(t)) if on_reference(&comm) => {
                    assert!(t.op.contains("allreduce #2") && t.pending == vec![Rank(0)], "{t:?}")
                }
                other => panic!("the late call completes with what rank 0 had sent: {other:?}"),
            }
            let mut got = vec![0.0f32; 4];
            comm.recv(&world, LocalMut::from(&mut got), 0, &CollOptions::default()).expect("recv");
            assert_eq!(got, vec![1.5; 4]);
            comm.send(&world, LocalRef::from(&vec![1u8; 1]), 0, &CollOptions::default()).expect("ack");
        }
        // Both are here within microseconds of each other now.
        comm.barrier(&world).expect("barrier");
    });
}

#[test]
fn the_logger_receives_one_line_per_operation_with_rank_and_group() {
    let ((), lines) = captured(|| {
        dfx::set_log_level(Some(Level::Debug));
        on_threads("logged", 2, config(), |comm| {
            allreduce(&comm, 4).expect("allreduce");
            comm.barrier(&comm.world()).expect("barrier");
        });
        dfx::set_log_level(Some(Level::Error));
    });
    for r in 0..2 {
        let done = format!("rank {r}: allreduce #1 in group [0, 1] (count 4 float32) completed");
        assert!(lines.iter().any(|(l, s)| *l == Level::Debug && s.contains(&done)), "no line {done:?} in {lines:#?}");
        assert!(
            lines.iter().any(|(l, s)| *l == Level::Info && s.contains(&format!("rank {r}: started"))),
            "{lines:#?}"
        );
    }
    assert!(lines.iter().all(|(_, s)| !s.contains('\n')), "one line per event: {lines:#?}");
}

#[test]
fn a_second_thread_driving_a_busy_group_gets_a_clear_error() {
    on_threads("two threads", 2, config(), |comm| {
        let me = comm.rank().index();
        allreduce(&comm, 4).expect("warm-up allreduce (sets the group's collectives up)");
        if me == 1 {
            // Rank 0's first thread waits in allreduce #2 for this rank meanwhile.
            std::thread::sleep(Duration::from_millis(600));
            allreduce(&comm, 4).expect("allreduce #2");
            return;
        }
        std::thread::scope(|s| {
            let first = s.spawn(|| allreduce(&comm, 4));
            std::thread::sleep(Duration::from_millis(200));
            let start = Instant::now();
            let second = allreduce(&comm, 4);
            let took = start.elapsed();
            match &second {
                Err(e @ Error::ConcurrentUse { group, .. }) => {
                    assert_eq!(group, &vec![Rank(0), Rank(1)]);
                    let text = e.to_string();
                    assert!(text.contains("group [0, 1]") && text.contains("allreduce #2"), "{text}");
                    assert_eq!(e.code(), "SYMM_E_CONCURRENT_USE");
                }
                other => panic!("expected ConcurrentUse, got {other:?}"),
            }
            assert!(took < Duration::from_millis(300), "the second thread waited {took:?} instead of failing at once");
            first.join().expect("first thread").expect("the first thread's allreduce completes");
        });
        let errors = dfx::stats(&comm).iter().find(|s| s.op == "allreduce").map(|s| s.errors);
        assert_eq!(errors, Some(1));
    });
}

#[test]
fn a_rank_thread_that_drops_its_communicator_fails_its_peers_with_peer_exited() {
    let results = run_in_process(2, config(), |comm| {
        allreduce(&comm, 4).expect("warm-up");
        if comm.rank().index() == 1 {
            return None;
        }
        let start = Instant::now();
        let e = allreduce(&comm, 4).unwrap_err();
        Some((e.to_string(), e.code(), start.elapsed()))
    });
    let (text, code, took) = results.into_iter().next().unwrap().expect("start-up").expect("rank 0's outcome");
    assert_eq!(code, "SYMM_E_PEER_EXITED", "{text}");
    assert!(text.contains("peer rank 1") && text.contains("dropped its communicator"), "{text}");
    assert!(took < Duration::from_secs(2), "detected after {took:?}");
}
