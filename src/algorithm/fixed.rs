//! The fixed window: one word per limit, `(window index tag: u32, count: u32)`, the same
//! packing as the sliding window's `cur`. A check in a later window than the word's counts
//! from zero; an admission is one CAS.

#[cfg(feature = "serde")]
use crate::algorithm::counter::slot_end;
use crate::algorithm::counter::{count_of, pack, set, tag_distance, tag_of, Counter, Rule, Words};
use crate::limit::MAX_UNITS;
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
    fn view(state: &Words, rule: &Rule, now: u64, expired: bool) -> View {
        let (slot, elapsed) = rule.slot_of(now);
        // Relaxed: one word, and nothing else is published with it.
        let seen = state.word(rule.at()).load(Ordering::Relaxed);
        if expired {
            return View { slot, elapsed, seen, current: 0 };
        }
        match tag_distance(tag_of(seen), slot as u32) {
            0 => View { slot, elapsed, seen, current: count_of(seen) },
            // Another thread already counts in a later window: time is at least there. The
            // adoption rests on this value alone, on any memory model: the later window's
            // count is in the same word, and nothing else is read for it (no clock is read
            // again; `touched` then covers the adopted window's start, which only delays
            // expiry, and retry times are counted from it, never earlier than exact).
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
    fn commit(state: &Words, rule: &Rule, view: &View, cost: u64) -> bool {
        let next = pack(view.slot, view.current + cost);
        // The word's modification order alone orders admissions: the word is the limit's whole
        // state, and nothing else is read or published with it. A view that adopts a later window
        // from the tag (`view`) relies on nothing but the tag itself: the window's count is in the
        // same word. Release pairs with the AcqRel RMW of `KeyState::migrate_at` when that reads
        // this value (or a later one in its release sequence): this check's clock reading then
        // happens-before the move's, so the move is never timed before this commit (see there); on
        // x86 the CAS is the same instruction either way. Acquire pairs with that same RMW (a
        // policy change) when this CAS reads its value: the retirement swapped into `touched`
        // before that RMW then happens-before this check's re-read of `touched` (`moved`, after its
        // commits), which by coherence reads it (nothing after the swap changes `touched` but
        // `fetch_max`es of smaller times) and starts over. When this CAS comes first in the word's
        // modification order, the RMW reads its value, so the move carries our units.
        state.word(rule.at()).compare_exchange(view.seen, next, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }
    /// Takes `cost` back out of the window the commit counted in. Exact: counts add up in
    /// any order, and a window's tag never comes back once the word has moved on. Once the
    /// window has passed its units no longer count, and there is nothing to take back. A
    /// count saturated at 2³²−1 (`record`) no longer says how many units it holds: it stays
    /// saturated (conservative).
    fn rollback(state: &Words, rule: &Rule, view: &View, cost: u64) {
        let cell = state.word(rule.at());
        // Relaxed: the count alone is the state (see `commit`).
        let mut cur = cell.load(Ordering::Relaxed);
        while tag_of(cur) == view.slot as u32 && count_of(cur) < MAX_UNITS {
            let next = pack(view.slot, count_of(cur).saturating_sub(cost));
            // Relaxed: as the load. A move to another policy that read the word before
            // this CAS carries our units (conservative); one after it sees them gone.
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
    fn admissible_at(_: &Words, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
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
    /// The current window's count, timed at the window's end (or `now`).
    #[cfg(feature = "serde")]
    fn history(state: &Words, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool {
        let view = Fixed::view(state, rule, now, false);
        if view.current > 0 {
            out.push((slot_end(rule, view.slot), view.current));
        }
        true
    }
}
