//! `_symm.memory_bound`: the memory-bandwidth bound that `python -m symm.perf` reports, the
//! model and measurement of [`symm_registry::host::membw`] that `symm-bench` reports too.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use symm_registry::host::membw::{self, Coll, Limits};

/// `memory_bound(ranks, queries, limits=None) -> (bounds, limits, table)`: for each query
/// `(op, in_place, bytes)` the least seconds of its memory traffic among `ranks` ranks, at the
/// rates `limits` (as returned before) or, when None, measured now (with one thread and
/// `min(ranks, CPUs)` pinned threads; the GIL released). `table` shows the rates.
#[pyfunction]
#[pyo3(signature = (ranks, queries, limits=None))]
pub fn memory_bound(
    py: Python<'_>,
    ranks: usize,
    queries: Vec<(String, bool, f64)>,
    limits: Option<&str>,
) -> PyResult<(Vec<f64>, String, String)> {
    if ranks == 0 {
        return Err(PyValueError::new_err("memory_bound: ranks 0: expected at least 1"));
    }
    let limits = match limits {
        Some(text) => Limits::decode(text)
            .ok_or_else(|| PyValueError::new_err(format!("memory_bound: limits {text:?}: not a table it returned")))?,
        None => py.detach(|| Limits::measure(ranks, true)),
    };
    let bounds = queries
        .iter()
        .map(|(op, in_place, bytes)| {
            let coll = Coll::from_name(op).ok_or_else(|| {
                let known: Vec<&str> = Coll::ALL.iter().map(|c| c.name()).collect();
                PyValueError::new_err(format!("memory_bound: op {op:?}: expected one of {}", known.join(", ")))
            })?;
            if !(bytes.is_finite() && *bytes >= 0.0) {
                return Err(PyValueError::new_err(format!("memory_bound: bytes {bytes}: expected a size >= 0")));
            }
            Ok(limits.bound(membw::traffic(coll, *in_place, *bytes, ranks)))
        })
        .collect::<PyResult<Vec<f64>>>()?;
    Ok((bounds, limits.encode(), limits.to_string()))
}
