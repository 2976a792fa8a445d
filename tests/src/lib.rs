//! # The conformance suite
//!
//! Every case is a function generic over [`Communicator`](symm_core::Communicator), called collectively by every rank of
//! a world (all ranks run the same case). The same cases run against every backend and mode:
//! in-process (ranks as threads, `tests/in_process.rs`) and multi-process (one process per rank
//! through the `symm-conformance-rank` binary, `tests/multi_process.rs`).
//!
//! A case panics (with the rank in the message) when the backend breaks the contract.

pub mod accuracy;
pub mod cases;
pub mod coll_cases;
pub mod debris;
pub mod gen;
pub mod report;

pub use cases::{run_case, CASES};
pub use coll_cases::{run_coll_case, COLL_CASES};
