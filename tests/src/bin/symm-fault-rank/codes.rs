//! Exit codes of `symm-fault-rank`: what a surviving rank saw. Shared with
//! `tests/killed_rank.rs`, which includes this file.

/// `PeerLost` naming the victim within the limit (the expected outcome).
pub const DETECTED: i32 = 17;
/// `PeerLost` naming the victim, but later than the limit.
pub const TOO_LATE: i32 = 18;
/// `PeerLost` naming a rank that is alive.
pub const WRONG_PEER: i32 = 19;
/// Another error (a timeout included).
pub const OTHER_ERROR: i32 = 20;
/// The barrier or wait completed although a member was dead.
pub const NO_ERROR: i32 = 21;
/// Start-up, the allocation or the first barrier failed, or bad arguments.
pub const SETUP_FAILED: i32 = 22;

/// A readable name for an exit code, for test messages.
#[allow(dead_code)] // used by the test, not by the binary
pub fn describe(code: i32) -> &'static str {
    match code {
        DETECTED => "PeerLost naming the killed rank in time",
        TOO_LATE => "PeerLost naming the killed rank, too late",
        WRONG_PEER => "PeerLost naming a live rank",
        OTHER_ERROR => "another error",
        NO_ERROR => "the wait completed although a member was dead",
        SETUP_FAILED => "set-up failed",
        _ => "an unexpected exit code",
    }
}
