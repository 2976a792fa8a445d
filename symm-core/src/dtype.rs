//! Element types that travel through symmetric memory.
//!
//! [`DType`] is the runtime tag (what a buffer holds); [`Element`] ties a Rust type to its tag so
//! typed APIs can check a slice against a buffer without the caller spelling the dtype twice.

use std::fmt;
use std::str::FromStr;

use crate::error::ArgError;

pub use float8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};

/// The element type of a buffer. The numeric codes are stable: bindings pass them across FFI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    F32 = 0,
    F64 = 1,
    F16 = 2,
    BF16 = 3,
    /// fp8 with 4 exponent and 3 mantissa bits, no infinities (`float8_e4m3fn`), max 448.
    F8E4M3 = 4,
    /// fp8 with 5 exponent and 2 mantissa bits (`float8_e5m2`), max 57344, has infinities.
    F8E5M2 = 5,
    I8 = 6,
    I16 = 7,
    I32 = 8,
    I64 = 9,
    U8 = 10,
    Bool = 11,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The canonical lower-case name (matches the PyTorch spelling without the `torch.` prefix,
    /// except `float8_e4m3fn` which is also accepted on input).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Floating-point dtypes (the only ones `avg` and low-precision transport accept).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// The stable numeric code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The dtype for a numeric code, or an error naming the code.
    pub fn from_code(code: i64) -> Result<DType, ArgError> {
        DType::ALL.into_iter().find(|d| i64::from(d.code()) == code).ok_or_else(|| ArgError::UnknownCode {
            what: "dtype",
            value: code.to_string(),
            accepted: DType::ALL.iter().map(|d| format!("{}={}", d.code(), d.name())).collect::<Vec<_>>().join(", "),
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = ArgError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().trim_start_matches("torch.").to_ascii_lowercase();
        let found = match lower.as_str() {
            "float32" | "f32" | "float" => DType::F32,
            "float64" | "f64" | "double" => DType::F64,
            "float16" | "f16" | "fp16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float8_e4m3fn" | "float8_e4m3" | "fp8_e4m3" | "e4m3" | "f8e4m3" => DType::F8E4M3,
            "float8_e5m2" | "fp8_e5m2" | "e5m2" | "f8e5m2" => DType::F8E5M2,
            "int8" | "i8" => DType::I8,
            "int16" | "i16" => DType::I16,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" | "long" => DType::I64,
            "uint8" | "u8" => DType::U8,
            "bool" => DType::Bool,
            _ => {
                return Err(ArgError::UnknownCode {
                    what: "dtype",
                    value: s.to_string(),
                    accepted: DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "),
                })
            }
        };
        Ok(found)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the in-memory representation of one [`DType`].
///
/// Sealed: every implementor is plain old data (any bit pattern of its size is a valid value,
/// except `bool`, whose buffers the library only ever fills with 0 or 1), so byte copies between
/// ranks can never produce an invalid value.
pub trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}

element!(
    f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, bool => Bool,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_roundtrip_and_sizes_match_rust_types() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(i64::from(d.code())).unwrap(), d);
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::F32.size(), std::mem::size_of::<f32>());
        assert_eq!(DType::BF16.size(), std::mem::size_of::<bf16>());
        assert_eq!(DType::F8E4M3.size(), std::mem::size_of::<F8E4M3>());
        assert_eq!(DType::Bool.size(), std::mem::size_of::<bool>());
    }

    #[test]
    fn unknown_names_and_codes_are_errors_that_list_the_accepted_values() {
        let e = "float128".parse::<DType>().unwrap_err().to_string();
        assert!(e.contains("float128") && e.contains("bfloat16"), "{e}");
        let e = DType::from_code(99).unwrap_err().to_string();
        assert!(e.contains("99") && e.contains("0=float32"), "{e}");
    }
}
