//! Accuracy measurement of allreduce on adversarial data, against an f64 reference, with the
//! guaranteed bounds of `docs/accuracy.md`, and the RFC's low-precision pipeline written out
//! ([`pipeline`]) that results in a transport format must equal bit for bit. Used by the
//! `symm-accuracy` report, by the `accuracy` test, which fails when a measured error exceeds its
//! guarantee or a result differs from the pipeline, and by the `low_precision_pipeline` case.

use symm_core::coll::lowp::SCALE_BLOCK;
use symm_core::{CollOptions, Collectives, DType, LocalMut, ReduceOp, Transport};

use crate::coll_cases::{decode, encode, eps, rounded};

/// Data sets, by name.
pub const DATASETS: &[&str] = &["normal", "tiny", "huge", "mixed", "zeros_subnormals", "cancellation"];

/// Element `i` of rank `r` in data set `set` (before rounding to the data dtype).
pub fn adversarial(set: &str, dtype: DType, r: usize, i: usize) -> f64 {
    let h = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = h ^ (h >> 31);
    let unit = (h % 1_000_003) as f64 / 1_000_003.0 * 2.0 - 1.0; // in [-1, 1)
    let (lo, hi) = match dtype {
        DType::F64 => (-300, 300),
        DType::F32 | DType::BF16 => (-36, 36),
        _ => (-6, 4), // fp16's range
    };
    match set {
        "normal" => unit,
        "tiny" => unit * 10f64.powi(lo + 2),
        "huge" => unit * 10f64.powi(hi - 2),
        // Magnitudes spread over the whole range inside every block.
        "mixed" => unit * 10f64.powi(lo + 2 + ((h >> 20) % (hi - lo - 3) as u64) as i32),
        // Zeros, signed zeros and values at the bottom of the range (subnormal in the data type).
        "zeros_subnormals" => match h % 4 {
            0 => 0.0,
            1 => -0.0,
            _ => {
                unit * match dtype {
                    DType::F64 => 1e-310,
                    DType::F32 | DType::BF16 => 1e-40,
                    _ => 3e-6,
                }
            }
        },
        // Rank r and rank r+1 nearly cancel, leaving small sums.
        "cancellation" => {
            let base = ((i % 97) as f64 - 48.0) * 1000.0;
            if r.is_multiple_of(2) {
                base + unit
            } else {
                -base + unit * 0.5
            }
        }
        _ => unreachable!("unknown data set {set}"),
    }
}

/// Relative error of a transport format against its block's largest magnitude (guaranteed).
pub fn guaranteed_unit(lp: Option<DType>) -> f64 {
    match lp {
        Some(DType::F8E4M3) => 1.0 / 14.0,
        Some(DType::F8E5M2) => 1.0 / 7.0,
        Some(DType::F16) => 1.0 / 2047.0,
        Some(DType::BF16) => 1.0 / 256.0,
        _ => 0.0,
    }
}

/// Smallest positive subnormal spacing of a format (absolute floor of its rounding error).
fn floor_of(lp: Option<DType>, d: DType) -> f64 {
    let data_floor = match d {
        DType::F64 => 5e-324,
        DType::F32 => 1.5e-45,
        DType::F16 => 6e-8,
        DType::BF16 => 1e-40,
        _ => 0.0,
    };
    data_floor + if lp == Some(DType::BF16) { 2f64.powi(-133) } else { 0.0 }
}

/// The result of measuring one configuration.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Largest error divided by its scale (the block magnitudes for a format, the absolute sum
    /// otherwise).
    pub worst_unit: f64,
    /// The guaranteed value of `worst_unit`.
    pub guaranteed_unit: f64,
    /// Largest error relative to |reference| over elements with |reference| > 1e-3 * scale.
    pub worst_relative: f64,
    /// Elements whose error exceeded the guaranteed bound.
    pub violations: usize,
    /// Whether non-finite inputs gave the same non-finite results as the reference.
    pub nonfinite_ok: bool,
    /// With a transport format: elements whose bits differ from the RFC's pipeline
    /// ([`pipeline`]; 0 when every element equals it), and the pipeline's own largest error
    /// relative to the same scale as `worst_unit`.
    pub pipeline_differs: usize,
    pub pipeline_worst_unit: f64,
}

/// Runs one allreduce sum of `count` elements of data set `set` on this rank's group and
/// measures it against the f64 reference (every rank computes the same measurement).
pub fn measure<C: Collectives>(comm: &C, set: &str, dtype: DType, lp: Option<DType>, count: usize) -> Measured {
    let world = comm.world();
    let n = world.size();
    let me = comm.rank().index();
    let mut inputs: Vec<Vec<f64>> =
        (0..n).map(|r| rounded(dtype, (0..count).map(|i| adversarial(set, dtype, r, i)))).collect();
    // Non-finite values ride along in the last block of rank 0 (they must propagate).
    if count >= 3 && dtype.is_float() {
        inputs[0][count - 1] = f64::NAN;
        inputs[0][count - 2] = f64::INFINITY;
        inputs[(1).min(n - 1)][count - 3] = f64::NEG_INFINITY;
    }
    let mut buf = encode(dtype, &inputs[me]);
    // SAFETY: `buf` holds `count` elements of `dtype`.
    let bm = unsafe { LocalMut::from_raw(buf.as_mut_ptr(), count, dtype) };
    let opts = CollOptions { transport: lp.map_or(Transport::Full, Transport::Low), ..CollOptions::default() };
    comm.allreduce(&world, bm, ReduceOp::Sum, &opts).expect("allreduce");
    let got = decode(dtype, &buf);

    // The RFC's pipeline, on every rank: what a format's result must equal, bit for bit.
    let piped = lp.map(|lp| {
        let decoded: Vec<Vec<f64>> = inputs.iter().map(|x| pipeline::through(dtype, lp, x)).collect();
        pipeline::reduce(dtype, ReduceOp::Sum, &decoded)
    });
    let pipeline_differs = piped.as_ref().map_or(0, |p| pipeline::differences(dtype, &buf, p).map_or(0, |d| d.0));
    let piped = piped.map(|p| decode(dtype, &p));

    // Block magnitudes of every rank's finite data.
    let block_amax = |v: &[f64]| -> Vec<f64> {
        v.chunks(SCALE_BLOCK).map(|c| c.iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()))).collect()
    };
    let reference: Vec<f64> = (0..count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let input_blocks: Vec<Vec<f64>> = inputs.iter().map(|x| block_amax(x)).collect();
    let u_acc = if dtype == DType::F64 { eps(DType::F64) } else { eps(DType::F32) };
    let u_out = eps(dtype);
    let u_l = guaranteed_unit(lp);
    let floor = floor_of(lp, dtype) * (2 * n + 2) as f64;
    let mut m = Measured {
        worst_unit: 0.0,
        guaranteed_unit: 0.0,
        worst_relative: 0.0,
        violations: 0,
        nonfinite_ok: true,
        pipeline_differs,
        pipeline_worst_unit: 0.0,
    };
    for i in 0..count {
        let (g, r) = (got[i], reference[i]);
        if !r.is_finite() {
            m.nonfinite_ok &= (r.is_nan() && g.is_nan()) || g == r;
            continue;
        }
        let b = i / SCALE_BLOCK;
        let abs_sum: f64 = inputs.iter().map(|x| x[i].abs()).sum();
        let (scale, guaranteed_unit) = match lp {
            Some(_) => (input_blocks.iter().map(|x| x[b]).sum::<f64>(), u_l),
            None => (abs_sum, n as f64 * u_acc),
        };
        let bound = guaranteed_unit * scale + n as f64 * u_acc * abs_sum + u_out * r.abs() + floor;
        let err = (g - r).abs();
        if err > bound {
            m.violations += 1;
        }
        if scale > 0.0 {
            m.worst_unit = m.worst_unit.max(err / scale);
            if let Some(p) = &piped {
                m.pipeline_worst_unit = m.pipeline_worst_unit.max((p[i] - r).abs() / scale);
            }
        }
        if r.abs() > 1e-3 * scale && r != 0.0 {
            m.worst_relative = m.worst_relative.max(err / r.abs());
        }
        m.guaranteed_unit = guaranteed_unit;
    }
    m
}

/// The RFC's low-precision pipeline, written out element by element for the tests to compare
/// symm's results with, bit for bit: every rank's input is cast to the transport format (with
/// the block scaling of docs/accuracy.md), cast back into the accumulation type (f32; f64 for
/// f64 data), accumulated in group-rank order, divided by the group size for `avg`, and cast
/// once into the data dtype. Written from the specification, independently of symm's kernels.
pub mod pipeline {
    use symm_core::coll::lowp::SCALE_BLOCK;
    use symm_core::{bf16, f16, DType, ReduceOp};

    /// A transport format as the arithmetic sees it: significant bits (the implicit one
    /// included), the exponent of its smallest normal value, and the magnitude a block's
    /// largest finite value is scaled to (docs/accuracy.md).
    struct Spec {
        bits: i32,
        min_normal_exp: i32,
        target: f64,
    }

    fn spec(lp: DType) -> Spec {
        match lp {
            DType::F16 => Spec { bits: 11, min_normal_exp: -14, target: 65504.0 },
            DType::BF16 => Spec { bits: 8, min_normal_exp: -126, target: 2f64.powi(127) },
            DType::F8E4M3 => Spec { bits: 4, min_normal_exp: -6, target: 224.0 },
            DType::F8E5M2 => Spec { bits: 3, min_normal_exp: -14, target: 57344.0 },
            _ => panic!("{lp} is not a transport format"),
        }
    }

    /// `x * 2^e`, in steps that keep every factor a normal f64 (exact unless the product
    /// leaves the normal range).
    fn scale(mut x: f64, mut e: i32) -> f64 {
        while e > 1000 {
            x *= 2f64.powi(1000);
            e -= 1000;
        }
        while e < -1000 {
            x *= 2f64.powi(-1000);
            e += 1000;
        }
        x * 2f64.powi(e)
    }

    /// `floor(log2(a))` of a finite positive `a` (subnormals included).
    fn binade(a: f64) -> i32 {
        let bits = a.to_bits();
        let biased = ((bits >> 52) & 0x7ff) as i32;
        if biased == 0 {
            -1074 + 63 - (bits & ((1 << 52) - 1)).leading_zeros() as i32
        } else {
            biased - 1023
        }
    }

    /// `y` rounded to the nearest value of a format with `bits` significant bits and normal
    /// exponents from `min_normal_exp` (ties to even; no overflow: the block scaling keeps
    /// finite values at most at the format's target, which is one of its values).
    fn round_to(y: f64, s: &Spec) -> f64 {
        if y == 0.0 {
            return y;
        }
        let ulp_exp = binade(y.abs()).max(s.min_normal_exp) - (s.bits - 1);
        scale(scale(y, -ulp_exp).round_ties_even(), ulp_exp)
    }

    /// The block exponent `e`: the block's largest finite magnitude `amax` divided by `2^e`
    /// lies in `(target / 2, target]`; 0 for a block without finite nonzero values.
    fn block_exponent(amax: f64, target: f64) -> i32 {
        if amax == 0.0 {
            return 0;
        }
        let mut e = binade(amax) - binade(target);
        while scale(amax, -e) > target {
            e += 1;
        }
        while scale(amax, -(e - 1)) <= target {
            e -= 1;
        }
        e
    }

    /// One rank's values (already in the data dtype `d`) after the trip through format `lp`,
    /// in the accumulation type: blocks of [`SCALE_BLOCK`] from the start of `x`, each scaled
    /// by its power of two, rounded into the format, scaled back; NaN and infinities as they
    /// were.
    pub fn through(d: DType, lp: DType, x: &[f64]) -> Vec<f64> {
        let s = spec(lp);
        let mut out = Vec::with_capacity(x.len());
        for block in x.chunks(SCALE_BLOCK) {
            let amax = block.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(v.abs()));
            let e = block_exponent(amax, s.target);
            out.extend(block.iter().map(|&v| {
                let back = if v.is_finite() { scale(round_to(scale(v, -e), &s), e) } else { v };
                if d == DType::F64 {
                    back
                } else {
                    f64::from(back as f32)
                }
            }));
        }
        out
    }

    /// Arithmetic of an accumulation type.
    trait Acc: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Div<Output = Self> {
        fn of(x: f64) -> Self;
        fn is_nan(self) -> bool;
        fn to_f64(self) -> f64;
    }
    impl Acc for f32 {
        fn of(x: f64) -> f32 {
            x as f32
        }
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
        fn to_f64(self) -> f64 {
            f64::from(self)
        }
    }
    impl Acc for f64 {
        fn of(x: f64) -> f64 {
            x
        }
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
        fn to_f64(self) -> f64 {
            self
        }
    }

    /// `acc = acc (op) x_r` for r = 0..n-1 in type `A`, starting from rank 0's value; NaN wins
    /// max and min; `avg` divides the sum by n.
    fn fold<A: Acc>(op: ReduceOp, column: impl Iterator<Item = f64>, n: usize) -> f64 {
        let mut acc: Option<A> = None;
        for x in column.map(A::of) {
            acc = Some(match acc {
                None => x,
                Some(a) => match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + x,
                    ReduceOp::Max if a.is_nan() || a > x => a,
                    ReduceOp::Min if a.is_nan() || a < x => a,
                    ReduceOp::Max | ReduceOp::Min => x,
                },
            });
        }
        let acc = acc.expect("at least one rank");
        if op == ReduceOp::Avg {
            (acc / A::of(n as f64)).to_f64()
        } else {
            acc.to_f64()
        }
    }

    /// The accumulated value (f32 or f64) cast once into the data dtype `d`, as bytes.
    fn cast_out(d: DType, acc: f64, out: &mut Vec<u8>) {
        match d {
            DType::F64 => out.extend(acc.to_le_bytes()),
            DType::F32 => out.extend((acc as f32).to_le_bytes()),
            DType::F16 => out.extend(f16::from_f32(acc as f32).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f32(acc as f32).to_le_bytes()),
            _ => panic!("{d} is not carried in a transport format"),
        }
    }

    /// The pipeline's result, as bytes of `d`, from every rank's values after [`through`]
    /// (`decoded[r]`, in group-rank order).
    pub fn reduce(d: DType, op: ReduceOp, decoded: &[Vec<f64>]) -> Vec<u8> {
        let (n, count) = (decoded.len(), decoded[0].len());
        let mut out = Vec::with_capacity(count * d.size());
        for i in 0..count {
            let column = decoded.iter().map(|x| x[i]);
            let acc = if d == DType::F64 { fold::<f64>(op, column, n) } else { fold::<f32>(op, column, n) };
            cast_out(d, acc, &mut out);
        }
        out
    }

    /// Where `got` differs from `want` (bytes of `d`; NaN equals NaN whatever its bits): the
    /// number of elements and the first one, described.
    pub fn differences(d: DType, got: &[u8], want: &[u8]) -> Option<(usize, String)> {
        let (g, w) = (super::decode(d, got), super::decode(d, want));
        let size = d.size();
        let mut first = None;
        let mut count = 0;
        for i in 0..g.len().max(w.len()) {
            let same = match (g.get(i), w.get(i)) {
                (Some(a), Some(b)) if a.is_nan() && b.is_nan() => true,
                (Some(_), Some(_)) => got[i * size..(i + 1) * size] == want[i * size..(i + 1) * size],
                _ => false,
            };
            if !same {
                count += 1;
                first.get_or_insert_with(|| format!("element {i}: got {:?}, want {:?}", g.get(i), w.get(i)));
            }
        }
        first.map(|f| (count, f))
    }
}
