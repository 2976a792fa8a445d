//! Validation mode (`SYMM_VALIDATE=1`) and the diagnostics of collective waits.
//!
//! The first round of every collective always compares what members were asked to do (kind,
//! dtype, op, format, root, count: see `agree`). Validation mode adds, before each collective
//! call, one **validation round** in which every member publishes to every peer:
//!
//! | fact  | meaning                                                                 |
//! |-------|-------------------------------------------------------------------------|
//! | `SRC` | alltoall: elements this member sends to the reader; others: its count   |
//! | `RED` | alltoall: elements this member expects from the reader; others: its call signature (kind, dtype, op, format, root) |
//! | `SIG` | [`VALIDATION_SIG`], which no ordinary round uses                        |
//! | `LEN` | this member's collective call number in the group                       |
//! | `MAX` | op code, dtype, "rejected its arguments" flag                           |
//!
//! and every member checks: the peer is in a validation round too (else the members do not run
//! the same sequence of rounds: one of them skipped or repeated a call, or `SYMM_VALIDATE`
//! differs between ranks), the call numbers agree, the operations agree, signatures and counts
//! agree (a small broadcast's root would not see a disagreement otherwise, see
//! [`eager`](super::eager), not even on the root itself), and for alltoall the
//! split sizes agree pairwise (what j sends to i is what i expects from j). Call numbers and
//! operations are seen alike by every member, so they all fail alike. Alltoall sizes are
//! pairwise, so a second round shares each member's verdict and every member fails with the
//! same report. Every member also keeps the `CALLS` word of its record on every peer at its
//! current call number (not tied to rounds), so that a member that finds rounds not lining up
//! can name the peer's call number next to its own.
//!
//! Cost: one extra round (two for alltoall) per collective call, plus one signal per peer.

use super::algo::Call;
use super::state::{ready, Ctx, Progress, CALLS, DONE, FACT_WORDS, LEN, MAX, RED, SIG, SRC};
use symm_core::backend::HostMapped;
use symm_core::dfx::Op;
use symm_core::dtype::DType;
use symm_core::error::{Error, Result, TimeoutError};
use symm_core::rank::Rank;

/// The kind byte of a validation round's signature (ordinary rounds use 1..=5).
pub const VALIDATION_KIND: i64 = 0x7f;
/// The `SIG` fact of a validation round.
pub const VALIDATION_SIG: i64 = VALIDATION_KIND | (0xff_ffff << 8);

/// What a call is, for the flight recorder, the statistics and the validation round.
#[derive(Clone, Copy, Debug)]
pub struct Plan<'a> {
    pub op: Op,
    /// Elements of the caller's buffer.
    pub count: usize,
    pub dtype: Option<DType>,
    /// Payload bytes for the statistics.
    pub bytes: usize,
    /// alltoall: elements this member sends to / expects from each member (group order).
    pub pairs: Option<(&'a [usize], &'a [usize])>,
    /// This member rejected its arguments (it joins only to tell the peers).
    pub rejected: bool,
    /// The call's signature (kind, dtype, op, format, root; 0: none, alltoall and rejected
    /// calls), compared with the count by the validation round.
    pub sig: i64,
}

impl Plan<'_> {
    /// A call of `op` on `count` elements of `dtype`.
    pub fn new(op: Op, count: usize, dtype: DType) -> Plan<'static> {
        Plan { op, count, dtype: Some(dtype), bytes: count * dtype.size(), pairs: None, rejected: false, sig: 0 }
    }

    /// This plan for the call `call` (whose signature the validation round compares).
    pub fn of(self, call: &Call) -> Self {
        Plan { sig: call.sig(), ..self }
    }

    /// A call of `op` whose arguments this member rejected.
    pub fn rejected(op: Op) -> Plan<'static> {
        Plan { op, count: 0, dtype: None, bytes: 0, pairs: None, rejected: true, sig: 0 }
    }
}

fn op_word(plan: &Plan<'_>) -> i64 {
    i64::from(plan.op.code())
        | (plan.dtype.map_or(0, |d| i64::from(d.code()) + 1) << 8)
        | (i64::from(plan.rejected) << 16)
}

/// The dtype of an [`op_word`] (`, dtype float32`; empty without one).
fn dtype_text(word: i64) -> String {
    match (word >> 8) & 0xff {
        0 => String::new(),
        c => DType::from_code(c - 1).map_or_else(|_| ", dtype ?".into(), |d| format!(", dtype {d}")),
    }
}

fn op_text(word: i64) -> String {
    let op = Op::from_code((word & 0xff) as u8).map_or("?", Op::name);
    let dtype = dtype_text(word);
    let rejected = if (word >> 16) & 1 == 1 { ", arguments rejected" } else { "" };
    format!("{op}{dtype}{rejected}")
}

/// One validation round (two for alltoall) before the call itself.
pub fn round<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress, plan: &Plan<'_>) -> Result<()> {
    let call = ctx.call;
    ctx.signal_all(CALLS, call)?;
    p.seq += 1;
    let seq = p.seq;
    let word = op_word(plan);
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        let (a, b) = match plan.pairs {
            Some((sends, expects)) => (sends[j], expects[j] as i64),
            None => (plan.count, plan.sig),
        };
        ctx.publish_to(j, seq, [a as i64, b, VALIDATION_SIG, call as i64, word])?;
    }
    ctx.wait_all(ready(seq), seq, "validation ready")?;
    let me = ctx.b.rank();
    let mut verdict: Option<Error> = None;
    // Alltoall pairs that disagree: (sender, receiver, sent, expected), in group ranks.
    let mut pair: Option<[usize; 4]> = None;
    // Whether a member rejected its arguments: then no member takes the second round (the
    // rejecting one has no pairs to share), and the call's own round reports the rejection.
    let mut peer_rejected = false;
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        let peer = ctx.group.ranks()[j];
        let [src, red, sig, len, max] = [SRC, RED, SIG, LEN, MAX].map(|f| ctx.read_fact(j, seq, f));
        peer_rejected |= sig == VALIDATION_SIG && (max >> 16) & 1 == 1;
        let mismatch =
            |mine: String, theirs: String| Error::Mismatch { rank: me, op: ctx.op.into(), peer, mine, theirs };
        let err = if sig != VALIDATION_SIG {
            Some(mismatch(
                format!("the validation round of collective call #{call}"),
                format!(
                    "an ordinary round (its latest collective call of the group: #{}): the members do not run the \
                     same sequence of collective calls, or SYMM_VALIDATE is not set on every rank",
                    ctx.read_word(j, CALLS)
                ),
            ))
        } else if len as u64 != call {
            Some(mismatch(
                format!("collective call #{call} of the group ({})", op_text(word)),
                format!("collective call #{len} of the group ({})", op_text(max)),
            ))
        } else if (max & 0xff) != (word & 0xff) && !plan.rejected && (max >> 16) & 1 == 0 {
            Some(mismatch(
                format!("{} as collective call #{call}", op_text(word)),
                format!("{} as collective call #{len}", op_text(max)),
            ))
        } else if plan.sig != 0 && red != 0 && (red != plan.sig || src as usize != plan.count) {
            // The whole signature and count, before any data moves: the root of a small
            // broadcast does not wait for its members (see `eager`), so its first round would
            // not show it a disagreement (on the root itself, when every member that disagrees
            // names itself).
            Some(mismatch(
                format!("{} as collective call #{call}", Call::describe(plan.sig, plan.count as i64)),
                format!("{} as collective call #{len}", Call::describe(red, src)),
            ))
        } else {
            if let (Some((sends, expects)), false, false) = (plan.pairs, plan.rejected, (max >> 16) & 1 == 1) {
                if pair.is_none() && src as usize != expects[j] {
                    pair = Some([j, ctx.me, src as usize, expects[j]]);
                }
                if pair.is_none() && red as usize != sends[j] {
                    pair = Some([ctx.me, j, sends[j], red as usize]);
                }
            }
            None
        };
        if verdict.is_none() {
            verdict = err;
        }
    }
    ctx.signal_all(DONE, seq)?;
    if plan.pairs.is_some() && verdict.is_none() && !peer_rejected {
        verdict = share_pair_verdict(ctx, p, pair)?;
    }
    verdict.map_or(Ok(()), Err)
}

/// Second round of alltoall validation: every member publishes the first disagreeing pair it
/// found, so that every member reports the same one (the lowest group rank's report).
fn share_pair_verdict<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    pair: Option<[usize; 4]>,
) -> Result<Option<Error>> {
    p.seq += 1;
    let seq = p.seq;
    let encode = |v: Option<[usize; 4]>| -> [i64; FACT_WORDS] {
        match v {
            Some([s, r, sent, expected]) => {
                [1 | ((s as i64) << 8) | ((r as i64) << 32), sent as i64, VALIDATION_SIG, expected as i64, 0]
            }
            None => [0, 0, VALIDATION_SIG, 0, 0],
        }
    };
    let mine = encode(pair);
    ctx.publish(seq, mine)?;
    ctx.wait_all(ready(seq), seq, "validation verdict")?;
    let mut first = None;
    for j in 0..ctx.n {
        let read = |f: usize| if j == ctx.me { mine[f] } else { ctx.read_fact(j, seq, f) };
        let flags = read(SRC);
        if read(SIG) == VALIDATION_SIG && flags & 1 == 1 {
            let (s, r) = (((flags >> 8) & 0xff_ffff) as usize, (flags >> 32) as usize);
            if s < ctx.n && r < ctx.n {
                first = Some((j, s, r, read(RED), read(LEN)));
                break;
            }
        }
    }
    ctx.signal_all(DONE, seq)?;
    Ok(first.map(|(reporter, s, r, sent, expected)| {
        let g = |k: usize| ctx.group.ranks()[k];
        // Name the other party of the pair from this member's point of view.
        let peer = if ctx.me == s { g(r) } else { g(s) };
        Error::Mismatch {
            rank: ctx.b.rank(),
            op: ctx.op.into(),
            peer,
            mine: format!(
                "global rank {} expecting recv_counts[{s}] = {expected} elements from it (found by global rank {}, \
                 SYMM_VALIDATE=1)",
                g(r),
                g(reporter)
            ),
            theirs: format!("send_counts[{r}] = {sent} elements for global rank {} from global rank {}", g(r), g(s)),
        }
    }))
}

/// In validation mode, adds this member's collective call number to a mismatch raised by the
/// call against a peer's validation round (rounds that do not line up show up there first; the
/// peer's call number is already in the text, from its facts).
pub fn annotate<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, e: &mut Error) {
    if let Error::Mismatch { mine, theirs, .. } = e {
        if !ctx.p2p && theirs.contains(VALIDATION_TEXT) && !mine.contains("collective call #") {
            mine.push_str(&format!(" as collective call #{}", ctx.call));
        }
    }
}

/// Adds the call's sequence number and the peers whose flag of the same meaning has and has not
/// `arrived` to a timeout of a wait on `writer`'s flag.
pub fn explain_timeout<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    t: &mut TimeoutError,
    writer: usize,
    arrived: &dyn Fn(usize) -> bool,
) {
    t.sequence = Some(ctx.call);
    if ctx.p2p {
        t.pending = vec![ctx.group.ranks()[writer]];
        return;
    }
    let (mut here, mut pending): (Vec<Rank>, Vec<Rank>) = (Vec::new(), Vec::new());
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        let r = ctx.group.ranks()[j];
        if arrived(j) {
            here.push(r);
        } else {
            pending.push(r);
        }
    }
    t.arrived = here;
    t.pending = pending;
}

/// What [`describe_validation`] says, for [`annotate`] to recognise.
const VALIDATION_TEXT: &str = "the validation round of its collective call #";

/// Text for the signature of a validation round, for `Call::describe`.
pub fn describe_validation(len: i64) -> String {
    format!("{VALIDATION_TEXT}{len} (SYMM_VALIDATE=1)")
}

/// Used by the always-on first-round comparison: whether `sig` is a validation round.
pub fn is_validation(sig: i64) -> bool {
    sig & 0xff == VALIDATION_KIND
}
