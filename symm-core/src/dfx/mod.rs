//! Diagnostics (DFX): flight recorder, dumps, logging and per-operation statistics.
//!
//! - **Flight recorder** ([`recorder`]): the last `SYMM_FLIGHT_RECORDER_ENTRIES` (default 64)
//!   operations of every rank (op, group, sequence number in the group, element count, dtype,
//!   state, CLOCK_MONOTONIC start and end), kept by the backend in memory every rank of the node
//!   reads. [`dump`] prints the whole node's picture from any rank; [`records`] returns it as
//!   data. A wait that times out attaches the picture to its [`TimeoutError`] and logs it; with
//!   `SYMM_DUMP_ON_SIGNAL=1`, SIGUSR1 prints it to stderr ([`install_dump_on_signal`]).
//! - **Logging** ([`log`]): through the `log` facade, `SYMM_LOG_LEVEL`, one line per event.
//! - **Statistics** ([`stats`](fn@stats)): calls, bytes, time and errors per operation, resettable.
//!
//! Every recorded operation goes through [`start`] and [`finish`], which cost a few plain
//! stores into the ring and the statistics and a level check, plus, for a timed operation, two
//! clock reads ([`clock::now_ns`]: the time-stamp counter where it is invariant).
//!
//! # Timing (`SYMM_TIMING`, off by default)
//! Collectives and point-to-point calls ([`Op::timing_optional`]) are timed only with
//! [`TIMING_VAR`] on: then their records carry start and end and the statistics their time.
//! Off, such a call reads no clock unless it blocks: the two readings were a third of the
//! software of a small call (a 1-rank broadcast of 8 B), and small broadcasts and sendrecv
//! were at parity with MPI because of them. A call that stops spinning to wait stamps its
//! record with that moment ([`Started::blocked`]), so a dump still shows how long every
//! stuck operation has been waiting. The primitives (barrier, `wait_until`, alloc, free, and
//! the communicator's life) are always timed. PyTorch's NCCL flight recorder makes the same
//! choice: durations only with `TORCH_NCCL_ENABLE_TIMING`.

pub mod clock;
pub mod log;
pub mod recorder;
mod signal;
pub mod stats;

use std::fmt::Write as _;

pub use log::{log_level, set_log_level, Level, LOG_LEVEL_VAR};
pub use recorder::{FlightRecord, FlightRing, RankRecords, RecordStart, RecordState, ENTRIES_VAR};
pub use signal::{
    current_generation, dump_all, install_dump_on, install_dump_on_signal, install_dump_on_signal_from_env,
    install_dump_on_signal_logged, process_generation, register, DumpSource, Registration, DUMP_ON_SIGNAL_VAR,
};
pub use stats::{OpStats, StatsTable};

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result, TimeoutError};
use crate::group::Group;
use crate::rank::Rank;
use crate::symm_log;

macro_rules! ops {
    ($($(#[$m:meta])* $v:ident = $code:literal, $name:literal;)*) => {
        /// The operations the flight recorder and the statistics know. The codes are stored in
        /// shared memory: stable, never reused.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Op { $($(#[$m])* $v = $code,)* }

        impl Op {
            /// Every operation, in code order.
            pub const ALL: &'static [Op] = &[$(Op::$v),*];
            /// Number of operations.
            pub const COUNT: usize = Op::ALL.len();

            /// The name used in messages, dumps and statistics.
            pub const fn name(self) -> &'static str {
                match self { $(Op::$v => $name,)* }
            }

            /// The operation of a stored code.
            pub fn from_code(code: u8) -> Option<Op> {
                match code { $($code => Some(Op::$v),)* _ => None }
            }
        }
    };
}

ops! {
    /// The communicator started.
    Init = 1, "init";
    /// The communicator was dropped (closed).
    Close = 2, "close";
    /// The process exited with the communicator open.
    Exit = 3, "exit";
    /// `barrier`.
    Barrier = 4, "barrier";
    /// `wait_until`.
    WaitUntil = 5, "wait_until";
    /// `alloc`.
    Alloc = 6, "alloc";
    /// `free`.
    Free = 7, "free";
    /// `allreduce` (both forms).
    AllReduce = 8, "allreduce";
    /// `reduce_scatter`.
    ReduceScatter = 9, "reduce_scatter";
    /// `allgather`.
    AllGather = 10, "allgather";
    /// `alltoall` (both forms).
    AllToAll = 11, "alltoall";
    /// `broadcast`.
    Broadcast = 12, "broadcast";
    /// `send`.
    Send = 13, "send";
    /// `recv`.
    Recv = 14, "recv";
    /// `sendrecv`.
    SendRecv = 15, "sendrecv";
}

impl Op {
    /// Whether the operation is timed only when timing is on (see "Timing" in the module
    /// documentation): the collectives and point-to-point calls.
    pub const fn timing_optional(self) -> bool {
        matches!(
            self,
            Op::AllReduce
                | Op::ReduceScatter
                | Op::AllGather
                | Op::AllToAll
                | Op::Broadcast
                | Op::Send
                | Op::Recv
                | Op::SendRecv
        )
    }

    /// The code stored in records.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Row of the statistics table.
    pub(crate) const fn index(self) -> usize {
        self as usize - 1
    }
}

/// CLOCK_MONOTONIC in nanoseconds: comparable between the processes of one host.
#[inline]
pub fn monotonic_ns() -> u64 {
    // Served by the vDSO (no system call).
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An operation about to run, as the hooks see it.
#[derive(Clone, Copy, Debug)]
pub struct OpEvent<'a> {
    /// The operation.
    pub op: Op,
    /// Its group.
    pub group: Option<&'a Group>,
    /// Its sequence number in the group (0: none).
    pub seq: u64,
    /// Elements of the caller's buffer.
    pub count: u64,
    /// Their dtype.
    pub dtype: Option<DType>,
    /// Payload bytes for the statistics.
    pub bytes: u64,
}

/// A started operation (returned by [`start`], consumed by [`finish`]; a copy goes to the
/// call's waits, for [`Started::blocked`]).
///
/// Two words, so that it comes back from [`start`] in registers: returned through memory, a
/// record the caller copies at once is read with loads wider than the stores that wrote it,
/// which the processor cannot forward (the copy waits until the stores reach the cache: the
/// largest stall of a small call). The ring is looked up again where the record is used.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Started {
    /// The operation's record in its rank's ring; [`Started::NO_RECORD`] without a recorder.
    index: u64,
    /// When the operation started; 0 when it is untimed (see [`start`], which keeps a timed
    /// start at 1 or more whatever the clock reads).
    start_ns: u64,
}

impl Started {
    /// The index of an operation without a flight record.
    const NO_RECORD: u64 = u64::MAX;

    /// No operation: nothing to record (a context outside a call).
    pub const NONE: Started = Started { index: Started::NO_RECORD, start_ns: 0 };

    /// Called by a wait of the operation that stops spinning to block (`b`: the backend given
    /// to [`start`]; another's ring would take the stamp): an untimed record learns the
    /// moment (the first time only: later waits of the call read no clock; a timed record has
    /// its start already).
    #[inline]
    pub fn blocked<B: Backend + ?Sized>(&self, b: &B) {
        if self.start_ns == 0 && self.index != Started::NO_RECORD {
            if let Some(ring) = b.flight_ring(b.rank()) {
                ring.blocked(self.index, clock::now_ns);
            }
        }
    }
}

/// Whether `b` times operation `op` (see "Timing" in the module documentation): someone uses
/// the time (the recorder, the statistics, or the debug log), and `op` is always timed or
/// timing is on. The log level does not turn timing on: it is process-wide, and the records
/// and statistics of one communicator must not depend on it.
#[inline]
fn timed<B: Backend + ?Sized>(b: &B, op: Op, recording: bool) -> bool {
    let used = recording || b.op_stats().is_some() || Level::Debug <= ::log::max_level();
    used && (b.timing() || !op.timing_optional())
}

/// Records the start of `ev` on `b`'s rank.
#[inline]
pub fn start<B: Backend + ?Sized>(b: &B, ev: &OpEvent<'_>) -> Started {
    let ring = b.flight_ring(b.rank());
    let timed = timed(b, ev.op, ring.is_some());
    let start_ns = if timed { clock::now_ns().max(1) } else { 0 };
    let index = ring.map_or(Started::NO_RECORD, |ring| {
        ring.begin(&RecordStart {
            op: ev.op,
            group: ev.group,
            seq: ev.seq,
            count: ev.count,
            dtype: ev.dtype,
            timed,
            start_ns,
        })
    });
    symm_log!(Level::Trace, b.rank(), "{} started", describe(ev));
    Started { index, start_ns }
}

/// Records the end of `ev` (started by [`start`] on `b`, the same backend) with outcome `r`:
/// ring, statistics, log; a timeout gets the node's flight-recorder picture attached (and
/// logged).
#[inline]
pub fn finish<B: Backend + ?Sized, T>(b: &B, ev: &OpEvent<'_>, s: Started, r: &mut Result<T>) {
    let timed = s.start_ns != 0;
    let end_ns = if timed { clock::now_ns() } else { 0 };
    if let Err(Error::Timeout(t)) = r {
        // Before this rank's own record is marked failed: the picture shows it still waiting.
        attach_flight(b, t);
    }
    let state = if r.is_ok() { RecordState::Completed } else { RecordState::Failed };
    if s.index != Started::NO_RECORD {
        if let Some(ring) = b.flight_ring(b.rank()) {
            ring.finish(s.index, state, s.start_ns, end_ns);
        }
    }
    let took = end_ns.saturating_sub(s.start_ns);
    if let Some(t) = b.op_stats() {
        t.add(ev.op, ev.bytes, took, r.is_err());
    }
    match r {
        Ok(_) if timed => {
            symm_log!(Level::Debug, b.rank(), "{} completed in {:.3} us", describe(ev), took as f64 / 1e3)
        }
        Ok(_) => symm_log!(Level::Debug, b.rank(), "{} completed (untimed)", describe(ev)),
        Err(e) => failed(b, ev, e),
    }
}

/// Runs `f` as operation `ev`: [`start`], `f`, [`finish`].
#[inline]
pub fn traced<B: Backend + ?Sized, T>(b: &B, ev: &OpEvent<'_>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let s = start(b, ev);
    let mut r = f();
    finish(b, ev, s, &mut r);
    r
}

/// Counts and logs an operation that failed before it started (nothing recorded in the ring).
pub fn refused<B: Backend + ?Sized>(b: &B, ev: &OpEvent<'_>, e: &Error) {
    if let Some(t) = b.op_stats() {
        t.add_rejected(ev.op);
    }
    failed(b, ev, e);
}

#[cold]
fn failed<B: Backend + ?Sized>(b: &B, ev: &OpEvent<'_>, e: &Error) {
    // A wait_until that times out breaks nothing (signals are monotonic; the caller may wait
    // again, or polls with a short bound on purpose): a warning without the dump. Every other
    // timeout, and a lost or exited peer, leaves the group unusable: an error, with the dump.
    let fatal = match e {
        Error::Timeout(_) => ev.op != Op::WaitUntil,
        Error::PeerLost { .. } | Error::PeerExited { .. } => true,
        _ => false,
    };
    let level = if fatal { Level::Error } else { Level::Warn };
    symm_log!(level, b.rank(), "{} failed ({}): {e}", describe(ev), e.code());
    if let (Error::Timeout(t), true) = (e, fatal) {
        if let Some(d) = &t.flight_dump {
            symm_log!(Level::Error, b.rank(), "flight recorder at the timeout:\n{d}");
        }
    }
}

/// `allreduce #3 in group [0, 1] (count 2 float32)`.
fn describe(ev: &OpEvent<'_>) -> String {
    let mut s = ev.op.name().to_string();
    if ev.seq > 0 {
        let _ = write!(s, " #{}", ev.seq);
    }
    if let Some(g) = ev.group {
        let _ = write!(s, " in group {:?}", g.ranks());
    }
    match ev.dtype {
        Some(d) => {
            let _ = write!(s, " (count {} {d})", ev.count);
        }
        None if ev.count > 0 => {
            let _ = write!(s, " (count {})", ev.count);
        }
        None => {}
    }
    s
}

/// Adds the node's flight-recorder picture to a timeout (once).
fn attach_flight<B: Backend + ?Sized>(b: &B, t: &mut TimeoutError) {
    if t.flight_dump.is_some() {
        return;
    }
    let Ok(all) = records(b) else { return };
    let now = monotonic_ns();
    let group = t.group.clone();
    let mut parts = Vec::new();
    for rr in &all {
        if group.as_ref().is_some_and(|g| !g.contains(&rr.rank)) {
            continue;
        }
        let text = match rr.records.last() {
            Some(r) => format!("rank {}: {}", rr.rank, short(r, now)),
            None => format!("rank {}: nothing recorded", rr.rank),
        };
        parts.push(text);
    }
    t.flight_summary = Some(parts.join("; "));
    t.flight_dump = Some(format_dump(b.rank(), &all, now));
}

/// `allreduce #7 [0, 1, 2] started 2.001 s ago (running)`.
fn short(r: &FlightRecord, now: u64) -> String {
    let mut s = r.op.to_string();
    if r.seq > 0 {
        let _ = write!(s, " #{}", r.seq);
    }
    if r.group_id != 0 {
        let _ = write!(s, " in group {}", r.group_text());
    }
    let ago = |t: u64| now.saturating_sub(t) as f64 / 1e9;
    let _ = match (r.state, r.timed, r.start_ns) {
        (RecordState::Started, true, t) => write!(s, " started {:.3} s ago, not finished", ago(t)),
        (RecordState::Started, false, 0) => write!(s, " not finished"),
        (RecordState::Started, false, t) => write!(s, " waiting for {:.3} s, not finished", ago(t)),
        (st, true, _) => write!(s, " {} {:.3} s ago", st.name(), ago(r.end_ns)),
        (st, false, _) => write!(s, " {}", st.name()),
    };
    s
}

/// The flight-recorder records of every rank on the caller's node (the caller's first).
pub fn records<B: Backend + ?Sized>(b: &B) -> Result<Vec<RankRecords>> {
    let me = b.rank();
    let Some(mine) = b.flight_ring(me) else {
        return Err(Error::Unsupported {
            rank: me,
            backend: b.backend_name(),
            what: format!("the flight recorder (or it is off: {ENTRIES_VAR}=0)"),
        });
    };
    let mut out = vec![mine.snapshot(me)];
    for r in (0..b.world_size() as u32).map(Rank).filter(|&r| r != me) {
        if let Some(ring) = b.flight_ring(r) {
            out.push(ring.snapshot(r));
        }
    }
    out[1..].sort_by_key(|r| r.rank);
    Ok(out)
}

/// The node-wide flight-recorder dump as text (what SIGUSR1 and timeouts print).
pub fn dump<B: Backend + ?Sized>(b: &B) -> String {
    match records(b) {
        Ok(all) => format_dump(b.rank(), &all, monotonic_ns()),
        Err(e) => format!("symm flight recorder unavailable: {e}\n"),
    }
}

/// Formats records of the ranks of a node; `now` is CLOCK_MONOTONIC nanoseconds.
pub fn format_dump(me: Rank, all: &[RankRecords], now: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "symm flight recorder, node of rank {me}: {} rank(s), times in s of CLOCK_MONOTONIC (now {:.6}); \
         untimed operations (SYMM_TIMING off) show when they blocked",
        all.len(),
        now as f64 / 1e9
    );
    let mut sorted: Vec<&RankRecords> = all.iter().collect();
    sorted.sort_by_key(|r| r.rank);
    for rr in sorted {
        let status = if rr.pid == 0 {
            "no recorder".to_string()
        } else if process_alive(rr.pid) {
            format!("pid {} alive", rr.pid)
        } else {
            format!("pid {} gone", rr.pid)
        };
        let _ = writeln!(
            s,
            "rank {} ({status}): last {} of {} operation(s){}",
            rr.rank,
            rr.records.len(),
            rr.total,
            if rr.unreadable > 0 { format!(", {} being written", rr.unreadable) } else { String::new() }
        );
        for r in &rr.records {
            let seq = if r.seq > 0 { format!("#{}", r.seq) } else { "-".into() };
            let what = match (r.dtype, r.count) {
                (Some(d), c) => format!("{c} x {d}"),
                (None, 0) => "-".into(),
                (None, c) => c.to_string(),
            };
            let group = if r.group_id == 0 { "-".into() } else { r.group_text() };
            let secs = |ns: u64| ns as f64 / 1e9;
            let timing = match (r.state, r.timed, r.start_ns) {
                (RecordState::Started, true, t) => {
                    format!("start {:.6} running for {:.6}", secs(t), secs(now - t.min(now)))
                }
                (_, true, t) => format!("start {:.6} took {:.6}", secs(t), secs(r.end_ns.saturating_sub(t))),
                (_, false, 0) => "untimed".to_string(),
                (RecordState::Started, false, t) => {
                    format!("blocked at {:.6}, waiting for {:.6}", secs(t), secs(now - t.min(now)))
                }
                (_, false, t) => format!("blocked at {:.6}, untimed", secs(t)),
            };
            let _ = writeln!(
                s,
                "  [{:>5}] {:<14} group {:<14} seq {:<6} {:<18} {:<9} {timing}",
                r.index,
                r.op,
                group,
                seq,
                what,
                r.state.name(),
            );
        }
    }
    s
}

/// Whether process `pid` is running: it exists and is not a zombie (a rank that died but was
/// not reaped yet by its launcher is dead for its peers). Only meaningful on the same host.
pub fn process_alive(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    // Signal 0 only checks for existence and permission: EPERM means someone else's process.
    let exists = matches!(rustix::process::test_kill_process(p), Ok(()) | Err(rustix::io::Errno::PERM));
    // The state is the field after the parenthesised command name in /proc/<pid>/stat.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
        .unwrap_or(false);
    exists && !zombie
}

/// The per-operation statistics of `b` (empty when the backend keeps none).
pub fn stats<B: Backend + ?Sized>(b: &B) -> Vec<OpStats> {
    b.op_stats().map(StatsTable::read).unwrap_or_default()
}

/// Resets the per-operation statistics of `b`.
pub fn reset_stats<B: Backend + ?Sized>(b: &B) {
    if let Some(t) = b.op_stats() {
        t.reset();
    }
}

/// The number of flight-recorder records per rank from `SYMM_FLIGHT_RECORDER_ENTRIES` (default
/// 64, 0 disables the recorder); an invalid value is an error naming the variable.
pub fn entries_from_env() -> std::result::Result<usize, String> {
    crate::config::Config::from_lookup(&only(ENTRIES_VAR)).map(|c| c.recorder_entries).map_err(|e| e.to_string())
}

/// The process environment's value of `var` alone (the others read as unset), to parse one
/// variable with [`Config`](crate::config::Config)'s parsers.
fn only(var: &'static str) -> impl Fn(&str) -> Option<String> {
    move |name: &str| if name == var { crate::config::environment(name) } else { None }
}

/// The environment variable that turns the per-operation statistics off (`0`, `false`, `no`,
/// `off`; on by default).
pub const STATS_VAR: &str = crate::config::STATS.name;

/// Whether `SYMM_STATS` leaves the statistics on (the default); an invalid value is an error
/// naming the variable.
pub fn stats_from_env() -> std::result::Result<bool, String> {
    switch_setting(&crate::config::STATS, crate::config::environment(STATS_VAR).as_deref(), true)
}

/// What value `value` of on/off variable `var` asks for (`None`: unset, `default`); an invalid
/// value is an error naming the variable.
fn switch_setting(var: &crate::config::Var, value: Option<&str>, default: bool) -> std::result::Result<bool, String> {
    crate::config::read(&|_| value.map(str::to_string), var, crate::config::parse_switch)
        .map(|b| b.unwrap_or(default))
        .map_err(|e| e.to_string())
}

/// An on/off environment value: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case,
/// surrounding blanks ignored); `None` for anything else.
pub fn switch(value: &str) -> Option<bool> {
    crate::config::parse_switch(value).ok()
}

/// The environment variable that times every collective and point-to-point call (`1`, `true`,
/// `yes`, `on`; off by default: see "Timing" in the module documentation).
pub const TIMING_VAR: &str = crate::config::TIMING.name;

/// Whether `SYMM_TIMING` asks for timing; an invalid value is an error naming the variable.
pub fn timing_from_env() -> std::result::Result<bool, String> {
    switch_setting(&crate::config::TIMING, crate::config::environment(TIMING_VAR).as_deref(), false)
}

/// The environment variable that turns on cross-rank validation of every collective.
pub const VALIDATE_VAR: &str = crate::config::VALIDATE.name;

/// Whether `SYMM_VALIDATE` asks for validation (`1`, `true`, `yes`, `on`). A value that is not
/// an on/off value reads as off here; a communicator's start-up refuses it.
pub fn validate_from_env() -> bool {
    crate::config::environment(VALIDATE_VAR).is_some_and(|v| switch(&v) == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_is_not_alive() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0) && !process_alive(u32::MAX));
        let mut running = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(process_alive(running.id()));
        running.kill().unwrap();
        // Not reaped yet: a zombie until `wait`, which `kill(pid, 0)` alone still finds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process_alive(running.id()) {
            assert!(std::time::Instant::now() < deadline, "a killed, unreaped child stays alive");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", running.id())).unwrap();
        assert!(stat.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'), "{stat}");
        running.wait().unwrap();
        assert!(!process_alive(running.id()));
    }

    #[test]
    fn the_statistics_switch_reads_its_spellings_and_names_itself_when_wrong() {
        assert_eq!(switch_setting(&crate::config::STATS, None, true), Ok(true));
        for on in ["1", "true", "YES", " on "] {
            assert_eq!(switch_setting(&crate::config::STATS, Some(on), true), Ok(true), "{on}");
        }
        for off in ["0", "false", "No", "OFF"] {
            assert_eq!(switch_setting(&crate::config::STATS, Some(off), true), Ok(false), "{off}");
        }
        let e = switch_setting(&crate::config::STATS, Some("maybe"), true).unwrap_err();
        assert!(e.contains("SYMM_STATS") && e.contains("maybe"), "{e}");
    }

    #[test]
    fn timing_is_off_unless_asked_for_and_names_itself_when_wrong() {
        assert_eq!(switch_setting(&crate::config::TIMING, None, false), Ok(false));
        assert_eq!(switch_setting(&crate::config::TIMING, Some(" On "), false), Ok(true));
        assert_eq!(switch_setting(&crate::config::TIMING, Some("0"), false), Ok(false));
        let e = switch_setting(&crate::config::TIMING, Some("always"), false).unwrap_err();
        assert!(e.contains("SYMM_TIMING") && e.contains("always"), "{e}");
        assert!(Op::Broadcast.timing_optional() && Op::SendRecv.timing_optional());
        assert!(!Op::Barrier.timing_optional() && !Op::WaitUntil.timing_optional() && !Op::Init.timing_optional());
    }

    #[test]
    fn op_codes_are_stable_and_round_trip() {
        for (i, &op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.code() as usize, i + 1);
            assert_eq!(Op::from_code(op.code()), Some(op));
            assert_eq!(op.index(), i);
        }
        assert_eq!(Op::from_code(0), None);
        assert_eq!(Op::AllReduce.code(), 8);
        assert_eq!(Op::Recv.code(), 14);
    }

    #[test]
    fn the_dump_names_ranks_ops_groups_and_states() {
        let rec = |index, op, seq, state, end_ns| FlightRecord {
            index,
            op,
            group_id: 7,
            group_size: 2,
            group_ranks: Some(vec![Rank(0), Rank(1)]),
            seq,
            count: 4,
            dtype: Some(DType::F32),
            state,
            timed: true,
            start_ns: 1_000_000_000,
            end_ns,
        };
        let untimed = |index, seq, state, start_ns| FlightRecord {
            timed: false,
            start_ns,
            end_ns: 0,
            ..rec(index, "sendrecv", seq, state, 0)
        };
        let all = vec![
            RankRecords {
                rank: Rank(1),
                pid: std::process::id(),
                total: 9,
                records: vec![rec(8, "allreduce", 3, RecordState::Started, 0)],
                unreadable: 0,
            },
            RankRecords {
                rank: Rank(0),
                pid: std::process::id(),
                total: 4,
                records: vec![
                    rec(1, "allreduce", 2, RecordState::Completed, 1_500_000_000),
                    untimed(2, 1, RecordState::Completed, 0),
                    untimed(3, 2, RecordState::Started, 2_500_000_000),
                ],
                unreadable: 0,
            },
        ];
        let text = format_dump(Rank(1), &all, 3_000_000_000);
        let rank0 = text.find("rank 0 (pid").unwrap();
        let rank1 = text.find("rank 1 (pid").unwrap();
        assert!(rank0 < rank1, "{text}");
        assert!(text.contains("last 1 of 9 operation(s)"), "{text}");
        assert!(text.contains("allreduce") && text.contains("[0, 1]") && text.contains("#3"), "{text}");
        assert!(text.contains("started") && text.contains("running for 2.000000"), "{text}");
        assert!(text.contains("completed") && text.contains("took 0.500000"), "{text}");
        assert!(text.contains("4 x float32"), "{text}");
        let line = |index: &str| text.lines().find(|l| l.contains(index)).unwrap_or_default().to_string();
        assert!(line("[    2]").ends_with("completed untimed"), "{text}");
        assert!(line("[    3]").ends_with("started   blocked at 2.500000, waiting for 0.500000"), "{text}");
        assert_eq!(
            short(&all[1].records[2], 3_000_000_000),
            "sendrecv #2 in group [0, 1] waiting for 0.500 s, not finished"
        );
        assert_eq!(short(&all[1].records[1], 3_000_000_000), "sendrecv #1 in group [0, 1] completed");
    }
}
