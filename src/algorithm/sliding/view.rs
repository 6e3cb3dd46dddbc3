//! A sliding window's view: what one limit holds at a check's time (the current slot, the
//! closed slots wholly inside the window, the oldest, partly covered one), and the decisions
//! made from it alone: does a cost fit, what room is left, how many units it counts.

use crate::algorithm::counter::{tag_distance, tag_of, Rule};

use super::ring::{closed_count, current_saturated};

/// One limit as a check sees it: what is in the window now, and what a commit would write.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct View {
    /// The slot this view is for (may be later than the caller's clock if another thread
    /// has already moved on), and ns elapsed in it.
    pub(super) slot: u64,
    pub(super) elapsed: u64,
    /// The `cur` word as loaded: the expected value of the commit's CAS. When its tag is
    /// older than `slot`, the commit closes that slot.
    pub(super) seen: u64,
    /// Units in the current slot, in the closed slots wholly inside the window, and in the
    /// oldest, partly covered slot.
    pub(super) current: u64,
    pub(super) full: u64,
    pub(super) oldest: u64,
    /// A saturated slot is among the closed ones wholly inside the window (`full` counts
    /// its entry's width; a `sum` written from this view is marked saturated).
    pub(super) saturated: Flag,
    /// The key is expired: every count is zero.
    pub(super) expired: Flag,
}

/// A view's flag as a whole word. A view is returned through memory and copied word by
/// word; a flag stored as a byte just before stalls that copy (the load cannot be served
/// from the narrower store), which measured as a fifth of a refusal's view in older slots.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Flag(pub(super) u64);

impl Flag {
    #[inline(always)]
    pub(super) fn of(set: bool) -> Flag {
        Flag(u64::from(set))
    }

    #[inline(always)]
    pub(super) fn get(self) -> bool {
        self.0 != 0
    }
}

impl View {
    /// The slot that `cur` holds and a commit would close, with its final count.
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "behind > 0 slots before this one is the slot cur holds, at least ring"
    )]
    pub(super) fn closing(&self, rule: &Rule) -> Option<(u64, u64)> {
        let behind = tag_distance(self.slot as u32, tag_of(self.seen));
        (behind > 0 && !self.expired.get())
            .then(|| (self.slot - behind as u64, closed_count(rule, self.seen)))
    }

    /// The weight (out of `precision`) with which the oldest slot still counts.
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "elapsed is a remainder of precision, or 0")]
    pub(super) fn weight(&self, rule: &Rule) -> u64 {
        if rule.strict {
            rule.precision
        } else {
            rule.precision - self.elapsed
        }
    }

    /// Does `cost` more fit? `whole + cost + oldest × weight / precision ≤ max`, in exact
    /// integers (the product needs 96 bits at most; no division).
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "counts and cost sum below 2⁴⁵ (module docs), used ≤ max below, u64 × u64 fits u128"
    )]
    pub(super) fn admits(&self, rule: &Rule, cost: u64) -> bool {
        let used = self.current + self.full + cost;
        if used > rule.max {
            return false;
        }
        self.oldest == 0
            || u128::from(self.oldest) * u128::from(self.weight(rule))
                <= u128::from(rule.max - used) * u128::from(rule.precision)
    }

    /// Whole units still free after `cost` more: `max − whole − cost − ⌈oldest × weight /
    /// precision⌉`, at least 0.
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "counts and cost sum below 2⁴⁵ (module docs)")]
    pub(super) fn room(&self, rule: &Rule, cost: u64) -> u64 {
        let free = rule.max.saturating_sub(self.current + self.full + cost);
        if self.oldest == 0 {
            return free;
        }
        free.saturating_sub(self.oldest_share(rule))
    }

    /// Units in the window, not capped at `max` (a state can hold more: `record`, or units
    /// carried over from a policy with a larger `max`). With a saturated slot in the window
    /// (a closed one wholly inside, the oldest, or the open one at 2³²−1) the count is
    /// unknown: everything there is, `u64::MAX` (a carry clamps it to what a slot holds,
    /// which saturates the slot it is carried into).
    pub(super) fn used(&self, rule: &Rule) -> u64 {
        // `as_oldest` weighs a saturated oldest slot, and only a saturated one, above any
        // entry's width.
        if self.saturated.get() || self.oldest > rule.entry_most || current_saturated(rule, self.current) {
            return u64::MAX;
        }
        let whole = self.current.saturating_add(self.full);
        if self.oldest == 0 {
            return whole;
        }
        whole.saturating_add(self.oldest_share(rule))
    }

    /// `⌈oldest × weight / precision⌉`: what the oldest, partly covered slot still weighs.
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "u64 × u64 fits u128, and a quotient by precision (≥ 1 ms) is far below u64::MAX"
    )]
    pub(super) fn oldest_share(&self, rule: &Rule) -> u64 {
        let faded = u128::from(self.oldest) * u128::from(self.weight(rule));
        // A fast division when the product fits 64 bits (it nearly always does).
        match u64::try_from(faded) {
            Ok(faded) => match rule.by_precision.div_rem(faded) {
                (q, 0) => q,
                (q, _) => q + 1,
            },
            Err(_) => u64::try_from(faded.div_ceil(u128::from(rule.precision))).unwrap_or(u64::MAX),
        }
    }
}

/// `(full, saturated)` with the flag as a [`Flag`].
#[inline(always)]
pub(super) fn flagged((full, saturated): (u64, bool)) -> (u64, Flag) {
    (full, Flag::of(saturated))
}
