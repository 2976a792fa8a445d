//! Streams of the CPU backend: each one an in-order queue of the rank's work, run by a progress
//! thread of its own (the contract is [`symm_core::stream`]'s).
//!
//! The thread takes the operations in the order they were enqueued and runs each with a handle
//! of the communicator: the host forms, with every wait bounded as on the host. An event is a
//! count of the stream's operations; it has completed once the thread has finished that many,
//! and reports the result of the operation it follows.
//!
//! `SYMM_STREAM_DELAY_US` makes the thread wait a random time up to that many microseconds
//! before each operation, so that tests see correctness come from ordering, not from timing.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use symm_core::stream::{self as contract, Event, HostTask, Stream};
use symm_core::{Error, Group, Rank, Result, TimeoutError};

/// An operation waiting in a stream.
struct Item<C> {
    op: &'static str,
    group: Option<Group>,
    run: HostTask<C>,
}

/// What a stream's thread and its waiters share, under the stream's lock.
struct State<C> {
    queue: VecDeque<Item<C>>,
    /// Operations enqueued so far (the next one is number `enqueued + 1`).
    enqueued: u64,
    /// Operations finished, failed or not (they finish in order).
    completed: u64,
    /// The operation the thread runs now: (number, name).
    running: Option<(u64, &'static str)>,
    /// The errors of the operations that failed, by number (the oldest are dropped past
    /// [`KEPT_FAILURES`]).
    failures: BTreeMap<u64, Error>,
    /// Set when the communicator closes: the thread runs what is queued, then ends.
    closing: bool,
}

/// How many failed operations' errors a stream keeps for their waits.
const KEPT_FAILURES: usize = 4096;

/// One stream.
pub(crate) struct Queue<C> {
    id: u32,
    rank: Rank,
    state: Mutex<State<C>>,
    /// The thread waits here for work.
    work: Condvar,
    /// Host waits for events wait here.
    done: Condvar,
}

impl<C> Queue<C> {
    fn lock(&self) -> MutexGuard<'_, State<C>> {
        // A panic inside an operation is caught on the thread; a poisoned lock only means a
        // waiter panicked, and the state stays consistent (every update is one assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until operation `seq` has finished, for at most `timeout`; its error if it failed.
    /// `what` names the wait in a timeout.
    fn wait_for(&self, seq: u64, timeout: Duration, what: &str) -> Result<()> {
        let start = Instant::now();
        let mut st = self.lock();
        while st.completed < seq {
            let waited = start.elapsed();
            if waited >= timeout {
                let last = match st.running {
                    Some((n, op)) => format!("{} finished; #{n} ({op}) running", st.completed),
                    None => format!("{} finished", st.completed),
                };
                return Err(Error::Timeout(Box::new(TimeoutError::new(
                    self.rank,
                    what.to_string(),
                    None,
                    format!("stream {} of rank {}", self.id, self.rank),
                    format!("its operations up to #{seq} to finish"),
                    last,
                    Vec::new(),
                    waited,
                ))));
            }
            st = self.done.wait_timeout(st, timeout - waited).unwrap_or_else(|p| p.into_inner()).0;
        }
        st.result(seq)
    }
}

impl<C> State<C> {
    /// The result of finished operation `seq` (0: none, a success).
    fn result(&self, seq: u64) -> Result<()> {
        self.failures.get(&seq).map_or(Ok(()), |e| Err(e.clone()))
    }
}

/// A stream and its thread (taken when the stream closes).
type Entry<C> = (Arc<Queue<C>>, Option<JoinHandle<()>>);

/// The streams of one communicator.
pub(crate) struct Streams<C> {
    owner: u64,
    rank: Rank,
    /// The most a thread waits before each operation (tests), in microseconds.
    delay_us: u64,
    queues: Mutex<Vec<Entry<C>>>,
}

impl<C> std::fmt::Debug for Streams<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.queues.lock().map_or(0, |q| q.len());
        write!(f, "Streams({n})")
    }
}

impl<C: Send + 'static> Streams<C> {
    pub(crate) fn new(owner: u64, rank: Rank, delay_us: u64) -> Self {
        Streams { owner, rank, delay_us, queues: Mutex::new(Vec::new()) }
    }

    fn queues(&self) -> MutexGuard<'_, Vec<Entry<C>>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new stream whose thread runs its operations with `handle`.
    pub(crate) fn create(&self, handle: C) -> Result<Stream> {
        let mut queues = self.queues();
        let id = queues.len() as u32;
        let q = Arc::new(Queue {
            id,
            rank: self.rank,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                running: None,
                failures: BTreeMap::new(),
                closing: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let (runner, delay_us) = (q.clone(), self.delay_us);
        let thread = std::thread::Builder::new()
            .name(format!("symm-stream-{}.{id}", self.rank))
            .spawn(move || run(&runner, &handle, delay_us))
            .map_err(|source| Error::System { rank: self.rank, what: "starting a stream's thread".into(), source })?;
        queues.push((q, Some(thread)));
        Ok(Stream::from_parts(self.owner, id))
    }

    fn queue(&self, stream: &Stream) -> Result<Arc<Queue<C>>> {
        let queues = self.queues();
        match queues.get(stream.id() as usize) {
            Some((q, _)) if stream.owner() == self.owner => Ok(q.clone()),
            _ => Err(Error::InvalidArgument {
                rank: self.rank,
                source: symm_core::ArgError::invalid(
                    "stream",
                    format!("stream {} of communicator {:#x}", stream.id(), stream.owner()),
                    format!("is not a stream of this communicator ({:#x})", self.owner),
                ),
            }),
        }
    }

    /// Enqueues operation `op` of `group`; its completion event.
    pub(crate) fn enqueue(
        &self,
        stream: &Stream,
        op: &'static str,
        group: Option<&Group>,
        run: HostTask<C>,
    ) -> Result<Event> {
        let q = self.queue(stream)?;
        let mut st = q.lock();
        if st.closing {
            return Err(Error::Unsupported {
                rank: self.rank,
                backend: "sim",
                what: format!("enqueueing {op} on stream {} of a communicator that is closing", q.id),
            });
        }
        if let Some(g) = group {
            g.stream_op_enqueued();
        }
        st.enqueued += 1;
        st.queue.push_back(Item { op, group: group.cloned(), run });
        q.work.notify_one();
        Ok(Event::from_parts(*stream, st.enqueued))
    }

    pub(crate) fn record(&self, stream: &Stream) -> Result<Event> {
        let q = self.queue(stream)?;
        let seq = q.lock().enqueued;
        Ok(Event::from_parts(*stream, seq))
    }

    /// Orders `stream`'s later operations after `event`: an operation that waits for it.
    pub(crate) fn wait_event(&self, stream: &Stream, event: &Event, timeout: Duration) -> Result<()> {
        let other = self.queue(&event.stream())?;
        let (seq, id) = (event.seq(), other.id);
        let what = format!("stream {} waiting for an event of stream {id} (after its operation #{seq})", stream.id());
        self.enqueue(stream, "stream_wait_event", None, Box::new(move |_| other.wait_for(seq, timeout, &what)))
            .map(|_| ())
    }

    pub(crate) fn query(&self, event: &Event) -> Result<bool> {
        let q = self.queue(&event.stream())?;
        let st = q.lock();
        if st.completed < event.seq() {
            return Ok(false);
        }
        st.result(event.seq()).map(|()| true)
    }

    pub(crate) fn synchronize(&self, event: &Event, timeout: Duration) -> Result<()> {
        let q = self.queue(&event.stream())?;
        let what = format!("synchronize (the host waiting for operation #{} of stream {})", event.seq(), q.id);
        q.wait_for(event.seq(), timeout, &what)
    }

    /// Lets every stream finish what is queued, then ends their threads (the communicator
    /// closes). Every operation's waits are bounded, so this is too.
    pub(crate) fn close(&self) {
        let threads: Vec<JoinHandle<()>> = {
            let mut queues = self.queues();
            for (q, _) in queues.iter() {
                q.lock().closing = true;
                q.work.notify_one();
            }
            queues.iter_mut().filter_map(|(_, t)| t.take()).collect()
        };
        for t in threads {
            // A thread that panicked outside an operation has nothing left to run.
            let _ = t.join();
        }
    }
}

/// The body of a stream's thread.
fn run<C>(q: &Queue<C>, handle: &C, delay_us: u64) {
    contract::mark_executor_thread();
    let mut rng = u64::from(q.rank.0) << 32 | u64::from(q.id) | 1;
    loop {
        let (seq, item) = {
            let mut st = q.lock();
            loop {
                if let Some(item) = st.queue.pop_front() {
                    let seq = st.completed + 1;
                    st.running = Some((seq, item.op));
                    break (seq, item);
                }
                if st.closing {
                    return;
                }
                st = q.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        if delay_us > 0 {
            // xorshift: any spread of delays will do.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_micros(rng % (delay_us + 1)));
        }
        let Item { op, group, run } = item;
        let r = catch_unwind(AssertUnwindSafe(|| run(handle))).unwrap_or_else(|_| {
            Err(Error::System {
                rank: q.rank,
                what: format!("{op} on stream {}", q.id),
                source: std::io::Error::other("the operation panicked"),
            })
        });
        {
            let mut st = q.lock();
            st.completed = seq;
            st.running = None;
            if let Err(e) = r {
                st.failures.insert(seq, e);
                if st.failures.len() > KEPT_FAILURES {
                    st.failures.pop_first();
                }
            }
        }
        if let Some(g) = group {
            g.stream_op_completed();
        }
        q.done.notify_all();
    }
}
