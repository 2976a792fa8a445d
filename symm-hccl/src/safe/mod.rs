//! The safe layer: HCCL loaded once per process, symm's dtypes and ops in HCCL's terms, the root
//! info that starts a communicator, the communicator itself (RAII, bound to one ACL stream), and
//! the ordering of HCCL's stream after (and before) other streams' work.
//!
//! Devices: HCCL, like ACL, works on the calling thread's device. A thread that creates a
//! communicator or enqueues its work calls `ascend_sys::safe::set_device` first.

mod comm;
mod dtype;
mod order;
mod root_info;

use std::sync::OnceLock;

use ascend_sys::loader::{self, Env, LoadError};

pub use comm::{HcclComm, DRAIN_ON_DROP};
pub use dtype::{movement_type, reduction, REDUCIBLE};
pub use order::{Producer, StreamOrder};
pub use root_info::RootInfo;

use crate::result::Result;
use crate::sys::HcclApi;

/// HCCL (`libhccl.so`), found by `ascend_sys`'s search in `env` and resolved.
pub fn load_with(env: Env<'_>) -> std::result::Result<HcclApi, LoadError> {
    loader::open_with(HcclApi::LIBRARY, env).and_then(HcclApi::resolve)
}

/// HCCL, loaded on first use and never unloaded (CANN's libraries keep threads and device state
/// that do not survive `dlclose`); a load that failed fails every later call with the same
/// error, without searching again.
pub fn hccl() -> Result<&'static HcclApi> {
    static TABLE: OnceLock<std::result::Result<HcclApi, LoadError>> = OnceLock::new();
    TABLE.get_or_init(|| load_with(&loader::process_env)).as_ref().map_err(|e| e.clone().into())
}
