//! Low-precision transport's operators ([`codec::Ops`]) on the device: aclnn operators and
//! ACL copies on one stream of the communicator.

use ascend_sys::safe::{self, CopyKind, Scalar, Tensor, Workspace};
use ascend_sys::AscendError;
use symm_core::coll::lowp::SCALE_BLOCK;
use symm_core::{Backend, DType, Error, Result};

use super::{AscendComm, StreamSlot};
use crate::codec;
use crate::dtype::acl_dtype;
use crate::reduce::Combine;

/// The codec's operators ([`codec::Ops`]) as aclnn operators and ACL copies on one stream.
pub(super) struct DeviceOps<'a> {
    pub(super) comm: &'a AscendComm,
    pub(super) slot: &'a StreamSlot,
    pub(super) workspace: &'a mut Workspace,
    /// Booleans for [`codec::Ops::replace`]'s mask, as many as the call's elements.
    pub(super) mask: codec::Addr,
}

impl DeviceOps<'_> {
    fn failed(&self, what: &str) -> impl Fn(AscendError) -> Error + '_ {
        self.comm.dev(&format!("low-precision transport: {what}"))
    }

    /// `f` over the whole blocks of a vector of `len` (rows of `SCALE_BLOCK`, first) and its
    /// short last block (one row); `f(first element, rows, columns)`.
    fn by_blocks(
        len: usize,
        mut f: impl FnMut(usize, usize, usize) -> ascend_sys::Result<()>,
    ) -> ascend_sys::Result<()> {
        let (full, rest) = (len / SCALE_BLOCK, len % SCALE_BLOCK);
        if full > 0 {
            f(0, full, SCALE_BLOCK)?;
        }
        if rest > 0 {
            f(full * SCALE_BLOCK, 1, rest)?;
        }
        Ok(())
    }
}

/// The tensor of shape `dims` of `d` at `at`.
///
/// # Safety
/// `at` holds that many elements of `d` until the operators enqueued on it have run (the codec
/// finishes its stream before its buffers go).
unsafe fn tensor(at: codec::Addr, dims: &[usize], d: DType) -> ascend_sys::Result<Tensor> {
    // SAFETY: forwarded.
    unsafe { Tensor::matrix(at.cast(), dims, acl_dtype(d)) }
}

// SAFETY (every block of this impl): the codec passes addresses of device memory that hold
// what each operator addresses (`codec::Ops`'s contract, from the contracts of
// `encode_local` and `reduce_encoded_local` and the reserved scratch), and finishes the
// stream before any of it goes.
impl codec::Ops for DeviceOps<'_> {
    unsafe fn cast(
        &mut self,
        from: codec::Addr,
        from_dtype: DType,
        to: codec::Addr,
        to_dtype: DType,
        len: usize,
    ) -> Result<()> {
        // SAFETY: see the impl.
        let (a, b) = unsafe { (tensor(from, &[len], from_dtype), tensor(to, &[len], to_dtype)) };
        safe::cast(
            &a.map_err(self.failed("cast"))?,
            acl_dtype(to_dtype),
            &b.map_err(self.failed("cast"))?,
            self.workspace,
            &self.slot.stream,
        )
        .map_err(self.failed(&format!("cast from {from_dtype} to {to_dtype}")))
    }

    unsafe fn abs(&mut self, x: codec::Addr, out: codec::Addr, dtype: DType, len: usize) -> Result<()> {
        // SAFETY: see the impl.
        let run = |ws: &mut Workspace| unsafe {
            safe::abs(&tensor(x, &[len], dtype)?, &tensor(out, &[len], dtype)?, ws, &self.slot.stream)
        };
        run(self.workspace).map_err(self.failed("absolute value"))
    }

    unsafe fn block_max(&mut self, x: codec::Addr, out: codec::Addr, dtype: DType, len: usize) -> Result<()> {
        let (size, stream, ws) = (dtype.size(), &self.slot.stream, &mut *self.workspace);
        DeviceOps::by_blocks(len, |first, rows, cols| {
            // SAFETY: see the impl; the rows' maxima go to their blocks' places.
            let (a, m) = unsafe {
                (
                    tensor(x.wrapping_add(first * size), &[rows, cols], dtype)?,
                    tensor(out.wrapping_add(first / SCALE_BLOCK * size), &[rows], dtype)?,
                )
            };
            safe::row_max(&a, &m, ws, stream)
        })
        .map_err(self.failed("the blocks' largest magnitudes"))
    }

    unsafe fn scale(
        &mut self,
        x: codec::Addr,
        factors: codec::Addr,
        out: codec::Addr,
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        let (size, stream, ws) = (dtype.size(), &self.slot.stream, &mut *self.workspace);
        DeviceOps::by_blocks(len, |first, rows, cols| {
            // SAFETY: see the impl; a column of the blocks' factors scales their rows.
            let (a, f, o) = unsafe {
                (
                    tensor(x.wrapping_add(first * size), &[rows, cols], dtype)?,
                    tensor(factors.wrapping_add(first / SCALE_BLOCK * size), &[rows, 1], dtype)?,
                    tensor(out.wrapping_add(first * size), &[rows, cols], dtype)?,
                )
            };
            safe::multiply(&a, &f, &o, ws, stream)
        })
        .map_err(self.failed("scaling the blocks"))
    }

    unsafe fn replace(&mut self, x: codec::Addr, dtype: DType, len: usize, from: f64, to: f64) -> Result<()> {
        let (stream, mask) = (&self.slot.stream, self.mask);
        let run = |ws: &mut Workspace| {
            // SAFETY: see the impl; the mask holds `len` booleans.
            let (v, m) = unsafe { (tensor(x, &[len], dtype)?, tensor(mask, &[len], DType::Bool)?) };
            let acl = acl_dtype(dtype);
            safe::equal(&v, &Scalar::float(from, acl)?, &m, ws, stream)?;
            safe::fill_where(&v, &m, &Scalar::float(to, acl)?, ws, stream)
        };
        run(self.workspace).map_err(self.failed(&format!("replacing {from} by {to}")))
    }

    unsafe fn combine(
        &mut self,
        combine: Combine,
        a: codec::Addr,
        b: codec::Addr,
        out: codec::Addr,
        dtype: DType,
        len: usize,
    ) -> Result<()> {
        let kind = match combine {
            Combine::Add => safe::Elementwise::Add,
            Combine::Max => safe::Elementwise::Maximum,
            Combine::Min => safe::Elementwise::Minimum,
        };
        let stream = &self.slot.stream;
        // SAFETY: see the impl.
        let run = |ws: &mut Workspace| unsafe {
            safe::binary(
                kind,
                &tensor(a, &[len], dtype)?,
                &tensor(b, &[len], dtype)?,
                &tensor(out, &[len], dtype)?,
                ws,
                stream,
            )
        };
        run(self.workspace).map_err(self.failed("combining the sources"))
    }

    unsafe fn divide(&mut self, x: codec::Addr, by: usize, dtype: DType, len: usize) -> Result<()> {
        let stream = &self.slot.stream;
        let run = |ws: &mut Workspace| {
            // SAFETY: see the impl.
            let v = unsafe { tensor(x, &[len], dtype)? };
            safe::divide(&v, &Scalar::float(by as f64, acl_dtype(dtype))?, &v, ws, stream)
        };
        run(self.workspace).map_err(self.failed("the average's division"))
    }

    unsafe fn copy(&mut self, from: codec::Addr, to: codec::Addr, bytes: usize) -> Result<()> {
        // SAFETY: see the impl.
        unsafe { safe::copy_async(to.cast(), from.cast(), bytes, CopyKind::DeviceToDevice, &self.slot.stream) }
            .map_err(self.failed("copying the result out"))
    }

    unsafe fn download(&mut self, from: codec::Addr, to: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: see the impl; `to` is valid until `finish` (this function's contract).
        unsafe { safe::copy_async(to.cast(), from.cast(), bytes, CopyKind::DeviceToHost, &self.slot.stream) }
            .map_err(self.failed("reading the blocks' numbers"))
    }

    unsafe fn upload(&mut self, from: *const u8, to: codec::Addr, bytes: usize) -> Result<()> {
        // SAFETY: see the impl; `from` is valid until `finish` (this function's contract).
        unsafe { safe::copy_async(to.cast(), from.cast(), bytes, CopyKind::HostToDevice, &self.slot.stream) }
            .map_err(self.failed("writing the blocks' numbers"))
    }

    fn finish(&mut self) -> Result<()> {
        self.comm.drain(self.slot, "low-precision transport", self.comm.default_timeout())
    }
}
