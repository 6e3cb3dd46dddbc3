//! Loom models of the three algorithms beside the sliding window (`algorithm/fixed.rs`,
//! `gcra.rs`, `log.rs`) under the shared admission protocol of `KeyState::check`
//! (protocol/mod.rs): a view (loads only), one CAS per limit to count, rollback of the limits
//! already committed when a later one refuses, and retirement. The fixed window's word is
//! `(window tag, count)`, GCRA's a theoretical arrival time, the sliding log's the address of
//! an immutable snapshot of timestamps (`DETACHED` once the state is retired).
//!
//! Every model runs once per algorithm: `<model>::fixed_window`, `<model>::gcra`,
//! `<model>::sliding_log`. With the clock frozen, a race must be equivalent to some
//! sequential run (same decisions, same counts left behind); a check racing a retirement
//! must be decided before it or answer `Retired`.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test algorithms`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::{Algorithm, Outcome, OwnedState, Policy};
use slidegate::{Decision, Denial, Limit};
use slidegate_loom_tests::{
    assert_sequential, peek, policy_with, race_with, sequential, take, units_with, Reached, MS,
};

/// Time of every check in the frozen-clock models: inside the first window of every limit
/// used with it, so no window moves while the threads race.
const NOW: u64 = 500 * MS;

/// One `#[test]` per algorithm for each model function: `<model>::fixed_window`,
/// `<model>::gcra` and `<model>::sliding_log`.
macro_rules! per_algorithm {
    ($($model:ident),* $(,)?) => {
        $(
            mod $model {
                use slidegate::model::Algorithm;

                #[test]
                fn fixed_window() {
                    super::$model(Algorithm::FixedWindow)
                }

                #[test]
                fn gcra() {
                    super::$model(Algorithm::Gcra)
                }

                #[test]
                fn sliding_log() {
                    super::$model(Algorithm::SlidingLog)
                }
            }
        )*
    };
}

per_algorithm!(
    two_threads_at_the_limit,
    three_threads_share_two_units,
    uneven_costs_at_the_limit,
    several_limits_roll_back,
    check_races_a_reset,
    check_races_a_reset_across_limits,
    check_races_eviction,
    check_races_eviction_across_limits,
);

/// `retry_after` of a cost-1 request refused at `NOW` by 2/s holding 2 units taken at `NOW`.
fn retry_when_full(algorithm: Algorithm) -> Duration {
    match algorithm {
        // The next window starts at 1 s.
        Algorithm::FixedWindow => Duration::from_millis(500),
        // The arrival time is 1.5 s (2 units of 0.5 s from 0.5 s); one more would take it to
        // 2 s, which is within the 1 s burst of the clock from 1 s on.
        Algorithm::Gcra => Duration::from_millis(500),
        // The oldest unit (0.5 s) leaves the window at 1.5 s.
        Algorithm::SlidingLog => Duration::from_secs(1),
        Algorithm::SlidingWindow => unreachable!("modelled in at_the_limit.rs"),
    }
}

/// Sorted `remaining` of the admitted decisions.
fn admitted_remaining(d: &[Decision]) -> Vec<u64> {
    let mut left: Vec<u64> = d.iter().filter(|d| d.is_allowed()).map(Decision::remaining).collect();
    left.sort_unstable();
    left
}

/// Two threads each take two cost-1 units at a frozen clock from 2/s: four CAS races for
/// two units. Exactly `max` (2) are admitted, one seeing 1 left and the other 0; both
/// refusals are the refusal a sequential run gives (nothing left, the exact `retry_after`,
/// which is positive); afterwards the limit holds exactly 2 and a cost-1 peek is refused
/// with that same decision.
fn two_threads_at_the_limit(algorithm: Algorithm) {
    loom::model(move || {
        let limits = [Limit::per_second(2)];
        let policy = policy_with(&limits, algorithm);
        let state = Arc::new(OwnedState::new(&policy, 0));
        let spawn = || {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || [take(&state, &policy, NOW, 1), take(&state, &policy, NOW, 1)])
        };
        let (a, b) = (spawn(), spawn());
        let d: Vec<Decision> = a.join().unwrap().into_iter().chain(b.join().unwrap()).collect();
        assert_eq!(admitted_remaining(&d), [0, 1], "{d:?}");
        let refusal = sequential(&policy, NOW, &[1, 1, 1])[2];
        assert!(!refusal.is_allowed() && refusal.remaining() == 0, "{refusal:?}");
        assert_eq!(refusal.retry_after(), Some(retry_when_full(algorithm)));
        for r in d.iter().filter(|d| !d.is_allowed()) {
            assert_eq!(*r, refusal);
        }
        assert_eq!(units_with(&state, algorithm, &limits, 0, NOW), 2);
        assert_eq!(peek(&state, &policy, NOW), refusal);
    });
}

/// Three threads, one cost-1 unit each, against 2/s at a frozen clock: the decisions are
/// those of a sequential run in some order (admitted with 1 then 0 left, then one refusal
/// with a positive `retry_after`), the limit holds exactly 2 and a cost-1 peek is refused.
fn three_threads_share_two_units(algorithm: Algorithm) {
    loom::model(move || {
        let limits = [Limit::per_second(2)];
        let policy = policy_with(&limits, algorithm);
        let (state, d) = race_with(&limits, algorithm, NOW, &[1, 1, 1]);
        assert_sequential(&policy, NOW, &[1, 1, 1], &d);
        assert_eq!(admitted_remaining(&d), [0, 1], "{d:?}");
        let refused = d.iter().find(|d| !d.is_allowed()).unwrap();
        assert_eq!(refused.retry_after(), Some(retry_when_full(algorithm)));
        assert_eq!(units_with(&state, algorithm, &limits, 0, NOW), 2);
        assert!(!peek(&state, &policy, NOW).is_allowed());
    });
}

/// Costs 2 and 1 against 2/s at a frozen clock: either fits alone, not both. Exactly one is
/// admitted, the decisions are those of the sequential run in the order the CASes took, and
/// the limit holds exactly the admitted cost (a log entry per unit, a count, or an arrival
/// time of that many intervals). Both winners are explored.
fn uneven_costs_at_the_limit(algorithm: Algorithm) {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let limits = [Limit::per_second(2)];
        let policy = policy_with(&limits, algorithm);
        let (state, d) = race_with(&limits, algorithm, NOW, &[2, 1]);
        assert_sequential(&policy, NOW, &[2, 1], &d);
        assert_eq!(d.iter().filter(|d| d.is_allowed()).count(), 1, "{d:?}");
        let admitted: u64 = [2, 1].iter().zip(&d).filter(|(_, d)| d.is_allowed()).map(|(c, _)| c).sum();
        assert_eq!(units_with(&state, algorithm, &limits, 0, NOW), admitted);
        assert_eq!(peek(&state, &policy, NOW).is_allowed(), admitted == 1);
        seen.record(admitted, &[1, 2]);
    });
    reached.assert_all(&[1, 2]);
}

/// Rollback across limits: 4 per 4 s first, then the tighter 3 per 100 ms; two threads of
/// cost 2 at a frozen clock. Both fit the first limit together, so both can commit there;
/// the second holds only one of them, so the thread whose CAS on it loses re-reads it, finds
/// it full and must take its 2 units back out of the first limit (a count decrement, an
/// arrival time moved back by 2 intervals, or a log snapshot without 2 of its entries).
///
/// Asserts: exactly one is admitted; the loser's decision is the sequential refusal (by the
/// second limit, positive `retry_after`); each limit holds exactly 2 units at `NOW`; and at
/// 600 ms, when the 100 ms limit is empty again but the first still holds the winner's 2,
/// exactly 2 more units are admitted one by one, the next refused by the first limit. (A
/// rollback that left units behind admits fewer; one that took back too much, 3.)
///
/// The winner's `remaining` is the sequential 1, or 0 when it counted into the first limit
/// while the loser's units were still there (its view saw them: conservative, and the
/// evidence that the rollback path ran). Every (winner, remaining) pair is explored.
///
/// GCRA takes a commit back only while it is the last commit on the word (a TAT cannot be
/// rewound past a later commit exactly: `algorithm/gcra.rs`, `gcra_rollback.rs`). A winner
/// that counted into the first limit while the loser's units were there (remaining 0)
/// committed on top of the loser's commit, so the loser's 2 units stay there (conservative:
/// the first limit holds 4, the loser's retry is refused by it, and nothing more fits at
/// 600 ms). Those outcomes are legal for GCRA only, and explored.
fn several_limits_roll_back(algorithm: Algorithm) {
    // (winner, its remaining, units the first limit holds beyond the admitted 2)
    const LEGAL: [(usize, u64, u64); 4] = [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)];
    const GCRA: [(usize, u64, u64); 4] = [(0, 0, 2), (0, 1, 0), (1, 0, 2), (1, 1, 0)];
    const PROBE: u64 = 600 * MS;
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let limits = [Limit::new(4, Duration::from_secs(4)), Limit::new(3, Duration::from_millis(100))];
        let policy = policy_with(&limits, algorithm);
        let (state, d) = race_with(&limits, algorithm, NOW, &[2, 2]);
        let winner = d.iter().position(Decision::is_allowed).unwrap();
        let loser = d[1 - winner];
        let residue = units_with(&state, algorithm, &limits, 0, NOW) - 2;
        if residue > 0 {
            assert_eq!(algorithm, Algorithm::Gcra, "a rollback left {residue} units: {d:?}");
            assert_eq!((residue, loser.denial()), (2, Some(Denial::Limit(0))), "{d:?}");
            assert_eq!(units_with(&state, algorithm, &limits, 1, NOW), 2, "{d:?}");
            assert!(!take(&state, &policy, PROBE, 1).is_allowed(), "{d:?}");
            seen.record((winner, d[winner].remaining(), residue), &GCRA);
            return;
        }
        let want = sequential(&policy, NOW, &[2, 2]);
        assert_eq!(loser, want[1], "{d:?}");
        assert_eq!(loser.denial(), Some(Denial::Limit(1)));
        assert!(loser.retry_after().is_some_and(|t| t > Duration::ZERO), "{loser:?}");
        for j in 0..limits.len() {
            assert_eq!(units_with(&state, algorithm, &limits, j, NOW), 2, "limit {j}: {d:?}");
        }
        let mut more = 0;
        let refused = loop {
            let next = take(&state, &policy, PROBE, 1);
            if !next.is_allowed() {
                break next;
            }
            more += 1;
            assert!(more <= 4, "no limit refuses");
        };
        assert_eq!(more, 2, "units admitted at {PROBE} ns after the race {d:?}");
        assert_eq!(refused.denial(), Some(Denial::Limit(0)));
        let legal = if algorithm == Algorithm::Gcra { &GCRA } else { &LEGAL };
        seen.record((winner, d[winner].remaining(), 0), legal);
    });
    reached.assert_all(if algorithm == Algorithm::Gcra { &GCRA } else { &LEGAL });
}

/// A check of cost 1 (at `NOW`, on a state holding one unit taken then) against an explicit
/// reset of the key (`retire_now`) on another thread. Either the check is decided first,
/// exactly as sequentially (admitted, 1 left of 3), or it finds the state retired, before or
/// after its commit, and answers `Retired`: never `Expired`, never a panic or an endless
/// retry (a CAS on a log word swapped to `DETACHED` fails, and the next view sees it).
/// Afterwards the state is retired and every check, counting or not, answers `Retired`.
fn check_races_a_reset(algorithm: Algorithm) {
    check_vs_retire_now(algorithm, vec![Limit::per_second(3)]);
}

/// As `check_races_a_reset` with two limits (3/s and 3 per 2 s), so the check commits limit
/// by limit (`check_all`) while the reset retires the limits one by one: for the sliding log,
/// a check that committed the first limit and then finds the second `DETACHED` must roll back
/// (finding the first detached too, or detaching with it) and answer `Retired`.
fn check_races_a_reset_across_limits(algorithm: Algorithm) {
    check_vs_retire_now(algorithm, vec![Limit::per_second(3), Limit::new(3, Duration::from_secs(2))]);
}

fn check_vs_retire_now(algorithm: Algorithm, limits: Vec<Limit>) {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let policy = policy_with(&limits, algorithm);
        let want = sequential(&policy, NOW, &[1, 1])[1];
        let state = Arc::new(OwnedState::new(&policy, 0));
        assert!(take(&state, &policy, NOW, 1).is_allowed());
        let checker = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || state.check(&policy, NOW, 1, true))
        };
        let resetter = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || state.retire_now(&policy))
        };
        let outcome = checker.join().unwrap();
        resetter.join().unwrap();
        let retired = assert_decided_or_retired(outcome, want);
        assert_stays_retired(&state, &policy, NOW);
        seen.record(retired, &[false, true]);
    });
    reached.assert_all(&[false, true]);
}

/// A check against an eviction (`retire` at the sweeper's clock) on a state of 2/s (expiry
/// 2 s for every algorithm: window or burst 1 s, plus a 1 s slot) holding one unit taken at
/// 0. The check, at 1.2 s, is in a later slot, so before its commit it raises `touched` to
/// 1.2 s; the sweeper, at 2.5 s, finds the key expired unless it reads that raise. Exactly
/// one wins: the check is decided (exactly as sequentially) and the state is not retired,
/// not expired at 2.5 s and holds the check's unit; or the retirement comes first (its CAS
/// on `touched` before the check's raise, which then finds the marker and commits nothing)
/// and the check answers `Retired`. Both are explored.
fn check_races_eviction(algorithm: Algorithm) {
    check_vs_retire(algorithm, vec![Limit::per_second(2)]);
}

/// As `check_races_eviction` with two limits of one window (2/s and 3/s, same expiry), so
/// the check commits limit by limit (`check_all`) while the retirement detaches them.
fn check_races_eviction_across_limits(algorithm: Algorithm) {
    check_vs_retire(algorithm, vec![Limit::per_second(2), Limit::per_second(3)]);
}

fn check_vs_retire(algorithm: Algorithm, limits: Vec<Limit>) {
    const CHECK: u64 = 1200 * MS;
    const SWEEP: u64 = 2500 * MS;
    const LEGAL: [(bool, bool); 2] = [(false, false), (true, true)];
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let policy = policy_with(&limits, algorithm);
        let fresh = |policy: &std::sync::Arc<Policy>| {
            let state = OwnedState::new(policy, 0);
            assert!(take(&state, policy, 0, 1).is_allowed());
            state
        };
        let want = take(&fresh(&policy), &policy, CHECK, 1);
        let state = Arc::new(fresh(&policy));
        assert!(state.is_expired(&policy, SWEEP), "the model needs a key expired at the sweep");
        let checker = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || state.check(&policy, CHECK, 1, true))
        };
        let sweeper = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || state.retire(&policy, SWEEP))
        };
        let (outcome, evicted) = (checker.join().unwrap(), sweeper.join().unwrap());
        let retired = assert_decided_or_retired(outcome, want);
        if evicted {
            assert_stays_retired(&state, &policy, CHECK);
        } else {
            assert!(!state.is_retired() && !state.is_expired(&policy, SWEEP));
            for j in 0..limits.len() {
                assert_eq!(units_with(&state, algorithm, &limits, j, CHECK), 1, "limit {j}");
            }
        }
        seen.record((retired, evicted), &LEGAL);
    });
    reached.assert_all(&LEGAL);
}

/// Asserts that a check racing a retirement was decided exactly as `want`, or answered
/// `Retired`; returns whether it was retired.
fn assert_decided_or_retired(outcome: Outcome, want: Decision) -> bool {
    match outcome {
        Outcome::Decided(d) => {
            assert_eq!(d, want);
            false
        }
        Outcome::Retired => true,
        Outcome::Expired => panic!("a check on an unexpired key answered Expired"),
    }
}

/// After a retirement: the state says so, and every check on it starts over on the map.
fn assert_stays_retired(state: &OwnedState, policy: &std::sync::Arc<Policy>, now: u64) {
    assert!(state.is_retired());
    for (cost, commit) in [(1, true), (1, false), (0, false)] {
        assert_eq!(state.check(policy, now, cost, commit), Outcome::Retired);
    }
}
