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
pub use coll_cases::{heap_only, run_coll_case, COLL_CASES, DEVICE_CASES};

/// Runs `f` on `n` ranks as threads of this process ([`symm_registry::run_in_process`]) and returns
/// what each rank returned; a rank that fails to start fails the caller, named in the message
/// after `what`.
pub fn on_threads<R: Send>(
    what: &str,
    n: usize,
    config: symm_registry::CommConfig,
    f: impl Fn(symm_registry::Comm) -> R + Sync,
) -> Vec<R> {
    let results = symm_registry::run_in_process(n, config, f).into_iter().enumerate();
    results.map(|(r, res)| res.unwrap_or_else(|e| panic!("{what}: rank {r} failed to start: {e}"))).collect()
}

/// Every collective case on `n` ranks as threads, for each `n` of `ranks` (64 MiB heaps).
pub fn coll_cases_on_threads(ranks: &[usize]) {
    for &n in ranks {
        for case in COLL_CASES {
            let config = symm_registry::CommConfig::with_heap_size(64 << 20);
            on_threads(&format!("{case} on {n} ranks"), n, config, |comm| run_case(case, &comm));
        }
    }
}
