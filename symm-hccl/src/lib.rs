//! # symm-hccl: HCCL, Ascend's collective library, loaded at run time
//!
//! The bindings of HCCL (`libhccl.so`) symm uses to run a vendor collective beside its own
//! symmetric-memory operations, in `ascend-sys`'s three layers and with its loader and macros:
//! - [`sys`]: the raw declarations in their C shapes (`HcclResult`, `HcclDataType` and
//!   `HcclReduceOp` as 4-byte integers with the header's values, `HcclComm` as a pointer,
//!   `HcclRootInfo` as its 4108 bytes), as a table of function pointers;
//! - [`result`]: every status a `Result` whose [`HcclError`] names the function, the code, its
//!   name and HCCL's own description (`HcclGetErrorString`);
//! - [`safe`]: HCCL loaded once per process; the [`RootInfo`] one rank makes and the others
//!   rebuild from bytes; the [`HcclComm`] (RAII) bound to one ACL stream, whose collectives
//!   (allreduce, reduce-scatter, allgather, broadcast, send, recv, alltoallv, barrier) take
//!   device pointers and symm's [`DType`](symm_core::DType) and [`ReduceOp`](symm_core::ReduceOp);
//!   and the ordering of an HCCL stream after another stream's work, and back
//!   ([`HcclComm::order_after`], [`HcclComm::order_before`]: an ACL event and
//!   `aclrtStreamWaitEvent`, no host synchronization).
//!
//! ## symm's types in HCCL's
//! Every dtype moves (allgather, broadcast, send, recv, alltoallv); reductions take the dtypes
//! HCCL reduces on Atlas A2, `bool` as int8 max/min, and `avg` is refused (HCCL has none: reduce
//! with `sum` and divide). See [`safe::reduction`].
//!
//! ## Loading
//! Nothing links against CANN: `libhccl.so` is opened on first use through
//! `ascend_sys::loader` (the same search: a copy already loaded, `$ASCEND_HOME_PATH/lib64`,
//! `$ASCEND_TOOLKIT_HOME/lib64`, the default prefixes, `LD_LIBRARY_PATH`), so the crate builds,
//! and its tests run, without CANN; the first call then fails with the places searched.
//!
//! ## What was checked where
//! - On every machine (CI): the declarations (function types, enumerator values, the root
//!   info's size) against `hccl.h` and `hccl_types.h` from the `torch-npu` 2.14.0 wheel
//!   (`tests/headers.rs`, `scripts/test.sh` step `ascend`), and that a wrong declaration fails
//!   that check; the dtype and op mapping; the errors; the root info's bytes; the loader's
//!   errors for a missing library and a missing function.
//! - **Nothing has run on hardware**: no call into a real HCCL has been made by this crate, and
//!   the ordering between streams is ACL's documented behaviour, not an observed one. See
//!   `docs/ascend.md`, "HCCL interop".

pub mod result;
pub mod safe;
pub mod sys;

pub use result::{HcclError, Result};
pub use safe::{HcclComm, Producer, RootInfo, StreamOrder};
