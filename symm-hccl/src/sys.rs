//! The raw layer: HCCL's C declarations (`libhccl.so`) in their C shapes, as a table of function
//! pointers resolved at run time through `ascend_sys`'s loader.
//!
//! Every signature, enumerator and constant is the one of `hccl/hccl.h` and `hccl/hccl_types.h`
//! as the `torch-npu` 2.14.0 wheel ships them (`torch_npu/include/third_party/hccl/inc`), and
//! `tests/headers.rs` compiles them against those headers. Conventions are `ascend_sys::sys`'s:
//! status codes and C enums are 4-byte integers with their values as constants, never Rust
//! `enum`s (a value a newer HCCL adds must not be undefined behaviour); handles are pointers.
//!
//! Not declared: the `*_RESERVED` enumerators, whose values moved between releases
//! (`HCCL_E_RESERVED` is implicit in the header; `../shared/reference/ascend-ffi.md` §2.2, R4).

use std::ffi::{c_char, c_void};

use ascend_sys::sys::acl::aclrtStream;
use ascend_sys::sys::{ffi_aliases, ffi_consts, ffi_layout, ffi_library, Layout};

/// `typedef enum {...} HcclResult;` (4 bytes; 0 is success).
pub type HcclResult = i32;
/// `typedef void *HcclComm;`
pub type HcclComm = *mut c_void;
/// `typedef enum {...} HcclDataType;` (4 bytes).
pub type HcclDataType = u32;
/// `typedef enum {...} HcclReduceOp;` (4 bytes).
pub type HcclReduceOp = u32;

ffi_aliases!(ALIASES: HcclResult, HcclComm, HcclDataType, HcclReduceOp);

ffi_consts! { CONSTANTS:
    HcclResult {
        HCCL_SUCCESS = 0,
        HCCL_E_PARA = 1,
        HCCL_E_PTR = 2,
        HCCL_E_MEMORY = 3,
        HCCL_E_INTERNAL = 4,
        HCCL_E_NOT_SUPPORT = 5,
        HCCL_E_NOT_FOUND = 6,
        HCCL_E_UNAVAIL = 7,
        HCCL_E_SYSCALL = 8,
        HCCL_E_TIMEOUT = 9,
        HCCL_E_OPEN_FILE_FAILURE = 10,
        HCCL_E_TCP_CONNECT = 11,
        HCCL_E_ROCE_CONNECT = 12,
        HCCL_E_TCP_TRANSFER = 13,
        HCCL_E_ROCE_TRANSFER = 14,
        HCCL_E_RUNTIME = 15,
        HCCL_E_DRV = 16,
        HCCL_E_PROFILING = 17,
        HCCL_E_CCE = 18,
        HCCL_E_NETWORK = 19,
        /// `HcclCommDestroy` from another thread while the communicator is in use.
        HCCL_E_AGAIN = 20,
        HCCL_E_REMOTE = 21,
        HCCL_E_SUSPENDING = 22,
        HCCL_E_OPRETRY_FAIL = 23,
        HCCL_E_OOM = 24,
    }
    HcclReduceOp {
        HCCL_REDUCE_SUM = 0,
        HCCL_REDUCE_PROD = 1,
        HCCL_REDUCE_MAX = 2,
        HCCL_REDUCE_MIN = 3,
    }
    HcclDataType {
        HCCL_DATA_TYPE_INT8 = 0,
        HCCL_DATA_TYPE_INT16 = 1,
        HCCL_DATA_TYPE_INT32 = 2,
        HCCL_DATA_TYPE_FP16 = 3,
        HCCL_DATA_TYPE_FP32 = 4,
        HCCL_DATA_TYPE_INT64 = 5,
        HCCL_DATA_TYPE_UINT64 = 6,
        HCCL_DATA_TYPE_UINT8 = 7,
        HCCL_DATA_TYPE_UINT16 = 8,
        HCCL_DATA_TYPE_UINT32 = 9,
        HCCL_DATA_TYPE_FP64 = 10,
        HCCL_DATA_TYPE_BFP16 = 11,
        HCCL_DATA_TYPE_INT128 = 12,
        HCCL_DATA_TYPE_HIF8 = 14,
        HCCL_DATA_TYPE_FP8E4M3 = 15,
        HCCL_DATA_TYPE_FP8E5M2 = 16,
        HCCL_DATA_TYPE_FP8E8M0 = 17,
    }
    u32 {
        /// The size of `HcclRootInfo`: what travels from the root rank to the others.
        HCCL_ROOT_INFO_BYTES = 4108,
    }
}

/// `typedef struct HcclRootInfoDef { char internal[HCCL_ROOT_INFO_BYTES]; } HcclRootInfo;`:
/// the root rank's address, made by `HcclGetRootInfo` and read by `HcclCommInitRootInfo`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclRootInfo {
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES as usize],
}

impl HcclRootInfo {
    /// All bytes zero: what `HcclGetRootInfo` fills.
    pub const fn zeroed() -> Self {
        HcclRootInfo { internal: [0; HCCL_ROOT_INFO_BYTES as usize] }
    }
}

impl std::fmt::Debug for HcclRootInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // 4108 opaque bytes say nothing to a reader; their count does.
        write!(f, "HcclRootInfo {{ internal: [{} bytes] }}", self.internal.len())
    }
}

// The size the C code and the bytes passed between ranks rely on, checked at compile time too.
const _: () = assert!(std::mem::size_of::<HcclRootInfo>() == HCCL_ROOT_INFO_BYTES as usize);

/// The struct layouts the header check compares with the header's.
pub const LAYOUTS: &[Layout] = &[ffi_layout!(HcclRootInfo { internal })];

ffi_library! {
    /// The HCCL functions symm calls. The communicator functions come first: on a `libhccl.so`
    /// without them the load fails naming `HcclGetRootInfo` (newer CANN documents them in
    /// `libhcomm.so`, risk R1 of the reference note).
    pub struct HcclApi in "libhccl.so" {
        required {
            fn HcclGetRootInfo(root_info: *mut HcclRootInfo) -> HcclResult;
            fn HcclCommInitRootInfo(
                n_ranks: u32,
                root_info: *const HcclRootInfo,
                rank: u32,
                comm: *mut HcclComm,
            ) -> HcclResult;
            fn HcclCommDestroy(comm: HcclComm) -> HcclResult;
            fn HcclGetRankSize(comm: HcclComm, rank_size: *mut u32) -> HcclResult;
            fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult;
            fn HcclAllReduce(
                send_buf: *mut c_void,
                recv_buf: *mut c_void,
                count: u64,
                data_type: HcclDataType,
                op: HcclReduceOp,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            /// `send_count` elements from every rank, gathered in rank order.
            fn HcclAllGather(
                send_buf: *mut c_void,
                recv_buf: *mut c_void,
                send_count: u64,
                data_type: HcclDataType,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            /// `recv_count` elements to every rank (the send buffer holds `recv_count * ranks`).
            fn HcclReduceScatter(
                send_buf: *mut c_void,
                recv_buf: *mut c_void,
                recv_count: u64,
                data_type: HcclDataType,
                op: HcclReduceOp,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            fn HcclBroadcast(
                buf: *mut c_void,
                count: u64,
                data_type: HcclDataType,
                root: u32,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            fn HcclSend(
                send_buf: *mut c_void,
                count: u64,
                data_type: HcclDataType,
                dest_rank: u32,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            fn HcclRecv(
                recv_buf: *mut c_void,
                count: u64,
                data_type: HcclDataType,
                src_rank: u32,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            /// The counts and displacements are host arrays of `uint64_t`, one per rank, in
            /// elements (HCCL's documentation of the function); the header types them `void *`,
            /// and the receive buffer `const void *`, though it is written.
            fn HcclAlltoAllV(
                send_buf: *const c_void,
                send_counts: *const c_void,
                send_displs: *const c_void,
                send_type: HcclDataType,
                recv_buf: *const c_void,
                recv_counts: *const c_void,
                recv_displs: *const c_void,
                recv_type: HcclDataType,
                comm: HcclComm,
                stream: aclrtStream,
            ) -> HcclResult;
            fn HcclBarrier(comm: HcclComm, stream: aclrtStream) -> HcclResult;
        }
        optional {
            /// A description of a status (newer HCCL only).
            fn HcclGetErrorString(code: HcclResult) -> *const c_char;
            /// The error a communicator's asynchronous work ran into (newer HCCL only).
            fn HcclGetCommAsyncError(comm: HcclComm, async_error: *mut HcclResult) -> HcclResult;
        }
    }
}
