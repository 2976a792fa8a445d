//! One rank of a multi-process conformance run: `symm-conformance-rank <case>...`, started
//! by `symm_sim::spawn_ranks` (which sets `SYMM_RANK`, `SYMM_WORLD_SIZE`, `SYMM_RENDEZVOUS`).

use symm_sim::SimComm;

fn main() {
    let cases: Vec<String> = std::env::args().skip(1).collect();
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
