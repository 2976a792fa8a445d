//! Collectives: the contract every backend implements ([`Collectives`]), the argument checks
//! every implementation shares, the reduction kernels and low-precision codecs, and the
//! reference collectives ([`reference`](mod@reference)), written on the stream-ordered
//! primitives alone: a fallback for any backend (served with [`by_reference`]: one per group,
//! cached) and the oracle of the others. The host engine, the implementation of backends whose
//! ranks map their peers' heaps ([`HostMapped`](crate::backend::HostMapped)), is the
//! `symm-host` crate.
//!
//! The collectives are allreduce, reduce_scatter, allgather, alltoall (list and single-buffer
//! forms), broadcast, send, recv and sendrecv, all group-aware. Arguments are validated on the
//! calling rank; arguments that must agree across ranks (counts, dtypes, ops, roots,
//! low-precision formats) are compared in the first round of every call, so a disagreement is
//! an error on every rank instead of a hang or corrupted data. Any memory is accepted: buffers
//! inside the symmetric heap may be read by peers in place (zero-copy), others are staged
//! through a per-group workspace.
//!
//! Results of allreduce are bit-identical on every rank: each element is reduced in group-rank
//! order in an accumulator type fixed by the dtype (f32 for 16- and 8-bit floats), whichever
//! algorithm ran.
//!
//! Concurrency: one thread at a time may drive a group; a second thread calling into a group
//! while another is inside a call gets `Error::ConcurrentUse` naming the group; collectives in
//! different groups never interfere (each group has its own workspace, flags and round
//! numbers).

pub mod by_reference;
pub mod checks;
pub mod copy;
pub mod kernels;
pub mod lowp;
pub mod reference;

use std::time::Duration;

use crate::buffer::{LocalMut, LocalRef};
use crate::comm::Communicator;
use crate::dfx::Op;
use crate::dtype::DType;
use crate::error::{ArgError, Result};
use crate::group::Group;
use crate::op::ReduceOp;

/// The format the data of an allreduce or reduce_scatter travel in between members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// The group's default from `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`, for the data it suits
    /// (f32, f64, f16, bf16); full precision where it is unset and for other data.
    #[default]
    Default,
    /// Full precision, whatever the environment says (a loss or a metric in a job whose
    /// gradients travel compressed).
    Full,
    /// This format (fp16, bf16, fp8 e4m3, fp8 e5m2); the data must be f32, f64, f16 or bf16.
    Low(DType),
}

/// Options of a collective call.
#[derive(Clone, Copy, Debug, Default)]
pub struct CollOptions {
    /// The transport format of allreduce / reduce_scatter (other collectives move data as is).
    pub transport: Transport,
    /// Bound of every wait in the call (`None`: the communicator's default).
    pub timeout: Option<Duration>,
    /// Called in the calling thread when the call is about to stop spinning and block (it may
    /// be called more than once in a call, and not at all in one that never waits): a language
    /// binding holds its interpreter lock through the short spin of a small call and lets it go
    /// there (releasing and re-taking Python's GIL costs ~40 ns, a fifth of a small allreduce).
    pub before_blocking: Option<fn()>,
}

impl CollOptions {
    /// Options with a transport format.
    pub fn low_precision(lp: DType) -> Self {
        CollOptions { transport: Transport::Low(lp), ..Self::default() }
    }

    /// Options for full precision whatever the environment's default.
    pub fn full_precision() -> Self {
        CollOptions { transport: Transport::Full, ..Self::default() }
    }

    /// These options with `f` called when the call is about to block (see
    /// [`CollOptions::before_blocking`]).
    pub fn with_before_blocking(self, f: fn()) -> Self {
        CollOptions { before_blocking: Some(f), ..self }
    }
}

pub use checks::ranges_overlap;

/// Collective communication over a group. Every member calls the same collectives in the same
/// order; each call returns when the caller's part is complete and its buffers may be reused.
/// A member that cannot make its call (its arguments failed a check of its own) calls
/// [`Collectives::reject`] in its place, so that the others fail with `PeerRejected`.
///
/// Each backend implements it: a backend whose ranks map their peers' heaps
/// ([`HostMapped`](crate::backend::HostMapped)) forwards to the host engine (the `symm-host` crate), others
/// bring their own (a device's kernels, a vendor library) or forward to the reference
/// collectives ([`by_reference`], [`collectives_by_reference!`](crate::collectives_by_reference)).
/// Whatever a backend provides keeps
/// this contract: the host engine's argument checks and errors, results bit-identical on every
/// member, and bounded waits.
pub trait Collectives: Communicator {
    /// In place: every member's `buf` becomes the reduction of all members' `buf`.
    fn allreduce(&self, group: &Group, buf: LocalMut<'_>, op: ReduceOp, opts: &CollOptions) -> Result<()>;

    /// Out of place: `output` becomes the reduction of every member's `input` (same length and
    /// dtype; the buffers are identical or disjoint).
    fn allreduce_into(
        &self,
        group: &Group,
        input: LocalRef<'_>,
        output: LocalMut<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()>;

    /// `input` holds `group.size()` equal parts; member r's `output` becomes the reduction of
    /// part r over all members.
    fn reduce_scatter(
        &self,
        group: &Group,
        output: LocalMut<'_>,
        input: LocalRef<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()>;

    /// Member r's `input` lands in part r of every member's `output` (`group.size()` parts).
    fn allgather(&self, group: &Group, output: LocalMut<'_>, input: LocalRef<'_>, opts: &CollOptions) -> Result<()>;

    /// The RFC's alltoall: `send[i]` goes to group rank i; what rank i sends lands in `recv`
    /// at the sum of `recv_counts[..i]`, and must be exactly `recv_counts[i]` elements.
    fn alltoall(
        &self,
        group: &Group,
        send: &[LocalRef<'_>],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()>;

    /// Single-buffer alltoall with split sizes: `send` holds `send_counts[i]` elements for rank
    /// i, back to back; `recv` receives `recv_counts[i]` from rank i, back to back.
    fn alltoall_single(
        &self,
        group: &Group,
        send: LocalRef<'_>,
        send_counts: &[usize],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()>;

    /// Every member's `buf` becomes group rank `root`'s `buf`. A broadcast of at most
    /// 256 bytes (8 KiB where ranks outnumber cores) returns at the root once its message is in
    /// every member's heap, without waiting for the members (up to 64 such broadcasts ahead of
    /// the slowest): a member whose arguments disagree with the root's fails, the root does not
    /// in that call but in a later collective of the group (see `docs/design.md`).
    fn broadcast(&self, group: &Group, buf: LocalMut<'_>, root: usize, opts: &CollOptions) -> Result<()>;

    /// Sends `buf` to group rank `dst`. Returns once the data is out of `buf`: buffered at the
    /// receiver for messages that fit its mailbox (in the host engine, `symm_host::eager_max_bytes`), which therefore never
    /// wait for the receiver; larger ones stream as the receiver consumes them, or, when `buf`
    /// lies in the symmetric heap, are copied by the receiver straight out of `buf` (zero-copy).
    fn send(&self, group: &Group, buf: LocalRef<'_>, dst: usize, opts: &CollOptions) -> Result<()>;

    /// Receives into `buf` the next message from group rank `src`; it must have `buf`'s length
    /// and dtype (otherwise the message is consumed and an error names both).
    fn recv(&self, group: &Group, buf: LocalMut<'_>, src: usize, opts: &CollOptions) -> Result<()>;

    /// Sends `send` to group rank `dst` and receives into `recv` the next message from group
    /// rank `src`, both at once (MPI_Sendrecv, HcclBatchSendRecv with one send and one recv):
    /// neither direction waits for the other, so rings and pairwise exchanges of any size
    /// complete without ordering the calls by rank. The send is an ordinary message (the peer
    /// may take it with `recv` or `sendrecv`) and the receive takes any message (from `send`
    /// or `sendrecv`); order between a pair is kept. `dst` and `src` may be equal, and may be
    /// the caller itself (a message to oneself, any size). `send` and `recv` must not overlap.
    /// An incoming message of another size or dtype is consumed and fails the call naming both,
    /// after the send is complete. Returns once both are complete.
    fn sendrecv(
        &self,
        group: &Group,
        send: LocalRef<'_>,
        dst: usize,
        recv: LocalMut<'_>,
        src: usize,
        opts: &CollOptions,
    ) -> Result<()>;

    /// Fails this member's next collective call of `group` (recorded as `op`) with the argument
    /// error `e`, found by the caller before it could make the call (a language binding's own
    /// checks): the members waiting in their collective fail at once with
    /// [`Error::PeerRejected`](crate::Error::PeerRejected) instead of a Timeout, and the group's
    /// rounds stay in step.
    /// Returns the error (`InvalidArgument` with `e`, or `GroupError` for a non-member).
    fn reject(&self, group: &Group, op: Op, e: ArgError) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::checks::transport_format;
    use super::*;

    #[test]
    fn the_environments_format_applies_where_it_suits_the_data_and_an_explicit_one_must() {
        use Transport::{Default, Full, Low};
        let bf16 = Ok(Some(DType::BF16));
        // The default: floating-point data travel in it, others in full precision.
        assert_eq!(transport_format(Default, &bf16, DType::F32), Ok(Some(DType::BF16)));
        assert_eq!(transport_format(Default, &bf16, DType::F64), Ok(Some(DType::BF16)));
        assert_eq!(transport_format(Default, &bf16, DType::I64), Ok(None));
        assert_eq!(transport_format(Default, &bf16, DType::U8), Ok(None));
        assert_eq!(transport_format(Default, &Ok(None), DType::F32), Ok(None));
        // The call's own format overrides the default, and must suit the data.
        assert_eq!(transport_format(Low(DType::F16), &bf16, DType::F32), Ok(Some(DType::F16)));
        let e = transport_format(Low(DType::BF16), &Ok(None), DType::I32).unwrap_err();
        assert!(e.to_string().contains("low_precision_dtype") && e.to_string().contains("int32"), "{e}");
        // Full precision on request, whatever the default.
        assert_eq!(transport_format(Full, &bf16, DType::F32), Ok(None));
        // A default the environment spells wrong fails every reduction that would use it.
        let bad = Err(ArgError::invalid(lowp::LOW_PRECISION_VAR, "fp7", "accepted: ..."));
        for dtype in [DType::F32, DType::I64] {
            let e = transport_format(Default, &bad, dtype).unwrap_err();
            assert!(e.to_string().contains(lowp::LOW_PRECISION_VAR), "{e}");
        }
        assert_eq!(transport_format(Full, &bad, DType::F32), Ok(None));
    }
}
