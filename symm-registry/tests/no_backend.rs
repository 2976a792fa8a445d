//! A build without backends (`--no-default-features`): the crate builds, and making a
//! communicator fails with an error that says why.
#![cfg(not(any(feature = "sim", feature = "ascend")))]

use symm_core::Rank;
use symm_registry::{run_in_process, BackendKind, Comm, CommConfig};

#[test]
fn without_backends_every_constructor_says_none_is_compiled_in() {
    let e = BackendKind::select(None, Rank(1)).unwrap_err();
    assert_eq!(e.code(), "SYMM_E_UNSUPPORTED");
    assert!(e.to_string().contains("no backend is compiled in"), "{e}");
    let e = BackendKind::select(Some("sim"), Rank(1)).unwrap_err().to_string();
    for part in ["SYMM_BACKEND", "\"sim\"", "not compiled in", "feature `sim`", "compiled in: none"] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    let results = run_in_process(2, CommConfig::with_heap_size(1 << 20), |_comm: Comm| ());
    assert!(results.iter().all(|r| r.as_ref().is_err_and(|e| e.code() == "SYMM_E_UNSUPPORTED")));
}
