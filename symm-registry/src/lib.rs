//! # symm-registry: every backend of symm behind one facade
//!
//! [`Comm`] is an enum with one variant per backend compiled in (cargo features; `sim`, the CPU
//! backend, on by default). It implements the contract of `symm-core` by forwarding to its
//! variant, so the callers (the Python package, `symm-bench`, the conformance suite) are written
//! once against `Comm` and name no backend type. Which backend a communicator is made with is
//! [`SYMM_BACKEND`](symm_core::config::BACKEND) (default: the first compiled in), read when it is
//! made ([`Comm::init`], [`Comm::from_env`], [`run_in_process`]); an unknown name, or one not
//! compiled in, is an error naming the variable and its value.
//!
//! ## Two kinds of dispatch, and why
//! - **The facade's own trait**, [`BackendControl`] (what a caller asks of a backend that is not
//!   in the contract: host identities, heap accounting), is dispatched by `enum_dispatch`.
//! - **The traits of `symm-core`** (`Backend`, `HostMapped`, `Collectives`, `StreamBackend`)
//!   cannot be: `enum_dispatch` links a trait and an enum registered in one crate's compilation,
//!   and those traits are defined in another crate. They are forwarded by one declarative macro
//!   (`forward.rs`): one `#[inline]` `match` on the variant per method, *every* method including
//!   the provided ones (a provided method left out would silently run the trait's default
//!   instead of the backend's override). With one variant the match compiles away: a call
//!   through `Comm` costs what a call on the backend costs. `SymmetricHeap`, `Communicator`,
//!   `PeerMemory`, `StreamCommunicator` and `StreamCollectives` are blanket impls over those
//!   and so hold for `Comm` as they are.
//!
//! Launch helpers, the start-up store and the host-memory model of the CPU backend are
//! re-exported here ([`host`], [`store`], [`spawn_ranks`], [`run_job`]) so that no caller
//! imports a backend crate.

mod comm;
mod forward;
mod launch;
mod select;

pub use comm::{BackendControl, Comm};
#[cfg(feature = "sim")]
pub use launch::{job_exit_code, run_job, spawn_ranks};
pub use launch::{run_in_process, RANK_VAR, RENDEZVOUS_HOSTED_VAR, RENDEZVOUS_VAR, WORLD_SIZE_VAR};
pub use select::{BackendKind, CommConfig};

/// What only the host engine has: the host-memory bandwidth model (`membw`, reported by
/// `symm-bench` and `python -m symm.perf`), the system calls of the CPU backend (`sys`: CPU
/// affinity, file descriptors over Unix sockets) and its count of lost wake-ups.
#[cfg(feature = "sim")]
pub mod host {
    pub use symm_sim::{lost_wakeups, membw, sys};
}

/// The start-up stores (`TcpStore`, `TcpStoreServer`, `MemoryStore`), which the launchers use.
#[cfg(feature = "sim")]
pub mod store {
    pub use symm_sim::store::*;
}
