//! What the rank binaries of the fault tests print: their lines and their checks.

use std::io::Write;

use symm_core::Rank;

/// Prints `line` with one write, so that the lines of several ranks do not interleave.
pub fn say(line: impl AsRef<str>) {
    let _ = std::io::stdout().write_all(format!("{}\n", line.as_ref()).as_bytes());
}

/// A rank's checks: each failed one is printed; [`Checks::exit`] ends the process with 0 when
/// every check passed, 1 otherwise.
#[derive(Debug)]
pub struct Checks {
    /// The rank that checks (named in every line).
    pub me: Rank,
    failed: bool,
}

impl Checks {
    /// No check failed yet.
    pub fn new(me: Rank) -> Checks {
        Checks { me, failed: false }
    }

    /// Records a failure, printed with `what`, unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            say(format!("[rank {}] CHECK FAILED: {}", self.me, what()));
            self.failed = true;
        }
    }

    /// Prints the verdict and exits with it.
    pub fn exit(self) -> ! {
        say(format!("[rank {}] {}", self.me, if self.failed { "FAILED" } else { "ok" }));
        std::process::exit(i32::from(self.failed));
    }
}
