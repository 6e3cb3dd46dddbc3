//! Loom model of a rollback racing a `record` that saturates the count it takes units back
//! from (`rollback` of `algorithm/fixed.rs`, `sliding/mod.rs` and `log.rs`). A count that has
//! saturated (2³²−1 in a fixed window's word or a sliding window's `cur`; a sliding log
//! that keeps only its newest `MAX_LOG_UNITS` entries) no longer says how many units it
//! stands for, so taking a rolled-back check's units out of it could leave fewer than the
//! units that remain: the rollback must leave it saturated.
//!
//! X checks 2 units against a loose limit and then a tight one (3 units); R records more
//! units than any count holds at the same instant, in both limits. When R's units land
//! between X's commit on the loose limit and X's CAS on the tight one, X finds the tight
//! limit full and rolls its 2 units back out of the loose one, which R has saturated: the
//! loose limit must still count at least R's units (a count of 2³²−1, or a full log).
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test saturation`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::{Algorithm, Outcome, OwnedState};
use slidegate::{Limit, MAX_LOG_UNITS, MAX_UNITS};
use slidegate_loom_tests::{policy_with, Reached, MS};

/// Every operation's clock: inside the first slot of both limits.
const NOW: u64 = 500 * MS;

/// The most units one limit of `algorithm` counts for one commit (`Counter::MOST`).
fn most(algorithm: Algorithm) -> u64 {
    if algorithm == Algorithm::SlidingLog {
        MAX_LOG_UNITS
    } else {
        MAX_UNITS
    }
}

/// One `#[test]` per algorithm with a rollback that subtracts: `fixed_window`,
/// `sliding_window`, `sliding_log` (GCRA's restores the value it saw, `gcra_rollback.rs`).
mod rollback_keeps_a_saturated_count {
    use slidegate::model::Algorithm;

    #[test]
    fn fixed_window() {
        super::rollback_keeps_a_saturated_count(Algorithm::FixedWindow)
    }

    #[test]
    fn sliding_window() {
        super::rollback_keeps_a_saturated_count(Algorithm::SlidingWindow)
    }

    #[test]
    fn sliding_log() {
        super::rollback_keeps_a_saturated_count(Algorithm::SlidingLog)
    }
}

/// Both decisions of X are explored: admitted (R's record came after X's commits) and
/// refused (by the tight limit, which R's units fill); the interleaving in which X's
/// rollback meets R's saturated count is among the refusals.
fn rollback_keeps_a_saturated_count(algorithm: Algorithm) {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        // The loose limit's `max` is just below what a count holds, so that a count two
        // units short of saturated would leave room.
        let loose = Limit::new(most(algorithm) - 1, Duration::from_secs(1));
        let tight = Limit::new(3, Duration::from_secs(1));
        let limits = [loose, tight];
        let policy = policy_with(&limits, algorithm);
        let state = Arc::new(OwnedState::new(&policy, 0));
        let x = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || match state.check(&policy, NOW, 2, true) {
                Outcome::Decided(d) => d.is_allowed(),
                other => panic!("unexpected {other:?}"),
            })
        };
        let r = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || {
                let _ = state.state().add(&policy, NOW, u64::MAX);
            })
        };
        let admitted = x.join().unwrap();
        r.join().unwrap();
        // R's units (clamped to what a count holds) are counted whatever X did, and the
        // loose limit refuses everything.
        let used = state.used(&policy, NOW);
        assert!(used[0] >= most(algorithm), "the loose limit counts {} units, fewer than R's", used[0]);
        let probe = policy_with(&limits[..1], algorithm);
        assert!(!matches!(state.check(&probe, NOW, 1, false), Outcome::Decided(d) if d.is_allowed()));
        seen.record(admitted, &[false, true]);
    });
    reached.assert_all(&[false, true]);
}
