//! GCRA: one word per limit holding the theoretical arrival time (TAT, ns on the limiter's
//! clock) of the next unit if units arrived exactly at the sustained rate. Admitting `cost`
//! moves it to `max(TAT, now) + cost × interval`, allowed while that stays within `burst`
//! (= `max × interval`) of `now`. An admission is one CAS; a refusal writes nothing.
//!
//! # Rollback
//! A check of several limits (or keys) that commits here and then finds a later limit full
//! takes its commit back (`Counter::rollback`) by restoring the TAT it saw, and only
//! while the word still holds the TAT its commit wrote; otherwise its units stay counted
//! (conservative: until they drain, the key may be refused where an exact count would
//! admit; it is never admitted beyond its limit). Subtracting `cost × interval` instead would be wrong: a
//! commit at a clock past the TAT first moves the TAT up to that clock, so after a later
//! check's commit the TAT no longer holds ours as `cost × interval` on top of the rest
//! (`loom-tests/tests/gcra_rollback.rs`: two checks on either side of one interval).
//!
//! Why the restore is exact. Every commit maps the word's value `v` to `max(v, now) +
//! cost × interval`, strictly above `v` (cost and interval are at least 1, and a check's
//! TAT is at most `now + burst`, far below the saturation at `u64::MAX`), and a rollback
//! only ever restores the value its commit replaced. So the word always equals the TAT of
//! the commits not rolled back, applied in the word's modification order: true initially,
//! kept by a commit (it applies itself on top), and by a rollback, because the word holds
//! our commit's value only while ours is the last commit not rolled back (a later one would
//! have put the word strictly above it, and only its own rollback can take that back), and
//! then the value our commit replaced is the TAT of the commits before it, none of which can
//! have been rolled back while ours stood on top of them. A value that recurs (ABA) is
//! harmless: the argument is about the value, not about who wrote it.

use crate::algorithm::counter::{set, Counter, Rule, Words};
use crate::limit::MAX_UNITS;
use crate::sync::Ordering;

pub(crate) struct Gcra;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct View {
    /// `now`'s slot (of the limit's precision) and ns into it, for `touched`.
    slot: u64,
    elapsed: u64,
    now: u64,
    /// The TAT as loaded: the commit's expected value.
    seen: u64,
    /// How far the TAT is ahead of `now` (0 when the bucket is full).
    lag: u64,
}

impl View {
    /// The TAT after admitting `cost` more.
    #[inline]
    fn after(&self, rule: &Rule, cost: u64) -> u64 {
        self.now.saturating_add(self.lag).saturating_add(cost.saturating_mul(rule.interval))
    }
}

impl Counter for Gcra {
    type View = View;
    type Pin = ();
    /// As a window's slot counts at most this many: one `record` of more moves the TAT no
    /// further (and a TAT beyond the clock's end saturates anyway).
    const MOST: u64 = MAX_UNITS;
    #[inline(always)]
    fn pin() {}
    fn words(_: &Rule) -> usize {
        1
    }
    fn reset(words: &mut [u64], rule: &Rule, _: u64) {
        set(words, rule.at(), 0);
    }
    #[inline]
    fn view(state: &Words, rule: &Rule, now: u64, expired: bool) -> View {
        let (slot, elapsed) = rule.slot_of(now);
        // Relaxed: one word, and nothing else is published with it.
        let seen = state.word(rule.at()).load(Ordering::Relaxed);
        let lag = if expired { 0 } else { seen.saturating_sub(now) };
        View { slot, elapsed, now, seen, lag }
    }
    #[inline(always)]
    fn retired(_: &View) -> bool {
        false
    }
    #[inline]
    #[allow(clippy::arithmetic_side_effects, reason = "after() adds to now, saturating: never below it")]
    fn admits(rule: &Rule, view: &View, cost: u64) -> bool {
        view.after(rule, cost) - view.now <= rule.burst
    }
    #[inline]
    fn commit(state: &Words, rule: &Rule, view: &View, cost: u64) -> bool {
        // The word's modification order alone orders admissions: nothing but the word is read or
        // published with it. Release pairs with the AcqRel RMW of `KeyState::migrate_at` when that
        // reads this value (or a later one in its release sequence): this check's clock reading
        // then happens-before the move's, so the move is never timed before this commit (see
        // there). On x86 the CAS is the same instruction either way. Acquire pairs with that same
        // RMW when this CAS reads its value: the retirement swapped into `touched` before that RMW
        // then happens-before this check's re-read of `touched` (`moved`, after its commits), which
        // by coherence reads it (nothing after the swap changes `touched` but `fetch_max`es of
        // smaller times) and starts over. When this CAS comes first in the word's modification
        // order, the RMW reads its value (an RMW reads the latest value), so the move carries our
        // units.
        state
            .word(rule.at())
            .compare_exchange(view.seen, view.after(rule, cost), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
    fn rollback(state: &Words, rule: &Rule, view: &View, cost: u64) {
        // Back to the TAT our commit replaced, only while the word holds the TAT our commit
        // wrote (see the module docs); else our units stay counted. Relaxed: the argument
        // is about the word's values alone, and nothing else is read or published with it.
        // A move to another policy that read the word before this CAS carries our units
        // (conservative); one that reads it after sees the restored value.
        let _ = state.word(rule.at()).compare_exchange(
            view.after(rule, cost),
            view.seen,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "after() adds to now, saturating: never below it; interval ≥ 1 (a window of at least 1 ms)"
    )]
    fn room(rule: &Rule, view: &View, cost: u64) -> u64 {
        let used = view.after(rule, cost) - view.now;
        rule.burst.saturating_sub(used) / rule.interval
    }
    fn used(rule: &Rule, view: &View) -> u64 {
        view.lag.div_ceil(rule.interval)
    }
    fn admissible_at(_: &Words, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
        // The first `t` with `after − t ≤ burst`.
        Ok(view.after(rule, cost).saturating_sub(rule.burst).max(view.now))
    }
    /// Normally `now`. A TAT more than a burst ahead (units recorded or carried over beyond
    /// `max`) counts until it is within a burst of the clock: `touched` then covers that
    /// later time, so the key does not expire (`burst + precision` after `touched`) before
    /// the TAT has passed.
    #[inline(always)]
    fn at(rule: &Rule, view: &View, cost: u64) -> (u64, u64) {
        let beyond = view.after(rule, cost).saturating_sub(rule.burst);
        if beyond > view.now {
            return rule.slot_of(beyond);
        }
        (view.slot, view.elapsed)
    }
    /// The units the TAT is ahead of `now` by, rounded up, timed so that counting them
    /// again at that time puts the TAT back where it is: `TAT − units × interval`, at most
    /// `now` (as if they had arrived at the sustained rate).
    #[cfg(feature = "serde")]
    fn history(state: &Words, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool {
        let view = Gcra::view(state, rule, now, false);
        let used = Gcra::used(rule, &view);
        if used > 0 {
            let tat = now.saturating_add(view.lag);
            out.push((tat.saturating_sub(used.saturating_mul(rule.interval)), used));
        }
        true
    }
}
