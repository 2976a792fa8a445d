//! The accuracy specification (docs/accuracy.md) enforced: on adversarial data, every
//! allreduce result lies within its guaranteed bound, inf/nan propagate, and with a transport
//! format every result equals the RFC's pipeline bit for bit.

use symm_core::DType;
use symm_registry::{run_in_process, CommConfig};
use symm_tests::accuracy::{measure, DATASETS};

#[test]
fn allreduce_sums_stay_within_the_specified_bounds() {
    let formats = [None, Some(DType::F16), Some(DType::BF16), Some(DType::F8E4M3), Some(DType::F8E5M2)];
    for n in [2, 3] {
        // One world per rank count; every configuration runs in it.
        let results = run_in_process(n, CommConfig::with_heap_size(128 << 20), |comm| {
            let mut failures = Vec::new();
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                for lp in formats {
                    for set in DATASETS {
                        // One size below the one-shot limit, one above (reduce-scatter + allgather).
                        for count in [3000, 70_000] {
                            let m = measure(&comm, set, dtype, lp, count);
                            if m.violations > 0 || !m.nonfinite_ok || m.pipeline_differs > 0 {
                                failures.push(format!("{n} ranks {dtype} via {lp:?} on {set} x {count}: {m:?}"));
                            }
                        }
                    }
                }
            }
            failures
        });
        for (r, res) in results.into_iter().enumerate() {
            let failures = res.expect("start-up");
            assert!(failures.is_empty(), "rank {r}: {failures:#?}");
        }
    }
}
