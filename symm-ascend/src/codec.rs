//! Low-precision transport on the device: runs in the CPU codec's format
//! ([`symm_core::coll::lowp`]: per 256-element block an `i32` exponent, then the payload),
//! made and reduced by device operators, and by the host codec itself for the rare blocks that
//! one multiplication in float32 does not code as it does. Written once over [`Ops`], which the
//! backend implements with aclnn operators (`comm.rs`) and the tests below with IEEE
//! arithmetic on the host: they compare the result with the host codec bit for bit, which
//! checks the algorithm, not the device.
//!
//! [`encode`]: the data is widened to float32 (a cast; float32 data is used in place), each
//! block's largest magnitude found (absolute value, then the maximum of each block) and read by
//! the host, which picks the block's exponent as the codec does
//! ([`lowp::block_scale`]) and writes the exponents into the run and the factors `2^-e` into
//! scratch; the device multiplies each block by its factor and casts into the format, rounding
//! once. A block whose largest magnitude is not finite, or whose factor the codec does not use
//! (outside float32's normal range, or bf16 codes of products below it), is coded by the host
//! codec: its elements are read, encoded, and its codes written over the device's.
//!
//! [`reduce`]: the host reads every run's exponents and writes the factors `2^e`; the device
//! casts each run's payload to float32, gives e4m3's infinities back (the codec codes them as
//! ±448, which finite data, scaled to at most 224, never reaches), scales, and combines the
//! sources in order as [`crate::reduce::plan`] does, divides once for `avg`, and casts to the
//! dtype once. A block whose factor is not a normal float32 is decoded by the host codec.
//!
//! Float64 data is coded by the host codec throughout (read, coded, written back): its
//! arithmetic is float64, whose casts into the formats the device's operators need not round
//! once.

use symm_core::coll::lowp::{self, SubRun, SCALE_BLOCK};
use symm_core::{DType, ReduceOp, Result};

use crate::reduce::Combine;

/// An address in the memory the operators work on (the device's).
pub type Addr = *mut u8;

/// The operators the codec asks of a device, each enqueued in order on one stream over `len`
/// elements at contiguous addresses. The host's copies are enqueued too: their host memory
/// stays valid until the next [`finish`](Ops::finish).
///
/// # Safety
/// Of every `unsafe` method: the addresses hold what the operator addresses (`len` elements
/// of its dtype, a factor per block, `bytes` bytes) until the next `finish`; an output
/// overlaps no input unless the method allows it.
pub trait Ops {
    /// `to = from` converted from `from_dtype` to `to_dtype`, rounding to nearest even.
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn cast(&mut self, from: Addr, from_dtype: DType, to: Addr, to_dtype: DType, len: usize) -> Result<()>;
    /// `out = |x|`.
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn abs(&mut self, x: Addr, out: Addr, dtype: DType, len: usize) -> Result<()>;
    /// `out[b]` = the largest element of block `b` of `x` (blocks of [`SCALE_BLOCK`], the last
    /// one possibly short).
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn block_max(&mut self, x: Addr, out: Addr, dtype: DType, len: usize) -> Result<()>;
    /// `out[k] = x[k] * factors[k / SCALE_BLOCK]` (`out` may be `x`).
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn scale(&mut self, x: Addr, factors: Addr, out: Addr, dtype: DType, len: usize) -> Result<()>;
    /// `x[k] = to` where `x[k] == from`.
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn replace(&mut self, x: Addr, dtype: DType, len: usize, from: f64, to: f64) -> Result<()>;
    /// `out = a <combine> b` (`out` may be `a`).
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn combine(&mut self, combine: Combine, a: Addr, b: Addr, out: Addr, dtype: DType, len: usize)
        -> Result<()>;
    /// `x = x / by`.
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn divide(&mut self, x: Addr, by: usize, dtype: DType, len: usize) -> Result<()>;
    /// `bytes` bytes from `from` to `to`, both the device's.
    ///
    /// # Safety
    /// See [`Ops`].
    unsafe fn copy(&mut self, from: Addr, to: Addr, bytes: usize) -> Result<()>;
    /// `bytes` bytes from the device's `from` into host memory.
    ///
    /// # Safety
    /// `to` is valid for `bytes` writes until the next `finish`.
    unsafe fn download(&mut self, from: Addr, to: *mut u8, bytes: usize) -> Result<()>;
    /// `bytes` bytes of host memory `from` to the device's `to`.
    ///
    /// # Safety
    /// `from` is valid for `bytes` reads until the next `finish`.
    unsafe fn upload(&mut self, from: *const u8, to: Addr, bytes: usize) -> Result<()>;
    /// Waits until everything enqueued has run.
    fn finish(&mut self) -> Result<()>;
}

/// The device scratch of one call: two float32 vectors of the elements and one of the blocks'
/// numbers, carved from one allocation ([`Scratch::bytes`]).
#[derive(Clone, Copy, Debug)]
pub struct Scratch {
    /// A widened vector (the data, or a source being decoded).
    pub wide: Addr,
    /// A second one (the scaled data, or the accumulator).
    pub acc: Addr,
    /// The blocks' maxima and factors.
    pub blocks: Addr,
}

/// Device operators like addresses aligned to at least this.
const ALIGN: usize = 512;

impl Scratch {
    /// Bytes of the scratch of a call over `len` elements and `runs` runs (1 to encode).
    pub fn bytes(len: usize, runs: usize) -> usize {
        let (vector, blocks) = Scratch::areas(len, runs);
        2 * vector + blocks
    }

    /// The scratch at device address `base`, of [`Scratch::bytes`].
    pub fn at(base: Addr, len: usize, runs: usize) -> Scratch {
        let (vector, _) = Scratch::areas(len, runs);
        Scratch { wide: base, acc: base.wrapping_add(vector), blocks: base.wrapping_add(2 * vector) }
    }

    fn areas(len: usize, runs: usize) -> (usize, usize) {
        let vector = (4 * len).next_multiple_of(ALIGN);
        // Encoding keeps the maxima, reducing a factor per block of every run.
        let blocks = (4 * runs.max(1) * len.div_ceil(SCALE_BLOCK)).next_multiple_of(ALIGN);
        (vector, blocks)
    }
}

/// Elements of block `b` of a run of `len`.
fn block_len(len: usize, b: usize) -> usize {
    SCALE_BLOCK.min(len - b * SCALE_BLOCK)
}

/// What a call left to the host codec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostShare {
    /// Blocks coded by the host codec.
    pub blocks: usize,
    /// Blocks in all.
    pub of: usize,
}

/// Encodes `len` elements of `d` at `data` into the run at `run` in format `lp`, as
/// [`lowp::encode`] does.
///
/// # Safety
/// `data` holds `len` elements of `d`; `run` is valid for [`lowp::encoded_bytes`] writes and
/// overlaps neither `data` nor the scratch; `s` is a scratch of `Scratch::bytes(len, 1)`; all in
/// the memory `o` works on. `lp` is a format for `d` ([`lowp::check_format`]).
pub unsafe fn encode<O: Ops>(
    o: &mut O,
    s: Scratch,
    d: DType,
    lp: DType,
    data: Addr,
    len: usize,
    run: Addr,
) -> Result<HostShare> {
    let blocks = len.div_ceil(SCALE_BLOCK);
    if len == 0 {
        return Ok(HostShare::default());
    }
    let bytes = lowp::encoded_bytes(lp, len);
    if d == DType::F64 {
        let mut elements = vec![0u8; len * d.size()];
        let mut coded = vec![0u8; bytes];
        // SAFETY: the buffers hold what is copied; they live past `finish`.
        unsafe { o.download(data, elements.as_mut_ptr(), elements.len())? };
        o.finish()?;
        let part = lowp::sub_run(coded.as_mut_ptr(), lp, len, 0, len);
        // SAFETY: `elements` holds `len` elements of `d`, `coded` a whole run.
        unsafe { lowp::encode(d, lp, elements.as_ptr(), len, part.exps.cast_mut(), part.payload.cast_mut()) };
        // SAFETY: as above.
        unsafe { o.upload(coded.as_ptr(), run, bytes)? };
        o.finish()?;
        return Ok(HostShare { blocks, of: blocks });
    }
    let (w, size, lp_size) = (DType::F32, d.size(), lp.size());
    let payload = run.wrapping_add(4 * blocks);
    let x = if d == w {
        data
    } else {
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.cast(data, d, s.wide, w, len)? };
        s.wide
    };
    // SAFETY: the addresses hold what the operator addresses (this function's contract).
    unsafe { o.abs(x, s.acc, w, len)? };
    // SAFETY: the addresses hold what the operator addresses (this function's contract).
    unsafe { o.block_max(s.acc, s.blocks, w, len)? };
    let mut amax = vec![0f32; blocks];
    // SAFETY: `amax` holds a float per block and lives past `finish`.
    unsafe { o.download(s.blocks, amax.as_mut_ptr().cast(), 4 * blocks)? };
    o.finish()?;
    let (mut exps, mut factors) = (vec![0i32; blocks], vec![0f32; blocks]);
    let mut on_host = Vec::new();
    for (b, &m) in amax.iter().enumerate() {
        match m.is_finite().then(|| lowp::block_scale(d, lp, f64::from(m))) {
            Some((e, Some(f))) => (exps[b], factors[b]) = (e, f as f32),
            // Coded below; the device's codes of the block are overwritten.
            _ => on_host.push(b),
        }
    }
    let mut elements = vec![0u8; on_host.len() * SCALE_BLOCK * size];
    let mut codes = vec![0u8; on_host.len() * SCALE_BLOCK * lp_size];
    for (i, &b) in on_host.iter().enumerate() {
        let at = data.wrapping_add(b * SCALE_BLOCK * size);
        // SAFETY: block i of `elements` holds a block; it lives past `finish`.
        unsafe { o.download(at, elements.as_mut_ptr().add(i * SCALE_BLOCK * size), block_len(len, b) * size)? };
    }
    if !on_host.is_empty() {
        o.finish()?;
    }
    for (i, &b) in on_host.iter().enumerate() {
        // SAFETY: block i of `elements` holds the block's elements, of `codes` room for its
        // codes; the exponent goes to the block's own.
        unsafe {
            lowp::encode(
                d,
                lp,
                elements.as_ptr().add(i * SCALE_BLOCK * size),
                block_len(len, b),
                &raw mut exps[b],
                codes.as_mut_ptr().add(i * SCALE_BLOCK * lp_size),
            )
        };
    }
    // SAFETY: the host vectors live past the `finish` below; the run and scratch hold them.
    unsafe {
        o.upload(exps.as_ptr().cast(), run, 4 * blocks)?;
        o.upload(factors.as_ptr().cast(), s.blocks, 4 * blocks)?;
    }
    // SAFETY: the addresses hold what the operator addresses (this function's contract).
    unsafe { o.scale(x, s.blocks, s.acc, w, len)? };
    // SAFETY: the addresses hold what the operator addresses (this function's contract).
    unsafe { o.cast(s.acc, w, payload, lp, len)? };
    for (i, &b) in on_host.iter().enumerate() {
        let at = payload.wrapping_add(b * SCALE_BLOCK * lp_size);
        // SAFETY: as above; block b's codes lie in the payload.
        unsafe { o.upload(codes.as_ptr().add(i * SCALE_BLOCK * lp_size), at, block_len(len, b) * lp_size)? };
    }
    o.finish()?;
    Ok(HostShare { blocks: on_host.len(), of: blocks })
}

/// Decodes the runs `runs` of `len` elements in format `lp` and reduces them with `op`, in
/// their order, into `out` of `d`, as [`lowp::reduce_encoded`] does.
///
/// # Safety
/// Every run holds `len` encoded elements; `out` is valid for `len` writes of `d` and overlaps
/// no run nor the scratch; `s` is a scratch of `Scratch::bytes(len, runs.len())`; all in the
/// memory `o` works on. `lp` is a format for `d`, `op` valid for it, `runs` not empty.
#[allow(clippy::too_many_arguments)] // the reduction's and the codec's arguments
pub unsafe fn reduce<O: Ops>(
    o: &mut O,
    s: Scratch,
    d: DType,
    lp: DType,
    op: ReduceOp,
    runs: &[Addr],
    out: Addr,
    len: usize,
) -> Result<HostShare> {
    let (n, blocks) = (runs.len(), len.div_ceil(SCALE_BLOCK));
    if len == 0 || n == 0 {
        return Ok(HostShare::default());
    }
    if d == DType::F64 {
        let bytes = lowp::encoded_bytes(lp, len);
        let mut coded = vec![0u8; n * bytes];
        let mut result = vec![0u8; len * d.size()];
        for (j, &r) in runs.iter().enumerate() {
            // SAFETY: run j's place holds a run; it lives past `finish`.
            unsafe { o.download(r, coded.as_mut_ptr().add(j * bytes), bytes)? };
        }
        o.finish()?;
        let parts: Vec<SubRun> = (0..n).map(|j| lowp::sub_run(coded[j * bytes..].as_ptr(), lp, len, 0, len)).collect();
        // SAFETY: every part is a whole run of `len`, `result` holds `len` elements.
        unsafe { lowp::reduce_encoded(d, lp, op, &parts, len, result.as_mut_ptr()) };
        // SAFETY: as above.
        unsafe { o.upload(result.as_ptr(), out, result.len())? };
        o.finish()?;
        return Ok(HostShare { blocks: n * blocks, of: n * blocks });
    }
    let (w, lp_size) = (DType::F32, lp.size());
    let mut exps = vec![0i32; n * blocks];
    for (j, &r) in runs.iter().enumerate() {
        // SAFETY: run j's exponents fit its place in `exps`, which lives past `finish`.
        unsafe { o.download(r, exps.as_mut_ptr().add(j * blocks).cast(), 4 * blocks)? };
    }
    o.finish()?;
    let mut factors = vec![0f32; n * blocks];
    let mut on_host = Vec::new();
    for (k, &e) in exps.iter().enumerate() {
        match lowp::unscale(d, e) {
            Some(f) => factors[k] = f as f32,
            None => on_host.push(k),
        }
    }
    let mut codes = vec![0u8; on_host.len() * SCALE_BLOCK * lp_size];
    for (i, &k) in on_host.iter().enumerate() {
        let (j, b) = (k / blocks, k % blocks);
        let at = runs[j].wrapping_add(4 * blocks + b * SCALE_BLOCK * lp_size);
        // SAFETY: block i of `codes` holds a block's codes; it lives past `finish`.
        unsafe { o.download(at, codes.as_mut_ptr().add(i * SCALE_BLOCK * lp_size), block_len(len, b) * lp_size)? };
    }
    if !on_host.is_empty() {
        o.finish()?;
    }
    let mut values = vec![0f32; on_host.len() * SCALE_BLOCK];
    for (i, &k) in on_host.iter().enumerate() {
        let part = SubRun { exps: &raw const exps[k], payload: codes[i * SCALE_BLOCK * lp_size..].as_ptr() };
        // SAFETY: the part is one block of codes with its exponent; float32 data decodes into
        // the block's arithmetic, which is float32 for every dtype here.
        unsafe { lowp::decode(w, lp, part, block_len(len, k % blocks), values[i * SCALE_BLOCK..].as_mut_ptr().cast()) };
    }
    // SAFETY: `factors` lives past the final `finish`; the scratch holds a factor per block of
    // every run.
    unsafe { o.upload(factors.as_ptr().cast(), s.blocks, 4 * n * blocks)? };
    let combine = match op {
        ReduceOp::Sum | ReduceOp::Avg => Combine::Add,
        ReduceOp::Max => Combine::Max,
        ReduceOp::Min => Combine::Min,
    };
    let mut host_blocks = on_host.iter().enumerate().peekable();
    for (j, &r) in runs.iter().enumerate() {
        // The first source is decoded into the accumulator, the others beside it.
        let v = if j == 0 { s.acc } else { s.wide };
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.cast(r.wrapping_add(4 * blocks), lp, v, w, len)? };
        if lp == DType::F8E4M3 {
            // SAFETY: the addresses hold what the operator addresses (this function's contract).
            unsafe { o.replace(v, w, len, 448.0, f64::INFINITY)? };
            // SAFETY: the addresses hold what the operator addresses (this function's contract).
            unsafe { o.replace(v, w, len, -448.0, f64::NEG_INFINITY)? };
        }
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.scale(v, s.blocks.wrapping_add(4 * j * blocks), v, w, len)? };
        while let Some((i, &k)) = host_blocks.next_if(|&(_, &k)| k / blocks == j) {
            let b = k % blocks;
            let at = v.wrapping_add(4 * b * SCALE_BLOCK);
            // SAFETY: `values` lives past `finish`; block b lies in the vector.
            unsafe { o.upload(values[i * SCALE_BLOCK..].as_ptr().cast(), at, 4 * block_len(len, b))? };
        }
        if j > 0 {
            // SAFETY: the addresses hold what the operator addresses (this function's contract).
            unsafe { o.combine(combine, s.acc, s.wide, s.acc, w, len)? };
        }
    }
    if op == ReduceOp::Avg {
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.divide(s.acc, n, w, len)? };
    }
    if d == w {
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.copy(s.acc, out, 4 * len)? };
    } else {
        // SAFETY: the addresses hold what the operator addresses (this function's contract).
        unsafe { o.cast(s.acc, w, out, d, len)? };
    }
    o.finish()?;
    Ok(HostShare { blocks: on_host.len(), of: n * blocks })
}

#[cfg(test)]
mod tests {
    use symm_core::dtype::f16;

    use super::*;
    use crate::host_model::{combine, load, store, Value};

    /// The operators on host memory, in IEEE arithmetic: what a device whose operators round
    /// as IEEE does (NaN propagates through the block maximum, as torch's `amax`) computes.
    #[derive(Default)]
    struct Host {
        /// Operators enqueued, by name.
        log: Vec<&'static str>,
    }

    fn float(d: DType, at: Addr, k: usize) -> f64 {
        // SAFETY: the tests' buffers hold what the operators address.
        match load(d, unsafe { std::slice::from_raw_parts(at.add(k * d.size()), d.size()) }) {
            Value::Float(x) => x,
            Value::Int(_) => unreachable!("the codec's vectors are floats"),
        }
    }

    fn put(d: DType, at: Addr, k: usize, x: f64) {
        // SAFETY: as above.
        store(d, Value::Float(x), unsafe { std::slice::from_raw_parts_mut(at.add(k * d.size()), d.size()) });
    }

    /// Rounds `x` to f32 where `d` is f32 (the operators' precision).
    fn in_precision(d: DType, x: f64) -> f64 {
        if d == DType::F32 {
            f64::from(x as f32)
        } else {
            x
        }
    }

    impl Ops for Host {
        unsafe fn cast(&mut self, from: Addr, from_dtype: DType, to: Addr, to_dtype: DType, len: usize) -> Result<()> {
            self.log.push("cast");
            (0..len).for_each(|k| put(to_dtype, to, k, float(from_dtype, from, k)));
            Ok(())
        }
        unsafe fn abs(&mut self, x: Addr, out: Addr, dtype: DType, len: usize) -> Result<()> {
            self.log.push("abs");
            (0..len).for_each(|k| put(dtype, out, k, float(dtype, x, k).abs()));
            Ok(())
        }
        unsafe fn block_max(&mut self, x: Addr, out: Addr, dtype: DType, len: usize) -> Result<()> {
            self.log.push("block_max");
            for b in 0..len.div_ceil(SCALE_BLOCK) {
                let m = (0..block_len(len, b))
                    .map(|i| float(dtype, x, b * SCALE_BLOCK + i))
                    .fold(f64::NEG_INFINITY, |m, v| if m.is_nan() || v.is_nan() { f64::NAN } else { m.max(v) });
                put(dtype, out, b, m);
            }
            Ok(())
        }
        unsafe fn scale(&mut self, x: Addr, factors: Addr, out: Addr, dtype: DType, len: usize) -> Result<()> {
            self.log.push("scale");
            for k in 0..len {
                let y = in_precision(dtype, float(dtype, x, k) * float(dtype, factors, k / SCALE_BLOCK));
                put(dtype, out, k, y);
            }
            Ok(())
        }
        unsafe fn replace(&mut self, x: Addr, dtype: DType, len: usize, from: f64, to: f64) -> Result<()> {
            self.log.push("replace");
            (0..len).filter(|&k| float(dtype, x, k) == from).for_each(|k| put(dtype, x, k, to));
            Ok(())
        }
        unsafe fn combine(&mut self, c: Combine, a: Addr, b: Addr, out: Addr, dtype: DType, len: usize) -> Result<()> {
            self.log.push("combine");
            for k in 0..len {
                let Value::Float(v) =
                    combine(c, dtype, Value::Float(float(dtype, a, k)), Value::Float(float(dtype, b, k)))
                else {
                    unreachable!("floats")
                };
                put(dtype, out, k, v);
            }
            Ok(())
        }
        unsafe fn divide(&mut self, x: Addr, by: usize, dtype: DType, len: usize) -> Result<()> {
            self.log.push("divide");
            (0..len).for_each(|k| put(dtype, x, k, in_precision(dtype, float(dtype, x, k) / by as f64)));
            Ok(())
        }
        unsafe fn copy(&mut self, from: Addr, to: Addr, bytes: usize) -> Result<()> {
            self.log.push("copy");
            // SAFETY: the tests' buffers hold what the operators address, and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(from, to, bytes) };
            Ok(())
        }
        unsafe fn download(&mut self, from: Addr, to: *mut u8, bytes: usize) -> Result<()> {
            self.log.push("download");
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(from, to, bytes) };
            Ok(())
        }
        unsafe fn upload(&mut self, from: *const u8, to: Addr, bytes: usize) -> Result<()> {
            self.log.push("upload");
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(from, to, bytes) };
            Ok(())
        }
        fn finish(&mut self) -> Result<()> {
            self.log.push("finish");
            Ok(())
        }
    }

    /// `len` elements of `d`: ordinary values, and blocks that take the host codec's paths
    /// (tiny and huge magnitudes, infinities, NaN, zeros), the last block short.
    fn data(d: DType, len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut v = vec![0u8; len * d.size()];
        for k in 0..len {
            let r = next();
            let ordinary = ((r >> 8) % 20001) as f64 / 97.0 - 100.0;
            let value = match (k / SCALE_BLOCK) % 8 {
                // Subnormal f32 magnitudes: the f32 factor is out of range.
                1 => ordinary * 1e-42,
                // Near f32's top.
                2 => ordinary * 3e36,
                3 if k % 97 == 5 => f64::INFINITY,
                4 if k % 89 == 7 => f64::NAN,
                5 => 0.0,
                // Values of very different sizes in one block.
                6 => ordinary * 10f64.powi((r % 13) as i32 - 6),
                _ => ordinary,
            };
            put(d, v.as_mut_ptr(), k, value);
        }
        v
    }

    /// The codes of `lp` at `k` of two payloads agree: the same bits, or both NaN.
    fn same_code(lp: DType, a: &[u8], b: &[u8], k: usize) -> bool {
        let at = k * lp.size()..(k + 1) * lp.size();
        let nan = |c: &[u8]| matches!(load(lp, c), Value::Float(x) if x.is_nan());
        a[at.clone()] == b[at.clone()] || (nan(&a[at.clone()]) && nan(&b[at]))
    }

    #[test]
    fn encoding_makes_the_host_codecs_runs() {
        let len = 8 * SCALE_BLOCK * 2 + 77;
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for lp in lowp::FORMATS {
                let mut input = data(d, len, 11 + d.size() as u64);
                let bytes = lowp::encoded_bytes(lp, len);
                let (mut want, mut got) = (vec![0u8; bytes], vec![0u8; bytes]);
                let part = lowp::sub_run(want.as_mut_ptr(), lp, len, 0, len);
                // SAFETY: sized by `encoded_bytes`.
                unsafe { lowp::encode(d, lp, input.as_ptr(), len, part.exps.cast_mut(), part.payload.cast_mut()) };
                let mut scratch = vec![0u64; Scratch::bytes(len, 1).div_ceil(8)];
                let s = Scratch::at(scratch.as_mut_ptr().cast(), len, 1);
                let mut host = Host::default();
                // SAFETY: sized as `encode` asks.
                let share = unsafe { encode(&mut host, s, d, lp, input.as_mut_ptr(), len, got.as_mut_ptr()) }.unwrap();
                let blocks = len.div_ceil(SCALE_BLOCK);
                assert_eq!(got[..4 * blocks], want[..4 * blocks], "{d} via {lp}: exponents");
                let (g, w) = (&got[4 * blocks..], &want[4 * blocks..]);
                for k in 0..len {
                    assert!(
                        same_code(lp, g, w, k),
                        "{d} via {lp}: element {k}: {:?} vs {:?}",
                        &g[k..k + 2],
                        &w[k..k + 2]
                    );
                }
                if d == DType::F64 {
                    assert_eq!(share.blocks, share.of, "float64 is the host's");
                } else {
                    // The ordinary blocks, at least, are the device's.
                    assert!(share.blocks <= share.of / 2, "{d} via {lp}: {share:?}");
                    assert!(host.log.contains(&"scale"), "{:?}", host.log);
                }
            }
        }
    }

    #[test]
    fn reducing_runs_gives_the_host_codecs_results() {
        let len = 8 * SCALE_BLOCK + 77;
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for lp in lowp::FORMATS {
                for n in [1, 2, 3, 5] {
                    let bytes = lowp::encoded_bytes(lp, len);
                    let mut runs: Vec<Vec<u8>> = (0..n)
                        .map(|j| {
                            let input = data(d, len, 100 * j as u64 + 3);
                            let mut run = vec![0u8; bytes];
                            let part = lowp::sub_run(run.as_mut_ptr(), lp, len, 0, len);
                            // SAFETY: sized by `encoded_bytes`.
                            unsafe {
                                lowp::encode(d, lp, input.as_ptr(), len, part.exps.cast_mut(), part.payload.cast_mut())
                            };
                            run
                        })
                        .collect();
                    let parts: Vec<SubRun> = runs.iter().map(|r| lowp::sub_run(r.as_ptr(), lp, len, 0, len)).collect();
                    let addrs: Vec<Addr> = runs.iter_mut().map(|r| r.as_mut_ptr()).collect();
                    for &op in ReduceOp::ALL {
                        let (mut want, mut got) = (vec![0u8; len * d.size()], vec![0u8; len * d.size()]);
                        // SAFETY: whole runs; `want` holds `len`.
                        unsafe { lowp::reduce_encoded(d, lp, op, &parts, len, want.as_mut_ptr()) };
                        let mut scratch = vec![0u64; Scratch::bytes(len, n).div_ceil(8)];
                        let s = Scratch::at(scratch.as_mut_ptr().cast(), len, n);
                        // SAFETY: sized as `reduce` asks.
                        let share =
                            unsafe { reduce(&mut Host::default(), s, d, lp, op, &addrs, got.as_mut_ptr(), len) }
                                .unwrap();
                        for k in 0..len {
                            assert!(
                                same_code(d, &got, &want, k),
                                "{d} via {lp} {op} of {n}: element {k}: {:?} vs {:?}",
                                load(d, &got[k * d.size()..]),
                                load(d, &want[k * d.size()..])
                            );
                        }
                        if d != DType::F64 {
                            assert!(share.blocks < share.of, "{d} via {lp}: {share:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn e4m3_infinities_come_back_and_short_runs_work() {
        let d = DType::F16;
        let values = [f64::INFINITY, -1.5, f64::NEG_INFINITY, 448.0, 3.0];
        let mut input = vec![0u8; values.len() * 2];
        values.iter().enumerate().for_each(|(k, &v)| put(d, input.as_mut_ptr(), k, v));
        let lp = DType::F8E4M3;
        let mut run = vec![0u8; lowp::encoded_bytes(lp, values.len())];
        let mut scratch = vec![0u64; Scratch::bytes(values.len(), 1).div_ceil(8)];
        let s = Scratch::at(scratch.as_mut_ptr().cast(), values.len(), 1);
        // SAFETY: sized as `encode` asks.
        unsafe { encode(&mut Host::default(), s, d, lp, input.as_mut_ptr(), values.len(), run.as_mut_ptr()) }.unwrap();
        let mut out = vec![0u8; values.len() * 2];
        // SAFETY: sized as `reduce` asks.
        unsafe { reduce(&mut Host::default(), s, d, lp, ReduceOp::Sum, &[run.as_mut_ptr()], out.as_mut_ptr(), 5) }
            .unwrap();
        let got: Vec<f32> = out.chunks(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        assert_eq!(got, [f32::INFINITY, -1.5, f32::NEG_INFINITY, 448.0, 3.0]);
    }
}
