//! Ascend SHMEM (`libshmem.so`, the `aclshmem` / `aclshmemx` API of `hicann/shmem` v1.0 and
//! later): start-up with the unique-id bootstrap, the symmetric heap, teams, and the
//! stream-ordered data plane.
//!
//! Signatures, values and layouts: `../shared/reference/ascend-ffi.md` §1.3 and §2.3. The
//! library's headers are C++ and not published in a package this project can download, so
//! `tests/headers.rs` checks these declarations against `tests/facts/shmem.h`, a transcription of
//! that note, the same way it checks ACL against the real headers. The `shmem_*` names of the
//! headers are macros: the symbols are the `aclshmem*` names used here.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::c_void;

use super::acl::aclrtStream;
use super::{ffi_aliases, ffi_consts, ffi_layout, ffi_library, Layout};

/// `typedef int aclshmem_team_t;` (a team's index; `ACLSHMEM_TEAM_WORLD` is 0).
pub type aclshmem_team_t = i32;
/// `enum aclshmemx_bootstrap_t` (4 bytes).
pub type aclshmemx_bootstrap_t = u32;
/// `enum data_op_engine_type_t` (4 bytes, a bit mask).
pub type data_op_engine_type_t = u32;
/// `enum aclshmem_mem_type_t` (4 bytes).
pub type aclshmem_mem_type_t = u32;

ffi_aliases!(ALIASES: aclshmem_team_t, aclshmemx_bootstrap_t, data_op_engine_type_t, aclshmem_mem_type_t);

ffi_consts! { CONSTANTS:
    i32 {
        ACLSHMEM_SUCCESS = 0,
        ACLSHMEM_INVALID_PARAM = -1,
        ACLSHMEM_INVALID_VALUE = -2,
        ACLSHMEM_SMEM_ERROR = -3,
        ACLSHMEM_INNER_ERROR = -4,
        ACLSHMEM_NOT_INITED = -5,
        ACLSHMEM_BOOTSTRAP_ERROR = -6,
        ACLSHMEM_TIMEOUT_ERROR = -7,
        ACLSHMEM_MALLOC_FAILED = -8,
        ACLSHMEM_DL_FUNC_FAILED = -9,
        ACLSHMEM_INNER_TIMEOUT = -10,
        ACLSHMEM_UNDER_API_UNLOAD = -11,
        ACLSHMEM_NOT_SUPPORTED = -100,
        /// `aclshmem_signal_op_type_t`: the signal becomes the value.
        ACLSHMEM_SIGNAL_SET = 0,
        /// `aclshmem_signal_op_type_t`: the value is added to the signal.
        ACLSHMEM_SIGNAL_ADD = 1,
        ACLSHMEM_CMP_EQ = 0,
        ACLSHMEM_CMP_NE = 1,
        ACLSHMEM_CMP_GT = 2,
        ACLSHMEM_CMP_GE = 3,
        ACLSHMEM_CMP_LT = 4,
        ACLSHMEM_CMP_LE = 5,
        /// `aclshmemx_init_status_t`: initialised.
        ACLSHMEM_STATUS_IS_INITIALIZED = 2,
        /// `aclshmemx_uniqueid_t::version` as v1.0 writes it: `(1 << 16) + sizeof(aclshmemx_uniqueid_t)`.
        ACLSHMEM_UNIQUEID_VERSION = (1 << 16) + 136,
        /// `aclshmem_init_optional_attr_t::version` the header's default initialiser sets.
        ACLSHMEM_OPTIONAL_ATTR_VERSION = (1 << 16) + 24,
    }
    u64 {
        /// The largest heap a PE may ask for.
        ACLSHMEM_MAX_LOCAL_SIZE = 40 << 30,
        /// The granule heap sizes should be a multiple of.
        ACLSHMEM_PAGE_SIZE = 2 << 20,
    }
    aclshmem_team_t {
        ACLSHMEM_TEAM_INVALID = -1,
        ACLSHMEM_TEAM_WORLD = 0,
    }
    aclshmemx_bootstrap_t {
        ACLSHMEMX_INIT_WITH_DEFAULT = 1,
        ACLSHMEMX_INIT_WITH_UNIQUEID = 8,
    }
    data_op_engine_type_t {
        /// The memory-transfer engine over HCCS, the one engine of a 910B node.
        ACLSHMEM_DATA_OP_MTE = 1,
    }
    aclshmem_mem_type_t {
        ACLSHMEM_DEVICE_SIDE = 1,
    }
}

/// The bytes of a unique id after its three leading words.
pub const ACLSHMEM_UNIQUE_ID_INNER_LEN: usize = 124;
/// The on-stream data-plane kernels take their byte count as `uint32_t` (risk R7): larger
/// transfers are split below it.
pub const ACLSHMEM_MAX_TRANSFER: usize = u32::MAX as usize;

/// `aclshmem_init_optional_attr_t` (24 bytes, align 4).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aclshmem_init_optional_attr_t {
    pub version: i32,
    pub data_op_engine_type: data_op_engine_type_t,
    pub shm_init_timeout: u32,
    pub shm_create_timeout: u32,
    pub control_operation_timeout: u32,
    pub sockFd: i32,
}

/// `aclshmemx_init_attr_t` as v1.5 lays it out (120 bytes); v1.0 to v1.3 read the first 112
/// and ignore `instance_id` (risk R5).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct aclshmemx_init_attr_t {
    pub my_pe: i32,
    pub n_pes: i32,
    pub ip_port: [u8; 64],
    pub local_mem_size: u64,
    pub option_attr: aclshmem_init_optional_attr_t,
    /// Unique-id start-up: the `aclshmemx_uniqueid_t *` (kept alive until init returns).
    pub comm_args: *mut c_void,
    pub instance_id: u64,
}

impl aclshmemx_init_attr_t {
    /// What the header's C++ default member initialisers give (which a C caller must write
    /// itself): zeroes, and the optional attributes' defaults with no pre-bound socket.
    pub fn defaults() -> Self {
        aclshmemx_init_attr_t {
            my_pe: 0,
            n_pes: 0,
            ip_port: [0; 64],
            local_mem_size: 0,
            option_attr: aclshmem_init_optional_attr_t {
                version: ACLSHMEM_OPTIONAL_ATTR_VERSION,
                data_op_engine_type: ACLSHMEM_DATA_OP_MTE,
                shm_init_timeout: 120,
                shm_create_timeout: 120,
                control_operation_timeout: 120,
                sockFd: -1,
            },
            comm_args: std::ptr::null_mut(),
            instance_id: 0,
        }
    }
}

/// `aclshmemx_uniqueid_t` (136 bytes). The library reads a 64-bit word inside `internal`, so
/// it is given 8-byte alignment (the C type has 4).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aclshmemx_uniqueid_t {
    pub version: i32,
    pub my_pe: i32,
    pub n_pes: i32,
    pub internal: [u8; ACLSHMEM_UNIQUE_ID_INNER_LEN],
}

impl aclshmemx_uniqueid_t {
    /// Its bytes, to pass to the other PEs.
    pub fn to_bytes(&self) -> [u8; 136] {
        let mut out = [0u8; 136];
        out[0..4].copy_from_slice(&self.version.to_ne_bytes());
        out[4..8].copy_from_slice(&self.my_pe.to_ne_bytes());
        out[8..12].copy_from_slice(&self.n_pes.to_ne_bytes());
        out[12..].copy_from_slice(&self.internal);
        out
    }

    /// The id another PE sent; `None` when `bytes` is not 136 long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 136 {
            return None;
        }
        let word = |i: usize| i32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut internal = [0u8; ACLSHMEM_UNIQUE_ID_INNER_LEN];
        internal.copy_from_slice(&bytes[12..]);
        Some(aclshmemx_uniqueid_t { version: word(0), my_pe: word(4), n_pes: word(8), internal })
    }
}

/// The structs as laid out here, checked against the reference note's layouts by
/// tests/headers.rs (and at compile time below).
pub const LAYOUTS: &[Layout] = &[
    ffi_layout!(aclshmem_init_optional_attr_t {
        version,
        data_op_engine_type,
        shm_init_timeout,
        shm_create_timeout,
        control_operation_timeout,
        sockFd,
    }),
    ffi_layout!(aclshmemx_init_attr_t { my_pe, n_pes, ip_port, local_mem_size, option_attr, comm_args, instance_id }),
    ffi_layout!(aclshmemx_uniqueid_t { version, my_pe, n_pes, internal }),
];

/// The sizes the library expects (reference note §2.3, measured with g++ on LP64).
const _: () = {
    assert!(std::mem::size_of::<aclshmem_init_optional_attr_t>() == 24);
    assert!(std::mem::size_of::<aclshmemx_init_attr_t>() == 120);
    assert!(std::mem::size_of::<aclshmemx_uniqueid_t>() == 136);
};

ffi_library! {
    /// The Ascend SHMEM functions symm calls: the v1.0 set is required, later ones optional.
    pub struct ShmemApi in "libshmem.so" {
        required {
            fn aclshmemx_get_uniqueid(uid: *mut aclshmemx_uniqueid_t) -> i32;
            fn aclshmemx_set_attr_uniqueid_args(
                my_pe: i32,
                n_pes: i32,
                local_mem_size: i64,
                uid: *mut aclshmemx_uniqueid_t,
                attr: *mut aclshmemx_init_attr_t,
            ) -> i32;
            fn aclshmemx_init_attr(flags: aclshmemx_bootstrap_t, attr: *mut aclshmemx_init_attr_t) -> i32;
            fn aclshmemx_init_status() -> i32;
            fn aclshmem_finalize() -> i32;
            fn aclshmem_malloc(size: usize) -> *mut c_void;
            fn aclshmem_free(ptr: *mut c_void);
            fn aclshmem_ptr(ptr: *mut c_void, pe: i32) -> *mut c_void;
            fn aclshmem_my_pe() -> i32;
            fn aclshmem_n_pes() -> i32;
            fn aclshmem_team_split_strided(
                parent: aclshmem_team_t,
                pe_start: i32,
                pe_stride: i32,
                pe_size: i32,
                new_team: *mut aclshmem_team_t,
            ) -> i32;
            fn aclshmem_team_translate_pe(src_team: aclshmem_team_t, src_pe: i32, dest_team: aclshmem_team_t) -> i32;
            fn aclshmem_team_destroy(team: aclshmem_team_t);
            fn aclshmem_team_my_pe(team: aclshmem_team_t) -> i32;
            fn aclshmem_team_n_pes(team: aclshmem_team_t) -> i32;
            fn aclshmemx_putmem_on_stream(dst: *mut c_void, src: *mut c_void, bytes: usize, pe: i32, stream: aclrtStream);
            fn aclshmemx_getmem_on_stream(dst: *mut c_void, src: *mut c_void, bytes: usize, pe: i32, stream: aclrtStream);
            fn aclshmemx_signal_op_on_stream(sig_addr: *mut i32, signal: i32, sig_op: i32, pe: i32, stream: aclrtStream);
            fn aclshmemx_signal_wait_until_on_stream(sig_addr: *mut i32, cmp: i32, cmp_val: i32, stream: aclrtStream);
            fn aclshmemx_barrier_on_stream(team: aclshmem_team_t, stream: aclrtStream);
            fn aclshmemx_barrier_all_on_stream(stream: aclrtStream);
        }
        optional {
            /// v1.5 and later.
            fn aclshmemx_quiet_on_stream(stream: aclrtStream);
            /// v1.3.5 and later.
            fn aclshmemx_get_heap_base(mem_type: aclshmem_mem_type_t) -> *mut c_void;
        }
    }
}
