//! The safe layer: the libraries loaded once per process, and RAII types for what they hand out
//! (streams, events, device buffers, the SHMEM heap and its teams, operator descriptors).
//!
//! The libraries are loaded on first use and never unloaded (CANN's libraries keep threads and
//! device state that do not survive `dlclose`); a library that failed to load fails every later
//! use with the same error, without searching again.
//!
//! Devices and contexts: ACL contexts are per thread. These types never reset a device or
//! finalize ACL (torch_npu owns both in a PyTorch process, R13); a thread that issues work calls
//! [`set_device`] first.

mod callback;
mod heap;
mod ops;
mod runtime;

use std::sync::OnceLock;

pub use callback::{launch as launch_callback, Reporter};
pub use heap::{heap_request, ShmemHeap, Team};
pub use ops::{
    abs, binary, cast, divide, equal, fill_where, multiply, row_max, Elementwise, Scalar, Tensor, Workspace,
};
pub use runtime::{
    chunks, copy_async, init, set_device, synchronize_stream, timeout_ms, version, CopyKind, DeviceBuffer, Event,
    Stream,
};

use crate::loader::{self, LoadError};
use crate::result::Result;
use crate::sys::acl::AclApi;
use crate::sys::aclnn::{NnopbaseApi, OpApi};
use crate::sys::shmem::ShmemApi;

/// Loads a table once per process.
macro_rules! loaded_once {
    ($(#[$m:meta])* $name:ident: $api:ty) => {
        $(#[$m])*
        pub fn $name() -> Result<&'static $api> {
            static TABLE: OnceLock<std::result::Result<$api, LoadError>> = OnceLock::new();
            TABLE
                .get_or_init(|| loader::open(<$api>::LIBRARY).and_then(<$api>::resolve))
                .as_ref()
                .map_err(|e| e.clone().into())
        }
    };
}

loaded_once!(
    /// AscendCL (`libascendcl.so`).
    acl: AclApi
);
loaded_once!(
    /// Ascend SHMEM (`libshmem.so`).
    shmem: ShmemApi
);
loaded_once!(
    /// The operators' descriptors (`libnnopbase.so`).
    nnopbase: NnopbaseApi
);
loaded_once!(
    /// The aclnn operators (`libopapi.so`).
    opapi: OpApi
);
