//! A ring word's entries: a closed slot's count read from its position or written there,
//! what a saturated entry says, and the re-encoding of a ring at another entry width (a
//! policy change that keeps the windows, `protocol/moving.rs`).

use crate::algorithm::counter::{count_of, pack, set, tag_distance, tag_of, Rule};
use crate::limit::MAX_UNITS;

use super::pair::{current_of, pack_pair, previous_of, FIELD_MOST};
use super::Sliding;

/// The count slot `cur` holds as the ring will keep it once closed: at most a ring entry's
/// width (never below `max`, see the module docs).
#[inline]
pub(super) fn closed_count(rule: &Rule, cur: u64) -> u64 {
    count_of(cur).min(rule.entry_most)
}

/// Whether a closed slot's entry of `count` units is saturated: it took at least as many
/// units as its entry holds, more than `max` (only `record` or a carry can do that), so it
/// no longer says how many (module docs).
#[inline]
pub(super) fn saturated(rule: &Rule, count: u64) -> bool {
    count >= rule.entry_most && rule.entry_most > rule.max
}

/// Whether the open slot's count (exact up to 2³²−1 in `cur`, up to a field's width in a
/// pair word, `pair.rs`) is saturated.
#[inline]
pub(super) fn current_saturated(rule: &Rule, count: u64) -> bool {
    let most = if rule.pair { rule.entry_most } else { MAX_UNITS };
    count >= most && most > rule.max
}

/// What a closed slot of `count` units weighs as the oldest, partly covered slot: its
/// count, except that a saturated entry weighs more than `max` until the slot has wholly
/// left the window (`max × precision + 1`: more than `max` at any weight of at least 1 ns
/// in `precision`), and more than any entry holds, so that a view's `oldest` above
/// `entry_most` says it is saturated (`View::used`). Conservative: never less than the
/// units it stands for.
#[inline]
pub(super) fn as_oldest(rule: &Rule, count: u64) -> u64 {
    if saturated(rule, count) {
        rule.max.saturating_mul(rule.precision).saturating_add(1).max(rule.entry_most.saturating_add(1))
    } else {
        count
    }
}

/// Ring entry at bit `shift` of `word`.
#[inline]
fn entry(rule: &Rule, word: u64, shift: u32) -> u64 {
    (word >> shift) & rule.entry_most
}

/// `word` with its entry at bit `shift` set to `count` (at most the entry's width).
#[inline]
pub(super) fn with_entry(rule: &Rule, word: u64, shift: u32, count: u64) -> u64 {
    let most = rule.entry_most;
    (word & !(most << shift)) | (count.min(most) << shift)
}

/// Slot `slot`'s count if ring word `word` holds that very slot (its tag is `slot` or up to
/// `ring − 1` slots later), else `None`: see [`read_entry`].
#[inline]
pub(super) fn held(rule: &Rule, word: u64, slot: u64, shift: u32) -> Option<u64> {
    let d = rule.ring_distance(word, slot);
    (d >= 0 && d.unsigned_abs() < rule.ring).then(|| entry(rule, word, shift))
}

/// What ring word `word` says about slot `slot`, whose entry sits at bit `shift`: the word's
/// tag is the newest slot written into it, so its entry for `slot`'s position holds `slot`
/// when that tag is `slot` or up to `ring − 1` slots later, an older slot (empty for us)
/// when the tag is earlier, and a later lap when the tag is `ring` or more slots later.
#[inline]
#[allow(clippy::arithmetic_side_effects, reason = "a slot below 2⁴⁵ plus a tag distance below 2³¹")]
pub(super) fn read_entry(rule: &Rule, word: u64, slot: u64, shift: u32) -> Hist {
    match held(rule, word, slot, shift) {
        Some(units) => Hist::Count(units),
        None => match rule.ring_distance(word, slot) {
            d if d < 0 => Hist::Count(0),
            d => Hist::Newer(slot + d.unsigned_abs()),
        },
    }
}

/// A history read: the slot's count, or the index of a newer slot found in its place.
pub(super) enum Hist {
    Count(u64),
    Newer(u64),
}

impl Sliding {
    /// Copies limit `a`'s counters in `old` (a retired state's words, read with the retire
    /// protocol) into limit `b`'s place in `new`, where `b` counts the same window with ring
    /// entries of another width: `cur` and `sum` as they are (a `sum` with a saturated slot
    /// in it is marked saturated already), and every slot the ring holds re-encoded at its
    /// position, a saturated one saturated at `b`'s width. Exact when `b`'s entries are at
    /// least as wide (the only case a limiter produces: its entries only widen). A window
    /// of one slot held as a pair (`pair.rs`) has its two counts moved into `cur` and the
    /// ring (or another pair), a saturated one saturated; a ring never becomes a pair
    /// (`Policy::same_windows`).
    pub(crate) fn reencode(a: &Rule, b: &Rule, old: &[u64], new: &mut [u64], now: u64) {
        let word = |at: usize| old.get(at).copied().unwrap_or(0);
        if a.rolled_at != 0 && b.rolled_at != 0 {
            // Entries copied as they are may hold more than the `sum` counted (a late closer
            // after a rollback): the rolled word goes with them.
            let rolled = word(a.rolled_at).max(new.get(b.rolled_at).copied().unwrap_or(0));
            set(new, b.rolled_at, rolled);
        }
        let first = word(a.at);
        // The slot `a`'s first word (`cur`, or a pair) holds, as a full index (a tag is its
        // low 32 bits; module docs).
        let (now_slot, _) = a.slot_of(now);
        let held = now_slot.saturating_add_signed(tag_distance(tag_of(first), now_slot as u32));
        if a.pair {
            // A saturated field stands for more than any count it could hold: saturated again.
            let current = if current_of(first) >= FIELD_MOST { MAX_UNITS } else { current_of(first) };
            let previous = if previous_of(first) >= FIELD_MOST { b.entry_most } else { previous_of(first) };
            if b.pair {
                set(new, b.at, pack_pair(held, current, previous));
            } else {
                set(new, b.at, pack(held, current));
                Self::write_ring(
                    b,
                    new,
                    held,
                    |slot| if slot.saturating_add(1) == held { previous } else { 0 },
                );
            }
            return;
        }
        set(new, b.at, first);
        let sum = a.sum_word().map(&word);
        if let (Some(sum), Some(to)) = (sum, b.sum_word()) {
            set(new, to, sum);
        }
        let later_lap = std::cell::Cell::new(false);
        Self::write_ring(b, new, held, |slot| {
            let (from, shift) = a.position(slot);
            match read_entry(a, word(from), slot, shift) {
                // A saturated entry stays saturated at the new width (module docs).
                Hist::Count(units) if saturated(a, units) => b.entry_most,
                Hist::Count(units) => units,
                Hist::Newer(_) => {
                    later_lap.set(true);
                    0
                }
            }
        });
        if let (true, Some(sum), Some(to)) = (later_lap.get(), sum, b.sum_word()) {
            // A racing move had begun to write a later lap (its `sum` may be copied above
            // without it): the entries written as 0 may be units the copied `sum` counts,
            // which a move that subtracts its leaving slots would then never take out. A
            // saturated `sum` makes the next views and moves add the ring up instead.
            set(new, to, pack(u64::from(tag_of(sum)), super::SUM_SATURATED));
        }
    }

    /// Writes ring `b`'s entries for the `ring` slots before `held`, oldest first (so each
    /// word's tag ends at the newest slot in it), each holding `units(slot)`.
    fn write_ring(b: &Rule, new: &mut [u64], held: u64, units: impl Fn(u64) -> u64) {
        for slot in held.saturating_sub(b.ring)..held {
            let (to, shift) = b.position(slot);
            let into = new.get(to).copied().unwrap_or(0);
            set(new, to, with_entry(b, b.ring_retag(into, slot), shift, units(slot)));
        }
    }
}

/// A walk's place in the ring: a position, its word and its entry's index in that word.
#[derive(Clone, Copy)]
pub(super) struct Cursor {
    pub(super) position: u64,
    pub(super) at: usize,
    pub(super) within: u32,
}

impl Cursor {
    /// At ring position `position` (below `ring`).
    #[inline(always)]
    pub(super) fn at(rule: &Rule, position: u64) -> Cursor {
        let (at, within) = rule.locate(position as usize);
        Cursor { position, at, within }
    }

    /// Entries from here to the end of the word and of the ring, at most `most`.
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "within < per_word, position < ring")]
    pub(super) fn run(&self, rule: &Rule, most: u64) -> u64 {
        u64::from(rule.per_word - self.within).min(rule.ring - self.position).min(most)
    }

    /// `n` positions on, `n` at most to the end of the word and of the ring.
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "n entries within the word and the ring")]
    pub(super) fn advance(&mut self, rule: &Rule, n: u64) {
        self.position += n;
        self.within += n as u32;
        if self.position == rule.ring {
            *self = Cursor { position: 0, at: rule.ring_at, within: 0 };
        } else if self.within == rule.per_word {
            (self.at, self.within) = (self.at + 1, 0);
        }
    }
}

/// Whether `word` holds each of the slots `first..=last` (`held`: its tag is that slot or
/// up to `ring − 1` later): exactly when `first` is no more than `ring − 1` behind the tag
/// and `last` not after it, since the distances fall by one from slot to slot.
#[inline(always)]
pub(super) fn holds(rule: &Rule, word: u64, first: u64, last: u64) -> bool {
    rule.ring_distance(word, last) >= 0 && rule.ring_distance(word, first) < rule.ring as i64
}

/// The sum of the lanes of `lanes`, `bits` wide each (2 to 32), in its low 48 bits: at
/// most 24 lanes, whose counts add up to less than 2³⁵.
#[inline(always)]
#[allow(clippy::arithmetic_side_effects, reason = "at most 24 lanes of at most 32 bits")]
pub(super) fn lane_sum(mut lanes: u64, bits: u32) -> u64 {
    let mask = u64::MAX >> (u64::BITS - bits);
    let mut sum = 0;
    while lanes != 0 {
        sum += lanes & mask;
        lanes >>= bits;
    }
    sum
}

/// The sum of the `n` entries of `word` from entry `within` on (at most to the word's end),
/// and whether one of them is saturated (only possible when they add up to `entry_most`
/// or more, so usually not looked for).
#[inline(always)]
#[allow(clippy::arithmetic_side_effects, reason = "within + n ≤ per_word: at most 48 bits")]
pub(super) fn run_units(rule: &Rule, word: u64, within: u32, n: u64) -> (u64, bool) {
    let bits = n as u32 * rule.entry_bits;
    let lanes = (word >> (within * rule.entry_bits)) & (u64::MAX >> (u64::BITS - bits));
    let units = lane_sum(lanes, rule.entry_bits);
    let mut any_saturated = false;
    if units >= rule.entry_most {
        let mut rest = lanes;
        while rest != 0 {
            any_saturated |= saturated(rule, rest & rule.entry_most);
            rest >>= rule.entry_bits;
        }
    }
    (units, any_saturated)
}
