//! Serving [`Collectives`](super::Collectives) from the reference collectives: what a backend
//! that has nothing better needs to make its `impl Collectives` a few lines.
//!
//! A backend keeps one [`ReferenceCache`] (one per communicator, shared by its handles). A
//! group's [`ReferenceGroup`] is created on the group's first collective or point-to-point
//! call, collectively, like the host engine's per-group state; [`prepare`] creates it earlier
//! (a backend does so for the world at start-up, so that send/recv between two ranks of the
//! world never waits for the others). The functions here have the collectives' signatures with
//! the cache added; [`collectives_by_reference!`](crate::collectives_by_reference) writes the
//! whole `impl Collectives` body from a method that returns the cache:
//!
//! ```ignore
//! impl Collectives for MyBackend {
//!     symm_core::collectives_by_reference!(reference_cache);
//! }
//! ```
//!
//! Each state holds a workspace in the heap and two streams of the rank for as long as the
//! cache lives: the contract has no group or stream destruction, so that is bounded by the
//! number of groups the communicator makes. A creation that fails (a member missing, a heap
//! too small) leaves no state; the group's next call tries again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::reference::{Reference, ReferenceGroup, ReferenceOptions};
use super::CollOptions;
use crate::buffer::{LocalMut, LocalRef};
use crate::dfx::Op;
use crate::error::{ArgError, AtRank, Result};
use crate::group::{Group, GroupId};
use crate::op::ReduceOp;
use crate::stream::StreamBackend;

/// One [`ReferenceGroup`] per group of a communicator, created on the group's first call.
#[derive(Debug)]
pub struct ReferenceCache {
    options: ReferenceOptions,
    /// Each group's slot, locked only to find or insert it; the slot's own lock is held while
    /// its state is created, so that groups set up independently of each other.
    groups: Mutex<HashMap<GroupId, Arc<GroupSlot>>>,
}

/// A group's place in the cache: empty until its state has been created.
type GroupSlot = Mutex<Option<Arc<ReferenceGroup>>>;

impl Default for ReferenceCache {
    fn default() -> Self {
        ReferenceCache::new(ReferenceOptions::default())
    }
}

impl ReferenceCache {
    /// A cache whose states are created with `options` (the timeout: the call's, else the
    /// communicator's default).
    pub fn new(options: ReferenceOptions) -> Self {
        ReferenceCache { options, groups: Mutex::new(HashMap::new()) }
    }

    /// The options its states are created with.
    pub fn options(&self) -> &ReferenceOptions {
        &self.options
    }

    /// The state of `group` on this member, created (collectively) if it does not exist yet.
    pub fn state<B: StreamBackend>(&self, b: &B, group: &Group) -> Result<Arc<ReferenceGroup>> {
        group.member().at(b.rank())?;
        let slot = {
            let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            groups.entry(group.id()).or_default().clone()
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(state) = slot.as_ref() {
            return Ok(state.clone());
        }
        let state = Arc::new(ReferenceGroup::create(b, group, self.options)?);
        *slot = Some(state.clone());
        Ok(state)
    }
}

/// Collective over `group`: creates its state now rather than at its first call.
pub fn prepare<B: StreamBackend>(b: &B, cache: &ReferenceCache, group: &Group) -> Result<()> {
    cache.state(b, group).map(|_| ())
}

/// Runs `f` on the reference collectives of `group`.
fn with<B: StreamBackend, T>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    f: impl FnOnce(&Reference<'_, B, &ReferenceGroup>) -> Result<T>,
) -> Result<T> {
    let state = cache.state(b, group)?;
    let r = Reference::on(b, &state);
    f(&r)
}

/// [`Collectives::allreduce`](super::Collectives::allreduce) on the reference.
pub fn allreduce<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    buf: LocalMut<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.allreduce(buf, op, opts))
}

/// [`Collectives::allreduce_into`](super::Collectives::allreduce_into) on the reference.
pub fn allreduce_into<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    input: LocalRef<'_>,
    output: LocalMut<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.allreduce_into(input, output, op, opts))
}

/// [`Collectives::reduce_scatter`](super::Collectives::reduce_scatter) on the reference.
pub fn reduce_scatter<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    output: LocalMut<'_>,
    input: LocalRef<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.reduce_scatter(output, input, op, opts))
}

/// [`Collectives::allgather`](super::Collectives::allgather) on the reference.
pub fn allgather<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    output: LocalMut<'_>,
    input: LocalRef<'_>,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.allgather(output, input, opts))
}

/// [`Collectives::alltoall`](super::Collectives::alltoall) on the reference.
pub fn alltoall<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    send: &[LocalRef<'_>],
    recv: LocalMut<'_>,
    recv_counts: &[usize],
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.alltoall(send, recv, recv_counts, opts))
}

/// [`Collectives::alltoall_single`](super::Collectives::alltoall_single) on the reference.
#[allow(clippy::too_many_arguments)] // the collective's arguments, the backend and its cache
pub fn alltoall_single<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    send: LocalRef<'_>,
    send_counts: &[usize],
    recv: LocalMut<'_>,
    recv_counts: &[usize],
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.alltoall_single(send, send_counts, recv, recv_counts, opts))
}

/// [`Collectives::broadcast`](super::Collectives::broadcast) on the reference.
pub fn broadcast<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    buf: LocalMut<'_>,
    root: usize,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.broadcast(buf, root, opts))
}

/// [`Collectives::send`](super::Collectives::send) on the reference.
pub fn send<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    buf: LocalRef<'_>,
    dst: usize,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.send(buf, dst, opts))
}

/// [`Collectives::recv`](super::Collectives::recv) on the reference.
pub fn recv<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    buf: LocalMut<'_>,
    src: usize,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.recv(buf, src, opts))
}

/// [`Collectives::sendrecv`](super::Collectives::sendrecv) on the reference.
#[allow(clippy::too_many_arguments)] // the collective's arguments, the backend and its cache
pub fn sendrecv<B: StreamBackend>(
    b: &B,
    cache: &ReferenceCache,
    group: &Group,
    send: LocalRef<'_>,
    dst: usize,
    recv: LocalMut<'_>,
    src: usize,
    opts: &CollOptions,
) -> Result<()> {
    with(b, cache, group, |r| r.sendrecv(send, dst, recv, src, opts))
}

/// [`Collectives::reject`](super::Collectives::reject) on the reference.
pub fn reject<B: StreamBackend>(b: &B, cache: &ReferenceCache, group: &Group, op: Op, e: ArgError) -> Result<()> {
    with(b, cache, group, |r| r.reject(op, e))
}

/// The body of `impl Collectives for T` for a backend `T: StreamBackend` whose collectives
/// are the reference ones: `$cache` names a method of `T` returning its
/// [`ReferenceCache`](crate::coll::by_reference::ReferenceCache).
#[macro_export]
macro_rules! collectives_by_reference {
    ($cache:ident) => {
        $crate::collectives_by_reference!(@each $cache;
            allreduce(group: &$crate::Group, buf: $crate::LocalMut<'_>, op: $crate::ReduceOp, opts: &$crate::CollOptions);
            allreduce_into(group: &$crate::Group, input: $crate::LocalRef<'_>, output: $crate::LocalMut<'_>,
                op: $crate::ReduceOp, opts: &$crate::CollOptions);
            reduce_scatter(group: &$crate::Group, output: $crate::LocalMut<'_>, input: $crate::LocalRef<'_>,
                op: $crate::ReduceOp, opts: &$crate::CollOptions);
            allgather(group: &$crate::Group, output: $crate::LocalMut<'_>, input: $crate::LocalRef<'_>,
                opts: &$crate::CollOptions);
            alltoall(group: &$crate::Group, send: &[$crate::LocalRef<'_>], recv: $crate::LocalMut<'_>,
                recv_counts: &[usize], opts: &$crate::CollOptions);
            alltoall_single(group: &$crate::Group, send: $crate::LocalRef<'_>, send_counts: &[usize],
                recv: $crate::LocalMut<'_>, recv_counts: &[usize], opts: &$crate::CollOptions);
            broadcast(group: &$crate::Group, buf: $crate::LocalMut<'_>, root: usize, opts: &$crate::CollOptions);
            send(group: &$crate::Group, buf: $crate::LocalRef<'_>, dst: usize, opts: &$crate::CollOptions);
            recv(group: &$crate::Group, buf: $crate::LocalMut<'_>, src: usize, opts: &$crate::CollOptions);
            sendrecv(group: &$crate::Group, send: $crate::LocalRef<'_>, dst: usize, recv: $crate::LocalMut<'_>,
                src: usize, opts: &$crate::CollOptions);
            reject(group: &$crate::Group, op: $crate::dfx::Op, e: $crate::ArgError);
        );
    };
    (@each $cache:ident; $($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $name(&self, $($arg: $ty),*) -> $crate::Result<()> {
                $crate::coll::by_reference::$name(self, self.$cache(), $($arg),*)
            }
        )*
    };
}
