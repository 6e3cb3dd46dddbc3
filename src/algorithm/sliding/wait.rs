//! A refusal's wait: the earliest time at which a refused cost fits the limit, walking the
//! window forward slot by slot from a view.

use crate::algorithm::counter::{Rule, Words};
use crate::sync::Ordering;

use super::ring::{as_oldest, held, holds, lane_sum, Cursor};
use super::View;

#[cfg(test)]
thread_local! {
    /// Run once between a wait's count of the older slots and its walk: lets `sliding/tests/`
    /// land another thread's write exactly there.
    pub(super) static BETWEEN_COUNT_AND_WALK: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Set: every wait walks the window, without the shortcut for a burst in one slot, so
    /// that `sliding/tests/` can hold the two answers together.
    pub(super) static WALK_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Waits answered by the shortcut.
    pub(super) static SHORTCUTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Set: the walk takes the ring's slots one at a time, never a word's run at once.
    pub(super) static SLOT_BY_SLOT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Runs of slots the walk took a word at a time.
    pub(super) static RUNS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What a refusal's wait knows from the view alone, before any ring word: the newest slot
/// with units (`slot`: the current one, or the one a move would close, after which nothing
/// is counted yet) and its units, and `left`, what the ring's slots before it, wholly
/// inside the window, hold and have not yet left (`u64::MAX` with a saturated slot in the
/// window: no count).
#[derive(Clone, Copy)]
pub(super) struct Tail {
    closing: Option<(u64, u64)>,
    slot: u64,
    units: u64,
    left: u64,
}

impl Tail {
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "slots below 2⁴⁵ (module docs)")]
    fn of(rule: &Rule, view: &View) -> Tail {
        let closing = view.closing(rule);
        let (slot, units) = match closing {
            Some((closed, units)) if closed + rule.slots > view.slot => (closed, units),
            _ => (view.slot, view.current),
        };
        let left = match (view.saturated.get(), slot == view.slot) {
            (true, _) => u64::MAX,
            (false, true) => view.full,
            (false, false) => view.full.checked_sub(units).unwrap_or(u64::MAX),
        };
        Tail { closing, slot, units, left }
    }

    /// The wait when the slots before the tail that are wholly inside the window are empty
    /// and the tail alone leaves no room for `cost` (a burst refused again and again, the
    /// usual case under attack): nothing fits until the tail is the oldest slot (the oldest
    /// slot now, whatever it holds, is gone long before), where its weight falls until
    /// `cost` fits. The walk comes to the same answer, by the same two jumps (`sliding/tests/`
    /// holds the two together); this reads no ring word, however long the ring and however
    /// old the burst. `None` otherwise.
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "slots below 2⁴⁵ (module docs)")]
    fn burst_wait(&self, rule: &Rule, cost: u64) -> Option<u64> {
        #[cfg(test)]
        if WALK_ONLY.with(std::cell::Cell::get) {
            return None;
        }
        let room = rule.max.saturating_sub(cost);
        if self.left != 0 || self.units <= room {
            return None;
        }
        #[cfg(test)]
        SHORTCUTS.with(|taken| taken.set(taken.get() + 1));
        let oldest = self.slot + rule.slots;
        let p = u128::from(rule.precision);
        Some(match Words::fits_in(rule, p, room, 0, as_oldest(rule, self.units.min(rule.entry_most)), 0) {
            Some(at) => rule.time_of(oldest, at),
            None => rule.time_of(oldest + 1, 0),
        })
    }
}

impl Words<'_> {
    /// The earliest time (ns) at which `cost` more units fit this limit if nothing else is
    /// admitted: the window slides forward slot by slot; within a slot the interpolated
    /// count falls linearly, so the crossing point is solved exactly (rounded up to the ns).
    ///
    /// The walk re-reads the ring after the view. If a racing check has moved the key on
    /// meanwhile and reused a position the walk needs, that slot's count is gone: read as
    /// empty, it can keep the window from draining (a wait up to a whole window too long,
    /// never too short), so the answer is an `Err` and the check starts over from fresh
    /// views. It is not retried for ever: the racing check may be preempted in the middle of
    /// its move (ring written, `cur` not yet), and a check must not wait for another.
    #[inline(always)]
    pub(super) fn admissible_at(&self, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
        let tail = Tail::of(rule, view);
        if let Some(at) = tail.burst_wait(rule, cost) {
            return Ok(at);
        }
        self.admissible_slow(rule, view, cost, tail)
    }

    /// [`admissible_at`](Self::admissible_at) past the burst shortcut: the walk. Out of
    /// line, so that a refusal for a burst (the path of a key under attack) carries none
    /// of its setup.
    #[inline(never)]
    fn admissible_slow(&self, rule: &Rule, view: &View, cost: u64, tail: Tail) -> Result<u64, u64> {
        let mut lost = false;
        let at = self.admissible_walk(rule, view, cost, tail, &mut lost);
        if lost {
            Err(at)
        } else {
            Ok(at)
        }
    }

    /// The walk of [`admissible_at`](Self::admissible_at); sets `lost` if it met a reused
    /// ring position.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "slots and counts below 2⁴⁵, slots at least ring (module docs); u64 × u64 fits u128"
    )]
    fn admissible_walk(&self, rule: &Rule, view: &View, cost: u64, tail: Tail, lost: &mut bool) -> u64 {
        let room = rule.max.saturating_sub(cost);
        let last = view.slot + rule.slots + 1;
        let Tail { closing, slot: tail, units: tail_units, left } = tail;
        let position = rule.by_ring.rem(view.slot + 1 - rule.slots);
        // The walk takes each slot that leaves from the ring, and a ring entry can hold more
        // than the sum counted for its slot (a rolled-back unit, see `carried_sum`): taken
        // from the sum, it would drain the window early. So when the older slots hold units,
        // the walk starts from the ring's own count of them (the ring's slots before the
        // tail; none after a closed slot that left the window), and checks at the end that
        // no entry grew meanwhile (entries only grow while they hold their slot: equal
        // totals mean every entry it read was the one counted here). When the sum says they
        // hold none, they truly hold none: the walk counts nothing from them.
        let ring_slots = view.slot + 1 - rule.slots..closing.map_or(tail, |(closed, _)| closed.min(tail));
        let counted = match (left > 0).then(|| self.older_units(rule, ring_slots.clone(), position)) {
            Some(None) => {
                *lost = true;
                return rule.time_of(last, 0);
            }
            counted => counted.flatten(),
        };
        let (whole, left) = match counted {
            Some(units) => {
                let closed_units = if tail == view.slot { 0 } else { tail_units };
                (view.current + closed_units + units, if left == u64::MAX { left } else { units })
            }
            None => (view.current + view.full, left),
        };
        #[cfg(test)]
        if let Some(between) = BETWEEN_COUNT_AND_WALK.with(|hook| hook.borrow_mut().take()) {
            between();
        }
        let at = self.slide(rule, view, room, (whole, view.oldest, left), (tail, tail_units), position, lost);
        if let Some(before) = counted {
            if self.older_units(rule, ring_slots, position) != Some(before) {
                *lost = true;
                return rule.time_of(last, 0);
            }
        }
        at
    }

    /// The units the ring holds for `slots` (consecutive, the first at ring position
    /// `position`), or `None` if a position holds another slot (a racing move reused it).
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "at most MAX_SLOTS 32-bit counts; positions below ring"
    )]
    pub(super) fn older_units(&self, rule: &Rule, slots: std::ops::Range<u64>, position: u64) -> Option<u64> {
        // A word at a time: one load, one check of its tag, and its entries added up.
        let (mut i, mut units) = (slots.start, 0u64);
        let mut cursor = Cursor::at(rule, position);
        let per_word = u64::from(rule.per_word);
        let entries = u64::MAX >> (u64::BITS - rule.per_word * rule.entry_bits);
        while i < slots.end {
            if cursor.within == 0 && slots.end - i >= per_word && rule.ring - cursor.position >= per_word {
                // A whole word (the usual case): no run to measure.
                // Relaxed: ordered by the Acquire load of `cur` in `view`.
                let word = self.word(cursor.at).load(Ordering::Relaxed);
                let last = i + per_word - 1;
                if !holds(rule, word, i, last) {
                    return None;
                }
                units += lane_sum(word & entries, rule.entry_bits);
                i += per_word;
                cursor.advance(rule, per_word);
                continue;
            }
            let (n, run) = self.run(rule, i, cursor, slots.end)?;
            units += run;
            i += n;
            cursor.advance(rule, n);
        }
        Some(units)
    }

    /// The slots from `i` (at `cursor`) up to `end` (exclusive, after `i`) that share `i`'s
    /// ring word: how many and the units they hold; `None` if the word holds another slot
    /// for any of them (a racing move reused it).
    #[inline(always)]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "positions below ring; within < per_word, whose entries take at most 48 bits; n ≥ 1 entries"
    )]
    fn run(&self, rule: &Rule, i: u64, cursor: Cursor, end: u64) -> Option<(u64, u64)> {
        let n = cursor.run(rule, end - i);
        let last = i + n - 1;
        // Relaxed: ordered by the Acquire load of `cur` in `view`.
        let word = self.word(cursor.at).load(Ordering::Relaxed);
        if !holds(rule, word, i, last) {
            return None;
        }
        // n entries of at most 48 bits in all: their lanes, added up.
        let bits = n as u32 * rule.entry_bits;
        let lanes = (word >> (cursor.within * rule.entry_bits)) & ((1u64 << bits) - 1);
        Some((n, lane_sum(lanes, rule.entry_bits)))
    }

    /// The walk of [`admissible_walk`](Self::admissible_walk) from the view's slot: `whole`
    /// (units wholly inside the window), `oldest` and `left` (units the ring's slots before
    /// the tail still hold, or `u64::MAX` if unknown), and the tail; sets `lost` if it met
    /// a reused ring position.
    #[allow(
        clippy::arithmetic_side_effects,
        clippy::too_many_arguments,
        reason = "slots and counts below 2⁴⁵, slots at least ring (module docs)"
    )]
    fn slide(
        &self,
        rule: &Rule,
        view: &View,
        room: u64,
        (mut whole, mut oldest, mut left): (u64, u64, u64),
        (tail, tail_units): (u64, u64),
        mut position: u64,
        lost: &mut bool,
    ) -> u64 {
        let p = u128::from(rule.precision);
        let last = view.slot + rule.slots + 1;
        let closing = view.closing(rule);
        // The slots the ring holds counts for: before the current one and the one a move
        // would close.
        let ring_end = closing.map_or(view.slot, |(closed, _)| closed.min(view.slot));
        let mut slot = view.slot;
        loop {
            let from = if slot == view.slot { view.elapsed } else { 0 };
            if whole <= room {
                if let Some(at) = Self::fits_in(rule, p, room, whole, oldest, from) {
                    return rule.time_of(slot, at);
                }
            } else if view.current > room && slot < view.slot + rule.slots {
                // Nothing fits while the current slot is wholly inside the window (the usual
                // refusal: a burst within one slot): go straight to where it becomes the oldest.
                let closes_with = view.current.min(rule.entry_most);
                (slot, whole, oldest) = (view.slot + rule.slots, 0, as_oldest(rule, closes_with));
                continue;
            } else if left == 0 && slot < tail + rule.slots {
                // The ring's slots before the tail are empty from here: go straight to where
                // the tail becomes the oldest.
                (slot, whole, oldest) = (
                    tail + rule.slots,
                    whole.saturating_sub(tail_units),
                    as_oldest(rule, tail_units.min(rule.entry_most)),
                );
                continue;
            }
            if slot == last {
                return rule.time_of(last, 0);
            }
            // While the window stays over `room` however far the ring's slots drain it, they
            // leave a word at a time: the slots from `i` that share its ring word, if the
            // window still holds more than `room` once they have all left and the older slots
            // hold all they take (`left`: no entry is cut short; always so unless a racing
            // move rewrote the ring, which the recount after the walk finds). The answer is
            // the walk's slot by slot (`sliding/tests/` holds the two together): none of those
            // slots could fit, and `left` cannot reach 0 before the run's end unless the rest
            // of it is empty. A run it cannot take (its word reused by a racing move, or
            // units enough to matter) goes slot by slot.
            let i = slot + 1 - rule.slots;
            #[cfg(test)]
            let runs = !SLOT_BY_SLOT.with(std::cell::Cell::get);
            #[cfg(not(test))]
            let runs = true;
            if runs && i < ring_end && view.current <= room {
                if let Some((n, units)) = self.run(rule, i, Cursor::at(rule, position), ring_end) {
                    if whole.saturating_sub(units) > room && (left == u64::MAX || units <= left) {
                        // `oldest` stays stale: with more than `room` left, the next step
                        // sets it (or a jump does) before anything reads it.
                        whole -= units;
                        if left != u64::MAX {
                            left -= units;
                        }
                        slot += n;
                        position = if position + n == rule.ring { 0 } else { position + n };
                        #[cfg(test)]
                        RUNS.with(|taken| taken.set(taken.get() + 1));
                        continue;
                    }
                }
            }
            // The slot that was oldest leaves; the next one becomes the oldest. Its count comes
            // from the ring, walked position by position (no division per slot), or from `cur`
            // for the slot a move would close, after which the ring has nothing yet.
            slot += 1;
            let i = slot - rule.slots;
            let leaving = match closing {
                _ if i == view.slot => view.current,
                _ if i > view.slot => 0,
                Some((closed, units)) if i == closed => units,
                Some((closed, _)) if i > closed => 0,
                _ => {
                    let (at, shift) = rule.place(position as usize);
                    // Relaxed: ordered by the Acquire load of `cur` in `view`.
                    let word = self.word(at).load(Ordering::Relaxed);
                    held(rule, word, i, shift).unwrap_or_else(|| {
                        *lost = true;
                        0
                    })
                }
            };
            position = rule.next_position(position);
            // A ring slot counts for no more than the older slots still hold: nothing, when
            // the sum says they hold nothing (an entry above that is a rolled-back unit).
            let leaving = if i < tail { leaving.min(left) } else { leaving };
            whole = whole.saturating_sub(leaving);
            oldest = as_oldest(rule, leaving);
            if i < tail && left != u64::MAX {
                left -= leaving;
            }
        }
    }

    /// Where in a slot `cost` fits, given the units wholly inside the window (`whole`, at
    /// most `room`) and the oldest, partly covered slot's: from `from` ns into the slot, or
    /// `None` if not before its end.
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "counts below 2⁴⁵ (module docs); u64 × u64 fits u128; whole ≤ room"
    )]
    pub(super) fn fits_in(
        rule: &Rule,
        p: u128,
        room: u64,
        whole: u64,
        oldest: u64,
        from: u64,
    ) -> Option<u64> {
        if rule.strict || oldest == 0 {
            return (whole + oldest <= room || oldest == 0).then_some(from);
        }
        // Need whole·p + oldest·(p − e) ≤ room·p, i.e. e ≥ (whole + oldest − room)·p / oldest.
        let excess = (whole + oldest).saturating_sub(room);
        if excess >= oldest {
            // The crossing point is at or past the slot's end: the next slot decides.
            return None;
        }
        // 64-bit division when the product fits (a 128-bit one is a slow library call).
        let need = match excess.checked_mul(rule.precision) {
            Some(product) => product.div_ceil(oldest),
            None => u64::try_from((u128::from(excess) * p).div_ceil(u128::from(oldest))).unwrap_or(u64::MAX),
        };
        let at = need.max(from);
        (at < rule.precision).then_some(at)
    }
}
