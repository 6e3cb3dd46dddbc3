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
//! and over-admit (`sliding/tests/` steps through the interleaving). So a rollback first raises
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

#[cfg(feature = "serde")]
mod history;
mod pair;
mod read;
mod ring;
mod view;
mod wait;

use pair::{pack_pair, pair_admissible_at};
use ring::{held, read_entry, with_entry, Hist};
use view::View;

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
    #[cfg(feature = "serde")]
    fn history(state: &Words, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool {
        state.history(rule, now, out)
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
