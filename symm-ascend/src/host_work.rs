//! Host work in stream order: what an ACL host callback runs for
//! [`StreamBackend::enqueue`](symm_core::stream::StreamBackend::enqueue) (the collectives'
//! stream forms, which run the host collective where the stream reaches them).
//!
//! The backend launches a blocking callback on the stream (`aclrtLaunchCallback`), whose data
//! is a boxed [`HostJob`]; the stream's callback thread ([`ascend_sys::safe::Reporter`]) runs
//! it once the stream's earlier work has completed, and the stream's later work waits until it
//! returns. The job runs the task, files its error under the operation's number (the event
//! after it reports it, as the contract says), and tells the group its stream operation is
//! over. This module is the part that needs no device: its tests run the jobs on the host.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use symm_core::stream::HostTask;
use symm_core::{Error, Group, Rank, Result};

/// How many failed operations' errors a stream keeps for their waits (the oldest go first).
const KEPT_FAILURES: usize = 4096;

/// The errors of a stream's failed host operations, by operation number.
#[derive(Debug, Default)]
pub struct Outcomes {
    failures: Mutex<BTreeMap<u64, Error>>,
}

impl Outcomes {
    /// Files the result of operation `seq`.
    pub fn file(&self, seq: u64, result: Result<()>) {
        if let Err(e) = result {
            let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            failures.insert(seq, e);
            if failures.len() > KEPT_FAILURES {
                failures.pop_first();
            }
        }
    }

    /// The result of completed operation `seq` (an operation that filed none succeeded).
    pub fn of(&self, seq: u64) -> Result<()> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.get(&seq).map_or(Ok(()), |e| Err(e.clone()))
    }
}

/// One enqueued host task, with what its completion must update.
pub struct HostJob<C> {
    /// The communicator handle the task runs with (kept alive until it has run).
    pub comm: C,
    pub task: HostTask<C>,
    /// The operation's name, in the error of a task that panicked.
    pub op: &'static str,
    /// The operation's number on its stream.
    pub seq: u64,
    pub stream_id: u32,
    pub rank: Rank,
    /// The group whose host calls wait for it (counted as enqueued by the caller).
    pub group: Option<Group>,
    pub outcomes: std::sync::Arc<Outcomes>,
}

impl<C> std::fmt::Debug for HostJob<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostJob")
            .field("op", &self.op)
            .field("seq", &self.seq)
            .field("stream_id", &self.stream_id)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl<C> HostJob<C> {
    /// Runs the task (a panic becomes its error, never an unwind into the device runtime),
    /// files its result and releases its group.
    pub fn run(self) {
        let HostJob { comm, task, op, seq, stream_id, rank, group, outcomes } = self;
        let result = catch_unwind(AssertUnwindSafe(|| task(&comm))).unwrap_or_else(|_| {
            Err(Error::System {
                rank,
                what: format!("{op} on stream {stream_id}"),
                source: std::io::Error::other("the operation panicked"),
            })
        });
        outcomes.file(seq, result);
        if let Some(g) = group {
            g.stream_op_completed();
        }
    }

    /// A job that will never run (its launch failed): releases its group.
    pub fn abandon(self) {
        if let Some(g) = self.group {
            g.stream_op_completed();
        }
    }
}

/// The callback ACL runs: `data` is a `Box<HostJob<C>>` made by `Box::into_raw`.
///
/// # Safety
/// `data` comes from `Box::into_raw(Box<HostJob<C>>)` and is passed here once.
pub unsafe extern "C" fn run_job<C>(data: *mut c_void) {
    // SAFETY: the contract: ownership of the box comes back here, once.
    let job = unsafe { Box::from_raw(data.cast::<HostJob<C>>()) };
    // `run` catches the task's panics; dropping the job's handles cannot unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(|| job.run()));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn job(
        task: HostTask<Arc<AtomicU32>>,
        seq: u64,
        group: Option<Group>,
        outcomes: &Arc<Outcomes>,
    ) -> HostJob<Arc<AtomicU32>> {
        HostJob {
            comm: Arc::new(AtomicU32::new(0)),
            task,
            op: "allreduce",
            seq,
            stream_id: 3,
            rank: Rank(1),
            group,
            outcomes: outcomes.clone(),
        }
    }

    fn group() -> Group {
        Group::new(2, Rank(1), &[Rank(0), Rank(1)], Ok(())).unwrap()
    }

    #[test]
    fn a_job_runs_its_task_with_the_handle_and_files_only_failures() {
        let outcomes = Arc::new(Outcomes::default());
        let seen = Arc::new(AtomicU32::new(0));
        let s = seen.clone();
        // Relaxed: read after the job has run on this thread.
        let task: HostTask<Arc<AtomicU32>> = Box::new(move |c| {
            s.store(c.load(Ordering::Relaxed) + 7, Ordering::Relaxed);
            Ok(())
        });
        job(task, 1, None, &outcomes).run();
        assert_eq!(seen.load(Ordering::Relaxed), 7);
        assert!(outcomes.of(1).is_ok());
        let failure = Error::Unsupported { rank: Rank(1), backend: "ascend", what: "a test failure".into() };
        let f = failure.clone();
        job(Box::new(move |_| Err(f)), 2, None, &outcomes).run();
        assert_eq!(outcomes.of(2).unwrap_err().to_string(), failure.to_string());
        // Each number reports its own operation's result only.
        assert!(outcomes.of(1).is_ok() && outcomes.of(3).is_ok());
    }

    #[test]
    fn a_panicking_task_is_an_error_of_its_operation() {
        let outcomes = Arc::new(Outcomes::default());
        job(Box::new(|_| panic!("boom")), 5, None, &outcomes).run();
        let e = outcomes.of(5).unwrap_err().to_string();
        assert!(e.contains("allreduce on stream 3") && e.contains("panicked") && e.contains("rank 1"), "{e}");
    }

    #[test]
    fn the_group_waits_for_the_job_and_not_after_it() {
        let outcomes = Arc::new(Outcomes::default());
        let g = group();
        g.stream_op_enqueued();
        let e = g.settle_streams(Rank(1), "barrier", Duration::from_millis(20)).unwrap_err();
        assert!(e.to_string().contains("barrier"), "{e}");
        job(Box::new(|_| Ok(())), 1, Some(g.clone()), &outcomes).run();
        g.settle_streams(Rank(1), "barrier", Duration::from_millis(20)).unwrap();
        // A job whose launch failed releases the group too.
        g.stream_op_enqueued();
        job(Box::new(|_| Ok(())), 2, Some(g.clone()), &outcomes).abandon();
        g.settle_streams(Rank(1), "barrier", Duration::from_millis(20)).unwrap();
    }

    #[test]
    fn the_callback_takes_the_box_back_and_runs_it_once() {
        let outcomes = Arc::new(Outcomes::default());
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let failure = Error::Unsupported { rank: Rank(1), backend: "ascend", what: "filed by the callback".into() };
        let task: HostTask<Arc<AtomicU32>> = Box::new(move |_| {
            // Relaxed: read after the callback has returned on this thread.
            r.fetch_add(1, Ordering::Relaxed);
            Err(failure)
        });
        let raw = Box::into_raw(Box::new(job(task, 9, None, &outcomes)));
        // SAFETY: a box made just above, passed once, as ACL would.
        unsafe { run_job::<Arc<AtomicU32>>(raw.cast()) };
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(outcomes.of(9).unwrap_err().to_string().contains("filed by the callback"));
    }

    #[test]
    fn old_failures_are_dropped_past_the_bound() {
        let outcomes = Outcomes::default();
        let e = Error::Unsupported { rank: Rank(0), backend: "ascend", what: "x".into() };
        for seq in 1..=(KEPT_FAILURES as u64 + 1) {
            outcomes.file(seq, Err(e.clone()));
        }
        assert!(outcomes.of(1).is_ok(), "the oldest is forgotten");
        assert!(outcomes.of(2).is_err() && outcomes.of(KEPT_FAILURES as u64 + 1).is_err());
    }
}
