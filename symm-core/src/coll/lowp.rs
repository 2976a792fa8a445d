//! Low-precision transport: encode locally, move the small format, decode and accumulate wide.
//!
//! Formats: fp16, bf16, fp8 e4m3 (`float8_e4m3fn`), fp8 e5m2. Data is cut into blocks of
//! [`SCALE_BLOCK`] elements; each block carries a power-of-two scale `2^e` (an `i32` exponent)
//! chosen so that the block's largest finite magnitude lands just below the format's top, so
//! values far below 1 or far above 448 keep the format's relative precision. Power-of-two
//! scales are exact: the only error is the format's rounding of `x / 2^e` (round to nearest
//! even). bf16 has f32's exponent range, so its blocks are only scaled for f64 data beyond it.
//!
//! Non-finite values propagate: NaN encodes as NaN; infinities encode as the format's infinity
//! (fp16, bf16, e5m2) or, for e4m3 which has none, as its largest code ±448, which the scaling
//! never produces for finite data (finite blocks are scaled to at most 224).
//!
//! Layout of an encoded run of `count` elements: `ceil(count / SCALE_BLOCK)` exponents (`i32`),
//! then `count` payload elements. A block-aligned part of a run is addressed by a [`SubRun`]
//! ([`part_layout`], [`sub_run`]), so members can each own a part of one run.

use crate::dtype::{bf16, f16, DType, F8E4M3, F8E5M2};
use crate::error::ArgError;
use crate::op::ReduceOp;

/// Elements per scale.
pub const SCALE_BLOCK: usize = 256;

/// The environment variable that sets the default transport format.
pub const LOW_PRECISION_VAR: &str = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE";

/// The accepted transport formats.
pub const FORMATS: [DType; 4] = [DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2];

/// Checks that `lp` is a transport format for `data`.
pub fn check_format(lp: DType, data: DType) -> Result<(), ArgError> {
    if !FORMATS.contains(&lp) {
        return Err(ArgError::invalid(
            "low_precision_dtype",
            lp,
            "accepted: float16, bfloat16, float8_e4m3fn, float8_e5m2",
        ));
    }
    if !matches!(data, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(ArgError::invalid(
            "low_precision_dtype",
            lp,
            format!("low-precision transport needs float32, float64, float16 or bfloat16 data, not {data}"),
        ));
    }
    Ok(())
}

/// The transport format named by `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` (unset or empty: none).
pub fn format_from_env() -> Result<Option<DType>, ArgError> {
    match std::env::var(LOW_PRECISION_VAR) {
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("none") => Ok(None),
        Ok(v) => {
            let d: DType = v.parse().map_err(|_| {
                ArgError::invalid(
                    LOW_PRECISION_VAR,
                    &v,
                    "accepted: float16, bfloat16, float8_e4m3fn, float8_e5m2, none",
                )
            })?;
            if FORMATS.contains(&d) {
                Ok(Some(d))
            } else {
                Err(ArgError::invalid(
                    LOW_PRECISION_VAR,
                    v,
                    "accepted: float16, bfloat16, float8_e4m3fn, float8_e5m2, none",
                ))
            }
        }
        Err(_) => Ok(None),
    }
}

/// Bytes of an encoded run of `count` elements.
pub fn encoded_bytes(lp: DType, count: usize) -> usize {
    count.div_ceil(SCALE_BLOCK) * 4 + count * lp.size()
}

/// The largest magnitude finite data is scaled to.
fn target_max(lp: DType) -> f64 {
    match lp {
        DType::F8E4M3 => 224.0,
        DType::F8E5M2 => 57344.0,
        DType::F16 => 65504.0,
        // bf16 has f32's range: scaling only matters for f64 data beyond it.
        _ => 2f64.powi(127),
    }
}

/// Converts a scaled value to the format's bits.
#[inline]
fn to_bits(lp: DType, y: f64) -> u16 {
    match lp {
        DType::F16 => f16::from_f64(y).to_bits(),
        DType::BF16 => bf16::from_f64(y).to_bits(),
        // Non-finite values are coded by hand: e4m3fn has no infinity (the reserved top code
        // stands for it) and the float8 crate saturates infinities to finite values.
        DType::F8E4M3 | DType::F8E5M2 if y.is_nan() => 0x7f,
        DType::F8E4M3 if y.is_infinite() => {
            if y > 0.0 {
                0x7e
            } else {
                0xfe
            }
        }
        DType::F8E5M2 if y.is_infinite() => {
            if y > 0.0 {
                0x7c
            } else {
                0xfc
            }
        }
        DType::F8E4M3 => u16::from(F8E4M3::from_f64(y).to_bits()),
        DType::F8E5M2 => u16::from(F8E5M2::from_f64(y).to_bits()),
        _ => unreachable!("validated transport format"),
    }
}

/// Converts the format's bits back to a (scaled) value.
#[inline]
fn from_bits(lp: DType, b: u16) -> f64 {
    match lp {
        DType::F16 => f16::from_bits(b).to_f64(),
        DType::BF16 => bf16::from_bits(b).to_f64(),
        DType::F8E4M3 => match b as u8 {
            0x7e => f64::INFINITY,
            0xfe => f64::NEG_INFINITY,
            x => F8E4M3::from_bits(x).to_f64(),
        },
        DType::F8E5M2 => F8E5M2::from_bits(b as u8).to_f64(),
        _ => unreachable!("validated transport format"),
    }
}

/// Reads element `i` of `data` (of dtype `d`) as f64.
///
/// # Safety
/// `data` holds more than `i` elements of `d`.
#[inline]
unsafe fn load(d: DType, data: *const u8, i: usize) -> f64 {
    // SAFETY: in bounds by the contract; unaligned reads tolerate any placement.
    unsafe {
        match d {
            DType::F32 => f64::from(data.cast::<f32>().add(i).read_unaligned()),
            DType::F64 => data.cast::<f64>().add(i).read_unaligned(),
            DType::F16 => data.cast::<f16>().add(i).read_unaligned().to_f64(),
            DType::BF16 => data.cast::<bf16>().add(i).read_unaligned().to_f64(),
            _ => unreachable!("validated data dtype"),
        }
    }
}

/// `x * 2^e` without overflowing the scale itself (the product may still over- or underflow).
#[inline]
fn ldexp(mut x: f64, mut e: i32) -> f64 {
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

/// `floor(log2(x))` of a finite positive `x`, subnormals included.
fn exponent_of(x: f64) -> i32 {
    let bits = x.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // Subnormal: 2^-1074 times the mantissa.
        -1074 + (63 - (bits & ((1 << 52) - 1)).leading_zeros() as i32)
    } else {
        biased - 1023
    }
}

/// The exponent `e` such that the block's largest finite magnitude divided by `2^e` is at most
/// the format's target (and above half of it).
fn block_exponent(lp: DType, amax: f64) -> i32 {
    if amax == 0.0 || !amax.is_finite() {
        return 0;
    }
    let t = target_max(lp);
    let mut e = exponent_of(amax) - exponent_of(t);
    // The estimate is within one of the answer: fix it up.
    while ldexp(amax, -e) > t {
        e += 1;
    }
    while ldexp(amax, -(e - 1)) <= t {
        e -= 1;
    }
    e
}

/// Where the exponents and the payload of a run (or of a block-aligned part of one) are.
#[derive(Clone, Copy, Debug)]
pub struct SubRun {
    /// Exponent of the part's first block.
    pub exps: *const i32,
    /// Payload of the part's first element.
    pub payload: *const u8,
}

/// Byte offsets, from the start of a run of `total` elements, of the exponents and payload of
/// its part starting at element `lo` (a multiple of [`SCALE_BLOCK`]) and `len` long; and the
/// byte lengths of both.
pub fn part_layout(lp: DType, total: usize, lo: usize, len: usize) -> ((usize, usize), (usize, usize)) {
    debug_assert!(lo % SCALE_BLOCK == 0 && lo + len <= total);
    let blocks = total.div_ceil(SCALE_BLOCK);
    let exps = (4 * (lo / SCALE_BLOCK), 4 * len.div_ceil(SCALE_BLOCK));
    let payload = (blocks * 4 + lo * lp.size(), len * lp.size());
    (exps, payload)
}

/// The part of a run starting at `base` (see [`part_layout`]).
pub fn sub_run(base: *const u8, lp: DType, total: usize, lo: usize, len: usize) -> SubRun {
    let ((e, _), (p, _)) = part_layout(lp, total, lo, len);
    SubRun { exps: base.wrapping_add(e).cast(), payload: base.wrapping_add(p) }
}

/// Encodes `count` elements of `data` (dtype `d`) into a part of a run: exponents at `exps`,
/// payload at `payload`.
///
/// # Safety
/// `data` holds `count` elements of `d`; `exps` is valid for `ceil(count / SCALE_BLOCK)`
/// `i32` writes and `payload` for `count * lp.size()` bytes; neither overlaps `data`.
pub unsafe fn encode(d: DType, lp: DType, data: *const u8, count: usize, exps: *mut i32, payload: *mut u8) {
    let blocks = count.div_ceil(SCALE_BLOCK);
    for b in 0..blocks {
        let (lo, hi) = (b * SCALE_BLOCK, ((b + 1) * SCALE_BLOCK).min(count));
        let mut amax = 0f64;
        for i in lo..hi {
            // SAFETY: i < count.
            let x = unsafe { load(d, data, i) }.abs();
            if x.is_finite() && x > amax {
                amax = x;
            }
        }
        let e = block_exponent(lp, amax);
        // SAFETY: b < blocks, inside the exponent area.
        unsafe { exps.add(b).write_unaligned(e) };
        for i in lo..hi {
            // SAFETY: i < count, in both the source and the payload.
            let bits = to_bits(lp, ldexp(unsafe { load(d, data, i) }, -e));
            // SAFETY: payload element i is inside the payload area.
            unsafe {
                if lp.size() == 2 {
                    payload.cast::<u16>().add(i).write_unaligned(bits);
                } else {
                    payload.add(i).write(bits as u8);
                }
            }
        }
    }
}

/// Decodes `len` elements of a part, calling `f(i, value)` for each.
///
/// # Safety
/// The part holds `len` elements.
#[inline]
unsafe fn for_each_decoded(lp: DType, part: SubRun, len: usize, mut f: impl FnMut(usize, f64)) {
    for b in 0..len.div_ceil(SCALE_BLOCK) {
        // SAFETY: b is a block of the part.
        let e = unsafe { part.exps.add(b).read_unaligned() };
        for i in b * SCALE_BLOCK..((b + 1) * SCALE_BLOCK).min(len) {
            // SAFETY: i < len, inside the payload.
            let bits = unsafe {
                if lp.size() == 2 {
                    part.payload.cast::<u16>().add(i).read_unaligned()
                } else {
                    u16::from(part.payload.add(i).read())
                }
            };
            f(i, ldexp(from_bits(lp, bits), e));
        }
    }
}

/// Reduces `len` elements of every source part into `dst` (dtype `d`), in source order,
/// accumulating in f64 for f64 data and f32 otherwise, rounding once into `d`.
///
/// # Safety
/// Every part holds `len` elements; `dst` is valid for `len` writes of `d` and overlaps no
/// source.
pub unsafe fn reduce_encoded(d: DType, lp: DType, op: ReduceOp, srcs: &[SubRun], len: usize, dst: *mut u8) {
    let n = srcs.len();
    let wide = d == DType::F64;
    let round = |x: f64| if wide { x } else { f64::from(x as f32) };
    let mut acc = vec![0f64; len];
    // SAFETY: forwarded from the contract.
    unsafe { for_each_decoded(lp, srcs[0], len, |i, x| acc[i] = round(x)) };
    for s in &srcs[1..] {
        // SAFETY: as above.
        unsafe {
            for_each_decoded(lp, *s, len, |i, x| {
                let (a, x) = (acc[i], round(x));
                acc[i] = round(match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + x,
                    ReduceOp::Max => {
                        if a > x || a.is_nan() {
                            a
                        } else {
                            x
                        }
                    }
                    ReduceOp::Min => {
                        if a < x || a.is_nan() {
                            a
                        } else {
                            x
                        }
                    }
                })
            })
        };
    }
    for (i, a) in acc.into_iter().enumerate() {
        let v = if op == ReduceOp::Avg { round(a / n as f64) } else { a };
        // SAFETY: i < len, inside `dst`.
        unsafe { store(d, dst, i, v) };
    }
}

/// Decodes `len` elements of a part into `dst` (dtype `d`).
///
/// # Safety
/// As [`reduce_encoded`] with one source.
pub unsafe fn decode(d: DType, lp: DType, src: SubRun, len: usize, dst: *mut u8) {
    // SAFETY: i < len, inside `dst` (contract).
    unsafe { for_each_decoded(lp, src, len, |i, x| store(d, dst, i, x)) };
}

/// Writes `x` as element `i` of `dst` (dtype `d`), rounding once.
///
/// # Safety
/// `dst` holds more than `i` elements of `d`.
#[inline]
unsafe fn store(d: DType, dst: *mut u8, i: usize, x: f64) {
    // SAFETY: in bounds by the contract.
    unsafe {
        match d {
            DType::F32 => dst.cast::<f32>().add(i).write_unaligned(x as f32),
            DType::F64 => dst.cast::<f64>().add(i).write_unaligned(x),
            DType::F16 => dst.cast::<f16>().add(i).write_unaligned(f16::from_f64(x)),
            DType::BF16 => dst.cast::<bf16>().add(i).write_unaligned(bf16::from_f64(x)),
            _ => unreachable!("validated data dtype"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(lp: DType, data: &[f32]) -> Vec<f32> {
        let enc = vec![0u8; encoded_bytes(lp, data.len())];
        let mut out = vec![0f32; data.len()];
        // SAFETY: buffers sized by `encoded_bytes` and `data.len()`.
        let run = sub_run(enc.as_ptr(), lp, data.len(), 0, data.len());
        // SAFETY: `enc` has room for the encoded run (it is only written through raw pointers
        // derived from it); `data` and `out` hold `data.len()` elements.
        unsafe {
            encode(DType::F32, lp, data.as_ptr().cast(), data.len(), run.exps.cast_mut(), run.payload.cast_mut());
            decode(DType::F32, lp, run, data.len(), out.as_mut_ptr().cast());
        }
        out
    }

    #[test]
    fn fp8_keeps_tiny_and_huge_magnitudes() {
        for scale in [1e-30f32, 1e-8, 1.0, 1e4, 1e30] {
            let data: Vec<f32> = (0..1000).map(|i| scale * (((i * 37) % 101) as f32 - 50.0) / 7.0).collect();
            for lp in FORMATS {
                let out = roundtrip(lp, &data);
                // Relative to the block's largest value (fp8 e4m3: 3 mantissa bits, and the
                // smallest values of a block may fall into the subnormal range).
                let bound = match lp {
                    DType::F8E4M3 => 1.0 / 16.0,
                    DType::F8E5M2 => 1.0 / 8.0,
                    DType::BF16 => 1.0 / 256.0,
                    _ => 1.0 / 2048.0,
                };
                for (b, chunk) in data.chunks(SCALE_BLOCK).enumerate() {
                    let amax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
                    for (i, &x) in chunk.iter().enumerate() {
                        let y = out[b * SCALE_BLOCK + i];
                        if (lp == DType::BF16 || lp == DType::F16) && (x.abs() < 1e-30 || x.abs() > 1e30) {
                            continue;
                        }
                        assert!((y - x).abs() <= bound * amax, "{lp} scale {scale}: {x} -> {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_values_propagate() {
        let data = [1.0f32, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.5];
        for lp in FORMATS {
            let out = roundtrip(lp, &data);
            assert_eq!(out[0], 1.0, "{lp}");
            assert_eq!(out[1], f32::INFINITY, "{lp}");
            assert_eq!(out[2], f32::NEG_INFINITY, "{lp}");
            assert!(out[3].is_nan(), "{lp}");
            assert_eq!(out[4], 0.0, "{lp}");
            assert_eq!(out[5], -0.5, "{lp}");
        }
    }

    #[test]
    fn format_checks_name_the_argument() {
        assert!(check_format(DType::F8E4M3, DType::F32).is_ok());
        let e = check_format(DType::I8, DType::F32).unwrap_err().to_string();
        assert!(e.contains("low_precision_dtype") && e.contains("float8_e5m2"), "{e}");
        assert!(check_format(DType::F16, DType::I32).is_err());
    }
}
