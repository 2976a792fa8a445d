//! One rank of a multi-process conformance run: `symm-conformance-rank <case>...`, started
//! by `symm_sim::spawn_ranks` (which sets `SYMM_RANK`, `SYMM_WORLD_SIZE`, `SYMM_RENDEZVOUS`).
//!
//! `SYMM_TEST_LL_MAX_BY_RANK=a,b,...` gives rank r the small-message limit `SYMM_LL_MAX` of
//! entry `r % len`: members that disagree on which calls take the small-message path.

use symm_sim::SimComm;

fn main() {
    let cases: Vec<String> = std::env::args().skip(1).collect();
    if let (Ok(list), Ok(rank)) = (std::env::var("SYMM_TEST_LL_MAX_BY_RANK"), std::env::var("SYMM_RANK")) {
        let limits: Vec<&str> = list.split(',').collect();
        let rank: usize = rank.parse().expect("SYMM_RANK is a number");
        // Single-threaded here: nothing reads the environment concurrently.
        std::env::set_var("SYMM_LL_MAX", limits[rank % limits.len()]);
    }
    let comm = match SimComm::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("start-up failed: {e}");
            std::process::exit(2);
        }
    };
    for case in &cases {
        symm_tests::run_case(case, &comm);
    }
}
