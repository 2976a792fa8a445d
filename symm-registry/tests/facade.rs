#![cfg(feature = "sim")]
//! The facade on the CPU backend: what the backend overrides reaches a caller of `Comm`, a
//! stream task gets a `Comm`, and `SYMM_BACKEND` picks (or refuses) the backend.

use std::time::Duration;

use symm_core::stream::StreamCollectives;
use symm_core::{
    Backend, CollOptions, Collectives, Communicator, DType, HostMapped, LocalMut, Rank, ReduceOp, SignalOp,
    StreamBackend, SymmetricHeap, WaitSite,
};
use symm_registry::{run_in_process, BackendControl, BackendKind, Comm, CommConfig};

fn config() -> CommConfig {
    let mut c = CommConfig::with_heap_size(32 << 20);
    c.settings.timeout = Duration::from_secs(30);
    c.settings.backend = Some("sim".into());
    c
}

fn site() -> WaitSite {
    WaitSite { op: "test".into(), group: None, location: "a test word".into(), watch: Vec::new(), waiting_on: None }
}

#[test]
fn the_backends_overrides_reach_the_facade() {
    let results = run_in_process(2, config(), |comm: Comm| {
        assert_eq!(comm.kind(), BackendKind::Sim);
        assert_eq!(comm.backend_name(), "sim");
        // Provided methods the CPU backend overrides (their defaults answer None / false / Unsupported).
        assert_eq!(comm.settings().map(|s| s.timeout), Some(Duration::from_secs(30)));
        assert!(comm.op_stats().is_some());
        assert!(comm.flight_ring(comm.rank()).is_some());
        assert!(comm.peer_heap_base(Rank(1 - comm.rank().0)).is_some());
        assert_eq!(comm.hosts().len(), 2);
        let world = comm.world();
        let sig = comm.alloc(&world, 2, DType::I64).unwrap();
        comm.barrier(&world).unwrap();
        // Each signals the peer's second word; `wait_any_signal_at` (default: Unsupported) finds it.
        let peer = 1 - comm.rank().index();
        comm.signal_op(&world, &sig, 1, 1, SignalOp::Set, peer).unwrap();
        let words = [(sig.heap_offset(), 1), (sig.heap_offset() + 8, 1)];
        assert_eq!(comm.wait_any_signal_at(&words, Duration::from_secs(30), &site).unwrap(), 1);
        // `heap_abandon` (default: nothing) queues the range: the heap accounting shows it.
        let dropped = comm.alloc(&world, 1024, DType::F32).unwrap();
        comm.abandon(dropped).unwrap();
        assert_eq!(comm.heap_stats().unwrap().dropped, 4096);
        comm.barrier(&world).unwrap();
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn a_stream_task_runs_with_a_comm_of_its_own() {
    let results = run_in_process(2, config(), |comm: Comm| {
        let world = comm.world();
        let s = comm.create_stream().unwrap();
        let mut data = vec![comm.rank().0 as f32 + 1.0; 64];
        // SAFETY: `data` stays alive and untouched until the work has completed (waited below).
        let work = unsafe {
            comm.allreduce_on(&s, &world, LocalMut::from(&mut data[..]), ReduceOp::Sum, &CollOptions::default())
        }
        .unwrap();
        work.wait(None).unwrap();
        assert!(data.iter().all(|&x| x == 3.0), "{data:?}");
        // The task's `Comm` is the same rank: a blocking collective after it pairs with the peer's.
        let mut more = [1.0f32; 8];
        comm.allreduce(&world, LocalMut::from(&mut more[..]), ReduceOp::Sum, &CollOptions::default()).unwrap();
        assert!(more.iter().all(|&x| x == 2.0));
        let task_rank = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = task_rank.clone();
        let e = comm
            .enqueue(
                &s,
                "probe",
                None,
                Box::new(move |c: &Comm| {
                    *seen.lock().unwrap() = Some((c.rank(), c.instance_id()));
                    Ok(())
                }),
            )
            .unwrap();
        comm.synchronize_event(&e, Duration::from_secs(30)).unwrap();
        assert_eq!(*task_rank.lock().unwrap(), Some((comm.rank(), comm.instance_id())));
    });
    for r in results {
        r.unwrap();
    }
}

#[test]
fn symm_backend_names_the_backend_or_is_refused_by_name() {
    assert_eq!(BackendKind::select(None, Rank(0)).unwrap(), BackendKind::Sim);
    assert_eq!(BackendKind::select(Some("sim"), Rank(0)).unwrap(), BackendKind::Sim);
    #[cfg(not(feature = "ascend"))]
    {
        let e = BackendKind::select(Some("ascend"), Rank(3)).unwrap_err().to_string();
        for part in ["SYMM_BACKEND", "\"ascend\"", "rank 3", "not compiled in", "feature `ascend`", "compiled in: sim"]
        {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
    }
    let e = BackendKind::select(Some("cuda"), Rank(3)).unwrap_err().to_string();
    for part in ["SYMM_BACKEND", "\"cuda\"", "rank 3", "known: sim, ascend", "compiled in: sim"] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    let mut c = config();
    c.settings.backend = Some("cuda".into());
    let results = run_in_process(2, c, |_comm: Comm| ());
    for (r, result) in results.into_iter().enumerate() {
        let e = result.unwrap_err();
        assert_eq!(e.code(), "SYMM_E_BOOTSTRAP");
        let e = e.to_string();
        assert!(e.contains(&format!("rank {r}")) && e.contains("SYMM_BACKEND") && e.contains("cuda"), "{e}");
    }
}
