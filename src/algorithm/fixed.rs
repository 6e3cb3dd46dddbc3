//! The fixed window: one word per limit, `(window index tag: u32, count: u32)`, the same
//! packing as the sliding window's `cur`. A check in a later window than the word's counts
//! from zero; an admission is one CAS.

use crate::layout::{count_of, pack, set, tag_distance, tag_of, Rule};
use crate::limit::MAX_UNITS;
use crate::protocol::{Counter, KeyState};
use crate::sync::Ordering;

pub(crate) struct Fixed;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct View {
    /// The window (as a slot of the rule, whose precision is the window) and ns into it.
    slot: u64,
    elapsed: u64,
    /// The word as loaded: the commit's expected value.
    seen: u64,
    /// Units already in `slot`.
    current: u64,
}

impl Counter for Fixed {
    type View = View;
    type Pin = ();
    /// The count saturates at 2³²−1 (`pack`).
    const MOST: u64 = MAX_UNITS;
    #[inline(always)]
    fn pin() {}
    fn words(_: &Rule) -> usize {
        1
    }
    fn reset(words: &mut [u64], rule: &Rule, now: u64) {
        set(words, rule.at(), pack(rule.slot_of(now).0, 0));
    }
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "a slot below 2⁴⁵ plus a tag distance below 2³¹")]
    fn view(state: &KeyState, rule: &Rule, now: u64, expired: bool) -> View {
        let (slot, elapsed) = rule.slot_of(now);
        // Relaxed: one word, and nothing else is published with it.
        let seen = state.word(rule.at()).load(Ordering::Relaxed);
        if expired {
            return View { slot, elapsed, seen, current: 0 };
        }
        match tag_distance(tag_of(seen), slot as u32) {
            0 => View { slot, elapsed, seen, current: count_of(seen) },
            // Another thread already counts in a later window: time is at least there.
            d if d > 0 => View { slot: slot + d as u64, elapsed: 0, seen, current: count_of(seen) },
            _ => View { slot, elapsed, seen, current: 0 },
        }
    }
    #[inline(always)]
    fn retired(_: &View) -> bool {
        false
    }
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "a 32-bit count plus a cost ≤ max")]
    fn admits(rule: &Rule, view: &View, cost: u64) -> bool {
        view.current + cost <= rule.max
    }
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "a 32-bit count plus a cost ≤ MOST")]
    fn commit(state: &KeyState, rule: &Rule, view: &View, cost: u64) -> bool {
        let next = pack(view.slot, view.current + cost);
        // The word's modification order alone orders admissions. Acquire pairs with the
        // RMWs of `KeyState::migrate` (a policy change), which must win or see this commit.
        state.word(rule.at()).compare_exchange(view.seen, next, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    fn rollback(state: &KeyState, rule: &Rule, view: &View, cost: u64) {
        let cell = state.word(rule.at());
        let mut cur = cell.load(Ordering::Relaxed);
        // Once the window has passed, its units no longer count: nothing to take back.
        while tag_of(cur) == view.slot as u32 {
            let next = pack(view.slot, count_of(cur).saturating_sub(cost));
            match cell.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "a 32-bit count plus a cost ≤ max")]
    fn room(rule: &Rule, view: &View, cost: u64) -> u64 {
        rule.max.saturating_sub(view.current + cost)
    }
    fn used(_: &Rule, view: &View) -> u64 {
        view.current
    }
    #[allow(clippy::arithmetic_side_effects, reason = "a 32-bit count plus a cost ≤ max; a slot below 2⁴⁵")]
    fn admissible_at(_: &KeyState, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
        Ok(if view.current + cost <= rule.max {
            rule.time_of(view.slot, view.elapsed)
        } else {
            // `cost` never exceeds `max`: the next window takes it.
            rule.time_of(view.slot + 1, 0)
        })
    }
    #[inline(always)]
    fn at(_: &Rule, view: &View, _: u64) -> (u64, u64) {
        (view.slot, view.elapsed)
    }
}
