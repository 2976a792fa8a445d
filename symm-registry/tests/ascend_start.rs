//! The Ascend backend through the registry on a machine without CANN: `SYMM_BACKEND=ascend`
//! selects it, and every rank fails at once with the library loader's search, naming the
//! library, the places tried and the variables that move them; none waits out its timeout.
//! (On a machine with CANN this test has nothing to show; `scripts/ascend-check.sh` runs the
//! conformance suite there.)
#![cfg(feature = "ascend")]

use std::time::{Duration, Instant};

use symm_core::config::Config;
use symm_registry::{run_in_process, BackendKind, Comm, CommConfig};

fn ascend_settings(timeout: Duration) -> CommConfig {
    CommConfig::from_settings(Config {
        backend: Some("ascend".into()),
        timeout,
        heap_size: 8 << 20,
        ..Config::default()
    })
}

#[test]
fn ascend_is_compiled_in_and_the_cpu_backend_stays_the_default() {
    assert!(BackendKind::COMPILED.contains(&BackendKind::Ascend));
    assert_eq!(BackendKind::select(Some("ascend"), symm_core::Rank(0)).unwrap(), BackendKind::Ascend);
    #[cfg(feature = "sim")]
    assert_eq!(BackendKind::select(None, symm_core::Rank(0)).unwrap(), BackendKind::Sim);
}

#[test]
fn without_cann_every_rank_fails_at_once_naming_the_library_and_where_it_was_sought() {
    if ascend_sys::safe::acl().is_ok() {
        eprintln!("libascendcl.so loads on this machine: nothing to show here (run scripts/ascend-check.sh)");
        return;
    }
    let timeout = Duration::from_secs(60);
    let start = Instant::now();
    let results = run_in_process(3, ascend_settings(timeout), |_comm: Comm| ());
    assert!(start.elapsed() < timeout / 2, "the ranks waited {:?} to fail", start.elapsed());
    for (r, result) in results.iter().enumerate() {
        let e = result.as_ref().expect_err("no rank can start without CANN");
        let text = e.to_string();
        assert_eq!(e.code(), "SYMM_E_BOOTSTRAP", "rank {r}: {text}");
        assert_eq!(e.rank(), symm_core::Rank(r as u32), "{text}");
        for part in ["libascendcl.so", "ASCEND_HOME_PATH", "LD_LIBRARY_PATH", "/usr/local/Ascend"] {
            assert!(text.contains(part), "rank {r}: {part:?} missing from: {text}");
        }
    }
}
