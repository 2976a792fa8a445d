//! Settings across processes (`symm-config-rank` runs each rank): a setting that must be the
//! same on every rank and differs is reported at start-up by every rank, naming the variable
//! and each rank's value; a refused value on one rank names the variable, the value and what is
//! accepted on that rank; a bad `SYMM_RANK` names `SYMM_RANK`, not a made-up rank; the
//! launcher's variables, `SYMM_BACKEND` and values that are not UTF-8 follow the same policy.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_symm-config-rank"))
}

/// A fresh directory for the ranks' results.
fn out_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let dir = std::env::temp_dir().join(format!("symm-config-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the results directory");
    dir
}

/// Runs `n` ranks with `per_rank` settings (`r:NAME=VALUE;...`) and a wait bound of
/// `timeout_s`; returns each rank's result (`ok`, or code and message) and the job's duration.
fn run(name: &str, n: usize, per_rank: &str, timeout_s: &str) -> (Vec<String>, Duration) {
    let dir = out_dir(name);
    let env: Vec<(String, String)> = [
        ("SYMMETRIC_MEMORY_HEAP_SIZE", "16M"),
        ("SYMMETRIC_MEMORY_TIMEOUT", timeout_s),
        ("SYMM_COLL_WORKSPACE", "1M"),
        ("SYMM_TEST_RANK_ENV", per_rank),
        ("SYMM_TEST_OUT", dir.to_str().expect("a UTF-8 temporary directory")),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let start = Instant::now();
    symm_registry::spawn_ranks(n, exe(), &[], &env, Duration::from_secs(20)).expect("starting ranks");
    let took = start.elapsed();
    let results = (0..n)
        .map(|r| std::fs::read_to_string(dir.join(format!("rank-{r}"))).unwrap_or_else(|e| format!("no result: {e}")))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (results, took)
}

#[test]
fn ranks_that_agree_start() {
    let (results, _) = run("agree", 3, "1:SYMM_COLL_WORKSPACE=1024K;2:SYMM_BCAST_EAGER_MAX=", "60");
    assert!(results.iter().all(|r| r == "ok"), "{results:?}");
}

#[test]
fn a_setting_that_differs_is_reported_by_name_on_every_rank_at_start_up() {
    for (n, per_rank, said) in [
        (2, "1:SYMM_COLL_WORKSPACE=2M", ["SYMM_COLL_WORKSPACE = \"", "rank 0: \"1048576\"", "rank 1: \"2097152\""]),
        (3, "2:SYMM_BCAST_EAGER_MAX=0", ["SYMM_BCAST_EAGER_MAX ", "rank 0: \"by placement\"", "rank 2: \"0\""]),
    ] {
        let (results, took) = run("differs", n, per_rank, "60");
        for (r, text) in results.iter().enumerate() {
            assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "rank {r}: {text}");
            let named = text.contains(&format!("environment variable {}", said[0]));
            assert!(named && text.contains("differs between ranks"), "rank {r}: {text}");
            assert!(said[1..].iter().all(|s| text.contains(s)), "rank {r}: {text}");
        }
        assert!(
            took < Duration::from_secs(30),
            "{per_rank}: reported at start-up, not at the 60 s wait bound: {took:?}"
        );
    }
}

#[test]
fn a_refused_value_on_one_rank_names_the_variable_the_value_and_what_is_accepted() {
    for (var, value, accepted) in [
        ("SYMM_SPIN_US", "abc", "microseconds from 0 to 1000000"),
        ("SYMM_COLL_WORKSPACE", "abc", "a byte size from 64K"),
        ("SYMMETRIC_MEMORY_TIMEOUT", "1e-9", "seconds from 0.001 to 1e9"),
    ] {
        // Its peer learns of it at once, from the failure it publishes in the start-up store.
        let (results, _) = run("refused", 2, &format!("1:{var}={value}"), "2");
        assert!(results[0].contains("a peer failed during start-up"), "{}", results[0]);
        let text = &results[1];
        assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "{text}");
        assert!(
            text.contains(&format!("rank 1: bootstrap failed: environment variable {var} = \"{value}\""))
                && text.contains(accepted),
            "{text}"
        );
        assert!(!text.contains("SYMMETRIC_MEMORY_HEAP_SIZE"), "{text}");
    }
}

#[test]
fn a_bad_rank_names_symm_rank_and_no_made_up_rank() {
    let dir = out_dir("rank");
    let status = std::process::Command::new(exe())
        .env("SYMM_RANK", "abc")
        .env("SYMM_WORLD_SIZE", "2")
        .env("SYMM_RENDEZVOUS", "127.0.0.1:1")
        .env("SYMM_TEST_OUT", &dir)
        .status()
        .expect("running a rank");
    let text = std::fs::read_to_string(dir.join("rank-abc")).expect("the rank's result");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.success());
    assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "{text}");
    assert!(text.contains("rank unknown:") && text.contains("SYMM_RANK = \"abc\""), "{text}");
    assert!(!text.contains("4294967295"), "{text}");
}

/// Starts a 1-rank job with `env` (at a store this test serves) and returns its result.
fn single(name: &str, env: &[(&str, &OsStr)]) -> String {
    let dir = out_dir(name);
    let store = symm_registry::store::TcpStoreServer::bind("127.0.0.1:0").expect("serving the start-up store");
    let status = std::process::Command::new(exe())
        .env("SYMM_RANK", "0")
        .env("SYMM_WORLD_SIZE", "1")
        .env("SYMM_RENDEZVOUS", store.local_addr().to_string())
        .env("SYMM_RENDEZVOUS_HOSTED", "1")
        .env("SYMMETRIC_MEMORY_TIMEOUT", "20")
        .env("SYMMETRIC_MEMORY_HEAP_SIZE", "16M")
        .env("SYMM_COLL_WORKSPACE", "1M")
        .env("SYMM_TEST_OUT", &dir)
        .envs(env.iter().copied())
        .status()
        .expect("running a rank");
    let text = std::fs::read_to_string(dir.join("rank-0")).unwrap_or_else(|e| format!("no result: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.success(), text == "ok", "{text}");
    text
}

#[test]
fn the_rendezvous_variables_refuse_bad_values_by_name() {
    assert_eq!(single("rendezvous-ok", &[]), "ok");
    for (var, value) in [
        ("SYMM_RENDEZVOUS", "127.0.0.1"),
        ("SYMM_RENDEZVOUS", ":80"),
        ("SYMM_RENDEZVOUS", "localhost:http"),
        ("SYMM_RENDEZVOUS", " "),
        ("SYMM_RENDEZVOUS_HOSTED", "yes"),
    ] {
        let text = single("rendezvous", &[(var, OsStr::new(value))]);
        assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "{var}={value}: {text}");
        assert!(text.contains(&format!("{var} ")) && text.contains("accepted"), "{var}={value}: {text}");
        if !value.trim().is_empty() {
            assert!(text.contains(&format!("{value:?}")), "{var}={value}: {text}");
        }
    }
}

#[test]
fn symm_backend_picks_the_backend_and_an_unknown_one_is_refused_by_name() {
    assert_eq!(single("backend-ok", &[("SYMM_BACKEND", OsStr::new("sim"))]), "ok");
    let mut refused = vec![("cuda", "no backend has that name"), ("Sim", "not a backend name")];
    if cfg!(not(feature = "ascend")) {
        refused.push(("ascend", "not compiled in (cargo feature `ascend` of symm-registry)"));
    }
    for (value, why) in refused {
        let text = single("backend", &[("SYMM_BACKEND", OsStr::new(value))]);
        assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "{value}: {text}");
        assert!(
            text.contains(&format!("rank 0: bootstrap failed: environment variable SYMM_BACKEND = \"{value}\"")),
            "{text}"
        );
        assert!(text.contains(why) && text.contains("accepted"), "{value}: {text}");
    }
}

#[test]
fn a_value_that_is_not_utf8_is_refused_not_ignored() {
    let text = single("utf8", &[("SYMM_SPIN_US", OsStr::from_bytes(b"5\xff"))]);
    assert!(text.starts_with("SYMM_E_BOOTSTRAP\n"), "{text}");
    assert!(text.contains("SYMM_SPIN_US") && text.contains("microseconds from 0 to 1000000"), "{text}");
}

#[test]
fn the_suites_number_settings_refuse_bad_values_by_name() {
    use symm_core::config::{test_number, TEST_CASES, TEST_SEED};
    let get =
        |v: &'static str| move |name: &str| (name == TEST_CASES.name || name == TEST_SEED.name).then(|| v.to_string());
    assert_eq!(test_number(&get("12"), &TEST_CASES), Ok(Some(12)));
    assert_eq!(test_number(&get(" "), &TEST_SEED), Ok(None));
    for bad in ["abc", "-1", "1.5"] {
        let e = test_number(&get(bad), &TEST_SEED).unwrap_err().to_string();
        assert!(e.contains("SYMM_TEST_SEED") && e.contains(&format!("{bad:?}")) && e.contains("accepted"), "{e}");
    }
}
