//! A limit's units by slot, for a snapshot of the key (`Counter::history`): the slot `cur`
//! holds and the closed slots the ring holds, as far back as a view at `now` reaches.

use crate::algorithm::counter::{count_of, slot_end, tag_distance, tag_of, Rule, Words};
use crate::sync::Ordering;

use super::pair::{current_of, previous_of};
use super::ring::{read_entry, Hist};

impl Words<'_> {
    /// `(time, units)` of every slot a view at `now` may count that holds units, oldest
    /// first (`Counter::history`). `false` if a ring word already holds a later lap of a
    /// slot read: a racing check moved `cur` on after the load below, and the caller reads
    /// again (`protocol/snapshot.rs`; after a few tries it settles for what a view counts).
    #[allow(clippy::arithmetic_side_effects, reason = "a slot is at least ring = slots + 1 (module docs)")]
    pub(super) fn history(&self, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool {
        let (slot, _) = rule.slot_of(now);
        // The oldest slot a view at `now` weighs (in part, interpolated).
        let first = slot - rule.slots;
        // Acquire: as in `view` (read.rs), the history written before the CAS that moved
        // `cur` to the slot it holds is read below.
        let seen = self.word(rule.at).load(Ordering::Acquire);
        // The slot `cur` holds: at most a key's expiry from `now`, so the tag says which
        // (or a later one a racing check's clock adopted).
        let Some(held) = slot.checked_add_signed(tag_distance(tag_of(seen), slot as u32)) else {
            return true;
        };
        let mut push = |s: u64, units: u64| {
            if units > 0 && s >= first {
                out.push((slot_end(rule, s), units));
            }
        };
        if rule.pair {
            push(held.saturating_sub(1), previous_of(seen));
            push(held, current_of(seen));
            return true;
        }
        // The ring holds the `slots` closed slots before `held` (and one more): read a word
        // at a time, each entry of it that holds a slot of the window.
        let mut s = first.max(held.saturating_sub(rule.slots));
        while s < held {
            // `ring` is at most MAX_SLOTS + 1: the remainder fits a usize.
            let position = rule.by_ring.rem(s) as usize;
            let (at, within) = rule.locate(position);
            // Relaxed: ordered by the Acquire load of `cur` above.
            let word = self.word(at).load(Ordering::Relaxed);
            // To the end of the word, or of the ring (whose last word may have room to spare).
            let run = (rule.left_in_word(position) as u64).min(rule.ring - position as u64).min(held - s);
            for i in 0..run {
                let shift = (within + i as u32) * rule.entry_bits;
                match read_entry(rule, word, s + i, shift) {
                    Hist::Count(units) => push(s + i, units),
                    Hist::Newer(_) => return false,
                }
            }
            s += run;
        }
        push(held, count_of(seen));
        true
    }
}
