//! A check's reads: one limit's window from its words, as a [`View`]. An open slot reads
//! three words (`cur`, the oldest slot's ring entry, `sum`); a key refused after a burst
//! two (`burst_view`); a check that closes a slot carries the closed slot's `sum` over
//! (`carried_sum`) or adds the ring up (`closed_units`). The module docs of `sliding` say
//! why each read is enough.

use crate::algorithm::counter::{count_of, pack, tag_distance, tag_of, Rule, Words};
use crate::sync::Ordering;

use super::ring::{as_oldest, closed_count, holds, read_entry, run_units, saturated, Cursor, Hist};
use super::view::{flagged, Flag, View};
use super::SUM_SATURATED;

impl Words<'_> {
    /// Reads one limit's window at `now` (loads only).
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "a slot is at least ring = slots + 1 (module docs)")]
    pub(super) fn view(&self, rule: &Rule, now: u64, expired: bool) -> View {
        let (slot, elapsed) = rule.slot_of(now);
        // Acquire pairs with the Release half of the CAS in `commit` that moved `cur` to the
        // slot it holds, whether this load reads that CAS's value or a later RMW's (another
        // commit in the slot, a rollback: RMWs continue its release sequence): the history
        // and `sum` written before that CAS happen-before the Relaxed reads below. A
        // happens-before edge of the language's model, so it holds on ARM as on x86, and in
        // loom. Slots after the one `cur` holds are read as empty (skipped, or being
        // written by a move not yet published), whatever their words say, so a view that
        // adopts a later slot from a ring word's or `sum`'s tag needs no more than this.
        let seen = self.word(rule.at).load(Ordering::Acquire);
        if expired {
            return View { slot, elapsed, seen, expired: Flag::of(true), ..View::default() };
        }
        if tag_of(seen) == slot as u32 {
            // The common case, an open slot: three words, whatever the window's length.
            let (at, shift) = rule.position(slot - rule.slots);
            let oldest = self.word(at).load(Ordering::Relaxed);
            let sum = rule.sum_word().map_or(pack(slot, 0), |at| self.word(at).load(Ordering::Relaxed));
            // Relaxed: both ordered by the Acquire load of `cur` above.
            // A saturated sum takes the slow path, which adds the ring up.
            if let (Hist::Count(oldest), true) = (
                read_entry(rule, oldest, slot - rule.slots, shift),
                tag_of(sum) == slot as u32 && count_of(sum) != SUM_SATURATED,
            ) {
                let (current, full, oldest) = (count_of(seen), count_of(sum), as_oldest(rule, oldest));
                return View {
                    slot,
                    elapsed,
                    seen,
                    current,
                    full,
                    oldest,
                    saturated: Flag(0),
                    expired: Flag::of(expired),
                };
            }
        } else if let Some(view) = self.burst_view(rule, slot, elapsed, seen) {
            return view;
        }
        self.view_slow(rule, slot, elapsed, seen)
    }

    /// The view when `cur` holds an older slot that is still in the window and the `sum`
    /// carried into that slot is 0: every unit in the window is in that slot (the slots
    /// after it were never written). It is what [`view_at`](Self::view_at) works out
    /// (`carried_sum` with a sum of 0, the oldest slot taken as empty when it is older than
    /// the one `cur` holds), from the two words alone: the view of a key refused again and
    /// again after a burst, until a check moves its `cur` on. `None` in any other case. Not
    /// inlined: an admission in an open slot, which never calls it, stays as short as
    /// without it.
    #[inline(never)]
    #[allow(clippy::arithmetic_side_effects, reason = "0 < behind < slots ≤ slot (module docs)")]
    pub(super) fn burst_view(&self, rule: &Rule, slot: u64, elapsed: u64, seen: u64) -> Option<View> {
        let at = rule.sum_word()?;
        let behind = tag_distance(slot as u32, tag_of(seen));
        let units = closed_count(rule, seen);
        if behind <= 0 || behind as u64 > rule.slots || saturated(rule, units) {
            return None;
        }
        let closed = slot - behind as u64;
        // Relaxed: only a sum of exactly 0 units for `closed` is used, and nothing read
        // after it depends on its writer (no ring entry is read), so Acquire would change
        // nothing. That 0 is exact: it is the sum the move to `closed` wrote before its CAS
        // on `cur` (which the Acquire load of `cur` in `view` follows) or a later raise of
        // it, and a raise never lowers a sum (`raise_sum`); the move's sum counted every
        // unit then in the slots before `closed`, and a rollback lowers only an open slot.
        if self.word(at).load(Ordering::Relaxed) != pack(closed, 0) {
            return None;
        }
        // `closed` wholly inside the window, or the oldest, partly covered slot.
        let (full, oldest) =
            if closed + rule.slots > slot { (units, 0) } else { (0, as_oldest(rule, units)) };
        Some(View { slot, elapsed, seen, current: 0, full, oldest, saturated: Flag(0), expired: Flag(0) })
    }

    /// The view when `cur` holds another slot than `now`'s, or when time has moved past
    /// `now` in another thread.
    #[cold]
    #[inline(never)]
    pub(super) fn view_slow(&self, rule: &Rule, mut slot: u64, mut elapsed: u64, seen: u64) -> View {
        let mut view = View::default();
        loop {
            // Filled in place, not returned in a `Result`: copying a view whose flags were
            // just stored byte by byte stalls on those stores (store forwarding fails).
            match self.view_at(rule, slot, elapsed, seen, &mut view) {
                Ok(()) => return view,
                // Another thread already works in a later slot: time is at least there.
                Err(later) => (slot, elapsed) = (later, 0),
            }
        }
    }

    /// The view at `slot` given the loaded `cur` word, or the later slot to adopt instead
    /// when `cur`, `sum` or the ring shows that time has already moved past `slot`. Not
    /// inlined: inlined into `view_slow`'s loop, its ring arithmetic's setup was hoisted
    /// before the loop and paid on every call (a refusal of a key whose admission is 2.5 s
    /// old, 60 slots: 603 instructions, 580 not inlined; callgrind).
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "slots are below 2⁴⁵ and at least ring (module docs); tag distances are below 2³¹"
    )]
    #[inline(never)]
    fn view_at(&self, rule: &Rule, slot: u64, elapsed: u64, seen: u64, view: &mut View) -> Result<(), u64> {
        let behind = tag_distance(slot as u32, tag_of(seen));
        if behind < 0 {
            return Err(slot + behind.unsigned_abs());
        }
        *view = View { slot, elapsed, seen, ..View::default() };
        let oldest = slot - rule.slots;
        if behind == 0 {
            view.current = count_of(seen);
            view.oldest = match self.hist(rule, oldest) {
                Hist::Count(units) => as_oldest(rule, units),
                Hist::Newer(newer) => return Err(newer + 1),
            };
            if let Some(at) = rule.sum_word() {
                // Relaxed: ordered by the Acquire load of `cur` in `view`.
                let sum = self.word(at).load(Ordering::Relaxed);
                match tag_distance(tag_of(sum), slot as u32) {
                    // A saturated sum (more than 2³²−1 units over the window, or a saturated
                    // slot in it) no longer says how many: add the ring up instead.
                    0 if count_of(sum) == SUM_SATURATED => {
                        (view.full, view.saturated) = flagged(self.closed_units(rule, view)?);
                    }
                    0 => view.full = count_of(sum),
                    d if d > 0 => return Err(slot + d as u64),
                    // Never written for this slot (cannot happen after `reset`/`commit`,
                    // which write it before `cur`): add the ring up instead.
                    _ => (view.full, view.saturated) = flagged(self.closed_units(rule, view)?),
                }
            }
            return Ok(());
        }
        // `cur` holds an older slot: this check would close it. Read the window from the
        // ring with that slot's count in place of what the ring has for it (once per slot).
        let (closed, units) = (slot - behind as u64, closed_count(rule, seen));
        // Acquire: pairs with the Release of the `raise_sum` that wrote what this reads. The
        // move that closed `closed` wrote the sum before its CAS on `cur`, which the Acquire
        // load of `cur` in `view` follows; but a late closer of that slot may raise the sum
        // after that CAS, counting a unit a rollback took back, and also writes the unit
        // into the slot's ring entry, first. A move that reads such a sum must read that
        // entry too (or a later value of its word), so that `carried_sum` sees the unit
        // leave and adds the ring up rather than keeping it in the sum for good
        // (`loom-tests/tests/rolled.rs`). Every later value of the sum is a `raise_sum`
        // CAS, which continues the late closer's release sequence; and a move that wrote
        // one read the entry (or a later value) before its Release: so an Acquire load of
        // any later sum sees the entry too (release sequences and read-read coherence).
        let sum = rule.sum_word().map(|at| self.word(at).load(Ordering::Acquire));
        view.oldest = match oldest {
            i if i == closed => as_oldest(rule, units),
            i if i > closed => 0,
            // One of the slots the closed slot's `sum` counts (`closed − n + 1 ..= closed −
            // 1`: it is `slot − n`, and `closed < slot`). A sum of 0 says it holds nothing,
            // whatever its entry says (`carried_sum`), so the ring is not read.
            _ if sum == Some(pack(closed, 0)) => 0,
            i => match self.hist(rule, i) {
                Hist::Count(units) => as_oldest(rule, units),
                Hist::Newer(newer) => return Err(newer + 1),
            },
        };
        (view.full, view.saturated) = flagged(match self.carried_sum(rule, view, closed, units, sum)? {
            Some(full) => (full, false),
            None => self.closed_units(rule, view)?,
        });
        Ok(())
    }

    /// `full` for the slot `view` moves to, carried over from the `sum` of the slot `cur`
    /// closes (`closed`, holding `units`; `sum` as `view_at` loaded it): plus the closed
    /// slot, less the slots that leave the window with the move. O(slots moved) rather than
    /// O(window), so a key checked about once per slot does not add its whole ring up at
    /// every check, and nothing when the sum holds no units (a key refused again and again
    /// after a burst reads no ring word here, however old the burst). `None` when that
    /// `sum` is not the closed slot's (a racing move), is or would be saturated, or a slot
    /// that leaves may hold more than the sum counted for it: add the ring up instead.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "closed < view.slot, both at least ring > slots (module docs); a sum and a count fit 33 bits"
    )]
    pub(super) fn carried_sum(
        &self,
        rule: &Rule,
        view: &View,
        closed: u64,
        units: u64,
        sum: Option<u64>,
    ) -> Result<Option<u64>, u64> {
        let Some(sum) = sum else { return Ok(Some(0)) };
        if view.slot - closed >= rule.slots {
            // The closed slot and everything before it are out of the window.
            return Ok(Some(0));
        }
        // A saturated sum no longer says how many units it held: subtracting the slots that
        // leave would forget units still in the window. A sum that would add a saturated
        // slot in is saturated too (the module docs): the ring's walk says so.
        if tag_of(sum) != closed as u32 || count_of(sum) == SUM_SATURATED || saturated(rule, units) {
            return Ok(None);
        }
        let before = count_of(sum);
        if before == 0 {
            // The slots that leave hold nothing, whatever the ring says: none is read.
            return Ok(Some(units));
        }
        // Every slot that leaves is older than the closed one, so the sum counted it, with
        // the count `cur` held when a move closed it; the ring's entry for it holds that
        // count too, unless a rollback lowered the slot's count while another check that
        // had read the higher one was still to write it (it writes what it read, and the
        // larger count wins in the ring, `raise`): subtracting that entry would forget units
        // still in the window (`tests::a_stale_closer_after_a_rollback`). A rollback raises
        // the rolled word to its slot first and publishes it with its CAS on `cur`, which
        // happened before `cur` left that slot, so it happens before the Acquire load of
        // `cur` in `view` (the later changes of `cur` are RMWs, which continue the
        // rollback's release sequence), and this Relaxed load sees it: no slot that leaves
        // has had a rollback when the word is older than the first of them.
        let first = closed + 1 - rule.slots;
        let mut leaving = 0u64;
        for slot in first..=view.slot - rule.slots {
            match self.hist(rule, slot) {
                Hist::Count(count) if !saturated(rule, count) => leaving += count,
                // Saturated, or a racing move reused the position: add the ring up.
                _ => return Ok(None),
            }
        }
        debug_assert!(rule.rolled_at != 0, "a sliding limit with a sum has a rolled word");
        if leaving > 0 && self.word(rule.rolled_at).load(Ordering::Relaxed) > rule.time_of(first, 0) {
            return Ok(None);
        }
        Ok(before.checked_sub(leaving).map(|kept| kept + units))
    }

    /// Units in the closed slots wholly inside `view`'s window (`slot − n + 1 .. slot`),
    /// from the ring, with the slot `view` closes (if any) read from `cur` instead; and
    /// whether one of them is saturated. A ring word at a time: one load and one check of
    /// its tag for the entries it holds (a move adds the whole window up when it cannot
    /// carry its `sum` over: `carried_sum`).
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "a slot is at least ring > slots; at most MAX_SLOTS 32-bit counts are added (module docs); n ≥ 1"
    )]
    pub(super) fn closed_units(&self, rule: &Rule, view: &View) -> Result<(u64, bool), u64> {
        let first = view.slot + 1 - rule.slots;
        let (mut full, mut any_saturated) = (0u64, false);
        // The slot `cur` closes counts as `cur` holds it, and the slots after it, never
        // written, as empty; the ring holds the ones before.
        let end = match view.closing(rule) {
            Some((closed, units)) => {
                if closed >= first {
                    (full, any_saturated) = (units, saturated(rule, units));
                }
                closed.max(first)
            }
            None => view.slot,
        };
        let (mut i, mut cursor) = (first, Cursor::at(rule, rule.by_ring.rem(first)));
        while i < end {
            let n = cursor.run(rule, end - i);
            // Relaxed: ordered by the Acquire load of `cur` in `view` (see there).
            let word = self.word(cursor.at).load(Ordering::Relaxed);
            if holds(rule, word, i, i + n - 1) {
                let (units, saturated) = run_units(rule, word, cursor.within, n);
                full += units;
                any_saturated |= saturated;
            } else {
                // Some of the run's slots are older than the word (empty) or a lap behind
                // it: slot by slot, as `hist` reads them.
                for j in 0..n {
                    let shift = (cursor.within + j as u32) * rule.entry_bits;
                    match read_entry(rule, word, i + j, shift) {
                        Hist::Count(units) => {
                            full += units;
                            any_saturated |= saturated(rule, units);
                        }
                        // A jump past this slot is being written: adopt it.
                        Hist::Newer(newer) => return Err(newer + 1),
                    }
                }
            }
            i += n;
            cursor.advance(rule, n);
        }
        Ok((full, any_saturated))
    }

    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "a slot below 2⁴⁵ plus a tag distance below 2³¹")]
    pub(super) fn hist(&self, rule: &Rule, slot: u64) -> Hist {
        let (at, shift) = rule.position(slot);
        // Relaxed: ordered by the Acquire load of `cur` in `view` (see there).
        read_entry(rule, self.word(at).load(Ordering::Relaxed), slot, shift)
    }
}
