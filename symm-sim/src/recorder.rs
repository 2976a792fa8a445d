//! The CPU backend's side of the diagnostics: every rank's flight-recorder ring lives in its
//! segment's control area (see [`Layout`]), so any rank reads the whole host's picture from the
//! mappings it already holds, even of a rank that died.
//!
//! [`SimNode`] shares the mappings with its communicator (one `Arc`) and is registered with
//! `symm_core::dfx` for the SIGUSR1 dump and the `atexit` hook; the mappings stay valid while
//! either holds them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use symm_core::dfx::{self, DumpSource, FlightRing, Op, RankRecords, RecordStart, RecordState};
use symm_core::{Group, Rank};

use crate::control::{Control, Layout, EXITED, OPEN};
use crate::sys::Mapping;
use crate::wait::ring;

/// What a dump and the exit hook need of one communicator.
#[derive(Debug)]
pub struct SimNode {
    pub rank: Rank,
    pub world_size: usize,
    pub layout: Layout,
    /// Mappings by global rank (`None`: not on this host). Never changes after start-up.
    pub maps: Arc<[Option<Mapping>]>,
    /// The world group (for the records of init, close and exit).
    pub world: Group,
}

impl SimNode {
    /// The control area of `r`, when `r` is on this host.
    #[inline]
    pub fn ctrl(&self, r: Rank) -> Option<Control<'_>> {
        self.maps.get(r.index())?.as_ref().map(|m| Control::of(m, self.layout))
    }

    /// The flight-recorder ring of `r`, when `r` is on this host and the recorder is on.
    #[inline]
    pub fn ring(&self, r: Rank) -> Option<FlightRing<'_>> {
        self.ctrl(r)?.ring()
    }

    /// The records of every rank on this host.
    pub fn records(&self) -> Vec<RankRecords> {
        (0..self.world_size as u32).map(Rank).filter_map(|r| Some(self.ring(r)?.snapshot(r))).collect()
    }

    /// Records a life-cycle event of this rank (init, close, exit) as a completed operation.
    pub fn mark(&self, op: Op) {
        if let Some(ring) = self.ring(self.rank) {
            let now = dfx::monotonic_ns();
            let ev =
                RecordStart { op, group: Some(&self.world), seq: 0, count: 0, dtype: None, timed: true, start_ns: now };
            let i = ring.begin(&ev);
            ring.finish(i, RecordState::Completed, now, now);
        }
    }

    /// Sets this rank's closed mark (unless set already) and wakes every local peer, so that
    /// those waiting on this rank notice at their next health check.
    pub fn close(&self, how: u64) {
        if let Some(me) = self.ctrl(self.rank) {
            // SeqCst: ordered before the doorbell rings below (a woken peer re-checks and must
            // see the mark); only the first of close and exit sets it.
            let _ = me.header().closed.compare_exchange(OPEN, how, Ordering::SeqCst, Ordering::SeqCst);
        }
        for r in (0..self.world_size as u32).map(Rank).filter(|&r| r != self.rank) {
            if let Some(c) = self.ctrl(r) {
                ring(c.header());
            }
        }
    }
}

impl DumpSource for SimNode {
    fn dump(&self) -> String {
        dfx::format_dump(self.rank, &self.records(), dfx::monotonic_ns())
    }

    fn process_exiting(&self) {
        self.mark(Op::Exit);
        self.close(EXITED);
    }
}
