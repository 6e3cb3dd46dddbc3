//! The ring's protocol in interleavings the property tests do not reach, step by step on
//! one key's words.

use std::time::Duration;

use super::*;
use crate::layout::Policy;
use crate::limit::Limit;
use crate::protocol::OwnedState;

const MS: u64 = 1_000_000;

/// A check that read `cur` before another check's rollback, and closes the slot after a
/// third check already did, writes the count it read: the ring's entry for the slot then
/// holds a rolled-back unit the carried `sum` never counted. When that slot leaves the
/// window, the sum must not have the entry subtracted from it (`carried_sum`), or the
/// window forgets a unit still inside it and admits one too many.
#[test]
fn a_stale_closer_after_a_rollback() {
    let limit = Limit::per_minute(11).precision(Duration::from_secs(1)).strict();
    let policy = Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}"));
    let owned = OwnedState::new(&policy, 0);
    let state = owned.state();
    let words: &Words = &state;
    let Some(rule) = policy.rules.first() else { panic!("one limit") };
    // One check at `now` on its own: view, decide, commit (again if the CAS lost).
    let admit = |now: u64| loop {
        let view = words.view(rule, now, false);
        if !view.admits(rule, 1) {
            return false;
        }
        if words.commit(rule, &view, 1) {
            return true;
        }
    };
    // Slot 5 (5.5 s): six units; then a check of several limits (B) counts a seventh.
    for _ in 0..7 {
        assert!(admit(5_500 * MS));
    }
    // A, a check at 6.5 s, reads cur = (slot 5, 7 units): a move that would close slot 5.
    let stale = words.view(rule, 6_500 * MS, false);
    // B's later limit refused: B takes its unit back, slot 5 holds 6.
    let (slot5, _) = rule.slot_of(5_500 * MS);
    words.rollback(rule, slot5, 1);
    // C, at 7.5 s, closes slot 5 with its 6 units and counts one in slot 7.
    assert!(admit(7_500 * MS));
    // A resumes: it writes 7 for slot 5 into the ring (the larger count wins), and its
    // CAS on `cur` fails, so it counts nothing.
    assert!(!words.commit(rule, &stale, 1));
    // Three more in slot 7 (6 + 4 = 10), one in slot 8 (which closes slot 7): 11, full.
    for _ in 0..3 {
        assert!(admit(7_600 * MS));
    }
    assert!(admit(8_500 * MS));
    assert!(!admit(8_600 * MS), "11 units in a window of 11");
    // A request of 7 fits once slot 7 has left (68 s: slot 8's 1 unit remains), not when
    // slot 5 has (66 s: 5 units remain, 4 would fit).
    let view = words.view(rule, 8_600 * MS, false);
    assert!(!view.admits(rule, 7));
    let at = words.admissible_at(rule, &view, 7).unwrap_or_else(|at| panic!("lost a slot: {at}"));
    assert_eq!(Duration::from_nanos(at), Duration::from_secs(68), "the wait of a request of 7");
    // At 66.5 s slot 5 has left the strict window (slots 6 to 66); slots 7 and 8 still
    // hold 5 units, so exactly 6 more fit.
    let mut admitted = 0;
    while admitted <= 11 && admit(66_500 * MS) {
        admitted += 1;
    }
    assert_eq!(admitted, 6, "5 units in the window, and {admitted} more admitted under a strict 11/min");
}
