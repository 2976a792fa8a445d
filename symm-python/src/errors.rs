//! One Python exception hierarchy for every [`symm_core::Error`].
//!
//! ```text
//! SymmError(Exception)                                      every error of the library; `.code`, `.rank`
//! ├── InvalidArgument(SymmError, ValueError)                 SYMM_E_INVALID_ARGUMENT
//! ├── GroupError(SymmError, ValueError)                      SYMM_E_GROUP
//! ├── HeapError(SymmError, RuntimeError)                     SYMM_E_HEAP
//! │   └── HeapExhausted                                      SYMM_E_HEAP_EXHAUSTED
//! ├── Timeout(SymmError, TimeoutError, RuntimeError)         SYMM_E_TIMEOUT
//! ├── PeerLost(SymmError, RuntimeError)                      SYMM_E_PEER_LOST
//! │   └── PeerExited                                         SYMM_E_PEER_EXITED
//! ├── Mismatch(SymmError, RuntimeError)                      SYMM_E_MISMATCH
//! ├── PeerRejected(SymmError, RuntimeError)                  SYMM_E_PEER_REJECTED
//! ├── ConcurrentUse(SymmError, RuntimeError)                 SYMM_E_CONCURRENT_USE
//! ├── BootstrapError(SymmError, RuntimeError)                SYMM_E_BOOTSTRAP
//! ├── Unsupported(SymmError, NotImplementedError)            SYMM_E_UNSUPPORTED
//! ├── SystemFailure(SymmError, OSError, RuntimeError)        SYMM_E_SYSTEM
//! └── DeviceError(SymmError, RuntimeError)                   SYMM_E_DEVICE
//! ```
//!
//! Besides its symm parent, each class derives from the built-in classes the callers of the
//! libraries symm stands in for already catch: `ValueError` for a bad argument or rank
//! (HyperParallel raises it for an out-of-range `target_rank`), `RuntimeError` for timeouts
//! and failures (what PyTorch's process groups and symmetric memory raise; `NotImplementedError`
//! is one), `TimeoutError` and `OSError` as Python names those cases. `create_exception!` takes
//! a single base class, so the classes are made by calling `type(name, bases, namespace)` at
//! module initialisation, from one table. The class is chosen from [`Error::code`], the stable
//! contract: a code this table does not know yet (a newer core) still raises `SymmError` with the
//! right `.code` (a test checks that every code of [`Error::CODES`] has its own class).
//!
//! `PeerExited` derives from `PeerLost`: both mean a peer is gone and the group cannot be used
//! any more, so `except symm.PeerLost` keeps catching a peer that left on purpose (closed its
//! communicator, or exited normally without closing it); `except symm.PeerExited` tells the two
//! apart.

use pyo3::exceptions::{PyException, PyNotImplementedError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use symm_core::{ArgError, AtRank, Error, Rank};

/// The Python module name shown in tracebacks (`symm.InvalidArgument`).
const MODULE: &str = "symm";

/// A built-in class an exception also derives from, besides its symm parent.
#[derive(Clone, Copy, Debug)]
enum Builtin {
    Value,
    Timeout,
    Os,
    Runtime,
    NotImplemented,
}

/// One row of the hierarchy: name, symm parent (a class before it in [`CLASSES`]), extra
/// built-in bases (a child has its parent's too), stable code, docstring.
struct Class {
    name: &'static str,
    parent: Option<&'static str>,
    builtins: &'static [Builtin],
    code: Option<&'static str>,
    doc: &'static str,
}

/// `Some` of the name given, `None` without one.
macro_rules! name_or_none {
    () => {
        None
    };
    ($name:ident) => {
        Some(stringify!($name))
    };
}

/// The rows of [`CLASSES`]: `Name(parent) [Builtin, ...] CODE: "docstring";`, without a
/// parent or a code where there is none.
macro_rules! classes {
    ($($name:ident($($parent:ident)?) [$($builtin:ident),*] $($code:ident)?: $doc:literal;)+) => {
        &[$(Class {
            name: stringify!($name),
            parent: name_or_none!($($parent)?),
            builtins: &[$(Builtin::$builtin),*],
            code: name_or_none!($($code)?),
            doc: $doc,
        }),+]
    };
}

/// The hierarchy, parents before children.
const CLASSES: &[Class] = classes! {
    SymmError() []:
        "Base class of every symm error. `code` is the stable error code (`SYMM_E_*`), `rank` \
         the global rank that raised it (None when unknown).";
    InvalidArgument(SymmError) [Value] SYMM_E_INVALID_ARGUMENT:
        "A bad argument, detected on the calling rank before any peer memory was touched. \
         The message names the argument, its value and the rank.";
    GroupError(SymmError) [Value] SYMM_E_GROUP:
        "A group problem: the caller is not a member, a rank is outside the group, the group \
         spans hosts, or a buffer does not exist on the target rank.";
    HeapError(SymmError) [Runtime] SYMM_E_HEAP:
        "A symmetric-heap problem (sizes that differ between ranks, a foreign or freed buffer).";
    HeapExhausted(HeapError) [] SYMM_E_HEAP_EXHAUSTED:
        "Not enough free symmetric heap on every member (raise SYMMETRIC_MEMORY_HEAP_SIZE).";
    Timeout(SymmError) [Timeout, Runtime] SYMM_E_TIMEOUT:
        "A bounded wait expired; the message says what was awaited, where, and the last value seen.";
    PeerLost(SymmError) [Runtime] SYMM_E_PEER_LOST:
        "A peer process ended while this rank depended on it.";
    Mismatch(SymmError) [Runtime] SYMM_E_MISMATCH:
        "Members of a group called a collective with arguments that do not agree.";
    PeerRejected(SymmError) [Runtime] SYMM_E_PEER_REJECTED:
        "A peer rejected its own arguments for a collective this rank joined.";
    BootstrapError(SymmError) [Runtime] SYMM_E_BOOTSTRAP:
        "Start-up failed: the framework's store, the environment, or mapping the peers' heaps.";
    Unsupported(SymmError) [NotImplemented] SYMM_E_UNSUPPORTED:
        "A capability the backend does not offer (for example device tensors on the CPU backend).";
    SystemFailure(SymmError) [Os, Runtime] SYMM_E_SYSTEM:
        "An operating-system call failed at run time.";
    DeviceError(SymmError) [Runtime] SYMM_E_DEVICE:
        "A call into the device's runtime (ACL, SHMEM, the aclnn operators) failed; the message \
         names the call, the library's code and its own message.";
    PeerExited(PeerLost) [] SYMM_E_PEER_EXITED:
        "A peer left on purpose (closed its communicator, or its process exited normally with \
         it open) while this rank still depended on it. A PeerLost: the group is unusable.";
    ConcurrentUse(SymmError) [Runtime] SYMM_E_CONCURRENT_USE:
        "Two threads of one rank called into the same group at the same time; the second \
         one gets this error at once. Call the operations of one group from one thread.";
};

/// The index in [`CLASSES`] of the class `name`.
fn named(name: &str) -> usize {
    CLASSES.iter().position(|c| c.name == name).expect("a class of the table")
}

/// The class for a stable error code (index into [`CLASSES`]); 0 (`SymmError`) for unknown codes.
fn class_index(code: &str) -> usize {
    CLASSES.iter().position(|c| c.code == Some(code)).unwrap_or(0)
}

/// The created classes, in [`CLASSES`] order.
static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn create(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let type_ = py.get_type::<PyType>();
    let mut made: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
    for c in CLASSES {
        let mut bases: Vec<Bound<'_, PyType>> = Vec::with_capacity(3);
        match c.parent {
            Some(p) => bases.push(made[named(p)].bind(py).clone()),
            None => bases.push(py.get_type::<PyException>()),
        }
        for b in c.builtins {
            bases.push(match b {
                Builtin::Value => py.get_type::<PyValueError>(),
                Builtin::Timeout => py.get_type::<PyTimeoutError>(),
                Builtin::Os => py.get_type::<PyOSError>(),
                Builtin::Runtime => py.get_type::<PyRuntimeError>(),
                Builtin::NotImplemented => py.get_type::<PyNotImplementedError>(),
            });
        }
        let ns = PyDict::new(py);
        ns.set_item("__module__", MODULE)?;
        ns.set_item("__doc__", c.doc)?;
        ns.set_item("code", c.code)?;
        ns.set_item("rank", py.None())?;
        let cls = type_.call1((c.name, PyTuple::new(py, bases)?, ns))?;
        made.push(cls.cast_into::<PyType>()?.unbind());
    }
    Ok(made)
}

/// Adds every exception class to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let types = TYPES.get_or_try_init(py, || create(py))?;
    for (c, t) in CLASSES.iter().zip(types) {
        m.add(c.name, t.clone_ref(py))?;
    }
    Ok(())
}

/// The Python exception for a library error: the class of its code, the message, and the
/// `code` and `rank` attributes.
pub(crate) fn to_py(py: Python<'_>, err: &Error) -> PyErr {
    to_py_with(py, err, "")
}

/// As [`to_py`], with `extra` appended to the message (a hint only the bindings know).
pub(crate) fn to_py_with(py: Python<'_>, err: &Error, extra: &str) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let types = TYPES.get_or_try_init(py, || create(py))?;
        let cls = types[class_index(err.code())].bind(py);
        let exc = cls.call1((format!("{err}{extra}"),))?;
        exc.setattr("code", err.code())?;
        let rank = err.rank();
        if rank != Rank(u32::MAX) {
            exc.setattr("rank", rank.0)?;
        }
        Ok(PyErr::from_value(exc))
    };
    // Building the exception only fails if the interpreter itself is failing (out of memory);
    // that error is then the more useful one to raise.
    build().unwrap_or_else(|e| e)
}

/// Shorthand: a core result as a Python result.
pub(crate) trait IntoPyResult<T> {
    /// Turns the library error into its Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, &e))
    }
}

/// An [`ArgError::Invalid`] raised by `rank`, as a Python exception.
pub(crate) fn invalid(
    py: Python<'_>,
    rank: Rank,
    arg: &'static str,
    value: impl std::fmt::Display,
    reason: &str,
) -> PyErr {
    let err = Err::<(), _>(ArgError::invalid(arg, value, reason)).at(rank).unwrap_err();
    to_py(py, &err)
}

/// An `InvalidArgument` raised before the caller's rank is known (bad `init` arguments).
pub(crate) fn unranked_invalid(py: Python<'_>, message: &str) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let types = TYPES.get_or_try_init(py, || create(py))?;
        let cls = types[class_index("SYMM_E_INVALID_ARGUMENT")].bind(py);
        Ok(PyErr::from_value(cls.call1((format!("invalid argument: {message}"),))?))
    };
    build().unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::{BootstrapError, GroupError, HeapError, TimeoutError};

    /// One error of every kind the core has today, so that a new code without a class shows up.
    fn samples() -> Vec<Error> {
        let r = Rank(1);
        vec![
            Error::InvalidArgument { rank: r, source: ArgError::invalid("x", 1, "bad") },
            Error::Group { rank: r, source: GroupError::NotMember { ranks: vec![Rank(0)] } },
            Error::Heap { rank: r, source: HeapError::ForeignBuffer { arg: "buf" } },
            Error::Heap {
                rank: r,
                source: HeapError::Exhausted {
                    requested: 1,
                    group: vec![],
                    largest_common_free: 0,
                    free: 0,
                    heap_size: 0,
                    awaiting_reclaim: 0,
                },
            },
            Error::Timeout(Box::new(TimeoutError::new(
                r,
                "wait".into(),
                None,
                "x".into(),
                "y".into(),
                "0".into(),
                vec![],
                std::time::Duration::ZERO,
            ))),
            Error::PeerLost { rank: r, peer: Rank(0), op: "barrier".into(), detail: "gone".into() },
            Error::PeerExited { rank: r, peer: Rank(0), op: "barrier".into(), detail: "gone".into() },
            Error::ConcurrentUse { rank: r, op: "barrier".into(), group: vec![], busy: "x".into() },
            Error::Bootstrap { rank: r, source: BootstrapError::Protocol("x".into()) },
            Error::Unsupported { rank: r, backend: "sim", what: "x".into() },
            Error::System { rank: r, what: "x".into(), source: std::io::Error::other("x") },
            Error::Device { rank: r, backend: "ascend", what: "x".into(), detail: "y".into() },
        ]
    }

    #[test]
    fn every_core_error_has_its_own_class_with_its_code() {
        for e in samples() {
            let i = class_index(e.code());
            assert_ne!(i, 0, "{} falls back to SymmError", e.code());
            assert_eq!(CLASSES[i].code, Some(e.code()));
        }
        assert_eq!(class_index("SYMM_E_SOMETHING_NEW"), 0);
    }

    #[test]
    fn every_code_of_the_core_has_its_own_class() {
        for code in Error::CODES {
            let i = class_index(code);
            assert_ne!(i, 0, "{code} falls back to SymmError: add a class to CLASSES");
        }
        let known = CLASSES.iter().filter_map(|c| c.code).count();
        assert_eq!(known, Error::CODES.len(), "a class has a code the core does not list");
        assert_eq!(CLASSES[class_index("SYMM_E_PEER_EXITED")].parent, Some("PeerLost"));
    }

    #[test]
    fn parents_come_before_children_and_codes_are_unique() {
        for (i, c) in CLASSES.iter().enumerate() {
            assert!(c.parent.is_none_or(|p| named(p) < i), "{}", c.name);
            assert!(c.code.is_none() || CLASSES.iter().filter(|d| d.code == c.code).count() == 1, "{}", c.name);
        }
        assert_eq!(CLASSES[class_index("SYMM_E_HEAP_EXHAUSTED")].parent, Some("HeapError"));
    }
}
