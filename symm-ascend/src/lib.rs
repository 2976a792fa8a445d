//! # symm-ascend: the Ascend backend
//!
//! [`AscendComm`] implements the framework's contract on an Ascend device: the heap is one
//! allocation of the Ascend SHMEM symmetric heap, the primitives are SHMEM's stream-ordered
//! operations on ACL streams, events are ACL events. Built on `ascend-sys`, which loads CANN at
//! run time: this crate builds and its tests run on any machine, and on one without CANN the
//! start-up fails with the libraries' search (`SYMM_E_BOOTSTRAP`).
//!
//! ## What holds now, and what does not yet
//! - Start-up: host identities and heap sizes compared, the device chosen (the rank's place on
//!   its host, or the caller's), ACL initialised, the SHMEM unique id made by rank 0 and passed
//!   through the start-up store, the heap mapped.
//! - Groups: any ordered rank list of one host; SHMEM PE `r` is world rank `r` ([`pe`]).
//! - Heap: collective allocation agreed through the store ([`alloc`]).
//! - Primitives, host and stream forms: put, get, signal (int32), put with signal, wait (host:
//!   polled from the host, bounded; stream: the device's wait kernel), quiet, host barriers of
//!   any group, stream barriers (SHMEM's for the world, the host's for a smaller group);
//!   streams and events ([`ledger`]).
//! - Collectives ([`collectives`]): the framework's reference collectives on these primitives,
//!   their reductions as plans of aclnn operators ([`reduce`]), float32 accumulation for the
//!   narrow floats as on CPU.
//! - Host work in stream order (the collectives' stream forms): blocking ACL host callbacks run
//!   by a thread of each stream ([`host_work`]); the caller's own ACL streams adopted
//!   (`StreamBackend::adopt_stream`).
//! - Low-precision transport ([`codec`]): the CPU codec's format made and reduced by aclnn
//!   operators, the host picking the blocks' exponents and coding the rare blocks the CPU
//!   codec codes in float64.
//! - Nothing here has run on a device: `docs/ascend.md` says what was checked where.

pub mod alloc;
pub mod codec;
pub mod collectives;
mod comm;
pub mod dtype;
#[cfg(test)]
mod host_model;
pub mod host_work;
pub mod ledger;
pub mod pe;
pub mod reduce;

pub use comm::{AscendComm, AscendConfig, NAME};
