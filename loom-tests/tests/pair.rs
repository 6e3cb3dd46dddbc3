//! Loom models of a window of one slot held in one word (`algorithm/sliding/pair.rs`): the
//! current and previous slots' counts beside the tag, the slot's turn made by the
//! admitting CAS itself, and a rollback that follows its units into the previous slot's
//! count when another check turned the word meanwhile. (The other models run pairs too:
//! every `Limit::per_second` of theirs is one.)
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Decision, Limit};
use slidegate_loom_tests::{policy, race_at, units, Reached, MS};

/// Strict 1/s: a check at 0.9 s and one at 1.1 s, the second turning the word to the next
/// slot. The strict window at 1.1 s still counts slot [0 s, 1 s) whole, so exactly one is
/// admitted, whichever comes first: the turn keeps the first's unit as the previous
/// slot's count, and a check at 0.9 s that finds the word already turned adopts the later
/// slot and its counts. Either way the word ends holding one unit, and the refused check
/// waits until the admitted unit's slot has left the strict window, which counts the
/// previous slot whole: until 2 s for a unit in [0 s, 1 s), 3 s for one in [1 s, 2 s). (A
/// check at 0.9 s that read the later slot's counts as its own slot's would say 2 s.)
#[test]
fn a_commit_races_the_turn_of_its_word() {
    static REACHED: Reached<[bool; 2]> = Reached::new();
    loom::model(|| {
        let limits = [Limit::per_second(1).strict()];
        assert_eq!(policy(&limits).words_per_key(), 2, "touched and the pair word");
        let (state, [early, late]) = race_at(&limits, [900 * MS, 1100 * MS]);
        assert_eq!(units(&state, &limits, 0, 1100 * MS), 1, "early {early:?}, late {late:?}");
        let until = |d: &Decision, at: u64| d.retry_after().map(|w| at + w.as_nanos() as u64);
        let waits = [until(&early, 900 * MS), until(&late, 1100 * MS)];
        let exact = if early.is_allowed() { [None, Some(2000 * MS)] } else { [Some(3000 * MS), None] };
        assert_eq!(waits, exact, "early {early:?}, late {late:?}");
        REACHED.record([early.is_allowed(), late.is_allowed()], &[[true, false], [false, true]]);
    });
    REACHED.assert_all(&[[true, false], [false, true]]);
}

/// Strict 10/s as a pair, then a gate of 1 per 0.5 s. T (0.6 s) commits to the pair in
/// slot [0 s, 1 s); C (1.5 s) turns the pair's word to slot [1 s, 2 s), carrying T's unit
/// as the previous slot's count, and takes the gate's unit in [1.5 s, 2 s), which T adopts
/// on its retry and finds full. T is refused, and its rollback must take its unit back
/// from the previous slot's count: the ring leaves it counted there (the conservative
/// case of `several_limits.rs`), the pair does not, so the pair holds exactly the admitted
/// units in every interleaving.
#[test]
fn a_rollback_follows_its_units_across_the_turn() {
    // (admitted, units the pair holds beyond them)
    const LEGAL: [(u64, u64); 2] = [
        (2, 0), // T, then C
        (1, 0), // T refused: C first, or T's commit taken back after C's turn
    ];
    static REACHED: Reached<(u64, u64)> = Reached::new();
    loom::model(|| {
        let limits = [Limit::per_second(10).strict(), Limit::new(1, Duration::from_millis(500)).strict()];
        let (state, [t, c]) = race_at(&limits, [600 * MS, 1500 * MS]);
        assert!(c.is_allowed(), "C {c:?}");
        let admitted = 1 + u64::from(t.is_allowed());
        // At 1.5 s the strict window counts slots [0 s, 1 s) and [1 s, 2 s) whole.
        let held = units(&state, &limits, 0, 1500 * MS);
        assert!(held >= admitted, "the pair holds {held} < {admitted} admitted: T {t:?}");
        REACHED.record((admitted, held - admitted), &LEGAL);
    });
    REACHED.assert_all(&LEGAL);
}
