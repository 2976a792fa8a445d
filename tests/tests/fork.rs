//! `fork()` after start-up: the child may not act as its parent's rank. Its calls fail at once
//! (`Unsupported`, naming fork), and neither its exit nor dropping its copy of the
//! communicator marks the parent's rank as gone; the parent and its peer then compute the
//! right sums. See `src/bin/symm-fork-rank.rs`.

use std::path::Path;
use std::time::Duration;

#[test]
fn a_forked_child_cannot_use_or_close_its_parents_communicator() {
    let exe = Path::new(env!("CARGO_BIN_EXE_symm-fork-rank"));
    let env = vec![
        ("SYMMETRIC_MEMORY_HEAP_SIZE".to_string(), "64M".to_string()),
        // A child that took the parent's place would leave a peer waiting: fail in seconds.
        ("SYMMETRIC_MEMORY_TIMEOUT".to_string(), "10".to_string()),
    ];
    let statuses =
        symm_registry::spawn_ranks(2, exe, &[], &env, Duration::from_secs(30)).expect("starting symm-fork-rank");
    for (r, st) in statuses.iter().enumerate() {
        assert!(st.success(), "rank {r} ended with {st} (see its output above)");
    }
}
