//! The stream-ordered execution model, next to the host (blocking) one.
//!
//! A [`Stream`] is an in-order queue of one rank's work, executed by the backend: a device's
//! hardware queue (an `aclrtStream`), or on the CPU backend a progress thread of the rank.
//! Enqueueing an operation returns at once with the [`Event`] that marks its completion; the
//! stream runs its operations one at a time, each after everything enqueued before it has
//! completed.
//!
//! # Contract
//! - **Order.** Operations of one stream complete in the order they were enqueued. An event
//!   completes when everything enqueued on its stream up to it has. [`StreamBackend::stream_wait_event`]
//!   orders everything enqueued on a stream afterwards after an event of another stream.
//!   Streams are otherwise unordered with each other.
//! - **Memory.** The buffers of an enqueued operation belong to it until its event has
//!   completed: the caller keeps them alive and neither reads nor writes them meanwhile (hence
//!   the `unsafe` of the typed forms in [`StreamCommunicator`] and [`StreamCollectives`]).
//! - **Host collectives and barriers** on a group first wait until every stream operation this
//!   rank enqueued on the group has completed, so that each member takes the group's
//!   collectives in the order its thread issued them, host and stream alike (two members
//!   pairing a stream allreduce with a host allreduce would otherwise exchange the wrong
//!   buffers). The wait is bounded by the call's timeout and says what it waited for. One-sided
//!   host calls (put, get, signals, waits, the heap) pair with nothing and do not wait: a host
//!   `signal_op` may release a stream's `wait_until`; order them with stream work through
//!   events. Host calls never wait for other groups' stream work.
//! - **Errors.** An event reports the result of the operation it follows: an operation's work
//!   gives that operation's own error, with the blocking form's message, as often as it is
//!   asked. The stream goes on executing after a failure (its peers are in the same
//!   operations, and a group stays usable after the errors that leave it so in the host form);
//!   work that depends on a failed operation is the caller's to hold back.
//! - **Waits.** Every wait, on the host ([`StreamBackend::synchronize_event`]) and on a stream
//!   (an operation's own waits, `stream_wait_event`), is bounded and names what it waited for.
//!
//! The CPU backend implements the model with a progress thread per stream
//! (`symm_sim::SimComm`); a device backend would map streams and events to its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{Backend, SignalWidth};
use crate::buffer::{LocalMut, LocalRef, SymmBuffer};
use crate::coll::{CollOptions, Collectives};
use crate::comm::Communicator;
use crate::dfx::Op;
use crate::dtype::DType;
use crate::error::{Error, Result, TimeoutError};
use crate::group::Group;
use crate::op::{CmpOp, ReduceOp, SignalOp};
use crate::rank::Rank;

/// A stream of one communicator: a handle, cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    owner: u64,
    id: u32,
}

impl Stream {
    /// Stream `id` of the communicator whose [`Backend::instance_id`] is `owner` (for backends).
    pub fn from_parts(owner: u64, id: u32) -> Stream {
        Stream { owner, id }
    }

    /// The communicator instance the stream belongs to.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// The stream's number in its communicator.
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// A point in a stream: complete when everything enqueued on the stream up to it has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    stream: Stream,
    seq: u64,
}

impl Event {
    /// The point after operation `seq` (1 for the first; 0: before any) of `stream`.
    pub fn from_parts(stream: Stream, seq: u64) -> Event {
        Event { stream, seq }
    }

    /// The stream it belongs to.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The number of operations of the stream it follows.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// Work a host-executed stream runs: given the communicator (a handle of the caller's, valid
/// while the stream lives).
pub type HostTask<B> = Box<dyn FnOnce(&B) -> Result<()> + Send + 'static>;

/// The stream-ordered mechanism of a backend. Arguments are validated by the caller (this
/// crate's typed forms), as for [`Backend`].
pub trait StreamBackend: Backend + Sized {
    /// A new stream of this rank.
    fn create_stream(&self) -> Result<Stream>;

    /// The platform's own queue `raw` (a device stream handle the caller's framework owns, such
    /// as torch_npu's current stream) as a stream of this rank, so that work enqueued on it is
    /// ordered with the framework's. The same handle gives the same stream; the backend never
    /// destroys it. Optional: a backend without device queues answers `Unsupported` (the
    /// default).
    ///
    /// # Safety
    /// `raw` is a live queue of this rank's device for as long as the communicator lives.
    unsafe fn adopt_stream(&self, raw: *mut std::ffi::c_void) -> Result<Stream> {
        let _ = raw;
        Err(Error::Unsupported {
            rank: self.rank(),
            backend: self.backend_name(),
            what: "adopting a platform stream (this backend's streams are its own: use create_stream)".into(),
        })
    }

    /// Enqueues `task` as operation `op` (its name in messages) on `stream`; returns its
    /// completion event. `group`: the group of a collective or barrier, whose host collectives
    /// and barriers then wait for it (see the module's contract); `None` for one-sided work.
    /// How a backend runs host work on a stream: the CPU backend's progress thread calls it, a
    /// device backend would launch a host callback.
    fn enqueue(&self, stream: &Stream, op: &'static str, group: Option<&Group>, task: HostTask<Self>) -> Result<Event>;

    /// The event after everything enqueued on `stream` so far.
    fn record_event(&self, stream: &Stream) -> Result<Event>;

    /// Orders everything enqueued on `stream` from now on after `event` (of any stream of this
    /// communicator). The stream's wait is bounded by the default timeout.
    fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()>;

    /// Whether `event` has completed; the error of the operation it follows, if that failed.
    /// Does not block.
    fn query_event(&self, event: &Event) -> Result<bool>;

    /// Blocks until `event` has completed, or `timeout` passes (`Error::Timeout` naming the
    /// stream, the event and the operation it was in); the error of the operation it follows,
    /// if that failed.
    fn synchronize_event(&self, event: &Event, timeout: Duration) -> Result<()>;

    /// Blocks until everything enqueued on `stream` so far has completed (see
    /// [`StreamBackend::synchronize_event`]).
    fn synchronize_stream(&self, stream: &Stream, timeout: Duration) -> Result<()> {
        let e = self.record_event(stream)?;
        self.synchronize_event(&e, timeout)
    }

    /// [`Backend::put_bytes`] on `stream`.
    ///
    /// # Safety
    /// `src` is valid for `bytes` reads until the returned event completes.
    unsafe fn put_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
    ) -> Result<Event> {
        let src = Ptr(src as *mut u8);
        self.enqueue(
            stream,
            "put",
            None,
            Box::new(move |b| {
                // SAFETY: the caller keeps `src` valid until the event completes (contract).
                unsafe { b.put_bytes(peer, dst_offset, src.get(), bytes) }
            }),
        )
    }

    /// [`Backend::get_bytes`] on `stream`.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` writes, and untouched by others, until the event completes.
    unsafe fn get_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        src_offset: usize,
        dst: *mut u8,
        bytes: usize,
    ) -> Result<Event> {
        let dst = Ptr(dst);
        self.enqueue(
            stream,
            "get",
            None,
            Box::new(move |b| {
                // SAFETY: the caller keeps `dst` valid and untouched until the event completes.
                unsafe { b.get_bytes(peer, src_offset, dst.get(), bytes) }
            }),
        )
    }

    /// [`Backend::signal_at`] on `stream`.
    fn signal_at_on(
        &self,
        stream: &Stream,
        peer: Rank,
        offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<Event> {
        self.enqueue(stream, "signal_op", None, Box::new(move |b| b.signal_at(peer, offset, width, op, value)))
    }

    /// [`Backend::put_signal_bytes`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamBackend::put_bytes_on`].
    #[allow(clippy::too_many_arguments)] // the fused form keeps both argument lists
    unsafe fn put_signal_bytes_on(
        &self,
        stream: &Stream,
        peer: Rank,
        dst_offset: usize,
        src: *const u8,
        bytes: usize,
        signal_offset: usize,
        width: SignalWidth,
        op: SignalOp,
        value: i64,
    ) -> Result<Event> {
        let src = Ptr(src as *mut u8);
        self.enqueue(
            stream,
            "put_with_signal",
            None,
            Box::new(move |b| {
                // SAFETY: as in `put_bytes_on`.
                unsafe { b.put_signal_bytes(peer, dst_offset, src.get(), bytes, signal_offset, width, op, value) }
            }),
        )
    }

    /// [`Backend::wait_signal_at`] on `stream`: later work of the stream runs once the caller's
    /// signal word satisfies `signal <cmp> value`; bounded by `timeout`. `setter`: the member of
    /// `group` (global rank) whose signal the wait needs, when only one sets it: then another
    /// member that closed its communicator after doing its part fails the wait no more (a lost
    /// member still does; see [`WaitSite::waiting_on`](crate::backend::WaitSite::waiting_on)).
    #[allow(clippy::too_many_arguments)] // wait_signal_at's arguments plus stream, group, setter
    fn wait_signal_at_on(
        &self,
        stream: &Stream,
        group: &Group,
        setter: Option<Rank>,
        offset: usize,
        width: SignalWidth,
        cmp: CmpOp,
        value: i64,
        timeout: Duration,
    ) -> Result<Event> {
        let members = group.ranks().to_vec();
        self.enqueue(
            stream,
            "wait_until",
            None,
            Box::new(move |b| {
                let site = || crate::backend::WaitSite {
                    op: "wait_until (on a stream)".into(),
                    group: Some(members.clone()),
                    location: format!("the signal word at heap byte {offset:#x}"),
                    watch: Vec::new(),
                    waiting_on: setter,
                };
                b.wait_signal_at(offset, width, cmp, value, timeout, &site).map(|_| ())
            }),
        )
    }

    /// [`Backend::barrier_group`] on `stream`.
    fn barrier_group_on(&self, stream: &Stream, group: &Group, timeout: Duration) -> Result<Event> {
        let g = group.clone();
        self.enqueue(stream, "barrier", Some(group), Box::new(move |b| b.barrier_group(&g, timeout)))
    }

    /// Reduces `srcs` element by element, in their order, into `out`, as the host kernel
    /// [`kernels::reduce`](crate::coll::kernels::reduce) does (its accumulator types, `avg`
    /// divided in the accumulator, one rounding to `dtype`): the local step of the reference
    /// collectives' reductions. Sources and `out` are in the backend's memory space (this
    /// rank's heap, or its local buffers); complete when it returns. Default: that host kernel,
    /// for a backend whose memory is host memory; a device backend runs its own kernels.
    ///
    /// # Safety
    /// Every source holds `len` elements of `dtype`, aligned for it; `out` is valid for `len`
    /// writes and overlaps no source; nothing else writes them meanwhile. `op` is valid for
    /// `dtype` (`avg` only for floating dtypes: checked by the caller).
    unsafe fn reduce_local(
        &self,
        dtype: DType,
        op: ReduceOp,
        srcs: &[*const u8],
        out: *mut u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded (this function's contract is the kernel's).
        unsafe { crate::coll::kernels::reduce(dtype, op, srcs, out, len) };
        Ok(())
    }

    /// Encodes `len` elements of `dtype` at `data` into the low-precision run at `run` (its
    /// exponents, then its payload in `lp`), bit for bit as
    /// [`lowp::encode`](crate::coll::lowp::encode) does: the local step of low-precision
    /// transport. Both are in the backend's memory space; complete when it returns. Default:
    /// that host codec, for a backend whose memory is host memory; a device backend runs its
    /// own operators.
    ///
    /// # Safety
    /// `data` holds `len` elements of `dtype`; `run` is valid for
    /// [`encoded_bytes(lp, len)`](crate::coll::lowp::encoded_bytes) writes, 4-byte aligned,
    /// and overlaps `data` nowhere; nothing else writes either meanwhile. `lp` is a transport
    /// format for `dtype` (checked by the caller).
    unsafe fn encode_local(&self, dtype: DType, lp: DType, data: *const u8, len: usize, run: *mut u8) -> Result<()> {
        let part = crate::coll::lowp::sub_run(run, lp, len, 0, len);
        // SAFETY: the run's exponents and payload lie in `run` (this function's contract).
        unsafe { crate::coll::lowp::encode(dtype, lp, data, len, part.exps.cast_mut(), part.payload.cast_mut()) };
        Ok(())
    }

    /// Decodes the low-precision runs `runs` (each of `len` elements, as
    /// [`encode_local`](Self::encode_local) writes them) and reduces them element by element,
    /// in their order, into `out` of `dtype`, as
    /// [`lowp::reduce_encoded`](crate::coll::lowp::reduce_encoded) does (float32 arithmetic,
    /// float64 for float64 data; `avg` divided there; one rounding into `dtype`). In the
    /// backend's memory space; complete when it returns. Default: that host codec.
    ///
    /// # Safety
    /// Every run holds `len` encoded elements, 4-byte aligned; `out` is valid for `len`
    /// writes of `dtype` and overlaps no run; nothing else writes them meanwhile. `lp` is a
    /// transport format for `dtype`, `op` valid for it (checked by the caller).
    unsafe fn reduce_encoded_local(
        &self,
        dtype: DType,
        lp: DType,
        op: ReduceOp,
        runs: &[*const u8],
        out: *mut u8,
        len: usize,
    ) -> Result<()> {
        let parts: Vec<_> = runs.iter().map(|&r| crate::coll::lowp::sub_run(r, lp, len, 0, len)).collect();
        // SAFETY: forwarded (this function's contract is the codec's).
        unsafe { crate::coll::lowp::reduce_encoded(dtype, lp, op, &parts, len, out) };
        Ok(())
    }
}

/// A raw pointer an enqueued operation carries to the thread that runs it.
#[derive(Clone, Copy)]
struct Ptr(*mut u8);

// SAFETY: the pointer is only dereferenced by the operation it was given to, under the
// contract of the `unsafe` function that enqueued it (the memory stays valid and untouched by
// others until the operation's event completes).
unsafe impl Send for Ptr {}

impl Ptr {
    /// The pointer (a method, so that closures capture the whole `Send` wrapper).
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// An enqueued operation: its event, and the communicator to wait with.
#[derive(Debug)]
#[must_use = "an operation in flight owns its buffers until it has completed"]
pub struct Work<'c, B: StreamBackend> {
    comm: &'c B,
    event: Event,
}

impl<'c, B: StreamBackend> Work<'c, B> {
    /// The work of `event`.
    pub fn new(comm: &'c B, event: Event) -> Self {
        Work { comm, event }
    }

    /// Its completion event.
    pub fn event(&self) -> Event {
        self.event
    }

    /// Blocks until it has completed (`None`: the communicator's default timeout); its error.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.comm.synchronize_event(&self.event, timeout.unwrap_or(self.comm.default_timeout()))
    }

    /// Whether it has completed (its error if it failed); does not block.
    pub fn is_completed(&self) -> Result<bool> {
        self.comm.query_event(&self.event)
    }
}

/// The typed, validated stream forms of the primitives: the same checks as the host forms
/// ([`Communicator`]), made when the operation is enqueued.
pub trait StreamCommunicator: Communicator + StreamBackend {
    /// [`Communicator::put`] on `stream`.
    ///
    /// # Safety
    /// `src` stays valid and unmodified until the returned work has completed.
    #[allow(clippy::too_many_arguments)] // put's arguments plus the stream
    unsafe fn put_on(
        &self,
        stream: &Stream,
        group: &Group,
        target: &SymmBuffer,
        target_offset: usize,
        src: LocalRef<'_>,
        src_offset: usize,
        count: usize,
        target_rank: usize,
    ) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        let (peer, dst, srcp, bytes) =
            crate::comm::check_transfer(self, group, target, target_offset, &src, src_offset, count, target_rank)?;
        // SAFETY: `srcp` lies in `src` at a checked range; valid until completion (contract).
        let e = unsafe { self.put_bytes_on(stream, peer, dst, srcp, bytes)? };
        Ok(Work::new(self, e))
    }

    /// [`Communicator::get`] on `stream`.
    ///
    /// # Safety
    /// `dst` stays valid, and untouched by others, until the returned work has completed.
    #[allow(clippy::too_many_arguments)] // get's arguments plus the stream
    unsafe fn get_on(
        &self,
        stream: &Stream,
        group: &Group,
        dst: LocalMut<'_>,
        dst_offset: usize,
        source: &SymmBuffer,
        source_offset: usize,
        count: usize,
        source_rank: usize,
    ) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        let (peer, src, dstp, bytes) =
            crate::comm::check_get(self, group, dst, dst_offset, source, source_offset, count, source_rank)?;
        // SAFETY: `dstp` lies in `dst` at a checked range; valid until completion (contract).
        let e = unsafe { self.get_bytes_on(stream, peer, src, dstp, bytes)? };
        Ok(Work::new(self, e))
    }

    /// [`Communicator::signal_op`] on `stream`.
    #[allow(clippy::too_many_arguments)] // signal_op's arguments plus the stream
    fn signal_op_on(
        &self,
        stream: &Stream,
        group: &Group,
        signal: &SymmBuffer,
        signal_offset: usize,
        value: i64,
        op: SignalOp,
        target_rank: usize,
    ) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        let (peer, offset, width) =
            crate::comm::check_signal_op(self, group, signal, signal_offset, value, target_rank)?;
        let e = self.signal_at_on(stream, peer, offset, width, op, value)?;
        Ok(Work::new(self, e))
    }

    /// [`Communicator::put_with_signal`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCommunicator::put_on`].
    #[allow(clippy::too_many_arguments)] // put_with_signal's arguments plus the stream
    unsafe fn put_with_signal_on(
        &self,
        stream: &Stream,
        group: &Group,
        target: &SymmBuffer,
        target_offset: usize,
        src: LocalRef<'_>,
        src_offset: usize,
        count: usize,
        signal: &SymmBuffer,
        signal_offset: usize,
        signal_value: i64,
        signal_op: SignalOp,
        target_rank: usize,
    ) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        let (peer, dst, srcp, bytes) =
            crate::comm::check_transfer(self, group, target, target_offset, &src, src_offset, count, target_rank)?;
        let (sig, width) = crate::comm::check_signal(self, signal, signal_offset, Some(signal_value), peer)?;
        // SAFETY: as in `put_on`.
        let e =
            unsafe { self.put_signal_bytes_on(stream, peer, dst, srcp, bytes, sig, width, signal_op, signal_value)? };
        Ok(Work::new(self, e))
    }

    /// [`Communicator::wait_until`] on `stream`: the stream's later work runs once the caller's
    /// `signal[signal_offset] <cmp> value` holds (bounded by `timeout`, default the
    /// communicator's).
    fn wait_until_on(
        &self,
        stream: &Stream,
        signal: &SymmBuffer,
        signal_offset: usize,
        cmp: CmpOp,
        value: i64,
        timeout: Option<Duration>,
    ) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        self.check_process()?;
        let (offset, width) = crate::comm::check_signal(self, signal, signal_offset, None, self.rank())?;
        let timeout = timeout.unwrap_or(self.default_timeout());
        let e = self.wait_signal_at_on(stream, &signal.group, None, offset, width, cmp, value, timeout)?;
        Ok(Work::new(self, e))
    }

    /// [`Communicator::barrier`] on `stream`.
    fn barrier_on(&self, stream: &Stream, group: &Group) -> Result<Work<'_, Self>> {
        check_stream(self, stream)?;
        self.check_process()?;
        crate::error::AtRank::at(group.member(), self.rank())?;
        let e = self.barrier_group_on(stream, group, self.default_timeout())?;
        Ok(Work::new(self, e))
    }
}

impl<B: Communicator + StreamBackend> StreamCommunicator for B {}

/// A buffer an enqueued collective carries: (pointer, elements, dtype).
#[derive(Clone, Copy)]
struct Buf(Ptr, usize, crate::dtype::DType);

impl Buf {
    fn of_ref(r: &LocalRef<'_>) -> Buf {
        Buf(Ptr(r.as_ptr() as *mut u8), r.len(), r.dtype())
    }

    fn of_mut(m: &mut LocalMut<'_>) -> Buf {
        Buf(Ptr(m.as_mut_ptr()), m.len(), m.dtype())
    }

    /// # Safety
    /// The memory is valid for reads for `'a` (the enqueuing call's contract).
    unsafe fn as_ref<'a>(self) -> LocalRef<'a> {
        // SAFETY: forwarded.
        unsafe { LocalRef::from_raw(self.0.get(), self.1, self.2) }
    }

    /// # Safety
    /// The memory is valid for writes, and untouched by others, for `'a`.
    unsafe fn as_mut<'a>(self) -> LocalMut<'a> {
        // SAFETY: forwarded.
        unsafe { LocalMut::from_raw(self.0.get(), self.1, self.2) }
    }
}

/// Options an enqueued collective keeps (the call's timeout and transport; a language
/// binding's `before_blocking` hook is the caller thread's and does not travel).
fn stream_options(opts: &CollOptions) -> CollOptions {
    CollOptions { before_blocking: None, ..*opts }
}

/// The stream forms of the collectives: the host collective, run in stream order. The
/// collective's own checks run when the stream reaches it (so that a member that refuses its
/// arguments still takes part in the round to reject it, as in the host form); their errors
/// surface from the work's `wait`.
pub trait StreamCollectives: Collectives + StreamBackend {
    /// [`Collectives::allreduce`] on `stream`.
    ///
    /// # Safety
    /// `buf` stays valid, and untouched by others, until the returned work has completed.
    unsafe fn allreduce_on(
        &self,
        stream: &Stream,
        group: &Group,
        mut buf: LocalMut<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (b, g, o) = (Buf::of_mut(&mut buf), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: the caller keeps the buffer valid and untouched until completion.
            c.allreduce(&g, unsafe { b.as_mut() }, op, &o)
        });
        submit(self, stream, group, Op::AllReduce, task)
    }

    /// [`Collectives::allreduce_into`] on `stream`.
    ///
    /// # Safety
    /// `input` stays valid and unmodified, and `output` valid and untouched by others, until
    /// the returned work has completed.
    unsafe fn allreduce_into_on(
        &self,
        stream: &Stream,
        group: &Group,
        input: LocalRef<'_>,
        mut output: LocalMut<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (i, out, g, o) = (Buf::of_ref(&input), Buf::of_mut(&mut output), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.allreduce_into(&g, unsafe { i.as_ref() }, unsafe { out.as_mut() }, op, &o)
        });
        submit(self, stream, group, Op::AllReduce, task)
    }

    /// [`Collectives::reduce_scatter`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_into_on`].
    unsafe fn reduce_scatter_on(
        &self,
        stream: &Stream,
        group: &Group,
        mut output: LocalMut<'_>,
        input: LocalRef<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (out, i, g, o) = (Buf::of_mut(&mut output), Buf::of_ref(&input), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.reduce_scatter(&g, unsafe { out.as_mut() }, unsafe { i.as_ref() }, op, &o)
        });
        submit(self, stream, group, Op::ReduceScatter, task)
    }

    /// [`Collectives::allgather`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_into_on`].
    unsafe fn allgather_on(
        &self,
        stream: &Stream,
        group: &Group,
        mut output: LocalMut<'_>,
        input: LocalRef<'_>,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (out, i, g, o) = (Buf::of_mut(&mut output), Buf::of_ref(&input), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.allgather(&g, unsafe { out.as_mut() }, unsafe { i.as_ref() }, &o)
        });
        submit(self, stream, group, Op::AllGather, task)
    }

    /// [`Collectives::alltoall_single`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_into_on`], for `send` and `recv`.
    #[allow(clippy::too_many_arguments)] // alltoall_single's arguments plus the stream
    unsafe fn alltoall_single_on(
        &self,
        stream: &Stream,
        group: &Group,
        send: LocalRef<'_>,
        send_counts: &[usize],
        mut recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (s, r, g, o) = (Buf::of_ref(&send), Buf::of_mut(&mut recv), group.clone(), stream_options(opts));
        let (sc, rc) = (send_counts.to_vec(), recv_counts.to_vec());
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.alltoall_single(&g, unsafe { s.as_ref() }, &sc, unsafe { r.as_mut() }, &rc, &o)
        });
        submit(self, stream, group, Op::AllToAll, task)
    }

    /// [`Collectives::alltoall`] (the list form) on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_into_on`], for every piece of `send` and `recv`.
    unsafe fn alltoall_on(
        &self,
        stream: &Stream,
        group: &Group,
        send: &[LocalRef<'_>],
        mut recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let sends: Vec<Buf> = send.iter().map(Buf::of_ref).collect();
        let (r, g, o, rc) = (Buf::of_mut(&mut recv), group.clone(), stream_options(opts), recv_counts.to_vec());
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            let send: Vec<LocalRef<'_>> = sends.iter().map(|b| unsafe { b.as_ref() }).collect();
            // SAFETY: as above.
            c.alltoall(&g, &send, unsafe { r.as_mut() }, &rc, &o)
        });
        submit(self, stream, group, Op::AllToAll, task)
    }

    /// [`Collectives::sendrecv`] on `stream`: both directions at once, as the host form.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_into_on`], for `send` and `recv`.
    #[allow(clippy::too_many_arguments)] // sendrecv's arguments plus the stream
    unsafe fn sendrecv_on(
        &self,
        stream: &Stream,
        group: &Group,
        send: LocalRef<'_>,
        dst: usize,
        mut recv: LocalMut<'_>,
        src: usize,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (sb, rb, g, o) = (Buf::of_ref(&send), Buf::of_mut(&mut recv), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.sendrecv(&g, unsafe { sb.as_ref() }, dst, unsafe { rb.as_mut() }, src, &o)
        });
        submit(self, stream, group, Op::SendRecv, task)
    }

    /// [`Collectives::broadcast`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_on`].
    unsafe fn broadcast_on(
        &self,
        stream: &Stream,
        group: &Group,
        mut buf: LocalMut<'_>,
        root: usize,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (b, g, o) = (Buf::of_mut(&mut buf), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.broadcast(&g, unsafe { b.as_mut() }, root, &o)
        });
        submit(self, stream, group, Op::Broadcast, task)
    }

    /// [`Collectives::send`] on `stream`.
    ///
    /// # Safety
    /// `buf` stays valid and unmodified until the returned work has completed.
    unsafe fn send_on(
        &self,
        stream: &Stream,
        group: &Group,
        buf: LocalRef<'_>,
        dst: usize,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (b, g, o) = (Buf::of_ref(&buf), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.send(&g, unsafe { b.as_ref() }, dst, &o)
        });
        submit(self, stream, group, Op::Send, task)
    }

    /// [`Collectives::recv`] on `stream`.
    ///
    /// # Safety
    /// As [`StreamCollectives::allreduce_on`].
    unsafe fn recv_on(
        &self,
        stream: &Stream,
        group: &Group,
        mut buf: LocalMut<'_>,
        src: usize,
        opts: &CollOptions,
    ) -> Result<Work<'_, Self>> {
        let (b, g, o) = (Buf::of_mut(&mut buf), group.clone(), stream_options(opts));
        let task: HostTask<Self> = Box::new(move |c| {
            // SAFETY: as in `allreduce_on`.
            c.recv(&g, unsafe { b.as_mut() }, src, &o)
        });
        submit(self, stream, group, Op::Recv, task)
    }
}

impl<B: Collectives + StreamBackend> StreamCollectives for B {}

/// Checks `stream`, enqueues collective `op` of `group` as `task` on it, and returns its work.
fn submit<'c, B: StreamBackend>(
    c: &'c B,
    stream: &Stream,
    group: &Group,
    op: Op,
    task: HostTask<B>,
) -> Result<Work<'c, B>> {
    check_stream(c, stream)?;
    Ok(Work::new(c, c.enqueue(stream, op.name(), Some(group), task)?))
}

/// A stream given to a communicator that does not own it fails, naming both.
fn check_stream<B: Backend>(b: &B, stream: &Stream) -> Result<()> {
    if stream.owner == b.instance_id() {
        Ok(())
    } else {
        Err(crate::error::ArgError::invalid(
            "stream",
            format!("stream {} of communicator {:#x}", stream.id, stream.owner),
            format!("belongs to another communicator than this one ({:#x})", b.instance_id()),
        ))
        .map_err(|source| Error::InvalidArgument { rank: b.rank(), source })
    }
}

thread_local! {
    /// Whether this thread executes a stream (its host calls are the stream's own operations,
    /// which never wait for their own group's stream work).
    static EXECUTOR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as a stream's executor (a backend's progress thread calls it once).
pub fn mark_executor_thread() {
    EXECUTOR.with(|e| e.set(true));
}

/// Whether the calling thread is a stream's executor.
#[inline]
pub fn on_executor_thread() -> bool {
    EXECUTOR.with(|e| e.get())
}

/// The stream operations a rank has enqueued on one group and not yet completed, which that
/// rank's host calls on the group wait for (see the module's contract).
#[derive(Default)]
pub(crate) struct PendingStreamOps {
    /// Enqueued and not completed. Release when completing (the operation's effects happen
    /// before), Acquire when a host call reads it.
    count: AtomicU64,
    lock: Mutex<()>,
    done: Condvar,
}

impl PendingStreamOps {
    pub(crate) fn enqueued(&self) {
        // Relaxed: only the completion's decrement publishes anything.
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn completed(&self) {
        // Release: the operation's effects happen before a host call that sees the count drop.
        if self.count.fetch_sub(1, Ordering::Release) == 1 {
            // The lock orders this notification after a waiter's check of the count.
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.done.notify_all();
        }
    }

    /// Returns once no stream operation is pending (at once on a stream's own thread), or
    /// `Error::Timeout` after `timeout` naming `op`, the group and how many were pending.
    #[inline]
    pub(crate) fn settle(&self, rank: Rank, op: &str, group: &[Rank], timeout: Duration) -> Result<()> {
        // Acquire: pairs with `completed`.
        if self.count.load(Ordering::Acquire) == 0 || on_executor_thread() {
            return Ok(());
        }
        self.settle_slow(rank, op, group, timeout)
    }

    #[cold]
    fn settle_slow(&self, rank: Rank, op: &str, group: &[Rank], timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Acquire: as in `settle`.
            let left = self.count.load(Ordering::Acquire);
            if left == 0 {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Timeout(Box::new(TimeoutError::new(
                    rank,
                    format!("{op} (a host call waiting for this rank's stream operations on its group)"),
                    Some(group.to_vec()),
                    "this rank's streams".into(),
                    "every stream operation this rank enqueued on the group to complete".into(),
                    format!("{left} still pending"),
                    Vec::new(),
                    waited,
                ))));
            }
            g = self.done.wait_timeout(g, timeout - waited).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}
