//! What the rank binaries of the fault tests print: their lines and their checks; what symm
//! logs meanwhile.

use std::io::Write;
use std::sync::Mutex;

use log::{Log, Metadata, Record};
use symm_core::dfx::log::{init_with, StderrLogger};
use symm_core::dfx::Level;
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

/// The lines (level, message) of [`captured`] in progress; `None`: lines go to stderr.
static CAPTURED: Mutex<Option<Vec<(Level, String)>>> = Mutex::new(None);

/// A logger that keeps the lines while [`captured`] runs.
struct Capture;

impl Log for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &Record<'_>) {
        match CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(lines) => lines.push((r.level(), r.args().to_string())),
            None => StderrLogger.log(r),
        }
    }

    fn flush(&self) {}
}

/// Makes the logger of [`captured`] the process's: before anything of symm starts, which
/// installs its own otherwise.
pub fn install_capture() {
    init_with(&Capture);
}

/// Runs `f` and returns what this process logged meanwhile (every thread's lines).
pub fn captured<R>(f: impl FnOnce() -> R) -> (R, Vec<(Level, String)>) {
    install_capture();
    *CAPTURED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    let r = f();
    (r, CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default())
}
