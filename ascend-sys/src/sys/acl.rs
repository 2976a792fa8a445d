//! AscendCL (`libascendcl.so`): the runtime's devices, streams, events, memory and copies.
//!
//! Signatures, values and sources: `../shared/reference/ascend-ffi.md` §1.1 and §2.1
//! (`acl/acl_rt.h`, `acl/acl_base.h`, `acl/error_codes/rt_error_codes.h`); checked against the
//! headers the `torch-npu` wheel ships by `tests/headers.rs`.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

use super::{ffi_aliases, ffi_consts, ffi_library};

/// `typedef int aclError;`
pub type aclError = i32;
/// `typedef void *aclrtStream;`
pub type aclrtStream = *mut c_void;
/// `typedef void *aclrtEvent;`
pub type aclrtEvent = *mut c_void;
/// `typedef void *aclrtContext;`
pub type aclrtContext = *mut c_void;
/// `enum aclrtMemcpyKind` (4 bytes).
pub type aclrtMemcpyKind = u32;
/// `enum aclrtMemMallocPolicy` (4 bytes).
pub type aclrtMemMallocPolicy = u32;
/// `enum aclrtEventRecordedStatus` (4 bytes).
pub type aclrtEventRecordedStatus = u32;
/// `enum aclDataType` (4 bytes, signed: `ACL_DT_UNDEFINED` is -1).
pub type aclDataType = i32;
/// `enum aclFormat` (4 bytes, signed: `ACL_FORMAT_UNDEFINED` is -1).
pub type aclFormat = i32;
/// `enum aclrtCallbackBlockType` (4 bytes).
pub type aclrtCallbackBlockType = u32;
/// `typedef void (*aclrtCallback)(void *userData);` (nullable, as C's function pointers are).
pub type aclrtCallback = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

ffi_aliases!(ALIASES: aclError, aclrtStream, aclrtEvent, aclrtContext, aclrtMemcpyKind, aclrtMemMallocPolicy,
    aclrtEventRecordedStatus, aclDataType, aclFormat, aclrtCallbackBlockType, aclrtCallback);

ffi_consts! { CONSTANTS:
    aclError {
        ACL_SUCCESS = 0,
        ACL_ERROR_INVALID_PARAM = 100000,
        ACL_ERROR_UNINITIALIZE = 100001,
        /// `aclInit` when the process (torch_npu) already initialised ACL: not a failure.
        ACL_ERROR_REPEAT_INITIALIZE = 100002,
        ACL_ERROR_BAD_ALLOC = 200000,
        ACL_ERROR_API_NOT_SUPPORT = 200001,
        ACL_ERROR_INVALID_DEVICE = 200002,
        ACL_ERROR_FEATURE_UNSUPPORTED = 200006,
        ACL_ERROR_INTERNAL_ERROR = 500000,
        ACL_ERROR_FAILURE = 500001,
        ACL_ERROR_RT_FAILURE = 500003,
        ACL_ERROR_DRV_FAILURE = 500004,
        ACL_ERROR_RT_PARAM_INVALID = 107000,
        ACL_ERROR_RT_INVALID_DEVICEID = 107001,
        ACL_ERROR_RT_CONTEXT_NULL = 107002,
        ACL_ERROR_RT_STREAM_CONTEXT = 107003,
        ACL_ERROR_RT_DEVICE_TASK_ABORT = 107022,
        ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
        ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
        ACL_ERROR_RT_INTERNAL_ERROR = 507000,
        ACL_ERROR_RT_AICORE_TIMEOUT = 507014,
        ACL_ERROR_RT_AICORE_EXCEPTION = 507015,
        /// `aclrtSynchronizeStreamWithTimeout` whose time ran out.
        ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046,
        ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047,
        /// `aclrtProcessReport` whose time ran out with no callback to run.
        ACL_ERROR_RT_REPORT_TIMEOUT = 507012,
    }
    aclrtMemcpyKind {
        ACL_MEMCPY_HOST_TO_HOST = 0,
        ACL_MEMCPY_HOST_TO_DEVICE = 1,
        ACL_MEMCPY_DEVICE_TO_HOST = 2,
        ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
    }
    aclrtMemMallocPolicy {
        ACL_MEM_MALLOC_HUGE_FIRST = 0,
        ACL_MEM_MALLOC_HUGE_ONLY = 1,
        ACL_MEM_MALLOC_NORMAL_ONLY = 2,
    }
    aclrtEventRecordedStatus {
        ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
        ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
    }
    aclrtCallbackBlockType {
        ACL_CALLBACK_NO_BLOCK = 0,
        /// The stream's later work waits until the callback has returned.
        ACL_CALLBACK_BLOCK = 1,
    }
    aclDataType {
        ACL_FLOAT = 0,
        ACL_FLOAT16 = 1,
        ACL_INT8 = 2,
        ACL_INT32 = 3,
        ACL_UINT8 = 4,
        ACL_INT16 = 6,
        ACL_INT64 = 9,
        ACL_DOUBLE = 11,
        ACL_BOOL = 12,
        ACL_BF16 = 27,
        ACL_FLOAT8_E5M2 = 35,
        ACL_FLOAT8_E4M3FN = 36,
    }
    aclFormat {
        /// The plain row-major layout the aclnn operators take for 1-D tensors.
        ACL_FORMAT_ND = 2,
    }
}

ffi_library! {
    /// The AscendCL functions symm calls.
    pub struct AclApi in "libascendcl.so" {
        required {
            fn aclInit(config_path: *const c_char) -> aclError;
            fn aclGetRecentErrMsg() -> *const c_char;
            fn aclrtGetVersion(major: *mut i32, minor: *mut i32, patch: *mut i32) -> aclError;
            fn aclrtSetDevice(device_id: i32) -> aclError;
            fn aclrtGetDevice(device_id: *mut i32) -> aclError;
            fn aclrtGetDeviceCount(count: *mut u32) -> aclError;
            fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError;
            fn aclrtDestroyStream(stream: aclrtStream) -> aclError;
            fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError;
            fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout_ms: i32) -> aclError;
            fn aclrtStreamWaitEvent(stream: aclrtStream, event: aclrtEvent) -> aclError;
            fn aclrtCreateEvent(event: *mut aclrtEvent) -> aclError;
            fn aclrtDestroyEvent(event: aclrtEvent) -> aclError;
            fn aclrtRecordEvent(event: aclrtEvent, stream: aclrtStream) -> aclError;
            fn aclrtSynchronizeEvent(event: aclrtEvent) -> aclError;
            fn aclrtQueryEventStatus(event: aclrtEvent, status: *mut aclrtEventRecordedStatus) -> aclError;
            fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, policy: aclrtMemMallocPolicy) -> aclError;
            fn aclrtFree(dev_ptr: *mut c_void) -> aclError;
            fn aclrtMemcpy(
                dst: *mut c_void,
                dest_max: usize,
                src: *const c_void,
                count: usize,
                kind: aclrtMemcpyKind,
            ) -> aclError;
            fn aclrtMemcpyAsync(
                dst: *mut c_void,
                dest_max: usize,
                src: *const c_void,
                count: usize,
                kind: aclrtMemcpyKind,
                stream: aclrtStream,
            ) -> aclError;
            fn aclrtMemsetAsync(
                dev_ptr: *mut c_void,
                max_count: usize,
                value: i32,
                count: usize,
                stream: aclrtStream,
            ) -> aclError;
            /// Binds the thread `thread_id` (a `pthread_t`) to run the host callbacks of `stream`.
            fn aclrtSubscribeReport(thread_id: u64, stream: aclrtStream) -> aclError;
            fn aclrtUnSubscribeReport(thread_id: u64, stream: aclrtStream) -> aclError;
            /// Runs, on the calling (subscribed) thread, the callbacks whose streams reached them;
            /// waits at most `timeout_ms` (-1: forever) for one.
            fn aclrtProcessReport(timeout_ms: i32) -> aclError;
            fn aclrtLaunchCallback(
                f: aclrtCallback,
                user_data: *mut c_void,
                block_type: aclrtCallbackBlockType,
                stream: aclrtStream,
            ) -> aclError;
        }
        optional {}
    }
}
