//! The traits of `symm-core` for [`Comm`], forwarded to its variant.
//!
//! `enum_dispatch` cannot do this (it links a trait and an enum registered in one crate, and
//! these traits are `symm-core`'s), so one macro writes each method as a `match` on the
//! variant. Every method of every trait is listed, provided ones included: one left out would
//! run the trait's default instead of the backend's override (`tests/forwarding.rs` checks the
//! lists against the traits' sources).

use std::time::Duration;

use symm_core::backend::{DescribeWait, MemorySpace, SignalWidth};
use symm_core::coll::{CollOptions, Collectives};
use symm_core::config::Config;
use symm_core::dfx::{FlightRing, Op, StatsTable};
use symm_core::stream::{Event, HostTask, Stream, StreamBackend};
use symm_core::{
    ArgError, Backend, CmpOp, DType, Group, HostMapped, LocalMut, LocalRef, Rank, ReduceOp, Result, SignalOp,
};

use crate::comm::Comm;

/// The value of no backend (a build without one): uninhabited, so `Comm` is too.
#[cfg(not(any(feature = "sim", feature = "ascend")))]
#[derive(Debug)]
pub enum NoBackend {}

#[cfg(not(any(feature = "sim", feature = "ascend")))]
impl NoBackend {
    /// Whatever is asked of it: it has no value.
    pub fn never<T>(&self) -> T {
        match *self {}
    }
}

#[cfg(not(any(feature = "sim", feature = "ascend")))]
impl crate::comm::BackendControl for NoBackend {
    fn hosts(&self) -> &[String] {
        self.never()
    }

    fn heap_stats(&self) -> Result<symm_core::HeapStats> {
        self.never()
    }

    fn reference_cache(&self) -> Option<&symm_core::coll::by_reference::ReferenceCache> {
        self.never()
    }
}

/// `$body` with `$c` bound to the variant's backend.
macro_rules! on_backend {
    ($self:ident, $c:ident => $body:expr) => {
        match *$self {
            #[cfg(feature = "sim")]
            Comm::Sim(ref $c) => $body,
            #[cfg(feature = "ascend")]
            Comm::Ascend(ref $c) => $body,
            #[cfg(not(any(feature = "sim", feature = "ascend")))]
            Comm::Nothing(ref n) => n.never(),
        }
    };
}

/// Each method, forwarded: `fn` for safe methods, `unsafe fn` for unsafe ones (whose contract
/// is the variant's, unchanged).
macro_rules! forward {
    () => {};
    ($(#[$a:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?; $($rest:tt)*) => {
        $(#[$a])*
        #[inline]
        #[cfg_attr(not(any(feature = "sim", feature = "ascend")), allow(unused_variables))]
        fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
            on_backend!(self, c => c.$name($($arg),*))
        }
        forward!($($rest)*);
    };
    ($(#[$a:meta])* unsafe fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; $($rest:tt)*) => {
        $(#[$a])*
        #[inline]
        #[cfg_attr(not(any(feature = "sim", feature = "ascend")), allow(unused_variables))]
        unsafe fn $name(&self $(, $arg: $ty)*) -> $ret {
            on_backend!(self, c => {
                // SAFETY: the caller's contract for this method is the variant's: forwarded.
                unsafe { c.$name($($arg),*) }
            })
        }
        forward!($($rest)*);
    };
}

impl Backend for Comm {
    forward! {
        fn backend_name(&self) -> &'static str;
        fn rank(&self) -> Rank;
        fn world_size(&self) -> usize;
        fn instance_id(&self) -> u64;
        fn default_timeout(&self) -> Duration;
        fn world(&self) -> Group;
        fn group_of(&self, ranks: &[Rank]) -> Result<Group>;
        fn heap_size(&self) -> usize;
        fn check_process(&self) -> Result<()>;
        fn heap_alloc(&self, group: &Group, bytes: usize, timeout: Duration) -> Result<usize>;
        fn heap_free(&self, group: &Group, offset: usize, bytes: usize, timeout: Duration) -> Result<()>;
        fn heap_abandon(&self, group: &Group, offset: usize, bytes: usize);
        fn local_heap_base(&self) -> *mut u8;
        fn heap_space(&self) -> MemorySpace;
        unsafe fn copy_to_heap(&self, offset: usize, src: *const u8, bytes: usize) -> Result<()>;
        unsafe fn copy_from_heap(&self, offset: usize, dst: *mut u8, bytes: usize) -> Result<()>;
        fn settings(&self) -> Option<&Config>;
        unsafe fn put_bytes(&self, peer: Rank, dst_offset: usize, src: *const u8, bytes: usize) -> Result<()>;
        unsafe fn get_bytes(&self, peer: Rank, src_offset: usize, dst: *mut u8, bytes: usize) -> Result<()>;
        fn signal_at(&self, peer: Rank, offset: usize, width: SignalWidth, op: SignalOp, value: i64) -> Result<()>;
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
            value: i64
        ) -> Result<()>;
        fn wait_signal_at(
            &self,
            offset: usize,
            width: SignalWidth,
            cmp: CmpOp,
            value: i64,
            timeout: Duration,
            site: DescribeWait<'_>
        ) -> Result<i64>;
        fn fence(&self) -> Result<()>;
        fn quiet(&self) -> Result<()>;
        fn barrier_group(&self, group: &Group, timeout: Duration) -> Result<()>;
        fn signal_width(&self) -> SignalWidth;
        fn flight_ring(&self, rank: Rank) -> Option<FlightRing<'_>>;
        fn op_stats(&self) -> Option<&StatsTable>;
        fn timing(&self) -> bool;
    }
}

/// Peer pointers and the host engine's waits (the Python package's peer-pointer features need
/// them): a backend whose heap its peers do not map answers `None` and `Unsupported`.
impl HostMapped for Comm {
    forward! {
        fn peer_heap_base(&self, peer: Rank) -> Option<*mut u8>;
        fn waiters_share_cores(&self) -> bool;
        fn wait_any_signal_at(&self, words: &[(usize, i64)], timeout: Duration, site: DescribeWait<'_>) -> Result<usize>;
    }
}

impl Collectives for Comm {
    forward! {
        fn allreduce(&self, group: &Group, buf: LocalMut<'_>, op: ReduceOp, opts: &CollOptions) -> Result<()>;
        fn allreduce_into(
            &self,
            group: &Group,
            input: LocalRef<'_>,
            output: LocalMut<'_>,
            op: ReduceOp,
            opts: &CollOptions
        ) -> Result<()>;
        fn reduce_scatter(
            &self,
            group: &Group,
            output: LocalMut<'_>,
            input: LocalRef<'_>,
            op: ReduceOp,
            opts: &CollOptions
        ) -> Result<()>;
        fn allgather(&self, group: &Group, output: LocalMut<'_>, input: LocalRef<'_>, opts: &CollOptions) -> Result<()>;
        fn alltoall(
            &self,
            group: &Group,
            send: &[LocalRef<'_>],
            recv: LocalMut<'_>,
            recv_counts: &[usize],
            opts: &CollOptions
        ) -> Result<()>;
        fn alltoall_single(
            &self,
            group: &Group,
            send: LocalRef<'_>,
            send_counts: &[usize],
            recv: LocalMut<'_>,
            recv_counts: &[usize],
            opts: &CollOptions
        ) -> Result<()>;
        fn broadcast(&self, group: &Group, buf: LocalMut<'_>, root: usize, opts: &CollOptions) -> Result<()>;
        fn send(&self, group: &Group, buf: LocalRef<'_>, dst: usize, opts: &CollOptions) -> Result<()>;
        fn recv(&self, group: &Group, buf: LocalMut<'_>, src: usize, opts: &CollOptions) -> Result<()>;
        fn sendrecv(
            &self,
            group: &Group,
            send: LocalRef<'_>,
            dst: usize,
            recv: LocalMut<'_>,
            src: usize,
            opts: &CollOptions
        ) -> Result<()>;
        fn reject(&self, group: &Group, op: Op, e: ArgError) -> Result<()>;
    }
}

impl StreamBackend for Comm {
    forward! {
        fn create_stream(&self) -> Result<Stream>;
        unsafe fn adopt_stream(&self, raw: *mut std::ffi::c_void) -> Result<Stream>;
        fn record_event(&self, stream: &Stream) -> Result<Event>;
        fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()>;
        fn query_event(&self, event: &Event) -> Result<bool>;
        fn synchronize_event(&self, event: &Event, timeout: Duration) -> Result<()>;
        fn synchronize_stream(&self, stream: &Stream, timeout: Duration) -> Result<()>;
        unsafe fn put_bytes_on(
            &self,
            stream: &Stream,
            peer: Rank,
            dst_offset: usize,
            src: *const u8,
            bytes: usize
        ) -> Result<Event>;
        unsafe fn get_bytes_on(
            &self,
            stream: &Stream,
            peer: Rank,
            src_offset: usize,
            dst: *mut u8,
            bytes: usize
        ) -> Result<Event>;
        fn signal_at_on(
            &self,
            stream: &Stream,
            peer: Rank,
            offset: usize,
            width: SignalWidth,
            op: SignalOp,
            value: i64
        ) -> Result<Event>;
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
            value: i64
        ) -> Result<Event>;
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
            timeout: Duration
        ) -> Result<Event>;
        fn barrier_group_on(&self, stream: &Stream, group: &Group, timeout: Duration) -> Result<Event>;
        unsafe fn reduce_local(
            &self,
            dtype: DType,
            op: ReduceOp,
            srcs: &[*const u8],
            out: *mut u8,
            len: usize
        ) -> Result<()>;
        unsafe fn encode_local(&self, dtype: DType, lp: DType, data: *const u8, len: usize, run: *mut u8) -> Result<()>;
        unsafe fn reduce_encoded_local(
            &self,
            dtype: DType,
            lp: DType,
            op: ReduceOp,
            runs: &[*const u8],
            out: *mut u8,
            len: usize
        ) -> Result<()>;
    }

    /// The task gets a `Comm` of its own: the variant's stream runs it with the backend's
    /// handle for the stream, which it wraps (on the CPU backend, one more reference to the
    /// rank's shared state for the task's length).
    #[cfg_attr(not(any(feature = "sim", feature = "ascend")), allow(unused_variables))]
    fn enqueue(&self, stream: &Stream, op: &'static str, group: Option<&Group>, task: HostTask<Self>) -> Result<Event> {
        match *self {
            #[cfg(feature = "sim")]
            Comm::Sim(ref c) => c.enqueue(
                stream,
                op,
                group,
                Box::new(move |sim: &symm_sim::SimComm| task(&Comm::Sim(sim.task_handle()))),
            ),
            #[cfg(feature = "ascend")]
            Comm::Ascend(ref c) => c.enqueue(
                stream,
                op,
                group,
                Box::new(move |a: &symm_ascend::AscendComm| task(&Comm::Ascend(a.clone()))),
            ),
            #[cfg(not(any(feature = "sim", feature = "ascend")))]
            Comm::Nothing(ref n) => n.never(),
        }
    }
}
