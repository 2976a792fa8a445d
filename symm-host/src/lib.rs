//! # symm-host: the host engine
//!
//! The collectives of a backend whose ranks map their peers' heaps into their own address space
//! ([`HostMapped`](symm_core::HostMapped): the CPU backend, `symm-sim`): the CPU's loads and
//! stores move the data, flags are polled in mapped memory, and the algorithms are the fast CPU
//! ones (a small-message path, one-shot and reduce-scatter + allgather allreduce, an eager
//! broadcast, streaming stores, the vectorised kernels of [`symm_core::coll::kernels`]). A
//! backend implements [`Collectives`](symm_core::Collectives) by forwarding each method to its
//! function here ([`collectives`]); a backend without a host mapping uses its own collectives or
//! the reference ones ([`symm_core::coll::reference`]), which this engine is tested against.
//!
//! Arguments are validated on the calling rank with the checks every engine shares
//! ([`symm_core::coll::checks`]); arguments that must agree across ranks (counts, dtypes, ops,
//! roots, low-precision formats) are compared in the first round of every call, so a
//! disagreement is an error on every rank instead of a hang or corrupted data. Any memory is
//! accepted: buffers inside the symmetric heap are read by peers in place (zero-copy), others are
//! staged through a per-group workspace.
//!
//! Results of allreduce are bit-identical on every rank: each element is reduced in group-rank
//! order in an accumulator type fixed by the dtype (f32 for 16- and 8-bit floats), whichever
//! algorithm (one-shot for small messages, reduce-scatter + allgather for large) ran.
//!
//! Concurrency: one thread at a time may drive a group; a second thread calling into a group
//! while another is inside a call gets `Error::ConcurrentUse` naming the group; collectives in
//! different groups never interfere (each group has its own workspace, flags and round
//! numbers, kept in the group's engine state, [`Group::engine_state`](symm_core::Group::engine_state)).
//!
//! ## Modules
//! - [`collectives`]: the entry points, one per collective;
//! - `engine`: what every call does around its algorithm (numbering, recording, validation);
//! - `state`: the group's workspace and the round protocol; `wait`: bounded waits that watch
//!   for failed and diverged peers; `validate`: the cross-rank check of `SYMM_VALIDATE=1`;
//! - `algo`: the collective algorithms; `ll`: small messages; `eager`: small broadcasts;
//!   `p2p`: send and recv mailboxes; `try_lock`: the group's lock, biased to its thread.

mod algo;
pub mod collectives;
mod eager;
mod engine;
mod ll;
mod p2p;
mod state;
mod try_lock;
mod validate;
mod wait;

pub use collectives::*;
pub use engine::{prepare, reject};
pub use p2p::eager_max_bytes;
pub use state::Tunables;
