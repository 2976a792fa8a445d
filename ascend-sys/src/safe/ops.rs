//! The aclnn operators on 1-D device vectors: their descriptors, their workspace, and the
//! elementwise operations the collectives need.

use std::ffi::c_void;
use std::time::Duration;

use super::runtime::{synchronize_stream, DeviceBuffer, Stream};
use super::{acl, nnopbase, opapi};
use crate::result::{AscendError, Result};
use crate::sys::acl::{aclDataType, ACL_DOUBLE, ACL_FLOAT, ACL_FORMAT_ND, ACL_INT64};
use crate::sys::aclnn::{aclIntArray, aclOpExecutor, aclScalar, aclTensor, aclnnStatus};

/// An operator's view of a contiguous 1-D vector in device memory; destroyed on drop (the
/// memory stays the caller's).
#[derive(Debug)]
pub struct Tensor {
    raw: *mut aclTensor,
}

impl Tensor {
    /// The vector of `len` elements of `dtype` at device address `data`.
    ///
    /// # Safety
    /// `data` holds `len` elements of `dtype` for as long as operators enqueued on the tensor
    /// run.
    pub unsafe fn vector(data: *mut c_void, len: usize, dtype: aclDataType) -> Result<Tensor> {
        // SAFETY: forwarded.
        unsafe { Tensor::matrix(data, &[len], dtype) }
    }

    /// The contiguous row-major tensor of shape `dims` (one to eight dimensions) of `dtype` at
    /// device address `data`.
    ///
    /// # Safety
    /// `data` holds the product of `dims` elements of `dtype` for as long as operators enqueued
    /// on the tensor run.
    pub unsafe fn matrix(data: *mut c_void, dims: &[usize], dtype: aclDataType) -> Result<Tensor> {
        assert!((1..=8).contains(&dims.len()), "a tensor of 1 to 8 dimensions");
        let api = nnopbase()?;
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut strides = vec![1i64; dims.len()];
        for k in (0..dims.len() - 1).rev() {
            strides[k] = strides[k + 1] * shape[k + 1];
        }
        let rank = dims.len() as u64;
        // SAFETY: the shape, its strides and storage shape are valid for the call; the
        // descriptor keeps copies of them.
        let raw = unsafe {
            (api.aclCreateTensor)(
                shape.as_ptr(),
                rank,
                dtype,
                strides.as_ptr(),
                0,
                ACL_FORMAT_ND,
                shape.as_ptr(),
                rank,
                data,
            )
        };
        if raw.is_null() {
            return Err(AscendError::Null {
                function: "aclCreateTensor",
                what: format!("no descriptor of shape {dims:?} of aclDataType {dtype}"),
            });
        }
        Ok(Tensor { raw })
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if let Ok(api) = nnopbase() {
            // SAFETY: created by this value; an operator planned with it has already been
            // enqueued (the executor holds what it needs).
            let _ = unsafe { (api.aclDestroyTensor)(self.raw) };
        }
    }
}

/// A host scalar argument of an operator; destroyed on drop.
#[derive(Debug)]
pub struct Scalar {
    raw: *mut aclScalar,
}

impl Scalar {
    /// A float32 scalar.
    pub fn f32(value: f32) -> Result<Scalar> {
        let mut v = value;
        Scalar::new((&raw mut v).cast(), ACL_FLOAT)
    }

    /// A float64 scalar.
    pub fn f64(value: f64) -> Result<Scalar> {
        let mut v = value;
        Scalar::new((&raw mut v).cast(), ACL_DOUBLE)
    }

    /// A scalar of the floating `dtype` (float32 or float64) holding `value` (exact in it).
    pub fn float(value: f64, dtype: aclDataType) -> Result<Scalar> {
        if dtype == ACL_DOUBLE {
            Scalar::f64(value)
        } else {
            Scalar::f32(value as f32)
        }
    }

    /// An int64 scalar (what torch_npu passes as `add`'s default `alpha` for every dtype).
    pub fn i64(value: i64) -> Result<Scalar> {
        let mut v = value;
        Scalar::new((&raw mut v).cast(), ACL_INT64)
    }

    fn new(value: *mut c_void, dtype: aclDataType) -> Result<Scalar> {
        let api = nnopbase()?;
        // SAFETY: `value` points to one element of `dtype`, which the call copies.
        let raw = unsafe { (api.aclCreateScalar)(value, dtype) };
        if raw.is_null() {
            return Err(AscendError::Null { function: "aclCreateScalar", what: format!("aclDataType {dtype}") });
        }
        Ok(Scalar { raw })
    }
}

impl Drop for Scalar {
    fn drop(&mut self) {
        if let Ok(api) = nnopbase() {
            // SAFETY: created by this value.
            let _ = unsafe { (api.aclDestroyScalar)(self.raw) };
        }
    }
}

/// A host array of `int64_t` argument of an operator; destroyed on drop.
#[derive(Debug)]
struct IntArray {
    raw: *mut aclIntArray,
}

impl IntArray {
    fn new(values: &[i64]) -> Result<IntArray> {
        let api = nnopbase()?;
        // SAFETY: `values` holds `len` integers, which the call copies.
        let raw = unsafe { (api.aclCreateIntArray)(values.as_ptr(), values.len() as u64) };
        if raw.is_null() {
            return Err(AscendError::Null { function: "aclCreateIntArray", what: format!("{values:?}") });
        }
        Ok(IntArray { raw })
    }
}

impl Drop for IntArray {
    fn drop(&mut self) {
        if let Ok(api) = nnopbase() {
            // SAFETY: created by this value.
            let _ = unsafe { (api.aclDestroyIntArray)(self.raw) };
        }
    }
}

/// The device memory the operators of one stream plan into: grown when an operator needs more,
/// never shrunk. Growing first waits for the stream, since operators enqueued earlier may still
/// use the old memory.
#[derive(Debug, Default)]
pub struct Workspace {
    buffer: Option<DeviceBuffer>,
    /// The bound of the wait before a growth.
    timeout: Duration,
}

impl Workspace {
    /// An empty workspace whose growth waits at most `timeout` for its stream.
    pub fn new(timeout: Duration) -> Workspace {
        Workspace { buffer: None, timeout }
    }

    /// The size a workspace of `current` bytes grows to when `need` bytes are asked of it:
    /// `None` when it suffices, else at least double (growths stay few) in 64 KiB units.
    pub fn grown(current: usize, need: usize) -> Option<usize> {
        (need > current).then(|| need.max(current.saturating_mul(2)).div_ceil(64 << 10) * (64 << 10))
    }

    /// At least `bytes` of workspace for an operator about to be enqueued on `stream` (null and
    /// 0 for none).
    fn reserve(&mut self, bytes: u64, stream: &Stream) -> Result<(*mut c_void, u64)> {
        if bytes == 0 {
            return Ok((std::ptr::null_mut(), 0));
        }
        let current = self.buffer.as_ref().map_or(0, DeviceBuffer::bytes);
        if let Some(size) = Workspace::grown(current, bytes as usize) {
            if self.buffer.is_some() && !synchronize_stream(stream, self.timeout)? {
                return Err(AscendError::Refused {
                    function: "Workspace::reserve",
                    argument: "timeout",
                    value: format!("{:?}", self.timeout),
                    reason: "the stream's earlier operators did not complete in time to free the old workspace",
                });
            }
            self.buffer = None;
            self.buffer = Some(DeviceBuffer::new(size)?);
        }
        let b = self.buffer.as_ref().expect("reserved above");
        Ok((b.ptr(), b.bytes() as u64))
    }
}

/// The elementwise binary operators of the reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elementwise {
    Add,
    Maximum,
    Minimum,
}

/// A planned operator's executor, enqueued by `enqueue`.
type Enqueue = unsafe extern "C" fn(*mut c_void, u64, *mut aclOpExecutor, *mut c_void) -> aclnnStatus;

/// Plans an operator (`plan` fills the workspace size and executor) and enqueues it on
/// `stream` with workspace from `ws`.
fn run(
    names: (&'static str, &'static str),
    plan: impl FnOnce(*mut u64, *mut *mut aclOpExecutor) -> aclnnStatus,
    enqueue: Enqueue,
    ws: &mut Workspace,
    stream: &Stream,
) -> Result<()> {
    let a = acl()?;
    let (mut bytes, mut executor) = (0u64, std::ptr::null_mut());
    a.check_aclnn(names.0, plan(&mut bytes, &mut executor))?;
    let (memory, size) = ws.reserve(bytes, stream)?;
    // SAFETY: the executor just planned, workspace of at least the size it asked for that
    // lives until the stream has run the operator (`Workspace`), and a non-null stream.
    a.check_aclnn(names.1, unsafe { enqueue(memory, size, executor, stream.raw()) })
}

/// Enqueues `out = a <op> b` on `stream` (all of one length; `out` may be `a`).
pub fn binary(
    op: Elementwise,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    ws: &mut Workspace,
    stream: &Stream,
) -> Result<()> {
    let api = opapi()?;
    match op {
        Elementwise::Add => {
            // An integer alpha, as torch's default `alpha=1`: it promotes no dtype.
            let one = Scalar::i64(1)?;
            run(
                ("aclnnAddGetWorkspaceSize", "aclnnAdd"),
                // SAFETY: live descriptors and valid out-pointers.
                |bytes, ex| unsafe { (api.aclnnAddGetWorkspaceSize)(a.raw, b.raw, one.raw, out.raw, bytes, ex) },
                api.aclnnAdd,
                ws,
                stream,
            )
        }
        Elementwise::Maximum => run(
            ("aclnnMaximumGetWorkspaceSize", "aclnnMaximum"),
            // SAFETY: as above.
            |bytes, ex| unsafe { (api.aclnnMaximumGetWorkspaceSize)(a.raw, b.raw, out.raw, bytes, ex) },
            api.aclnnMaximum,
            ws,
            stream,
        ),
        Elementwise::Minimum => run(
            ("aclnnMinimumGetWorkspaceSize", "aclnnMinimum"),
            // SAFETY: as above.
            |bytes, ex| unsafe { (api.aclnnMinimumGetWorkspaceSize)(a.raw, b.raw, out.raw, bytes, ex) },
            api.aclnnMinimum,
            ws,
            stream,
        ),
    }
}

/// Enqueues `out = a / divisor` on `stream` (the average's division).
pub fn divide(a: &Tensor, divisor: &Scalar, out: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnDivsGetWorkspaceSize", "aclnnDivs"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnDivsGetWorkspaceSize)(a.raw, divisor.raw, out.raw, bytes, ex) },
        api.aclnnDivs,
        ws,
        stream,
    )
}

/// Enqueues `out = a` converted to `out`'s dtype `dtype` on `stream` (low-precision transport).
pub fn cast(a: &Tensor, dtype: aclDataType, out: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnCastGetWorkspaceSize", "aclnnCast"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnCastGetWorkspaceSize)(a.raw, dtype, out.raw, bytes, ex) },
        api.aclnnCast,
        ws,
        stream,
    )
}

/// Enqueues `out = |a|` on `stream`.
pub fn abs(a: &Tensor, out: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnAbsGetWorkspaceSize", "aclnnAbs"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnAbsGetWorkspaceSize)(a.raw, out.raw, bytes, ex) },
        api.aclnnAbs,
        ws,
        stream,
    )
}

/// Enqueues `out[i] = max_j a[i, j]` on `stream`: the maximum of every row of the matrix `a`
/// (NaN propagates, as torch's `amax`).
pub fn row_max(a: &Tensor, out: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    let dims = IntArray::new(&[1])?;
    run(
        ("aclnnAmaxGetWorkspaceSize", "aclnnAmax"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnAmaxGetWorkspaceSize)(a.raw, dims.raw, false, out.raw, bytes, ex) },
        api.aclnnAmax,
        ws,
        stream,
    )
}

/// Enqueues `out = a * b` on `stream`, `b` broadcast over `a`'s shape (a column of factors
/// scales each row).
pub fn multiply(a: &Tensor, b: &Tensor, out: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnMulGetWorkspaceSize", "aclnnMul"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnMulGetWorkspaceSize)(a.raw, b.raw, out.raw, bytes, ex) },
        api.aclnnMul,
        ws,
        stream,
    )
}

/// Enqueues `mask = (a == value)` on `stream` (`mask` of booleans).
pub fn equal(a: &Tensor, value: &Scalar, mask: &Tensor, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnEqScalarGetWorkspaceSize", "aclnnEqScalar"),
        // SAFETY: live descriptors and valid out-pointers.
        |bytes, ex| unsafe { (api.aclnnEqScalarGetWorkspaceSize)(a.raw, value.raw, mask.raw, bytes, ex) },
        api.aclnnEqScalar,
        ws,
        stream,
    )
}

/// Enqueues `a[i] = value where mask[i]` on `stream`.
pub fn fill_where(a: &Tensor, mask: &Tensor, value: &Scalar, ws: &mut Workspace, stream: &Stream) -> Result<()> {
    let api = opapi()?;
    run(
        ("aclnnInplaceMaskedFillScalarGetWorkspaceSize", "aclnnInplaceMaskedFillScalar"),
        // SAFETY: live descriptors and valid out-pointers; the operator writes `a` in place.
        |bytes, ex| unsafe {
            (api.aclnnInplaceMaskedFillScalarGetWorkspaceSize)(a.raw, mask.raw, value.raw, bytes, ex)
        },
        api.aclnnInplaceMaskedFillScalar,
        ws,
        stream,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_grow_rarely_and_in_whole_units() {
        assert_eq!(Workspace::grown(0, 0), None);
        assert_eq!(Workspace::grown(0, 1), Some(64 << 10));
        assert_eq!(Workspace::grown(64 << 10, 64 << 10), None);
        assert_eq!(Workspace::grown(64 << 10, (64 << 10) + 1), Some(128 << 10));
        assert_eq!(Workspace::grown(128 << 10, 1 << 20), Some(1 << 20));
        assert_eq!(Workspace::grown(1 << 20, (1 << 20) + 5), Some(2 << 20));
    }
}
