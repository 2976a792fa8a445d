//! The aclnn operators the collectives run on the device: tensor and scalar descriptors
//! (`libnnopbase.so`, `aclnn/acl_meta.h`) and the two-phase elementwise operators
//! (`libopapi.so`, `aclnnop/aclnn_*.h`).
//!
//! Every operator is a pair: `aclnnXGetWorkspaceSize(inputs.., out, &workspace_bytes, &executor)`
//! plans the call on the host, then `aclnnX(workspace, workspace_bytes, executor, stream)`
//! enqueues it; the executor is consumed by the second call. Sources: CANN 8.1.RC1's
//! `aclnn/acl_meta.h`, `aclnnop/aclnn_add.h`, `aclnn_maximum.h`, `aclnn_minimum.h`,
//! `aclnn_div.h`, `aclnn_cast.h`, `aclnn_amax.h`, `aclnn_mul.h`, and `hicann/ops-math`
//! (`math/*/op_host/op_api/aclnn_*.h`, the docs of `aclnnAbs`, `aclnnEqScalar`,
//! `aclnnInplaceMaskedFillScalar` and `aclCreateIntArray`).
//! CANN's headers are not in a package this project can download: `tests/headers.rs` checks
//! these declarations against `tests/facts/aclnn.h`, a transcription of them.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

use super::acl::{aclDataType, aclFormat, aclrtStream};
use super::{ffi_aliases, ffi_library};

/// `typedef int32_t aclnnStatus;` (0 is success).
pub type aclnnStatus = i32;

ffi_aliases!(ALIASES: aclnnStatus);

/// `struct aclTensor` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct aclTensor {
    _opaque: [u8; 0],
}

/// `struct aclScalar` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct aclScalar {
    _opaque: [u8; 0],
}

/// `struct aclIntArray` (opaque): a host array of `int64_t`, such as a reduction's dimensions.
#[repr(C)]
#[derive(Debug)]
pub struct aclIntArray {
    _opaque: [u8; 0],
}

/// `struct aclOpExecutor` (opaque).
#[repr(C)]
#[derive(Debug)]
pub struct aclOpExecutor {
    _opaque: [u8; 0],
}

ffi_library! {
    /// The descriptors of the operators' arguments.
    pub struct NnopbaseApi in "libnnopbase.so" {
        required {
            fn aclCreateTensor(
                view_dims: *const i64,
                view_dims_num: u64,
                data_type: aclDataType,
                stride: *const i64,
                offset: i64,
                format: aclFormat,
                storage_dims: *const i64,
                storage_dims_num: u64,
                tensor_data: *mut c_void,
            ) -> *mut aclTensor;
            fn aclDestroyTensor(tensor: *const aclTensor) -> aclnnStatus;
            fn aclCreateScalar(value: *mut c_void, data_type: aclDataType) -> *mut aclScalar;
            fn aclDestroyScalar(scalar: *const aclScalar) -> aclnnStatus;
            fn aclCreateIntArray(value: *const i64, size: u64) -> *mut aclIntArray;
            fn aclDestroyIntArray(array: *const aclIntArray) -> aclnnStatus;
        }
        optional {}
    }
}

ffi_library! {
    /// The operators of the collectives: the reductions (add, maximum, minimum), the average's
    /// division by a scalar, and low-precision transport's codec (cast, absolute value, block
    /// maximum, block scaling, and the replacement of one value).
    pub struct OpApi in "libopapi.so" {
        required {
            fn aclnnAddGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclTensor,
                alpha: *const aclScalar,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnAdd(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnMaximumGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclTensor,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnMaximum(
                workspace: *mut c_void,
                workspace_size: u64,
                executor: *mut aclOpExecutor,
                stream: aclrtStream,
            ) -> aclnnStatus;
            fn aclnnMinimumGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclTensor,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnMinimum(
                workspace: *mut c_void,
                workspace_size: u64,
                executor: *mut aclOpExecutor,
                stream: aclrtStream,
            ) -> aclnnStatus;
            fn aclnnDivsGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclScalar,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnDivs(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnCastGetWorkspaceSize(
                self_: *const aclTensor,
                dtype: aclDataType,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnCast(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnAbsGetWorkspaceSize(
                self_: *const aclTensor,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnAbs(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnAmaxGetWorkspaceSize(
                self_: *const aclTensor,
                dim: *const aclIntArray,
                keep_dim: bool,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnAmax(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnMulGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclTensor,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnMul(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream)
                -> aclnnStatus;
            fn aclnnEqScalarGetWorkspaceSize(
                self_: *const aclTensor,
                other: *const aclScalar,
                out: *mut aclTensor,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnEqScalar(
                workspace: *mut c_void,
                workspace_size: u64,
                executor: *mut aclOpExecutor,
                stream: aclrtStream,
            ) -> aclnnStatus;
            fn aclnnInplaceMaskedFillScalarGetWorkspaceSize(
                self_ref: *mut aclTensor,
                mask: *const aclTensor,
                value: *const aclScalar,
                workspace_size: *mut u64,
                executor: *mut *mut aclOpExecutor,
            ) -> aclnnStatus;
            fn aclnnInplaceMaskedFillScalar(
                workspace: *mut c_void,
                workspace_size: u64,
                executor: *mut aclOpExecutor,
                stream: aclrtStream,
            ) -> aclnnStatus;
        }
        optional {}
    }
}
