//! Loom models of admission in one slot (`KeyState::check`, protocol/mod.rs): with the clock
//! frozen, every admission is a CAS on the limit's `cur` word, so threads racing for the
//! last units of a limit must get exactly `max` of them between them, never more or fewer,
//! and the state left behind must read the same as after a sequential run.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;

use slidegate::model::OwnedState;
use slidegate::{Decision, Limit};
use slidegate_loom_tests::{peek, policy, units, Reached, MS, S};

/// Time of every check: inside the slot the state was created in, so no slot moves.
const NOW: u64 = 500 * MS;

/// Runs one thread per cost against a fresh state, all at `NOW`; decisions in cost order.
fn race(limit: Limit, costs: &'static [u64]) -> (Arc<OwnedState>, Vec<Decision>) {
    slidegate_loom_tests::race(&[limit], NOW, costs)
}

#[test]
fn two_threads_at_the_limit() {
    loom::model(|| {
        let limit = Limit::per_second(1);
        let (state, d) = race(limit, &[1, 1]);
        // Exactly one wins the single unit; the loser is refused with what a sequential
        // refusal would say.
        assert_eq!(d.iter().filter(|d| d.is_allowed()).count(), 1, "{d:?}");
        let loser = d.iter().find(|d| !d.is_allowed()).unwrap();
        assert_eq!(loser.remaining(), 0);
        assert!(loser.retry_after().is_some());
        assert_eq!(units(&state, &[limit], 0, NOW), 1);
        let after = peek(&state, &policy(&[limit]), NOW);
        assert!(!after.is_allowed());
        assert_eq!(after.remaining(), 0);
        // Interpolated: the unit of slot [0 s, 1 s) fades over [1 s, 2 s); one more fits at 2 s.
        assert_eq!(after.retry_after(), Some(Duration::from_nanos(2 * S - NOW)));
    });
}

#[test]
fn three_threads_share_two_units() {
    loom::model(|| {
        let limit = Limit::per_second(2);
        let (state, d) = race(limit, &[1, 1, 1]);
        let mut left: Vec<u64> = d.iter().filter(|d| d.is_allowed()).map(Decision::remaining).collect();
        left.sort_unstable();
        // Two admitted, in some order: the first saw 0 units (1 left after it), the second 1.
        assert_eq!(left, [0, 1], "{d:?}");
        assert_eq!(units(&state, &[limit], 0, NOW), 2);
        let after = peek(&state, &policy(&[limit]), NOW);
        assert!(!after.is_allowed());
        assert_eq!(after.remaining(), 0);
    });
}

#[test]
fn cost_two_and_cost_one_at_max_two() {
    static REACHED: Reached<u64> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(2);
        let (state, d) = race(limit, &[2, 1]);
        // Either fits alone, not both: exactly one is admitted, and exactly its cost is counted.
        assert_eq!(d.iter().filter(|d| d.is_allowed()).count(), 1, "{d:?}");
        let admitted: u64 = [2, 1].iter().zip(&d).filter(|(_, d)| d.is_allowed()).map(|(c, _)| c).sum();
        assert_eq!(units(&state, &[limit], 0, NOW), admitted);
        assert_eq!(peek(&state, &policy(&[limit]), NOW).is_allowed(), admitted == 1);
        REACHED.record(admitted, &[1, 2]);
    });
    REACHED.assert_all(&[1, 2]);
}
