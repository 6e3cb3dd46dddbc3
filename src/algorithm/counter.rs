//! What every algorithm works on, below the admission protocol (`protocol/`) and the
//! per-key layout (`layout.rs`), which both build on it: the [`Counter`] trait (the steps
//! an algorithm gives the protocol), [`Words`] (one key's words, as an algorithm reads and
//! writes them), [`Rule`] (one limit, compiled for the hot path), and how a word packs a
//! slot's tag with its count ([`pack`]). Nothing here depends on the protocol or the
//! layout, so that the algorithms need nothing above them.
//!
//! Slot indices are `now / precision + ring` (see [`Rule::slot_of`]): with a precision of at
//! least 1 ms they stay below 2⁴⁵, and a view only adopts slots that some thread computed
//! that way, so adding a window's slots to one cannot overflow; and every slot is at least
//! `ring = n + 1`, so subtracting a window's slots from one cannot go below zero. Counts
//! are at most 32-bit fields (a sliding window's ring entries may be narrower, see
//! `algorithm/sliding/`) and costs at most `max` (≤ 2³²−1), or clamped to that on the way in
//! (`Counter::MOST`), so sums of a window's counts and a cost stay below 2⁴⁵ too.
//!
//! Slot tags are 32 bits of the slot index (16 in a sliding window's narrow ring words, see
//! [`RingWord`] and `algorithm/sliding/`). They are compared only within a key that is
//! not expired, where `touched` bounds the gap to below 2³¹ slots, or 2¹⁵ in narrow words
//! (both checked at build time, `layout.rs`), so they never alias. An expired key is replaced under the key table's shard mutex, never
//! in place by concurrent checks.

use std::fmt;

use crate::divisor::Divisor;
use crate::limit::Limit;
use crate::sync::AtomicU64;

/// One algorithm's counters for one limit of a key, as the admission protocol of
/// [`KeyState::check`] drives them: read a view (loads only), decide from it, publish an
/// admission with one CAS that fails if the view is stale, take it back if a later limit
/// refuses. One implementation per algorithm, in `algorithm/` (the sliding window in `sliding/`).
///
/// [`KeyState::check`]: crate::protocol::KeyState::check
pub(crate) trait Counter {
    /// One limit as a check sees it.
    type View: Copy + Default;
    /// Held for the whole check: what a view points to stays valid until it drops.
    type Pin;
    fn pin() -> Self::Pin;
    /// The most units one commit counts. A check's cost is at most `max`; units recorded
    /// or carried over are clamped to this, which changes no decision (counts saturate at
    /// it, or the log's decisions are the same, see there) and keeps commits from overflowing.
    const MOST: u64;
    /// Words per limit.
    fn words(rule: &Rule) -> usize;
    /// The limit's words, empty at `now`: their initial values (`words` is the whole state).
    fn reset(words: &mut [u64], rule: &Rule, now: u64);
    fn view(state: &Words, rule: &Rule, now: u64, expired: bool) -> Self::View;
    /// The view found the state retired under it (the check starts over on the table).
    fn retired(view: &Self::View) -> bool;
    fn admits(rule: &Rule, view: &Self::View, cost: u64) -> bool;
    /// Counts `cost` as of the view; `false` if the state changed since.
    fn commit(state: &Words, rule: &Rule, view: &Self::View, cost: u64) -> bool;
    /// Takes back a commit of `cost` made from `view`, when a later limit refused.
    fn rollback(state: &Words, rule: &Rule, view: &Self::View, cost: u64);
    /// Whole units still free after `cost` more.
    fn room(rule: &Rule, view: &Self::View, cost: u64) -> u64;
    /// Units the view counts, not capped at `max` (what a policy change carries over).
    fn used(rule: &Rule, view: &Self::View) -> u64;
    /// The earliest time (ns) at which `cost` fits, if nothing else is admitted.
    /// `Err` with a later, conservative time if the state moved on since the view and lost
    /// what the exact answer needs (a racing check reused a ring position): the check then
    /// starts over, a bounded number of times, before it settles for that time.
    fn admissible_at(state: &Words, rule: &Rule, view: &Self::View, cost: u64) -> Result<u64, u64>;
    /// The slot (of the limit's precision) and ns into it that a commit of `cost` from the
    /// view counts at: `touched` must cover it, so that the key is not expired while the
    /// commit's units count.
    fn at(rule: &Rule, view: &Self::View, cost: u64) -> (u64, u64);
    /// What the limit counts at `now`, by when it was counted: `(time, units)` pairs, oldest
    /// first, only units some view at `now` may still count, each timed at the latest it
    /// can have been counted (its slot's last ns, which may be after `now`): a snapshot's
    /// record of the key (`protocol/snapshot.rs`). Loads only; `false` if a racing check
    /// moved the limit on while it was read (the caller reads again).
    #[cfg(feature = "serde")]
    fn history(state: &Words, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool;
}

/// The last ns of slot `slot` of `rule`: the latest the units a history reads in that slot
/// can have been counted at (for the open slot, a time still to come: a load places them no
/// later than its own time).
#[cfg(feature = "serde")]
#[inline]
pub(crate) fn slot_end(rule: &Rule, slot: u64) -> u64 {
    rule.time_of(slot.saturating_add(1), 0).saturating_sub(1)
}

/// One key's words: `touched`, then every limit's (laid out by `layout.rs`), borrowed from
/// where they live (a node of the key table, an `OwnedState`). The protocol's `KeyState`
/// derefs to them, and an algorithm reads and writes them through [`word`](Self::word) (the
/// sliding window adds its steps on them in `sliding/`). Copies share the words. (`pub`
/// only because `KeyState`, public for the loom models, derefs to it.)
#[derive(Clone, Copy)]
pub struct Words<'a>(&'a [AtomicU64]);

impl<'a> Words<'a> {
    /// The words in `words`.
    #[inline(always)]
    pub(crate) fn new(words: &'a [AtomicU64]) -> Words<'a> {
        Words(words)
    }

    #[inline]
    #[allow(
        clippy::indexing_slicing,
        reason = "indexes come from the layout of the policy passed: the state's own, or one laid out the same"
    )]
    pub(crate) fn word(&self, index: usize) -> &AtomicU64 {
        &self.0[index]
    }

    /// Every word, in order.
    #[inline]
    pub(crate) fn all(&self) -> &'a [AtomicU64] {
        self.0
    }
}

/// As the slice of words (what a `KeyState`'s `Debug` shows).
impl fmt::Debug for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[inline]
pub(crate) fn pack(slot: u64, count: u64) -> u64 {
    // Truncation to 32 bits is the point: see the module docs on tags.
    ((slot as u32 as u64) << 32) | (count.min(u64::from(u32::MAX)))
}

#[inline]
pub(crate) fn tag_of(word: u64) -> u32 {
    (word >> 32) as u32
}

#[inline]
pub(crate) fn count_of(word: u64) -> u64 {
    word & 0xFFFF_FFFF
}

/// Sets word `at` of a state being initialised (an offset its policy laid out: always there).
#[inline]
pub(crate) fn set(words: &mut [u64], at: usize, word: u64) {
    if let Some(w) = words.get_mut(at) {
        *w = word;
    }
}

/// Signed distance from tag `b` to tag `a`, in slots (valid while below 2³¹).
#[inline]
pub(crate) fn tag_distance(a: u32, b: u32) -> i64 {
    i64::from(a.wrapping_sub(b) as i32)
}

/// One limit, compiled for the hot path.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) limit: Limit,
    pub(crate) max: u64,
    /// Slot length in ns.
    pub(crate) precision: u64,
    /// Slots per window.
    pub(crate) slots: u64,
    /// `slots + 1`: ring positions, and also the slot-index offset that keeps
    /// `k - ring` from going below zero.
    pub(crate) ring: u64,
    pub(crate) strict: bool,
    /// A sliding window of one slot whose counts fit 16 bits: the current and previous
    /// slots' counts in one word with the tag, no ring (`algorithm/sliding/pair.rs`).
    /// Its `entry_bits` is then 16 (a field's width) and `ring_at` unused.
    pub(crate) pair: bool,
    /// Index of this limit's first word (`cur` for the sliding and fixed windows). With more than one slot a `sum` word follows it,
    /// then the ring.
    pub(crate) at: usize,
    /// Index of the first ring word.
    pub(crate) ring_at: usize,
    /// Index of the key's *rolled* word, shared by its limits: 1 + the start (ns) of the
    /// latest slot a rollback lowered a count in (`algorithm/sliding/`, "Stale writers").
    /// Laid out, after every limit's words, when one of a sliding-window policy's limits has
    /// a `sum` word, and then the same for every limit; else 0 (`touched`'s index: never
    /// read or written as this word). A test's prefix policy (the first limits of a longer
    /// one, read through its words) points it at the next limit's `cur`: never commit or
    /// roll back through one.
    pub(crate) rolled_at: usize,
    /// The width of a ring entry in bits, 2 to 32: the fewest that hold more than `max` (see
    /// [`ring_entry_bits`] and `algorithm/sliding/`), or wider where the limiter's other
    /// policies need it.
    ///
    /// [`ring_entry_bits`]: crate::layout::ring_entry_bits
    pub(crate) entry_bits: u32,
    /// The largest count a ring entry holds: `2^entry_bits − 1`, more than `max`.
    pub(crate) entry_most: u64,
    /// How a ring word packs: [`RingWord`] (`Wide` for every algorithm without a ring).
    /// Set with [`set_ring_word`](Self::set_ring_word), which also sets `per_word`.
    pub(crate) ring_word: RingWord,
    /// Ring entries to a word: the word's entry bits ([`RingWord::entry_bits`]) over
    /// `entry_bits`, at most 24.
    pub(crate) per_word: u32,
    /// `⌈2³² / per_word⌉`: a ring position over `per_word` as a multiply and a shift (`place`).
    pub(crate) per_word_inverse: u64,
    /// `precision` and `ring` as fast divisors.
    pub(crate) by_precision: Divisor,
    pub(crate) by_ring: Divisor,
    /// Window length in ns.
    pub(crate) window: u64,
    /// GCRA: ns between two units at the sustained rate (`window / max`, rounded up), and
    /// the burst tolerance `max × interval`.
    pub(crate) interval: u64,
    pub(crate) burst: u64,
}

impl Rule {
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "a slot index is below 2⁴⁵ (precision ≥ 1 ms) and ring ≤ MAX_SLOTS + 1"
    )]
    pub(crate) fn slot_of(&self, now: u64) -> (u64, u64) {
        let (slot, elapsed) = self.by_precision.div_rem(now);
        (slot + self.ring, elapsed)
    }

    #[inline]
    pub(crate) fn time_of(&self, slot: u64, elapsed: u64) -> u64 {
        slot.saturating_sub(self.ring).saturating_mul(self.precision).saturating_add(elapsed)
    }

    #[inline]
    pub(crate) fn at(&self) -> usize {
        self.at
    }

    /// Where slot `slot`'s ring entry lives: `(word index, bit shift in that word)`.
    #[inline]
    pub(crate) fn position(&self, slot: u64) -> (usize, u32) {
        // `ring` is at most MAX_SLOTS + 1, so the remainder fits a usize.
        self.place(self.by_ring.rem(slot) as usize)
    }

    /// `(word index, bit shift)` of ring position `position` (below `ring`).
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "ring_at plus a position below ring over the entries per word is one of the limit's words; the shift is below 48"
    )]
    pub(crate) fn place(&self, position: usize) -> (usize, u32) {
        let (word, within) = self.locate(position);
        (word, within * self.entry_bits)
    }

    /// `(word index, entry index in that word)` of ring position `position` (below `ring`).
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "ring_at plus a position below ring over the entries per word is one of the limit's words"
    )]
    pub(crate) fn locate(&self, position: usize) -> (usize, u32) {
        let (word, within) = self.split(position);
        (self.ring_at + word, within)
    }

    /// Entries from ring position `position` (below `ring`) to the end of its word.
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "within < entries per word")]
    pub(crate) fn left_in_word(&self, position: usize) -> usize {
        let (_, within) = self.split(position);
        (self.per_word - within) as usize
    }

    /// `(word, entry within it)` of ring position `position`: a multiply and a shift. With
    /// `m = ⌈2³²/d⌉ = (2³² + e)/d`, `e < d` (`d = per_word ≤ 24`), `p·m/2³²` exceeds `p/d`
    /// by `p·e/(d·2³²)`, under `1/d` for every `p < 2³²/24`, so the floor is exact for every
    /// position (below 2²⁰: a ring has at most MAX_SLOTS + 1 of them).
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "position < 2²⁰ times a multiplier ≤ 2³² fits u64; q × per_word ≤ position"
    )]
    fn split(&self, position: usize) -> (usize, u32) {
        let word = ((position as u64 * self.per_word_inverse) >> 32) as usize;
        (word, (position - word * self.per_word as usize) as u32)
    }

    /// Packs the ring in `ring_word`s, `per_word` entries of `entry_bits` to a word.
    #[allow(clippy::arithmetic_side_effects, reason = "entry_bits is 2 to 32, per_word at least 1")]
    pub(crate) fn set_ring_word(&mut self, ring_word: RingWord) {
        self.ring_word = ring_word;
        self.per_word = (ring_word.entry_bits() / self.entry_bits.max(1)).max(1);
        self.per_word_inverse = (1u64 << 32).div_ceil(u64::from(self.per_word));
    }

    /// Signed distance in slots from `slot` to ring word `word`'s tag (valid while below
    /// 2³¹ slots for a wide word, 2¹⁵ for a narrow one).
    #[inline]
    pub(crate) fn ring_distance(&self, word: u64, slot: u64) -> i64 {
        match self.ring_word {
            RingWord::Wide => tag_distance(tag_of(word), slot as u32),
            // Truncation to 16 bits is the point: a narrow word's tag is the slot's low 16 bits.
            RingWord::Narrow => i64::from(((word >> 48) as u16).wrapping_sub(slot as u16) as i16),
        }
    }

    /// `word`'s entries under the tag of `slot`.
    #[inline]
    pub(crate) fn ring_retag(&self, word: u64, slot: u64) -> u64 {
        match self.ring_word {
            RingWord::Wide => pack(slot, 0) | (word & 0xFFFF_FFFF),
            // Truncation to 16 bits is the point (see `ring_distance`).
            RingWord::Narrow => (u64::from(slot as u16) << 48) | (word & 0xFFFF_FFFF_FFFF),
        }
    }

    /// The ring position after `position` (below `ring`), wrapping to 0.
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "position < ring ≤ MAX_SLOTS + 1")]
    pub(crate) fn next_position(&self, position: u64) -> u64 {
        if position + 1 == self.ring {
            0
        } else {
            position + 1
        }
    }

    /// Ring words: `ring` entries, `per_word` to a word.
    #[inline]
    pub(crate) fn ring_words(&self) -> usize {
        (self.ring as usize).div_ceil(self.per_word as usize)
    }

    /// The `sum` word: `(slot tag, units in the closed slots wholly inside that slot's
    /// window)`, so a check in an open slot reads three words whatever the window's length.
    /// A window of one slot has no such slots and no `sum` word.
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "with more than one slot, at + 1 is the limit's sum word"
    )]
    pub(crate) fn sum_word(&self) -> Option<usize> {
        (self.slots > 1).then_some(self.at + 1)
    }
}

/// How a sliding window's ring word packs its tag (the newest slot written into it) with
/// its entries (`algorithm/sliding/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingWord {
    /// A 32-bit tag over 32 bits of entries: as many as fit (sixteen 2-bit counts to one
    /// 32-bit count).
    Wide,
    /// A 16-bit tag over 48 bits of entries: as many as fit (eight 6-bit counts, six 8-bit,
    /// four 12-bit, three 16-bit, two 24-bit). Only where tags 2¹⁵ slots apart never meet
    /// (`layout.rs` decides, the sliding module's docs argue).
    Narrow,
}
impl RingWord {
    /// The bits a word's entries take: the low 32 of a wide word, the low 48 of a narrow one.
    #[inline]
    pub(crate) fn entry_bits(self) -> u32 {
        match self {
            RingWord::Wide => 32,
            RingWord::Narrow => 48,
        }
    }
}
