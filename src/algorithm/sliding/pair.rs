//! A window of one slot in one word: `(slot tag: u32, current: u16, previous: u16)`.
//!
//! A sliding window of one slot (`Limit::per_second(n)` at its default precision) reads
//! two counts: the current slot's and the previous one's, which counts in part (or whole,
//! strict). While `max` stays below 2¹⁶ − 1 both fit one word beside the tag, and the
//! window needs no ring, no `sum` and no closing: a check loads the word, derives the
//! counts for its slot from the tag (the same slot: as held; the next one: the held
//! current becomes the previous; later: both empty), and admits with one CAS of the whole
//! word, which moves the slot on in the same step. A check delayed between its load and
//! its CAS fails on any change, so there is no stale writer to argue about; tags compare
//! within a key's expiry as the `cur` word's do (`counter.rs`). `layout.rs` lays a limit
//! out this way when it has one slot and ring entries of at most 16 bits (`Rule::pair`),
//! whatever the policy's other limits are.
//!
//! Each field saturates at 2¹⁶ − 1, above any such `max`: a check admits at most `max`
//! into a slot, so only `record` or a carry saturates one, and a saturated field then
//! counts as full (as a ring entry does, `ring.rs`) until its slot has left the window.

use crate::algorithm::counter::{tag_distance, tag_of, Rule, Words};
use crate::sync::Ordering;

use super::ring::as_oldest;
use super::view::{Flag, View};

/// The most a field holds: a count of this many is saturated (`ring::saturated`, whose
/// `entry_most` a pair rule sets to this).
pub(super) const FIELD_MOST: u64 = 0xFFFF;

/// The word for `slot` holding `current` and `previous` units, each saturated at
/// [`FIELD_MOST`].
#[inline(always)]
pub(super) fn pack_pair(slot: u64, current: u64, previous: u64) -> u64 {
    // Truncation to 32 bits is the point: the tag, as in `counter::pack`.
    (u64::from(slot as u32) << 32) | (current.min(FIELD_MOST) << 16) | previous.min(FIELD_MOST)
}

#[inline(always)]
pub(super) fn current_of(word: u64) -> u64 {
    (word >> 16) & FIELD_MOST
}

#[inline(always)]
pub(super) fn previous_of(word: u64) -> u64 {
    word & FIELD_MOST
}

/// `(current, previous)` that `word` holds for `slot`, or `None` if the word already holds
/// a later slot.
#[inline(always)]
fn counts_at(word: u64, slot: u64) -> Option<(u64, u64)> {
    match tag_distance(tag_of(word), slot as u32) {
        0 => Some((current_of(word), previous_of(word))),
        -1 => Some((0, current_of(word))),
        d if d < 0 => Some((0, 0)),
        _ => None,
    }
}

impl Words<'_> {
    /// The view of a pair rule's window at `now` (one load).
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "a slot below 2⁴⁵ plus a tag distance below 2³¹")]
    pub(super) fn pair_view(&self, rule: &Rule, now: u64, expired: bool) -> View {
        let (mut slot, mut elapsed) = rule.slot_of(now);
        // Relaxed: the word is the limit's whole state, and nothing else is read with it
        // (the commit's CAS says why it orders what it must, as the fixed window's does).
        let seen = self.word(rule.at).load(Ordering::Relaxed);
        let (current, previous) = if expired {
            (0, 0)
        } else {
            match counts_at(seen, slot) {
                Some(counts) => counts,
                None => {
                    // Another thread already counts in a later slot: time is at least there.
                    // The adoption rests on this value alone: both counts are in the word.
                    slot += tag_distance(tag_of(seen), slot as u32).unsigned_abs();
                    elapsed = 0;
                    (current_of(seen), previous_of(seen))
                }
            }
        };
        View {
            slot,
            elapsed,
            seen,
            current,
            full: 0,
            oldest: as_oldest(rule, previous),
            saturated: Flag(0),
            expired: Flag::of(expired),
        }
    }

    /// Counts `cost` in the view's slot with one CAS, which also moves the word to that
    /// slot. `false` if the word changed since the view.
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "a 16-bit count plus a cost ≤ MOST")]
    pub(super) fn pair_commit(&self, rule: &Rule, view: &View, cost: u64) -> bool {
        // The previous slot's count as the new word keeps it: what the view's `oldest` was
        // read from, before `as_oldest` weighed a saturated one.
        let previous = if view.expired.get() {
            0
        } else {
            counts_at(view.seen, view.slot).map_or(0, |(_, previous)| previous)
        };
        let next = pack_pair(view.slot, view.current + cost, previous);
        // As the fixed window's commit: the word's modification order alone orders
        // admissions, and a view that adopted a later slot relied on the word alone. Release
        // pairs with the AcqRel RMW of `KeyState::migrate_at` when that reads this value (or
        // a later one in its release sequence): this check's clock reading then
        // happens-before the move's. Acquire pairs with that same RMW when this CAS reads its
        // value: the retirement swapped into `touched` before it then happens-before this
        // check's re-read of `touched` (`moved`), which starts over.
        self.word(rule.at).compare_exchange(view.seen, next, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// Takes back `cost` units committed to `slot`: from the current count while the word
    /// holds that slot, from the previous one once a check has moved it to the next slot
    /// (the move carried the count over whole), and not at all once the slot has left the
    /// window. Exact: counts add up in any order, and a tag never comes back. A saturated
    /// field no longer says how many units it holds: it stays saturated (conservative).
    pub(super) fn pair_rollback(&self, rule: &Rule, slot: u64, cost: u64) {
        let cell = self.word(rule.at);
        // Relaxed: the word alone is the state (see `pair_commit`).
        let mut word = cell.load(Ordering::Relaxed);
        loop {
            let (current, previous) = (current_of(word), previous_of(word));
            let next = match tag_distance(tag_of(word), slot as u32) {
                0 if current < FIELD_MOST => pack_pair(slot, current.saturating_sub(cost), previous),
                1 if previous < FIELD_MOST => (word & !FIELD_MOST) | previous.saturating_sub(cost),
                _ => return,
            };
            // Relaxed: as the load. A move to another policy that read the word before this
            // CAS carries our units (conservative); one after it sees them gone.
            match cell.compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => word = seen,
            }
        }
    }
}

/// The earliest time at which `cost` fits a pair rule's window, if nothing else is
/// admitted: within the view's slot, as the previous slot's weight falls (never, strict,
/// before the slot ends); else in the next slot, where the current slot is the oldest; else
/// at the start of the one after, with the window empty. The walk of `wait.rs` on a ring
/// of one slot takes the same steps (`sliding/tests/` holds the two together).
#[allow(clippy::arithmetic_side_effects, reason = "slots below 2⁴⁵ (counter.rs)")]
pub(super) fn pair_admissible_at(rule: &Rule, view: &View, cost: u64) -> u64 {
    let room = rule.max.saturating_sub(cost);
    let p = u128::from(rule.precision);
    if view.current <= room {
        if let Some(at) = Words::fits_in(rule, p, room, view.current, view.oldest, view.elapsed) {
            return rule.time_of(view.slot, at);
        }
    }
    match Words::fits_in(rule, p, room, 0, as_oldest(rule, view.current), 0) {
        Some(at) => rule.time_of(view.slot + 1, at),
        None => rule.time_of(view.slot + 2, 0),
    }
}
