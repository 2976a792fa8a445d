//! Conformance cases for the collectives, checked against a host reference computed by every
//! rank from the same deterministic data.

use std::time::Duration;

use proptest::prelude::*;
use symm_core::backend::MemorySpace;
use symm_core::coll::lowp::FORMATS;
use symm_core::coll::reference::ReferenceOptions;
use symm_core::config::CollectiveEngine;
use symm_core::{
    bf16, f16, ArgError, CollOptions, Collectives, Communicator, DType, Error, Group, LocalMut, LocalRef, ReduceOp,
    SymmBuffer, Transport, F8E4M3, F8E5M2,
};
use symm_host::{eager_max_bytes, Tunables};

use crate::gen::{draw, seed};

/// The cases that hold where the heap and the buffers are device memory ([`heap_only`]): every
/// buffer they give a call is a [`Mem`]. `scripts/ascend-check.sh` runs them on Ascend.
pub const DEVICE_CASES: &[&str] = &[
    "heap_sources",
    "collectives_on_stream",
    "allreduce",
    "reduce_scatter",
    "low_precision_pipeline",
    "allgather",
    "broadcast",
    "alltoall",
];

/// Whether every buffer of a [`Mem`] lives in the heap: where the heap is device memory (the
/// local buffers must be too), or with `SYMM_TEST_HEAP_ONLY=1` (the same cases on the CPU).
pub fn heap_only<C: Communicator>(comm: &C) -> bool {
    comm.heap_space() == MemorySpace::Device || crate::gen::setting(&symm_core::config::TEST_HEAP_ONLY) == Some(1)
}

/// Collective cases, by name.
pub const COLL_CASES: &[&str] = &[
    "allreduce",
    "allreduce_inputs_reused",
    "reduce_scatter",
    "low_precision_pipeline",
    "allgather",
    "broadcast",
    "small_broadcasts",
    "alltoall",
    "sendrecv",
    "sendrecv_heap",
    "sendrecv_both",
    "coll_errors",
    "coll_groups",
];

/// Runs collective case `name` on this rank; `None` if the name is not a collective case.
pub fn run_coll_case<C: Collectives>(name: &str, comm: &C) -> Option<()> {
    // The reference collectives are simple, not fast: a quarter of the random cases.
    let scale = if on_reference(comm) { 4 } else { 1 };
    let cases =
        |d: usize| crate::gen::setting(&symm_core::config::TEST_CASES).map_or(d.div_ceil(scale), |n| n as usize);
    match name {
        "allreduce" => allreduce(comm, cases(40)),
        "allreduce_inputs_reused" => allreduce_inputs_reused(comm),
        "reduce_scatter" => reduce_scatter(comm, cases(24)),
        "low_precision_pipeline" => low_precision_pipeline(comm),
        "allgather" => allgather(comm, cases(24)),
        "broadcast" => broadcast(comm, cases(16)),
        "small_broadcasts" => small_broadcasts(comm),
        "alltoall" => alltoall(comm, cases(16)),
        "sendrecv" => sendrecv(comm, cases(16)),
        "sendrecv_heap" => sendrecv_heap(comm),
        "sendrecv_both" => sendrecv_both(comm, cases(16)),
        "coll_errors" => errors(comm),
        "coll_groups" => groups(comm),
        _ => return None,
    }
    Some(())
}

/// Whether `comm`'s collectives are the reference ones (`SYMM_COLLECTIVES=reference`).
pub fn on_reference<C: Collectives>(comm: &C) -> bool {
    comm.settings().is_some_and(|c| c.collectives == CollectiveEngine::Reference)
}

/// Element `i` of rank `r`'s data in case `k`, as f64: mixed signs, zeros, and magnitudes
/// spread over many binades (and exact small integers for integer dtypes).
pub fn value(dtype: DType, r: usize, k: usize, i: usize) -> f64 {
    let h = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (k as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9)
        ^ (i as u64).wrapping_mul(0x94d0_49bb_1331_11eb);
    let h = h ^ (h >> 29);
    let small = ((h % 201) as f64) - 100.0;
    match dtype {
        DType::Bool => (h & 1) as f64,
        DType::U8 => (h % 256) as f64,
        d if !d.is_float() => small,
        DType::F8E4M3 | DType::F8E5M2 => small / 8.0,
        // fp16 overflows at 65504: keep sums of 8 ranks finite.
        DType::F16 => small * 2f64.powi(((h >> 8) % 16) as i32 - 12) / 3.0,
        _ => {
            if h.is_multiple_of(17) {
                0.0
            } else {
                small * 2f64.powi(((h >> 8) % 24) as i32 - 12) / 3.0
            }
        }
    }
}

/// `values` as bytes of `dtype` (rounding to the dtype).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DType::F8E4M3 => out.push(F8E4M3::from_f64(v).to_bits()),
            DType::F8E5M2 => out.push(F8E5M2::from_f64(v).to_bits()),
            DType::I8 => out.push(v as i8 as u8),
            DType::I16 => out.extend((v as i16).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
        }
    }
    out
}

/// Bytes of `dtype` as f64.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|b| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
            DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::F8E4M3 => F8E4M3::from_bits(b[0]).to_f64(),
            DType::F8E5M2 => F8E5M2::from_bits(b[0]).to_f64(),
            DType::I8 => f64::from(b[0] as i8),
            DType::I16 => f64::from(i16::from_le_bytes(b.try_into().unwrap())),
            DType::I32 => f64::from(i32::from_le_bytes(b.try_into().unwrap())),
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::U8 => f64::from(b[0]),
            DType::Bool => f64::from(b[0]),
        })
        .collect()
}

/// Unit roundoff of a dtype.
pub(crate) fn eps(d: DType) -> f64 {
    match d {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F8E4M3 => 2f64.powi(-4),
        DType::F8E5M2 => 2f64.powi(-3),
        _ => 0.0,
    }
}

/// Error of a transport format relative to its block's largest magnitude (see
/// docs/accuracy.md).
pub fn format_bound(lp: DType) -> f64 {
    match lp {
        DType::F8E4M3 => 2f64.powi(-3),
        DType::F8E5M2 => 2f64.powi(-2),
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-7),
    }
}

/// The reference reduction of `inputs` (one vector per rank, already rounded to the dtype)
/// and the allowed absolute error per element (docs/accuracy.md).
pub fn reference(dtype: DType, op: ReduceOp, inputs: &[Vec<f64>], lp: Option<DType>) -> (Vec<f64>, Vec<f64>) {
    let n = inputs.len();
    let count = inputs[0].len();
    let wrap = |v: f64| -> f64 {
        match dtype {
            DType::I8 => v as i64 as i8 as f64,
            DType::I16 => v as i64 as i16 as f64,
            DType::I32 => v as i64 as i32 as f64,
            DType::U8 => v as i64 as u8 as f64,
            DType::Bool => f64::from(v != 0.0),
            _ => v,
        }
    };
    let amax: Vec<f64> = inputs.iter().map(|x| x.iter().fold(0f64, |m, v| m.max(v.abs()))).collect();
    let mut out = Vec::with_capacity(count);
    let mut tol = Vec::with_capacity(count);
    for i in 0..count {
        let col: Vec<f64> = inputs.iter().map(|x| x[i]).collect();
        let abs_sum: f64 = col.iter().map(|v| v.abs()).sum();
        let r = match op {
            ReduceOp::Sum => wrap(col.iter().sum()),
            ReduceOp::Avg => col.iter().sum::<f64>() / n as f64,
            ReduceOp::Max => col.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => col.iter().cloned().fold(f64::INFINITY, f64::min),
        };
        let acc_eps = if dtype == DType::F64 { eps(DType::F64) } else { eps(DType::F32) };
        let mut t = if dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Avg) {
            n as f64 * acc_eps * abs_sum + eps(dtype) * r.abs() * 2.0
        } else {
            0.0
        };
        if let Some(lp) = lp {
            let blocks: f64 = amax.iter().sum();
            t += format_bound(lp) * (blocks + amax.iter().cloned().fold(0.0, f64::max) * n as f64)
                + eps(dtype) * r.abs() * 2.0;
        }
        out.push(r);
        tol.push(t);
    }
    (out, tol)
}

fn check(name: &str, me: usize, got: &[f64], want: &[f64], tol: &[f64]) {
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let ok = if w.is_nan() { g.is_nan() } else { (g - w).abs() <= t || g == w };
        assert!(ok, "rank {me}: {name}: element {i}: got {g}, want {w} (tolerance {t})");
    }
}

/// `values` rounded to `dtype` (what a buffer of `dtype` holds), as f64.
pub fn rounded(dtype: DType, values: impl Iterator<Item = f64>) -> Vec<f64> {
    decode(dtype, &encode(dtype, &values.collect::<Vec<_>>()))
}

/// This rank's index, the world, and its size.
pub(crate) fn world_of<C: Communicator>(comm: &C) -> (usize, Group, usize) {
    let world = comm.world();
    let n = world.size();
    (comm.rank().index(), world, n)
}

/// The ranks after and before `me` on the ring of `n`.
pub(crate) fn ring(me: usize, n: usize) -> (usize, usize) {
    ((me + 1) % n, (me + n - 1) % n)
}

/// Options with a timeout of `secs` seconds.
fn within(secs: u64) -> CollOptions {
    CollOptions { timeout: Some(Duration::from_secs(secs)), ..CollOptions::default() }
}

/// Options for a reduction in transport format `lp` (full precision for `None`), 60 s at most.
fn carried(lp: Option<DType>) -> CollOptions {
    CollOptions { transport: lp.map_or(Transport::Full, Transport::Low), ..within(60) }
}

/// Runs `send` then `recv` when `send_first`, else the other way round: with one side of each
/// pair sending first, messages larger than the mailbox (whose send returns only once the
/// receiver has taken them) cannot deadlock.
fn in_order(send_first: bool, send: impl FnOnce(), recv: impl FnOnce()) {
    if send_first {
        send();
        recv();
    } else {
        recv();
        send();
    }
}

/// Where a test keeps a buffer: plain memory, or the symmetric heap (zero-copy).
struct Mem<'c, C: Communicator> {
    comm: &'c C,
    /// The collective allocation, when any rank uses the heap (freed collectively).
    alloc: Option<SymmBuffer>,
    /// Plain memory, for ranks that do not use the heap.
    host: Option<Vec<u8>>,
    /// The element type and count it was made for.
    dtype: DType,
    len: usize,
}

impl<'c, C: Communicator> Mem<'c, C> {
    /// A buffer of `len` elements. `mask` says which ranks keep it in the heap (bit r for
    /// rank r): the allocation is collective, so every rank allocates when any bit is set,
    /// and ranks whose bit is clear use plain memory (mixing zero-copy and staged members).
    fn new(comm: &'c C, group: &Group, mask: u8, dtype: DType, len: usize) -> Self {
        let mask = if heap_only(comm) { u8::MAX } else { mask };
        let alloc = (mask != 0).then(|| comm.alloc(group, len, dtype).expect("alloc"));
        let use_heap = mask & (1 << (comm.rank().index() % 8)) != 0;
        let host = (!use_heap).then(|| vec![0u8; len * dtype.size()]);
        Mem { comm, alloc, host, dtype, len }
    }

    /// [`Mem::new`], holding `data`.
    fn filled(comm: &'c C, group: &Group, mask: u8, dtype: DType, len: usize, data: &[u8]) -> Self {
        let mut mem = Mem::new(comm, group, mask, dtype, len);
        mem.fill(data);
        mem
    }

    fn ptr(&mut self) -> *mut u8 {
        match (&mut self.host, &self.alloc) {
            (Some(v), _) => v.as_mut_ptr(),
            (None, Some(b)) => self.comm.local_ptr(b).expect("local_ptr"),
            (None, None) => unreachable!("a Mem has host memory or an allocation"),
        }
    }

    /// Its first `len` bytes: heap memory through the backend's copy out of the heap (the
    /// suite never dereferences the heap).
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        match (&self.host, &self.alloc) {
            (Some(v), _) => v[..len].to_vec(),
            (None, Some(b)) => {
                let mut out = vec![0u8; len];
                // SAFETY: the allocation holds at least `len` bytes; read between collectives.
                unsafe { self.comm.copy_from_heap(b.heap_offset(), out.as_mut_ptr(), len) }.expect("copy_from_heap");
                out
            }
            (None, None) => unreachable!("a Mem has host memory or an allocation"),
        }
    }

    /// Writes `data` at byte `at`: heap memory through the backend's copy into the heap.
    fn fill_at(&mut self, at: usize, data: &[u8]) {
        match (&mut self.host, &self.alloc) {
            (Some(v), _) => v[at..at + data.len()].copy_from_slice(data),
            (None, Some(b)) => {
                assert!(at + data.len() <= b.bytes(), "{} bytes at {at} of a {}-byte buffer", data.len(), b.bytes());
                // SAFETY: the range lies in the allocation (checked above).
                unsafe { self.comm.copy_to_heap(b.heap_offset() + at, data.as_ptr(), data.len()) }
                    .expect("copy_to_heap")
            }
            (None, None) => unreachable!("a Mem has host memory or an allocation"),
        }
    }

    fn fill(&mut self, data: &[u8]) {
        self.fill_at(0, data);
    }

    fn local_ref(&mut self, dtype: DType, len: usize) -> LocalRef<'static> {
        // SAFETY: the memory outlives the collective call it is used in (tests keep the Mem
        // alive across the call).
        unsafe { LocalRef::from_raw(self.ptr(), len, dtype) }
    }

    fn local_mut(&mut self, dtype: DType, len: usize) -> LocalMut<'static> {
        // SAFETY: as above; exclusive for the call.
        unsafe { LocalMut::from_raw(self.ptr(), len, dtype) }
    }

    fn release(self) {
        if let Some(b) = self.alloc {
            self.comm.free(b).expect("free");
        }
    }

    /// All its bytes, then [`Mem::release`].
    fn into_bytes(mut self) -> Vec<u8> {
        let got = self.bytes(self.len * self.dtype.size());
        self.release();
        got
    }
}

/// allreduce of all of `a`: in place (`out_mask` `None`), or into a new buffer kept in the heap
/// on the ranks of `out_mask`; the result's bytes.
fn allreduce_mem<C: Collectives>(
    comm: &C,
    group: &Group,
    a: &mut Mem<'_, C>,
    out_mask: Option<u8>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Vec<u8> {
    let (dtype, count) = (a.dtype, a.len);
    match out_mask {
        None => {
            comm.allreduce(group, a.local_mut(dtype, count), op, opts).expect("allreduce");
            a.bytes(count * dtype.size())
        }
        Some(mask) => {
            let mut b = Mem::new(comm, group, mask, dtype, count);
            comm.allreduce_into(group, a.local_ref(dtype, count), b.local_mut(dtype, count), op, opts)
                .expect("allreduce_into");
            b.into_bytes()
        }
    }
}

/// reduce_scatter of `a` (one part per rank): into this rank's part of `a` (`out_mask` `None`),
/// or into a new buffer kept in the heap on the ranks of `out_mask`; the result's bytes.
fn reduce_scatter_mem<C: Collectives>(
    comm: &C,
    group: &Group,
    a: &mut Mem<'_, C>,
    out_mask: Option<u8>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Vec<u8> {
    let (dtype, me, n) = (a.dtype, comm.rank().index(), group.size());
    let (m, size) = (a.len / n, dtype.size());
    match out_mask {
        None => {
            let out = a.ptr().wrapping_add(me * m * size);
            // SAFETY: part `me` of `a` holds `m` elements.
            let out_ref = unsafe { LocalMut::from_raw(out, m, dtype) };
            comm.reduce_scatter(group, out_ref, a.local_ref(dtype, n * m), op, opts).expect("reduce_scatter");
            a.bytes(n * m * size)[me * m * size..(me + 1) * m * size].to_vec()
        }
        Some(mask) => {
            let mut b = Mem::new(comm, group, mask, dtype, m);
            comm.reduce_scatter(group, b.local_mut(dtype, m), a.local_ref(dtype, n * m), op, opts)
                .expect("reduce_scatter");
            b.into_bytes()
        }
    }
}

fn counts() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1), Just(2), Just(7), Just(1021), 0usize..5000, 5000usize..200_000]
}

fn any_dtype() -> impl Strategy<Value = DType> {
    (0..DType::ALL.len()).prop_map(|i| DType::ALL[i])
}

fn any_op() -> impl Strategy<Value = ReduceOp> {
    (0..4usize).prop_map(|i| ReduceOp::ALL[i])
}

fn bit_identical<C: Collectives>(comm: &C, group: &Group, bytes: &[u8], what: &str) {
    let h =
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)) as i64;
    let n = group.size();
    let mut mine = Mem::filled(comm, group, 0, DType::I64, 1, &h.to_le_bytes());
    let mut gathered = Mem::new(comm, group, 0, DType::I64, n);
    comm.allgather(group, gathered.local_mut(DType::I64, n), mine.local_ref(DType::I64, 1), &CollOptions::default())
        .expect("allgather of hashes");
    mine.release();
    let all: Vec<i64> =
        gathered.into_bytes().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(all.iter().all(|&x| x == h), "rank {}: {what}: results differ between ranks: {all:?}", comm.rank());
}

/// allreduce over random dtypes, ops, sizes, formats, in and out of place, heap and host.
pub fn allreduce<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    let strategy = (any_dtype(), any_op(), counts(), any::<bool>(), any::<u8>(), 0usize..6);
    for (k, (dtype, op, count, in_place, heap, lp_sel)) in
        draw(strategy, cases, seed("allreduce")).into_iter().enumerate()
    {
        let op = if op == ReduceOp::Avg && !dtype.is_float() { ReduceOp::Sum } else { op };
        let lp = (lp_sel < 4 && matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
            .then(|| FORMATS[lp_sel]);
        let inputs: Vec<Vec<f64>> = (0..n).map(|r| rounded(dtype, (0..count).map(|i| value(dtype, r, k, i)))).collect();
        let (want, tol) = reference(dtype, op, &inputs, lp);
        let mut a = Mem::filled(comm, &world, heap, dtype, count, &encode(dtype, &inputs[me]));
        let got = allreduce_mem(comm, &world, &mut a, (!in_place).then_some(!heap), op, &carried(lp));
        let what = format!(
            "case {k}: allreduce in {world:?} {dtype} {op} count {count} in_place {in_place} heap {heap} lp {lp:?}"
        );
        check(&what, me, &decode(dtype, &got), &want, &tol);
        bit_identical(comm, &world, &got, &what);
        a.release();
    }
}

/// allreduce out of place in the one-shot sizes (past the small-message path, up to the
/// one-shot limit), with the input in the heap on every rank, on none, on rank 0 only and on
/// all but rank 0: where every rank has a core (2 ranks on this 2-core machine) the peers read
/// a heap input in place. Each input is overwritten the moment the call returns, so a call that
/// returned before every peer had read its input would hand them the overwritten values (with
/// the wait for the peers removed, 11 runs of the suite in 15 failed with 12 rounds a size).
pub fn allreduce_inputs_reused<C: Collectives>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let tun = Tunables::from_env().expect("settings from the environment");
    let one_shot_max = tun.oneshot_max.min(tun.stage_bytes / 2);
    let dtype = DType::F32;
    // Sizes every rank agrees on (tests may set the small-message limit by rank): past the
    // default limit of 2 KiB, and up to the one-shot limit.
    let counts = [2048 / 4 + 1, one_shot_max / 8, one_shot_max / 4];
    let all: u8 = 0xff;
    for (m, mask) in [all, 0, 1, all & !1].into_iter().enumerate() {
        for (c, &count) in counts.iter().enumerate() {
            let mut a = Mem::new(comm, &world, mask, dtype, count);
            let mut out = vec![0u8; count * dtype.size()];
            for round in 0..100 {
                let k = 10_000 + 100 * (4 * c + m) + round;
                let inputs: Vec<Vec<f64>> =
                    (0..n).map(|r| (0..count).map(|i| value(dtype, r, k, i)).collect()).collect();
                let (want, tol) = reference(dtype, ReduceOp::Sum, &inputs, None);
                a.fill(&encode(dtype, &inputs[me]));
                // SAFETY: `out` holds `count` elements and outlives the call.
                let dst = unsafe { LocalMut::from_raw(out.as_mut_ptr(), count, dtype) };
                comm.allreduce_into(&world, a.local_ref(dtype, count), dst, ReduceOp::Sum, &CollOptions::default())
                    .expect("allreduce_into");
                a.fill(&encode(dtype, &vec![f64::NAN; count]));
                let what = format!("allreduce_inputs_reused: count {count}, heap mask {mask:#x}, round {round}");
                check(&what, me, &decode(dtype, &out), &want, &tol);
            }
            a.release();
        }
    }
}

/// reduce_scatter over random dtypes, ops, sizes and formats.
pub fn reduce_scatter<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    let strategy = (any_dtype(), any_op(), counts(), any::<bool>(), any::<u8>(), 0usize..6);
    for (k, (dtype, op, m, in_place, heap, lp_sel)) in
        draw(strategy, cases, seed("reduce_scatter")).into_iter().enumerate()
    {
        let m = m / n.max(1);
        let op = if op == ReduceOp::Avg && !dtype.is_float() { ReduceOp::Max } else { op };
        let lp = (lp_sel < 4 && matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16))
            .then(|| FORMATS[lp_sel]);
        let inputs: Vec<Vec<f64>> = (0..n).map(|r| rounded(dtype, (0..n * m).map(|i| value(dtype, r, k, i)))).collect();
        let mine: Vec<Vec<f64>> = inputs.iter().map(|x| x[me * m..(me + 1) * m].to_vec()).collect();
        let (want, tol) = reference(dtype, op, &mine, lp);
        let mut a = Mem::filled(comm, &world, heap, dtype, n * m, &encode(dtype, &inputs[me]));
        let got = reduce_scatter_mem(comm, &world, &mut a, (!in_place).then_some(!heap), op, &carried(lp));
        check(&format!("case {k}: reduce_scatter {dtype} {op} m {m} lp {lp:?}"), me, &decode(dtype, &got), &want, &tol);
        a.release();
    }
}

/// Element `i` of rank `r`'s data for the low-precision cases: [`value`], with blocks of very
/// different magnitudes on every rank (fp16 data stays in its range), and a NaN, both
/// infinities, a negative zero and a subnormal planted at fixed places.
fn lowp_value(dtype: DType, n: usize, r: usize, k: usize, i: usize) -> f64 {
    let planted = match i {
        5 if r == 1 % n => Some(f64::INFINITY),
        9 if r == 0 => Some(f64::NAN),
        13 if r == n - 1 => Some(f64::NEG_INFINITY),
        17 => Some(-0.0),
        21 if r == 0 => Some(f64::from(f32::from_bits(1))),
        _ => None,
    };
    if let Some(v) = planted {
        return v;
    }
    let v = value(dtype, r, k, i);
    if dtype == DType::F16 {
        v
    } else {
        v * 2f64.powi((((i / 256) * 5 + r * 3) % 41) as i32 - 20)
    }
}

/// Element `i` of rank `r`'s data for the exact case: an integer of at most the format's
/// significant bits, times a power of two shared by every rank in its block, so that every
/// value crosses the format exactly and the f32 sum of 8 ranks is exact.
fn exact_value(lp: DType, r: usize, i: usize) -> f64 {
    let bits = match lp {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F8E4M3 => 4,
        _ => 3,
    };
    let h = (r as u64 + 7).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = h ^ (h >> 31);
    let m = (h % (1 << bits)) as f64;
    // No negative zero: which zero a max of zeros keeps is the pipeline test's business.
    let sign = if h & (1 << 40) != 0 && m != 0.0 { -1.0 } else { 1.0 };
    sign * m * 2f64.powi((((i / 256) * 7 + 3) % 30) as i32 - 15)
}

/// Low-precision allreduce and reduce_scatter against the RFC's pipeline
/// ([`pipeline`](crate::accuracy::pipeline)), bit for bit, on every rank: every format, f32,
/// f64, f16 and bf16 data, every op, sizes on the one-shot path (small ones included), past it
/// (reduce-scatter + allgather) and past the workspace (chunked), counts that are no multiple
/// of the scale block, in and out of place, outputs in the heap on all, some or no ranks. Then
/// inputs the format carries exactly, whose f32 sum is exact: the results are exact.
pub fn low_precision_pipeline<C: Collectives>(comm: &C) {
    use crate::accuracy::pipeline::{differences, reduce, through};
    let (me, world, n) = world_of(comm);
    let tun = Tunables::from_env().expect("settings from the environment");
    let one_shot_max = tun.oneshot_max.min(tun.stage_bytes / 2);
    let opts = |lp| carried(Some(lp));
    let masks = [0xffu8, 0x55, 0, 0xaa];
    let mut k = 50_000;
    for (di, dtype) in [DType::F32, DType::BF16, DType::F16, DType::F64].into_iter().enumerate() {
        let size = dtype.size();
        for (li, lp) in FORMATS.into_iter().enumerate() {
            // Small, one-shot, two-shot, and past the two-shot chunk (where the encoded chunk
            // and a result part, 1/n of the chunk in the data dtype, fill the workspace).
            let chunked = (tun.stage_bytes as f64 / (lp.size() as f64 + size as f64 / n as f64)) as usize + 101;
            let counts = [1, 7, 257, one_shot_max / size - 3, 2 * one_shot_max / size + 37, chunked];
            for (s, count) in counts.into_iter().enumerate() {
                // The largest (chunked) size for the data types the RFC names only.
                if s == counts.len() - 1 && di > 1 {
                    continue;
                }
                k += 1;
                let input = |r: usize| rounded(dtype, (0..count).map(|i| lowp_value(dtype, n, r, k, i)));
                // Rank 0 compares with the pipeline, every rank with rank 0 (a hash): each rank
                // computing the whole reference would make the case n times as long.
                let decoded: Vec<Vec<f64>> =
                    if me == 0 { (0..n).map(|r| through(dtype, lp, &input(r))).collect() } else { Vec::new() };
                let mine = encode(dtype, &input(me));
                let (in_place, mask) = (s % 2 == 0, masks[(s + li) % masks.len()]);
                for op in ReduceOp::ALL.iter().copied() {
                    let mut a = Mem::filled(comm, &world, if in_place { mask } else { !mask }, dtype, count, &mine);
                    let got = allreduce_mem(comm, &world, &mut a, (!in_place).then_some(mask), op, &opts(lp));
                    a.release();
                    let what =
                        format!("allreduce {dtype} via {lp} {op} count {count} in_place {in_place} heap {mask:#x}");
                    if me == 0 {
                        if let Some((wrong, first)) = differences(dtype, &got, &reduce(dtype, op, &decoded)) {
                            panic!("rank 0 of {n}: {what}: {wrong} elements differ from the pipeline; first: {first}");
                        }
                    }
                    bit_identical(comm, &world, &got, &what);
                }
            }
            // reduce_scatter: blocks start at every part.
            let parts = [1, 7, 300, 1021, tun.stage_bytes / n / lp.size() + 333];
            for (s, m) in parts.into_iter().enumerate() {
                if s == parts.len() - 1 && di > 1 {
                    continue;
                }
                k += 1;
                // Every part of a rank's input holds the same values; only part `me` of the
                // peers' inputs matters here.
                let part = |r: usize| rounded(dtype, (0..m).map(|i| lowp_value(dtype, n, r, k, i)));
                let input = part(me).repeat(n);
                let decoded: Vec<Vec<f64>> = (0..n).map(|r| through(dtype, lp, &part(r))).collect();
                let in_place = s % 2 == 1;
                for op in ReduceOp::ALL.iter().copied() {
                    let want = reduce(dtype, op, &decoded);
                    let mask = masks[(s + li) % masks.len()];
                    let mut a = Mem::filled(comm, &world, mask, dtype, n * m, &encode(dtype, &input));
                    // Out of place into plain memory (mask 0) on every rank.
                    let got = reduce_scatter_mem(comm, &world, &mut a, (!in_place).then_some(0), op, &opts(lp));
                    a.release();
                    if let Some((wrong, first)) = differences(dtype, &got, &want) {
                        panic!(
                            "rank {me} of {n}: reduce_scatter {dtype} via {lp} {op} part {m} in_place {in_place}: \
                             {wrong} elements differ from the pipeline; first: {first}"
                        );
                    }
                }
            }
        }
    }
    // Inputs the format carries exactly, whose f32 sum is exact: exact results, whatever the
    // algorithm (one-shot, reduce-scatter + allgather, chunked).
    for lp in FORMATS {
        for count in [512, 2 * one_shot_max / 4 + 37, tun.stage_bytes / lp.size() + 101] {
            let inputs: Vec<Vec<f64>> = (0..n).map(|r| (0..count).map(|i| exact_value(lp, r, i)).collect()).collect();
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let want: Vec<f64> = (0..count)
                    .map(|i| {
                        let column = inputs.iter().map(|x| x[i]);
                        if op == ReduceOp::Sum {
                            column.sum()
                        } else {
                            column.fold(f64::NEG_INFINITY, f64::max)
                        }
                    })
                    .collect();
                let mut buf = encode(DType::F32, &inputs[me]);
                // SAFETY: `buf` holds `count` f32 values and outlives the call.
                let bm = unsafe { LocalMut::from_raw(buf.as_mut_ptr(), count, DType::F32) };
                comm.allreduce(&world, bm, op, &opts(lp)).expect("allreduce");
                if let Some((wrong, first)) = differences(DType::F32, &buf, &encode(DType::F32, &want)) {
                    panic!(
                        "rank {me} of {n}: allreduce {op} via {lp} of values it carries exactly, count {count}: \
                         {wrong} elements inexact; first: {first}"
                    );
                }
            }
        }
    }
}

/// allgather over random dtypes and sizes, in place (input = own part of output) or not.
pub fn allgather<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    for (k, (dtype, m, in_place, heap)) in
        draw((any_dtype(), counts(), any::<bool>(), any::<u8>()), cases, seed("allgather")).into_iter().enumerate()
    {
        let size = dtype.size();
        let data: Vec<Vec<u8>> =
            (0..n).map(|r| encode(dtype, &(0..m).map(|i| value(dtype, r, k, i)).collect::<Vec<_>>())).collect();
        let mut out = Mem::new(comm, &world, heap, dtype, n * m);
        if in_place {
            out.fill_at(me * m * size, &data[me]);
            let own = out.ptr().wrapping_add(me * m * size);
            // SAFETY: as above.
            let input = unsafe { LocalRef::from_raw(own, m, dtype) };
            comm.allgather(&world, out.local_mut(dtype, n * m), input, &CollOptions::default()).expect("allgather");
        } else {
            let mut inp = Mem::filled(comm, &world, !heap, dtype, m, &data[me]);
            comm.allgather(&world, out.local_mut(dtype, n * m), inp.local_ref(dtype, m), &CollOptions::default())
                .expect("allgather");
            inp.release();
        }
        assert_eq!(out.into_bytes(), data.concat(), "rank {me}: case {k}: allgather {dtype} m {m} in_place {in_place}");
    }
}

/// broadcast from random roots.
pub fn broadcast<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    for (k, (dtype, count, root, heap)) in
        draw((any_dtype(), counts(), 0..n, any::<u8>()), cases, seed("broadcast")).into_iter().enumerate()
    {
        let data = encode(dtype, &(0..count).map(|i| value(dtype, root, k, i)).collect::<Vec<_>>());
        let mut buf = Mem::new(comm, &world, heap, dtype, count);
        if me == root {
            buf.fill(&data);
        }
        comm.broadcast(&world, buf.local_mut(dtype, count), root, &CollOptions::default()).expect("broadcast");
        assert_eq!(buf.into_bytes(), data, "rank {me}: case {k}: broadcast {dtype} from {root}");
    }
}

/// Small broadcasts, whose root does not wait for its members: a root far ahead of late
/// members (flow control), rotating roots, and members that disagree (each gets an error, no
/// rank waits out the timeout, the group stays usable).
pub fn small_broadcasts<C: Collectives>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let opts = within(20);
    let tun = Tunables::from_env().expect("tunables");
    let validate = tun.validate;
    // Whether a broadcast of `bytes` is eager (SYMM_BCAST_EAGER_MAX, when set, may turn small
    // ones into rounds: their root then waits and fails with its members).
    // The reference collectives have no eager broadcast: each is a round.
    let eager = |bytes: usize| !on_reference(comm) && tun.bcast_eager_max.is_none_or(|max| bytes <= max);
    // 200 broadcasts (more than a root may run ahead of a member) from one root, while the other
    // members start late, then from rotating roots; sizes up to the eager limit and past it
    // (256 bytes where every rank has a core, 8 KiB where ranks share cores).
    if me != 0 {
        std::thread::sleep(Duration::from_millis(30));
    }
    for k in 0..400usize {
        let root = if k < 200 { 0 } else { k % n };
        let count = [1, 2, 10, 64, 65, 300, 2048, 2049][k % 8];
        let expect: Vec<i32> = (0..count).map(|i| (k * 1000 + i + root) as i32).collect();
        let mut buf = if me == root { expect.clone() } else { vec![-1; count] };
        comm.broadcast(&world, LocalMut::from(&mut buf), root, &opts).expect("small broadcast");
        assert!(buf == expect, "rank {me}: broadcast {k} from {root}");
    }
    if n < 2 {
        return;
    }
    let usable = |what: &str| {
        let mut x = vec![me as f64 + 1.0; 3];
        comm.allreduce(&world, LocalMut::from(&mut x), ReduceOp::Sum, &opts).expect(what);
        assert_eq!(x, vec![(n * (n + 1) / 2) as f64; 3], "rank {me}: {what}");
        let mut y = vec![if me == n - 1 { 7i16 } else { 0 }; 5];
        comm.broadcast(&world, LocalMut::from(&mut y), n - 1, &opts).expect(what);
        assert_eq!(y, vec![7i16; 5], "rank {me}: {what}");
    };
    // Members that disagree on the root: nobody sends; every rank fails.
    let mut buf = vec![0f32; 4];
    let e = comm.broadcast(&world, LocalMut::from(&mut buf), if me == 0 { 1 } else { 0 }, &opts).unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }) && e.to_string().contains("root="), "rank {me}: {e}");
    usable("after a root disagreement");
    // Counts that differ: the members fail naming both counts; the root, which does not wait
    // for them, succeeds (validation mode compares counts first: every rank fails).
    let mut buf = vec![1u8; if me == 0 { 8 } else { 9 }];
    let r = comm.broadcast(&world, LocalMut::from(&mut buf), 0, &opts);
    if me == 0 && !validate && eager(9) {
        r.expect("the root of a small broadcast does not wait for its members");
    } else {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Mismatch { .. }), "rank {me}: {e}");
        assert!(e.to_string().contains("count=8") && e.to_string().contains("count=9"), "rank {me}: {e}");
    }
    usable("after a count disagreement");
    // Calls in different orders: rank 0 broadcasts then reduces, the others reduce then
    // receive the broadcast. The reductions disagree on the broadcasts made before them.
    let mut x = vec![1i64; 2];
    let mut b = vec![if me == 0 { 5i64 } else { 0 }; 2];
    let (first, second) = if me == 0 {
        let first = comm.broadcast(&world, LocalMut::from(&mut b), 0, &opts);
        (first, comm.allreduce(&world, LocalMut::from(&mut x), ReduceOp::Sum, &opts))
    } else {
        let first = comm.allreduce(&world, LocalMut::from(&mut x), ReduceOp::Sum, &opts);
        (first, comm.broadcast(&world, LocalMut::from(&mut b), 0, &opts))
    };
    if validate || !eager(16) {
        // The validation round compares the operations, and a broadcast that is a round pairs
        // with the allreduce: both calls fail on every rank.
        assert!(first.is_err() && second.is_err(), "rank {me}: {first:?} {second:?}");
    } else {
        let (bcast, reduce) = if me == 0 { (first, second) } else { (second, first) };
        bcast.expect("the broadcast itself agrees");
        assert_eq!(b, vec![5i64; 2], "rank {me}: broadcast data");
        let e = reduce.unwrap_err();
        assert!(e.to_string().contains("small broadcasts"), "rank {me}: {e}");
        assert!(matches!(e, Error::Mismatch { .. }), "rank {me}: {e}");
    }
    usable("after calls in different orders");
    // One member rejects its root: it fails with its own error, the others complete the
    // broadcast from rank 0 (a rank waiting for the rejecting rank as root would fail instead).
    let mut buf = vec![if me == 0 { 3i32 } else { 0 }; 6];
    let r = comm.broadcast(&world, LocalMut::from(&mut buf), if me == n - 1 { n + 5 } else { 0 }, &opts);
    if me == n - 1 {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("root"), "rank {me}: {e}");
    } else if eager(24) {
        r.expect("broadcast with a rejecting member");
        assert_eq!(buf, vec![3i32; 6], "rank {me}");
    } else {
        // A round: the rejection reaches every member.
        assert!(matches!(r, Err(Error::PeerRejected { .. })), "rank {me}: {r:?}");
    }
    usable("after a rejection");
}

/// alltoall with random per-pair counts, list and single-buffer forms.
pub fn alltoall<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    for (k, (dtype, scale, single, heap)) in draw(
        (any_dtype(), prop_oneof![Just(0usize), Just(1), Just(300), Just(70_000)], any::<bool>(), any::<u8>()),
        cases,
        seed("alltoall"),
    )
    .into_iter()
    .enumerate()
    {
        let size = dtype.size();
        // count[s][d]: what s sends to d (deterministic, known to every rank).
        let count = |s: usize, d: usize| if scale == 0 { 0 } else { (s * 7 + d * 13 + k) % (scale + 1) };
        let seg = |s: usize, d: usize| {
            encode(dtype, &(0..count(s, d)).map(|i| value(dtype, s, k * 31 + d, i)).collect::<Vec<_>>())
        };
        let flat: Vec<u8> = (0..n).flat_map(|d| seg(me, d)).collect();
        let send_counts: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
        let total: usize = recv_counts.iter().sum();
        // Buffers are allocated collectively: every rank asks for the largest total sent or
        // received by anyone. Ranks whose bit of `heap` is set send from the heap (peers read
        // it in place), the others from plain memory (staged); receive buffers take the
        // opposite placement.
        let sent = |s: usize| (0..n).map(|d| count(s, d)).sum::<usize>();
        let received = |d: usize| (0..n).map(|s| count(s, d)).sum::<usize>();
        let largest = (0..n).map(|r| sent(r).max(received(r))).max().unwrap_or(0);
        let mut send = Mem::filled(comm, &world, heap, dtype, largest, &flat);
        let mut recv = Mem::filled(comm, &world, !heap, dtype, largest, &vec![0xEE; total * size]);
        let recv_ref = recv.local_mut(dtype, total);
        if single {
            comm.alltoall_single(
                &world,
                send.local_ref(dtype, flat.len() / size),
                &send_counts,
                recv_ref,
                &recv_counts,
                &CollOptions::default(),
            )
            .expect("alltoall_single");
        } else {
            let base = send.ptr();
            let starts = send_counts.iter().scan(0, |acc, &c| Some(std::mem::replace(acc, *acc + c)));
            // SAFETY: segment d lies inside the send buffer (`flat` fills it in order).
            let refs: Vec<LocalRef<'_>> = starts
                .zip(&send_counts)
                .map(|(lo, &c)| unsafe { LocalRef::from_raw(base.add(lo * size), c, dtype) })
                .collect();
            comm.alltoall(&world, &refs, recv_ref, &recv_counts, &CollOptions::default()).expect("alltoall");
        }
        let want: Vec<u8> = (0..n).flat_map(|s| seg(s, me)).collect();
        let got = recv.bytes(total * size);
        assert_eq!(got, want, "rank {me}: case {k}: alltoall {dtype} scale {scale} single {single} heap {heap:#x}");
        recv.release();
        send.release();
    }
    // Host buffers (the rejection itself is the same wherever the buffers are).
    if n > 1 && !heap_only(comm) {
        // The last member rejects its own arguments (recv_counts of the wrong length): it fails
        // with them, the others at once with PeerRejected (in validation mode too, whose second
        // round only members without a rejecting peer take), and the group stays usable.
        let counts = vec![1usize; n];
        let bad = if me == n - 1 { vec![1usize; n + 1] } else { counts.clone() };
        let src = vec![me as i32; n];
        let mut dst = vec![0i32; n];
        let opts = within(20);
        let r = comm.alltoall_single(&world, LocalRef::from(&src[..]), &counts, LocalMut::from(&mut dst), &bad, &opts);
        match r {
            Err(Error::InvalidArgument { .. }) if me == n - 1 => {}
            Err(Error::PeerRejected { .. }) if me != n - 1 => {}
            other => panic!("rank {me}: alltoall with a rejecting member: {other:?}"),
        }
        comm.alltoall_single(&world, LocalRef::from(&src[..]), &counts, LocalMut::from(&mut dst), &counts, &opts)
            .expect("alltoall after a rejection");
        assert_eq!(dst, (0..n as i32).collect::<Vec<_>>(), "rank {me}: alltoall after a rejection");
    }
}

/// send/recv around the ring: several messages in flight before the receiver is in recv,
/// messages larger than the mailbox, and empty ones.
pub fn sendrecv<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    let (next, prev) = ring(me, n);
    let opts = within(60);
    // Sizes (bytes) at the edges of the mailbox layout: the payload on the flag's line up to
    // 256 bytes, from the next line above; chunk payloads of `chunk - 64` bytes.
    let chunk = Tunables::from_env().expect("tunables").mail_chunk;
    for len in [40, 41, 255, 256, 257, chunk - 65, chunk - 64, chunk - 63, chunk - 24, 2 * (chunk - 64) + 1] {
        let out: Vec<u8> = (0..len).map(|i| (i * 7 + me * 13 + len) as u8).collect();
        let mut got = vec![0u8; len];
        comm.sendrecv(&world, LocalRef::from(&out[..]), next, LocalMut::from(&mut got), prev, &opts)
            .expect("sendrecv at a layout edge");
        let want: Vec<u8> = (0..len).map(|i| (i * 7 + prev * 13 + len) as u8).collect();
        assert!(got == want, "rank {me}: sendrecv of {len} bytes");
    }
    for (k, sizes) in draw(
        prop::collection::vec(prop_oneof![Just(0usize), 1usize..100, 100usize..300_000], 1..4),
        cases,
        seed("sendrecv"),
    )
    .into_iter()
    .enumerate()
    {
        // Small messages first so they fit the mailbox while nobody receives yet; a large one
        // streams through flow control.
        let msg = |r: usize, j: usize, len: usize| {
            (0..len).map(|i| (r * 1_000_003 + k * 7919 + j * 104_729 + i) as i32).collect::<Vec<i32>>()
        };
        let small: Vec<usize> = sizes.iter().copied().filter(|&s| s < 100).collect();
        let large: Vec<usize> = sizes.iter().copied().filter(|&s| s >= 100).collect();
        for (j, &len) in small.iter().enumerate() {
            comm.send(&world, LocalRef::from(&msg(me, j, len)), next, &opts).expect("send small");
        }
        for (j, &len) in small.iter().enumerate() {
            let mut got = vec![0i32; len];
            comm.recv(&world, LocalMut::from(&mut got), prev, &opts).expect("recv small");
            assert_eq!(got, msg(prev, j, len), "rank {me}: case {k}: small message {j}");
        }
        // Large messages: even ranks send first, odd ranks receive first (no deadlock with
        // flow control even for rings of odd length, since rank 0 sends and rank n-1 ... ).
        for (j, &len) in large.iter().enumerate() {
            let data = msg(me, 100 + j, len);
            let mut got = vec![0i32; len];
            if n == 1 {
                // A large self-message would need the receiver inside recv: skip.
                continue;
            }
            in_order(
                me.is_multiple_of(2),
                || comm.send(&world, LocalRef::from(&data), next, &opts).expect("send large"),
                || comm.recv(&world, LocalMut::from(&mut got), prev, &opts).expect("recv large"),
            );
            assert_eq!(got, msg(prev, 100 + j, len), "rank {me}: case {k}: large message {j}");
        }
    }
}

/// The largest message a send hands over without its receiver under the settings of this
/// run: the host engine's eager limit (larger messages from the heap go rendezvous), or the
/// reference collectives' mailbox (the CPU backend creates them with the default options).
fn eager_max<C: Collectives>(comm: &C) -> usize {
    if on_reference(comm) {
        ReferenceOptions::default().eager_max_bytes()
    } else {
        eager_max_bytes(&Tunables::from_env().expect("settings from the environment"))
    }
}

/// Message `j` of rank `r` in case `k`: `len` bytes that differ between ranks, cases,
/// messages and positions, so a misplaced or stale chunk shows.
fn p2p_bytes(r: usize, k: usize, j: usize, len: usize) -> Vec<u8> {
    let seed = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((k as u64) << 24) ^ ((j as u64) << 44);
    (0..len).map(|i| ((i as u64 ^ seed).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 56) as u8).collect()
}

/// send/recv of buffers in the symmetric heap: sizes below, at and above the rendezvous
/// threshold (messages larger than the mailbox go zero-copy) up to several MiB, into heap and
/// plain memory, each behind eager messages still in flight; then a rendezvous message that
/// does not match the receiver's buffer (size, then dtype): the receiver fails naming both, the
/// sender is released, and the pair stays usable.
pub fn sendrecv_heap<C: Collectives>(comm: &C) {
    let (me, world, n) = world_of(comm);
    if n == 1 {
        // A message larger than the mailbox to oneself needs the receiver inside recv while
        // the send is still going: sendrecv_both covers it.
        return;
    }
    let (next, prev) = ring(me, n);
    let opts = within(60);
    let t = eager_max(comm);
    let sizes = [t - 1, t, t + 1, 2 * t + 3, (3 << 20) + 5];
    let max = *sizes.iter().max().expect("sizes");
    let mut send = Mem::new(comm, &world, 0xff, DType::U8, max);
    // Even ranks send first, odd ranks receive first: a send larger than the mailbox returns
    // only once its receiver has taken the message.
    let even = me.is_multiple_of(2);
    for (k, &len) in sizes.iter().enumerate() {
        let mut recv = Mem::new(comm, &world, if k % 2 == 0 { 0xff } else { 0 }, DType::U8, len);
        send.fill(&p2p_bytes(me, k, 0, len));
        let small = [p2p_bytes(me, k, 1, 10), p2p_bytes(me, k, 2, 100)];
        in_order(
            even,
            || {
                for m in &small {
                    comm.send(&world, LocalRef::from(&m[..]), next, &opts).expect("send small");
                }
                comm.send(&world, send.local_ref(DType::U8, len), next, &opts).expect("send from the heap");
            },
            || {
                for (j, m) in [10, 100].into_iter().enumerate() {
                    let mut got = vec![0u8; m];
                    comm.recv(&world, LocalMut::from(&mut got), prev, &opts).expect("recv small");
                    assert!(got == p2p_bytes(prev, k, j + 1, m), "rank {me}: size {len}: small message {j}");
                }
                comm.recv(&world, recv.local_mut(DType::U8, len), prev, &opts).expect("recv of a heap message");
            },
        );
        assert!(recv.into_bytes() == p2p_bytes(prev, k, 0, len), "rank {me}: heap message of {len} bytes (case {k})");
    }
    // Mismatches on rendezvous messages: the sender is released (its send succeeds), the
    // receiver fails naming both, and the next message goes through.
    let len = t + 100;
    send.fill(&p2p_bytes(me, 90, 0, len));
    let mut short = vec![0u8; len - 1];
    let mut wide = vec![0i16; len / 2];
    in_order(
        even,
        || {
            comm.send(&world, send.local_ref(DType::U8, len), next, &opts).expect("send (size mismatch at recv)");
            comm.send(&world, send.local_ref(DType::U8, len), next, &opts).expect("send (dtype mismatch at recv)");
        },
        || {
            let e = comm.recv(&world, LocalMut::from(&mut short), prev, &opts).unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "rank {me}: {e}");
            let text = e.to_string();
            assert!(text.contains(&format!("{} elements", len - 1)) && text.contains(&format!("{len} bytes")), "{e}");
            let e = comm.recv(&world, LocalMut::from(&mut wide), prev, &opts).unwrap_err();
            assert!(e.to_string().contains("int16") && e.to_string().contains("uint8"), "rank {me}: {e}");
        },
    );
    let mut got = vec![0u8; len];
    in_order(
        even,
        || comm.send(&world, send.local_ref(DType::U8, len), next, &opts).expect("send after mismatches"),
        || comm.recv(&world, LocalMut::from(&mut got), prev, &opts).expect("recv after mismatches"),
    );
    assert!(got == p2p_bytes(prev, 90, 0, len), "rank {me}: message after the mismatches");
    send.release();
}

/// sendrecv: both directions at once, around the ring and between pairs (a rank without a
/// partner exchanges with itself), with heap and plain buffers on either side, sizes from 0 to
/// several MiB on both sides of the rendezvous threshold and different in the two directions,
/// and with a partner using plain send/recv in either order; then sendrecv mixed with queued
/// plain messages, mismatching receives and bad arguments.
pub fn sendrecv_both<C: Collectives>(comm: &C, cases: usize) {
    let (me, world, n) = world_of(comm);
    let (next, prev) = ring(me, n);
    let opts = within(60);
    let t = eager_max(comm);
    let base = prop_oneof![
        Just(0usize),
        1usize..64,
        64usize..4096,
        Just(t - 1),
        Just(t),
        Just(t + 1),
        t..4 * t,
        (1usize << 20)..(3usize << 20)
    ];
    let dtypes = [DType::U8, DType::F32, DType::I64];
    let strategy =
        (base, prop_oneof![Just(0usize), Just(3), Just(4093)], 0usize..3, 0usize..3, any::<u8>(), any::<u8>());
    for (k, (base, skew, mode, d, send_mask, recv_mask)) in
        draw(strategy, cases, seed("sendrecv_both")).into_iter().enumerate()
    {
        let dtype = dtypes[d];
        let size = dtype.size();
        // Rank r sends count(r) elements (to every destination).
        let count = |r: usize| (base + r * skew) / size;
        let partner = if me ^ 1 < n { me ^ 1 } else { me };
        let (dst, src) = if mode == 0 { (next, prev) } else { (partner, partner) };
        let max = (0..n).map(count).max().unwrap_or(0);
        let mut send = Mem::filled(comm, &world, send_mask, dtype, max, &p2p_bytes(me, k, 0, count(me) * size));
        let mut recv = Mem::new(comm, &world, recv_mask, dtype, max);
        let (sref, rmut) = (send.local_ref(dtype, count(me)), recv.local_mut(dtype, count(src)));
        let what = format!("case {k}: mode {mode} base {base} skew {skew} {dtype} masks {send_mask:#x}/{recv_mask:#x}");
        if mode == 2 && me % 2 == 1 && partner != me {
            // The partner's sendrecv must serve this rank whichever order it uses.
            in_order(
                k % 2 == 0,
                || comm.send(&world, sref, dst, &opts).expect("plain send to a sendrecv"),
                || comm.recv(&world, rmut, src, &opts).expect("plain recv from a sendrecv"),
            );
        } else {
            comm.sendrecv(&world, sref, dst, rmut, src, &opts).unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
        }
        assert!(
            recv.bytes(count(src) * size) == p2p_bytes(src, k, 0, count(src) * size),
            "rank {me}: {what}: wrong data from {src}"
        );
        send.release();
        recv.release();
    }
    // Plain and combined calls mix, in order: a queued plain message is what sendrecv
    // receives, and sendrecv's message is what the next plain recv gets.
    let (m0, m1) = (p2p_bytes(me, 50, 0, 33), p2p_bytes(me, 50, 1, 700));
    comm.send(&world, LocalRef::from(&m0[..]), next, &opts).expect("plain send before sendrecv");
    let mut got0 = vec![0u8; 33];
    comm.sendrecv(&world, LocalRef::from(&m1[..]), next, LocalMut::from(&mut got0), prev, &opts).expect("sendrecv");
    let mut got1 = vec![0u8; 700];
    comm.recv(&world, LocalMut::from(&mut got1), prev, &opts).expect("plain recv after sendrecv");
    assert!(got0 == p2p_bytes(prev, 50, 0, 33) && got1 == p2p_bytes(prev, 50, 1, 700), "rank {me}: order");
    // A receive that does not match fails naming both sizes, after the send is complete (one
    // message from the heap, rendezvous, one eager); the pair stays usable.
    let len = t + 50;
    let mut heap = Mem::filled(comm, &world, 0xff, DType::U8, len, &p2p_bytes(me, 60, 0, len));
    let small = p2p_bytes(me, 60, 1, 40);
    let mut long = vec![0u8; len + 1];
    let e = comm.sendrecv(&world, heap.local_ref(DType::U8, len), next, LocalMut::from(&mut long), prev, &opts);
    let e = e.unwrap_err();
    assert!(matches!(e, Error::Mismatch { .. }), "rank {me}: {e}");
    assert!(
        e.to_string().contains(&format!("{} elements", len + 1)) && e.to_string().contains(&format!("{len} bytes"))
    );
    let mut long = vec![0u8; 41];
    let e = comm.sendrecv(&world, LocalRef::from(&small[..]), next, LocalMut::from(&mut long), prev, &opts);
    assert!(e.unwrap_err().to_string().contains("40 bytes"), "rank {me}: eager mismatch");
    let mut got = vec![0u8; len];
    comm.sendrecv(&world, heap.local_ref(DType::U8, len), next, LocalMut::from(&mut got), prev, &opts)
        .expect("sendrecv after mismatches");
    assert!(got == p2p_bytes(prev, 60, 0, len), "rank {me}: sendrecv after mismatches");
    heap.release();
    // Bad arguments fail on the calling rank and touch no peer.
    let mut buf = vec![0u8; 64];
    let p = buf.as_mut_ptr();
    // SAFETY: both views lie in `buf`; the call rejects them before touching either.
    let (a, b) = unsafe { (LocalRef::from_raw(p, 32, DType::U8), LocalMut::from_raw(p.add(16), 32, DType::U8)) };
    let e = comm.sendrecv(&world, a, next, b, prev, &opts).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("overlap"), "rank {me}: {e}");
    assert_eq!(e.rank().index(), me, "{e}");
    let (x, mut y) = (vec![0u8; 4], vec![0u8; 4]);
    let e = comm.sendrecv(&world, LocalRef::from(&x[..]), n, LocalMut::from(&mut y), prev, &opts).unwrap_err();
    assert!(e.to_string().contains("dst_rank"), "rank {me}: {e}");
    let e = comm.sendrecv(&world, LocalRef::from(&x[..]), next, LocalMut::from(&mut y), n + 3, &opts).unwrap_err();
    assert!(e.to_string().contains("src_rank"), "rank {me}: {e}");
}

/// Bad input: errors on the calling rank, an error (not a hang) on the others, and the group
/// stays usable.
pub fn errors<C: Collectives>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let opts = within(20);
    let assert_rank = |e: &Error, what: &str| {
        assert_eq!(e.rank().index(), me, "{what}: {e}");
        assert!(e.to_string().contains(&format!("rank {me}")), "{what}: {e}");
    };
    // Counts that differ between ranks: every rank gets Mismatch. 4 against 5 lies on both
    // sides of the inline limit (16 bytes travel in the round's facts, 20 are staged): no rank
    // waits for data that never comes. 0 against 5: an empty call takes part in its round; one
    // that returned at once would leave the other ranks' call to be paired with its rank's next
    // one, which with equal arguments returns wrong sums, no error.
    if n >= 2 {
        for (first, others) in [(10, 11), (4, 5), (0, 5)] {
            let mut buf = vec![1.0f32; if me == 0 { first } else { others }];
            let e = comm.allreduce(&world, LocalMut::from(&mut buf), ReduceOp::Sum, &opts).unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "rank {me}: {e}");
            if first == 10 {
                assert_rank(&e, "count mismatch");
            }
            let text = e.to_string();
            assert!(text.contains(&format!("count={first}")) && text.contains(&format!("count={others}")), "{e}");
        }
        // Different ops.
        let mut buf = vec![1i32; 4];
        let op = if me == 0 { ReduceOp::Max } else { ReduceOp::Min };
        let e = comm.allreduce(&world, LocalMut::from(&mut buf), op, &opts).unwrap_err();
        assert!(e.to_string().contains("op=max") && e.to_string().contains("op=min"), "{e}");
    }
    // avg on integers: rejected locally on every rank (all pass the same arguments).
    let mut ints = vec![1i64; 3];
    let e = comm.allreduce(&world, LocalMut::from(&mut ints), ReduceOp::Avg, &opts).unwrap_err();
    assert!(e.to_string().contains("avg") && e.to_string().contains("int64"), "{e}");
    // One rank passes an output that is too small: it fails locally, the others hear of it.
    if n >= 2 {
        let input = vec![1.0f64; n * 4];
        let mut out = vec![0.0f64; if me == 1 { 3 } else { 4 }];
        let e = comm
            .reduce_scatter(&world, LocalMut::from(&mut out), LocalRef::from(&input), ReduceOp::Sum, &opts)
            .unwrap_err();
        if me == 1 {
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("input"), "{e}");
        } else {
            assert!(
                matches!(e, Error::PeerRejected { .. }) && e.to_string().contains("global rank 1"),
                "rank {me}: {e}"
            );
        }
        assert_rank(&e, "rejected");
    }
    // One rank rejects its call itself (an error found before the call): the others, waiting
    // in their allreduce, fail at once with PeerRejected.
    if n >= 2 {
        let mut buf = vec![1.0f32; 4];
        let r = if me == 1 {
            let why = ArgError::invalid("tensor", "<freed>", "released");
            comm.reject(&world, symm_core::dfx::Op::AllReduce, why)
        } else {
            comm.allreduce(&world, LocalMut::from(&mut buf), ReduceOp::Sum, &opts)
        };
        let e = r.unwrap_err();
        if me == 1 {
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("tensor = <freed>"), "{e}");
        } else {
            assert!(matches!(e, Error::PeerRejected { .. }) && e.to_string().contains("global rank 1"), "{e}");
        }
        assert_rank(&e, "rejected by the caller");
    }
    // Wrong dtype pairing.
    let input = vec![1.0f32; 4];
    let mut out = vec![0i32; 4 * n];
    let e = comm.allgather(&world, LocalMut::from(&mut out), LocalRef::from(&input), &opts).unwrap_err();
    assert!(e.to_string().contains("int32") && e.to_string().contains("float32"), "{e}");
    // An alltoall whose receive buffer overlaps what it sends: rejected on every rank (all
    // pass the same kind of arguments) before any byte moves.
    let mut both = vec![0i32; 2 * n];
    let at = both.as_mut_ptr().cast::<u8>();
    // SAFETY: both views lie inside `both`, which outlives the call; they overlap on purpose
    // and the call must refuse them before touching either.
    let (send, recv) =
        unsafe { (LocalRef::from_raw(at, n, DType::I32), LocalMut::from_raw(at.add(4 * n / 2), n, DType::I32)) };
    let counts = vec![1usize; n];
    let e = comm.alltoall_single(&world, send, &counts, recv, &counts, &opts).unwrap_err();
    assert!(e.to_string().contains("receive_tensor") && e.to_string().contains("overlaps"), "rank {me}: {e}");
    assert!(both.iter().all(|&x| x == 0), "rank {me}: nothing written: {both:?}");
    // Invalid root and peer.
    let mut b = vec![0u8; 4];
    let e = comm.broadcast(&world, LocalMut::from(&mut b), n + 1, &opts).unwrap_err();
    assert!(e.to_string().contains("root"), "{e}");
    let e = comm.send(&world, LocalRef::from(&b), n, &opts).unwrap_err();
    assert!(e.to_string().contains("dst_rank"), "{e}");
    // A recv whose size differs from the message: error naming both, pair still usable.
    if n >= 2 {
        let (next, prev) = ring(me, n);
        comm.send(&world, LocalRef::from(&[7i16; 5][..]), next, &opts).expect("send");
        let mut got = vec![0i16; 6];
        let e = comm.recv(&world, LocalMut::from(&mut got), prev, &opts).unwrap_err();
        assert!(e.to_string().contains("6 elements") && e.to_string().contains("10 bytes"), "{e}");
        comm.send(&world, LocalRef::from(&[9i16; 2][..]), next, &opts).expect("send");
        let mut got = vec![0i16; 2];
        comm.recv(&world, LocalMut::from(&mut got), prev, &opts).expect("recv after a mismatch");
        assert_eq!(got, [9, 9]);
    }
    // Unknown low-precision format.
    let mut buf = vec![1.0f32; 8];
    let e = comm
        .allreduce(&world, LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::low_precision(DType::I8))
        .unwrap_err();
    assert!(e.to_string().contains("low_precision_dtype"), "{e}");
    // The group still works.
    let mut buf = vec![me as f32 + 1.0; 33];
    comm.allreduce(&world, LocalMut::from(&mut buf), ReduceOp::Sum, &opts).expect("allreduce after errors");
    let want = (n * (n + 1) / 2) as f32;
    assert!(buf.iter().all(|&x| x == want), "rank {me}: {buf:?}");
}

/// Collectives in overlapping and disjoint groups, interleaved, never interfere.
pub fn groups<C: Collectives>(comm: &C) {
    let (me, world, n) = world_of(comm);
    let mut lists: Vec<Vec<usize>> =
        vec![(0..n).rev().collect(), (0..n).step_by(2).collect(), (1..n).step_by(2).collect()];
    if n >= 4 {
        lists.push(vec![3, 1]);
        lists.push(vec![0, 2, 3]);
    }
    lists.retain(|l| !l.is_empty());
    let groups: Vec<Group> = lists.iter().map(|l| comm.new_group(&world, l).expect("group")).collect();
    for round in 0..5 {
        for (l, g) in lists.iter().zip(&groups) {
            if g.my_rank().is_none() {
                continue;
            }
            let len = 1000 + round * 3001;
            let mut buf: Vec<i64> = (0..len).map(|i| (me * 1000 + i + round) as i64).collect();
            comm.allreduce(g, LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default())
                .expect("group allreduce");
            for (i, &v) in buf.iter().enumerate() {
                let want: i64 = l.iter().map(|&r| (r * 1000 + i + round) as i64).sum();
                assert_eq!(v, want, "rank {me}: group {l:?} round {round} element {i}");
            }
            let mine = [me as i32];
            let mut all = vec![0i32; l.len()];
            comm.allgather(g, LocalMut::from(&mut all), LocalRef::from(&mine[..]), &CollOptions::default())
                .expect("group allgather");
            assert_eq!(
                all,
                l.iter().map(|&r| r as i32).collect::<Vec<_>>(),
                "rank {me}: group {l:?}: gather in group order"
            );
        }
        let mut w = vec![1u8; 10];
        comm.allreduce(&world, LocalMut::from(&mut w), ReduceOp::Sum, &CollOptions::default())
            .expect("world allreduce");
        assert!(w.iter().all(|&x| x as usize == n % 256));
    }
}
