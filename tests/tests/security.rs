//! Start-up security, tried from the outside: a process of another user (uid `nobody`) attacks
//! a 2-rank job in a private network namespace (abstract Unix sockets and the loopback are per
//! namespace, so nothing else on the machine sees the job or the attacker). Skipped, with the
//! reason, where the machine cannot make one (not root, no `unshare`/`setpriv`). The actors are
//! in `src/bin/symm-security-probe.rs`.

use std::process::Command;
use std::time::{Duration, Instant};

const PROBE: &str = env!("CARGO_BIN_EXE_symm-security-probe");

/// Why a private network namespace with a second user cannot be had here, if it cannot.
fn no_namespace() -> Option<String> {
    let ok = |cmd: &mut Command| cmd.output().map(|o| o.status.success()).unwrap_or(false);
    if !ok(Command::new("unshare").args(["-n", "--", "ip", "link", "set", "lo", "up"])) {
        return Some("cannot create a network namespace (`unshare -n` and `ip` need root)".into());
    }
    if !ok(Command::new("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "true"])) {
        return Some("cannot run a process as uid nobody (`setpriv` needs root)".into());
    }
    None
}

/// Runs `probe scenario` as root in a fresh network namespace; its output and whether it
/// succeeded, or `None` (printed) when that is impossible here.
fn in_namespace(scenario: &str) -> Option<(bool, String)> {
    if let Some(why) = no_namespace() {
        eprintln!("SKIPPED {scenario}: {why}");
        return None;
    }
    let out = Command::new("unshare")
        .args(["-n", "--", "sh", "-c", "ip link set lo up && exec \"$0\" \"$1\"", PROBE, scenario])
        .output()
        .expect("running unshare");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Some((out.status.success(), text))
}

#[test]
fn another_user_cannot_take_a_ranks_heap_and_the_peer_is_still_served() {
    let Some((ok, out)) = in_namespace("scenario-heap") else { return };
    assert!(ok, "{out}");
    assert!(out.contains("attacker: CONNECTED"), "the attacker never reached the socket:\n{out}");
    assert!(out.contains("attacker: REFUSED"), "{out}");
    // Refused and logged by the rank, which went on to serve its real peer.
    assert!(out.contains("refused a connection for this rank's heap segment: pid"), "{out}");
    assert!(out.contains("is another user"), "{out}");
    assert!(out.contains("rank 0 ok") && out.contains("rank 1 ok"), "{out}");
}

#[test]
fn another_user_cannot_write_into_the_start_up_store() {
    let Some((ok, out)) = in_namespace("scenario-store") else { return };
    assert!(ok, "{out}");
    assert!(out.contains("attacker: REFUSED"), "{out}");
    assert!(out.contains("refused a client at") && out.contains("does not know the job secret"), "{out}");
    assert!(out.contains("rank 0 ok") && out.contains("rank 1 ok"), "{out}");
}

#[test]
fn a_rank_with_a_bad_environment_makes_its_peers_fail_at_once() {
    // Rank 1 must report its failure at once: otherwise rank 0 waits for its hello until the
    // whole timeout (60 s here).
    let env: Vec<(String, String)> =
        [("SYMMETRIC_MEMORY_HEAP_SIZE", "16M"), ("SYMMETRIC_MEMORY_TIMEOUT", "60"), ("SYMM_TEST_BAD_ENV_RANK", "1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let t = Instant::now();
    let statuses = symm_registry::spawn_ranks(3, PROBE.as_ref(), &["rank".into()], &env, Duration::from_secs(120))
        .expect("spawn ranks");
    let took = t.elapsed();
    // Rank 1 fails on its own setting (2); ranks 0 and 2 learn it from the store (17).
    let codes: Vec<Option<i32>> = statuses.iter().map(|s| s.code()).collect();
    assert_eq!(codes, [Some(17), Some(2), Some(17)], "after {took:?}");
    assert!(took < Duration::from_secs(20), "the peers failed only after {took:?}");
}
