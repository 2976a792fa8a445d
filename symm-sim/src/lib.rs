//! # symm-sim: the CPU shared-memory backend
//!
//! Processes of one host are the ranks; each rank's heap is shared memory mapped by every rank
//! of the host. It runs on laptops, in CI and in CPU jobs, and is the reference the device
//! backends are tested against.
//!
//! Two modes, one code path:
//! - **multi-process**: [`SimComm::from_env`] (rank, world size and rendezvous from
//!   `SYMM_RANK`, `SYMM_WORLD_SIZE`, `SYMM_RENDEZVOUS`, `SYMM_RENDEZVOUS_HOSTED`), or [`SimComm::init`] with any
//!   [`Bootstrap`](symm_core::Bootstrap) (the Python layer brings the framework's store);
//! - **in-process**: [`run_in_process`] runs the ranks as threads for fast property tests.
//!
//! Shared memory is anonymous (memfd) and handed to peers over abstract Unix sockets, so no
//! object with a name exists at any time: nothing outlives the job, even when ranks are killed.

mod alloc;
mod comm;
pub mod control;
pub mod launch;
pub mod membw;
mod recorder;
pub mod store;
mod stream;
pub mod sys;
mod wait;

pub use comm::{SimComm, SimConfig};
pub use launch::{run_in_process, spawn_ranks};
pub use symm_core::{GroupHeapStats, HeapStats};
pub use wait::lost_wakeups;
