//! Loom models of GCRA's rollback (`algorithm/gcra.rs`) under the admission protocol of
//! several limits (`KeyState::check`, protocol/mod.rs) and of several keys
//! (`KeyState::check_many`). A check commits its limits one CAS at a time; when a later
//! limit refuses, it takes back what it committed. A GCRA word is a theoretical arrival
//! time (TAT), and a commit at a clock past the TAT first moves the TAT up to that clock,
//! so a commit's units cannot be taken back by subtracting `cost × interval` once a check
//! with a later clock has committed after it: the later check's TAT starts from its own
//! clock, not from ours, and subtracting would rewind it past the later check's unit.
//!
//! The race needs no stall: X (at 0 ms) and Y (at 150 ms) each want one unit of 10/s
//! (interval 100 ms) and of 1/s. X commits the 10/s limit (TAT 100 ms), Y commits it from
//! its own clock (TAT 250 ms) and takes the 1/s limit, X finds the 1/s limit full and rolls
//! its unit back. Whatever the interleaving, every limit's TAT must be at least the TAT of
//! a sequential run of the checks that were admitted (conservative: a residue of the
//! rolled-back check may stay, never less than exact).
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test gcra_rollback`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::sync::Arc;
use loom::thread;
use slidegate::model::{Algorithm, Outcome, OwnedState, Policy};
use slidegate::Limit;
use slidegate_loom_tests::{policy_with, Reached, MS};

/// The two checks' clocks: on either side of the 10/s limit's interval (100 ms).
const X_AT: u64 = 0;
const Y_AT: u64 = 150 * MS;

/// What a test reads the TATs at: before both clocks, so that every unit a TAT holds shows
/// (`used` is the lag of the TAT behind this time, in whole intervals rounded up).
const PROBE: u64 = 0;

/// The loose limit (10/s: interval 100 ms) and the tight one (1/s: room for one unit).
fn loose_and_tight() -> [Limit; 2] {
    [Limit::per_second(10), Limit::per_second(1)]
}

fn decided(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Decided(d) => d.is_allowed(),
        other => panic!("unexpected {other:?}"),
    }
}

/// The units each limit of `policy` holds at `PROBE` after the checks at `admitted` clocks
/// are run one after another, in clock order, on a fresh state: what the race must hold at
/// least.
fn sequential_used(policy: &std::sync::Arc<Policy>, admitted: &[u64]) -> Vec<u64> {
    let state = OwnedState::new(policy, 0);
    for &at in admitted {
        assert!(decided(state.check(policy, at, 1, true)), "sequentially, the check at {at} ns is admitted");
    }
    state.used(policy, PROBE)
}

/// Asserts that `state` holds, in every limit, at least the units of a sequential run of the
/// admitted checks; returns the admitted checks (X, Y) and the units the loose limit holds
/// beyond exact.
fn assert_no_unit_lost(
    state: &OwnedState,
    policy: &std::sync::Arc<Policy>,
    (x, y): (bool, bool),
) -> ((bool, bool), u64) {
    let admitted: Vec<u64> = [(x, X_AT), (y, Y_AT)].iter().filter(|(a, _)| *a).map(|&(_, at)| at).collect();
    assert_eq!(admitted.len(), 1, "the 1/s limit has room for one: X {x}, Y {y}");
    let exact = sequential_used(policy, &admitted);
    let held = state.used(policy, PROBE);
    for (j, (&held, &exact)) in held.iter().zip(&exact).enumerate() {
        assert!(held >= exact, "limit {j} holds {held} units, fewer than the {exact} admitted: X {x}, Y {y}");
    }
    ((x, y), held[0] - exact[0])
}

/// One key, two limits (`check_all`): X at 0 ms and Y at 150 ms, one unit each. Exactly
/// one is admitted, and every limit holds at least the units of a sequential run of the
/// admitted check. The outcomes, as (admitted, units the 10/s limit holds beyond exact at
/// `PROBE`):
///
/// * Y wins, 0: Y's commit on the 10/s limit came after X's and moved the TAT from Y's
///   clock (250 ms); X's rollback finds Y's TAT there and leaves it (subtracting X's
///   100 ms instead would leave 150 ms: 2 units where Y's alone are 3), or X rolled back
///   before Y's commit.
/// * X wins, 0: Y's rollback found its own TAT on top and restored what it saw.
/// * X wins, 3: Y committed the 10/s limit first (TAT 250 ms, from Y's clock), X committed
///   on top of it (350 ms) and took the 1/s limit; Y's rollback finds X's TAT, so Y's unit
///   stays, counted from Y's clock: 350 ms where X's unit alone is 100 ms (the one
///   conservative outcome: refusals up to Y's unit and its 150 ms early, for as long as
///   they take to drain).
#[test]
fn rollback_keeps_a_later_clocks_commit() {
    // ((X admitted, Y admitted), units the loose limit holds beyond exact)
    const LEGAL: [((bool, bool), u64); 3] = [((false, true), 0), ((true, false), 0), ((true, false), 3)];
    static REACHED: Reached<((bool, bool), u64)> = Reached::new();
    loom::model(|| {
        let policy = policy_with(&loose_and_tight(), Algorithm::Gcra);
        let state = Arc::new(OwnedState::new(&policy, 0));
        let spawn = |at| {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || decided(state.check(&policy, at, 1, true)))
        };
        let (x, y) = (spawn(X_AT), spawn(Y_AT));
        let admitted = (x.join().unwrap(), y.join().unwrap());
        REACHED.record(assert_no_unit_lost(&state, &policy, admitted), &LEGAL);
    });
    REACHED.assert_all(&LEGAL);
}

/// Several keys (`check_many`): key A counts the loose limit alone, key B the loose limit
/// and then the tight one; X and Y charge both keys, at 0 ms and 150 ms. The states are
/// committed in address order, so either A's loose limit or B's is committed before B's
/// tight one: either way, the loser's rollback of a loose limit may follow the winner's
/// commit there, and must keep the winner's unit.
#[test]
fn rollback_across_keys_keeps_a_later_clocks_commit() {
    static REACHED: Reached<(bool, bool)> = Reached::new();
    loom::model(|| {
        let [loose, tight] = loose_and_tight();
        let (a_policy, b_policy) =
            (policy_with(&[loose], Algorithm::Gcra), policy_with(&[loose, tight], Algorithm::Gcra));
        let a = Arc::new(OwnedState::new(&a_policy, 0));
        let b = Arc::new(OwnedState::new(&b_policy, 0));
        let spawn = |at| {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || decided(OwnedState::check_many(&[&a, &b], at, 1).0))
        };
        let (x, y) = (spawn(X_AT), spawn(Y_AT));
        let admitted = (x.join().unwrap(), y.join().unwrap());
        let (winner, _) = assert_no_unit_lost(&b, &b_policy, admitted);
        let at = if admitted.0 { X_AT } else { Y_AT };
        let exact = sequential_used(&a_policy, &[at]);
        let held = a.used(&a_policy, PROBE);
        assert!(held[0] >= exact[0], "key A holds {} units, fewer than the {} admitted", held[0], exact[0]);
        REACHED.record(winner, &[(false, true), (true, false)]);
    });
    REACHED.assert_all(&[(false, true), (true, false)]);
}
