//! symm's dtypes as the device sees them: their `aclDataType`, and the type a reduction on the
//! device accumulates in (the CPU kernels' choice, `symm_core::coll::kernels`, so that both
//! backends round alike: float32 for the 16- and 8-bit floats, the type itself otherwise).

use ascend_sys::sys::acl::{self, aclDataType};
use symm_core::DType;

/// The ACL data type of `d`.
pub fn acl_dtype(d: DType) -> aclDataType {
    match d {
        DType::F32 => acl::ACL_FLOAT,
        DType::F64 => acl::ACL_DOUBLE,
        DType::F16 => acl::ACL_FLOAT16,
        DType::BF16 => acl::ACL_BF16,
        DType::F8E4M3 => acl::ACL_FLOAT8_E4M3FN,
        DType::F8E5M2 => acl::ACL_FLOAT8_E5M2,
        DType::I8 => acl::ACL_INT8,
        DType::I16 => acl::ACL_INT16,
        DType::I32 => acl::ACL_INT32,
        DType::I64 => acl::ACL_INT64,
        DType::U8 => acl::ACL_UINT8,
        DType::Bool => acl::ACL_BOOL,
    }
}

/// The dtype a device reduction of `d` accumulates in.
pub fn accumulator(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => DType::F32,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_its_own_acl_type() {
        let mut seen: Vec<aclDataType> = DType::ALL.iter().map(|&d| acl_dtype(d)).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), DType::ALL.len());
        assert_eq!(acl_dtype(DType::BF16), 27);
        assert_eq!(acl_dtype(DType::F8E4M3), 36);
    }

    #[test]
    fn narrow_floats_accumulate_in_float32_as_on_cpu() {
        for d in [DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2] {
            assert_eq!(accumulator(d), DType::F32);
        }
        for d in [DType::F32, DType::F64, DType::I8, DType::I32, DType::I64, DType::U8, DType::Bool] {
            assert_eq!(accumulator(d), d);
        }
    }
}
