//! # symm-core: the contracts of symmetric-memory communication
//!
//! Every rank of a node owns a heap with the same layout; any rank reads and writes a peer's
//! heap directly (one-sided). This crate holds what every backend shares: the model, the
//! contracts, the validation and the errors. Backends (`symm-sim` for CPUs, device backends
//! later) supply only mechanism.
//!
//! ## Layers
//! ```text
//! Communicator / SymmetricHeap   typed, validated, group-aware API (blanket impls, this crate)
//!            │  byte offsets, global ranks, already checked
//! Backend                        mechanism: move bytes, update signals, wait, barrier, alloc
//!            │
//! symm-sim (CPU shared memory) │ Ascend │ CUDA
//! ```
//! Static dispatch: generic code takes `C: Communicator`. The facade that picks a backend at
//! start-up (`symm-registry`'s `Comm`, an enum of the backends compiled in) sits above this
//! crate.
//!
//! ## Who validates what
//! - This crate, on the calling rank, before anything moves: membership of the caller in the
//!   group, group-local ranks, buffer ownership, that the target rank holds the buffer (it took
//!   part in its allocation), dtype agreement, element ranges (`offset + count <= len`, without
//!   overflow), signal dtype (`int32`/`int64`), signal values that fit the signal, op codes.
//! - The backend, collectively: agreement between ranks that needs communication (allocation
//!   sizes, heap sizes at start-up) and locality of groups (all members on one host).
//! - Nobody validates twice: backends trust arguments they receive through [`Backend`].
//!
//! ## Units
//! Offsets and counts of the public API are **elements** of the buffer's dtype (the RFC's
//! callers all pass elements). `target_rank` is the rank inside the group passed with the call.
//!
//! ## Execution and ordering
//! See [`backend`] for the full contract. In short: calls execute (CPU) or are enqueued on the
//! communicator's stream (devices) in issue order; `put_with_signal` makes the data visible
//! before the signal; waits acquire; `fence` orders, `quiet` completes, `barrier` completes and
//! synchronises a group. Signals are monotonic words that waits never reset (SHMEM semantics).
//!
//! ## Errors
//! [`Error`] composes small domain enums ([`ArgError`], [`GroupError`], [`HeapError`],
//! [`BootstrapError`]) and adds timeouts ([`TimeoutError`]: rank, op, group, location,
//! condition, last value, arrived and pending peers, the flight recorder), lost and exited
//! peers, unsupported capabilities and OS failures. Every variant names the rank that raised it;
//! [`Error::code`] gives a stable code (`docs/errors.md`).
//!
//! ## Diagnostics
//! [`dfx`]: the flight recorder (every rank's last operations, in memory the whole node reads),
//! dumps (API, timeouts, SIGUSR1), logging (`SYMM_LOG_LEVEL`, pluggable sink), per-operation
//! statistics, and the cross-rank validation mode (`SYMM_VALIDATE=1`) of the collectives.

pub mod backend;
pub mod bias;
pub mod bootstrap;
pub mod buffer;
pub mod coll;
pub mod comm;
pub mod config;
pub mod dfx;
pub mod dtype;
pub mod env;
pub mod error;
pub mod group;
pub mod heap;
pub mod op;
pub mod rank;
pub mod stream;

#[doc(hidden)]
pub use log as __log;

pub use backend::{Backend, DescribeWait, HostMapped, MemorySpace, SignalWidth, WaitSite};
pub use bootstrap::{Bootstrap, Store};
pub use buffer::{LocalMut, LocalRef, SymmBuffer};
pub use coll::{CollOptions, Collectives, Transport};
pub use comm::{Communicator, PeerMemory, SymmetricHeap};
pub use dtype::{bf16, f16, DType, Element, F8E4M3, F8E5M2};
pub use error::{ArgError, AtRank, BootstrapError, Error, GroupError, HeapError, Result, TimeoutError};
pub use group::{Group, GroupId, GroupRegistry};
pub use heap::{GroupHeapStats, HeapStats};
pub use op::{CmpOp, ReduceOp, SignalOp};
pub use rank::{GroupRank, Rank};
pub use stream::{Event, Stream, StreamBackend, StreamCollectives, StreamCommunicator, Work};
