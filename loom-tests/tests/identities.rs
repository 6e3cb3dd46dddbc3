//! Loom models of one request charged to several keys (`KeyState::check_many`, protocol/many.rs):
//! the several-limits protocol over several keys' states, without locks. Threads charging
//! the same two keys in opposite orders, or racing a single-key check, must admit exactly
//! what the limits allow, and a refused or rolled-back request must leave nothing counted
//! in any key.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::sync::Arc;

use slidegate::model::{Outcome, OwnedState, Policy};
use slidegate::Limit;
use slidegate_loom_tests::{peek, policy, Reached, MS};

const NOW: u64 = 500 * MS;

fn admitted(outcome: (Outcome, usize)) -> bool {
    match outcome.0 {
        Outcome::Decided(d) => d.is_allowed(),
        other => panic!("unexpected {other:?}"),
    }
}

/// Two fresh keys under `limit`, shared by the threads with the policy.
fn two_keys(limit: Limit) -> (Arc<(OwnedState, OwnedState)>, std::sync::Arc<Policy>) {
    let policy = policy(&[limit]);
    let states = Arc::new((OwnedState::new(&policy, 0), OwnedState::new(&policy, 0)));
    (states, policy)
}

#[test]
fn opposite_orders_share_the_last_unit() {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let (states, p) = two_keys(Limit::per_second(1));
        let spawn = |first: bool| {
            let states = Arc::clone(&states);
            loom::thread::spawn(move || {
                let (a, b) = (&states.0, &states.1);
                let keys = if first { [a, b] } else { [b, a] };
                admitted(OwnedState::check_many(&keys, NOW, 1))
            })
        };
        let (t1, t2) = (spawn(true), spawn(false));
        let (w1, w2) = (t1.join().unwrap(), t2.join().unwrap());
        // One request, one unit per key: exactly one of them gets both.
        assert!(w1 ^ w2, "{w1} {w2}");
        assert!(!peek(&states.0, &p, NOW).is_allowed());
        assert!(!peek(&states.1, &p, NOW).is_allowed());
        seen.record(if w1 { "first" } else { "second" }, &["first", "second"]);
    });
    reached.assert_all(&["first", "second"]);
}

/// Ignored: loom 0.7 reports an execution of this model that breaks RMW atomicity in
/// loom itself. Traced with prints: the single-key thread's SeqCst load of key 1's `cur`
/// returns the two-key thread's committed value, and its very next compare-exchange on the
/// same atomic still succeeds against the older value, so two CAS both "read" the initial
/// value (C11 coherence forbids this; see tokio-rs/loom#254, #389 and the unmerged fix
/// #391). The property is checked on real threads instead by
/// `tests/identities.rs::threads_charging_keys_in_opposite_orders_admit_exactly_the_limit`
/// (single-key checks racing two-key requests, 30 rounds of 6 threads, exact counts).
#[test]
#[ignore = "loom 0.7 breaks RMW atomicity in this execution (tokio-rs/loom#254); see the doc comment"]
fn a_single_key_check_races_a_request_on_two_keys() {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let (states, p) = two_keys(Limit::per_second(1));
        let both = {
            let states = Arc::clone(&states);
            loom::thread::spawn(move || admitted(OwnedState::check_many(&[&states.0, &states.1], NOW, 1)))
        };
        let alone = {
            let states = Arc::clone(&states);
            loom::thread::spawn(move || admitted(OwnedState::check_many(&[&states.1], NOW, 1)))
        };
        let (both, alone) = (both.join().unwrap(), alone.join().unwrap());
        // Key 1 has one unit: exactly one of the two requests gets it.
        assert!(both ^ alone, "{both} {alone}");
        // Key 0 holds a unit exactly when the two-key request was admitted: a commit to key
        // 0 followed by a refusal on key 1 was rolled back.
        assert_eq!(peek(&states.0, &p, NOW).is_allowed(), !both);
        seen.record(if both { "both" } else { "alone" }, &["both", "alone"]);
    });
    reached.assert_all(&["both", "alone"]);
}
