//! The device's arithmetic modelled on the host, element by element, for the tests that
//! interpret what the backend issues ([`crate::reduce`]'s plans, [`crate::codec`]'s operators):
//! IEEE rounding, NaN winning max and min, integers wrapping in their width.

use symm_core::dtype::{bf16, f16, F8E4M3, F8E5M2};
use symm_core::DType;

use crate::reduce::Combine;

/// One element as the host holds it: floats widened to f64 exactly, integers as i64.
#[derive(Clone, Copy, Debug)]
pub enum Value {
    Float(f64),
    Int(i64),
}

pub fn load(d: DType, bytes: &[u8]) -> Value {
    let b2 = || [bytes[0], bytes[1]];
    match d {
        DType::F32 => Value::Float(f64::from(f32::from_le_bytes(bytes[..4].try_into().unwrap()))),
        DType::F64 => Value::Float(f64::from_le_bytes(bytes[..8].try_into().unwrap())),
        DType::F16 => Value::Float(f64::from(f16::from_le_bytes(b2()).to_f32())),
        DType::BF16 => Value::Float(f64::from(bf16::from_le_bytes(b2()).to_f32())),
        DType::F8E4M3 => Value::Float(f64::from(F8E4M3::from_bits(bytes[0]).to_f32())),
        DType::F8E5M2 => Value::Float(f64::from(F8E5M2::from_bits(bytes[0]).to_f32())),
        DType::I8 => Value::Int(i64::from(bytes[0] as i8)),
        DType::I16 => Value::Int(i64::from(i16::from_le_bytes(b2()))),
        DType::I32 => Value::Int(i64::from(i32::from_le_bytes(bytes[..4].try_into().unwrap()))),
        DType::I64 => Value::Int(i64::from_le_bytes(bytes[..8].try_into().unwrap())),
        DType::U8 | DType::Bool => Value::Int(i64::from(bytes[0])),
    }
}

/// Stores `v` as `d`, rounding once (to nearest even) as a cast does.
pub fn store(d: DType, v: Value, out: &mut [u8]) {
    let f = |v: Value| match v {
        Value::Float(x) => x,
        Value::Int(i) => i as f64,
    };
    let i = |v: Value| match v {
        Value::Int(i) => i,
        Value::Float(x) => x as i64,
    };
    match d {
        DType::F32 => out[..4].copy_from_slice(&(f(v) as f32).to_le_bytes()),
        DType::F64 => out[..8].copy_from_slice(&f(v).to_le_bytes()),
        // From f32 (the accumulator), as the CPU kernels narrow.
        DType::F16 => out[..2].copy_from_slice(&f16::from_f32(f(v) as f32).to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16::from_f32(f(v) as f32).to_le_bytes()),
        DType::F8E4M3 => out[0] = F8E4M3::from_f32(f(v) as f32).to_bits(),
        DType::F8E5M2 => out[0] = F8E5M2::from_f32(f(v) as f32).to_bits(),
        DType::I8 => out[0] = i(v) as i8 as u8,
        DType::I16 => out[..2].copy_from_slice(&(i(v) as i16).to_le_bytes()),
        DType::I32 => out[..4].copy_from_slice(&(i(v) as i32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&i(v).to_le_bytes()),
        DType::U8 => out[0] = i(v) as u8,
        DType::Bool => out[0] = u8::from(i(v) != 0),
    }
}

/// `a <c> b` in `d`, as the device's operator would (NaN wins max and min; integers wrap
/// in their width; booleans: any, any, all).
pub fn combine(c: Combine, d: DType, a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => Value::Float(match c {
            // The sum rounds in the operator's own precision.
            Combine::Add if d == DType::F32 => f64::from(x as f32 + y as f32),
            Combine::Add => x + y,
            Combine::Max if x.is_nan() || x > y => x,
            Combine::Min if x.is_nan() || x < y => x,
            Combine::Max | Combine::Min => y,
        }),
        (Value::Int(x), Value::Int(y)) if d == DType::Bool => Value::Int(match c {
            Combine::Add | Combine::Max => x | y,
            Combine::Min => x & y,
        }),
        (Value::Int(x), Value::Int(y)) => {
            let r = match c {
                Combine::Add => x.wrapping_add(y),
                Combine::Max => x.max(y),
                Combine::Min => x.min(y),
            };
            let mut bytes = [0u8; 8];
            store(d, Value::Int(r), &mut bytes);
            load(d, &bytes)
        }
        _ => unreachable!("one type per step"),
    }
}
