//! Several hundred MiB through every path: zero-copy (heap buffers) and staged (plain memory),
//! in place and out of place.

use symm_core::{Backend, CollOptions, Collectives, DType, LocalMut, LocalRef, ReduceOp, SymmetricHeap};
use symm_registry::{run_in_process, CommConfig};

const COUNT: usize = 80 * 1024 * 1024 + 3; // 320 MiB of f32, odd count

#[test]
fn allreduce_of_320_mib() {
    let config = CommConfig::with_heap_size(1 << 30);
    let results = run_in_process(2, config, |comm| {
        let world = comm.world();
        let me = comm.rank().index() as f32;
        let value = |i: usize| ((i % 1000) as f32) * 0.5 + me;
        let want = |i: usize| ((i % 1000) as f32) + 1.0; // 2 * (i % 1000) * 0.5 + 0 + 1
                                                         // Staged, in place.
        let mut host: Vec<f32> = (0..COUNT).map(value).collect();
        comm.allreduce(&world, LocalMut::from(&mut host), ReduceOp::Sum, &CollOptions::default())
            .expect("staged allreduce");
        assert!(host.iter().enumerate().all(|(i, &v)| v == want(i)), "staged allreduce result");
        // Zero-copy in place: the buffer lives in the heap.
        let buf = comm.alloc(&world, COUNT, DType::F32).expect("alloc");
        comm.write_local(&buf, 0, &(0..COUNT).map(value).collect::<Vec<f32>>()).expect("write_local");
        let p = comm.local_ptr(&buf).expect("ptr").cast::<f32>();
        // SAFETY: `buf` holds COUNT f32 elements; exclusive for the call.
        let heap_ref = unsafe { LocalMut::from_raw(p.cast(), COUNT, DType::F32) };
        comm.allreduce(&world, heap_ref, ReduceOp::Sum, &CollOptions::default()).expect("zero-copy allreduce");
        let got: Vec<f32> = comm.read_local(&buf).expect("read_local");
        assert!(got.iter().enumerate().all(|(i, &v)| v == want(i)), "zero-copy allreduce result");
        // Out of place from the heap into plain memory.
        let mut out = vec![0f32; COUNT];
        // SAFETY: `buf` holds COUNT elements.
        let inp = unsafe { LocalRef::from_raw(p.cast(), COUNT, DType::F32) };
        comm.allreduce_into(&world, inp, LocalMut::from(&mut out), ReduceOp::Max, &CollOptions::default())
            .expect("into");
        assert!(out.iter().enumerate().all(|(i, &v)| v == want(i)), "out-of-place max");
        comm.free(buf).expect("free");
    });
    for r in results {
        r.expect("rank start-up");
    }
}
