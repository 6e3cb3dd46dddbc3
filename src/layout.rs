//! The per-key layout: how a policy's limits are compiled ([`Rule`], [`Policy`]) and laid
//! out as one key's `AtomicU64` words, and how a word packs a slot's tag with its count.
//!
//! A key's words are `[touched]` followed by each limit's words in order (see each
//! algorithm's `Counter::words`; the sliding window's are in `algorithm/sliding.rs`).
//! `touched` is the time (ns) of the last admission that moved a slot: it bounds how old
//! every count is, which is what eviction and expiry need. A retired state's `touched` is
//! [`RETIRED`].
//!
//! Slot indices are `now / precision + ring` (see [`Rule::slot_of`]): with a precision of at
//! least 1 ms they stay below 2⁴⁵, and a view only adopts slots that some thread computed
//! that way, so adding a window's slots to one cannot overflow; and every slot is at least
//! `ring = n + 1`, so subtracting a window's slots from one cannot go below zero. Counts
//! are at most 32-bit fields (a sliding window's ring entries may be narrower, see
//! `algorithm/sliding.rs`) and costs at most `max` (≤ 2³²−1), or clamped to that on the way in
//! (`Counter::MOST`), so sums of a window's counts and a cost stay below 2⁴⁵ too.
//!
//! Slot tags are 32 bits of the slot index. They are compared only within a key that is
//! not expired, where `touched` bounds the gap to below 2³¹ slots (checked at build time),
//! so they never alias. An expired key is replaced under the key table's shard mutex, never
//! in place by concurrent checks.

use std::sync::atomic::AtomicBool;
#[cfg(any(test, slidegate_loom))]
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::decision::Decision;
use crate::divisor::Divisor;
use crate::error::ConfigError;
use crate::limit::{Accuracy, Limit};
use crate::metrics::PolicyMetrics;
use crate::protocol::{Carry, Counter};

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
    /// Index of this limit's first word (`cur` for the sliding and fixed windows). With more than one slot a `sum` word follows it,
    /// then the ring.
    pub(crate) at: usize,
    /// Index of the first ring word.
    pub(crate) ring_at: usize,
    /// log₂ of the ring entries packed in one word's low 32 bits: 2 (four 8-bit counts)
    /// for a `max` up to 254, 1 (two 16-bit counts) up to 65,534, else 0 (one 32-bit count).
    /// See [`ring_entries_log`] and `algorithm/sliding.rs`.
    pub(crate) entries_log: u32,
    /// The largest count a ring entry holds: `2^(32 >> entries_log) − 1`, more than `max`.
    pub(crate) entry_most: u64,
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
        reason = "ring_at plus a position below ring over the entries per word is one of the limit's words; the shift is below 32"
    )]
    pub(crate) fn place(&self, position: usize) -> (usize, u32) {
        let within = position & ((1 << self.entries_log) - 1);
        (self.ring_at + (position >> self.entries_log), (within as u32) << (5 - self.entries_log))
    }

    /// Ring words: `ring` entries, `2^entries_log` to a word.
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "ring is at most MAX_SLOTS + 1")]
    pub(crate) fn ring_words(&self) -> usize {
        (self.ring as usize).div_ceil(1 << self.entries_log)
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
    /// cached headers are keyed by.
    pub(crate) version: u64,
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
    /// as wide as `widest[j]` says (an `entries_log`: smaller is wider). A limiter's policies
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
            let entries_log = match algorithm {
                Algorithm::SlidingWindow => ring_entries_log(limit.max()).min(floor),
                // No ring: the field is unused, and equal for every policy.
                _ => 0,
            };
            let rule = Rule {
                limit: *limit,
                max: limit.max(),
                precision,
                slots,
                ring: slots + 1,
                strict: limit.accuracy() == Accuracy::Strict,
                at,
                ring_at,
                entries_log,
                entry_most: u64::from(u32::MAX >> (32 - (32 >> entries_log))),
                by_precision,
                by_ring,
                window,
                interval,
                burst: interval.saturating_mul(limit.max()),
            };
            at += algorithm.words(&rule);
            rules.push(rule);
        }
        // How long after the start of its slot an admitted unit can still count.
        let held = |r: &Rule| if algorithm == Algorithm::Gcra { r.burst } else { r.window };
        let expiry = rules.iter().map(|r| held(r).saturating_add(r.precision)).max().unwrap_or(0);
        for r in &rules {
            if r.by_precision.div_rem(expiry).0 >= (1 << 30) - 1 {
                return Err(ConfigError::SpanTooWide {
                    limit: r.limit,
                    longest_window: Duration::from_nanos(expiry.saturating_sub(r.precision)),
                });
            }
        }
        let smallest_max = rules.iter().map(|r| r.max).min().unwrap_or(0);
        Ok(Policy {
            algorithm,
            rules: rules.into_boxed_slice(),
            words: at,
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
    #[cfg(feature = "tower")]
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
    /// entries differ in width only; see `algorithm::sliding::reencode`.)
    pub(crate) fn same_windows(&self, newer: &Policy) -> bool {
        self.algorithm == Algorithm::SlidingWindow
            && newer.algorithm == Algorithm::SlidingWindow
            && self.rules.len() == newer.rules.len()
            && self
                .rules
                .iter()
                .zip(newer.rules.iter())
                .all(|(a, b)| a.window == b.window && a.precision == b.precision && a.strict == b.strict)
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
                    && a.at == b.at
                    && a.entries_log == b.entries_log
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

/// The `entries_log` of the narrowest ring entries (four 8-bit counts to a word).
pub(crate) const NARROWEST: u32 = 2;

/// log₂ of the ring entries per word for a limit of `max`: the narrowest count that holds
/// more than `max` (a slot admits at most `max` units through checks; more only through
/// `record` or a carry, and a narrow entry then saturates, see `algorithm/sliding.rs`).
pub(crate) fn ring_entries_log(max: u64) -> u32 {
    match max {
        0..=0xFE => 2,
        0xFF..=0xFFFE => 1,
        _ => 0,
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
