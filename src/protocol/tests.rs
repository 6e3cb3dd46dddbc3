//! The admission protocol's unit tests, on owned states.

use super::*;
use crate::limit::Limit;
use std::time::Duration;

const S: u64 = 1_000_000_000;

fn decided(o: Outcome) -> Decision {
    match o {
        Outcome::Decided(d) => d,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn two_bucket_example_from_the_seed_article() {
    // 500/min in one 60 s slot; 400 in the previous minute, 250 so far in this one;
    // 45 s into this minute the estimate is 250 + 400 × 15/60 = 350: allowed, 149 left.
    let limit = Limit::per_minute(500).precision(Duration::from_secs(60));
    let policy = Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}"));
    let state = OwnedState::new(&policy, 0);
    assert!(decided(state.check(&policy, 10 * S, 400, true)).is_allowed());
    assert!(decided(state.check(&policy, 104 * S, 250, true)).is_allowed());
    let d = decided(state.check(&policy, 105 * S, 1, true));
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 149);
}

#[test]
fn history_survives_a_jump_longer_than_the_ring() {
    let policy = Policy::new(&[Limit::per_second(3), Limit::per_minute(5)]).unwrap_or_else(|e| panic!("{e}"));
    let state = OwnedState::new(&policy, 0);
    for _ in 0..3 {
        assert!(decided(state.check(&policy, 0, 1, true)).is_allowed());
    }
    assert!(!decided(state.check(&policy, 0, 1, true)).is_allowed());
    // 10 s later the 1 s limit is empty but the minute still holds 3.
    let d = decided(state.check(&policy, 10 * S, 2, true));
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    let d = decided(state.check(&policy, 10 * S, 1, true));
    assert_eq!(d.denial(), Some(crate::Denial::Limit(1)));
    // The first 3 units leave the minute window at 61 s (strictly: when slot 0 is gone).
    // Slot 0's 3 units become the oldest slot at 60 s and fade linearly: 2 + 3·(1 − f) ≤ 4
    // from f = 1/3, i.e. 60.333333334 s (rounded up to the ns), 50.333333334 s from now.
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(50_333_333_334)));
}

/// The interpolated estimate's worst case, as the semantics guide states it: a slot's budget at
/// its very end, then a burst one window later, puts close to (never) 2 × max into one
/// window. Strict admits exactly max on the same pattern.
#[test]
fn interpolated_excess_stays_below_twice_max_and_strict_has_none() {
    const MS: u64 = 1_000_000;
    for (limit, want) in [(Limit::per_second(10), 19), (Limit::per_second(10).strict(), 10)] {
        let policy = Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}"));
        let state_owned = OwnedState::new(&policy, 0);
        let state = state_owned.state();
        let mut admitted = 0;
        for now in [999 * MS, 1998 * MS] {
            for _ in 0..20 {
                admitted += u64::from(decided(state.check(&policy, now, 1, true)).is_allowed());
            }
        }
        // Every admitted unit lies in (0.998 s, 1.998 s], one window.
        assert_eq!(admitted, want, "{limit}");
        assert!(admitted < 2 * limit.max());
    }
}

#[test]
fn expired_state_asks_for_a_reset() {
    let policy = Policy::new(&[Limit::per_second(1)]).unwrap_or_else(|e| panic!("{e}"));
    let state = OwnedState::new(&policy, 0);
    assert!(decided(state.check(&policy, 0, 1, true)).is_allowed());
    assert!(!state.is_expired(&policy, S));
    assert!(state.is_expired(&policy, 2 * S));
    assert_eq!(state.check(&policy, 2 * S, 1, true), Outcome::Expired);
    assert!(decided(state.check(&policy, 2 * S, 1, false)).is_allowed());
}

#[test]
fn only_an_expired_state_retires_and_then_every_check_starts_over() {
    let policy = Policy::new(&[Limit::per_second(1)]).unwrap_or_else(|e| panic!("{e}"));
    let state = OwnedState::new(&policy, 0);
    assert!(decided(state.check(&policy, 0, 1, true)).is_allowed());
    assert!(!state.retire(&policy, S), "1 s after its last unit the key still counts");
    assert!(state.retire(&policy, 2 * S));
    assert!(state.is_retired());
    assert!(!state.is_expired(&policy, u64::MAX), "retired is not expired");
    assert!(!state.retire(&policy, u64::MAX), "retires once");
    for commit in [true, false] {
        assert_eq!(state.check(&policy, 2 * S, 1, commit), Outcome::Retired);
    }
    let reset = OwnedState::new(&policy, 0);
    reset.retire_now(&policy);
    assert_eq!(reset.check(&policy, 0, 1, true), Outcome::Retired);
    // A clock saturated at the end of time is not the RETIRED marker.
    let late = OwnedState::new(&policy, u64::MAX);
    assert!(decided(late.check(&policy, u64::MAX, 1, true)).is_allowed());
    assert!(!late.is_retired());
}
