//! # ascend-sys: AscendCL, Ascend SHMEM and the aclnn operators, loaded at run time
//!
//! The bindings the Ascend backend (`symm-ascend`) is written on, in cudarc's three layers:
//! - [`sys`]: the raw declarations of the subset symm uses, in their C shapes (status codes as
//!   `i32`, C enums as 4-byte integers with their values as constants, handles as pointers),
//!   as tables of function pointers;
//! - [`result`]: every status becomes a `Result` whose [`AscendError`] names the function, the
//!   code and the library's own message;
//! - [`safe`]: the libraries loaded once per process, and RAII types for streams, events,
//!   device buffers, the SHMEM heap and its teams, and the operators' descriptors.
//!
//! ## Loading
//! Nothing links against CANN ([`loader`]): every library is opened with `dlopen` on first use,
//! so this crate builds, and its tests run, on any machine. Where a library is missing, the
//! first call that needs it fails with [`LoadError::NotFound`], listing every place searched
//! (`$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64`, the default install prefixes,
//! `LD_LIBRARY_PATH`) and what to install; a library without a required function fails with
//! [`LoadError::MissingSymbol`].
//!
//! ## What was checked where
//! - On every machine (CI): the declared function types, enum values, constants and struct
//!   layouts, against ACL's own headers from the `torch-npu` wheel and against transcriptions
//!   of SHMEM's and aclnn's headers (`tests/headers.rs`, `scripts/test.sh` step `ascend`); the
//!   loader's errors; the logic of the safe layer (chunking, timeouts, heap sizes, workspace
//!   growth, unique ids).
//! - Not yet on hardware: no call into a real CANN library has been made by this crate. See
//!   `docs/ascend.md`.

pub mod loader;
pub mod result;
pub mod safe;
pub mod sys;

pub use loader::LoadError;
pub use result::{AscendError, Result};
