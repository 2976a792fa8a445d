//! The conformance suite with ranks as threads of this process.

use symm_sim::{run_in_process, SimConfig};

fn run(case: &str, n: usize) {
    let mut config = SimConfig::with_heap_size(16 << 20);
    config.timeout = std::time::Duration::from_secs(60);
    for (r, res) in run_in_process(n, config, |comm| symm_tests::run_case(case, &comm)).into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r} failed to start: {e}"));
    }
}

macro_rules! case {
    ($name:ident) => {
        #[test]
        fn $name() {
            for n in [1, 2, 3, 4, 8] {
                run(stringify!($name), n);
            }
        }
    };
}

case!(primitives);
case!(signals);
case!(ordering);
case!(groups);
case!(bad_input);
case!(heap);
