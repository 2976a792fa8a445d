//! A reduction as the device runs it: `out = op(src_0, ..., src_{n-1})`, element by element in
//! source order, as a sequence of elementwise operators ([`plan`]) that the backend issues
//! with aclnn (`comm.rs`) and the tests here interpret on the host.
//!
//! The plan follows the CPU kernels (`symm_core::coll::kernels::reduce`): the same accumulator
//! type ([`accumulator`]: float32 for the 16- and 8-bit floats), sources combined one at a
//! time in order, `avg` divided once in the accumulator, one rounding back to the dtype. Where
//! the device's operators round as IEEE does (add, max, min, the casts; the division is the
//! one to watch), a device reduction has the CPU's bits: the host interpretation below is
//! compared with the CPU kernel bit for bit, which checks the plan, not the device.

use symm_core::{DType, ReduceOp};

use crate::dtype::accumulator;

/// A vector a step reads or writes: a source, the output, or one of two scratch vectors of the
/// accumulator type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Source `j`.
    Src(usize),
    /// The output.
    Out,
    /// The accumulator (scratch).
    Acc,
    /// A widened source (scratch).
    Wide,
}

/// The elementwise combination of two vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Sum (integers wrap; booleans: any).
    Add,
    /// Maximum (NaN wins; booleans: any).
    Max,
    /// Minimum (NaN wins; booleans: all).
    Min,
}

/// One elementwise operator of a plan, over `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `to = from`, both of `dtype`.
    Copy { from: Operand, to: Operand, dtype: DType },
    /// `to = from` converted from `from_dtype` to `to_dtype` (rounding to nearest even).
    Cast { from: Operand, from_dtype: DType, to: Operand, to_dtype: DType },
    /// `out = a <combine> b`, all of `dtype` (`out` may be `a`).
    Combine { combine: Combine, a: Operand, b: Operand, out: Operand, dtype: DType },
    /// `x = x / by`, of the floating `dtype`.
    Divide { x: Operand, by: usize, dtype: DType },
}

/// The steps that reduce `n` sources (at least one) of `dtype` with `op` into the output.
/// Scratch vectors are needed only where the accumulator is wider than `dtype` ([`scratch`]).
pub fn plan(dtype: DType, op: ReduceOp, n: usize) -> Vec<Step> {
    assert!(n > 0, "a reduction has a source");
    let combine = match op {
        // On 0/1 bytes a sum is "any", which is the maximum: no boolean addition is asked of
        // the device's operators.
        ReduceOp::Sum if dtype == DType::Bool => Combine::Max,
        ReduceOp::Sum | ReduceOp::Avg => Combine::Add,
        ReduceOp::Max => Combine::Max,
        ReduceOp::Min => Combine::Min,
    };
    let acc = accumulator(dtype);
    let mut steps = Vec::with_capacity(2 * n + 2);
    if acc == dtype {
        // The output is the accumulator: no scratch, no rounding.
        if n == 1 {
            steps.push(Step::Copy { from: Operand::Src(0), to: Operand::Out, dtype });
        } else {
            steps.push(Step::Combine { combine, a: Operand::Src(0), b: Operand::Src(1), out: Operand::Out, dtype });
        }
        for j in 2..n {
            steps.push(Step::Combine { combine, a: Operand::Out, b: Operand::Src(j), out: Operand::Out, dtype });
        }
        if op == ReduceOp::Avg {
            steps.push(Step::Divide { x: Operand::Out, by: n, dtype });
        }
        return steps;
    }
    steps.push(Step::Cast { from: Operand::Src(0), from_dtype: dtype, to: Operand::Acc, to_dtype: acc });
    for j in 1..n {
        steps.push(Step::Cast { from: Operand::Src(j), from_dtype: dtype, to: Operand::Wide, to_dtype: acc });
        steps.push(Step::Combine { combine, a: Operand::Acc, b: Operand::Wide, out: Operand::Acc, dtype: acc });
    }
    if op == ReduceOp::Avg {
        steps.push(Step::Divide { x: Operand::Acc, by: n, dtype: acc });
    }
    steps.push(Step::Cast { from: Operand::Acc, from_dtype: acc, to: Operand::Out, to_dtype: dtype });
    steps
}

/// Bytes of each scratch vector a reduction of `len` elements of `dtype` needs (0: none).
pub fn scratch(dtype: DType, len: usize) -> usize {
    let acc = accumulator(dtype);
    if acc == dtype {
        0
    } else {
        len * acc.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_model::{combine, load, store, Value};

    /// Runs `steps` on host vectors: what the device would compute, operator by operator.
    fn interpret(steps: &[Step], srcs: &[Vec<u8>], dtype: DType, len: usize) -> Vec<u8> {
        let acc_size = accumulator(dtype).size();
        let mut out = vec![0u8; len * dtype.size()];
        let (mut acc, mut wide) = (vec![0u8; len * acc_size], vec![0u8; len * acc_size]);
        for step in steps {
            for k in 0..len {
                let read = |o: Operand, d: DType, out: &[u8], acc: &[u8], wide: &[u8]| {
                    let at = k * d.size();
                    match o {
                        Operand::Src(j) => load(d, &srcs[j][at..]),
                        Operand::Out => load(d, &out[at..]),
                        Operand::Acc => load(d, &acc[at..]),
                        Operand::Wide => load(d, &wide[at..]),
                    }
                };
                let (value, to, d) = match *step {
                    Step::Copy { from, to, dtype } => (read(from, dtype, &out, &acc, &wide), to, dtype),
                    Step::Cast { from, from_dtype, to, to_dtype } => {
                        (read(from, from_dtype, &out, &acc, &wide), to, to_dtype)
                    }
                    Step::Combine { combine: c, a, b, out: to, dtype } => {
                        let (x, y) = (read(a, dtype, &out, &acc, &wide), read(b, dtype, &out, &acc, &wide));
                        (combine(c, dtype, x, y), to, dtype)
                    }
                    Step::Divide { x, by, dtype } => {
                        let Value::Float(v) = read(x, dtype, &out, &acc, &wide) else {
                            unreachable!("avg is for floats")
                        };
                        let q = if dtype == DType::F32 { f64::from(v as f32 / by as f32) } else { v / by as f64 };
                        (Value::Float(q), x, dtype)
                    }
                };
                let at = k * d.size();
                let dst = match to {
                    Operand::Out => &mut out[at..],
                    Operand::Acc => &mut acc[at..],
                    Operand::Wide => &mut wide[at..],
                    Operand::Src(_) => unreachable!("no step writes a source"),
                };
                store(d, value, dst);
            }
        }
        out
    }

    /// Sources of `len` elements: mostly ordinary values of the dtype, some special (NaN,
    /// infinities, the largest values) so that rounding, overflow and NaN rules show.
    fn sources(dtype: DType, n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|_| {
                let mut v = vec![0u8; len * dtype.size()];
                for k in 0..len {
                    let r = next();
                    let value = if dtype.is_float() {
                        Value::Float(match r % 16 {
                            0 => f64::NAN,
                            1 => f64::INFINITY,
                            2 => -1e30,
                            _ => ((r >> 8) % 20001) as f64 / 97.0 - 100.0,
                        })
                    } else {
                        Value::Int((r >> 4) as i64)
                    };
                    store(dtype, value, &mut v[k * dtype.size()..]);
                }
                v
            })
            .collect()
    }

    #[test]
    fn the_plan_computes_what_the_cpu_kernel_does_bit_for_bit() {
        let len = 300;
        for dtype in DType::ALL {
            for &op in ReduceOp::ALL {
                if op == ReduceOp::Avg && !dtype.is_float() {
                    continue;
                }
                for n in [1, 2, 3, 5, 8] {
                    let srcs = sources(dtype, n, len, 7 + n as u64);
                    let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr()).collect();
                    let mut want = vec![0u8; len * dtype.size()];
                    // SAFETY: every source holds `len` elements, `want` too; none overlap.
                    unsafe { symm_core::coll::kernels::reduce(dtype, op, &ptrs, want.as_mut_ptr(), len) };
                    let got = interpret(&plan(dtype, op, n), &srcs, dtype, len);
                    for k in 0..len {
                        let at = k * dtype.size()..(k + 1) * dtype.size();
                        let (g, w) = (load(dtype, &got[at.clone()]), load(dtype, &want[at.clone()]));
                        let both_nan = matches!((g, w), (Value::Float(a), Value::Float(b)) if a.is_nan() && b.is_nan());
                        assert!(
                            both_nan || got[at.clone()] == want[at.clone()],
                            "{dtype} {op} of {n}: element {k}: plan {g:?}, CPU kernel {w:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn narrow_floats_widen_each_source_and_round_once() {
        let steps = plan(DType::BF16, ReduceOp::Avg, 3);
        let casts = steps.iter().filter(|s| matches!(s, Step::Cast { .. })).count();
        assert_eq!(casts, 4, "three widenings and one rounding: {steps:?}");
        assert!(matches!(steps[steps.len() - 2], Step::Divide { by: 3, dtype: DType::F32, .. }), "{steps:?}");
        assert_eq!(scratch(DType::BF16, 10), 40);
        assert_eq!(scratch(DType::F32, 10), 0);
        assert!(plan(DType::F32, ReduceOp::Sum, 4).iter().all(|s| !matches!(s, Step::Cast { .. })));
    }

    #[test]
    fn sources_are_combined_in_their_order() {
        let order: Vec<usize> = plan(DType::I32, ReduceOp::Sum, 4)
            .iter()
            .flat_map(|s| match *s {
                Step::Combine { a, b, .. } => [a, b]
                    .into_iter()
                    .filter_map(|o| match o {
                        Operand::Src(j) => Some(j),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(order, [0, 1, 2, 3]);
    }
}
