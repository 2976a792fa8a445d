//! One rank of a start-up with per-rank settings, for `tests/config_env.rs`: started by
//! `symm_registry::spawn_ranks` (or directly, to test `SYMM_RANK` itself).
//!
//! `SYMM_TEST_RANK_ENV=r:NAME=VALUE;r:NAME=VALUE...` sets `NAME` to `VALUE` on rank `r` only,
//! before the start-up. The rank then starts (`Comm::from_env`), runs one allreduce, and
//! writes what happened to `$SYMM_TEST_OUT/rank-<r>` (`<r>` as `SYMM_RANK` spells it):
//! `ok`, or the error's code and message on two lines.

use symm_core::{Backend, CollOptions, Collectives, LocalMut, ReduceOp};
use symm_registry::Comm;

fn main() {
    let rank = std::env::var("SYMM_RANK").unwrap_or_default();
    if let Ok(list) = std::env::var("SYMM_TEST_RANK_ENV") {
        for entry in list.split(';').filter(|e| !e.is_empty()) {
            let (r, setting) = entry.split_once(':').expect("r:NAME=VALUE");
            let (name, value) = setting.split_once('=').expect("r:NAME=VALUE");
            if r == rank {
                // Single-threaded here: nothing reads the environment concurrently.
                std::env::set_var(name, value);
            }
        }
    }
    let out =
        std::path::Path::new(&std::env::var("SYMM_TEST_OUT").expect("SYMM_TEST_OUT")).join(format!("rank-{rank}"));
    let result = Comm::from_env().and_then(|comm| {
        let mut x = vec![1.0f32; 4];
        comm.allreduce(&comm.world(), LocalMut::from(&mut x), ReduceOp::Sum, &CollOptions::default())?;
        Ok(x[0])
    });
    let text = match &result {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("{}\n{e}", e.code()),
    };
    std::fs::write(&out, text).expect("writing the rank's result");
    std::process::exit(if result.is_ok() { 0 } else { 2 });
}
