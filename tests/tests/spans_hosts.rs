//! The one-node rule: symmetric memory groups must lie on one host.
//!
//! Four ranks as threads of this process pretend to be on two hosts through
//! `CommConfig::host_id`: ranks 0 and 1 on host "a", ranks 2 and 3 on host "b". A group inside one
//! host works; a group across hosts, and the world, are refused with `GroupError::SpansHosts`
//! naming the ranks on the other host, on every use (alloc, barrier, put), without a hang.
//!
//! `run_in_process` gives every rank the same config, so the rank threads are started here with
//! a config per rank (as `symm_registry::run_in_process` does otherwise).

use std::sync::Arc;
use std::time::{Duration, Instant};

use symm_core::{Backend, Bootstrap, Communicator, DType, Error, GroupError, LocalRef, Rank, Store, SymmetricHeap};
use symm_registry::store::MemoryStore;
use symm_registry::{BackendControl, Comm, CommConfig};

const HOSTS: [&str; 4] = ["a", "a", "b", "b"];

/// Runs `f` on one thread per entry of `hosts`, rank r claiming host `hosts[r]`.
fn run_on_hosts(hosts: &[&str], f: impl Fn(Comm) + Sync) {
    let n = hosts.len();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(r, host)| {
                let (store, f) = (store.clone(), &f);
                let mut config = CommConfig::with_heap_size(1 << 20);
                config.settings.timeout = Duration::from_secs(30);
                config.settings.host_id = Some(host.to_string());
                s.spawn(move || {
                    let boot = Bootstrap::new(Rank(r as u32), n, store, "spans-hosts", config.settings.timeout);
                    let comm = Comm::init(&boot, config).unwrap_or_else(|e| panic!("rank {r} failed to start: {e}"));
                    f(comm)
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
}

/// The global ranks not on `me`'s host.
fn remote_of(me: usize, ranks: &[usize]) -> Vec<Rank> {
    ranks.iter().filter(|&&r| HOSTS[r] != HOSTS[me]).map(|&r| Rank(r as u32)).collect()
}

/// Asserts `r` is a `SpansHosts` error raised by `me` naming exactly `remote`, with a message
/// that says so.
fn expect_spans_hosts<T: std::fmt::Debug>(r: symm_core::Result<T>, me: usize, remote: &[Rank], what: &str) {
    let e = match r {
        Err(e) => e,
        Ok(v) => panic!("rank {me}: {what} must fail with SpansHosts naming {remote:?}, but it succeeded: {v:?}"),
    };
    let Error::Group { rank, source: GroupError::SpansHosts { remote: got, local_rank, host, .. } } = &e else {
        panic!("rank {me}: {what} must fail with SpansHosts naming {remote:?}, got {e:?}");
    };
    assert_eq!((rank.index(), local_rank.index()), (me, me), "{what}: the error must be raised by rank {me}");
    assert_eq!(got, remote, "rank {me}: {what}: the ranks on the other host");
    assert_eq!(host, HOSTS[me], "rank {me}: {what}: the error must name this rank's host");
    let text = e.to_string();
    assert!(text.contains("spans hosts") && text.contains(&format!("{remote:?}")), "{what}: {text}");
    assert_eq!(e.code(), "SYMM_E_GROUP");
}

#[test]
fn groups_inside_one_host_work_and_groups_across_hosts_are_refused() {
    run_on_hosts(&HOSTS, |comm| {
        let me = comm.rank().index();
        let world = comm.world();
        assert_eq!(comm.hosts(), HOSTS, "rank {me}: host identities exchanged at start-up");
        let start = Instant::now();

        // The world spans both hosts: every use is refused on the calling rank.
        let all: Vec<usize> = (0..HOSTS.len()).collect();
        let remote = remote_of(me, &all);
        expect_spans_hosts(comm.alloc(&world, 4, DType::F32), me, &remote, "world alloc");
        expect_spans_hosts(comm.barrier(&world), me, &remote, "world barrier");

        // A group on this rank's host works: alloc, put into every member, barrier, check.
        let local: Vec<usize> = all.iter().copied().filter(|&r| HOSTS[r] == HOSTS[me]).collect();
        let g = comm.new_group(&world, &local).expect("a group on one host");
        let mine = g.my_rank().expect("member of its host's group").index();
        let buf = comm.alloc(&g, local.len(), DType::I64).expect("alloc on one host");
        comm.write_local(&buf, 0, &vec![-1i64; local.len()]).expect("write");
        comm.barrier(&g).expect("barrier on one host");
        let value = [me as i64];
        for t in 0..local.len() {
            comm.put(&g, &buf, mine, LocalRef::from(&value[..]), 0, 1, t).expect("put on one host");
        }
        comm.barrier(&g).expect("barrier on one host");
        let got: Vec<i64> = comm.read_local(&buf).expect("read");
        let want: Vec<i64> = local.iter().map(|&r| r as i64).collect();
        assert_eq!(got, want, "rank {me}: group {local:?}: element i holds the global rank of member i");

        // A put in the world with a buffer of this host's group: refused for the world first.
        expect_spans_hosts(
            comm.put(&world, &buf, 0, LocalRef::from(&value[..]), 0, 1, 0),
            me,
            &remote,
            "world put with a one-host buffer",
        );

        // The group [1, 2] crosses the hosts: its members are refused, each naming the other.
        let cross = comm.new_group(&world, &[1, 2]).expect("creating a handle needs no communication");
        if cross.my_rank().is_some() {
            let remote = remote_of(me, &[1, 2]);
            assert_eq!(remote.len(), 1, "rank {me}: exactly the other member is remote");
            expect_spans_hosts(comm.alloc(&cross, 4, DType::F32), me, &remote, "alloc in [1, 2]");
            expect_spans_hosts(comm.barrier(&cross), me, &remote, "barrier in [1, 2]");
            expect_spans_hosts(
                comm.put(&cross, &buf, 0, LocalRef::from(&value[..]), 0, 1, 0),
                me,
                &remote,
                "put in [1, 2]",
            );
        } else {
            // Non-members cannot use it either (for them it is foreign twice over).
            assert!(comm.barrier(&cross).is_err(), "rank {me}: a barrier on [1, 2] must fail for a non-member");
        }

        // The refusals were local (no hang) and left the host's group usable.
        assert!(start.elapsed() < Duration::from_secs(10), "rank {me}: refusals took {:?}", start.elapsed());
        comm.barrier(&g).expect("barrier on one host after the refusals");
        comm.free(buf).expect("free");
    });
}
