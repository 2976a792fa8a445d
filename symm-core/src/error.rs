//! The error taxonomy: small enums by domain, composed into [`Error`].
//!
//! Every error a caller can see names the rank that raised it. Domain enums ([`ArgError`],
//! [`GroupError`], [`HeapError`]) are rank-free so that pure functions (parsers, validators) can
//! return them; the communicator attaches its rank when it turns them into an [`Error`].

use std::fmt;
use std::time::Duration;

use crate::rank::Rank;

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bad argument: detected on the calling rank before any peer memory is touched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A numeric or textual code that names nothing.
    #[error("unknown {what} {value:?}; accepted: {accepted}")]
    UnknownCode { what: &'static str, value: String, accepted: String },
    /// `offset + count` runs past the end of a buffer.
    #[error("{arg}: offset {offset} + count {count} exceeds the buffer's {len} elements")]
    OutOfBounds { arg: &'static str, offset: usize, count: usize, len: usize },
    /// A buffer holds another dtype than the operation needs.
    #[error("{arg}: dtype {actual} does not match {expected}")]
    DTypeMismatch { arg: &'static str, expected: String, actual: String },
    /// Any other invalid value.
    #[error("{arg} = {value}: {reason}")]
    Invalid { arg: &'static str, value: String, reason: String },
}

impl ArgError {
    /// An [`ArgError::Invalid`] from anything printable.
    pub fn invalid(arg: &'static str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        ArgError::Invalid { arg, value: value.to_string(), reason: reason.into() }
    }
}

/// A problem with a group or a rank inside it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// The caller is not a member of the group it passed.
    #[error("this rank is not a member of the group with global ranks {ranks:?}")]
    NotMember { ranks: Vec<Rank> },
    /// A group-local rank outside `0..size`.
    #[error("{arg} = {value} is outside the group of {size} ranks (global ranks {ranks:?})")]
    RankOutOfRange { arg: &'static str, value: i64, size: usize, ranks: Vec<Rank> },
    /// A rank list that is empty or repeats a rank.
    #[error("ranks = {ranks:?}: {reason}")]
    BadRankList { ranks: Vec<i64>, reason: &'static str },
    /// A group whose members are not all on this host.
    #[error("the group {ranks:?} spans hosts: ranks {remote:?} are not on the same host as rank {local_rank} ({host}); symmetric memory groups must lie on one node")]
    SpansHosts { ranks: Vec<Rank>, remote: Vec<Rank>, local_rank: Rank, host: String },
    /// The per-rank table of groups is full.
    #[error("too many groups: this rank already takes part in {limit} groups (the limit of the control area)")]
    TooManyGroups { limit: usize },
    /// A symmetric buffer used with a rank that did not take part in its allocation.
    #[error(
        "{arg}: the buffer was allocated in the group {alloc_ranks:?}, which does not contain global rank {target}"
    )]
    BufferNotOnRank { arg: &'static str, alloc_ranks: Vec<Rank>, target: Rank },
    /// A group whose collective state belongs to another engine than the caller's.
    #[error("the group {ranks:?} holds the collective state of {has}, not of {wanted}: one process drives a group with one collective engine")]
    OtherEngine { ranks: Vec<Rank>, has: &'static str, wanted: &'static str },
}

/// A problem with the symmetric heap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeapError {
    /// Not enough contiguous space free on every member of the group.
    #[error("symmetric heap exhausted: requested {requested} bytes in group {group:?}; the largest range free on every member is {largest_common_free} bytes, this rank has {free} of {heap_size} bytes free{} (raise SYMMETRIC_MEMORY_HEAP_SIZE)", awaiting_text(*.awaiting_reclaim))]
    Exhausted {
        requested: usize,
        group: Vec<Rank>,
        largest_common_free: usize,
        free: usize,
        heap_size: usize,
        /// Bytes of this rank's heap held by buffers it dropped (abandoned) that other members
        /// of their group still hold: they come back once those members drop them too.
        awaiting_reclaim: usize,
    },
    /// A request larger than the whole heap.
    #[error("symmetric heap too small: requested {requested} bytes in group {group:?}, but each rank's heap is {heap_size} bytes (raise SYMMETRIC_MEMORY_HEAP_SIZE)")]
    TooLarge { requested: usize, group: Vec<Rank>, heap_size: usize },
    /// Members asked for different sizes in the same collective allocation.
    #[error("allocation size mismatch in group {group:?}: bytes requested per global rank {sizes:?}; every member must allocate the same size")]
    SizeMismatch { group: Vec<Rank>, sizes: Vec<(Rank, usize)> },
    /// Members of a collective free named different allocations (or some freed while others
    /// allocated): nothing was freed or allocated, on any member.
    #[error("free mismatch in group {group:?}: requests per global rank {requests:?}; every member must free the same allocation, in the same order (nothing was freed)")]
    FreeMismatch { group: Vec<Rank>, requests: Vec<(Rank, String)> },
    /// Ranks started with different heap sizes.
    #[error("heap size differs between ranks: {sizes:?} (SYMMETRIC_MEMORY_HEAP_SIZE must be the same everywhere)")]
    HeapSizeMismatch { sizes: Vec<(Rank, usize)> },
    /// An invalid heap size setting.
    #[error("SYMMETRIC_MEMORY_HEAP_SIZE = {value:?}: {reason}")]
    BadHeapSize { value: String, reason: String },
    /// A buffer that does not belong to this communicator, or was freed.
    #[error("{arg}: the buffer does not belong to this communicator (allocated by another one or already freed)")]
    ForeignBuffer { arg: &'static str },
}

/// The clause of [`HeapError::Exhausted`] about dropped buffers that wait for other members.
fn awaiting_text(bytes: usize) -> String {
    if bytes == 0 {
        String::new()
    } else {
        format!(
            "; {bytes} bytes of this rank's heap are held by buffers it dropped that other members of their group \
             still hold (they come back at the group's next allocation once every member dropped them)"
        )
    }
}

/// A wait that ran out of time, with everything needed to find out why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutError {
    /// The rank that waited.
    pub rank: Rank,
    /// What was being waited for (`wait_until`, `barrier`, `alloc`, `allreduce (round 9)` ...).
    pub op: String,
    /// The group's global ranks, when the wait belongs to a group.
    pub group: Option<Vec<Rank>>,
    /// Where the awaited value lives (buffer, offset, byte address in the heap).
    pub location: String,
    /// The condition that never became true.
    pub condition: String,
    /// The value seen last.
    pub last_observed: String,
    /// Peers that had not arrived, when known.
    pub pending: Vec<Rank>,
    /// How long the rank waited.
    pub waited: Duration,
    /// The operation's sequence number in its group (collectives: the group's collective call
    /// number, the same on every member; send/recv: the caller's point-to-point call number).
    pub sequence: Option<u64>,
    /// Peers that had reached the awaited point (collectives), when known.
    pub arrived: Vec<Rank>,
    /// One line per local rank of the group: its latest flight-recorder record.
    pub flight_summary: Option<String>,
    /// The node-wide flight-recorder dump at the time of the timeout (also logged at error
    /// level).
    pub flight_dump: Option<String>,
}

impl TimeoutError {
    /// A timeout with the diagnostics known to a backend's wait (the layers above add the
    /// sequence number, arrived peers and the flight recorder).
    #[allow(clippy::too_many_arguments)] // the fields every wait knows, in the order printed
    pub fn new(
        rank: Rank,
        op: String,
        group: Option<Vec<Rank>>,
        location: String,
        condition: String,
        last_observed: String,
        pending: Vec<Rank>,
        waited: Duration,
    ) -> TimeoutError {
        TimeoutError {
            rank,
            op,
            group,
            location,
            condition,
            last_observed,
            pending,
            waited,
            sequence: None,
            arrived: Vec::new(),
            flight_summary: None,
            flight_dump: None,
        }
    }
}

impl fmt::Display for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: timed out after {:.3} s in {}", self.rank, self.waited.as_secs_f64(), self.op)?;
        if let Some(s) = self.sequence {
            write!(f, ", operation #{s} of the group")?;
        }
        if let Some(g) = &self.group {
            write!(f, " in group {g:?}")?;
        }
        write!(f, " waiting for {} at {}; last observed {}", self.condition, self.location, self.last_observed)?;
        if !self.arrived.is_empty() {
            write!(f, "; ranks arrived: {:?}", self.arrived)?;
        }
        if !self.pending.is_empty() {
            write!(f, "; ranks not arrived: {:?}", self.pending)?;
        }
        if let Some(s) = &self.flight_summary {
            write!(
                f,
                "; flight recorder (latest operation per rank): {s}; full node dump in TimeoutError::flight_dump, \
                 also logged at error level"
            )?;
        }
        write!(f, " (raise SYMMETRIC_MEMORY_TIMEOUT or the call's timeout if the peers are only slow)")
    }
}

impl std::error::Error for TimeoutError {}

/// How [`BootstrapError::Env`] shows the variable's value: ` = "value"`, or that it is unset.
fn shown_value(value: &Option<String>) -> String {
    match value {
        Some(v) => format!(" = {v:?}"),
        None => " is not set".into(),
    }
}

/// A failure during start-up: exchanging addresses and mapping peers' heaps.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// A required environment variable is missing or malformed.
    #[error("environment variable {var}{}: {reason}", shown_value(.value))]
    Env { var: &'static str, value: Option<String>, reason: String },
    /// The rendezvous or a peer could not be reached in time.
    #[error("{what} did not complete within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A peer sent something this version does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A start-up record failed authentication until the deadline: someone other than the
    /// job's ranks wrote it (or a rank runs with another job secret).
    #[error("start-up record {key:?} was rejected: {reason}; see SYMM_JOB_SECRET in docs/errors.md")]
    Forged { key: String, reason: String },
    /// A peer's start-up failed (it published its error in the store).
    #[error("a peer failed during start-up: {reason}")]
    PeerFailed { reason: String },
    /// The store refused a request (too large, too many connections, or not authenticated).
    #[error("the start-up store refused {what}: {reason}")]
    Refused { what: String, reason: String },
}

/// Every error of the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument, detected on the calling rank.
    #[error("rank {rank}: invalid argument: {source}")]
    InvalidArgument {
        rank: Rank,
        #[source]
        source: ArgError,
    },
    /// A group problem.
    #[error("rank {rank}: {source}")]
    Group {
        rank: Rank,
        #[source]
        source: GroupError,
    },
    /// A heap problem.
    #[error("rank {rank}: {source}")]
    Heap {
        rank: Rank,
        #[source]
        source: HeapError,
    },
    /// A bounded wait expired.
    #[error(transparent)]
    Timeout(Box<TimeoutError>),
    /// A peer process ended while this rank depended on it.
    #[error("rank {rank}: peer rank {peer} was lost during {op}: {detail}")]
    PeerLost { rank: Rank, peer: Rank, op: String, detail: String },
    /// A peer ended on purpose (dropped its communicator, or its process exited normally) while
    /// this rank still depended on it.
    #[error("rank {rank}: peer rank {peer} has shut down ({detail}) while this rank waited for it in {op}; every member must take part in every operation of its groups before it closes its communicator")]
    PeerExited { rank: Rank, peer: Rank, op: String, detail: String },
    /// Two threads of one rank drove the same group at the same time.
    #[error("rank {rank}: {op}: group {group:?} is already in use by another thread of this rank ({busy}); the operations of one group must be called from one thread at a time")]
    ConcurrentUse { rank: Rank, op: String, group: Vec<Rank>, busy: String },
    /// Members of a group called a collective with arguments that do not agree.
    #[error("rank {rank}: {op}: arguments differ between ranks: global rank {peer} called it with {theirs}, this rank with {mine}")]
    Mismatch { rank: Rank, op: String, peer: Rank, mine: String, theirs: String },
    /// A peer rejected its own arguments for a collective this rank joined.
    #[error("rank {rank}: {op}: global rank {peer} rejected its arguments (see the error on that rank); nothing was exchanged")]
    PeerRejected { rank: Rank, op: String, peer: Rank },
    /// Start-up failed.
    #[error("rank {rank}: bootstrap failed: {source}")]
    Bootstrap {
        rank: Rank,
        #[source]
        source: BootstrapError,
    },
    /// A capability the backend does not offer.
    #[error("rank {rank}: {what} is not supported by the {backend} backend")]
    Unsupported { rank: Rank, backend: &'static str, what: String },
    /// A call into a device's runtime (ACL, SHMEM, the operators) failed: `what` names the call
    /// and what it was for, `detail` the library's code and message.
    #[error("rank {rank}: {backend} backend: {what}: {detail}")]
    Device { rank: Rank, backend: &'static str, what: String, detail: String },
    /// An operating-system call failed at run time.
    #[error("rank {rank}: {what}: {source}")]
    System {
        rank: Rank,
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// A copy of an I/O error: its kind and message (the OS error code becomes part of the text).
fn copy_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// A copy for each waiter of an operation that failed once (an asynchronous operation's error
/// reaches every wait on it and on later work of its stream); I/O sources keep their kind and
/// message.
impl Clone for BootstrapError {
    fn clone(&self) -> Self {
        match self {
            BootstrapError::Env { var, value, reason } => {
                BootstrapError::Env { var, value: value.clone(), reason: reason.clone() }
            }
            BootstrapError::Timeout { what, timeout } => {
                BootstrapError::Timeout { what: what.clone(), timeout: *timeout }
            }
            BootstrapError::Io { what, source } => BootstrapError::Io { what: what.clone(), source: copy_io(source) },
            BootstrapError::Protocol(p) => BootstrapError::Protocol(p.clone()),
            BootstrapError::Forged { key, reason } => {
                BootstrapError::Forged { key: key.clone(), reason: reason.clone() }
            }
            BootstrapError::PeerFailed { reason } => BootstrapError::PeerFailed { reason: reason.clone() },
            BootstrapError::Refused { what, reason } => {
                BootstrapError::Refused { what: what.clone(), reason: reason.clone() }
            }
        }
    }
}

/// As for [`BootstrapError`]: a copy per waiter, I/O sources by kind and message.
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::InvalidArgument { rank, source } => Error::InvalidArgument { rank: *rank, source: source.clone() },
            Error::Group { rank, source } => Error::Group { rank: *rank, source: source.clone() },
            Error::Heap { rank, source } => Error::Heap { rank: *rank, source: source.clone() },
            Error::Timeout(t) => Error::Timeout(t.clone()),
            Error::PeerLost { rank, peer, op, detail } => {
                Error::PeerLost { rank: *rank, peer: *peer, op: op.clone(), detail: detail.clone() }
            }
            Error::PeerExited { rank, peer, op, detail } => {
                Error::PeerExited { rank: *rank, peer: *peer, op: op.clone(), detail: detail.clone() }
            }
            Error::ConcurrentUse { rank, op, group, busy } => {
                Error::ConcurrentUse { rank: *rank, op: op.clone(), group: group.clone(), busy: busy.clone() }
            }
            Error::Mismatch { rank, op, peer, mine, theirs } => {
                Error::Mismatch { rank: *rank, op: op.clone(), peer: *peer, mine: mine.clone(), theirs: theirs.clone() }
            }
            Error::PeerRejected { rank, op, peer } => Error::PeerRejected { rank: *rank, op: op.clone(), peer: *peer },
            Error::Bootstrap { rank, source } => Error::Bootstrap { rank: *rank, source: source.clone() },
            Error::Unsupported { rank, backend, what } => {
                Error::Unsupported { rank: *rank, backend, what: what.clone() }
            }
            Error::Device { rank, backend, what, detail } => {
                Error::Device { rank: *rank, backend, what: what.clone(), detail: detail.clone() }
            }
            Error::System { rank, what, source } => {
                Error::System { rank: *rank, what: what.clone(), source: copy_io(source) }
            }
        }
    }
}

impl Error {
    /// Every code [`Error::code`] returns, in the order of `docs/errors.md`. Codes are stable:
    /// never renamed or reused; new kinds of errors get new codes.
    pub const CODES: &'static [&'static str] = &[
        "SYMM_E_INVALID_ARGUMENT",
        "SYMM_E_GROUP",
        "SYMM_E_HEAP",
        "SYMM_E_HEAP_EXHAUSTED",
        "SYMM_E_TIMEOUT",
        "SYMM_E_PEER_LOST",
        "SYMM_E_PEER_EXITED",
        "SYMM_E_MISMATCH",
        "SYMM_E_PEER_REJECTED",
        "SYMM_E_CONCURRENT_USE",
        "SYMM_E_BOOTSTRAP",
        "SYMM_E_UNSUPPORTED",
        "SYMM_E_SYSTEM",
        "SYMM_E_DEVICE",
    ];

    /// A stable, documented code for the kind of error (see `docs/errors.md`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "SYMM_E_INVALID_ARGUMENT",
            Error::Group { .. } => "SYMM_E_GROUP",
            Error::Heap { source: HeapError::Exhausted { .. } | HeapError::TooLarge { .. }, .. } => {
                "SYMM_E_HEAP_EXHAUSTED"
            }
            Error::Heap { .. } => "SYMM_E_HEAP",
            Error::Timeout(_) => "SYMM_E_TIMEOUT",
            Error::PeerLost { .. } => "SYMM_E_PEER_LOST",
            Error::PeerExited { .. } => "SYMM_E_PEER_EXITED",
            Error::ConcurrentUse { .. } => "SYMM_E_CONCURRENT_USE",
            Error::Mismatch { .. } => "SYMM_E_MISMATCH",
            Error::PeerRejected { .. } => "SYMM_E_PEER_REJECTED",
            Error::Bootstrap { .. } => "SYMM_E_BOOTSTRAP",
            Error::Unsupported { .. } => "SYMM_E_UNSUPPORTED",
            Error::System { .. } => "SYMM_E_SYSTEM",
            Error::Device { .. } => "SYMM_E_DEVICE",
        }
    }

    /// The rank that raised the error.
    pub fn rank(&self) -> Rank {
        match self {
            Error::InvalidArgument { rank, .. }
            | Error::Group { rank, .. }
            | Error::Heap { rank, .. }
            | Error::PeerLost { rank, .. }
            | Error::PeerExited { rank, .. }
            | Error::ConcurrentUse { rank, .. }
            | Error::Mismatch { rank, .. }
            | Error::PeerRejected { rank, .. }
            | Error::Bootstrap { rank, .. }
            | Error::Unsupported { rank, .. }
            | Error::Device { rank, .. }
            | Error::System { rank, .. } => *rank,
            Error::Timeout(t) => t.rank,
        }
    }
}

/// Attaches the calling rank to a rank-free domain error.
pub trait AtRank<T> {
    /// Turns the error into an [`Error`] raised by `rank`.
    fn at(self, rank: Rank) -> Result<T>;
}

macro_rules! at_rank {
    ($t:ty, $variant:ident) => {
        impl<T> AtRank<T> for std::result::Result<T, $t> {
            fn at(self, rank: Rank) -> Result<T> {
                self.map_err(|source| Error::$variant { rank, source })
            }
        }
    };
}

at_rank!(ArgError, InvalidArgument);
at_rank!(GroupError, Group);
at_rank!(HeapError, Heap);
at_rank!(BootstrapError, Bootstrap);

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant, so that a new variant without a listed code fails here.
    fn samples() -> Vec<Error> {
        let r = Rank(1);
        let t =
            TimeoutError::new(r, "barrier".into(), None, "x".into(), "y".into(), "0".into(), vec![], Duration::ZERO);
        vec![
            Error::InvalidArgument { rank: r, source: ArgError::invalid("x", 1, "bad") },
            Error::Group { rank: r, source: GroupError::NotMember { ranks: vec![] } },
            Error::Heap { rank: r, source: HeapError::ForeignBuffer { arg: "buf" } },
            Error::Heap { rank: r, source: HeapError::TooLarge { requested: 1, group: vec![], heap_size: 0 } },
            Error::Timeout(Box::new(t)),
            Error::PeerLost { rank: r, peer: Rank(0), op: "x".into(), detail: "x".into() },
            Error::PeerExited { rank: r, peer: Rank(0), op: "x".into(), detail: "x".into() },
            Error::ConcurrentUse { rank: r, op: "x".into(), group: vec![], busy: "x".into() },
            Error::Mismatch { rank: r, op: "x".into(), peer: Rank(0), mine: "a".into(), theirs: "b".into() },
            Error::PeerRejected { rank: r, op: "x".into(), peer: Rank(0) },
            Error::Bootstrap { rank: r, source: BootstrapError::Protocol("x".into()) },
            Error::Unsupported { rank: r, backend: "sim", what: "x".into() },
            Error::System { rank: r, what: "x".into(), source: std::io::Error::other("x") },
            Error::Device { rank: r, backend: "ascend", what: "x".into(), detail: "y".into() },
        ]
    }

    #[test]
    fn a_copy_says_the_same_and_has_the_same_code() {
        for e in samples() {
            let c = e.clone();
            assert_eq!((c.code(), c.to_string(), c.rank()), (e.code(), e.to_string(), e.rank()));
        }
    }

    #[test]
    fn every_code_is_listed_unique_and_documented() {
        let docs = include_str!("../../docs/errors.md");
        for e in samples() {
            assert!(Error::CODES.contains(&e.code()), "{} is not in Error::CODES", e.code());
            assert_eq!(e.rank(), Rank(1));
            assert!(e.to_string().contains("rank 1"), "{e}");
        }
        for (i, c) in Error::CODES.iter().enumerate() {
            assert!(!Error::CODES[..i].contains(c), "{c} twice");
            assert!(samples().iter().any(|e| e.code() == *c), "no variant gives {c}");
            assert!(docs.contains(&format!("## `{c}`")), "docs/errors.md has no section for {c}");
        }
    }
}
