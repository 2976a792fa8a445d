//! Offsets and counts of the public API are **elements** of the buffer's dtype, never bytes.
//!
//! Pinned on the bytes themselves: a put of `count = 3` at `target_offset = 2` into a float64
//! buffer writes bytes 16..40 of the target's copy and nothing else; `src_offset`, `get`'s
//! offsets and `signal_offset` scale the same way.

use std::time::Duration;

use symm_core::{Backend, CmpOp, Communicator, DType, LocalMut, LocalRef, SignalOp, SymmBuffer, SymmetricHeap};
use symm_registry::{run_in_process, Comm, CommConfig};

const SENTINEL: u8 = 0xEE;

/// The caller's copy of `buf`, as bytes (through the backend's copy out of the heap).
fn my_bytes(comm: &Comm, buf: &SymmBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.bytes()];
    // SAFETY: `buf` lies in this rank's heap and `out` holds `buf.bytes()` bytes; the peer
    // wrote it before the barrier that precedes every call, and nobody writes it while it is read.
    unsafe { comm.copy_from_heap(buf.heap_offset(), out.as_mut_ptr(), out.len()) }.expect("copy_from_heap");
    out
}

/// Fills the caller's copy of `buf` with the sentinel, before the barrier that lets the peer write.
fn fill_mine(comm: &Comm, buf: &SymmBuffer) {
    let src = vec![SENTINEL; buf.bytes()];
    // SAFETY: as in `my_bytes`.
    unsafe { comm.copy_to_heap(buf.heap_offset(), src.as_ptr(), src.len()) }.expect("copy_to_heap");
}

fn config() -> CommConfig {
    let mut c = CommConfig::with_heap_size(1 << 20);
    c.settings.timeout = Duration::from_secs(30);
    c
}

#[test]
fn put_get_and_signal_offsets_count_elements_not_bytes() {
    for r in run_in_process(2, config(), |comm| {
        let me = comm.rank().index();
        let world = comm.world();
        let buf = comm.alloc(&world, 8, DType::F64).expect("alloc 8 x float64");
        let sig = comm.alloc(&world, 6, DType::I64).expect("alloc signals");
        fill_mine(&comm, &buf);
        comm.write_local(&sig, 0, &[0i64; 6]).expect("zero signals");
        comm.barrier(&world).expect("barrier");

        let src = [1.5f64, 2.5, 3.5, 4.5];
        if me == 0 {
            // Elements 1..4 of `src` into elements 2..5 of rank 1's copy.
            comm.put(&world, &buf, 2, LocalRef::from(&src[..]), 1, 3, 1).expect("put");
            // Element 3 of the signal buffer: bytes 24..32.
            comm.signal_op(&world, &sig, 3, 7, SignalOp::Set, 1).expect("signal");
        }
        comm.barrier(&world).expect("barrier");

        if me == 1 {
            let bytes = my_bytes(&comm, &buf);
            let want: Vec<u8> = src[1..4].iter().flat_map(|v| v.to_ne_bytes()).collect();
            assert_eq!(
                &bytes[16..40],
                &want[..],
                "put(target_offset=2, src_offset=1, count=3) must write bytes 16..40"
            );
            assert!(bytes[..16].iter().all(|&b| b == SENTINEL), "bytes 0..16 must be untouched: {:?}", &bytes[..16]);
            assert!(bytes[40..].iter().all(|&b| b == SENTINEL), "bytes 40..64 must be untouched: {:?}", &bytes[40..]);

            let words: Vec<i64> = comm.read_local(&sig).expect("read signals");
            assert_eq!(words, [0, 0, 0, 7, 0, 0], "signal_offset=3 must update the fourth int64 (bytes 24..32)");
            let seen = comm.wait_until(&sig, 3, CmpOp::Eq, 7, Some(Duration::from_secs(5))).expect("wait");
            assert_eq!(seen, 7, "wait_until(signal_offset=3) must watch the same word");
        } else {
            // get(source_offset=3, count=2) into dst_offset=1: rank 1's elements 3..5 (bytes
            // 24..40, the last two values put above) land in dst[1..3].
            let mut dst = [0f64; 4];
            comm.get(&world, LocalMut::from(&mut dst[..]), 1, &buf, 3, 2, 1).expect("get");
            assert_eq!(dst, [0.0, 3.5, 4.5, 0.0], "get(dst_offset=1, source_offset=3, count=2)");
        }
        comm.barrier(&world).expect("barrier");
        comm.free(sig).expect("free");
        comm.free(buf).expect("free");
    }) {
        r.expect("rank start-up");
    }
}
