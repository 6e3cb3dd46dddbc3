//! GCRA: one word per limit holding the theoretical arrival time (TAT, ns on the limiter's
//! clock) of the next unit if units arrived exactly at the sustained rate. Admitting `cost`
//! moves it to `max(TAT, now) + cost × interval`, allowed while that stays within `burst`
//! (= `max × interval`) of `now`. An admission is one CAS; a refusal writes nothing.

use crate::layout::{set, Rule};
use crate::limit::MAX_UNITS;
use crate::protocol::{Counter, KeyState};
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
    fn view(state: &KeyState, rule: &Rule, now: u64, expired: bool) -> View {
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
    fn commit(state: &KeyState, rule: &Rule, view: &View, cost: u64) -> bool {
        // The word's modification order alone orders admissions. Acquire pairs with the
        // RMWs of `KeyState::migrate` (a policy change), which must win or see this commit.
        state
            .word(rule.at())
            .compare_exchange(view.seen, view.after(rule, cost), Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }
    fn rollback(state: &KeyState, rule: &Rule, _: &View, cost: u64) {
        // Moves the TAT back by what the commit added, whatever was admitted after it: a
        // later admission's TAT is ours plus its own cost, unless its clock had already
        // passed our TAT (the check stalled for a whole interval between its commit and
        // this rollback), in which case this frees up to `cost` units early. With one clock
        // reading shared by the racing checks it is exact.
        let back = cost.saturating_mul(rule.interval);
        let cell = state.word(rule.at());
        let mut cur = cell.load(Ordering::Relaxed);
        loop {
            match cell.compare_exchange_weak(
                cur,
                cur.saturating_sub(back),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
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
    fn admissible_at(_: &KeyState, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
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
}
