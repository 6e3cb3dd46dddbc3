//! The same answer worked out two ways, on random histories: each fast path of the ring
//! (a burst's view and wait, a word's entries added at once, a pair word) against the
//! general one.

use std::time::Duration;

use super::*;
use crate::algorithm::sliding::ring::saturated;

/// Six refusals on `words`, each up to `step` ns after the last, of up to `max` units (or
/// up to 3): the wait worked out as it is against the wait with `slower` set (the same
/// answer the long way). Before some of them (`race`), a check at a later time moves the
/// key on between the refusal's view and its wait, reusing ring positions the walk may read
/// (then both answers must say so). A request that fits is admitted if `admit`, else
/// skipped. Returns the refusals compared.
#[allow(clippy::arithmetic_side_effects, reason = "times and counts far below 2⁶⁴, as in the tests")]
fn refusals(
    words: &Words,
    rule: &Rule,
    (next, mut now, step): (&mut dyn FnMut(u64) -> u64, u64, u64),
    race: impl Fn(&mut dyn FnMut(u64) -> u64) -> bool,
    admit: bool,
    slower: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
) -> usize {
    let window = rule.precision * rule.slots;
    let mut compared = 0;
    for _ in 0..6 {
        now += next(step);
        let view = words.view(rule, now, false);
        let most = if next(2) == 0 { rule.max } else { rule.max.min(3) };
        let cost = 1 + next(most);
        if view.admits(rule, cost) {
            if admit {
                burst(words, rule, now, cost);
            }
            continue;
        }
        if race(next) {
            let later = now + next(2 * window);
            while !words.commit(rule, &words.view(rule, later, false), 1) {}
        }
        let fast = words.admissible_at(rule, &view, cost);
        slower.with(|set| set.set(true));
        let slow = words.admissible_at(rule, &view, cost);
        slower.with(|set| set.set(false));
        assert_eq!(fast, slow, "{rule:?}, cost {cost}, at {now} ns, {view:?}");
        compared += 1;
    }
    compared
}

/// The wait of a burst in one slot, worked out in closed form, against the walk over the
/// window, on random histories: limits of one to sixty slots, interpolated and strict,
/// entries of 2 to 32 bits, saturated ones among them (`record`), refusals in the slot of the burst and slots after it (the move
/// not yet made, so the burst is the slot `cur` would close), requests of up to `max` units,
/// and checks that move the key on between a refusal's view and its wait.
#[test]
fn the_wait_of_a_burst_is_the_walks() {
    let mut next = draws(0x9e37_79b9_7f4a_7c15);
    let mut compared = 0;
    for case in 0..5_000 {
        let (max, limit) = burst_case(case);
        let limit = if case % 3 == 0 { limit.strict() } else { limit };
        on_one_limit(limit, |words, rule| {
            let window = rule.precision * rule.slots;
            let mut now = 3 * window + next(window);
            for _ in 0..1 + next(case as u64 % 3 * 3 + 1) {
                burst(words, rule, now, 1 + next(max));
                if next(6) == 0 {
                    // Units admitted elsewhere (`record`): more than entries of 8 bits or less hold.
                    while !words.commit(rule, &words.view(rule, now, false), 300) {}
                }
                now += next(2 * window / 3 + 1);
            }
            let race = |next: &mut dyn FnMut(u64) -> u64| next(3) == 0;
            compared +=
                refusals(words, rule, (&mut next, now, window / 2 + 1), race, false, &super::wait::WALK_ONLY);
        });
    }
    let short = super::wait::SHORTCUTS.with(std::cell::Cell::get);
    assert!(
        compared > 3_000 && short > 1_000,
        "{compared} refusals compared, {short} of a burst in one slot"
    );
}

/// Whether `burst_view` answers at `slot`, `elapsed` ns in, for the `cur` the words hold;
/// where it does, its view must be `view_slow`'s.
fn burst_view_is_view_slows(words: &Words, rule: &Rule, slot: u64, elapsed: u64) -> bool {
    let seen = words.word(rule.at).load(Ordering::Relaxed);
    let Some(fast) = words.burst_view(rule, slot, elapsed, seen) else { return false };
    let slow = words.view_slow(rule, slot, elapsed, seen);
    assert_eq!(
        format!("{fast:?}"),
        format!("{slow:?}"),
        "{rule:?} at slot {slot} + {elapsed} ns, cur {seen:x}"
    );
    true
}

/// The view of a burst from two words (`burst_view`) against the ring's (`view_slow`, as
/// `view_at` works it out), on random histories: bursts in one slot or several, some
/// with units taken back (`rollback`) or recorded past what narrow entries hold, read at
/// times from within the burst's slot to past the window, limits of one to sixty slots.
#[test]
fn a_bursts_view_is_the_rings() {
    let mut next = draws(0x51_7cc1_b727_220a);
    let (mut compared, mut taken) = (0, 0);
    for case in 0..3_000 {
        let (max, limit) = burst_case(case);
        on_one_limit(limit, |words, rule| {
            let window = rule.precision * rule.slots;
            let mut now = 3 * window + next(window);
            for _ in 0..1 + next(3) {
                burst(words, rule, now, 1 + next(max));
                match next(8) {
                    0 => while !words.commit(rule, &words.view(rule, now, false), 300) {},
                    1 => words.rollback(rule, rule.slot_of(now).0, 1),
                    _ => {}
                }
                let gap = if next(2) == 0 { rule.precision } else { 2 * window };
                now += next(gap);
            }
            for _ in 0..4 {
                let at = now + next(window + 2 * rule.precision);
                let (slot, elapsed) = rule.slot_of(at);
                compared += 1;
                taken += usize::from(burst_view_is_view_slows(words, rule, slot, elapsed));
            }
        });
    }
    assert!(compared == 12_000 && taken > 2_000, "{taken} burst views of {compared}");
}

/// `burst_view` against `view_slow` on arbitrary words: every ring word random (so an
/// answer that read one would differ), slot tags across a 2³² wrap, `cur` one slot to one
/// past the window behind, counts up to and past what an entry holds, and `sum` words of
/// 0 units for the slot `cur` holds, for slots before and after it (a move in another
/// thread between its write of the sum and its CAS on `cur`, or a copy made meanwhile),
/// or random. Where it answers, the answer is the ring's; it answers for about a quarter of them.
#[test]
fn a_bursts_view_reads_no_ring() {
    let mut next = draws(0x1234_5678_9abc_def1);
    let (mut compared, mut taken) = (0, 0);
    for case in 0..4_000 {
        let (_, limit) = if case % 2 == 0 { burst_case(case / 2) } else { ring_case(case / 2) };
        let limit = if case % 3 == 0 { limit.strict() } else { limit };
        on_one_limit(limit, |words, rule| {
            for _ in 0..50 {
                for word in words.all() {
                    word.store(next(u64::MAX) ^ (next(u64::MAX) << 32), Ordering::Relaxed);
                }
                let base =
                    [1u64 << 32, 2 << 32, 5 << 32, 1 << 40].get(next(4) as usize).copied().unwrap_or(1 << 32);
                let slot = base - 70 + next(140);
                let closed = slot - 1 - next(rule.slots + 1);
                let count = match next(4) {
                    0 => 0,
                    1 => next(rule.max + 1),
                    2 => rule.entry_most - 1 + next(3),
                    _ => next(u64::from(u32::MAX) + 1),
                };
                words.word(rule.at).store(pack(closed, count), Ordering::Relaxed);
                if let Some(at) = rule.sum_word() {
                    let sum = match next(6) {
                        0 => next(u64::MAX),
                        1 => pack(closed + 1 + next(3), 0),
                        2 => pack(closed - 1 - next(3), 0),
                        _ => pack(closed, 0),
                    };
                    words.word(at).store(sum, Ordering::Relaxed);
                }
                let elapsed = next(rule.precision);
                compared += 1;
                taken += usize::from(burst_view_is_view_slows(words, rule, slot, elapsed));
            }
        });
    }
    assert!(compared == 200_000 && taken > 40_000, "{taken} burst views of {compared}");
}

/// The ring's count of a run of slots, a word at a time (`older_units`), against reading
/// each slot's entry on its own, on random rings: every width and packing, runs that wrap
/// at the ring's end, and slots a later move has taken over, a lap later or not yet
/// written (both say `None`).
#[test]
fn the_ring_counted_a_word_at_a_time() {
    let mut next = draws(0x2545_f491_4f6c_dd1d);
    let (mut compared, mut lost) = (0, 0);
    for case in 0..2_000 {
        let (max, limit) = ring_case(case);
        on_one_limit(limit, |words, rule| {
            let window = rule.precision * rule.slots;
            let mut now = 2 * window;
            for _ in 0..next(200) {
                now += next(rule.precision * 3);
                burst(words, rule, now, 1 + next(max));
            }
            let view = words.view(rule, now, false);
            for _ in 0..8 {
                let first = view.slot + 1 - rule.slots + next(rule.slots);
                let end = first + next(view.slot + 2 - first);
                let position = rule.by_ring.rem(first);
                if next(3) == 0 {
                    // A later check moves the key on first, and may reuse positions of the run.
                    now += next(2 * window);
                    while !words.commit(rule, &words.view(rule, now, false), 0) {}
                }
                let by_entry = (first..end).try_fold(0u64, |sum, i| {
                    let (at, shift) = rule.position(i);
                    held(rule, words.word(at).load(Ordering::Relaxed), i, shift).map(|units| sum + units)
                });
                assert_eq!(
                    words.older_units(rule, first..end, position),
                    by_entry,
                    "case {case}: {limit:?}, slots {first}..{end}"
                );
                compared += 1;
                lost += u64::from(by_entry.is_none());
            }
        });
    }
    assert!(
        compared > 10_000 && lost > 100,
        "{compared} runs compared, {lost} of them over a reused position"
    );
}

/// A view's count of the closed slots in its window, a ring word at a time
/// (`closed_units`), against reading each slot's entry on its own (`hist`), with the slot
/// `cur` would close read from `cur` and the slots after it empty: on random histories of
/// every width and packing, views at `cur`'s slot or up to two windows after it, saturated
/// entries (`record`) among them, and a later check moving the key on between a view's
/// load of `cur` and its count (words no longer holding their runs: read slot by slot).
#[test]
fn the_closed_slots_counted_a_word_at_a_time() {
    let mut next = draws(0x510e_527f_ade6_82d1);
    let (mut compared, mut saturated_seen, mut adopted) = (0, 0, 0);
    for case in 0..2_000 {
        let (max, limit) = ring_case(case);
        on_one_limit(limit, |words, rule| {
            let window = rule.precision * rule.slots;
            let mut now = 2 * window;
            for _ in 0..next(200) {
                now += next(rule.precision * 3);
                match next(20) {
                    // Units admitted elsewhere (`record`): an entry of 8 bits or less saturates.
                    0 => while !words.commit(rule, &words.view(rule, now, false), 300) {},
                    // A check of cost 0 moves `cur` on, closing the slot (however full).
                    1..=6 => while !words.commit(rule, &words.view(rule, now, false), 0) {},
                    _ => burst(words, rule, now, 1 + next(max)),
                }
            }
            for _ in 0..4 {
                // At `cur`'s slot (no slot closing: the count a saturated `sum` needs), or up
                // to two windows after it.
                let later = if next(4) == 0 { now } else { now + rule.precision + next(2 * window) };
                let (slot, _) = rule.slot_of(later);
                // Relaxed: one thread.
                let seen = words.word(rule.at).load(Ordering::Relaxed);
                let mut view = View { slot, seen, ..View::default() };
                if tag_distance(tag_of(seen), slot as u32) > 0 {
                    continue;
                }
                let closing = view.closing(rule);
                if next(3) == 0 {
                    // A later check moves the key on between the view's load of `cur` and its
                    // count, rewriting ring words the count reads: their runs are no longer
                    // held, and are read slot by slot (a later lap: adopt it).
                    let on = later + rule.precision + next(2 * window);
                    while !words.commit(rule, &words.view(rule, on, false), 0) {}
                }
                let by_entry = (slot + 1 - rule.slots..slot).try_fold((0u64, false), |(full, any), i| {
                    let units = match closing {
                        Some((closed, units)) if i == closed => units,
                        Some((closed, _)) if i > closed => 0,
                        _ => match words.hist(rule, i) {
                            Hist::Count(units) => units,
                            Hist::Newer(newer) => return Err(newer + 1),
                        },
                    };
                    Ok((full + units, any || saturated(rule, units)))
                });
                view.elapsed = 0;
                assert_eq!(
                    words.closed_units(rule, &view),
                    by_entry,
                    "case {case}: {limit:?} at slot {slot}"
                );
                compared += 1;
                saturated_seen += u64::from(by_entry.is_ok_and(|(_, any)| any));
                adopted += u64::from(by_entry.is_err());
            }
        });
    }
    assert!(
        compared > 5_000 && saturated_seen > 100 && adopted > 100,
        "{compared} views compared, {saturated_seen} with a saturated slot, {adopted} adopting a later one"
    );
}

/// The walk taking the ring's slots a word at a time while the window stays over the room
/// (`slide`'s runs), against taking them one by one, on histories spread over the window:
/// every width and packing, interpolated and strict, runs that wrap at the ring's end,
/// rolled-back units (entries above what the sum counts), requests of up to `max` units,
/// and checks that move the key on between a refusal's view and its wait.
#[test]
fn the_walk_by_runs_is_the_walk_by_slots() {
    let mut next = draws(0x6a09_e667_f3bc_c909);
    let mut compared = 0;
    for case in 0..3_000 {
        let max = [2, 7, 40, 200, 1_000, 60_000, 70_000, 20_000_000].get(case % 8).copied().unwrap_or(1);
        let limit = match case % 4 {
            0 => Limit::per_minute(max),
            1 => Limit::per_minute(max).precision(Duration::from_secs(4)),
            2 => Limit::per_hour(max),
            _ => Limit::per_second(max).precision(Duration::from_millis(100)),
        };
        let limit = if case % 3 == 0 { limit.strict() } else { limit };
        on_one_limit(limit, |words, rule| {
            let window = rule.precision * rule.slots;
            let mut now = 2 * window + next(window);
            // Units spread over the window: a few per slot, up to the limit.
            for _ in 0..next(3 * rule.slots) {
                now += next(rule.precision * 2);
                burst(words, rule, now, 1 + next(max / 20 + 2));
                if next(8) == 0 {
                    let (slot, _) = rule.slot_of(now);
                    words.rollback(rule, slot, 1);
                }
            }
            let race = |next: &mut dyn FnMut(u64) -> u64| next(4) == 0;
            compared += refusals(
                words,
                rule,
                (&mut next, now, rule.precision * 4),
                race,
                true,
                &super::wait::SLOT_BY_SLOT,
            );
        });
    }
    let runs = super::wait::RUNS.with(std::cell::Cell::get);
    assert!(
        compared > 3_000 && runs > 10_000,
        "{compared} refusals compared, {runs} runs taken a word at a time"
    );
}

/// A window of one slot held as a pair word (`pair.rs`) against the same window held as a
/// ring (of 16-bit entries, as wide as the pair's fields), on random histories: `max` of 1
/// to 65,534, interpolated and
/// strict, slots of 1 s and 1 min, bursts, rollbacks and units recorded beyond `max`
/// (below both layouts' saturation), time moving by up to two slots (and sometimes far)
/// between checks, and delayed checks, timed before the latest commit (both adopt its
/// slot). Every view admits, leaves room and counts alike, and every refusal's wait (the
/// pair's closed form, the ring's walk) is the same.
#[test]
fn a_pair_is_a_ring_of_one_slot() {
    let mut next = draws(0x3c6e_f372_fe94_f82b);
    let (mut compared, mut refused) = (0, 0);
    for case in 0..2_000 {
        let max = [1, 2, 5, 40, 254, 300, 65_534].get(case % 7).copied().unwrap_or(1);
        let limit = match case % 2 {
            0 => Limit::per_second(max),
            _ => Limit::per_minute(max).precision(Duration::from_secs(60)),
        };
        let limit = if case % 3 == 0 { limit.strict() } else { limit };
        let (pair, ring) =
            (Policy::new(&[limit]).unwrap_or_else(|e| panic!("{e}")), ring_policy_of(limit, 16));
        let (pair_state, ring_state) = (OwnedState::new(&pair, 0), OwnedState::new(&ring, 0));
        let (p, r) = (pair_state.state(), ring_state.state());
        let (Some(pr), Some(rr)) = (pair.rules.first(), ring.rules.first()) else { panic!("one limit") };
        assert!(pr.pair && !rr.pair, "{limit:?}");
        let mut now = 3 * pr.precision;
        for _ in 0..40 {
            now += if next(20) == 0 { next(5 * pr.precision) } else { next(pr.precision / 2 + 1) };
            let cost = 1 + if next(3) == 0 { next(max) } else { next(max.min(3)) };
            // A check delayed since before the latest commit: up to two slots behind.
            let at = if next(8) == 0 { now.saturating_sub(next(2 * pr.precision)) } else { now };
            let (vp, vr) = (Sliding::view(&p, pr, at, false), Sliding::view(&r, rr, at, false));
            if next(10) == 0 && rr.entry_most >= FIELD_MOST && vp.current + cost < FIELD_MOST {
                // Units admitted elsewhere (`record`), beyond `max`: 16-bit entries on both sides.
                assert!(Sliding::commit(&p, pr, &vp, cost) && Sliding::commit(&r, rr, &vr, cost));
                continue;
            }
            let at = format!("case {case}: {limit:?}, cost {cost} at {at} ns, {vp:?} / {vr:?}");
            assert_eq!(vp.admits(pr, cost), vr.admits(rr, cost), "{at}");
            assert_eq!(vp.room(pr, 0), vr.room(rr, 0), "{at}");
            assert_eq!(vp.used(pr), vr.used(rr), "{at}");
            compared += 1;
            if vp.admits(pr, cost) {
                assert!(Sliding::commit(&p, pr, &vp, cost) && Sliding::commit(&r, rr, &vr, cost), "{at}");
                if next(6) == 0 {
                    Sliding::rollback(&p, pr, &vp, cost);
                    Sliding::rollback(&r, rr, &vr, cost);
                }
            } else {
                let waits =
                    (Sliding::admissible_at(&p, pr, &vp, cost), Sliding::admissible_at(&r, rr, &vr, cost));
                assert_eq!(waits.0, waits.1, "{at}");
                refused += 1;
            }
        }
    }
    assert!(compared > 50_000 && refused > 10_000, "{compared} views compared, {refused} waits");
}
