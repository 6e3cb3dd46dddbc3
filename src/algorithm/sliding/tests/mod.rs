//! The ring's protocol in interleavings the property tests do not reach, step by step on
//! one key's words.

use std::time::Duration;

use super::pair::FIELD_MOST;
use super::*;
use crate::layout::Policy;
use crate::limit::Limit;
use crate::protocol::OwnedState;

mod two_ways;

const MS: u64 = 1_000_000;

/// One check at `now` on its own: view, decide, commit (again if the CAS lost).
fn admit(words: &Words, rule: &Rule, now: u64) -> bool {
    loop {
        let view = words.view(rule, now, false);
        if !view.admits(rule, 1) {
            return false;
        }
        if words.commit(rule, &view, 1) {
            return true;
        }
    }
}

/// A strict 11/min on one key, stepped to where a check of several limits (B) has counted
/// a 7th unit in slot 5 (5.5 s) and taken it back, after A, a check at 6.5 s, read `cur`
/// with the 7 units (a move that would close slot 5, returned), and before C, at 7.5 s,
/// closed slot 5 with its 6 units and counted one in slot 7.
fn rolled_back(words: &Words, rule: &Rule) -> View {
    for _ in 0..7 {
        assert!(admit(words, rule, 5_500 * MS));
    }
    let stale = words.view(rule, 6_500 * MS, false);
    let (slot5, _) = rule.slot_of(5_500 * MS);
    words.rollback(rule, slot5, 1);
    assert!(admit(words, rule, 7_500 * MS));
    stale
}

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
    let admit = |now: u64| admit(words, rule, now);
    let stale = rolled_back(words, rule);
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

/// A's late write lands while a refusal computes its wait, between its count of the older
/// slots and its walk over them: the walk must not take slot 5 as 7 from a count of 6.
#[test]
fn a_stale_closer_during_a_wait() {
    let limit = Limit::per_minute(11).precision(Duration::from_secs(1)).strict();
    // Leaked, so that the hook (which must be 'static) can hold them: one small state.
    let policy = Box::leak(Box::new(Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}"))));
    let owned: &'static OwnedState = Box::leak(Box::new(OwnedState::new(policy, 0)));
    let words: &'static Words = Box::leak(Box::new(owned.state()));
    let Some(rule) = policy.rules.first() else { panic!("one limit") };
    let stale = rolled_back(words, rule);
    for _ in 0..3 {
        assert!(admit(words, rule, 7_600 * MS));
    }
    assert!(admit(words, rule, 8_500 * MS));
    let view = words.view(rule, 8_600 * MS, false);
    assert!(!view.admits(rule, 7));
    super::wait::BETWEEN_COUNT_AND_WALK.with(|hook| {
        *hook.borrow_mut() = Some(Box::new(move || {
            assert!(!words.commit(rule, &stale, 1), "A's CAS fails; its write to the ring stays");
        }));
    });
    // Slots 7 and 8 hold 5 units once slot 5 has left (66 s): a request of 7 fits only once
    // slot 7 has left too (68 s). An answer the walk could not trust is later still.
    let at = words.admissible_at(rule, &view, 7).unwrap_or_else(|at| at);
    assert!(Duration::from_nanos(at) >= Duration::from_secs(68), "the wait of a request of 7: {at} ns");
}

/// A policy of `limit` alone that keeps a ring even for one slot (not a pair word).
fn ring_policy(limit: Limit) -> std::sync::Arc<Policy> {
    ring_policy_of(limit, crate::layout::NARROWEST)
}

/// [`ring_policy`] with entries of at least `bits`.
fn ring_policy_of(limit: Limit, bits: u32) -> std::sync::Arc<Policy> {
    crate::layout::NO_PAIRS.with(|set| set.set(true));
    let policy = Policy::with_entries(
        &[limit],
        crate::algorithm::Algorithm::SlidingWindow,
        &[bits; crate::layout::MAX_LIMITS],
    );
    crate::layout::NO_PAIRS.with(|set| set.set(false));
    std::sync::Arc::new(policy.unwrap_or_else(|e| panic!("{e}")))
}

/// Case `case`'s `max` and limit for the ring-reading tests: every entry width from 2 to 32
/// bits (`max` 1 to 2·10⁷), in narrow words (slots of 1 s and 4 s) and wide ones (100 ms).
fn ring_case(case: usize) -> (u64, Limit) {
    let max = [1, 3, 40, 200, 1_000, 60_000, 70_000, 20_000_000].get(case % 8).copied().unwrap_or(1);
    let limit = match case % 3 {
        0 => Limit::per_minute(max),
        1 => Limit::per_minute(max).precision(Duration::from_secs(4)),
        _ => Limit::per_second(max).precision(Duration::from_millis(100)),
    };
    (max, limit)
}

/// Case `case`'s `max` and limit for the burst tests: one to sixty slots, entries of 2 to
/// 32 bits.
fn burst_case(case: usize) -> (u64, Limit) {
    let max = [1, 2, 5, 40, 300, 70_000, 20_000_000].get(case % 7).copied().unwrap_or(1);
    let limit = match case % 4 {
        0 => Limit::per_second(max),
        1 => Limit::per_minute(max),
        2 => Limit::per_minute(max).precision(Duration::from_secs(20)),
        _ => Limit::per_second(max).precision(Duration::from_millis(250)),
    };
    (max, limit)
}

/// Runs `body` on the words of a fresh key under a policy of `limit` alone (a ring, even
/// of one slot), and its rule.
fn on_one_limit<T>(limit: Limit, body: impl FnOnce(&Words, &Rule) -> T) -> T {
    let policy = ring_policy(limit);
    let owned = OwnedState::new(&policy, 0);
    let state = owned.state();
    let Some(rule) = policy.rules.first() else { panic!("one limit") };
    body(&state, rule)
}

/// A deterministic stream of draws below a bound (xorshift from `seed`).
fn draws(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed.checked_rem(below).unwrap_or(0)
    }
}

/// A burst at `now`: as much of a request of `units` as fits, in one commit.
fn burst(words: &Words, rule: &Rule, now: u64, units: u64) {
    let units = units.min(words.view(rule, now, false).room(rule, 0));
    while units > 0 && !words.commit(rule, &words.view(rule, now, false), units) {}
}

/// A rollback after another check moved a pair word to the next slot takes the units
/// from the previous slot's count, where the move carried them; once that slot has left
/// the window too, there is nothing to take back.
#[test]
fn a_pair_rolls_back_across_a_turn() {
    let policy = Policy::new(&[Limit::per_second(10)]).unwrap_or_else(|e| panic!("{e}"));
    let owned = OwnedState::new(&policy, 0);
    let state = owned.state();
    let Some(rule) = policy.rules.first() else { panic!("one limit") };
    assert!(rule.pair);
    let view = Sliding::view(&state, rule, 5_500 * MS, false);
    assert!(Sliding::commit(&state, rule, &view, 4));
    // Another check, in the next slot, moves the word on: its previous slot holds our 4.
    let later = Sliding::view(&state, rule, 6_000 * MS, false);
    assert!(Sliding::commit(&state, rule, &later, 1));
    assert_eq!(Sliding::view(&state, rule, 6_000 * MS, false).oldest, 4);
    Sliding::rollback(&state, rule, &view, 4);
    let after = Sliding::view(&state, rule, 6_000 * MS, false);
    assert_eq!((after.current, after.oldest), (1, 0), "the 4 units taken from the previous slot");
    // Two slots on, slot 5 has left the window: a rollback of it changes nothing.
    let view = Sliding::view(&state, rule, 6_100 * MS, false);
    assert!(Sliding::commit(&state, rule, &view, 2));
    let far = Sliding::view(&state, rule, 8_000 * MS, false);
    assert!(Sliding::commit(&state, rule, &far, 1));
    let before = Sliding::view(&state, rule, 8_000 * MS, false);
    Sliding::rollback(&state, rule, &view, 2);
    let after = Sliding::view(&state, rule, 8_000 * MS, false);
    assert_eq!((after.seen, after.current), (before.seen, 1));
}

/// A change of `max` that widens the ring's entries re-encodes a key's ring from a copy of
/// its words (`reencode`), read one word after another while a check may be moving the key
/// on. Here the copy took `cur` and `sum` before a move that jumped three slots, and the
/// ring after it: the ring entry of slot 0 (3 units, counted by the copied `sum`) then
/// holds slot 61 and is re-encoded as 0. When slot 0 leaves the window, a move that took
/// its entry out of the `sum` would keep its 3 units for good; the re-encoded `sum` is
/// marked saturated instead, so the next move adds the ring up.
#[test]
fn a_ring_copied_mid_move_is_added_up_after_its_reencoding() {
    let strict = |max| Limit::per_minute(max).precision(Duration::from_secs(1)).strict();
    let new = |max| Policy::new(&[strict(max)]).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = (new(60), new(100));
    assert!(a.same_windows(&b) && !a.same_layout(&b), "6-bit entries, then 7-bit ones");
    let (Some(ra), Some(rb)) = (a.rules.first(), b.rules.first()) else { panic!("one limit") };
    let owned = OwnedState::new(&a, 0);
    let state = owned.state();
    let words: &Words = &state;
    // Relaxed: one thread.
    let copy = || words.all().iter().map(|w| w.load(Ordering::Relaxed)).collect::<Vec<u64>>();
    for _ in 0..3 {
        assert!(admit(words, ra, 500 * MS));
    }
    assert!(admit(words, ra, 59_500 * MS));
    let before = copy();
    // The racing check at 62.5 s closes slot 59 and writes slots 59 to 61 into the ring
    // (61 entries: slot 61's is slot 0's).
    assert!(admit(words, ra, 62_500 * MS));
    let read: Vec<u64> = copy()
        .into_iter()
        .zip(before)
        .enumerate()
        .map(|(i, (now, then))| if i < ra.ring_at { then } else { now })
        .collect();
    let mut fresh = vec![0u64; b.words_per_key()];
    Sliding::reencode(ra, rb, &read, &mut fresh, 62_500 * MS);
    let moved = OwnedState::from_words(&b, &fresh);
    let state = moved.state();
    let words: &Words = &state;
    // At 61.5 s the strict window holds slots 1 to 61: slot 59's unit alone.
    let view = words.view(rb, 61_500 * MS, false);
    assert_eq!(view.current + view.full + view.oldest, 1, "{view:?}");
}

/// A key checked once a second on a per-minute limit opens a slot at every check while a
/// slot with units leaves the window. The move takes the leaving entry out of the carried
/// `sum` (`carried_sum`), which must then be what the ring adds up to; only while a slot
/// that leaves is no newer than the latest slot a rollback lowered does it add the ring up
/// instead.
#[test]
fn a_move_subtracts_what_leaves_unless_a_rollback_lowered_it() {
    let limit = Limit::per_minute(100).precision(Duration::from_secs(1));
    on_one_limit(limit, |words, rule| {
        let (mut subtracted, mut added_up) = (0, Vec::new());
        for second in 0..130u64 {
            let now = second * 1_000 * MS + 500 * MS;
            let (slot, _) = rule.slot_of(now);
            // Relaxed: one thread.
            let seen = words.word(rule.at).load(Ordering::Relaxed);
            let view = View { slot, seen, ..View::default() };
            if let Some((closed, units)) = view.closing(rule) {
                let sum = rule.sum_word().map(|at| words.word(at).load(Ordering::Relaxed));
                match words.carried_sum(rule, &view, closed, units, sum) {
                    Ok(Some(full)) => {
                        assert_eq!(Ok((full, false)), words.closed_units(rule, &view), "at {second} s");
                        subtracted += u64::from(second >= 60);
                    }
                    Ok(None) => added_up.push(second),
                    Err(later) => panic!("at {second} s: a later slot {later}"),
                }
            }
            assert!(admit(words, rule, now));
            if second == 2 {
                // A check of several limits takes a second unit back.
                assert!(admit(words, rule, now));
                words.rollback(rule, slot, 1);
            }
        }
        // Slots 0, 1 and 2 leave the window at 60, 61 and 62 s.
        assert_eq!(added_up, [60, 61, 62], "moves that added the ring up");
        assert_eq!(subtracted, 130 - 63, "moves that subtracted their leaving slot");
    });
}

/// A move whose closed slot's `sum` is 0 takes the oldest slot as empty without reading the
/// ring (`view_at`). Here the oldest slot's entry holds a unit a rollback took back, which a
/// late closer wrote: the window holds one unit, and one more fits.
#[test]
fn a_move_from_an_empty_sum_counts_no_rolled_back_unit() {
    let limit = Limit::new(2, Duration::from_secs(3)).precision(Duration::from_secs(1)).strict();
    let policy = Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}"));
    let owned = OwnedState::new(&policy, 0);
    let state = owned.state();
    let words: &Words = &state;
    let Some(rule) = policy.rules.first() else { panic!("one limit") };
    assert!(admit(words, rule, 5_500 * MS));
    // A reads `cur` (slot 5, 1 unit) at 6.5 s; the unit is taken back; W closes slot 5 with
    // none (`sum` for slot 7: 0) and counts one in slot 7; A writes its 1 into slot 5's
    // entry (its `sum` for slot 6 is older than slot 7's, and stays unwritten).
    let stale = words.view(rule, 6_500 * MS, false);
    words.rollback(rule, rule.slot_of(5_500 * MS).0, 1);
    assert!(admit(words, rule, 7_300 * MS));
    assert!(!words.commit(rule, &stale, 1));
    assert!(matches!(words.hist(rule, rule.slot_of(5_500 * MS).0), Hist::Count(1)), "A's late write");
    // At 8.1 s the strict window holds slots 5 to 8: slot 7's unit alone.
    assert!(admit(words, rule, 8_100 * MS), "one unit in a window of 2");
    assert!(!admit(words, rule, 8_200 * MS), "two units in a window of 2");
}
