//! symm's dtypes and reductions in HCCL's terms.
//!
//! Two uses, two rules:
//! - **Moving data** (allgather, broadcast, send, recv, alltoallv): HCCL copies elements without
//!   reading them, so every symm dtype moves, as the HCCL type of its own name where `hccl.h`
//!   lists that type for these functions, and as `uint8` (same width, the bytes unchanged) where
//!   it does not: the fp8 formats (not in the lists of the wheel's `hccl.h`) and `bool` (no HCCL
//!   type; torch_npu moves it as `uint8` too).
//! - **Reducing** (allreduce, reduce_scatter): only the dtypes HCCL's documentation lists for
//!   `HcclAllReduce` and `HcclReduceScatter` on Atlas A2 (910B): int8, int16, int32, int64,
//!   float16, float32, bfloat16 (`hicann/hccl` `docs/zh/api_ref/comm_op_interface/`, commit
//!   `022ea40e`; the wheel's `hccl.h` comments list fewer, without int64, and without int16 for
//!   reduce-scatter). `bool` reduces exactly as `int8` with max (`sum` and `max` are "any" in
//!   symm) or min ("all"), its bytes being 0 or 1. float64, the fp8 formats and uint8 are
//!   refused, naming the dtype, rather than left to fail inside HCCL.
//!
//! `avg` is refused: HCCL has no average (`HcclReduceOp` is sum, prod, max, min). The caller
//! reduces with `sum` and divides by the rank count, on its own stream order, where it chooses
//! the rounding (symm's collectives divide once, after the sum).

use symm_core::{DType, ReduceOp};

use crate::result::{HcclError, Result};
use crate::sys::{self, HcclDataType, HcclReduceOp};

/// The dtypes HCCL reduces on Atlas A2 (besides `bool`, which reduces as int8).
pub const REDUCIBLE: [DType; 7] = [DType::I8, DType::I16, DType::I32, DType::I64, DType::F16, DType::F32, DType::BF16];

/// The HCCL type that moves `dtype`'s elements unchanged.
pub fn movement_type(dtype: DType) -> HcclDataType {
    match dtype {
        DType::F32 => sys::HCCL_DATA_TYPE_FP32,
        DType::F64 => sys::HCCL_DATA_TYPE_FP64,
        DType::F16 => sys::HCCL_DATA_TYPE_FP16,
        DType::BF16 => sys::HCCL_DATA_TYPE_BFP16,
        DType::I8 => sys::HCCL_DATA_TYPE_INT8,
        DType::I16 => sys::HCCL_DATA_TYPE_INT16,
        DType::I32 => sys::HCCL_DATA_TYPE_INT32,
        DType::I64 => sys::HCCL_DATA_TYPE_INT64,
        DType::U8 => sys::HCCL_DATA_TYPE_UINT8,
        // One byte each, moved as bytes: the movement functions of hccl.h list uint8, not these.
        DType::F8E4M3 | DType::F8E5M2 | DType::Bool => sys::HCCL_DATA_TYPE_UINT8,
    }
}

/// The HCCL type and op that reduce `dtype` with `op` as symm defines the reduction, for the
/// call `function` (named in the error); `avg` and the dtypes outside [`REDUCIBLE`] (and
/// `bool`) are [`HcclError::Unsupported`].
pub fn reduction(function: &'static str, dtype: DType, op: ReduceOp) -> Result<(HcclDataType, HcclReduceOp)> {
    let hccl_op = match op {
        ReduceOp::Sum => sys::HCCL_REDUCE_SUM,
        ReduceOp::Max => sys::HCCL_REDUCE_MAX,
        ReduceOp::Min => sys::HCCL_REDUCE_MIN,
        ReduceOp::Avg => {
            return Err(HcclError::Unsupported {
                function,
                argument: "op",
                value: op.name().into(),
                reason: "HCCL has no average (HcclReduceOp is sum, prod, max, min): reduce with sum and \
                         divide by the rank count",
            })
        }
    };
    if dtype == DType::Bool {
        // 0/1 bytes: the int8 maximum is symm's "any" (its sum and max), the minimum its "all".
        let any_or_all = if op == ReduceOp::Min { sys::HCCL_REDUCE_MIN } else { sys::HCCL_REDUCE_MAX };
        return Ok((sys::HCCL_DATA_TYPE_INT8, any_or_all));
    }
    if !REDUCIBLE.contains(&dtype) {
        return Err(HcclError::Unsupported {
            function,
            argument: "dtype",
            value: dtype.name().into(),
            reason: "HCCL reduces int8, int16, int32, int64, float16, float32 and bfloat16 on Atlas A2 \
                     (bool as int8 max/min); move the data with allgather and reduce it elsewhere",
        });
    }
    Ok((movement_type(dtype), hccl_op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_moves_as_a_type_of_its_width() {
        let width = |t: HcclDataType| match t {
            sys::HCCL_DATA_TYPE_INT8 | sys::HCCL_DATA_TYPE_UINT8 => 1,
            sys::HCCL_DATA_TYPE_INT16 | sys::HCCL_DATA_TYPE_FP16 | sys::HCCL_DATA_TYPE_BFP16 => 2,
            sys::HCCL_DATA_TYPE_INT32 | sys::HCCL_DATA_TYPE_FP32 => 4,
            sys::HCCL_DATA_TYPE_INT64 | sys::HCCL_DATA_TYPE_FP64 => 8,
            other => panic!("HCCL type {other} is not one symm moves"),
        };
        for d in DType::ALL {
            assert_eq!(width(movement_type(d)), d.size(), "{d}");
        }
        // The values of hccl_types.h.
        assert_eq!(movement_type(DType::BF16), 11);
        assert_eq!(movement_type(DType::F64), 10);
        assert_eq!(movement_type(DType::U8), 7);
        assert_eq!(movement_type(DType::F8E4M3), 7);
        assert_eq!(movement_type(DType::Bool), 7);
    }

    #[test]
    fn every_dtype_and_op_reduces_or_is_refused_by_name() {
        for d in DType::ALL {
            for &op in ReduceOp::ALL {
                match reduction("HcclAllReduce", d, op) {
                    Ok((t, o)) => {
                        assert_ne!(op, ReduceOp::Avg);
                        if d == DType::Bool {
                            assert_eq!(t, sys::HCCL_DATA_TYPE_INT8);
                        } else {
                            assert!(REDUCIBLE.contains(&d), "{d}");
                            assert_eq!(t, movement_type(d));
                        }
                        assert!([sys::HCCL_REDUCE_SUM, sys::HCCL_REDUCE_MAX, sys::HCCL_REDUCE_MIN].contains(&o));
                    }
                    Err(e) => {
                        let text = e.to_string();
                        let (argument, value) = if op == ReduceOp::Avg { ("op", "avg") } else { ("dtype", d.name()) };
                        let named = format!("HcclAllReduce: {argument} = {value} is not supported by HCCL");
                        assert!(text.starts_with(&named), "{d} {op}: {text}");
                        assert!(matches!(e, HcclError::Unsupported { .. }));
                    }
                }
            }
        }
    }

    #[test]
    fn the_refusals_are_exactly_avg_and_the_dtypes_hccl_does_not_reduce() {
        let refused: Vec<DType> =
            DType::ALL.into_iter().filter(|&d| reduction("HcclReduceScatter", d, ReduceOp::Sum).is_err()).collect();
        assert_eq!(refused, [DType::F64, DType::F8E4M3, DType::F8E5M2, DType::U8]);
        for d in DType::ALL {
            assert!(reduction("HcclReduceScatter", d, ReduceOp::Avg).is_err(), "{d}");
        }
        assert_eq!(reduction("f", DType::F32, ReduceOp::Sum), Ok((4, 0)));
        assert_eq!(reduction("f", DType::BF16, ReduceOp::Max), Ok((11, 2)));
        assert_eq!(reduction("f", DType::I64, ReduceOp::Min), Ok((5, 3)));
    }

    #[test]
    fn bool_reduces_as_symms_any_and_all() {
        assert_eq!(reduction("f", DType::Bool, ReduceOp::Sum), Ok((sys::HCCL_DATA_TYPE_INT8, sys::HCCL_REDUCE_MAX)));
        assert_eq!(reduction("f", DType::Bool, ReduceOp::Max), Ok((sys::HCCL_DATA_TYPE_INT8, sys::HCCL_REDUCE_MAX)));
        assert_eq!(reduction("f", DType::Bool, ReduceOp::Min), Ok((sys::HCCL_DATA_TYPE_INT8, sys::HCCL_REDUCE_MIN)));
    }
}
