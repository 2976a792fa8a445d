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

use std::sync::OnceLock;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::copy::{copy, fence, Stores};
use crate::dtype::{bf16, f16, DType, F8E4M3, F8E5M2};
use crate::error::ArgError;
use crate::op::ReduceOp;

/// Elements per scale.
pub const SCALE_BLOCK: usize = 256;

/// The environment variable that sets the default transport format.
pub const LOW_PRECISION_VAR: &str = crate::config::LOW_PRECISION.name;

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

/// The transport format named by `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` (unset, blank or
/// `none`: none), parsed by [`config`](crate::config).
pub fn format_from_env() -> Result<Option<DType>, ArgError> {
    crate::config::read(&crate::config::environment, &crate::config::LOW_PRECISION, crate::config::parse_low_precision)
        .map(Option::flatten)
        .map_err(|e| e.into_arg())
}

/// Every integer up to this one is exact in transport format `lp` (2 to the power of its
/// significand bits, the implicit one included), at any block scale: a benchmark's exact
/// checks keep their values and sums within it.
pub fn exact_integers(lp: DType) -> u32 {
    match lp {
        DType::F16 => 1 << 11,
        DType::BF16 => 1 << 8,
        DType::F8E4M3 => 1 << 4,
        _ => 1 << 3,
    }
}

/// Bytes of an encoded run of `count` elements.
pub fn encoded_bytes(lp: DType, count: usize) -> usize {
    count.div_ceil(SCALE_BLOCK) * 4 + count * lp.size()
}

/// The arithmetic a block is scaled, decoded and accumulated in: `f32` for f32, f16 and bf16
/// data, `f64` for f64 data. Every value of a transport format is exact in both, and so is
/// every scaling by a power of two whose product stays in the normal range, so both compute
/// what one exact scaling and one rounding would (f32 sums and quotients of f32 values equal
/// the f64 ones rounded to f32: double rounding is innocuous with 53 >= 2 * 24 + 2 bits).
/// [`encode_as`] scales a block down in f32 only where a product below the normal range
/// could not change the code ([`Format::MIN_EXP`]).
trait Wide: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Div<Output = Self> {
    const ZERO: Self;
    /// The exponent of the smallest normal value.
    const MIN_NORMAL_EXP: i32;
    /// `2^e`, where it is a normal value of the type (the factor of one exact scaling).
    fn pow2(e: i32) -> Option<Self>;
    fn mul(self, factor: Self) -> Self;
    fn abs(self) -> Self;
    /// Finite (not NaN, not infinite).
    fn finite(self) -> bool;
    fn is_nan(self) -> bool;
    fn to_f64(self) -> f64;
    /// Rounds an `f64` once.
    fn from_f64(x: f64) -> Self;
    fn from_f32(x: f32) -> Self;
    fn count(n: usize) -> Self;
    /// The codes of format `L` for a block of scaled values (one at a time from f64, unless
    /// the type has better).
    #[inline(always)]
    fn code<L: Format>(y: &[Self], out: &mut [u16]) {
        out.iter_mut().zip(y).for_each(|(o, &v)| *o = L::bits_of_f64(v.to_f64()));
    }
}

/// [`Wide`] for a float type whose bits are `$bits` with exponent bias `$bias` above `$shift`
/// significand bits; `$extra`: methods it overrides.
macro_rules! wide {
    ($t:ty, $bits:ty, $bias:expr, $shift:expr, { $($extra:item)* }) => {
        impl Wide for $t {
            const ZERO: $t = 0.0;
            const MIN_NORMAL_EXP: i32 = 1 - $bias;
            #[inline(always)]
            fn pow2(e: i32) -> Option<$t> {
                (1 - $bias..=$bias).contains(&e).then(|| <$t>::from_bits(((e + $bias) as $bits) << $shift))
            }
            #[inline(always)]
            fn mul(self, factor: $t) -> $t {
                self * factor
            }
            #[inline(always)]
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn finite(self) -> bool {
                self.abs() < <$t>::INFINITY
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn from_f32(x: f32) -> $t {
                x as $t
            }
            #[inline(always)]
            fn count(n: usize) -> $t {
                n as $t
            }
            $($extra)*
        }
    };
}

wide!(f32, u32, 127, 23, {
    #[inline(always)]
    fn code<L: Format>(y: &[f32], out: &mut [u16]) {
        L::code_f32(y, out);
    }
});
wide!(f64, u64, 1023, 52, {});

/// A transport format: how a scaled value becomes its bits (rounding to nearest even) and back.
/// Non-finite values are coded by hand for fp8: e4m3fn has no infinity (the reserved top code
/// stands for it) and the float8 crate saturates infinities to finite values.
trait Format {
    /// Bytes per element.
    const BYTES: usize;
    /// The largest magnitude finite data is scaled to.
    const TARGET_MAX: f64;
    /// The exponent of the smallest positive (subnormal) value.
    const MIN_EXP: i32;
    /// What decoding needs, fetched once per call (fp8: the value of every code).
    type Table: Copy;
    fn bits_of_f32(y: f32) -> u16;
    /// The code of an f64: through f32, rounded to odd ([`to_f32_odd`]), which is correct for
    /// formats of at most 22 significant bits.
    #[inline(always)]
    fn bits_of_f64(y: f64) -> u16 {
        Self::bits_of_f32(to_f32_odd(y))
    }
    fn table() -> Self::Table;
    /// The value of `bits` (exact in f32).
    fn value(table: Self::Table, bits: u16) -> f32;
    /// The codes of a block of scaled values (one at a time, unless the format has better).
    #[inline(always)]
    fn code_f32(y: &[f32], out: &mut [u16]) {
        out.iter_mut().zip(y).for_each(|(o, &v)| *o = Self::bits_of_f32(v));
    }
    /// The values of a block of codes.
    #[inline(always)]
    fn values(table: Self::Table, codes: &[u16], out: &mut [f32]) {
        out.iter_mut().zip(codes).for_each(|(o, &c)| *o = Self::value(table, c));
    }
}

/// `y` rounded to f32 to odd: the nearest f32 toward zero, its last bit set where that is
/// inexact. Rounding the result once more, to nearest even, into a format of at most 22
/// significant bits (fp16, bf16), gives `y` correctly rounded: no double-rounding error. (`half`'s
/// conversions from f64 go through f32 with F16C, and otherwise drop the low bits of the f64
/// significand: either can round a value just above a tie down.)
#[inline(always)]
fn to_f32_odd(y: f64) -> f32 {
    let f = y as f32;
    if !y.is_finite() || f64::from(f) == y {
        return f;
    }
    let toward_zero = if f64::from(f).abs() > y.abs() { f32::from_bits(f.to_bits() - 1) } else { f };
    f32::from_bits(toward_zero.to_bits() | 1)
}

struct Fp16;
struct Bf16;
struct E4m3;
struct E5m2;

impl Format for Fp16 {
    const BYTES: usize = 2;
    const TARGET_MAX: f64 = 65504.0;
    const MIN_EXP: i32 = -24;
    type Table = ();
    #[inline(always)]
    fn bits_of_f32(y: f32) -> u16 {
        f16::from_f32(y).to_bits()
    }
    fn table() {}
    #[inline(always)]
    fn value((): (), bits: u16) -> f32 {
        f16::from_bits(bits).to_f32()
    }
    // The whole block in one conversion: vector instructions (F16C) where the CPU has them,
    // instead of a call and a feature check per element.
    fn code_f32(y: &[f32], out: &mut [u16]) {
        out.reinterpret_cast_mut::<f16>().convert_from_f32_slice(y);
    }
    fn values((): (), codes: &[u16], out: &mut [f32]) {
        codes.reinterpret_cast::<f16>().convert_to_f32_slice(out);
    }
}

impl Format for Bf16 {
    const BYTES: usize = 2;
    // bf16 has f32's range: scaling only matters for f64 data beyond it.
    const TARGET_MAX: f64 = 1.7014118346046923e38; // 2^127
    const MIN_EXP: i32 = -133;
    type Table = ();
    /// As `bf16::from_f32` (round to nearest even, NaN kept quiet), without branches: the
    /// compiler vectorises the block's loop.
    #[inline(always)]
    fn bits_of_f32(y: f32) -> u16 {
        let x = y.to_bits();
        let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
        let quiet_nan = ((x >> 16) | 0x40) as u16;
        if x & 0x7fff_ffff > 0x7f80_0000 {
            quiet_nan
        } else {
            rounded
        }
    }
    fn table() {}
    #[inline(always)]
    fn value((): (), bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }
}

/// The fp8 code of a finite `y`, rounding to nearest even and saturating to the largest finite
/// code, as the float8 crate's conversion from `f64` (`SatFinite`), without branches (the
/// compiler vectorises the block's loop). `MANTISSA` bits, exponent `BIAS`, codes up to `MAX`.
/// Normal results round on `y`'s bits; subnormal ones are rounded by the FPU, adding the power
/// of two whose unit in the last place is the format's subnormal step.
#[inline(always)]
fn fp8_finite_bits<const MANTISSA: u32, const BIAS: u32, const MAX: u32>(y: f32) -> u16 {
    let shift = 23 - MANTISSA;
    let a = y.abs();
    let bits = a.to_bits();
    let normal = (bits.wrapping_add((1 << (shift - 1)) - 1 + ((bits >> shift) & 1)) >> shift)
        .wrapping_sub((127 - BIAS) << MANTISSA)
        .min(MAX);
    // 2^(e) with ulp 2^(1 - BIAS - MANTISSA), the subnormal step: e = 23 + 1 - BIAS - MANTISSA.
    let magic = f32::from_bits((127 + 24 - BIAS - MANTISSA) << 23);
    let subnormal = (a + magic).to_bits().wrapping_sub(magic.to_bits());
    let min_normal = f32::from_bits((128 - BIAS) << 23);
    let code = if a < min_normal { subnormal } else { normal };
    (code | ((y.to_bits() >> 24) & 0x80)) as u16
}

/// [`fp8_bits`] from `f32`, branch-free ([`fp8_finite_bits`]), the same codes.
#[inline(always)]
fn fp8_code<const MANTISSA: u32, const BIAS: u32, const MAX: u32>(y: f32, inf: (u16, u16)) -> u16 {
    let finite = fp8_finite_bits::<MANTISSA, BIAS, MAX>(y);
    let infinite = if y > 0.0 { inf.0 } else { inf.1 };
    if y.is_nan() {
        0x7f
    } else if y.is_infinite() {
        infinite
    } else {
        finite
    }
}

/// The fp8 code of `y`: NaN and infinities by hand (`inf`: the codes of +inf and -inf), the rest
/// by `finite`.
#[inline(always)]
fn fp8_bits(y: f64, inf: (u16, u16), finite: impl Fn(f64) -> u8) -> u16 {
    if y.is_nan() {
        0x7f
    } else if y.is_infinite() {
        if y > 0.0 {
            inf.0
        } else {
            inf.1
        }
    } else {
        u16::from(finite(y))
    }
}

/// The value of fp8 code `code`: the infinities of `inf` (by hand, as [`fp8_bits`] codes them),
/// else `value`.
fn fp8_value(code: u8, inf: (u16, u16), value: fn(u8) -> f32) -> f32 {
    match u16::from(code) {
        c if c == inf.0 => f32::INFINITY,
        c if c == inf.1 => f32::NEG_INFINITY,
        _ => value(code),
    }
}

/// [`Format`] for fp8 format `$name` (the float8 crate's `$f8`): `$mantissa` bits, exponent
/// `$bias`, finite codes up to `$max`, the infinities coded `$inf`, blocks scaled to `$target`,
/// the smallest value 2^`$min_exp`.
macro_rules! fp8_format {
    ($name:ident, $f8:ty, $mantissa:expr, $bias:expr, $max:expr, $inf:expr, $target:expr, $min_exp:expr) => {
        impl Format for $name {
            const BYTES: usize = 1;
            const TARGET_MAX: f64 = $target;
            const MIN_EXP: i32 = $min_exp;
            type Table = &'static [f32; 256];
            #[inline(always)]
            fn bits_of_f32(y: f32) -> u16 {
                fp8_code::<$mantissa, $bias, $max>(y, $inf)
            }
            #[inline(always)]
            fn bits_of_f64(y: f64) -> u16 {
                fp8_bits(y, $inf, |y| <$f8>::from_f64(y).to_bits())
            }
            fn table() -> Self::Table {
                static VALUES: OnceLock<[f32; 256]> = OnceLock::new();
                VALUES.get_or_init(|| {
                    std::array::from_fn(|code| fp8_value(code as u8, $inf, |x| <$f8>::from_bits(x).to_f32()))
                })
            }
            #[inline(always)]
            fn value(table: Self::Table, bits: u16) -> f32 {
                table[usize::from(bits as u8)]
            }
        }
    };
}

// e4m3fn has no infinity: the reserved top codes (±448) carry it.
fp8_format!(E4m3, F8E4M3, 3, 7, 0x7e, (0x7e, 0xfe), 224.0, -9);
fp8_format!(E5m2, F8E5M2, 2, 15, 0x7b, (0x7c, 0xfc), 57344.0, -16);

/// A dtype low-precision transport carries: widened exactly into its arithmetic ([`Wide`]) and
/// narrowed back rounding once.
trait Data: Copy {
    type W: Wide;
    fn widen(self) -> Self::W;
    fn narrow(w: Self::W) -> Self;
}

/// [`Data`] impls: the type, its arithmetic, how a value widens and how one narrows.
macro_rules! data {
    ($($t:ty => $w:ty, |$x:ident| $widen:expr, |$y:ident| $narrow:expr;)*) => {$(
        impl Data for $t {
            type W = $w;
            #[inline(always)]
            fn widen(self) -> $w {
                let $x = self;
                $widen
            }
            #[inline(always)]
            fn narrow($y: $w) -> $t {
                $narrow
            }
        }
    )*};
}

data! {
    f32 => f32, |x| x, |w| w;
    f64 => f64, |x| x, |w| w;
    f16 => f32, |x| x.to_f32(), |w| f16::from_f32(w);
    bf16 => f32, |x| x.to_f32(), |w| bf16::from_f32(w);
}

/// Runs the generic function `$f::<data type, format>($args)` for dtype `$d` and format `$lp`
/// (validated by [`check_format`]): one specialised loop per pair instead of a dispatch per
/// element.
macro_rules! for_types {
    ($d:expr, $lp:expr, $f:ident $args:tt) => {
        for_types!(@ $d, $lp, $f $args; F32 f32, F64 f64, F16 f16, BF16 bf16)
    };
    (@ $d:expr, $lp:expr, $f:ident $args:tt; $($dv:ident $dt:ty),*) => {
        match ($d, $lp) {
            $(
                (DType::$dv, DType::F16) => $f::<$dt, Fp16> $args,
                (DType::$dv, DType::BF16) => $f::<$dt, Bf16> $args,
                (DType::$dv, DType::F8E4M3) => $f::<$dt, E4m3> $args,
                (DType::$dv, DType::F8E5M2) => $f::<$dt, E5m2> $args,
            )*
            (d, lp) => unreachable!("validated data dtype and transport format: {d}, {lp}"),
        }
    };
}

/// `x * 2^e` without overflowing the scale itself (the product may still over- or underflow).
/// The factors are built from their bits: `powi` need not be exact (miri makes it inexact).
fn ldexp(mut x: f64, mut e: i32) -> f64 {
    let pow2 = |e| <f64 as Wide>::pow2(e).expect("a normal exponent");
    while e > 1000 {
        x *= pow2(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= pow2(-1000);
        e += 1000;
    }
    x * pow2(e)
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
/// the format's target `t` (and above half of it).
fn block_exponent(t: f64, amax: f64) -> i32 {
    if amax == 0.0 || !amax.is_finite() {
        return 0;
    }
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
    debug_assert!(lo.is_multiple_of(SCALE_BLOCK) && lo + len <= total);
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
    // SAFETY: forwarded.
    unsafe { for_types!(d, lp, encode_as(data, count, exps, payload)) }
}

/// [`encode`] for data of type `D` into format `L`, a block at a time: the block is widened
/// into a local array, its largest finite magnitude found, scaled, and coded into a local
/// array that is copied out (the loops run on aligned local memory the compiler can vectorise;
/// `data` and `payload` may be unaligned).
///
/// # Safety
/// As [`encode`].
unsafe fn encode_as<D: Data, L: Format>(data: *const u8, count: usize, exps: *mut i32, payload: *mut u8) {
    let data = data.cast::<D>();
    let mut x = [<D::W as Wide>::ZERO; SCALE_BLOCK];
    let mut bits = [0u16; SCALE_BLOCK];
    let mut bytes = [0u8; SCALE_BLOCK];
    for b in 0..count.div_ceil(SCALE_BLOCK) {
        let lo = b * SCALE_BLOCK;
        let n = SCALE_BLOCK.min(count - lo);
        let x = &mut x[..n];
        for (k, v) in x.iter_mut().enumerate() {
            // SAFETY: element lo + k < count of `data` (contract); unaligned reads tolerate
            // any placement.
            *v = unsafe { data.add(lo + k).read_unaligned() }.widen();
        }
        let (e, factor) = block_scale_as::<D, L>(largest_finite(x).to_f64());
        // SAFETY: b < blocks, inside the exponent area.
        unsafe { exps.add(b).write_unaligned(e) };
        let bits = &mut bits[..n];
        match factor {
            Some(f) => {
                // Exact: a power of two of the arithmetic.
                let f = <D::W as Wide>::from_f64(f);
                x.iter_mut().for_each(|v| *v = v.mul(f));
                <D::W as Wide>::code::<L>(x, bits);
            }
            // Extreme blocks (a scale beyond the arithmetic's normal range, or see above).
            None => bits.iter_mut().zip(x.iter()).for_each(|(o, &v)| *o = L::bits_of_f64(ldexp(v.to_f64(), -e))),
        }
        // SAFETY: payload elements lo..lo + n lie inside the payload area (contract); the local
        // arrays are disjoint from it.
        unsafe {
            if L::BYTES == 2 {
                std::ptr::copy_nonoverlapping(bits.as_ptr().cast::<u8>(), payload.add(2 * lo), 2 * n);
            } else {
                bytes.iter_mut().zip(bits.iter()).for_each(|(o, &v)| *o = v as u8);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), payload.add(lo), n);
            }
        }
    }
}

/// The arithmetic a block of `d` data is scaled, decoded and accumulated in: float64 for
/// float64 data, float32 otherwise.
pub fn arithmetic(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// How [`encode`] scales a block of `d` data into `lp` whose largest finite magnitude is `amax`
/// (0 for a block without finite nonzero values): the block's exponent `e`, and the factor
/// `2^-e` where one multiplication by it in the block's [`arithmetic`] followed by one
/// rounding into `lp` gives the block's codes; `None` where the codec takes its exact f64 path
/// instead (a factor outside the arithmetic's normal range, or bf16 codes of f32 products
/// below f32's normal range). `d` and `lp` are validated by [`check_format`].
pub fn block_scale(d: DType, lp: DType, amax: f64) -> (i32, Option<f64>) {
    for_types!(d, lp, block_scale_as(amax))
}

fn block_scale_as<D: Data, L: Format>(amax: f64) -> (i32, Option<f64>) {
    let e = block_exponent(L::TARGET_MAX, amax);
    // Scaled down in the block's arithmetic, a product below its normal range is rounded
    // there once more: harmless where the format has no value that small (all but bf16 from
    // f32); else exactly, in f64.
    let scaled_exactly = e <= 0 || L::MIN_EXP > <D::W as Wide>::MIN_NORMAL_EXP + 1;
    (e, <D::W as Wide>::pow2(-e).filter(|_| scaled_exactly).map(Wide::to_f64))
}

/// The factor `2^e` that decodes a block of exponent `e` into `d`'s [`arithmetic`] by one
/// multiplication, where it is a normal value of that arithmetic (`None`: the codec rounds the
/// exact f64 product once instead).
pub fn unscale(d: DType, e: i32) -> Option<f64> {
    match arithmetic(d) {
        DType::F64 => <f64 as Wide>::pow2(e),
        _ => <f32 as Wide>::pow2(e).map(f64::from),
    }
}

/// The largest finite magnitude in `x` (0 if none). Eight running maxima instead of one: the
/// compiler turns them into one vector register, where a single chain of comparisons would
/// take a few cycles per element. The maximum does not depend on the order of comparison
/// (NaN and infinities are skipped), so the result is the same.
#[inline(always)]
fn largest_finite<W: Wide>(x: &[W]) -> W {
    let keep = |m: W, v: W| {
        let a = v.abs();
        if a.finite() && a > m {
            a
        } else {
            m
        }
    };
    let mut lanes = [W::ZERO; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = keep(*m, v);
        }
    }
    rest.iter().chain(lanes.iter()).fold(W::ZERO, |m, &v| keep(m, v))
}

/// Scratch of [`decode_block`], made once per call.
struct DecodeScratch {
    bytes: [u8; SCALE_BLOCK],
    codes: [u16; SCALE_BLOCK],
    values: [f32; SCALE_BLOCK],
}

impl DecodeScratch {
    fn new() -> DecodeScratch {
        DecodeScratch { bytes: [0; SCALE_BLOCK], codes: [0; SCALE_BLOCK], values: [0.0; SCALE_BLOCK] }
    }
}

/// Decodes block `b` of a part into `out` (as many elements as `out` holds), in arithmetic `W`:
/// the codes are copied into `scratch` and converted together.
///
/// # Safety
/// The part holds block `b` with at least `out.len()` elements.
#[inline(always)]
unsafe fn decode_block<W: Wide, L: Format>(
    table: L::Table,
    part: SubRun,
    b: usize,
    out: &mut [W],
    scratch: &mut DecodeScratch,
) {
    let n = out.len();
    let (bytes, codes, values) = (&mut scratch.bytes[..n], &mut scratch.codes[..n], &mut scratch.values[..n]);
    let first = b * SCALE_BLOCK;
    // SAFETY: b is a block of the part, whose elements first..first + n lie in its payload
    // (contract); the local arrays are disjoint from it.
    let e = unsafe {
        if L::BYTES == 2 {
            std::ptr::copy_nonoverlapping(part.payload.add(2 * first), codes.as_mut_ptr().cast::<u8>(), 2 * n);
        } else {
            // Copied, not borrowed: the payload may be a peer's memory.
            std::ptr::copy_nonoverlapping(part.payload.add(first), bytes.as_mut_ptr(), n);
            codes.iter_mut().zip(bytes.iter()).for_each(|(c, &v)| *c = u16::from(v));
        }
        part.exps.add(b).read_unaligned()
    };
    L::values(table, codes, values);
    match W::pow2(e) {
        Some(f) => out.iter_mut().zip(values.iter()).for_each(|(o, &v)| *o = W::from_f32(v).mul(f)),
        // Rounding once, from the exact f64 product.
        None => out.iter_mut().zip(values.iter()).for_each(|(o, &v)| *o = W::from_f64(ldexp(f64::from(v), e))),
    }
}

/// Reduces `len` elements of every source part into `dst` (dtype `d`), in source order,
/// accumulating in f64 for f64 data and f32 otherwise, rounding once into `d`.
///
/// # Safety
/// Every part holds `len` elements; `dst` is valid for `len` writes of `d` and overlaps no
/// source.
pub unsafe fn reduce_encoded(d: DType, lp: DType, op: ReduceOp, srcs: &[SubRun], len: usize, dst: *mut u8) {
    // SAFETY: forwarded.
    unsafe { for_types!(d, lp, reduce_as(op, srcs, len, dst)) }
}

/// [`reduce_encoded`] for data of type `D` in format `L`, a block at a time.
///
/// # Safety
/// As [`reduce_encoded`].
unsafe fn reduce_as<D: Data, L: Format>(op: ReduceOp, srcs: &[SubRun], len: usize, dst: *mut u8) {
    let (table, dst) = (L::table(), dst.cast::<D>());
    let (mut acc, mut x) = ([<D::W as Wide>::ZERO; SCALE_BLOCK], [<D::W as Wide>::ZERO; SCALE_BLOCK]);
    let members = <D::W as Wide>::count(srcs.len());
    let mut scratch = DecodeScratch::new();
    for b in 0..len.div_ceil(SCALE_BLOCK) {
        let n = SCALE_BLOCK.min(len - b * SCALE_BLOCK);
        let (acc, x) = (&mut acc[..n], &mut x[..n]);
        // SAFETY: every part holds block b with n elements (contract).
        unsafe { decode_block::<D::W, L>(table, srcs[0], b, acc, &mut scratch) };
        for s in &srcs[1..] {
            // SAFETY: as above.
            unsafe { decode_block::<D::W, L>(table, *s, b, x, &mut scratch) };
            let pairs = acc.iter_mut().zip(x.iter());
            match op {
                ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, &x)| *a = *a + x),
                // NaN wins, in both.
                ReduceOp::Max => pairs.for_each(|(a, &x)| *a = if *a > x || a.is_nan() { *a } else { x }),
                ReduceOp::Min => pairs.for_each(|(a, &x)| *a = if *a < x || a.is_nan() { *a } else { x }),
            }
        }
        if op == ReduceOp::Avg {
            acc.iter_mut().for_each(|a| *a = *a / members);
        }
        for (k, &a) in acc.iter().enumerate() {
            // SAFETY: element b * SCALE_BLOCK + k < len, inside `dst` (contract).
            unsafe { dst.add(b * SCALE_BLOCK + k).write_unaligned(D::narrow(a)) };
        }
    }
}

/// Elements [`reduce_encoded_fan_out`] reduces before copying them out: a block of results
/// that stays in L2 between its reduction and its copies (under miri two blocks, so that its
/// tests cross it at sizes miri runs in seconds).
const FAN_ELEMENTS: usize = if cfg!(miri) { 2 * SCALE_BLOCK } else { 64 * SCALE_BLOCK };

/// [`reduce_encoded`] into `dsts[0]`, and the same values copied (with `stores`) into every
/// other destination, a few blocks at a time: a reducer's part of a two-shot allreduce goes,
/// in the data dtype, into its own output, its workspace (for members that read it) and the
/// outputs of members that take pushes. Fences streaming stores before returning, so a release
/// store that follows publishes the results.
///
/// # Safety
/// As [`reduce_encoded`] for `dsts[0]`; every other destination is valid for `len` writes of
/// `d`, and all of them are pairwise disjoint and disjoint from the sources.
pub unsafe fn reduce_encoded_fan_out(
    d: DType,
    lp: DType,
    op: ReduceOp,
    srcs: &[SubRun],
    len: usize,
    dsts: &[*mut u8],
    stores: Stores,
) {
    let size = d.size();
    let mut parts: Vec<SubRun> = srcs.to_vec();
    let mut lo = 0;
    while lo < len {
        let n = FAN_ELEMENTS.min(len - lo);
        for (p, s) in parts.iter_mut().zip(srcs) {
            *p =
                SubRun { exps: s.exps.wrapping_add(lo / SCALE_BLOCK), payload: s.payload.wrapping_add(lo * lp.size()) };
        }
        // SAFETY: every source holds `len` elements from a block boundary, so elements
        // lo..lo + n (lo a multiple of SCALE_BLOCK) are a part of it; the destinations hold
        // `len` elements each and are disjoint from the sources and each other (contract).
        unsafe {
            let first = dsts[0].add(lo * size);
            reduce_encoded(d, lp, op, &parts, n, first);
            for &dst in &dsts[1..] {
                copy(first, dst.add(lo * size), n * size, stores);
            }
        }
        lo += n;
    }
    fence(stores);
}

/// Decodes `len` elements of a part into `dst` (dtype `d`).
///
/// # Safety
/// As [`reduce_encoded`] with one source.
pub unsafe fn decode(d: DType, lp: DType, src: SubRun, len: usize, dst: *mut u8) {
    // SAFETY: forwarded.
    unsafe { for_types!(d, lp, decode_as(src, len, dst)) }
}

/// [`decode`] for data of type `D` in format `L`.
///
/// # Safety
/// As [`decode`].
unsafe fn decode_as<D: Data, L: Format>(src: SubRun, len: usize, dst: *mut u8) {
    let (table, dst) = (L::table(), dst.cast::<D>());
    let (mut x, mut scratch) = ([<D::W as Wide>::ZERO; SCALE_BLOCK], DecodeScratch::new());
    for b in 0..len.div_ceil(SCALE_BLOCK) {
        let n = SCALE_BLOCK.min(len - b * SCALE_BLOCK);
        // SAFETY: the part holds block b with n elements (contract).
        unsafe { decode_block::<D::W, L>(table, src, b, &mut x[..n], &mut scratch) };
        for (k, &v) in x[..n].iter().enumerate() {
            // SAFETY: element b * SCALE_BLOCK + k < len, inside `dst` (contract).
            unsafe { dst.add(b * SCALE_BLOCK + k).write_unaligned(D::narrow(v)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `f32` bit pattern with step `step` (1: all of them), through the fast conversions
    /// and through the reference ones (`half`, and `float8` via `f64`): the same codes.
    fn conversions_agree(step: usize) {
        for x in (0..=u32::MAX).step_by(step).chain([0x7f7f_ffff, 0x8000_0001, 0x3f80_8000, 0x3f81_8000]) {
            let y = f32::from_bits(x);
            assert_eq!(Bf16::bits_of_f32(y), bf16::from_f32(y).to_bits(), "bf16 {x:#x}");
            assert_eq!(E4m3::bits_of_f32(y), E4m3::bits_of_f64(f64::from(y)), "e4m3 {x:#x} ({y:e})");
            assert_eq!(E5m2::bits_of_f32(y), E5m2::bits_of_f64(f64::from(y)), "e5m2 {x:#x} ({y:e})");
        }
    }

    #[test]
    fn fast_conversions_agree_with_the_reference_ones() {
        // Under miri (about a thousand times slower) a sample of the bit patterns.
        conversions_agree(if cfg!(miri) { (1 << 22) + 1 } else { 4093 });
        // At and around every fp8 value and every midpoint between neighbours (where rounding
        // turns), both signs, beyond the largest value too.
        for (table, max) in [(E4m3::table(), 448f32), (E5m2::table(), 57344.0)] {
            let mut values: Vec<f32> = table.iter().copied().filter(|v| v.is_finite() && *v >= 0.0).collect();
            values.sort_by(f32::total_cmp);
            values.extend([max * 1.03, max * 1.07, max * 1.5, max * 4.0]);
            // Under miri every fourth pair of neighbours, and the top ones (around and beyond
            // the largest value, where the conversions saturate).
            let pairs = values.len() - 1;
            let sample = |k: usize| !cfg!(miri) || k.is_multiple_of(4) || k + 6 >= pairs;
            for (_, w) in values.windows(2).enumerate().filter(|&(k, _)| sample(k)) {
                let mid = (w[0] + w[1]) / 2.0;
                for y in [w[0], mid, w[1]] {
                    for x in [y.to_bits().saturating_sub(1), y.to_bits(), y.to_bits() + 1] {
                        for y in [f32::from_bits(x), -f32::from_bits(x)] {
                            assert_eq!(E4m3::bits_of_f32(y), E4m3::bits_of_f64(f64::from(y)), "e4m3 {y:e}");
                            assert_eq!(E5m2::bits_of_f32(y), E5m2::bits_of_f64(f64::from(y)), "e5m2 {y:e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[ignore = "every f32: about a minute; run after changing a conversion"]
    fn fast_conversions_agree_with_the_reference_ones_everywhere() {
        conversions_agree(1);
    }

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
        // Under miri (about a thousand times slower) the extreme scales and 1 (1e-30 takes
        // bf16's blocks through the f64 scaling, the others through f32's), over a block and
        // a part of one.
        let (scales, n) = if cfg!(miri) {
            (&[1e-30f32, 1.0, 1e30][..], SCALE_BLOCK as i32 + 44)
        } else {
            (&[1e-30f32, 1e-8, 1.0, 1e4, 1e30][..], 1000)
        };
        for &scale in scales {
            let data: Vec<f32> = (0..n).map(|i| scale * (((i * 37) % 101) as f32 - 50.0) / 7.0).collect();
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

    /// Values of every kind a block may hold: NaN, infinities, signed zeros, subnormals (a
    /// block whose largest value is above 2^127 scales them down), a value just above a bf16
    /// tie, and random values over 90 decades.
    fn mixed_values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = (s >> 11) as f64 / (1u64 << 53) as f64;
                match i % 97 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    5 => 1e-40,
                    6 => 3.0e38,
                    7 => f64::from(f32::from_bits(0x0001_0001)),
                    8 => f64::from(f32::from_bits(0x3f80_8001)),
                    9 => -f64::from(f32::from_bits(0x3f81_8000)),
                    _ => (r - 0.5) * 10f64.powi(((s >> 3) % 90) as i32 - 45),
                }
            })
            .collect()
    }

    /// `x` rounded once to dtype `d` (correctly: the reference `bits_of_f64` for 16-bit types):
    /// its bytes appended to `bytes`, and the value stored. (Appended rather than returned: an
    /// allocation per element would dominate the tests' time under miri.)
    fn narrow(d: DType, x: f64, bytes: &mut Vec<u8>) -> f64 {
        match d {
            DType::F32 => {
                bytes.extend_from_slice(&(x as f32).to_le_bytes());
                f64::from(x as f32)
            }
            DType::F64 => {
                bytes.extend_from_slice(&x.to_le_bytes());
                x
            }
            DType::F16 => {
                let h = f16::from_bits(Fp16::bits_of_f64(x));
                bytes.extend_from_slice(&h.to_le_bytes());
                h.to_f64()
            }
            _ => {
                let h = bf16::from_bits(Bf16::bits_of_f64(x));
                bytes.extend_from_slice(&h.to_le_bytes());
                h.to_f64()
            }
        }
    }

    /// `v` stored as dtype `d`, and the values stored.
    fn as_dtype(d: DType, v: &[f64]) -> (Vec<u8>, Vec<f64>) {
        let mut bytes = Vec::with_capacity(v.len() * d.size());
        let exact = v.iter().map(|&x| narrow(d, x, &mut bytes)).collect();
        (bytes, exact)
    }

    /// Whether `a` and `b` hold the same elements of dtype `d`, bit for bit, a NaN matching
    /// any NaN: Rust leaves the sign and payload of a NaN that arithmetic produces unspecified.
    fn same_values(d: DType, a: &[u8], b: &[u8]) -> bool {
        let nan = |x: &[u8]| match d {
            DType::F32 => f32::from_le_bytes(x.try_into().unwrap()).is_nan(),
            DType::F64 => f64::from_le_bytes(x.try_into().unwrap()).is_nan(),
            DType::F16 => f16::from_le_bytes(x.try_into().unwrap()).is_nan(),
            _ => bf16::from_le_bytes(x.try_into().unwrap()).is_nan(),
        };
        let pairs = a.chunks(d.size()).zip(b.chunks(d.size()));
        a.len() == b.len() && pairs.into_iter().all(|(x, y)| x == y || (nan(x) && nan(y)))
    }

    /// Code `i` of a run.
    fn code_at(run: SubRun, lp: DType, i: usize) -> u16 {
        // SAFETY: callers pass an index inside the run.
        unsafe {
            if lp.size() == 2 {
                run.payload.cast::<u16>().add(i).read_unaligned()
            } else {
                u16::from(run.payload.add(i).read())
            }
        }
    }

    /// A format's reference functions: the code of an f64, the value of a code.
    struct Reference {
        target_max: f64,
        code: fn(f64) -> u16,
        value: fn(u16) -> f32,
    }

    fn reference(lp: DType) -> Reference {
        match lp {
            DType::F16 => {
                Reference { target_max: Fp16::TARGET_MAX, code: Fp16::bits_of_f64, value: |c| Fp16::value((), c) }
            }
            DType::BF16 => {
                Reference { target_max: Bf16::TARGET_MAX, code: Bf16::bits_of_f64, value: |c| Bf16::value((), c) }
            }
            DType::F8E4M3 => Reference {
                target_max: E4m3::TARGET_MAX,
                code: E4m3::bits_of_f64,
                value: |c| E4m3::value(E4m3::table(), c),
            },
            _ => Reference {
                target_max: E5m2::TARGET_MAX,
                code: E5m2::bits_of_f64,
                value: |c| E5m2::value(E5m2::table(), c),
            },
        }
    }

    /// The codes of one run, computed the plain way: every value scaled exactly in f64 by its
    /// block's power of two and rounded once into the format.
    fn reference_codes(lp: DType, exact: &[f64]) -> (Vec<i32>, Vec<u16>) {
        let Reference { target_max: t, code, .. } = reference(lp);
        let mut exps = Vec::new();
        let mut codes = Vec::new();
        for block in exact.chunks(SCALE_BLOCK) {
            let amax = block.iter().map(|x| x.abs()).filter(|a| a.is_finite()).fold(0.0, f64::max);
            let e = block_exponent(t, amax);
            exps.push(e);
            codes.extend(block.iter().map(|&x| code(ldexp(x, -e))));
        }
        (exps, codes)
    }

    /// Element `i` of a run decoded the plain way: exactly in f64, rounded to the accumulator
    /// (f64 for f64 data, f32 otherwise).
    fn reference_value(d: DType, lp: DType, run: SubRun, i: usize) -> f64 {
        // SAFETY: i lies inside the run, in block i / SCALE_BLOCK.
        let e = unsafe { run.exps.add(i / SCALE_BLOCK).read_unaligned() };
        let v = ldexp(f64::from((reference(lp).value)(code_at(run, lp, i))), e);
        if d == DType::F64 {
            v
        } else {
            f64::from(v as f32)
        }
    }

    /// The fast kernels against the plain computation, bit for bit, for every data dtype,
    /// format and op: the codes (scaled exactly, rounded once, correctly), the reductions (f32
    /// arithmetic on f32 values rounds like f64 arithmetic rounded to f32) and the decoding.
    #[test]
    fn kernels_match_the_plain_computation() {
        // Under miri (about a thousand times slower) the widest and a narrowest type (the others
        // differ only in element size; all four run natively), every format and op, two
        // sources instead of three (the loop over the sources after the first still runs),
        // and a block and one element for half of the pairs only: alternating, so that each
        // format, and each type with a 1-byte and a 2-byte payload, crosses a block boundary.
        let dtypes = [DType::F64, DType::F16, DType::F32, DType::BF16];
        let sources = if cfg!(miri) { 2 } else { 3 };
        for (di, &d) in if cfg!(miri) { &dtypes[..2] } else { &dtypes[..] }.iter().enumerate() {
            for (fi, lp) in FORMATS.into_iter().enumerate() {
                let sizes = [(1000, 1), (257, 2), (1, 3)];
                // Under miri a block and one element, and a single element; or the latter only.
                let miri_sizes = if (di + fi).is_multiple_of(2) { &sizes[1..] } else { &sizes[2..] };
                for &(n, seed) in if cfg!(miri) { miri_sizes } else { &sizes[..] } {
                    let inputs: Vec<(Vec<u8>, Vec<f64>)> =
                        (0..sources).map(|k| as_dtype(d, &mixed_values(n, seed * 10 + k))).collect();
                    let mut encoded = Vec::new();
                    for (bytes, exact) in &inputs {
                        let enc = vec![0u8; encoded_bytes(lp, n)];
                        let run = sub_run(enc.as_ptr(), lp, n, 0, n);
                        // SAFETY: `enc` holds an encoded run of n elements; `bytes` n of d.
                        unsafe { encode(d, lp, bytes.as_ptr(), n, run.exps.cast_mut(), run.payload.cast_mut()) };
                        let (exps, codes) = reference_codes(lp, exact);
                        for (b, &e) in exps.iter().enumerate() {
                            // SAFETY: b is a block of the run.
                            assert_eq!(unsafe { run.exps.add(b).read_unaligned() }, e, "{d} {lp} block {b}");
                        }
                        for (i, &c) in codes.iter().enumerate() {
                            let (got, value) = (code_at(run, lp, i), reference(lp).value);
                            let both_nan = value(got).is_nan() && value(c).is_nan();
                            assert!(got == c || both_nan, "{d} {lp} element {i} ({}): {got:#x}, want {c:#x}", exact[i]);
                        }
                        encoded.push(enc);
                    }
                    let runs: Vec<SubRun> = encoded.iter().map(|e| sub_run(e.as_ptr(), lp, n, 0, n)).collect();
                    let mut got = vec![0u8; n * d.size()];
                    // SAFETY: the run holds n elements; `got` n of d.
                    unsafe { decode(d, lp, runs[0], n, got.as_mut_ptr()) };
                    // Every run decoded the plain way once, for the decoding and every op.
                    let decoded: Vec<Vec<f64>> =
                        runs.iter().map(|&r| (0..n).map(|i| reference_value(d, lp, r, i)).collect()).collect();
                    assert!(same_values(d, &got, &as_dtype(d, &decoded[0]).0), "{d} {lp} decode");
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                        // SAFETY: every run holds n elements; `got` n of d.
                        unsafe { reduce_encoded(d, lp, op, &runs, n, got.as_mut_ptr()) };
                        assert!(same_values(d, &got, &reference_reduce(d, op, &decoded)), "{d} {lp} {op:?}");
                    }
                }
            }
        }
    }

    /// The reduction the plain way, of runs decoded the plain way ([`reference_value`] of
    /// every element of every run): rounded to the accumulator after every step, then once
    /// into the dtype.
    fn reference_reduce(d: DType, op: ReduceOp, decoded: &[Vec<f64>]) -> Vec<u8> {
        let round = |x: f64| if d == DType::F64 { x } else { f64::from(x as f32) };
        let values: Vec<f64> = (0..decoded[0].len())
            .map(|i| {
                let a = decoded[1..].iter().fold(decoded[0][i], |a, r| {
                    let x = r[i];
                    round(match op {
                        ReduceOp::Sum | ReduceOp::Avg => a + x,
                        ReduceOp::Max if a > x || a.is_nan() => a,
                        ReduceOp::Min if a < x || a.is_nan() => a,
                        _ => x,
                    })
                });
                if op == ReduceOp::Avg {
                    round(a / decoded.len() as f64)
                } else {
                    a
                }
            })
            .collect();
        as_dtype(d, &values).0
    }

    /// The fan-out reduction writes, in every destination, what [`reduce_encoded`] writes, over
    /// sizes around its block of blocks (one encoded run per source, with streaming stores too).
    #[test]
    fn fan_out_reduction_equals_the_reduction_in_every_destination() {
        // Under miri (about a thousand times slower) two sources instead of three, and
        // streaming stores only: with ordinary ones only the `copy` called differs, and
        // `copy`'s own test runs both kinds there.
        let sources = if cfg!(miri) { 2 } else { 3 };
        let all_stores = [Stores::Cached, Stores::Streaming];
        for (d, lp) in [(DType::F32, DType::BF16), (DType::BF16, DType::F8E4M3), (DType::F64, DType::F16)] {
            // Under miri one element, and one more than a block of blocks (two blocks there):
            // a second pass, on a part that starts past the first exponents and payload,
            // ending in a partial block.
            let lens = [1, 255, 257, FAN_ELEMENTS - 1, FAN_ELEMENTS + 300, 3 * FAN_ELEMENTS];
            for &len in if cfg!(miri) { &[1, FAN_ELEMENTS + 1][..] } else { &lens[..] } {
                let inputs: Vec<Vec<u8>> = (0..sources).map(|k| as_dtype(d, &mixed_values(len, 40 + k)).0).collect();
                let encoded: Vec<Vec<u8>> = inputs
                    .iter()
                    .map(|x| {
                        let enc = vec![0u8; encoded_bytes(lp, len)];
                        let run = sub_run(enc.as_ptr(), lp, len, 0, len);
                        // SAFETY: `enc` holds an encoded run of len elements; `x` len of d.
                        unsafe { encode(d, lp, x.as_ptr(), len, run.exps.cast_mut(), run.payload.cast_mut()) };
                        enc
                    })
                    .collect();
                let runs: Vec<SubRun> = encoded.iter().map(|e| sub_run(e.as_ptr(), lp, len, 0, len)).collect();
                let mut want = vec![0u8; len * d.size()];
                // SAFETY: every run holds len elements; `want` len of d.
                unsafe { reduce_encoded(d, lp, ReduceOp::Sum, &runs, len, want.as_mut_ptr()) };
                for &stores in if cfg!(miri) { &all_stores[1..] } else { &all_stores[..] } {
                    let mut outs = vec![vec![0xa5u8; len * d.size()]; 3];
                    let dsts: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
                    // SAFETY: as above, for three disjoint destinations.
                    unsafe { reduce_encoded_fan_out(d, lp, ReduceOp::Sum, &runs, len, &dsts, stores) };
                    for (k, o) in outs.iter().enumerate() {
                        assert!(same_values(d, o, &want), "{d} via {lp}, {len} elements, {stores:?}: destination {k}");
                    }
                }
            }
        }
    }

    /// The 16-bit formats' conversions from f64 round correctly: around every tie between two
    /// neighbouring codes (offsets of f32's and f64's last places, both ways), the result is
    /// the nearer neighbour, the even one at the tie itself.
    #[test]
    fn sixteen_bit_conversions_from_f64_round_correctly() {
        let mut s = 7u64;
        for (name, lp) in [("bf16", DType::BF16), ("fp16", DType::F16)] {
            let Reference { code, value, .. } = reference(lp);
            let value = |c| f64::from(value(c));
            // Zero and every subnormal code, then random normal codes below the largest (bf16
            // normals 0x0080..0x7f7e, fp16 0x0400..0x7bfe), each with the next code up.
            let (first, last) = if name == "bf16" { (0x0080u16, 0x7f7e) } else { (0x0400, 0x7bfe) };
            // Under miri (about a thousand times slower) every 16th subnormal code and the last
            // one, and 50 random codes.
            let subnormal = (0..first).filter(|c| !cfg!(miri) || c.is_multiple_of(16) || c + 1 == first);
            let random = (0..if cfg!(miri) { 50 } else { 20_000 }).map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                first + ((s >> 20) % u64::from(last - first + 1)) as u16
            });
            let pairs = subnormal.chain(random).map(|below| (below, value(below), value(below + 1)));
            // The largest finite code: above it lies infinity, where the next code would be.
            let max = last + 1;
            let top = (max, value(max), 2.0 * value(max) - value(max - 1));
            for (below, lo, hi) in pairs.chain([top]) {
                let mid = (lo + hi) / 2.0;
                let f32_ulp = f64::from(f32::from_bits((mid as f32).to_bits() + 1)) - f64::from(mid as f32);
                for offset in
                    [0.0, f32_ulp, 2.0 * f32_ulp, mid * 2f64.powi(-50), f64::from(below & 0xff) * mid * 2f64.powi(-45)]
                {
                    for y in [mid + offset, mid - offset] {
                        let want = if y < mid || (y == mid && below % 2 == 0) { below } else { below + 1 };
                        assert_eq!(code(y), want, "{name} of {y:e} ({:#x})", y.to_bits());
                        assert_eq!(code(-y), want | 0x8000, "{name} of -{y:e}");
                    }
                }
            }
        }
    }
}
