//! Reduction kernels: `dst[i] = op(src_0[i], src_1[i], ..., src_{n-1}[i])`, always in source
//! order, accumulating in a wider type where the element is narrow.
//!
//! The order is fixed and the accumulator type depends only on the dtype, so every rank that
//! reduces the same sources gets the same bits, whichever algorithm split the work.
//! Work proceeds in blocks of [`BLOCK`] elements through an accumulator array on the stack, so
//! each inner loop is a simple vectorisable pass over one source.

use super::copy::{copy, fence, Stores};
use crate::dtype::{bf16, f16, DType, F8E4M3, F8E5M2};
use crate::op::ReduceOp;

/// Elements per accumulation block (fits L1 with room for the sources).
pub const BLOCK: usize = 1024;

/// An element type that can be reduced.
pub trait Reduce: Copy + 'static {
    /// The accumulator type.
    type Acc: Copy + Default;
    /// Whether `Acc` is `Self` (no widening): the reduction can then run in place in `dst`,
    /// two plain streams at a time, which vectorises much better.
    const SAME: bool = false;
    /// Widens an element.
    fn widen(self) -> Self::Acc;
    /// Narrows an accumulator (rounding once).
    fn narrow(a: Self::Acc) -> Self;
    /// Sum of two accumulators (wrapping for integers, logical or for bool).
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Maximum (floats: NaN wins).
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Minimum (floats: NaN wins).
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a / n`, for `avg` (floats only; never called for other types).
    fn div(a: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! float_reduce {
    ($t:ty, $acc:ty, $widen:expr, $narrow:expr) => {
        impl Reduce for $t {
            type Acc = $acc;
            const SAME: bool = std::mem::size_of::<$t>() == std::mem::size_of::<$acc>();
            #[inline(always)]
            fn widen(self) -> $acc {
                $widen(self)
            }
            #[inline(always)]
            fn narrow(a: $acc) -> Self {
                $narrow(a)
            }
            #[inline(always)]
            fn add(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn max(a: $acc, b: $acc) -> $acc {
                if a > b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn min(a: $acc, b: $acc) -> $acc {
                if a < b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn div(a: $acc, n: usize) -> $acc {
                a / n as $acc
            }
        }
    };
}

float_reduce!(f32, f32, |x| x, |a| a);
float_reduce!(f64, f64, |x| x, |a| a);
float_reduce!(f16, f32, f16::to_f32, f16::from_f32);
float_reduce!(bf16, f32, bf16::to_f32, bf16::from_f32);
float_reduce!(F8E4M3, f32, |x: F8E4M3| x.to_f32(), F8E4M3::from_f32);
float_reduce!(F8E5M2, f32, |x: F8E5M2| x.to_f32(), F8E5M2::from_f32);

macro_rules! int_reduce {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            type Acc = $t;
            const SAME: bool = true;
            #[inline(always)]
            fn widen(self) -> $t { self }
            #[inline(always)]
            fn narrow(a: $t) -> Self { a }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t { a.wrapping_add(b) }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t { a.max(b) }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t { a.min(b) }
            #[inline(always)]
            fn div(a: $t, _n: usize) -> $t { a }
        }
    )*};
}

int_reduce!(i8, i16, i32, i64, u8);

/// Booleans travel as bytes 0/1: sum and max are "any", min is "all".
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct BoolByte(pub u8);

impl Reduce for BoolByte {
    type Acc = u8;
    #[inline(always)]
    fn widen(self) -> u8 {
        self.0
    }
    #[inline(always)]
    fn narrow(a: u8) -> Self {
        BoolByte(u8::from(a != 0))
    }
    #[inline(always)]
    fn add(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    fn max(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    fn min(a: u8, b: u8) -> u8 {
        a & b
    }
    #[inline(always)]
    fn div(a: u8, _n: usize) -> u8 {
        a
    }
}

#[inline(always)]
fn combine<T: Reduce>(op: ReduceOp, acc: &mut [T::Acc], src: *const T) {
    // The match is outside the loops so that each loop is a plain vectorisable pass.
    macro_rules! pass {
        ($f:path) => {
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `src` holds `acc.len()` elements (caller's contract of `reduce_typed`).
                *a = $f(*a, unsafe { src.add(i).read_unaligned() }.widen());
            }
        };
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pass!(T::add),
        ReduceOp::Max => pass!(T::max),
        ReduceOp::Min => pass!(T::min),
    }
}

/// `dst[i] = f(a[i], b[i])` for `len` elements (a plain, vectorisable pass).
///
/// When the pointers are aligned the pass runs over slices, which tell the compiler that the
/// written slice does not overlap the one it reads; with raw pointers it would check for
/// overlap at run time and, in place (`dst` is `a` or `b`), fall back to scalar code.
///
/// # Safety
/// `a` and `b` are valid for `len` reads, `dst` for `len` writes; `dst` is `a`, `b` or
/// disjoint from both; `a` and `b` are disjoint.
#[inline(always)]
unsafe fn pass2<T: Reduce>(a: *const T, b: *const T, dst: *mut T, len: usize, f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
    let aligned = [a as usize, b as usize, dst as usize].iter().all(|p| p % std::mem::align_of::<T>() == 0);
    if aligned && len > 0 {
        let op = |x: T, y: T| T::narrow(f(x.widen(), y.widen()));
        // SAFETY: in all three arms the pointers are aligned (checked), valid for `len` elements
        // (contract), and the mutable slice overlaps no shared slice alive at the same time:
        // in place it is the only slice over its memory, and `a`, `b` are disjoint.
        unsafe {
            if std::ptr::eq(dst, a) {
                let (acc, other) = (std::slice::from_raw_parts_mut(dst, len), std::slice::from_raw_parts(b, len));
                acc.iter_mut().zip(other).for_each(|(x, &y)| *x = op(*x, y));
            } else if std::ptr::eq(dst, b) {
                let (acc, other) = (std::slice::from_raw_parts_mut(dst, len), std::slice::from_raw_parts(a, len));
                acc.iter_mut().zip(other).for_each(|(y, &x)| *y = op(x, *y));
            } else {
                let d = std::slice::from_raw_parts_mut(dst, len);
                let (x, y) = (std::slice::from_raw_parts(a, len), std::slice::from_raw_parts(b, len));
                d.iter_mut().zip(x.iter().zip(y)).for_each(|(d, (&x, &y))| *d = op(x, y));
            }
        }
        return;
    }
    for i in 0..len {
        // SAFETY: i < len (contract); reading both before writing keeps exact aliasing correct.
        unsafe {
            let v = f(a.add(i).read_unaligned().widen(), b.add(i).read_unaligned().widen());
            dst.add(i).write_unaligned(T::narrow(v));
        }
    }
}

/// The reduction for types that accumulate in themselves: fold the sources into `dst` two
/// streams at a time, block by block (so `dst` stays in cache between passes). Same order as
/// [`reduce_typed`]: `((s0 op s1) op s2) ...`.
///
/// # Safety
/// As [`reduce_typed`], and `dst` is not one of `srcs[2..]` (it would be overwritten before
/// being read).
unsafe fn reduce_same<T: Reduce>(op: ReduceOp, srcs: &[*const T], dst: *mut T, count: usize) {
    let n = srcs.len();
    macro_rules! fold {
        ($f:path) => {{
            let mut start = 0;
            while start < count {
                let len = (BLOCK * 8).min(count - start);
                // SAFETY: `start + len <= count` for every source and `dst` (contract).
                unsafe {
                    let d = dst.add(start);
                    if n == 1 {
                        std::ptr::copy(srcs[0].add(start), d, len);
                    } else {
                        pass2::<T>(srcs[0].add(start), srcs[1].add(start), d, len, $f);
                        for src in &srcs[2..] {
                            pass2::<T>(d, src.add(start), d, len, $f);
                        }
                    }
                }
                start += len;
            }
        }};
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => fold!(T::add),
        ReduceOp::Max => fold!(T::max),
        ReduceOp::Min => fold!(T::min),
    }
    if op == ReduceOp::Avg {
        for i in 0..count {
            // SAFETY: i < count, inside `dst`.
            unsafe {
                let p = dst.add(i);
                p.write_unaligned(T::narrow(T::div(p.read_unaligned().widen(), n)));
            }
        }
    }
}

/// Typed n-ary reduction.
///
/// # Safety
/// Every `srcs[j]` is valid for reads of `count` elements, `dst` for writes of `count`
/// elements; `dst` may be one of the sources (each block is read completely before it is
/// written) but must not partially overlap any source; nobody writes the sources meanwhile.
pub unsafe fn reduce_typed<T: Reduce>(op: ReduceOp, srcs: &[*const T], dst: *mut T, count: usize) {
    let n = srcs.len();
    if T::SAME && !srcs.iter().skip(2).any(|&s| std::ptr::eq(s, dst)) {
        // SAFETY: forwarded; `dst` is not a source read after the first pass.
        return unsafe { reduce_same(op, srcs, dst, count) };
    }
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < count {
        let len = BLOCK.min(count - start);
        let acc = &mut acc[..len];
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `start + i < count`, within the first source (caller's contract).
            *a = unsafe { srcs[0].add(start + i).read_unaligned() }.widen();
        }
        for src in &srcs[1..] {
            // SAFETY: `start + len <= count`, within this source.
            combine::<T>(op, acc, unsafe { src.add(start) });
        }
        if op == ReduceOp::Avg {
            for a in acc.iter_mut() {
                *a = T::div(*a, n);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: `start + i < count`, within `dst` (caller's contract).
            unsafe { dst.add(start + i).write_unaligned(T::narrow(*a)) };
        }
        start += len;
    }
}

/// Dispatches [`reduce_typed`] on `dtype`. `avg` must only reach floating dtypes (validated by
/// the caller).
///
/// # Safety
/// As [`reduce_typed`], with counts in elements of `dtype`.
pub unsafe fn reduce(dtype: DType, op: ReduceOp, srcs: &[*const u8], dst: *mut u8, count: usize) {
    macro_rules! go {
        ($t:ty) => {{
            // SAFETY: thin pointers have one layout whatever they point to, so the slice of
            // byte pointers is a slice of typed pointers; the rest is this function's contract.
            unsafe {
                let typed = std::slice::from_raw_parts(srcs.as_ptr().cast::<*const $t>(), srcs.len());
                reduce_typed::<$t>(op, typed, dst.cast::<$t>(), count)
            }
        }};
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::F16 => go!(f16),
        DType::BF16 => go!(bf16),
        DType::F8E4M3 => go!(F8E4M3),
        DType::F8E5M2 => go!(F8E5M2),
        DType::I8 => go!(i8),
        DType::I16 => go!(i16),
        DType::I32 => go!(i32),
        DType::I64 => go!(i64),
        DType::U8 => go!(u8),
        DType::Bool => go!(BoolByte),
    }
}

/// Bytes of the block [`reduce_fan_out`] reduces before writing it out: inside L2, so
/// the result is read back from there for every destination.
const FAN_BLOCK_BYTES: usize = 64 << 10;

/// Reduces the sources once and writes the result to every destination in `dsts` (the
/// caller's own output and peers' outputs: the push of a reduced part), block by block
/// through a buffer in L2, with the given stores (ordinary ones for a destination that is
/// also a source). Fences streaming stores before returning, so a release store that follows
/// publishes the results.
///
/// # Safety
/// As [`reduce`] for every destination: each is valid for `count` writes, may be exactly one
/// of the sources (each block is read from every source before any destination is written)
/// and partially overlaps none of them; destinations are pairwise disjoint.
pub unsafe fn reduce_fan_out(
    dtype: DType,
    op: ReduceOp,
    srcs: &[*const u8],
    dsts: &[*mut u8],
    count: usize,
    stores: Stores,
) {
    let size = dtype.size();
    // A destination that is also a source (in place) is in the cache once its block has been
    // read: ordinary stores cost no extra read there, and streaming would only evict it.
    let per_dst: Vec<Stores> =
        dsts.iter().map(|&d| if srcs.contains(&d.cast_const()) { Stores::Cached } else { stores }).collect();
    if let ([dst], [Stores::Cached]) = (dsts, per_dst.as_slice()) {
        // One destination in the cache: reduce straight into it.
        // SAFETY: forwarded.
        return unsafe { reduce(dtype, op, srcs, *dst, count) };
    }
    // u64 words keep the block aligned for every dtype.
    let mut block = [0u64; FAN_BLOCK_BYTES / 8];
    let tmp = block.as_mut_ptr().cast::<u8>();
    let per_block = FAN_BLOCK_BYTES / size;
    let mut moved: Vec<*const u8> = srcs.to_vec();
    let mut start = 0;
    while start < count {
        let len = per_block.min(count - start);
        for (m, s) in moved.iter_mut().zip(srcs) {
            *m = s.wrapping_add(start * size);
        }
        // SAFETY: every source holds `start + len` elements (contract); `tmp` holds
        // `per_block >= len` and is disjoint from all of them.
        unsafe { reduce(dtype, op, &moved, tmp, len) };
        for (&dst, &how) in dsts.iter().zip(&per_dst) {
            // SAFETY: `dst` holds `count` elements (contract); `tmp` is disjoint from it.
            unsafe { copy(tmp, dst.add(start * size), len * size, how) };
        }
        start += len;
    }
    fence(stores);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Reduce>(op: ReduceOp, srcs: &[Vec<T>]) -> Vec<T> {
        let count = srcs[0].len();
        let ptrs: Vec<*const T> = srcs.iter().map(|s| s.as_ptr()).collect();
        let mut out = srcs[0].clone();
        // SAFETY: every source and `out` hold `count` elements.
        unsafe { reduce_typed(op, &ptrs, out.as_mut_ptr(), count) };
        out
    }

    #[test]
    fn sums_in_rank_order_with_wide_accumulation() {
        // In f16, 2048 + 1 + 1 rounds to 2048 step by step, but to 2050 in f32 then once to f16.
        let a = vec![f16::from_f32(2048.0); 3];
        let b = vec![f16::from_f32(1.0); 3];
        let out = run(ReduceOp::Sum, &[a, b.clone(), b]);
        assert_eq!(out[0].to_f32(), 2050.0);
    }

    #[test]
    fn ops_on_floats_ints_and_bools() {
        let out = run(ReduceOp::Max, &[vec![1.0f32, f32::NAN, -3.0], vec![2.0, 0.0, f32::NAN]]);
        assert_eq!(out[0], 2.0);
        assert!(out[1].is_nan() && out[2].is_nan());
        assert_eq!(run(ReduceOp::Min, &[vec![5i32, -7], vec![3, 9]]), vec![3, -7]);
        assert_eq!(run(ReduceOp::Sum, &[vec![i8::MAX], vec![1i8]]), vec![i8::MIN]);
        assert_eq!(run(ReduceOp::Avg, &[vec![1.0f64, 2.0], vec![2.0, 4.0]]), vec![1.5, 3.0]);
        let bools = |v: &[u8]| v.iter().map(|&b| BoolByte(b)).collect::<Vec<_>>();
        let s = run(ReduceOp::Sum, &[bools(&[0, 1, 0]), bools(&[0, 0, 1])]);
        assert_eq!(s.iter().map(|b| b.0).collect::<Vec<_>>(), [0, 1, 1]);
        let m = run(ReduceOp::Min, &[bools(&[1, 1, 0]), bools(&[1, 0, 1])]);
        assert_eq!(m.iter().map(|b| b.0).collect::<Vec<_>>(), [1, 0, 0]);
    }

    #[test]
    fn in_place_and_longer_than_a_block() {
        let n = BLOCK * 2 + 17;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (2 * i) as f32).collect();
        let mut inout = a.clone();
        let ptrs = [inout.as_ptr(), b.as_ptr()];
        // SAFETY: all buffers hold `n` elements; dst is exactly the first source.
        unsafe { reduce_typed(ReduceOp::Sum, &ptrs, inout.as_mut_ptr(), n) };
        assert!(inout.iter().enumerate().all(|(i, &v)| v == (3 * i) as f32));
    }

    #[test]
    fn fan_out_writes_the_same_result_everywhere() {
        let stores = [Stores::Cached, Stores::Streaming];
        // Two blocks and a part of a third of f32. Under miri (about a thousand times slower)
        // one block and a part of a second, of f64, which has the fewest elements per block,
        // and streaming stores only: that run writes the destination that is a source with
        // ordinary stores and the other one with streaming stores, so it takes both paths.
        if cfg!(miri) {
            fan_out_case(DType::F64, |i| i as f64, FAN_BLOCK_BYTES / 8 + 5, &stores[1..]);
        } else {
            fan_out_case(DType::F32, |i| i as f32, FAN_BLOCK_BYTES / 4 * 2 + 5, &stores);
        }
    }

    /// [`reduce_fan_out`] of `n` elements of dtype `d` (Rust type `T`, `of(i)`: the value of
    /// integer `i`) into a destination that is a source and one that is not, with each of
    /// `all_stores`.
    fn fan_out_case<T: Copy + PartialEq + std::fmt::Debug>(
        d: DType,
        of: fn(usize) -> T,
        n: usize,
        all_stores: &[Stores],
    ) {
        assert_eq!(d.size(), std::mem::size_of::<T>());
        let a: Vec<T> = (0..n).map(of).collect();
        let b: Vec<T> = (0..n).map(|i| of(i % 7)).collect();
        for &stores in all_stores {
            let mut inout = a.clone();
            let mut other = vec![of(0); n];
            let srcs = [inout.as_ptr().cast::<u8>(), b.as_ptr().cast::<u8>()];
            let dsts = [inout.as_mut_ptr().cast::<u8>(), other.as_mut_ptr().cast::<u8>()];
            // SAFETY: every buffer holds `n` elements of `d`; the first destination is exactly
            // the first source, the second is disjoint from both.
            unsafe { reduce_fan_out(d, ReduceOp::Sum, &srcs, &dsts, n, stores) };
            let want: Vec<T> = (0..n).map(|i| of(i + i % 7)).collect();
            assert_eq!(inout, want, "{stores:?}");
            assert_eq!(other, want, "{stores:?}");
        }
    }
}
