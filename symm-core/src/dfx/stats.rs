//! Per-operation statistics of one communicator: calls, bytes, time and errors by operation.
//!
//! A backend that keeps statistics embeds a [`StatsTable`] and returns it from
//! [`Backend::op_stats`](crate::Backend::op_stats); every recorded operation adds to it with a few
//! relaxed atomic additions (no lock, no allocation).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Op;

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
}

/// The statistics of one operation, as read by [`stats`](super::stats).
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
        // Relaxed: independent counters; readers want totals, not a consistent snapshot.
        row.calls.fetch_add(1, Ordering::Relaxed);
        row.bytes.fetch_add(bytes, Ordering::Relaxed);
        row.nanos.fetch_add(nanos, Ordering::Relaxed);
        if failed {
            row.errors.fetch_add(1, Ordering::Relaxed);
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
        for row in &self.rows {
            // Relaxed: see `add`; a call ending concurrently may land before or after.
            for c in [&row.calls, &row.bytes, &row.nanos, &row.errors] {
                c.store(0, Ordering::Relaxed);
            }
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
}
