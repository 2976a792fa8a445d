//! One rank of a multi-process conformance run: `symm-conformance-rank <case>...`, started
//! by `symm_registry::spawn_ranks` (which sets `SYMM_RANK`, `SYMM_WORLD_SIZE`, `SYMM_RENDEZVOUS`,
//! `SYMM_RENDEZVOUS_HOSTED`).
//!
//! `SYMM_TEST_LL_MAX_BY_RANK=a,b,...` gives rank r the small-message limit `SYMM_LL_MAX` of
//! entry `r % len`: members that disagree on which calls take the small-message path.
//! `SYMM_TEST_LIGHT_SIGNALS_BY_RANK` does the same for `SYMM_LIGHT_SIGNALS` (ranks that signal
//! lightly next to ranks that fence every signal).
//! With `SYMM_TEST_NAP_MS` set (sleeping waiters nap that long between looks), the rank fails if
//! any of its waits lost a wake-up (`symm_registry::host::lost_wakeups`): with naps of seconds, a wait
//! that slept its nap out and then found its condition met was not woken by the writer.

use symm_core::Backend;
use symm_registry::Comm;

fn main() {
    let cases: Vec<String> = std::env::args().skip(1).collect();
    if cases.first().map(String::as_str) == Some("--device-cases") {
        // For scripts/ascend-check.sh: the cases that hold where the heap is device memory.
        println!("{}", symm_tests::DEVICE_CASES.join(" "));
        return;
    }
    for (by_rank, var) in
        [("SYMM_TEST_LL_MAX_BY_RANK", "SYMM_LL_MAX"), ("SYMM_TEST_LIGHT_SIGNALS_BY_RANK", "SYMM_LIGHT_SIGNALS")]
    {
        if let (Ok(list), Ok(rank)) = (std::env::var(by_rank), std::env::var("SYMM_RANK")) {
            let values: Vec<&str> = list.split(',').collect();
            let rank: usize = rank.parse().expect("SYMM_RANK is a number");
            // Single-threaded here: nothing reads the environment concurrently.
            std::env::set_var(var, values[rank % values.len()]);
        }
    }
    let comm = match Comm::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("start-up failed: {e}");
            std::process::exit(2);
        }
    };
    for case in &cases {
        symm_tests::run_case(case, &comm);
    }
    if std::env::var_os("SYMM_TEST_NAP_MS").is_some() {
        let lost = symm_registry::host::lost_wakeups();
        assert_eq!(
            lost,
            0,
            "rank {}: {lost} wait(s) slept their nap out although the awaited change had been made",
            comm.rank()
        );
    }
}
