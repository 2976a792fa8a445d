//! The fast path of the public collectives (`symm.shmem_allreduce` and the others of
//! [`crate::ops`]): what it knows of the platform and the communicator it runs on, set once by
//! `symm.init` ([`enable`]).
//!
//! The full arm ([`crate::entry::Full`]) opens the profiler range, resolves the group, asks the
//! platform adapter to describe each tensor as a [`Desc`](crate::comm::Desc) tuple, and converts
//! and checks that before running the core. For a tiny message that argument handling costs
//! many times the collective itself (a 2-rank allreduce of 8 bytes takes about 0.25-0.4 us in
//! Rust). The fast path does the same in one native call with the fewest reads: the entry point
//! binds the arguments in place ([`crate::entry`]), the tensors are read without the adapter
//! ([`crate::tensor`]), the op is matched by identity with interned names and cached small-int
//! codes, the group by identity in the API's own cache of native groups (`None`: the world,
//! whose membership is checked once), and the profiler flag is one borrowed dict read, or none
//! while the dict holding it has not changed since the flag was last read `False` (its version,
//! which CPython keeps up to 3.13). docs/performance.md, "What the simplification measured
//! (issue 22)", has what each of these saves.
//!
//! The collective runs exactly as on the full arm: the same core call
//! ([`PyCommunicator::run_allreduce`] and its siblings), which for small messages keeps the GIL
//! while it spins and releases it when it is about to block (a collective may wait for its
//! peers; holding the GIL then would stall every other Python thread for as long as the slowest
//! peer takes).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyType};
use symm_core::Group;

use crate::comm::{PyCommunicator, PyGroup};
use crate::tensor::Reader;

/// What the platform hands over once (`Platform.fast_path()`), so that the fast path can read
/// its tensors, groups and profiler flag without the adapter.
#[derive(Debug)]
pub(crate) struct FastSpec {
    /// How the platform's tensors are read.
    pub(crate) tensors: Reader,
    /// The profiler's flag, `(mapping, key)`: true while the framework's profiler records.
    profiler: Option<(Py<PyDict>, Py<PyString>)>,
    /// The mapping's version ([`dict_version`]) when the flag was last read as `False`; 0:
    /// none. While the version is the same, the flag is still `False`, and a call reads one
    /// word instead of looking the key up.
    profiler_off_at: AtomicU64,
    /// The API's native groups by framework group object, when the platform keys groups by the
    /// object itself (`None` in a call is the world, always known).
    groups: Option<Py<PyDict>>,
    /// The world group (what `group=None` means) when this rank can use it (a group's
    /// membership and locality never change: checked once, not per call); `None`: calls on
    /// the world take the full path, which reports why.
    world: Option<Group>,
}

impl FastSpec {
    /// Builds the spec from the platform's values, or `None` when the tensor types do not read
    /// the torch way (the fast path then stays off); see [`Reader::new`].
    #[allow(clippy::too_many_arguments)] // the platform's description, field by field
    pub(crate) fn new(
        types: Vec<Bound<'_, PyType>>,
        dtypes: &Bound<'_, PyDict>,
        profiler: Option<(Bound<'_, PyDict>, Bound<'_, PyString>)>,
        groups: Option<Bound<'_, PyDict>>,
        shim: Option<Bound<'_, PyDict>>,
        probes: &[Bound<'_, PyAny>],
        world: Group,
    ) -> PyResult<Option<FastSpec>> {
        let Some(tensors) = Reader::new(types, dtypes, shim, probes)? else { return Ok(None) };
        Ok(Some(FastSpec {
            tensors,
            profiler: profiler.map(|(o, k)| (o.unbind(), k.unbind())),
            profiler_off_at: AtomicU64::new(0),
            groups: groups.map(Bound::unbind),
            world: world.member().is_ok().then_some(world),
        }))
    }

    /// Whether the framework's profiler records now (calls then take the full path, which
    /// opens the profiler range). A flag that cannot be read counts as recording.
    ///
    /// Every access to `profiler_off_at` happens with the GIL held, which orders them: the
    /// atomic only makes the spec `Sync`, hence `Relaxed` (free-threaded builds keep no
    /// version, see [`dict_version`], and never store one).
    pub(crate) fn profiling(&self, py: Python<'_>) -> bool {
        let Some((map, key)) = &self.profiler else { return false };
        let version = dict_version(map);
        if version.is_some_and(|v| self.profiler_off_at.load(Ordering::Relaxed) == v) {
            return false;
        }
        // SAFETY: `map` is a dict and `key` a str, both held by `self`, the GIL held. The
        // result is borrowed (no reference counting for the common answer), or NULL: missing
        // (no exception) or failed (an exception, taken below). `version` was read before the
        // look-up: should the look-up run code that changes the dict (a stored key's `__eq__`),
        // the version kept below is an old one, which only costs a look-up more next time.
        let value = unsafe { ffi::PyDict_GetItemWithError(map.as_ptr(), key.as_ptr()) };
        if value.is_null() {
            drop(PyErr::take(py));
            return true;
        }
        // SAFETY: `Py_False` is the address of the `False` singleton.
        if value == unsafe { ffi::Py_False() } {
            if let Some(v) = version {
                self.profiler_off_at.store(v, Ordering::Relaxed);
            }
            return false;
        }
        // SAFETY: `value` is a live object borrowed from `map`; a reference is taken before its
        // `__bool__` may run code (which could drop the dict's).
        let value = unsafe { Bound::from_borrowed_ptr(py, value) };
        value.is_truthy().unwrap_or(true)
    }

    /// The native group of `group` when it is the world (`None`; one this rank can use) or
    /// already cached by the API.
    fn group<'a, 'py>(&'a self, group: Option<&Bound<'py, PyAny>>) -> Option<FastGroup<'a, 'py>> {
        let Some(group) = group.filter(|g| !g.is_none()) else { return self.world.as_ref().map(FastGroup::World) };
        let cached = self.groups.as_ref()?.bind(group.py()).get_item(group).ok()??;
        cached.cast_into::<PyGroup>().ok().map(FastGroup::Cached)
    }

    /// [`FastSpec::group`], when this rank is a member (the world's membership was checked
    /// once, in [`FastSpec::new`]).
    pub(crate) fn member_group<'a, 'py>(&'a self, group: Option<&Bound<'py, PyAny>>) -> Option<FastGroup<'a, 'py>> {
        let g = self.group(group)?;
        (!matches!(g, FastGroup::Cached(_)) || g.get().member().is_ok()).then_some(g)
    }
}

/// The version CPython keeps for `dict` (`ma_version_tag`, up to Python 3.13: a new value,
/// unique in the interpreter, at every insertion, deletion and change of a value of a dict with
/// its own table, such as a module's `vars()`, the mapping the platforms hand over), or `None`
/// where there is none: 0, Python 3.14 on (which dropped the field), a free-threaded build
/// (where another thread may be writing the field, and a reader on a weakly ordered CPU could
/// see the new version with the old value).
fn dict_version(dict: &Py<PyDict>) -> Option<u64> {
    #[cfg(not(any(Py_3_14, PyPy, GraalPy, Py_GIL_DISABLED)))]
    {
        // Deprecated for 3.12-3.13 (removed in 3.14), still maintained there.
        #[allow(deprecated)]
        // SAFETY: `dict` is a live dict (or an instance of a subclass), an object that starts
        // with CPython's `PyDictObject`; the field is a plain word, read with the GIL held.
        let v = unsafe { (*dict.as_ptr().cast::<ffi::PyDictObject>()).ma_version_tag };
        (v != 0).then_some(v)
    }
    #[cfg(any(Py_3_14, PyPy, GraalPy, Py_GIL_DISABLED))]
    {
        let _ = dict;
        None
    }
}

/// The group a fast call runs on: the world, or a cached native group (held for the call).
pub(crate) enum FastGroup<'a, 'py> {
    World(&'a Group),
    Cached(Bound<'py, PyGroup>),
}

impl FastGroup<'_, '_> {
    pub(crate) fn get(&self) -> &Group {
        match self {
            FastGroup::World(g) => g,
            FastGroup::Cached(b) => b.get().group(),
        }
    }
}

/// The communicator the fast path runs on and what it knows of the platform: set once, by
/// `symm.init` (one runtime per process).
#[derive(Debug)]
pub(crate) struct Fast {
    pub(crate) comm: Py<PyCommunicator>,
    pub(crate) spec: FastSpec,
}

pub(crate) static FAST: PyOnceLock<Fast> = PyOnceLock::new();

/// Enables the fast path on `comm` (the first call wins: `symm.init` runs once per process).
pub(crate) fn enable(py: Python<'_>, comm: Py<PyCommunicator>, spec: FastSpec) {
    let _ = FAST.set(py, Fast { comm, spec });
}
