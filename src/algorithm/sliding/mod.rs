//! The sliding window (interpolated or strict): one limit's ring of per-slot counters.
//!
//! # Layout
//! A window of one slot whose counts fit 16 bits is one *pair* word instead, both slots'
//! counts beside the tag, with no ring (`pair.rs`); everything below is about rings.
//!
//! A limit's words, behind the key's `touched` (`layout.rs`), and after every limit's words
//! the key's `rolled` word when a limit has a `sum`:
//!
//! ```text
//! [touched] ([cur] [sum] [ring words × ⌈(n+1) / entries per word⌉])… [rolled]
//! ```
//!
//! * `cur`: the limit's current slot as one word, `(slot tag: u32, count: u32)`. Every
//!   admission into the limit is a CAS on this word, so per limit, admissions are totally
//!   ordered and exact.
//! * `sum`: `(slot tag, units in the closed slots wholly inside that slot's window)`, so a
//!   check in an open slot reads three words whatever the window's length (a window of one
//!   slot has none).
//! * the ring: `n + 1` closed slots' counts. Slot `i`'s count lives at position
//!   `i % (n + 1)`. Entries are as narrow as the limit's `max` allows: the fewest bits
//!   (at least 2) whose largest count is above `max`, so 6 bits up to `max` 62, 8 up to
//!   254, 10 up to 1,022, 16 up to 65,534, up to 24; past that 32. A ring word packs a
//!   tag, the newest slot written into it, with as many entries as fit: an entry then
//!   holds the newest slot at or before the tag that maps to its position (`read_entry`,
//!   `ring.rs`). In slots of 1 s or more, where the policy's expiry and two rings span
//!   under 2¹⁴ slots, the word is *narrow*, a 16-bit tag over 48 bits of entries;
//!   otherwise, and for 32-bit entries, it is *wide*, a 32-bit tag over 32 bits
//!   (`RingWord`, `counter.rs`; `layout.rs` decides). So a 60/min limit at 1 s slots keeps
//!   its 61 closed slots in 8 words of eight 6-bit counts, and a 1000/min one in 16 of
//!   four 10-bit counts.
//! * `rolled`: 1 + the start (ns) of the latest slot a rollback lowered (or was about to
//!   lower) a count in, in any of the key's limits that has a `sum` (0: none); see "Stale
//!   writers".
//!
//! # Moving on
//! At a current slot `k` the window reads slots `k-n ..= k-1` from the ring, which leaves
//! position `k % (n+1)` free: the thread that moves `cur` from `k` to a later slot writes
//! slot `k`'s final count there *before* its CAS, so the history is complete the moment the
//! new `cur` is visible (Release on the CAS, Acquire on the load). A jump of several slots
//! also writes the skipped slots as empty, one CAS per ring word. A reader that meets a
//! word whose tag is a lap ahead of the slot it wants knows time has moved on and adopts
//! the later slot, so no one waits for anyone.
//!
//! The new `sum` is carried from the old one (`carried_sum`): plus the closed slot, less
//! the slots that leave the window with the move, read from the ring. So a move costs
//! O(slots moved), not O(window), including the steady state of a key checked every few
//! seconds on a per-minute limit, whose every check opens a slot while an older one with
//! units leaves. It adds the ring up instead when the old `sum` is saturated or not the
//! closed slot's (a racing move), or when a leaving entry may hold more than the `sum`
//! counted for its slot (below).
//!
//! # Stale writers
//! A thread may be delayed for any time between loading `cur` and writing the ring. Its
//! write (`raise`) is a CAS on the whole word that changes only the entries of the slots it
//! closes, and each only if the word does not already hold that slot with at least as many
//! units, or a later lap of its position: a stale writer's slots are older than what the
//! word holds, so it changes nothing. Every check that closes slot `k` while `cur` still
//! holds it writes `k`'s count as of its load of `cur`, and the thread whose CAS moves `cur`
//! on wrote the final one, so the larger count wins. A rollback (a check of several limits
//! or keys taking its units back) is the one thing that lowers an open slot's count: a
//! closer that read the count before it writes more than the slot finally held, and the
//! entry keeps those rolled-back units (conservative) while the `sum` the move carried
//! does not. Subtracting that entry from a `sum` would forget units still in the window,
//! and over-admit (`tests.rs` steps through the interleaving). So a rollback first raises
//! the key's `rolled` word to its slot, and publishes it with its CAS on `cur` (Release);
//! every later change of `cur` is an RMW, which continues that CAS's release sequence, so a
//! move whose Acquire load of `cur` reads a later slot sees the raise. A move whose leaving
//! entries hold units subtracts them only when `rolled` is older than the first of them (no
//! rollback touched them), and otherwise adds the ring up. A late closer may also raise the
//! `sum` its move would have written, counting the rolled-back unit; it writes the ring
//! entry first and raises the sum with Release, and a move loads the sum it carries with
//! Acquire, so a move that reads that sum reads the entry too and sees the unit leave (else
//! the sum would keep it). A refusal's wait starts from the ring's own count (`wait.rs`).
//! The loom models in `loom-tests/tests/rolled.rs` race a rollback and a late closer
//! against the moves after them.
//!
//! The argument rests on comparing a word's tag with a slot, which holds while the two are
//! less than half the tag's range apart. The move of `cur` to slot `c` left every ring
//! position holding a slot of `c − n − 1 .. c`, tags only move forward, and a key that is
//! not expired was counted in within its expiry (`touched`, see `counter.rs`); so the tags
//! and slots a thread compares are within the key's expiry and two rings of each other,
//! plus however long that thread was delayed between its load of `cur` and its last read
//! or write of the ring. A wide tag (32 bits) holds for delays under 2³¹ slots less that
//! span, which `layout.rs` keeps within 2³⁰ slots and two rings: about 2³⁰ slots, 34
//! years at the default 1 s slots, 12 days at the finest precision (1 ms). A narrow tag
//! (16 bits) holds for delays under 2¹⁵ slots less that span, which `layout.rs` keeps
//! below 2¹⁴ (else the words stay wide): at least 2¹⁴ slots, 4.5 hours at 1 s slots, 11
//! days at 1 min slots; narrow words are never used in slots under 1 s. A thread stopped
//! longer than that while others go on checking the same key could write a closed count
//! into a later lap, or read one from it, and miscount that key.
//!
//! "Counted in within its expiry" assumes that a check which raised `touched` (its
//! `cover`) also moved `cur`, or that another check did. Within one key that holds: a
//! check of several limits whose commit into a limit fails lost to a check that committed
//! into it, and that check goes on to the later limits (or loses to one that does).
//! [`KeyState::check_many`](crate::protocol::KeyState::check_many) covers every key before
//! its first commit, so a key B checked only together with a key A whose every commit
//! loses a race (and whose re-read then refuses) keeps a fresh `touched` while its `cur`
//! stays where it was. Were that to last for the bound above (4.5 hours of lost races at
//! 1 s slots in narrow words, without one admission of B), B's tags would be compared
//! across a wrap. The loom models in `loom-tests/tests/slot_rotation.rs` race a delayed closer
//! against later ones, in a narrow and a wide word of 4-bit and of 10-bit counts;
//! `tests/model.rs` runs across the points where either tag wraps.
//!
//! # Saturation
//! A check admits at most `max` units into a slot, so an entry (whose width is above
//! `max`) always holds a slot's exact count. Only `record` or a carry between policies can
//! put more into a slot: closed, its entry then saturates at its width (`saturated`), and
//! counts as full until the slot has left the window: its width (above `max`) while it is
//! wholly inside, more than `max` as the oldest, partly covered slot (`as_oldest`). The
//! slot `cur` holds keeps its exact count up to 2³²−1, where it saturates too (a count of
//! 2³²−1 may stand for more: `record`'s cost is clamped there). A saturated slot stays
//! saturated: a `sum` that adds one in is marked saturated (the ring is then added up, so
//! a view knows), a ring re-encoded into wider entries (`reencode`, `ring.rs`) keeps it saturated at
//! the new width, and what a key is known to have used (`used`, carried into a new layout)
//! is everything there is. Decisions are then conservative: never an admission the exact
//! count would refuse, never a `retry_after` too early (`tests/contract.rs`,
//! `tests/model.rs`). A limit of `max` 2³²−1 has entries no wider than `max`: its counts
//! saturate at 2³²−1 and read as exactly that.

use crate::algorithm::counter::{count_of, pack, set, tag_distance, tag_of, Counter, Rule, Words};
use crate::limit::MAX_UNITS;
use crate::sync::Ordering;

mod pair;
mod ring;
mod view;
mod wait;

use pair::{pack_pair, pair_admissible_at};
use ring::{
    as_oldest, closed_count, held, holds, read_entry, run_units, saturated, with_entry, Cursor, Hist,
};
use view::{flagged, Flag, View};

/// A `sum` word's count once the units over a window no longer fit 32 bits (`pack`
/// saturates), or once a saturated slot is among them: the sum is then added up from the
/// ring, which holds every slot's count and says which saturated.
const SUM_SATURATED: u64 = u32::MAX as u64;

/// The sliding-window counter (interpolated or strict): the module docs describe it.
pub(crate) struct Sliding;

impl Counter for Sliding {
    type View = View;
    type Pin = ();
    /// A slot's count saturates at 2³²−1 (`pack`).
    const MOST: u64 = MAX_UNITS;
    #[inline(always)]
    fn pin() {}
    #[allow(clippy::arithmetic_side_effects, reason = "ring is at most MAX_SLOTS + 1")]
    fn words(rule: &Rule) -> usize {
        if rule.pair {
            return 1;
        }
        1 + usize::from(rule.slots > 1) + rule.ring_words()
    }
    fn reset(words: &mut [u64], rule: &Rule, now: u64) {
        let (slot, _) = rule.slot_of(now);
        if rule.pair {
            set(words, rule.at, pack_pair(slot, 0, 0));
            return;
        }
        set(words, rule.at, pack(slot, 0));
        if let Some(at) = rule.sum_word() {
            set(words, at, pack(slot, 0));
        }
        // `slot_of` puts every slot at least `ring` in: nothing saturates.
        // Oldest first, so each word's tag ends at the newest slot in it; every count is 0.
        for i in slot.saturating_sub(rule.ring)..slot {
            let at = rule.position(i).0;
            set(words, at, rule.ring_retag(0, i));
        }
    }
    #[inline(always)]
    fn view(state: &Words, rule: &Rule, now: u64, expired: bool) -> View {
        if rule.pair {
            return state.pair_view(rule, now, expired);
        }
        state.view(rule, now, expired)
    }
    #[inline(always)]
    fn retired(_: &View) -> bool {
        false
    }
    #[inline(always)]
    fn admits(rule: &Rule, view: &View, cost: u64) -> bool {
        view.admits(rule, cost)
    }
    #[inline(always)]
    fn commit(state: &Words, rule: &Rule, view: &View, cost: u64) -> bool {
        if rule.pair {
            return state.pair_commit(rule, view, cost);
        }
        state.commit(rule, view, cost)
    }
    fn rollback(state: &Words, rule: &Rule, view: &View, cost: u64) {
        Sliding::rollback_in(state, rule, view.slot, cost);
    }
    #[inline(always)]
    fn room(rule: &Rule, view: &View, cost: u64) -> u64 {
        view.room(rule, cost)
    }
    fn used(rule: &Rule, view: &View) -> u64 {
        view.used(rule)
    }
    #[inline(always)]
    fn admissible_at(state: &Words, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
        if rule.pair {
            return Ok(pair_admissible_at(rule, view, cost));
        }
        state.admissible_at(rule, view, cost)
    }
    #[inline(always)]
    fn at(_: &Rule, view: &View, _: u64) -> (u64, u64) {
        (view.slot, view.elapsed)
    }
}

impl Sliding {
    /// [`Counter::rollback`] of a commit made in `slot`.
    #[inline]
    pub(crate) fn rollback_in(state: &Words, rule: &Rule, slot: u64, cost: u64) {
        if rule.pair {
            return state.pair_rollback(rule, slot, cost);
        }
        state.rollback(rule, slot, cost);
    }
}

impl Words<'_> {
    /// Reads one limit's window at `now` (loads only).
    #[inline(always)]
    #[allow(clippy::arithmetic_side_effects, reason = "a slot is at least ring = slots + 1 (module docs)")]
    fn view(&self, rule: &Rule, now: u64, expired: bool) -> View {
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
    fn burst_view(&self, rule: &Rule, slot: u64, elapsed: u64, seen: u64) -> Option<View> {
        let at = rule.sum_word()?;
        let behind = tag_distance(slot as u32, tag_of(seen));
        let units = closed_count(rule, seen);
        if behind <= 0 || behind as u64 > rule.slots || saturated(rule, units) {
            return None;
        }
        let closed = slot - behind as u64;
        // Relaxed: the move to `closed` wrote its sum before its CAS on `cur`, which the
        // Acquire load of `cur` in `view` follows, so this reads that sum or a later one. A
        // later one of the same slot is a late closer's raise, never lower (`raise_sum`),
        // and that move's sum was exact or above (a rollback lowers only an open slot): so
        // 0 is exact. Only 0 is used, which needs no ring entry (unlike `view_at`'s
        // Acquire load, whose sum may be subtracted from).
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
    fn view_slow(&self, rule: &Rule, mut slot: u64, mut elapsed: u64, seen: u64) -> View {
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
    fn carried_sum(
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
    fn closed_units(&self, rule: &Rule, view: &View) -> Result<(u64, bool), u64> {
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
    fn hist(&self, rule: &Rule, slot: u64) -> Hist {
        let (at, shift) = rule.position(slot);
        // Relaxed: ordered by the Acquire load of `cur` in `view` (see there).
        read_entry(rule, self.word(at).load(Ordering::Relaxed), slot, shift)
    }

    /// Counts `cost` in the view's slot with one CAS on `cur`, first writing what the move
    /// to a new slot closes: the closed slot's final count, the skipped slots as empty, and
    /// the new slot's `sum`. `false` if `cur` changed since the view.
    #[inline(always)]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "slots below 2⁴⁵ and at least ring (module docs); a 32-bit count plus a cost ≤ MOST"
    )]
    fn commit(&self, rule: &Rule, view: &View, cost: u64) -> bool {
        if let Some((closed, units)) = view.closing(rule) {
            // The closed slot, unless a jump longer than the ring leaves it out, and the
            // skipped slots, one ring word at a time.
            let mut first = closed.max(view.slot - rule.ring);
            while first < view.slot {
                let position = rule.by_ring.rem(first) as usize;
                let in_word = rule.left_in_word(position);
                let in_ring = rule.ring as usize - position;
                let last = (first + in_word.min(in_ring) as u64 - 1).min(view.slot - 1);
                self.raise(rule, position, first..=last, (closed, units));
                first = last + 1;
            }
            if let Some(at) = rule.sum_word() {
                // A sum with a saturated slot in it is saturated (module docs).
                let full = if view.saturated.get() { SUM_SATURATED } else { view.full };
                self.raise_sum(at, pack(view.slot, full));
            }
        }
        let next = pack(view.slot, view.current + cost);
        // Release pairs with the Acquire load in `view`: the history written just above
        // happens-before any view that sees `next` (or a later value in its release sequence).
        // Acquire pairs with the RMWs of `KeyState::migrate_at` (see there).
        self.word(rule.at).compare_exchange(view.seen, next, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// Writes `slots` (consecutive, all in the ring word that holds ring position
    /// `position`, the first's) as closed: `closed.0` with `closed.1` units, the others
    /// empty. An entry that already holds its slot keeps the larger count, and an entry that
    /// holds a later lap is left alone; the word's tag becomes the newest slot in it. Every
    /// thread closing a slot writes the same final count, and a stale writer's smaller count
    /// or older slot loses, so the ring only ever moves forward (module docs).
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "positions below ring: `position + k` stays within the word (the caller's split)"
    )]
    fn raise(&self, rule: &Rule, position: usize, slots: std::ops::RangeInclusive<u64>, closed: (u64, u64)) {
        let (at, _) = rule.place(position);
        let cell = self.word(at);
        let newest = *slots.end();
        // Relaxed: published by the Release CAS on `cur` that follows in `commit`.
        let mut old = cell.load(Ordering::Relaxed);
        loop {
            let mut word = old;
            if rule.ring_distance(old, newest) < 0 {
                word = rule.ring_retag(old, newest);
            }
            for (k, slot) in slots.clone().enumerate() {
                let (_, shift) = rule.place(position + k);
                let ours = if slot == closed.0 { closed.1 } else { 0 };
                match (held(rule, old, slot, shift), read_entry(rule, old, slot, shift)) {
                    (Some(have), _) if have >= ours => {}
                    (None, Hist::Newer(_)) => {}
                    _ => word = with_entry(rule, word, shift, ours),
                }
            }
            if word == old {
                return;
            }
            match cell.compare_exchange_weak(old, word, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => old = seen,
            }
        }
    }

    /// Stores `word` in the `sum` word unless it already holds a newer slot, or the same
    /// slot with at least as many units (as [`raise`](Self::raise) does for ring entries).
    fn raise_sum(&self, at: usize, word: u64) {
        let cell = self.word(at);
        // Relaxed: only compared.
        let mut old = cell.load(Ordering::Relaxed);
        loop {
            let ahead = tag_distance(tag_of(word), tag_of(old));
            if ahead < 0 || (ahead == 0 && count_of(word) <= count_of(old)) {
                return;
            }
            // Release: publishes this commit's ring writes, made before, to a move that
            // reads this sum (its Acquire load in `view_at`) without having followed this
            // commit's CAS on `cur`, which fails when this commit is a late closer.
            match cell.compare_exchange_weak(old, word, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => old = seen,
            }
        }
    }

    /// Takes back `cost` units committed to `slot` by a check that then failed on a later
    /// limit: exact while the slot is open (counts add up in any order, and a slot's tag
    /// never comes back once `cur` has moved on). If the slot has closed meanwhile the
    /// units stay (see the module docs). A count saturated at 2³²−1 (`record`) no longer
    /// says how many units it holds: it stays saturated (conservative).
    fn rollback(&self, rule: &Rule, slot: u64, cost: u64) {
        let cell = self.word(rule.at);
        // Relaxed: what this reads is only compared, never used to read other words.
        let mut cur = cell.load(Ordering::Relaxed);
        // Only a limit with a `sum` subtracts ring entries from it (`carried_sum`).
        let mut raise = rule.sum_word().is_some();
        while tag_of(cur) == slot as u32 && count_of(cur) < MAX_UNITS {
            if raise {
                // Before the count is lowered: a late closer may then write the count it
                // read before, more than the slot ends with, and `carried_sum` must not
                // subtract that entry. Relaxed: published by the Release CAS below.
                self.word(rule.rolled_at)
                    .fetch_max(rule.time_of(slot, 0).saturating_add(1), Ordering::Relaxed);
                raise = false;
            }
            let next = pack(slot, count_of(cur).saturating_sub(cost));
            // Release: publishes the rolled word's raise above. Every later change of
            // `cur` is an RMW (a commit's CAS, another rollback), which continues this
            // CAS's release sequence, so a view whose Acquire load of `cur` reads any value
            // after this one (every value of a later slot) sees the raise (`carried_sum`).
            // It also continues the release sequence of the commit that moved `cur` to this
            // slot, so a reader of this value still sees the history that commit wrote
            // (C++20's rule, which Rust's model is, on x86, ARM and every target; loom's
            // RMWs carry them on too).
            match cell.compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests;
