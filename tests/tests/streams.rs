//! The stream-ordered model of the CPU backend, ranks as threads of this process: order under
//! random delays of the progress threads, events between streams, many operations in flight
//! in several groups, host calls after stream work, and errors surfacing from `wait`.

use std::time::Duration;

use symm_core::{
    Backend, CmpOp, CollOptions, Collectives, Communicator, DType, Error, Group, LocalMut, LocalRef, ReduceOp,
    SignalOp, StreamBackend, StreamCollectives, StreamCommunicator, SymmetricHeap,
};
use symm_registry::{run_in_process, Comm, CommConfig};

/// Every rank's run of `f`, with each stream operation delayed at random by up to `delay_us`.
fn ranks(n: usize, delay_us: u64, f: impl Fn(&Comm) + Sync) {
    let mut config = CommConfig::with_heap_size(64 << 20);
    config.settings.timeout = Duration::from_secs(30);
    config.settings.stream_delay = Duration::from_micros(delay_us);
    for (r, res) in run_in_process(n, config, |comm| f(&comm)).into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r} failed to start: {e}"));
    }
}

fn world(c: &Comm) -> Group {
    c.world()
}

#[test]
fn puts_signals_and_waits_complete_in_stream_order() {
    const ROUNDS: usize = 12;
    ranks(3, 300, |c| {
        let (g, me, n) = (world(c), c.rank().index(), c.world_size());
        let right = (me + 1) % n;
        let data = c.alloc(&g, ROUNDS, DType::I64).unwrap();
        let sig = c.alloc(&g, 1, DType::I64).unwrap();
        let back = c.alloc(&g, ROUNDS, DType::I64).unwrap();
        c.barrier(&g).unwrap();
        let s = c.create_stream().unwrap();
        let src: Vec<i64> = (0..ROUNDS).map(|k| (me * 100 + k) as i64).collect();
        let mut got = vec![0i64; ROUNDS];
        let mut works = Vec::new();
        for k in 0..ROUNDS {
            // SAFETY: `src` outlives the stream's work (synchronised below before it goes).
            works.push(unsafe { c.put_on(&s, &g, &data, k, LocalRef::from(&src[k..k + 1]), 0, 1, right) }.unwrap());
        }
        // After every put: one signal the neighbour waits for on its own stream.
        works.push(c.signal_op_on(&s, &g, &sig, 0, 1, SignalOp::Add, right).unwrap());
        works.push(c.wait_until_on(&s, &sig, 0, CmpOp::Ge, 1, None).unwrap());
        // The left neighbour's data has arrived: read it back from my own heap into `back`
        // through a get of myself, then into host memory, both in order.
        let mine = c.local_ref(&data).unwrap();
        // SAFETY: `mine` is this rank's heap copy, valid while `data` lives.
        works.push(unsafe { c.put_on(&s, &g, &back, 0, mine, 0, ROUNDS, me) }.unwrap());
        // SAFETY: `got` outlives the work (waited below).
        let last = unsafe { c.get_on(&s, &g, LocalMut::from(&mut got[..]), 0, &back, 0, ROUNDS, me) }.unwrap();
        last.wait(None).unwrap();
        for w in &works {
            assert!(w.is_completed().unwrap());
        }
        let left = (me + n - 1) % n;
        let want: Vec<i64> = (0..ROUNDS).map(|k| (left * 100 + k) as i64).collect();
        assert_eq!(got, want, "rank {me}");
        c.barrier(&g).unwrap();
    });
}

#[test]
fn collectives_on_a_stream_keep_their_order_and_host_calls_wait_for_them() {
    ranks(3, 200, |c| {
        let (g, me, n) = (world(c), c.rank().index(), c.world_size());
        let s = c.create_stream().unwrap();
        let mut bufs: Vec<Vec<f64>> = (0..8).map(|k| vec![(me + k) as f64; 5 + k]).collect();
        let mut bcast = [if me == 1 { 7.5f32 } else { 0.0 }; 33];
        let opts = CollOptions::default();
        let mut works = Vec::new();
        for b in bufs.iter_mut() {
            // SAFETY: the buffers outlive the work (the host allreduce below waits for it).
            works.push(unsafe { c.allreduce_on(&s, &g, LocalMut::from(&mut b[..]), ReduceOp::Sum, &opts) }.unwrap());
        }
        // SAFETY: as above.
        works.push(unsafe { c.broadcast_on(&s, &g, LocalMut::from(&mut bcast[..]), 1, &opts) }.unwrap());
        // A host collective of the same group waits for the stream's work first: every member
        // pairs it with the others' host call, not with one of their stream calls.
        let mut host = vec![me as i32 + 1; 3];
        c.allreduce(&g, LocalMut::from(&mut host[..]), ReduceOp::Max, &opts).unwrap();
        assert_eq!(host, vec![n as i32; 3]);
        for w in &works {
            assert!(w.is_completed().unwrap(), "the host call returned before the stream's work");
        }
        let total = |k: usize| (0..n).map(|r| (r + k) as f64).sum::<f64>();
        for (k, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == total(k)), "rank {me} buffer {k}: {b:?}");
        }
        assert!(bcast.iter().all(|&x| x == 7.5));
    });
}

#[test]
fn an_event_orders_another_stream_after_it() {
    ranks(2, 500, |c| {
        let (g, me) = (world(c), c.rank().index());
        let peer = 1 - me;
        let src = c.alloc(&g, 64, DType::U8).unwrap();
        let dst = c.alloc(&g, 64, DType::U8).unwrap();
        c.write_local(&src, 0, &[me as u8 + 10; 64]).unwrap();
        c.barrier(&g).unwrap();
        let (a, b) = (c.create_stream().unwrap(), c.create_stream().unwrap());
        let mut staged = [0u8; 64];
        // Stream a fetches the peer's bytes; stream b forwards them back to the peer, ordered
        // after a by an event (without it, b would often send the zeros `staged` starts with).
        // SAFETY: `staged` outlives both streams' work (waited below).
        let fetched = unsafe { c.get_on(&a, &g, LocalMut::from(&mut staged[..]), 0, &src, 0, 64, peer) }.unwrap();
        c.stream_wait_event(&b, &fetched.event()).unwrap();
        // SAFETY: as above.
        let sent = unsafe { c.put_on(&b, &g, &dst, 0, LocalRef::from(&staged[..]), 0, 64, peer) }.unwrap();
        sent.wait(Some(Duration::from_secs(30))).unwrap();
        c.barrier(&g).unwrap();
        assert_eq!(c.read_local::<u8>(&dst).unwrap(), vec![me as u8 + 10; 64], "rank {me}");
    });
}

#[test]
fn many_operations_in_flight_in_several_groups() {
    ranks(4, 100, |c| {
        let me = c.rank().index();
        let w = world(c);
        // Pairs {0,1} and {2,3}, and the world, each with its own stream.
        let pair = c.new_group(&w, &[me / 2 * 2, me / 2 * 2 + 1]).unwrap();
        let (sw, sp) = (c.create_stream().unwrap(), c.create_stream().unwrap());
        let opts = CollOptions::default();
        let mut in_world: Vec<Vec<i64>> = (0..20).map(|k| vec![(me * k) as i64; 17]).collect();
        let mut in_pair: Vec<Vec<i64>> = (0..20).map(|k| vec![(me + k) as i64; 9]).collect();
        let mut works = Vec::new();
        for (x, y) in in_world.iter_mut().zip(in_pair.iter_mut()) {
            // SAFETY: the buffers outlive the work (synchronised below).
            unsafe {
                works.push(c.allreduce_on(&sw, &w, LocalMut::from(&mut x[..]), ReduceOp::Sum, &opts).unwrap());
                works.push(c.allreduce_on(&sp, &pair, LocalMut::from(&mut y[..]), ReduceOp::Max, &opts).unwrap());
            }
        }
        c.synchronize_stream(&sw, Duration::from_secs(30)).unwrap();
        c.synchronize_stream(&sp, Duration::from_secs(30)).unwrap();
        for (k, x) in in_world.iter().enumerate() {
            assert!(x.iter().all(|&v| v == (6 * k) as i64), "world allreduce {k} on rank {me}: {x:?}");
        }
        let top = me / 2 * 2 + 1;
        for (k, y) in in_pair.iter().enumerate() {
            assert!(y.iter().all(|&v| v == (top + k) as i64), "pair allreduce {k} on rank {me}: {y:?}");
        }
        assert!(works.iter().all(|w| w.is_completed().unwrap()));
    });
}

#[test]
fn a_failed_operation_fails_its_own_wait_and_the_stream_goes_on() {
    ranks(2, 0, |c| {
        let (g, me) = (world(c), c.rank().index());
        let s = c.create_stream().unwrap();
        let opts = CollOptions::default();
        let mut input = vec![1.0f32; 8];
        // Rank 1's output is too short: it rejects its arguments, rank 0 learns it from the
        // round (PeerRejected), as in the host form.
        let mut output = vec![0.0f32; if me == 1 { 4 } else { 8 }];
        // SAFETY: both outlive the work (waited below).
        let bad = unsafe {
            c.allreduce_into_on(
                &s,
                &g,
                LocalRef::from(&input[..]),
                LocalMut::from(&mut output[..]),
                ReduceOp::Sum,
                &opts,
            )
        }
        .unwrap();
        // SAFETY: as above.
        let later = unsafe { c.allreduce_on(&s, &g, LocalMut::from(&mut input[..]), ReduceOp::Sum, &opts) }.unwrap();
        let e = bad.wait(None).unwrap_err();
        match (me, &e) {
            (1, Error::InvalidArgument { .. }) | (0, Error::PeerRejected { .. }) => {}
            _ => panic!("rank {me}: unexpected error {e}"),
        }
        let again = bad.wait(None).unwrap_err();
        assert_eq!(again.to_string(), e.to_string(), "every wait reports the operation's error");
        assert_eq!(bad.is_completed().unwrap_err().code(), e.code());
        // The stream went on: the later allreduce ran on both ranks, and succeeded.
        later.wait(None).unwrap();
        assert_eq!(input, vec![2.0f32; 8]);
    });
}

#[test]
fn a_host_wait_is_bounded_and_says_what_it_waited_for() {
    ranks(2, 0, |c| {
        let (g, me) = (world(c), c.rank().index());
        let sig = c.alloc(&g, 1, DType::I32).unwrap();
        c.barrier(&g).unwrap();
        let s = c.create_stream().unwrap();
        let blocked = c.wait_until_on(&s, &sig, 0, CmpOp::Eq, 5, Some(Duration::from_secs(20))).unwrap();
        let e = blocked.wait(Some(Duration::from_millis(50))).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Timeout(_)), "{text}");
        assert!(text.contains(&format!("stream 0 of rank {me}")) && text.contains("#1 (wait_until) running"), "{text}");
        assert!(!blocked.is_completed().unwrap());
        // A host barrier does not wait for one-sided stream work. After it, the peer releases
        // the wait; the stream then completes.
        c.barrier(&g).unwrap();
        c.signal_op(&g, &sig, 0, 5, SignalOp::Set, 1 - me).unwrap();
        blocked.wait(None).unwrap();
        c.barrier(&g).unwrap();
    });
}

#[test]
fn a_stream_of_another_communicator_is_refused() {
    let mut streams = std::sync::Mutex::new(Vec::new());
    ranks(2, 0, |c| {
        let s = c.create_stream().unwrap();
        streams.lock().unwrap().push(s);
        c.barrier(&world(c)).unwrap();
        let theirs = streams.lock().unwrap().iter().copied().find(|t| *t != s).unwrap();
        let e = c.record_event(&theirs).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("stream 0 of communicator"),
            "{e}"
        );
        c.barrier(&world(c)).unwrap();
    });
    assert_eq!(streams.get_mut().unwrap().len(), 2);
}

#[test]
fn a_platform_stream_is_unsupported_on_the_cpu_backend() {
    ranks(1, 0, |c| {
        let mut queue = 0u8;
        // SAFETY: the backend refuses before it could use the handle.
        let e = unsafe { c.adopt_stream((&raw mut queue).cast()) }.unwrap_err();
        assert!(matches!(e, Error::Unsupported { backend: "sim", .. }), "{e}");
        assert!(e.to_string().contains("adopting a platform stream"), "{e}");
    });
}
