//! `rendezvous(tensor, group)`, the name HyperParallel and torch give to establishing a
//! symmetric tensor among a group.
//!
//! torch's rendezvous exchanges the members' buffer and signal-pad addresses. symm needs no such
//! exchange: an allocation lies at the same heap offset on every member of its group, and peers
//! are reached by offset. What is left is the check torch also makes (its alloc-id cross-check):
//! every member passes the same view of the same allocation, so that a rank that passes another
//! tensor fails at once on every member instead of corrupting a peer's data later.

use pyo3::prelude::*;
use symm_core::dfx::Op;
use symm_core::{CollOptions, Collectives, Error, Group, GroupError, LocalMut, LocalRef};

use crate::comm::{Desc, PyCommunicator};
use crate::errors::{self, IntoPyResult};

/// What each member contributes to the check: the view's heap offset and bytes, and the bytes of
/// the signal pad the Python side allocates next (which must agree as any allocation size).
const FIELDS: usize = 3;

fn describe(row: &[i64]) -> String {
    format!("a tensor at heap offset {:#x} of {} bytes, signal pad size {} bytes", row[0], row[1], row[2])
}

impl PyCommunicator {
    /// Collective over `g`: checks that `tensor` is a symmetric tensor of an allocation every
    /// member of `g` took part in, and that every member passes the same view of it and the
    /// same `pad_bytes`; returns the view's `(heap_offset, bytes)`.
    ///
    /// A rank whose own tensor fails the check rejects the round (its peers get PeerRejected at
    /// once); members that disagree all raise Mismatch, naming the first member that differs.
    pub(crate) fn coll_rendezvous(
        &self,
        py: Python<'_>,
        g: &Group,
        tensor: &Desc,
        pad_bytes: usize,
    ) -> PyResult<(usize, usize)> {
        let me = self.rank_id();
        self.member_of(py, g)?;
        let check = || {
            let buf = self.symmetric(py, tensor, "tensor")?;
            let alloc = buf.group();
            if let Some(&target) = g.ranks().iter().find(|&&r| alloc.to_local(r).is_none()) {
                let source = GroupError::BufferNotOnRank { arg: "tensor", alloc_ranks: alloc.ranks().to_vec(), target };
                return Err(errors::to_py(py, &Error::Group { rank: me, source }));
            }
            Ok(buf)
        };
        let buf = check().map_err(|e| self.reject_round(py, g, Op::AllGather, e))?;
        let as_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let mine = [as_i64(buf.heap_offset()), as_i64(buf.bytes()), as_i64(pad_bytes)];
        let mut all = vec![0i64; FIELDS * g.size()];
        let comm = self.comm();
        py.detach(|| {
            comm.allgather(g, LocalMut::from_slice(&mut all), LocalRef::from_slice(&mine), &CollOptions::default())
        })
        .map_err(|e| match e {
            // The exchange is rendezvous's own: name the call the peers made.
            Error::PeerRejected { rank, peer, .. } => Error::PeerRejected { rank, op: "rendezvous".into(), peer },
            e => e,
        })
        .py(py)?;
        for (i, theirs) in all.chunks_exact(FIELDS).enumerate() {
            if theirs != mine {
                let e = Error::Mismatch {
                    rank: me,
                    op: format!("rendezvous (group {:?})", g.ranks()),
                    peer: g.ranks()[i],
                    mine: describe(&mine),
                    theirs: describe(theirs),
                };
                return Err(errors::to_py(py, &e));
            }
        }
        Ok((buf.heap_offset(), buf.bytes()))
    }
}
