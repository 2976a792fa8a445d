//! Prints the accuracy table of `docs/accuracy.md`: allreduce sums of adversarial data on 4
//! ranks (threads), per data dtype and transport format, measured against an f64 reference,
//! next to the guaranteed bound, and with a format the RFC's pipeline (encode each input,
//! decode, accumulate in group-rank order, round once): its worst error on the same scale, and
//! whether symm's result equals it bit for bit. `symm-accuracy [ranks] [count]`.

use symm_core::DType;
use symm_registry::{run_in_process, CommConfig};
use symm_tests::accuracy::{measure, DATASETS};

fn main() {
    let mut args = std::env::args().skip(1);
    let ranks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1 << 16);
    println!("# allreduce(sum) accuracy: {ranks} ranks, {count} elements per rank, f64 reference");
    println!("# worst unit = max |err| / scale (scale: sum of block maxima for a format, sum of |x| otherwise)");
    println!("# pipeline = the same for the RFC's pipeline; =pipeline: symm's result equals it bit for bit");
    println!(
        "{:<6} {:<14} {:<18} {:>12} {:>12} {:>12} {:>6} {:>9} {:>12} {:>9}",
        "data",
        "format",
        "data set",
        "worst unit",
        "guaranteed",
        "worst rel",
        "viol",
        "inf/nan",
        "pipeline",
        "=pipeline"
    );
    let formats = [None, Some(DType::F16), Some(DType::BF16), Some(DType::F8E4M3), Some(DType::F8E5M2)];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for lp in formats {
            for set in DATASETS {
                let results = run_in_process(ranks, CommConfig::with_heap_size(256 << 20), |comm| {
                    measure(&comm, set, dtype, lp, count)
                });
                let m = results.into_iter().next().expect("rank 0").expect("start-up");
                let pipeline = match (lp, m.pipeline_differs) {
                    (None, _) => "-".to_string(),
                    (Some(_), 0) => "yes".to_string(),
                    (Some(_), d) => format!("{d} differ"),
                };
                println!(
                    "{:<6} {:<14} {:<18} {:>12.3e} {:>12.3e} {:>12.3e} {:>6} {:>9} {:>12.3e} {:>9}",
                    dtype.name(),
                    lp.map_or("none", |d| d.name()),
                    set,
                    m.worst_unit,
                    m.guaranteed_unit,
                    m.worst_relative,
                    m.violations,
                    if m.nonfinite_ok { "ok" } else { "WRONG" },
                    m.pipeline_worst_unit,
                    pipeline
                );
            }
        }
    }
}
