//! The backend contract: what a backend must do, with every argument already validated.
//!
//! A backend only moves bytes and keeps its promises on ordering; the public, typed and
//! validated API ([`SymmetricHeap`](crate::SymmetricHeap), [`Communicator`](crate::Communicator))
//! is implemented once, for every backend, on top of this trait.
//!
//! # Execution model
//! Each backend has one *issue order*: the order in which the calling thread makes calls.
//! - Synchronous backends (`symm-sim`) execute a call before returning: after `put_bytes`
//!   returns, the bytes are in the peer's heap.
//! - Stream-ordered backends (Ascend, CUDA) enqueue on the communicator's stream and return;
//!   the stream executes in issue order. [`Backend::quiet`] returns once everything issued has
//!   completed, and host-side waits ([`Backend::wait_signal_at`], [`Backend::barrier_group`])
//!   first drain the stream, so a host wait never overtakes work issued before it.
//!
//! # Ordering
//! - `put_signal_bytes`: the data is visible to the target before the signal update is (release
//!   on the signal; the waiter's successful check is an acquire).
//! - `signal_at`: a release too: the caller's earlier stores, including direct stores into a
//!   peer's heap through a backend's mapping of it (the collectives' small-message path), are
//!   visible to a waiter whose check (acquire) sees the update.
//! - `fence`: puts and signals to the same peer issued before it are delivered before those
//!   issued after it. `quiet`: everything issued before it is complete and visible.
//! - `barrier_group`: everything every member issued before the barrier is complete and visible
//!   to every member after it.

use std::time::Duration;

use crate::dfx::{FlightRing, StatsTable};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::op::{CmpOp, SignalOp};
use crate::rank::Rank;

/// Where a backend's heap lives, and so who may load from and store to it directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySpace {
    /// Host memory (the CPU backend): the caller may dereference heap addresses.
    Host,
    /// A device's memory: reached only through the backend's copies
    /// ([`Backend::copy_to_heap`], [`Backend::copy_from_heap`]) and its operations.
    Device,
}

/// Width of a signal word (int32 like Ascend SHMEM, int64 like OpenSHMEM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalWidth {
    /// `int32` signals.
    W32,
    /// `int64` signals.
    W64,
}

impl SignalWidth {
    /// Bytes of one word.
    pub const fn bytes(self) -> usize {
        match self {
            SignalWidth::W32 => 4,
            SignalWidth::W64 => 8,
        }
    }

    /// The word holding counter value `v` modulo 2^width, as the signed value the signal calls
    /// take (a 32-bit word's value fits in `i32`): counters wrap, and equal words mean equal
    /// counters modulo 2^width.
    pub const fn word_of(self, v: u64) -> i64 {
        match self {
            SignalWidth::W32 => v as u32 as i32 as i64,
            SignalWidth::W64 => v as i64,
        }
    }
}

/// What a wait is for, so that a timeout can say it.
///
/// Waits take it as a [`DescribeWait`], built only when needed: a wait that ends while it
/// spins (most waits of small messages) neither allocates nor formats. Built eagerly, its
/// strings and rank lists cost about a third of a one-way `put_with_signal` + `wait_until`
/// trip on the CPU backend, most of it in freeing them after the signal was seen.
#[derive(Clone, Debug)]
pub struct WaitSite {
    /// The operation (`wait_until`, `barrier`, `allreduce` ...).
    pub op: String,
    /// The group's global ranks, when the wait belongs to a group.
    pub group: Option<Vec<Rank>>,
    /// Where the awaited value lives, in words.
    pub location: String,
    /// The peers whose end (lost or exited) fails the wait early; empty: every member of
    /// `group`. Point-to-point waits name their one peer, so that another member finishing its
    /// work and leaving is no error for them.
    pub watch: Vec<Rank>,
    /// The one peer whose signal the wait needs, when there is one: a peer that left on
    /// purpose (closed its communicator, exited normally) fails the wait only if it is this one,
    /// since another may have done its whole part before leaving. `None`: any watched peer that
    /// left fails the wait.
    pub waiting_on: Option<Rank>,
}

/// Builds the [`WaitSite`] of a wait, on demand: a backend calls it only once the wait has
/// stopped spinning (to check its peers' health while it sleeps) or when it fails.
pub type DescribeWait<'a> = &'a dyn Fn() -> WaitSite;

/// The mechanism a backend provides. Arguments are validated by the caller (this crate).
///
/// Offsets are byte offsets into the symmetric heap (the same on every rank); `bytes` fits the
/// heap; peers are members of a group the caller belongs to and lie on the caller's host.
pub trait Backend: Send + Sync {
    /// Short name for messages (`sim`, `ascend`).
    fn backend_name(&self) -> &'static str;
    /// The caller's rank in the world.
    fn rank(&self) -> Rank;
    /// Number of ranks in the world.
    fn world_size(&self) -> usize;
    /// A number identifying this communicator instance (buffers remember it).
    fn instance_id(&self) -> u64;
    /// The bound applied to waits that are given none.
    fn default_timeout(&self) -> Duration;
    /// The group of every rank.
    fn world(&self) -> Group;
    /// The cached group of these global ranks (created on first use, locality checked).
    fn group_of(&self, ranks: &[Rank]) -> Result<Group>;
    /// Size of each rank's heap in bytes.
    fn heap_size(&self) -> usize;
    /// `Ok` when the calling process may use this communicator: the one that created it.
    /// A child of `fork()` inherits the parent's mappings, and a call there would act as the
    /// parent's rank (pair with its peers, mark it exited); every public call checks this
    /// first and fails with `Error::Unsupported` in such a child. Cheap (no system call): it
    /// runs on every call. Default: always `Ok` (a backend whose state cannot be inherited).
    fn check_process(&self) -> Result<()> {
        Ok(())
    }

    /// Collective over `group`: reserves `bytes` at one offset free on every member and
    /// returns it (0 bytes reserve nothing but still take part in the size agreement). Members
    /// asking for different sizes all get `HeapError::SizeMismatch`.
    fn heap_alloc(&self, group: &Group, bytes: usize, timeout: Duration) -> Result<usize>;
    /// Collective over `group`: checks that every member frees the same range (members that
    /// disagree all get `HeapError::FreeMismatch` and nothing is freed), waits until every
    /// member has stopped using it, then releases it.
    fn heap_free(&self, group: &Group, offset: usize, bytes: usize, timeout: Duration) -> Result<()>;
    /// Local and non-blocking (a garbage collector calls it): this rank gives up the range of
    /// `group` at `offset` without the collective free. A backend that reclaims releases the
    /// range at a later collective allocation (or free) of `group` once every member has given
    /// it up. Default: the range stays reserved until the communicator ends.
    fn heap_abandon(&self, _group: &Group, _offset: usize, _bytes: usize) {}
    /// Address of the caller's own heap (in the backend's memory space).
    fn local_heap_base(&self) -> *mut u8;
    /// The memory space of the heap. Default: host memory.
    fn heap_space(&self) -> MemorySpace {
        MemorySpace::Host
    }
    /// Copies `bytes` of host memory `src` into the caller's own heap at `offset`, complete
    /// when it returns. Default: a host copy (a host-memory heap).
    ///
    /// # Safety
    /// `src` is valid for `bytes` reads; `offset + bytes` lies in the heap; nothing else
    /// accesses that range of the heap meanwhile.
    unsafe fn copy_to_heap(&self, offset: usize, src: *const u8, bytes: usize) -> Result<()> {
        // SAFETY: a host heap (the default's premise); the range is valid by the contract.
        unsafe { std::ptr::copy_nonoverlapping(src, self.local_heap_base().add(offset), bytes) };
        Ok(())
    }
    /// Copies `bytes` of the caller's own heap at `offset` into host memory `dst`, complete
    /// when it returns. Default: a host copy.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` writes; `offset + bytes` lies in the heap.
    unsafe fn copy_from_heap(&self, offset: usize, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: as in `copy_to_heap`.
        unsafe { std::ptr::copy_nonoverlapping(self.local_heap_base().add(offset), dst, bytes) };
        Ok(())
    }
    /// The settings this communicator was created with ([`Config`](crate::config::Config),
    /// parsed once at start-up): the collectives take theirs from it. Default: `None`, and the
    /// collectives parse the environment when a group first needs them.
    fn settings(&self) -> Option<&crate::config::Config> {
        None
    }

    /// Copies `bytes` from local memory `src` to `peer`'s heap at `dst_offset`.
    ///
    /// # Safety
    /// `src` is valid for reads of `bytes` bytes until the copy completes (for stream-ordered
    /// backends: until `quiet`).
    unsafe fn put_bytes(&self, peer: Rank, dst_offset: usize, src: *const u8, bytes: usize) -> Result<()>;

    /// Copies `bytes` from `peer`'s heap at `src_offset` to local memory `dst`.
    ///
    /// # Safety
    /// `dst` is valid for writes of `bytes` bytes until the copy completes, and nothing else
    /// accesses it meanwhile.
    unsafe fn get_bytes(&self, peer: Rank, src_offset: usize, dst: *mut u8, bytes: usize) -> Result<()>;

    /// Atomically updates the signal word at `offset` in `peer`'s heap and wakes its waiters.
    /// `offset` is aligned to the width; a 32-bit `value` fits in `i32`.
    fn signal_at(&self, peer: Rank, offset: usize, width: SignalWidth, op: SignalOp, value: i64) -> Result<()>;

    /// `put_bytes`, then `signal_at`, with the data visible before the signal.
    ///
    /// # Safety
    /// As [`Backend::put_bytes`].
    #[allow(clippy::too_many_arguments)] // the fused form of two calls keeps both argument lists
    unsafe fn put_signal_bytes(
        &self,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
        signal_offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's own contract.
        unsafe { self.put_bytes(peer, dst_offset, src, bytes)? };
        self.fence()?;
        self.signal_at(peer, signal_offset, width, op, value)
    }

    /// Blocks until the caller's own signal word at `offset` satisfies `signal <cmp> value`,
    /// or `timeout` passes (then `Error::Timeout` describing `site()`). Returns the value seen.
    /// Does not modify the signal. `site` is called only when the wait needs the description
    /// (see [`DescribeWait`]).
    fn wait_signal_at(
        &self,
        offset: usize,
        width: SignalWidth,
        cmp: CmpOp,
        value: i64,
        timeout: Duration,
        site: DescribeWait<'_>,
    ) -> Result<i64>;

    /// Orders earlier puts and signals before later ones. Fallible: a device backend's fence is
    /// a call into its runtime.
    fn fence(&self) -> Result<()>;
    /// Completes everything issued so far.
    fn quiet(&self) -> Result<()>;
    /// Blocks until every member of `group` has arrived (see the module's ordering rules).
    fn barrier_group(&self, group: &Group, timeout: Duration) -> Result<()>;

    /// The width of the signal words the collectives written on this contract use for their
    /// flags (`symm_core::coll::reference`): the widest the backend signals natively. Default:
    /// [`SignalWidth::W64`] (the CPU backend). Ascend's aclshmem signals are int32: its backend
    /// answers [`SignalWidth::W32`], and flags then wrap after 2^32 updates (the reference
    /// collectives are correct across the wrap).
    fn signal_width(&self) -> SignalWidth {
        SignalWidth::W64
    }

    /// Diagnostics, optional: the flight-recorder ring of `rank`: the caller's own (which it
    /// writes) or a peer's on its node (read only). `None` when the backend keeps none (the
    /// recorder is then off) or `rank` is not on the caller's node. The same ring for a rank
    /// for the communicator's whole life: an operation's record is found again by its index
    /// (see [`crate::dfx::Started`]). See [`crate::dfx`].
    fn flight_ring(&self, _rank: Rank) -> Option<FlightRing<'_>> {
        None
    }

    /// Diagnostics, optional: the per-operation statistics of this communicator.
    fn op_stats(&self) -> Option<&StatsTable> {
        None
    }

    /// Diagnostics: whether collectives and point-to-point calls are timed (`SYMM_TIMING`; see
    /// "Timing" in [`crate::dfx`]). Off by default.
    fn timing(&self) -> bool {
        false
    }
}

/// What only a backend whose ranks map their peers' heaps into their own address space can do:
/// the capabilities the host engine (the `symm-host` crate) is written on. A device backend
/// does not implement it (its collectives are its own).
pub trait HostMapped: Backend {
    /// Address at which the caller can load from and store to `peer`'s heap; `None` where it
    /// is not mapped (a rank of another host).
    fn peer_heap_base(&self, peer: Rank) -> Option<*mut u8>;

    /// Whether ranks share CPU cores with the peers they wait for (more ranks on a host than
    /// cores): a wait written above the backend that polls should then yield the core between
    /// polls rather than spin.
    fn waiters_share_cores(&self) -> bool;

    /// Blocks until any of the caller's own 64-bit signal words at `words[i].0` is at least
    /// `words[i].1`, or `timeout` passes (then `Error::Timeout` describing `site()`). Returns the
    /// index of a word that holds. Optional capability (`Err(Unsupported)`): callers then wait
    /// on one word at a time in bounded slices, which notices a change of another word only at
    /// the end of a slice.
    fn wait_any_signal_at(&self, words: &[(usize, i64)], timeout: Duration, site: DescribeWait<'_>) -> Result<usize> {
        let _ = (words, timeout, site);
        Err(Error::Unsupported {
            rank: self.rank(),
            backend: self.backend_name(),
            what: "waiting on several signal words at once".into(),
        })
    }
}
