//! The cases. Each is collective: every rank of the world calls it with its own communicator.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use symm_core::{
    CmpOp, Communicator, DType, Error, GroupError, GroupRank, HeapError, LocalMut, LocalRef, Rank, ReduceOp, SignalOp,
    SymmBuffer,
};

use symm_core::stream::{StreamBackend, StreamCollectives, StreamCommunicator};
use symm_core::{CollOptions, Collectives};

use crate::coll_cases::{ring, world_of};
use crate::gen::{draw, seed};

/// Every case, by name (the multi-process binary takes one of these).
pub const CASES: &[&str] =
    &["primitives", "signals", "ordering", "groups", "bad_input", "heap", "heap_sources", "collectives_on_stream"];

/// Runs case `name` (a primitive case or one of [`COLL_CASES`](crate::COLL_CASES)) on this
/// rank.
pub fn run_case<C: symm_core::Collectives + StreamBackend>(name: &str, comm: &C) {
    if crate::coll_cases::run_coll_case(name, comm).is_some() {
        return;
    }
    match name {
        "primitives" => primitives(comm, cases_per_run(64)),
        "signals" => signals(comm, cases_per_run(24)),
        "ordering" => ordering(comm, if comm.world_size() > 4 { 300 } else { 2000 }),
        "groups" => groups(comm),
        "bad_input" => bad_input(comm),
        "heap" => heap(comm),
        "heap_sources" => heap_sources(comm),
        "collectives_on_stream" => collectives_on_stream(comm),
        other => panic!("unknown conformance case {other:?}; known: {CASES:?} and {:?}", crate::COLL_CASES),
    }
}

fn cases_per_run(default: usize) -> usize {
    crate::gen::setting(&symm_core::config::TEST_CASES).map_or(default, |n| n as usize)
}

/// Byte `i` of the data rank `r` sends in case `case` (bool data stays 0/1).
fn pattern(r: usize, case: usize, i: usize, dtype: DType) -> u8 {
    let b = (r.wrapping_mul(131) ^ case.wrapping_mul(31) ^ i.wrapping_mul(7)).wrapping_add(i >> 8) as u8;
    if dtype == DType::Bool {
        b & 1
    } else {
        b
    }
}

const SENTINEL: u8 = 0xEE;

/// The caller's copy of `buf`, read through the backend's copy out of the heap (the suite never
/// dereferences heap memory, so it runs on a backend whose heap is device memory).
fn my_bytes<C: Communicator>(comm: &C, buf: &SymmBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.bytes()];
    // SAFETY: `buf` lies in this rank's heap; `out` holds `buf.bytes()` bytes. The cases read
    // between barriers, while no peer writes it.
    unsafe { comm.copy_from_heap(buf.heap_offset(), out.as_mut_ptr(), out.len()) }.expect("copy_from_heap");
    out
}

/// Sets every byte of the caller's copy of `buf` to `byte`, through the backend's copy into the
/// heap; done before the barrier that lets peers write.
fn fill_mine<C: Communicator>(comm: &C, buf: &SymmBuffer, byte: u8) {
    let src = vec![byte; buf.bytes()];
    // SAFETY: as in `my_bytes`.
    unsafe { comm.copy_to_heap(buf.heap_offset(), src.as_ptr(), src.len()) }.expect("copy_to_heap");
}

/// The primitives with every local buffer in the heap (a symmetric buffer's own copy is the
/// source of the puts and the destination of the gets), the data written and read only
/// through the backend's copies, int32 signals: what runs unchanged where the heap and the local
/// buffers are device memory (`scripts/ascend-check.sh` runs it on the Ascend backend). Host and
/// stream forms.
pub fn heap_sources<C: Communicator + StreamBackend>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let (right, left) = ring(me, n);
    let (len, dtype) = (1027, DType::F32);
    let bytes_of = |r: usize, round: usize| -> Vec<u8> { (0..len * 4).map(|i| pattern(r, round, i, dtype)).collect() };
    let src = comm.alloc(&world, len, dtype).expect("alloc src");
    let land = comm.alloc(&world, len, dtype).expect("alloc land");
    let back = comm.alloc(&world, len, dtype).expect("alloc back");
    // Word j: rank j's arrival; word n: the sum every rank adds to.
    let sig = comm.alloc(&world, n + 1, DType::I32).expect("alloc signals");
    let fill = |buf: &SymmBuffer, data: &[u8]| {
        // SAFETY: `data` holds the buffer's bytes; written before the barrier that lets peers in.
        unsafe { comm.copy_to_heap(buf.heap_offset(), data.as_ptr(), data.len()) }.expect("copy_to_heap")
    };
    fill(&src, &bytes_of(me, 1));
    fill_mine(comm, &land, SENTINEL);
    fill_mine(comm, &back, SENTINEL);
    fill_mine(comm, &sig, 0);
    comm.barrier(&world).expect("barrier");

    // Host forms: put_with_signal to the right, get from the right, a sum of signal adds at rank 0.
    let from_heap = comm.local_ref(&src).expect("local_ref");
    comm.put_with_signal(&world, &land, 0, from_heap, 0, len, &sig, me, 1, SignalOp::Set, right)
        .expect("put_with_signal");
    assert_eq!(comm.wait_until(&sig, left, CmpOp::Eq, 1, None).expect("wait_until"), 1);
    assert_eq!(my_bytes(comm, &land), bytes_of(left, 1), "rank {me}: what rank {left} put from its heap");
    let into_heap = comm.local_ptr(&back).expect("local_ptr");
    // SAFETY: `back`'s own copy holds `len` elements, written by nothing else until the barrier.
    let into = unsafe { LocalMut::from_raw(into_heap, len, dtype) };
    comm.get(&world, into, 0, &src, 0, len, right).expect("get");
    assert_eq!(my_bytes(comm, &back), bytes_of(right, 1), "rank {me}: what it got from rank {right}'s heap");
    comm.signal_op(&world, &sig, n, me as i64 + 1, SignalOp::Add, 0).expect("signal_op add");
    if me == 0 {
        let total = (n * (n + 1) / 2) as i64;
        assert_eq!(comm.wait_until(&sig, n, CmpOp::Eq, total, None).expect("wait for the sum"), total);
    }
    comm.barrier(&world).expect("barrier");

    // Stream forms: to the left this time, each rank's stream waiting for its own arrival.
    fill(&src, &bytes_of(me, 2));
    fill_mine(comm, &land, SENTINEL);
    comm.barrier(&world).expect("barrier");
    let stream = comm.create_stream().expect("create_stream");
    let from_heap = comm.local_ref(&src).expect("local_ref");
    // SAFETY: `src` lives and is not written until the work has completed (waited below).
    let put = unsafe {
        comm.put_with_signal_on(&stream, &world, &land, 0, from_heap, 0, len, &sig, me, 2, SignalOp::Set, left)
    }
    .expect("put_with_signal_on");
    let arrived = comm.wait_until_on(&stream, &sig, right, CmpOp::Eq, 2, None).expect("wait_until_on");
    arrived.wait(None).expect("the stream's wait");
    put.wait(None).expect("the stream's put");
    assert_eq!(my_bytes(comm, &land), bytes_of(right, 2), "rank {me}: what rank {right} put on its stream");
    comm.barrier_on(&stream, &world).expect("barrier_on").wait(None).expect("the stream's barrier");
    comm.barrier(&world).expect("barrier");
    for buf in [src, land, back, sig] {
        comm.free(buf).expect("free");
    }
}

/// The collectives' stream forms with every buffer in the heap, read and written only through
/// the backend's copies (what a device backend runs as host work in stream order): an
/// allreduce, then an allreduce that every member refuses (`avg` of int32), whose own work
/// reports it while the stream goes on; an allgather on a second stream ordered after the first
/// stream's work by an event (a group's collectives run one at a time on a rank); a host
/// allreduce of the group, which waits for the group's stream work first.
pub fn collectives_on_stream<C: Collectives + StreamBackend>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let len = 1000;
    let opts = CollOptions::default();
    let part = comm.alloc(&world, len, DType::F32).expect("alloc part");
    let gathered = comm.alloc(&world, len * n, DType::F32).expect("alloc gathered");
    let ints = comm.alloc(&world, 16, DType::I32).expect("alloc ints");
    let fill = |buf: &SymmBuffer, data: &[u8]| {
        // SAFETY: `data` holds the buffer's bytes; written before the barrier.
        unsafe { comm.copy_to_heap(buf.heap_offset(), data.as_ptr(), data.len()) }.expect("copy_to_heap")
    };
    let f32_bytes = |v: f32, count: usize| -> Vec<u8> { (0..count).flat_map(|_| v.to_le_bytes()).collect() };
    fill(&part, &f32_bytes(me as f32 + 1.0, len));
    fill_mine(comm, &gathered, 0);
    fill(&ints, &(0..16).flat_map(|_| (me as i32 + 1).to_le_bytes()).collect::<Vec<u8>>());
    comm.barrier(&world).expect("barrier");

    let (first, second) = (comm.create_stream().expect("create_stream"), comm.create_stream().expect("create_stream"));
    let mine = |buf: &SymmBuffer| {
        let ptr = comm.local_ptr(buf).expect("local_ptr");
        // SAFETY: the caller's own copy of `buf`, which only the stream work below touches until
        // it has completed (every work is waited for before the buffers are read or freed).
        unsafe { LocalMut::from_raw(ptr, buf.len(), buf.dtype()) }
    };
    // SAFETY: as in `mine`.
    let sum = unsafe { comm.allreduce_on(&first, &world, mine(&part), ReduceOp::Sum, &opts) }.expect("allreduce_on");
    // SAFETY: as in `mine`.
    let refused = unsafe { comm.allreduce_on(&first, &world, mine(&ints), ReduceOp::Avg, &opts) }.expect("enqueued");
    comm.stream_wait_event(&second, &refused.event()).expect("stream_wait_event");
    let input = comm.local_ref(&part).expect("local_ref");
    // SAFETY: as in `mine`; `part` is only read from here on.
    let gather = unsafe { comm.allgather_on(&second, &world, mine(&gathered), input, &opts) }.expect("allgather_on");
    let ptr = comm.local_ptr(&ints).expect("local_ptr");
    // SAFETY: `ints` is the caller's copy; the host call waits for the stream work that uses it.
    let host = unsafe { LocalMut::from_raw(ptr, 16, DType::I32) };
    comm.allreduce(&world, host, ReduceOp::Max, &opts).expect("host allreduce after the streams");
    for w in [&sum, &refused, &gather] {
        assert!(w.is_completed().unwrap_or(true), "rank {me}: the host allreduce returned before the stream's work");
    }
    gather.wait(None).expect("the allgather after the event");
    let e = refused.wait(None).expect_err("an avg of int32 is refused");
    assert!(
        matches!(e, Error::InvalidArgument { .. } | Error::PeerRejected { .. }),
        "rank {me}: the refused allreduce's work reports {e}"
    );
    assert_eq!(refused.wait(None).expect_err("again").to_string(), e.to_string(), "every wait says the same");
    let total = (n * (n + 1) / 2) as f32;
    assert_eq!(my_bytes(comm, &part), f32_bytes(total, len), "rank {me}: the stream's allreduce");
    assert_eq!(my_bytes(comm, &gathered), f32_bytes(total, len * n), "rank {me}: the allgather after the event");
    let max: Vec<u8> = (0..16).flat_map(|_| (n as i32).to_le_bytes()).collect();
    assert_eq!(my_bytes(comm, &ints), max, "rank {me}: the host allreduce (the refused one left the data alone)");
    comm.barrier(&world).expect("barrier");
    for buf in [part, gathered, ints] {
        comm.free(buf).expect("free");
    }
}

#[derive(Clone, Debug)]
struct TransferCase {
    dtype: DType,
    len: usize,
    target_offset: usize,
    src_len: usize,
    src_offset: usize,
    count: usize,
    shift: usize,
}

fn transfer_case(n: usize) -> impl Strategy<Value = TransferCase> {
    (0..DType::ALL.len(), 0usize..300, any::<u32>(), any::<u32>(), any::<u32>(), 0..n).prop_map(
        move |(d, len, a, b, c, shift)| {
            let count = match c % 5 {
                0 => 0,
                1 => len.min(1),
                2 => len,
                _ => (c as usize / 5) % (len + 1),
            };
            let target_offset = a as usize % (len - count + 1);
            let src_len = count + (b as usize % 7);
            let src_offset = (b as usize / 7) % (src_len - count + 1);
            TransferCase { dtype: DType::ALL[d], len, target_offset, src_len, src_offset, count, shift }
        },
    )
}

/// put and get over random dtypes, lengths, offsets (0, 1, unaligned) and peers.
pub fn primitives<C: Communicator>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    for (k, case) in draw(transfer_case(n), cases, seed("primitives")).into_iter().enumerate() {
        let size = case.dtype.size();
        let buf = comm.alloc(&world, case.len, case.dtype).expect("alloc");
        fill_mine(comm, &buf, SENTINEL);
        comm.barrier(&world).expect("barrier");
        let src: Vec<u8> = (0..case.src_len * size).map(|i| pattern(me, k, i, case.dtype)).collect();
        // SAFETY: `src` holds `src_len` elements of `dtype` and outlives the call.
        let src_ref = unsafe { LocalRef::from_raw(src.as_ptr(), case.src_len, case.dtype) };
        let target = (me + case.shift) % n;
        comm.put(&world, &buf, case.target_offset, src_ref, case.src_offset, case.count, target).expect("put");
        comm.barrier(&world).expect("barrier");

        let from = (me + n - case.shift) % n;
        let got = my_bytes(comm, &buf);
        let lo = case.target_offset * size;
        let hi = lo + case.count * size;
        for (i, &b) in got.iter().enumerate() {
            let want = if (lo..hi).contains(&i) {
                pattern(from, k, case.src_offset * size + i - lo, case.dtype)
            } else {
                SENTINEL
            };
            assert_eq!(b, want, "rank {me}: case {k} {case:?}: byte {i} of my buffer after put from rank {from}");
        }

        // get back what this rank put into its target, into a guarded local buffer.
        let guard = 3;
        let mut dst = vec![SENTINEL; (case.count + 2 * guard) * size];
        // SAFETY: `dst` holds `count + 2 * guard` elements and is borrowed exclusively.
        let dst_ref = unsafe { LocalMut::from_raw(dst.as_mut_ptr(), case.count + 2 * guard, case.dtype) };
        comm.get(&world, dst_ref, guard, &buf, case.target_offset, case.count, target).expect("get");
        for (i, &b) in dst.iter().enumerate() {
            let inside = (guard * size..(guard + case.count) * size).contains(&i);
            let want =
                if inside { pattern(me, k, case.src_offset * size + i - guard * size, case.dtype) } else { SENTINEL };
            assert_eq!(b, want, "rank {me}: case {k} {case:?}: byte {i} of get from rank {target}");
        }
        comm.barrier(&world).expect("barrier");
        comm.free(buf).expect("free");
    }
}

/// signal_op (set, add; int32, int64), wait_until with every comparison, and put_with_signal.
pub fn signals<C: Communicator>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    let strategy = (prop::bool::ANY, 1usize..17, any::<u32>(), -1000i64..1000, 0usize..300, 0..n);
    for (k, (wide, len, o, base, data_len, shift)) in draw(strategy, cases, seed("signals")).into_iter().enumerate() {
        let dtype = if wide { DType::I64 } else { DType::I32 };
        let offset = o as usize % len;
        let sig = comm.alloc(&world, len, dtype).expect("alloc signal");
        fill_mine(comm, &sig, 0);
        comm.barrier(&world).expect("barrier");
        // Every rank adds base + r to every rank's word: the sum is the same everywhere.
        for t in 0..n {
            comm.signal_op(&world, &sig, offset, base + me as i64, SignalOp::Add, t).expect("signal add");
        }
        let sum: i64 = (0..n as i64).map(|r| base + r).sum();
        let seen = comm.wait_until(&sig, offset, CmpOp::Eq, sum, None).expect("wait for the sum");
        assert_eq!(seen, sum, "rank {me}: case {k}");
        for cmp in CmpOp::ALL {
            let holds = cmp.holds(sum, base);
            let r =
                comm.wait_until(&sig, offset, *cmp, base, Some(Duration::from_millis(if holds { 5000 } else { 20 })));
            match (holds, r) {
                (true, Ok(v)) => assert_eq!(v, sum),
                (false, Err(Error::Timeout(t))) => {
                    let text = t.to_string();
                    assert!(text.contains(&format!("signal {} {base}", cmp.symbol())), "{text}");
                    assert!(text.contains(&format!("rank {me}")) && text.contains(&sum.to_string()), "{text}");
                    // The wait's description, built only once the wait failed.
                    assert!(text.contains("wait_until") && text.contains(&format!("signal[{offset}]")), "{text}");
                }
                (holds, r) => panic!("rank {me}: case {k}: {cmp} {base} on {sum}: holds={holds}, got {r:?}"),
            }
        }
        comm.barrier(&world).expect("barrier");
        // Set: the rank before me writes its own rank + 1 into my word.
        let target = (me + shift) % n;
        comm.signal_op(&world, &sig, offset, me as i64 + 1, SignalOp::Set, target).expect("signal set");
        let from = (me + n - shift) % n;
        comm.wait_until(&sig, offset, CmpOp::Eq, from as i64 + 1, None).expect("wait for set");
        comm.barrier(&world).expect("barrier");

        // put_with_signal: data first, then the signal.
        let data = comm.alloc(&world, data_len, DType::I16).expect("alloc data");
        fill_mine(comm, &sig, 0);
        comm.barrier(&world).expect("barrier");
        let src: Vec<i16> = (0..data_len).map(|i| (me * 1000 + i + k) as i16).collect();
        comm.put_with_signal(
            &world,
            &data,
            0,
            LocalRef::from(&src),
            0,
            data_len,
            &sig,
            offset,
            7,
            SignalOp::Add,
            target,
        )
        .expect("put_with_signal");
        comm.wait_until(&sig, offset, CmpOp::Ge, 7, None).expect("wait for put_with_signal");
        let got: Vec<i16> = comm.read_local(&data).expect("read");
        let want: Vec<i16> = (0..data_len).map(|i| (from * 1000 + i + k) as i16).collect();
        assert_eq!(got, want, "rank {me}: case {k}: data seen with the signal");
        comm.barrier(&world).expect("barrier");
        comm.free(data).expect("free");
        comm.free(sig).expect("free");
    }
}

/// Many rounds of put_with_signal around the ring; the receiver checks the data every time it
/// sees the signal, then acknowledges so the sender may overwrite it.
pub fn ordering<C: Communicator>(comm: &C, rounds: i64) {
    let (me, world, n) = world_of(comm);
    const K: usize = 2048;
    let data = comm.alloc(&world, K, DType::I64).expect("alloc");
    let flags = comm.alloc(&world, 2, DType::I64).expect("alloc flags"); // [0]: data ready, [1]: ack
    fill_mine(comm, &flags, 0);
    comm.barrier(&world).expect("barrier");
    let (next, prev) = ring(me, n);
    let mut src = vec![0i64; K];
    for round in 1..=rounds {
        // The receiver has checked round - 1: the buffer may be overwritten.
        comm.wait_until(&flags, 1, CmpOp::Ge, round - 1, None).expect("wait for ack");
        for (i, v) in src.iter_mut().enumerate() {
            *v = round * 1_000_000 + (me * 10_000 + i) as i64;
        }
        comm.put_with_signal(&world, &data, 0, LocalRef::from(&src), 0, K, &flags, 0, round, SignalOp::Set, next)
            .expect("put_with_signal");
        comm.wait_until(&flags, 0, CmpOp::Ge, round, None).expect("wait for data");
        let got: Vec<i64> = comm.read_local(&data).expect("read");
        for (i, &v) in got.iter().enumerate() {
            assert_eq!(v, round * 1_000_000 + (prev * 10_000 + i) as i64, "rank {me}: round {round}: element {i}");
        }
        comm.signal_op(&world, &flags, 1, round, SignalOp::Set, prev).expect("ack");
    }
    comm.barrier(&world).expect("barrier");
    comm.free(flags).expect("free");
    comm.free(data).expect("free");
}

/// Overlapping and disjoint sub-groups with arbitrary orders, used in the same job.
pub fn groups<C: Communicator>(comm: &C) {
    let (me, world, n) = world_of(comm);
    // A rank-private allocation of a rank-dependent size first: world allocations must still
    // land at one offset on every member.
    let solo = comm.new_group(&world, &[me]).expect("solo group");
    let private = comm.alloc(&solo, (me + 1) * 1000, DType::U8).expect("private alloc");

    let mut lists: Vec<Vec<usize>> =
        vec![(0..n).rev().collect(), (0..n).step_by(2).collect(), (1..n).step_by(2).collect()];
    lists.push((0..n.div_ceil(2)).collect());
    if n >= 4 {
        lists.push(vec![3, 1]);
        lists.push(vec![0, 2, 3]);
    }
    lists.retain(|l| !l.is_empty());
    let groups: Vec<_> = lists.iter().map(|l| comm.new_group(&world, l).expect("new_group")).collect();
    for (l, g) in lists.iter().zip(&groups) {
        let again = comm.new_group(&world, l).expect("new_group again");
        assert!(again.same_object(g), "rank {me}: the group {l:?} was not cached");
        for (i, &r) in l.iter().enumerate() {
            assert_eq!(g.to_global(GroupRank(i as u32)), Some(Rank(r as u32)), "rank {me}: {l:?}");
            assert_eq!(g.to_local(Rank(r as u32)), Some(GroupRank(i as u32)), "rank {me}: {l:?}");
        }
        assert_eq!(g.my_rank().is_some(), l.contains(&me));
    }
    for (l, g) in lists.iter().zip(&groups) {
        let Some(mine) = g.my_rank() else {
            let e = comm.barrier(g).unwrap_err();
            assert!(matches!(e, Error::Group { source: GroupError::NotMember { .. }, .. }), "rank {me}: {e}");
            assert!(comm.alloc(g, 4, DType::I32).is_err());
            continue;
        };
        let size = l.len();
        let buf = comm.alloc(g, size, DType::I32).expect("group alloc");
        fill_mine(comm, &buf, 0xFF);
        comm.barrier(g).expect("group barrier");
        let value = [me as i32];
        for t in 0..size {
            comm.put(g, &buf, mine.index(), LocalRef::from(&value[..]), 0, 1, t).expect("group put");
        }
        comm.barrier(g).expect("group barrier");
        let got: Vec<i32> = comm.read_local(&buf).expect("read");
        let want: Vec<i32> = l.iter().map(|&r| r as i32).collect();
        assert_eq!(got, want, "rank {me}: group {l:?}: slot i must hold the global rank of member i");
        // A sub-group of this group, by ranks relative to it, in another order.
        if size >= 2 {
            let sub = comm.new_group(g, &[1, 0]).expect("sub-group");
            assert_eq!(sub.ranks(), &[Rank(l[1] as u32), Rank(l[0] as u32)]);
        }
        comm.barrier(g).expect("group barrier");
        comm.free(buf).expect("free");
    }
    comm.barrier(&world).expect("barrier");
    comm.free(private).expect("free private");
}

fn expect_arg_error(r: symm_core::Result<()>, me: usize, what: &str, needles: &[&str]) {
    let e = r.expect_err(what);
    let text = e.to_string();
    assert!(text.contains(&format!("rank {me}")), "{what}: the error must name the rank: {text}");
    for n in needles {
        assert!(text.contains(n), "{what}: the error must mention {n:?}: {text}");
    }
}

/// Bad arguments: each gives its own clear error on the calling rank, no hang anywhere, and no
/// byte written anywhere.
pub fn bad_input<C: Communicator>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let buf = comm.alloc(&world, 16, DType::F32).expect("alloc");
    let sig = comm.alloc(&world, 4, DType::I32).expect("alloc");
    fill_mine(comm, &buf, SENTINEL);
    fill_mine(comm, &sig, 0);
    comm.barrier(&world).expect("barrier");
    let src = [1.0f32; 8];
    let s = || LocalRef::from(&src[..]);
    let peer = (me + 1) % n;

    // Each call with what it tries and what its error must mention, checked in this order.
    let (outside, mut dst) = (n.to_string(), [0f32; 4]);
    let calls: [(&str, &[&str], symm_core::Result<()>); 13] = [
        (
            "target out of bounds",
            &["target_offset/count", "10", "7", "16"],
            comm.put(&world, &buf, 10, s(), 0, 7, peer),
        ),
        ("src out of bounds", &["src_offset/count", "8"], comm.put(&world, &buf, 0, s(), 2, 7, peer)),
        ("count overflow", &["target_offset/count"], comm.put(&world, &buf, 1, s(), 0, usize::MAX, peer)),
        ("rank outside", &["target_rank", &outside], comm.put(&world, &buf, 0, s(), 0, 1, n)),
        ("dtype", &["int32", "float32"], comm.put(&world, &buf, 0, LocalRef::from(&[1i32; 4][..]), 0, 1, peer)),
        ("get dst", &["dst_offset/count"], comm.get(&world, LocalMut::from(&mut dst[..]), 2, &buf, 0, 3, peer)),
        ("get src", &["source_offset/count"], comm.get(&world, LocalMut::from(&mut dst[..]), 0, &buf, 15, 2, peer)),
        ("get rank", &["source_rank"], comm.get(&world, LocalMut::from(&mut dst[..]), 0, &buf, 0, 1, n + 3)),
        ("signal dtype", &["signal", "int32 or int64"], comm.signal_op(&world, &buf, 0, 1, SignalOp::Add, peer)),
        ("signal offset", &["signal_offset"], comm.signal_op(&world, &sig, 4, 1, SignalOp::Add, peer)),
        ("signal value", &["signal_value"], comm.signal_op(&world, &sig, 0, 1 << 40, SignalOp::Set, peer)),
        ("wait offset", &["signal_offset"], comm.wait_until(&sig, 9, CmpOp::Eq, 0, None).map(|_| ())),
        ("pws rank", &["target_rank"], comm.put_with_signal(&world, &buf, 0, s(), 0, 1, &sig, 0, 1, SignalOp::Set, n)),
    ];
    for (what, needles, r) in calls {
        expect_arg_error(r, me, what, needles);
    }
    if n >= 2 {
        // A group without the caller.
        let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
        let g = comm.new_group(&world, &others).expect("group of the others");
        expect_arg_error(comm.put(&g, &buf, 0, s(), 0, 1, 0), me, "non-member put", &["not a member"]);
        expect_arg_error(comm.barrier(&g), me, "non-member barrier", &["not a member"]);
        // A buffer of a group that does not hold the target.
        let solo = comm.new_group(&world, &[me]).expect("solo");
        let mine_only = comm.alloc(&solo, 4, DType::F32).expect("solo alloc");
        expect_arg_error(
            comm.put(&world, &mine_only, 0, s(), 0, 1, peer),
            me,
            "buffer not on target",
            &["does not contain"],
        );
        comm.free(mine_only).expect("free");
    }
    expect_arg_error(comm.new_group(&world, &[0, 0]).map(|_| ()), me, "duplicate ranks", &["twice"]);
    expect_arg_error(comm.new_group(&world, &[n]).map(|_| ()), me, "rank outside world", &["ranks", &outside]);
    for (code, what) in
        [(SignalOp::from_code(2).map(|_| ()), "signal op"), (CmpOp::from_code(6).map(|_| ()), "compare op")]
    {
        assert!(code.unwrap_err().to_string().contains(what));
    }
    assert!(ReduceOp::from_code(-3).unwrap_err().to_string().contains("reduce op"));
    assert!(DType::from_code(12).is_err());

    // Nothing was written anywhere: every rank's buffer still holds the sentinel.
    comm.barrier(&world).expect("barrier");
    assert!(my_bytes(comm, &buf).iter().all(|&b| b == SENTINEL), "rank {me}: a failed call wrote data");
    assert!(my_bytes(comm, &sig).iter().all(|&b| b == 0), "rank {me}: a failed call changed a signal");
    comm.barrier(&world).expect("barrier");
    comm.free(sig).expect("free");
    comm.free(buf).expect("free");
}

/// Collective allocation: size mismatches and exhaustion are errors on every member, without a
/// hang, and leave the heap usable; freed space is reused.
pub fn heap<C: Communicator>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let heap = comm.heap_size();

    if n >= 2 {
        let len = if me == 0 { 100 } else { 200 };
        let start = Instant::now();
        match comm.alloc(&world, len, DType::F32) {
            Err(Error::Heap { source: HeapError::SizeMismatch { sizes, .. }, rank }) => {
                assert_eq!(rank.index(), me);
                assert_eq!(sizes.len(), n);
                assert_eq!(sizes[0], (Rank(0), 400));
                assert_eq!(sizes[1], (Rank(1), 800));
            }
            other => panic!("rank {me}: a size mismatch must be an error on every rank, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(10), "rank {me}: the mismatch took {:?}", start.elapsed());
        // And a zero-size request against a non-zero one is a mismatch too.
        let r = comm.alloc(&world, if me == 0 { 0 } else { 1 }, DType::U8);
        assert!(matches!(r, Err(Error::Heap { source: HeapError::SizeMismatch { .. }, .. })), "rank {me}: {r:?}");
    }
    // Too large for any heap: refused locally, naming the variable.
    let e = comm.alloc(&world, heap + 1, DType::U8).unwrap_err().to_string();
    assert!(e.contains("SYMMETRIC_MEMORY_HEAP_SIZE") && e.contains(&format!("rank {me}")), "{e}");
    // Exhaustion found collectively: two halves do not fit.
    let half = heap / 2 + 4096;
    let a = comm.alloc(&world, half, DType::U8).expect("first half");
    match comm.alloc(&world, half, DType::U8) {
        Err(e @ Error::Heap { source: HeapError::Exhausted { .. }, .. }) => {
            let text = e.to_string();
            assert!(text.contains("SYMMETRIC_MEMORY_HEAP_SIZE") && text.contains(&half.to_string()), "{text}");
            assert_eq!(e.code(), "SYMM_E_HEAP_EXHAUSTED");
        }
        other => panic!("rank {me}: expected exhaustion, got {other:?}"),
    }
    let offset = a.heap_offset();
    comm.free(a).expect("free");
    let b = comm.alloc(&world, half, DType::U8).expect("reuse after free");
    assert_eq!(b.heap_offset(), offset, "rank {me}: freed space is reused first-fit");
    // Zero-length buffers work and take no space.
    let z = comm.alloc(&world, 0, DType::F64).expect("empty alloc");
    assert!(z.is_empty());
    comm.put(&world, &z, 0, LocalRef::from(&[0f64; 0][..]), 0, 0, (me + 1) % n).expect("empty put");
    comm.free(z).expect("free");
    comm.free(b).expect("free");
    heap_disagreements(comm);
    heap_reclaim(comm);
    comm.barrier(&world).expect("barrier");
}

/// Frees that name different allocations, or a free against an allocation: an error on every
/// member, and nothing is freed or allocated.
fn heap_disagreements<C: Communicator>(comm: &C) {
    let (me, world, n) = world_of(comm);
    if n < 2 {
        return;
    }
    let a = comm.alloc(&world, 4096, DType::U8).expect("a");
    let b = comm.alloc(&world, 4096, DType::U8).expect("b");
    let (ao, bo) = (a.heap_offset(), b.heap_offset());
    let (mine, other) = if me == 0 { (a, b) } else { (b, a) };
    match comm.free(mine) {
        Err(e @ Error::Heap { source: HeapError::FreeMismatch { .. }, .. }) => {
            let text = e.to_string();
            assert_eq!(e.code(), "SYMM_E_HEAP");
            assert!(text.contains(&format!("rank {me}")), "{text}");
            assert!(text.contains(&format!("{ao:#x}")) && text.contains(&format!("{bo:#x}")), "{text}");
        }
        other => panic!("rank {me}: frees of different allocations must fail on every member, got {other:?}"),
    }
    // Nothing was freed: a new allocation lands elsewhere.
    let c = comm.alloc(&world, 4096, DType::U8).expect("c");
    let co = c.heap_offset();
    assert!(co != ao && co != bo, "rank {me}: an allocation after the failed free took a range that was not freed");
    // A free on one member against an allocation on the others.
    let r = if me == 0 { comm.free(c) } else { comm.alloc(&world, 4096, DType::U8).map(|_| ()) };
    assert!(
        matches!(r, Err(Error::Heap { source: HeapError::FreeMismatch { .. }, .. })),
        "rank {me}: a free against an allocation must fail on every member, got {r:?}"
    );
    // The buffers the failed frees consumed are still allocated: free them in one order.
    let lost = |offset| SymmBuffer::from_parts(comm.instance_id(), world.clone(), offset, 4096, DType::U8);
    let (a, b) = if me == 0 { (lost(ao), other) } else { (other, lost(bo)) };
    comm.free(a).expect("free a");
    comm.free(b).expect("free b");
    comm.free(lost(co)).expect("free c");
}

/// Buffers abandoned (dropped without `free`) by every member come back at the group's next
/// allocation; one that some members still hold stays reserved.
fn heap_reclaim<C: Communicator>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let half = comm.heap_size() / 2 + 4096;
    // Only one such buffer fits at a time: each allocation reclaims the one abandoned before.
    for i in 0..6 {
        let buf = comm
            .alloc(&world, half, DType::U8)
            .unwrap_or_else(|e| panic!("rank {me}: allocation #{i} of a loop that abandons its buffers: {e}"));
        comm.abandon(buf).expect("abandon");
    }
    let held = comm.alloc(&world, half, DType::U8).expect("after the loop");
    let offset = held.heap_offset();
    let kept = if me == 0 || n == 1 {
        comm.abandon(held).expect("abandon");
        None
    } else {
        Some(held)
    };
    if n >= 2 {
        match comm.alloc(&world, half, DType::U8) {
            Err(e @ Error::Heap { source: HeapError::Exhausted { awaiting_reclaim, .. }, .. }) => {
                if me == 0 {
                    assert!(awaiting_reclaim >= half, "rank {me}: {e}");
                    assert!(e.to_string().contains("other members of their group still hold"), "{e}");
                } else {
                    assert_eq!(awaiting_reclaim, 0, "rank {me}: {e}");
                }
            }
            other => panic!("rank {me}: a buffer some members still hold must stay reserved, got {other:?}"),
        }
    }
    if let Some(k) = kept {
        comm.abandon(k).expect("abandon");
    }
    let again = comm.alloc(&world, half, DType::U8).expect("reclaimed once every member dropped it");
    assert_eq!(again.heap_offset(), offset, "rank {me}: the reclaimed range is reused first-fit");
    comm.free(again).expect("free");
}
