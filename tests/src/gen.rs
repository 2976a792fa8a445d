//! Deterministic case generation: every rank draws the same cases from the same seed, so the
//! ranks of a world agree on what to do without talking.

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Draws `count` values of `strategy`, identically on every rank for the same `seed`.
pub fn draw<S: Strategy>(strategy: S, count: usize, seed: u64) -> Vec<S::Value> {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    (0..count).map(|_| strategy.new_tree(&mut runner).expect("strategy never rejects").current()).collect()
}

/// A number setting of the suite (`None`: unset); a refused value stops the run, naming it.
pub fn setting(var: &symm_core::config::Var) -> Option<u64> {
    symm_core::config::test_number(&symm_core::config::environment, var).unwrap_or_else(|e| panic!("{e}"))
}

/// The seed for this run: `SYMM_TEST_SEED` if set (to replay a failure), else fixed per case.
pub fn seed(case: &str) -> u64 {
    setting(&symm_core::config::TEST_SEED).unwrap_or_else(|| {
        case.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    })
}
