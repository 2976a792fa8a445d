//! Accuracy measurement of allreduce on adversarial data, against an f64 reference, with the
//! guaranteed bounds of `docs/accuracy.md`. Used by the `symm-accuracy` report and by the
//! `accuracy` test, which fails when a measured error exceeds its guarantee.

use symm_core::coll::lowp::SCALE_BLOCK;
use symm_core::{CollOptions, Collectives, DType, LocalMut, ReduceOp, Transport};

use crate::coll_cases::{decode, encode};

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
            if r % 2 == 0 {
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

/// Unit roundoff of the data/accumulator types.
fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
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
}

/// Runs one allreduce sum of `count` elements of data set `set` on this rank's group and
/// measures it against the f64 reference (every rank computes the same measurement).
pub fn measure<C: Collectives>(comm: &C, set: &str, dtype: DType, lp: Option<DType>, count: usize) -> Measured {
    let world = comm.world();
    let n = world.size();
    let me = comm.rank().index();
    let mut inputs: Vec<Vec<f64>> = (0..n)
        .map(|r| decode(dtype, &encode(dtype, &(0..count).map(|i| adversarial(set, dtype, r, i)).collect::<Vec<_>>())))
        .collect();
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

    // Block magnitudes of every rank's finite data, and of the reference result.
    let block_amax = |v: &[f64]| -> Vec<f64> {
        v.chunks(SCALE_BLOCK).map(|c| c.iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()))).collect()
    };
    let reference: Vec<f64> = (0..count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let input_blocks: Vec<Vec<f64>> = inputs.iter().map(|x| block_amax(x)).collect();
    let result_blocks = block_amax(&reference);
    let u_acc = if dtype == DType::F64 { unit_roundoff(DType::F64) } else { unit_roundoff(DType::F32) };
    let u_out = unit_roundoff(dtype);
    let u_l = guaranteed_unit(lp);
    let floor = floor_of(lp, dtype) * (2 * n + 2) as f64;
    let mut m =
        Measured { worst_unit: 0.0, guaranteed_unit: 0.0, worst_relative: 0.0, violations: 0, nonfinite_ok: true };
    for i in 0..count {
        let (g, r) = (got[i], reference[i]);
        if !r.is_finite() {
            m.nonfinite_ok &= (r.is_nan() && g.is_nan()) || g == r;
            continue;
        }
        let b = i / SCALE_BLOCK;
        let abs_sum: f64 = inputs.iter().map(|x| x[i].abs()).sum();
        let (scale, guaranteed_unit) = match lp {
            Some(_) => {
                let blocks: f64 = input_blocks.iter().map(|x| x[b]).sum::<f64>() + result_blocks[b];
                (blocks, u_l)
            }
            None => (abs_sum, n as f64 * u_acc),
        };
        let bound = guaranteed_unit * scale + n as f64 * u_acc * abs_sum + u_out * r.abs() + floor;
        let err = (g - r).abs();
        if err > bound {
            m.violations += 1;
        }
        if scale > 0.0 {
            m.worst_unit = m.worst_unit.max(err / scale);
        }
        if r.abs() > 1e-3 * scale && r != 0.0 {
            m.worst_relative = m.worst_relative.max(err / r.abs());
        }
        m.guaranteed_unit = guaranteed_unit;
    }
    m
}
