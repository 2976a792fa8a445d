//! Per-operation statistics of one communicator: calls, bytes, time and errors by operation.
//!
//! A backend that keeps statistics embeds a [`StatsTable`] and returns it from
//! [`Backend::op_stats`](crate::Backend::op_stats); every recorded operation adds to it (no lock,
//! no allocation). The first thread that adds owns the table through a [`Bias`]: its additions
//! are plain loads and stores. Once another thread adds or resets, every addition is a relaxed
//! atomic addition (see [`crate::bias`] for why the owner avoids them).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Op;
use crate::bias::Bias;

/// Counters of one operation.
#[derive(Debug, Default)]
struct Row {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    errors: AtomicU64,
}

/// The counters of every operation of one communicator.
#[derive(Debug, Default)]
pub struct StatsTable {
    rows: [Row; Op::COUNT],
    /// The thread whose additions need no read-modify-write.
    writers: Bias,
}

/// The statistics of one operation, as read by [`stats`](fn@super::stats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpStats {
    /// The operation (`allreduce`, `barrier`, ...).
    pub op: &'static str,
    /// Calls made (failed ones included).
    pub calls: u64,
    /// Payload bytes of those calls: elements x dtype size of the caller's buffer (alltoall:
    /// of everything it sends; send/recv: of the message; barrier, wait_until: 0).
    pub bytes: u64,
    /// Time spent in those calls, in nanoseconds.
    pub total_ns: u64,
    /// Calls that returned an error.
    pub errors: u64,
}

impl StatsTable {
    /// Adds one call of `op`.
    #[inline]
    pub fn add(&self, op: Op, bytes: u64, nanos: u64, failed: bool) {
        let row = &self.rows[op.index()];
        // The owner stays inside for a few counters.
        let owner = self.writers.enter_short();
        for (c, by) in [(&row.calls, 1), (&row.bytes, bytes), (&row.nanos, nanos), (&row.errors, u64::from(failed))] {
            if by == 0 {
                continue;
            }
            // Relaxed: independent counters; readers want totals, not a consistent snapshot.
            // The owner is the only writer: its own load sees its last store.
            if owner {
                c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
            } else {
                c.fetch_add(by, Ordering::Relaxed);
            }
        }
        if owner {
            self.writers.leave();
        }
    }

    /// Counts an error of `op` that ended the call before it started (no time, no bytes).
    pub fn add_rejected(&self, op: Op) {
        self.add(op, 0, 0, true);
    }

    /// The operations with at least one call, in [`Op`] order.
    pub fn read(&self) -> Vec<OpStats> {
        Op::ALL
            .iter()
            .map(|&op| {
                let row = &self.rows[op.index()];
                // Relaxed: see `add`.
                OpStats {
                    op: op.name(),
                    calls: row.calls.load(Ordering::Relaxed),
                    bytes: row.bytes.load(Ordering::Relaxed),
                    total_ns: row.nanos.load(Ordering::Relaxed),
                    errors: row.errors.load(Ordering::Relaxed),
                }
            })
            .filter(|s| s.calls > 0)
            .collect()
    }

    /// Sets every counter back to zero.
    pub fn reset(&self) {
        // The owner stays inside for a few counters.
        let owner = self.writers.enter_short();
        for row in &self.rows {
            // Relaxed: see `add`; a call ending concurrently may land before or after.
            for c in [&row.calls, &row.bytes, &row.nanos, &row.errors] {
                c.store(0, Ordering::Relaxed);
            }
        }
        if owner {
            self.writers.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_reads_and_resets() {
        let t = StatsTable::default();
        assert!(t.read().is_empty());
        t.add(Op::AllReduce, 64, 1000, false);
        t.add(Op::AllReduce, 64, 500, true);
        t.add_rejected(Op::Barrier);
        let s = t.read();
        assert_eq!(
            s,
            vec![
                OpStats { op: "barrier", calls: 1, bytes: 0, total_ns: 0, errors: 1 },
                OpStats { op: "allreduce", calls: 2, bytes: 128, total_ns: 1500, errors: 1 },
            ]
        );
        t.reset();
        assert!(t.read().is_empty());
    }

    #[test]
    fn threads_after_the_first_lose_no_counts() {
        // The first thread owns the table; three more add concurrently from the middle of its
        // run on (the bias is revoked then); every addition counts.
        let t = StatsTable::default();
        let started = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..100_000 {
                    t.add(Op::Send, 2, 3, false);
                    if i == 100 {
                        // Release: the others start once this thread owns the table.
                        started.store(true, Ordering::Release);
                    }
                }
            });
            for _ in 0..3 {
                s.spawn(|| {
                    // Acquire: pairs with the store above.
                    while !started.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    for _ in 0..100_000 {
                        t.add(Op::Send, 2, 3, true);
                    }
                });
            }
        });
        assert_eq!(
            t.read(),
            vec![OpStats { op: "send", calls: 400_000, bytes: 800_000, total_ns: 1_200_000, errors: 300_000 }]
        );
    }
}
