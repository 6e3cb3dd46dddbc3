//! Loom models of admission across several limits (`KeyState::check`, `rollback` in
//! protocol/mod.rs): a request is committed limit by limit, one CAS each; when a later limit's CAS
//! loses a race and the limit no longer admits, the limits already committed are rolled
//! back and the check starts over. No limit may ever hold more than its max, and with the
//! clock frozen (no slot closes between commit and rollback) a rollback must leave nothing
//! behind: every limit ends up counting exactly the admitted units.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::OwnedState;
use slidegate::{Decision, Denial, Limit};
use slidegate_loom_tests::{peek, policy, race_at, take, units, Reached, MS};

/// Time of every check: inside the slot the state was created in, so no slot moves.
const NOW: u64 = 500 * MS;

/// One thread per cost against a fresh state under `limits`, all at `NOW`.
fn race(limits: &[Limit], costs: &'static [u64]) -> (Arc<OwnedState>, Vec<Decision>) {
    slidegate_loom_tests::race(limits, NOW, costs)
}

/// Checks the state `race` left: each limit counts exactly the admitted units, and that is
/// within its max. Returns the admitted units.
fn assert_exact(state: &OwnedState, limits: &[Limit], costs: &[u64], d: &[Decision]) -> u64 {
    let admitted: u64 = costs.iter().zip(d).filter(|(_, d)| d.is_allowed()).map(|(c, _)| c).sum();
    for (j, limit) in limits.iter().enumerate() {
        let held = units(state, limits, j, NOW);
        assert!(held <= limit.max(), "limit {j} holds {held} > {}", limit.max());
        assert_eq!(held, admitted, "limit {j} holds {held}, admitted {admitted}: {d:?}");
    }
    admitted
}

/// 2/s first (room for both threads), then 1 per 2 s (room for one). Both threads can
/// commit into the first limit; the one whose CAS on the second loses must roll the first
/// back, or 2/s would be left holding a unit nobody was admitted for.
#[test]
fn several_limits_roll_back() {
    static REACHED: Reached<[bool; 2]> = Reached::new();
    loom::model(|| {
        let limits = [Limit::per_second(2), Limit::new(1, Duration::from_secs(2))];
        let (state, d) = race(&limits, &[1, 1]);
        assert_eq!(assert_exact(&state, &limits, &[1, 1], &d), 1);
        let loser = d.iter().find(|d| !d.is_allowed()).unwrap();
        assert_eq!(loser.denial(), Some(Denial::Limit(1)), "{loser:?}");
        // The policy's own peek agrees: the second limit is full. The first has 1 left: a
        // cost-1 peek through a policy of it alone (a prefix of the layout) admits, 0 after.
        assert!(!peek(&state, &policy(&limits), NOW).is_allowed());
        let first = peek(&state, &policy(&limits[..1]), NOW);
        assert!(first.is_allowed() && first.remaining() == 0, "{first:?}");
        REACHED.record([d[0].is_allowed(), d[1].is_allowed()], &[[true, false], [false, true]]);
    });
    REACHED.assert_all(&[[true, false], [false, true]]);
}

/// Uneven costs: 3/s first (room for both), then 2 per 2 s (room for either, not both).
/// A rollback of 2 units after a rival's 1 (or of 1 after a rival's 2) must take back
/// exactly its own cost.
#[test]
fn several_limits_roll_back_uneven_costs() {
    static REACHED: Reached<u64> = Reached::new();
    loom::model(|| {
        let limits = [Limit::per_second(3), Limit::new(2, Duration::from_secs(2))];
        let (state, d) = race(&limits, &[2, 1]);
        assert_eq!(d.iter().filter(|d| d.is_allowed()).count(), 1, "{d:?}");
        let admitted = assert_exact(&state, &limits, &[2, 1], &d);
        REACHED.record(admitted, &[1, 2]);
    });
    REACHED.assert_all(&[1, 2]);
}

/// The one error the module docs allow: a rollback that finds its slot already closed
/// leaves its units counted there (conservative: it can only refuse more, never admit
/// more). Limits: 10 per 2 s in 1 s slots, then 1 per 0.5 s. T (0.6 s) commits to the
/// first; C (1.5 s) closes the first limit's slot [0 s, 1 s) with T's unit in it and takes
/// the second limit's unit in its slot [1.5 s, 2 s), which T adopts on its retry (C shows
/// that time has reached 1.5 s) and finds full. T is refused and its rollback finds the
/// slot closed: the first limit holds 1 unit more than was admitted, never more, never less.
#[test]
fn rollback_after_the_slot_closed_over_counts_at_most_its_cost() {
    // (admitted, units the first limit holds beyond them)
    const LEGAL: [(u64, u64); 3] = [
        (2, 0), // T, then C: T's unit left the second limit's window by 1.5 s
        (1, 0), // C first: T adopts C's slots and is refused before committing anything
        (1, 1), // T's rollback came after C closed its slot: T's unit stays counted
    ];
    static REACHED: Reached<(u64, u64)> = Reached::new();
    loom::model(|| {
        let limits = closer_and_gate();
        let (state, [t, c]) = race_at(&limits, [600 * MS, 1500 * MS]);
        assert!(c.is_allowed(), "C {c:?}");
        let admitted = 1 + u64::from(t.is_allowed());
        // At 1.5 s the first limit's window covers [0 s, 2 s), every slot used; the second
        // limit's covers [1 s, 2 s), where only C's unit (or T's, adopted) can be.
        let held = units(&state, &limits, 0, 1500 * MS);
        assert!(held >= admitted, "first limit holds {held} < {admitted} admitted");
        assert_eq!(units(&state, &limits, 1, 1500 * MS), 1);
        REACHED.record((admitted, held - admitted), &LEGAL);
    });
    REACHED.assert_all(&LEGAL);
}

/// The other way a rollback can leave its unit behind: T (0.6 s) commits to the first limit
/// (10 per 2 s, 1 s slots) and loses the second (1 per 0.5 s) to M's check at 0.6 s; M's
/// next check (1.5 s) goes to close the first limit's slot [0 s, 1 s) and writes its count,
/// T's unit included, into the ring; then T's rollback *succeeds* on `cur`, M's CAS fails,
/// and M's retry writes the smaller count, which `raise` ignores (it only raises). The
/// ring keeps T's unit although `cur` no longer had it. Conservative like the closed-slot
/// case, and bounded the same way: never fewer units than admitted, at most one more.
///
/// Exactly 2 of the 3 requests are admitted: one of T and M's first check in [0.5 s, 1 s)
/// of the second limit and M's second check in [1.5 s, 2 s), unless T adopted that slot
/// from M's ring writes first (then M's first check was admitted and its second refused).
#[test]
fn rollback_races_a_closer() {
    // (admitted, units the first limit holds beyond them)
    const LEGAL: [(u64, u64); 2] = [(2, 0), (2, 1)];
    static REACHED: Reached<(u64, u64)> = Reached::new();
    loom::model(|| {
        let limits = closer_and_gate();
        let policy = policy(&limits);
        let state = Arc::new(OwnedState::new(&policy, 0));
        let t = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || take(&state, &policy, 600 * MS, 1))
        };
        let m = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || [take(&state, &policy, 600 * MS, 1), take(&state, &policy, 1500 * MS, 1)])
        };
        let (t, m) = (t.join().unwrap(), m.join().unwrap());
        let admitted = [t, m[0], m[1]].iter().filter(|d| d.is_allowed()).count() as u64;
        // At 1.5 s the first limit's window covers [0 s, 2 s), every slot used.
        let held = units(&state, &limits, 0, 1500 * MS);
        assert!(held >= admitted, "first limit holds {held} < {admitted} admitted: T {t:?} M {m:?}");
        REACHED.record((admitted, held - admitted), &LEGAL);
    });
    REACHED.assert_all(&LEGAL);
}

/// The two limits of the rollback-meets-a-closed-slot models: 10 per 2 s in 1 s slots (the
/// one whose slot closes) and 1 per 0.5 s (the one that refuses and forces the rollback).
fn closer_and_gate() -> [Limit; 2] {
    [
        Limit::new(10, Duration::from_secs(2)).precision(Duration::from_secs(1)).strict(),
        Limit::new(1, Duration::from_millis(500)).strict(),
    ]
}
