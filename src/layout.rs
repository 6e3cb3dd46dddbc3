//! The per-key layout: how a policy's limits are compiled (a [`Rule`] each, in a
//! [`Policy`]) and laid out as one key's `AtomicU64` words. (`Rule` itself, what slot
//! indices and tags may hold, and how a word packs a slot's tag with its count are
//! `algorithm/counter.rs`'s.)
//!
//! A key's words are `[touched]` followed by each limit's words in order (see each
//! algorithm's `Counter::words`; the sliding window's are in `algorithm/sliding/`).
//! `touched` is the time (ns) of the last admission that moved a slot: it bounds how old
//! every count is, which is what eviction and expiry need. A retired state's `touched` is
//! [`RETIRED`]. A sliding window's ring words pack narrow or wide (`narrow_rings`), and
//! [`Carry`] says what a policy change does with a key's counts.

use std::sync::atomic::AtomicBool;
#[cfg(any(test, slidegate_loom))]
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::counter::{set, Counter, RingWord, Rule};
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::decision::Decision;
use crate::divisor::Divisor;
use crate::error::ConfigError;
use crate::limit::{Accuracy, Limit};
use crate::metrics::PolicyMetrics;

/// The most limits one limiter may apply together (views live on the stack).
///
/// ```
/// use slidegate::{ConfigError, Limit, Limiter, MAX_LIMITS};
///
/// let mut builder = Limiter::<u64>::builder();
/// for n in 0..=MAX_LIMITS as u64 {
///     builder = builder.limit(Limit::per_second(n + 1));
/// }
/// assert!(matches!(builder.build(), Err(ConfigError::TooManyLimits { most: MAX_LIMITS, .. })));
/// ```
pub const MAX_LIMITS: usize = 8;

pub(crate) const TOUCHED: usize = 0;

#[cfg(test)]
thread_local! {
    /// Set: a sliding window of one slot keeps a ring, not a pair word, so that the ring's
    /// tests (`algorithm/sliding/tests/`) reach rings of one slot and hold pairs to them.
    pub(crate) static NO_PAIRS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One version of one of a limiter's named policies: its limits compiled for the hot path.
/// Immutable once published, except for `replaced`. Every [`KeyState`] holds an `Arc` of the
/// version it was laid out for, so a check needs nothing but its state.
#[derive(Debug)]
pub struct Policy {
    pub(crate) algorithm: Algorithm,
    pub(crate) rules: Box<[Rule]>,
    pub(crate) words: usize,
    /// A key untouched for this long (ns) holds no count in any window.
    pub(crate) expiry: u64,
    /// The smallest `max`: a cost above it never fits (one comparison on the hot path).
    pub(crate) smallest_max: u64,
    /// The index of the named policy this is a version of, in the limiter's list.
    pub(crate) tier: usize,
    /// Decisions are reported but every refusal is admitted.
    pub(crate) shadow: bool,
    /// Set once a newer version of the same named policy is published: states laid out for
    /// this one move to the newer one at their next check (under the map's write lock).
    pub(crate) replaced: AtomicBool,
    /// This version's series, labelled with the policy's name (feature `metrics`).
    pub(crate) metrics: PolicyMetrics,
    /// How states of older versions move to this one when their layout changes.
    pub(crate) carry: Carry,
    /// Unique to this version in the process (0 until `of_tier`): what the tower layer's
    /// cached headers and a snapshot's policy entries are keyed by (an address could be a
    /// later version's once this one is freed).
    pub(crate) version: u64,
}

// Here rather than beside the move that reads it (`protocol/moving.rs`): every `Policy` holds
// one, and the protocol depends on this module, not the other way round.
/// What a policy change does to the counts of a key whose state must be laid out anew
/// (a window, a precision or the number of limits changed). A change of `max` alone always
/// carries the counts over exactly, whatever this says. See [`Limiter::update_policy`](crate::Limiter::update_policy).
///
/// ```
/// use slidegate::{Carry, Limit, Limiter, PolicyConfig};
/// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
/// let _ = limiter.check_n(&1, 6);
/// let per_minute = PolicyConfig::new([Limit::per_minute(100)]);
/// limiter.update_policy("default", per_minute, Carry::Conservative)?;
/// assert_eq!(limiter.peek(&1).remaining(), 93); // the 6 used carried over
/// limiter.update_policy("default", PolicyConfig::new([Limit::per_hour(100)]), Carry::Reset)?;
/// assert_eq!(limiter.peek(&1).remaining(), 99); // a new window, started empty
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carry {
    /// Each new limit starts with the units the old limits counted over a window at least
    /// as long as its own (the fewest such, as the tightest known bound), or, when every
    /// old window is shorter, the most any old limit counted: everything the key is known
    /// to have used, recorded as used now. It can refuse more than an exact count would
    /// (the units age out over the new window from now), never admit more than what was
    /// recorded allows. Units older than every old window were never kept and cannot count.
    #[default]
    Conservative,
    /// Every window starts empty.
    Reset,
}

impl Policy {
    /// Validates `limits` together for the sliding window and lays out the per-key words.
    #[cfg(any(test, slidegate_loom))]
    pub fn new(limits: &[Limit]) -> Result<Arc<Policy>, ConfigError> {
        Policy::with_algorithm(limits, Algorithm::SlidingWindow).map(Arc::new)
    }

    /// Validates `limits` together for `algorithm` and lays out the per-key words, each
    /// sliding window's ring entries as narrow as its `max` allows.
    #[cfg(any(test, slidegate_loom))]
    pub fn with_algorithm(limits: &[Limit], algorithm: Algorithm) -> Result<Policy, ConfigError> {
        Policy::with_entries(limits, algorithm, &[NARROWEST; MAX_LIMITS])
    }

    /// As [`with_algorithm`](Self::with_algorithm), with limit `j`'s ring entries at least
    /// `widest[j]` bits wide. A limiter's policies
    /// share these floors, which only ever widen (see `policy.rs`), so that moving a key
    /// between them never narrows its entries.
    pub(crate) fn with_entries(
        limits: &[Limit],
        algorithm: Algorithm,
        widest: &[u32; MAX_LIMITS],
    ) -> Result<Policy, ConfigError> {
        if limits.is_empty() {
            return Err(ConfigError::NoLimits);
        }
        if limits.len() > MAX_LIMITS {
            return Err(ConfigError::TooManyLimits { given: limits.len(), most: MAX_LIMITS });
        }
        let mut rules = Vec::with_capacity(limits.len());
        let mut at = TOUCHED + 1;
        #[allow(
            clippy::arithmetic_side_effects,
            reason = "at most MAX_LIMITS limits of at most MAX_SLOTS slots (validated): offsets below 30,000"
        )]
        for (limit, &floor) in limits.iter().zip(widest) {
            limit.validate()?;
            algorithm.validate(limit)?;
            let window = nanos(limit.window());
            // A fixed window is one slot as long as the window.
            let (precision, slots) = match algorithm {
                Algorithm::FixedWindow => (window, 1),
                _ => (nanos(limit.get_precision()), limit.slots()),
            };
            let ring_at = at + 1 + usize::from(slots > 1);
            let (Some(by_precision), Some(by_ring)) = (Divisor::new(precision), Divisor::new(slots + 1))
            else {
                return Err(ConfigError::ZeroPrecision { limit: *limit });
            };
            let interval = window.div_ceil(limit.max().max(1));
            let entry_bits = match algorithm {
                Algorithm::SlidingWindow => ring_entry_bits(limit.max()).max(floor),
                // No ring: the field is unused, and equal for every policy.
                _ => 32,
            };
            // One slot whose counts fit 16 bits: one word, no ring. A pair's fields are 16
            // bits whatever `max`, so two pair rules of a window share their layout.
            #[cfg(test)]
            let pairs = !NO_PAIRS.with(std::cell::Cell::get);
            #[cfg(not(test))]
            let pairs = true;
            let pair = pairs && algorithm == Algorithm::SlidingWindow && slots == 1 && entry_bits <= 16;
            let entry_bits = if pair { 16 } else { entry_bits };
            // GCRA's bucket: `max` units, or the limit's burst; the rate stays `max` per
            // window (`interval`).
            let bucket = limit.get_burst().unwrap_or(limit.max());
            let mut rule = Rule {
                limit: *limit,
                max: bucket,
                precision,
                slots,
                ring: slots + 1,
                strict: limit.accuracy() == Accuracy::Strict,
                pair,
                at,
                ring_at,
                // Set below, once the limits' words are laid out.
                rolled_at: 0,
                entry_bits,
                entry_most: u64::from(u32::MAX >> (32 - entry_bits)),
                // Wide until `narrow_rings` knows the policy's expiry.
                ring_word: RingWord::Wide,
                per_word: 1,
                per_word_inverse: 1 << 32,
                by_precision,
                by_ring,
                window,
                interval,
                burst: interval.saturating_mul(bucket),
            };
            rule.set_ring_word(RingWord::Wide);
            at += algorithm.words(&rule);
            rules.push(rule);
        }
        // How long after the start of its slot an admitted unit can still count.
        let held = |r: &Rule| if algorithm == Algorithm::Gcra { r.burst } else { r.window };
        let expiry = rules.iter().map(|r| held(r).saturating_add(r.precision)).max().unwrap_or(0);
        let saved = if algorithm == Algorithm::SlidingWindow { narrow_rings(&mut rules, expiry) } else { 0 };
        for r in &rules {
            if r.by_precision.div_rem(expiry).0 >= (1 << 30) - 1 {
                return Err(ConfigError::SpanTooWide {
                    limit: r.limit,
                    longest_window: Duration::from_nanos(expiry.saturating_sub(r.precision)),
                });
            }
        }
        let mut words = at.saturating_sub(saved);
        if algorithm == Algorithm::SlidingWindow && rules.iter().any(|r| r.sum_word().is_some()) {
            // The rolled word, behind the limits' words (`Rule::rolled_at`).
            for rule in &mut rules {
                rule.rolled_at = words;
            }
            words = words.saturating_add(1);
        }
        let smallest_max = rules.iter().map(|r| r.max).min().unwrap_or(0);
        Ok(Policy {
            algorithm,
            rules: rules.into_boxed_slice(),
            words,
            expiry,
            smallest_max,
            tier: 0,
            shadow: false,
            replaced: AtomicBool::new(false),
            metrics: PolicyMetrics::none(),
            version: 0,
            carry: Carry::Conservative,
        })
    }

    /// Makes this a version of the limiter's named policy number `tier`.
    pub(crate) fn of_tier(
        mut self,
        tier: usize,
        shadow: bool,
        carry: Carry,
        metrics: PolicyMetrics,
    ) -> Policy {
        self.tier = tier;
        self.shadow = shadow;
        self.carry = carry;
        self.metrics = metrics;
        // Relaxed: only uniqueness matters, which the read-modify-write gives.
        static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        self.version = VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Unique to this version of a named policy in the process.
    #[cfg(any(feature = "tower", feature = "serde"))]
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// How states of older versions move to this one (see [`KeyState::migrate_at`]).
    pub(crate) fn carry(&self) -> Carry {
        self.carry
    }

    /// The index of the named policy this is a version of.
    #[inline]
    pub(crate) fn tier(&self) -> usize {
        self.tier
    }

    /// Whether the policy runs in shadow (refusals reported, not enforced).
    #[inline]
    pub(crate) fn shadow(&self) -> bool {
        self.shadow
    }

    #[inline]
    pub(crate) fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    /// Has a newer version of this policy been published? Acquire pairs with the Release
    /// store in [`mark_replaced`](Self::mark_replaced): whoever sees `true` then finds the
    /// newer version in the limiter's list.
    #[inline(always)]
    pub(crate) fn is_replaced(&self) -> bool {
        self.replaced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Called after the newer version is published (see [`is_replaced`](Self::is_replaced)).
    pub(crate) fn mark_replaced(&self) {
        self.replaced.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Do `self` and `newer` count the same windows the same way, so that a state of one
    /// can be copied into the other's layout slot by slot? (Sliding windows whose ring
    /// entries differ in width only, or a pair word that becomes a ring of one slot; see
    /// `algorithm::sliding::reencode`. A ring never becomes a pair: entries only widen.)
    pub(crate) fn same_windows(&self, newer: &Policy) -> bool {
        self.algorithm == Algorithm::SlidingWindow
            && newer.algorithm == Algorithm::SlidingWindow
            && self.rules.len() == newer.rules.len()
            && self.rules.iter().zip(newer.rules.iter()).all(|(a, b)| {
                a.window == b.window
                    && a.precision == b.precision
                    && a.strict == b.strict
                    && (a.pair || !b.pair)
            })
    }

    /// Can a state laid out for `self` serve `newer` as it is? (The key table then points
    /// the key's node at `newer`, and frees the node by `newer`'s word count: they must
    /// agree.) Only when nothing but the limits' `max` differs (and not under GCRA, whose state is a time computed from
    /// `max`): the words mean the same counts, which then carry over exactly.
    pub(crate) fn same_layout(&self, newer: &Policy) -> bool {
        self.algorithm == newer.algorithm
            && self.algorithm != Algorithm::Gcra
            && self.words == newer.words
            && self.rules.len() == newer.rules.len()
            && self.rules.iter().zip(newer.rules.iter()).all(|(a, b)| {
                a.window == b.window
                    && a.precision == b.precision
                    && a.strict == b.strict
                    && a.pair == b.pair
                    && a.at == b.at
                    && a.entry_bits == b.entry_bits
                    && a.ring_word == b.ring_word
            })
    }

    /// A key untouched for this long (ns) holds no count in any window.
    pub(crate) fn expiry(&self) -> u64 {
        self.expiry
    }

    /// The limits, in builder order.
    pub fn limits(&self) -> impl Iterator<Item = &Limit> {
        self.rules.iter().map(|r| &r.limit)
    }

    /// 64-bit words per key.
    pub fn words_per_key(&self) -> usize {
        self.words
    }

    /// The index of the first limit whose `max` is below `cost`: such a request never fits.
    #[inline]
    pub(crate) fn oversized(&self, cost: u64) -> Option<usize> {
        if cost <= self.smallest_max {
            return None;
        }
        self.rules.iter().position(|r| cost > r.max)
    }

    /// The decision for a key with no state (absent, or expired): everything is free.
    pub(crate) fn fresh(&self, cost: u64) -> Decision {
        let (tightest, remaining) = self
            .rules
            .iter()
            .map(|r| r.max.saturating_sub(cost))
            .enumerate()
            .min_by_key(|&(_, room)| room)
            .unwrap_or((0, 0));
        Decision::allowed(remaining, tightest)
    }

    /// The decision for a cost that exceeds limit `index`'s `max`, given the room the key has.
    pub(crate) fn never(&self, index: usize, remaining: u64) -> Decision {
        Decision::cost_too_large(index, remaining)
    }
}

/// The shortest slots a narrow ring word serves (`RingWord::Narrow`): 1 s.
const NARROW_PRECISION: u64 = 1_000_000_000;
/// The most slots a key's expiry and two rings may span in a narrow ring word: 2¹⁴, half
/// the 2¹⁵ its 16-bit tags tell apart; the other half is what a thread may be delayed by
/// (`algorithm/sliding/`, "Stale writers").
const NARROW_SPAN: u64 = 1 << 14;

/// Packs the ring words of the sliding windows in `rules` narrow (a 16-bit tag over 48 bits
/// of entries) where that holds more: entries of up to 24 bits, in slots of at least 1 s, and
/// a policy's `expiry` and two rings below [`NARROW_SPAN`] slots. The rest stay wide. Word
/// offsets move up to match; returns the words saved.
#[allow(
    clippy::arithmetic_side_effects,
    reason = "offsets below 30,000 (at most MAX_LIMITS limits of at most MAX_SLOTS slots); ring ≤ MAX_SLOTS + 1"
)]
fn narrow_rings(rules: &mut [Rule], expiry: u64) -> usize {
    let mut shift = 0;
    for rule in rules {
        if rule.pair {
            // No ring to pack.
            rule.at -= shift;
            continue;
        }
        let wide = rule.ring_words();
        let span = rule.by_precision.div_rem(expiry).0.saturating_add(2 * rule.ring);
        if rule.entry_bits <= 24 && rule.precision >= NARROW_PRECISION && span < NARROW_SPAN {
            rule.set_ring_word(RingWord::Narrow);
        }
        rule.at -= shift;
        rule.ring_at -= shift;
        shift += wide - rule.ring_words();
    }
    shift
}

/// The narrowest ring entries, in bits (counts up to 3, for a `max` of 1 or 2).
pub(crate) const NARROWEST: u32 = 2;

/// The ring entries' width in bits for a limit of `max`: the fewest that hold more than
/// `max` (a slot admits at most `max` units through checks; more only through `record` or
/// a carry, and a narrow entry then saturates at `2^bits − 1`, see `algorithm/sliding/`),
/// so 6 bits for a `max` up to 62, 8 up to 254, 16 up to 65,534; past 24 bits a whole
/// 32-bit entry (a word holds one either way), whose largest count, `2³² − 1`, is also the
/// largest `max`.
pub(crate) fn ring_entry_bits(max: u64) -> u32 {
    match u64::BITS.saturating_sub(max.saturating_add(1).leading_zeros()) {
        bits @ 0..=24 => bits.max(NARROWEST),
        _ => 32,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `touched` of a retired state: later than any time, so it never looks expired, and
/// recognisable by every check that still holds the state.
pub(crate) const RETIRED: u64 = u64::MAX;

/// The words of a fresh state of `policy` at `now` (ns): every window empty.
pub(crate) fn initial_words(policy: &Policy, now: u64) -> Vec<u64> {
    let mut init = vec![0u64; policy.words];
    fill_initial(policy, now, &mut init);
    init
}

/// Writes a fresh state of `policy` at `now` into `init` (`policy.words_per_key()` long).
pub(crate) fn fill_initial(policy: &Policy, now: u64, init: &mut [u64]) {
    init.fill(0);
    set(init, TOUCHED, now.min(RETIRED - 1));
    for rule in policy.rules.iter() {
        match policy.algorithm {
            Algorithm::SlidingWindow => Sliding::reset(init, rule, now),
            Algorithm::FixedWindow => Fixed::reset(init, rule, now),
            Algorithm::SlidingLog => Log::reset(init, rule, now),
            Algorithm::Gcra => Gcra::reset(init, rule, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(limits: &[&str]) -> Vec<Rule> {
        let limits: Vec<Limit> =
            limits.iter().map(|t| t.parse().unwrap_or_else(|e| panic!("{t}: {e}"))).collect();
        let policy =
            Policy::with_algorithm(&limits, Algorithm::SlidingWindow).unwrap_or_else(|e| panic!("{e}"));
        policy.rules.to_vec()
    }

    #[test]
    fn ring_words_are_narrow_in_slots_of_a_second_or_more_within_a_short_span() {
        use RingWord::{Narrow, Wide};
        let formats = |limits: &[&str]| rules(limits).iter().map(|r| r.ring_word).collect::<Vec<_>>();
        // Entries of up to 24 bits in 1 s slots, 1 min slots (per_hour's default): narrow.
        assert_eq!(formats(&["60/min"]), [Narrow]);
        assert_eq!(formats(&["1000/min"]), [Narrow]);
        assert_eq!(formats(&["240/h"]), [Narrow]);
        assert_eq!(formats(&["100000/min"]), [Narrow]);
        // 32-bit entries gain nothing from a narrow tag.
        assert_eq!(formats(&["20000000/min"]), [Wide]);
        // Slots under 1 s: the wide tag's 2³¹ slots (24 days at 1 ms).
        assert_eq!(formats(&["10/s@500ms"]), [Wide]);
        // A day's expiry is 86,400 one-second slots, past the narrow span: the 1 s limit's
        // words stay wide, the 1 min limit's (1,441 slots) are narrow.
        assert_eq!(formats(&["100/min", "1000/day", "10/s@100ms"]), [Wide, Narrow, Wide]);
        // The longest ring, 3,601 positions: its expiry and two rings are 10,803 slots.
        assert_eq!(formats(&["200/h@1s"]), [Narrow]);
        assert_eq!(formats(&["200/h@1s", "500/5h@5s"]), [Wide, Narrow]);
    }

    #[test]
    fn narrow_rings_move_the_later_limits_up() {
        let limits: Vec<Limit> =
            ["100/min", "1000/min", "10/s@100ms"].iter().map(|t| t.parse().unwrap()).collect();
        let policy =
            Policy::with_algorithm(&limits, Algorithm::SlidingWindow).unwrap_or_else(|e| panic!("{e}"));
        let mut at = TOUCHED + 1;
        for rule in policy.rules.iter() {
            assert_eq!((rule.at, rule.ring_at), (at, at + 1 + usize::from(rule.slots > 1)));
            at = rule.ring_at + rule.ring_words();
        }
        // touched, then 2 + 11 (six 7-bit entries to a word), 2 + 16 (four 10-bit ones)
        // and 2 + 2 words (eight 4-bit ones to a wide word), then the rolled word.
        assert_eq!(policy.words_per_key(), at + 1);
        assert_eq!(at, 1 + 13 + 18 + 4);
        assert!(policy.rules.iter().all(|rule| rule.rolled_at == at));
    }

    #[test]
    fn ring_entries_are_as_narrow_as_max_allows() {
        // The fewest bits holding more than `max`: 2 up to 2, 6 up to 62, 8 up to 254, 16
        // up to 65,534, 24 up to 2²⁴ − 2, then a whole 32-bit entry.
        for (max, bits) in [
            (1, 2),
            (2, 2),
            (3, 3),
            (62, 6),
            (63, 7),
            (254, 8),
            (255, 9),
            (1000, 10),
            (65_534, 16),
            (65_535, 17),
            ((1 << 24) - 2, 24),
            ((1 << 24) - 1, 32),
            (u64::from(u32::MAX), 32),
        ] {
            assert_eq!(ring_entry_bits(max), bits, "{max}");
            let most = u64::from(u32::MAX >> (32 - bits));
            assert!(most > max || (bits == 32 && max == most), "{max}");
        }
    }

    #[test]
    fn narrow_words_hold_more_entries() {
        // 61 entries: eight 6-bit ones to a narrow word (8 words, not 16 of 32-bit entries);
        // four 10-bit ones (16, not 31 of 16-bit entries wide).
        let small = rules(&["60/min"]).remove(0);
        assert_eq!((small.entry_bits, small.per_word, small.ring_words()), (6, 8, 8));
        let large = rules(&["1000/min"]).remove(0);
        assert_eq!((large.entry_bits, large.per_word, large.ring_words()), (10, 4, 16));
        let wide = rules(&["5000/min@500ms"]).remove(0);
        assert_eq!(
            (wide.ring_word, wide.entry_bits, wide.per_word, wide.ring_words()),
            (RingWord::Wide, 13, 2, 61)
        );
        // Every position has its own entry, and entries stay within a word's entry bits.
        for rule in [small, large, wide] {
            let bits = rule.ring_word.entry_bits();
            let mut seen = std::collections::HashSet::new();
            for position in 0..rule.ring as usize {
                let (word, shift) = rule.place(position);
                assert!(word >= rule.ring_at && word < rule.ring_at + rule.ring_words(), "{position}");
                assert!(shift + rule.entry_bits <= bits, "{position}: {shift}");
                assert!(seen.insert((word, shift)), "{position} shares an entry");
                assert_eq!(rule.left_in_word(position), ((bits - shift) / rule.entry_bits) as usize);
            }
        }
    }

    #[test]
    fn a_position_splits_exactly_at_every_width() {
        // The multiply-and-shift of `place` against a division, for every entries-per-word
        // count a width gives, over the longest ring's positions.
        for bits in NARROWEST..=32 {
            for ring_word in [RingWord::Wide, RingWord::Narrow] {
                let mut rule = rules(&["10/min"]).remove(0);
                rule.entry_bits = bits;
                rule.set_ring_word(ring_word);
                let per_word = (ring_word.entry_bits() / bits).max(1) as usize;
                assert_eq!(rule.per_word as usize, per_word);
                for position in 0..=crate::limit::MAX_SLOTS as usize + 1 {
                    let (word, within) = rule.locate(position);
                    assert_eq!(
                        (word - rule.ring_at, within as usize),
                        (position / per_word, position % per_word)
                    );
                }
            }
        }
    }
}
