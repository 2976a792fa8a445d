//! [`PyStore`]: the framework's key-value store (a Python object) as a [`symm_core::Store`].
//!
//! The object speaks the c10d `Store` protocol (PyTorch's `TCPStore`, `FileStore`,
//! `PrefixStore`; MindSpore's `TCPStore` has the same methods):
//! - `set(key: str, value: bytes)`;
//! - `wait(keys: list[str], timeout: datetime.timedelta)`: blocks until the keys exist, raises
//!   after `timeout` (optional: without it `get` relies on the store's own timeout);
//! - `get(key: str) -> bytes`;
//! - `check(keys: list[str]) -> bool`: whether the keys exist now (optional: without it a look
//!   for a key is a `wait` of 1 ms; c10d reads a zero timeout as "no timeout").
//!
//! Start-up runs with the GIL released; each store call takes it back for its own duration only.

use std::time::Duration;

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use symm_core::{BootstrapError, Store};

/// A Python key-value store used for the start-up exchange.
#[derive(Debug)]
pub(crate) struct PyStore {
    obj: Py<PyAny>,
    has_wait: bool,
    has_check: bool,
}

impl PyStore {
    /// Wraps `obj`; it must have `set` and `get` (checked here, so a wrong object fails at once
    /// with a clear message rather than in the middle of the exchange).
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> Result<PyStore, String> {
        for method in ["set", "get"] {
            if !obj.hasattr(method).unwrap_or(false) {
                return Err(format!("has no {method}() method; expected a c10d-style store (set, get, wait)"));
            }
        }
        let has = |m: &str| obj.hasattr(m).unwrap_or(false);
        Ok(PyStore { obj: obj.clone().unbind(), has_wait: has("wait"), has_check: has("check") })
    }
}

/// Turns an exception raised by the store into a start-up error: timeouts (a `TimeoutError`, or
/// c10d's `RuntimeError("Wait timeout")` / `DistStoreError`) become [`BootstrapError::Timeout`].
fn store_error(py: Python<'_>, op: &str, key: &str, timeout: Duration, err: PyErr) -> BootstrapError {
    let text = err.value(py).to_string();
    let lower = text.to_ascii_lowercase();
    if err.is_instance_of::<PyTimeoutError>(py) || lower.contains("timeout") || lower.contains("timed out") {
        BootstrapError::Timeout { what: format!("store.{op}({key:?}) ({text})"), timeout }
    } else {
        BootstrapError::Io { what: format!("store.{op}({key:?})"), source: std::io::Error::other(text) }
    }
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), BootstrapError> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method1("set", (key, PyBytes::new(py, value)))
                .map(drop)
                .map_err(|e| store_error(py, "set", key, Duration::ZERO, e))
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, BootstrapError> {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            let err = |op: &str, e: PyErr| store_error(py, op, key, timeout, e);
            if self.has_wait {
                let keys = PyList::new(py, [key]).map_err(|e| err("wait", e))?;
                obj.call_method1("wait", (keys, timeout)).map_err(|e| err("wait", e))?;
            }
            let value = obj.call_method1("get", (key,)).map_err(|e| err("get", e))?;
            bytes_of(key, &value)
        })
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, BootstrapError> {
        if !self.has_check {
            return match self.get(key, Duration::from_millis(1)) {
                Ok(v) => Ok(Some(v)),
                Err(BootstrapError::Timeout { .. }) => Ok(None),
                Err(e) => Err(e),
            };
        }
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            let err = |op: &str, e: PyErr| store_error(py, op, key, Duration::ZERO, e);
            let keys = PyList::new(py, [key]).map_err(|e| err("check", e))?;
            let there = obj.call_method1("check", (keys,)).and_then(|b| b.is_truthy()).map_err(|e| err("check", e))?;
            if !there {
                return Ok(None);
            }
            let value = obj.call_method1("get", (key,)).map_err(|e| err("get", e))?;
            bytes_of(key, &value).map(Some)
        })
    }
}

/// The bytes of a value `get` returned.
fn bytes_of(key: &str, value: &Bound<'_, PyAny>) -> Result<Vec<u8>, BootstrapError> {
    match value.cast::<PyBytes>() {
        Ok(b) => Ok(b.as_bytes().to_vec()),
        Err(_) => Err(BootstrapError::Protocol(format!(
            "store.get({key:?}) returned {}, expected bytes",
            value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))),
    }
}
