//! The collectives of the Ascend backend: not yet served. The framework's reference collectives
//! do their local steps (copying arrived data out of the heap, the reductions, the
//! low-precision codecs) on the host, and device buffers need them on the device, with the aclnn
//! operators (`ascend_sys::safe::{binary, divide, cast}`); until the reference collectives take
//! those steps from the backend, every collective fails with `Unsupported`, naming itself,
//! after the same membership check as a real one.

use symm_core::coll::{CollOptions, Collectives};
use symm_core::dfx::Op;
use symm_core::{ArgError, AtRank, Error, Group, LocalMut, LocalRef, ReduceOp, Result};

use crate::comm::{AscendComm, NAME};

impl AscendComm {
    fn not_yet(&self, group: &Group, op: Op) -> Result<()> {
        group.member().at(symm_core::Backend::rank(self))?;
        Err(Error::Unsupported {
            rank: symm_core::Backend::rank(self),
            backend: NAME,
            what: format!("{} on device buffers (the device collectives are not written yet)", op.name()),
        })
    }
}

impl Collectives for AscendComm {
    fn allreduce(&self, group: &Group, _buf: LocalMut<'_>, _op: ReduceOp, _opts: &CollOptions) -> Result<()> {
        self.not_yet(group, Op::AllReduce)
    }

    fn allreduce_into(
        &self,
        group: &Group,
        _input: LocalRef<'_>,
        _output: LocalMut<'_>,
        _op: ReduceOp,
        _opts: &CollOptions,
    ) -> Result<()> {
        self.not_yet(group, Op::AllReduce)
    }

    fn reduce_scatter(
        &self,
        group: &Group,
        _output: LocalMut<'_>,
        _input: LocalRef<'_>,
        _op: ReduceOp,
        _opts: &CollOptions,
    ) -> Result<()> {
        self.not_yet(group, Op::ReduceScatter)
    }

    fn allgather(&self, group: &Group, _output: LocalMut<'_>, _input: LocalRef<'_>, _opts: &CollOptions) -> Result<()> {
        self.not_yet(group, Op::AllGather)
    }

    fn alltoall(
        &self,
        group: &Group,
        _send: &[LocalRef<'_>],
        _recv: LocalMut<'_>,
        _recv_counts: &[usize],
        _opts: &CollOptions,
    ) -> Result<()> {
        self.not_yet(group, Op::AllToAll)
    }

    fn alltoall_single(
        &self,
        group: &Group,
        _send: LocalRef<'_>,
        _send_counts: &[usize],
        _recv: LocalMut<'_>,
        _recv_counts: &[usize],
        _opts: &CollOptions,
    ) -> Result<()> {
        self.not_yet(group, Op::AllToAll)
    }

    fn broadcast(&self, group: &Group, _buf: LocalMut<'_>, _root: usize, _opts: &CollOptions) -> Result<()> {
        self.not_yet(group, Op::Broadcast)
    }

    fn send(&self, group: &Group, _buf: LocalRef<'_>, _dst: usize, _opts: &CollOptions) -> Result<()> {
        self.not_yet(group, Op::Send)
    }

    fn recv(&self, group: &Group, _buf: LocalMut<'_>, _src: usize, _opts: &CollOptions) -> Result<()> {
        self.not_yet(group, Op::Recv)
    }

    fn sendrecv(
        &self,
        group: &Group,
        _send: LocalRef<'_>,
        _dst: usize,
        _recv: LocalMut<'_>,
        _src: usize,
        _opts: &CollOptions,
    ) -> Result<()> {
        self.not_yet(group, Op::SendRecv)
    }

    fn reject(&self, group: &Group, _op: Op, e: ArgError) -> Result<()> {
        group.member().at(symm_core::Backend::rank(self))?;
        Err(e).at(symm_core::Backend::rank(self))
    }
}
