//! # symm-python: the native module `symm._symm`
//!
//! The Python package `symm` (in `python/symm`) is the public API; this module is its private,
//! framework-neutral engine:
//!
//! ```text
//! symm (Python)            empty / barrier / shmem_* / groups / errors, RFC names and argument order
//!   symm.platform.*        the framework: ranks, groups, the key-value store, tensor <-> Desc
//!         │  descriptors (address, elements, dtype, layout), native groups, heap blocks
//! symm._symm (this crate)  validation with the Python argument names, GIL released while blocking;
//!         │                the public collectives themselves: their common case in one call (ops.rs)
//! symm-core / symm-registry Communicator over the backend chosen (`Comm`; the CPU one by default)
//! ```
//!
//! - [`comm`]: `Communicator`, `Group`, `HeapBlock` (buffer protocol: zero-copy tensors).
//! - [`coll`]: collectives and send/recv, checked with the Python argument names.
//! - [`ops`]: the table of the public collectives (`shmem_allreduce` ...): their functions,
//!   stubs and both arms; [`entry`]: their entry points (the common case in one native call,
//!   the rest through the native full arm); [`fast`]: what the fast arm knows of the platform;
//!   [`tensor`]: how it reads the platform's tensors.
//! - [`store`]: the framework's store as a [`symm_core::Store`] for start-up.
//! - [`errors`]: one exception class per error code, all under `symm.SymmError`.
//! - [`dfx`]: diagnostics: logging into `logging`, statistics, flight-recorder dumps.
//! - [`registry`]: live allocations by heap offset (recognising symmetric tensors).
//! - [`work`]: asynchronous operations (`async_op=True`): their stream, `Work`, the tensors
//!   in flight.
//! - [`perf`]: the memory-bandwidth bound of `symm.perf`.
//! - [`rendezvous`]: `rendezvous`'s check that every member passes the same symmetric tensor.
//! - [`peer`]: peers' copies of an allocation by address (`PeerBuffer`), for PyTorch's
//!   symmetric-memory handle (`buffer_ptrs`, `get_buffer`).

mod coll;
mod comm;
mod dfx;
mod entry;
mod errors;
mod fast;
mod ops;
mod peer;
mod perf;
mod registry;
mod rendezvous;
mod store;
mod tensor;
mod work;

use pyo3::prelude::*;

/// Native engine of the `symm` package (private: use `symm`).
#[pymodule(gil_used = false)]
fn _symm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DTYPES", comm::dtype_names(m.py())?)?;
    // The backends this build has (cargo features of symm-registry), in their default order.
    let backends: Vec<&str> = symm_registry::BackendKind::COMPILED.iter().map(|k| k.name()).collect();
    m.add("BACKENDS", backends)?;
    m.add("SHIM_FUNCTIONS", tensor::SHIM_FUNCTIONS.to_vec())?;
    m.add("COLLECTIVES", ops::table(m.py())?)?;
    m.add_class::<comm::PyCommunicator>()?;
    m.add_class::<comm::PyGroup>()?;
    m.add_class::<comm::HeapBlock>()?;
    m.add_class::<peer::PeerBuffer>()?;
    m.add_class::<work::PyWork>()?;
    m.add_function(wrap_pyfunction!(comm::init, m)?)?;
    m.add_function(wrap_pyfunction!(perf::memory_bound, m)?)?;
    m.add_function(wrap_pyfunction!(work::foreign_started, m)?)?;
    entry::register(m)?;
    errors::register(m)?;
    dfx::register(m)?;
    Ok(())
}
