//! Room for a new key in a full table (`max_keys`).
//!
//! A table at `max_keys` first looks for a held key that is *idle*: expired, so its
//! windows count nothing (`KeyState::retire` says so, by the same CAS a sweep uses). Such a
//! key gives up its place to the new one at once, without waiting for a sweep. Nothing is
//! forgotten, so this is always on. When no idle key is found, [`WhenFull`] decides:
//! refuse the new key, or evict the least recently used key of the sample looked at.
//!
//! The search is bounded, because under a key spray it runs for nearly every request:
//! - one search looks at [`LOOK`] keys in the new key's shard and [`LOOK_OTHERS`] in at
//!   most [`OTHER_SHARDS`] others that hold keys (an eviction at [`SAMPLE`]), stepping over
//!   [`SLOTS`] slots at most in each; in each shard a quarter of them from its *hand*,
//!   the slot where its last search there stopped (so successive searches go round the
//!   whole shard), the rest sampled at random places (the new key's hash seeds them);
//! - each shard has a *hint*, a time before which none of its keys can be idle,
//!   learned from the keys its hand passed over a whole lap and lowered by every insert
//!   (`u64::MAX` once it is seen to hold none). A shard whose keys are all live is skipped for one
//!   atomic load until that time, so a spray against a table of live keys costs a few
//!   loads per request, not a scan;
//! - the new key's own shard is searched first (its mutex is held already), then other
//!   shards whose hint allows an idle key, in turn from one the new key's hash picks,
//!   taken with `try_lock` (never waiting, so two inserts searching each other's shards
//!   cannot deadlock), until [`OTHER_SHARDS`] holding keys were searched or the search has
//!   looked at its keys.
//!
//! The hint is only a hint: a key is only ever taken out by `retire`'s CAS, which re-checks
//! its expiry, so a hint that is too late only delays a new key, and one that is too early
//! only costs a search.

use std::hash::Hash;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::grace::Guard;
use crate::sync::{AtomicU64, Ordering};

use super::memory::SendPtr;
use super::writers::Change;
use super::{tombstone, untagged, Counts, Node, Shard, Table, SHARDS};

/// Keys one search for an idle key looks at in the new key's shard, and in each other shard
/// it looks into.
const LOOK: usize = 16;
/// Keys one search for an idle key looks at in other shards, in all.
const LOOK_OTHERS: usize = 32;
/// Keys [`WhenFull::EvictLeastRecent`] chooses the least recently used of.
const SAMPLE: usize = 8;
/// Slots a search steps over in one shard (empty ones and tombstones included).
const SLOTS: usize = 16 * LOOK;
/// Shards holding keys, other than the new key's own, that one search looks into.
const OTHER_SHARDS: usize = 4;

/// What a limiter at [`max_keys`](crate::LimiterBuilder::max_keys) does with a new key
/// when no held key is idle (set with
/// [`LimiterBuilder::when_full`](crate::LimiterBuilder::when_full)).
///
/// Whatever this says, a held key that is idle (its windows count nothing, so forgetting
/// it loses nothing) gives its place to the new key first, found at the new key's check,
/// without waiting for a sweep and on any clock.
///
/// ```
/// use slidegate::{Limit, Limiter, ManualClock, WhenFull};
/// let clock = ManualClock::new();
/// let limiter = Limiter::<u64>::builder()
///     .limit(Limit::per_minute(10))
///     .max_keys(1)
///     .when_full(WhenFull::EvictLeastRecent)
///     .clock(clock.clone())
///     .build()?;
/// assert!(limiter.check(&1).is_allowed());
/// // Key 1 is live (its minute is not over), so key 2 evicts it.
/// assert!(limiter.check(&2).is_allowed());
/// assert_eq!(limiter.len(), 1);
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WhenFull {
    /// Refuse the new key ([`Denial::TooManyKeys`](crate::Denial::TooManyKeys); 503 from
    /// the tower layer) until a held key is idle. The default: no count is ever
    /// forgotten, so a spray of new keys cannot reset a limited client's windows; the
    /// price is that while every held key is live, new clients wait.
    #[default]
    Refuse,
    /// Evict the least recently used of a sample of 8 held keys (from the new key's shard
    /// where it holds any; nginx's `limit_req` evicts its least recently used state when
    /// its zone is full) and admit the new key. New clients always get in; the evicted key's
    /// windows restart empty, so a client whose key is evicted gets a fresh budget, and
    /// a spray of new keys can evict a client that is being limited.
    EvictLeastRecent,
}

/// How a search made room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freed {
    /// An idle key was taken out.
    Idle,
    /// A live key was evicted ([`WhenFull::EvictLeastRecent`]).
    Evicted,
}

/// What one search for room may still look at: keys (nodes read) and slots (stepped over,
/// empty ones and tombstones included).
struct Budget {
    keys: usize,
    slots: usize,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    /// Makes room for a new key whose shard is `own` (its mutex held: `counts`), at time
    /// `now`: takes out an idle key of `own` or of other shards ([`LOOK`] keys in `own`,
    /// [`LOOK_OTHERS`] in others), or, with [`WhenFull::EvictLeastRecent`], a key of `own` (or of the
    /// first other shard that holds one): an idle one of [`SAMPLE`] if any, else the least
    /// recently used of them (when `evict`: the table is so built and the insert may). The
    /// place is the new key's: the table's count of keys is not lowered, so no other insert
    /// can take it first. `None` when nothing was taken out.
    pub(super) fn make_room(
        &self,
        own: &Shard<K>,
        counts: &mut Counts,
        now: u64,
        hash: u64,
        guard: &Guard,
        evict: bool,
    ) -> Option<Freed> {
        let per_shard = if evict { SAMPLE } else { LOOK };
        // Each shard searched gets slots of its own, so that a sparse array (few keys in
        // many slots, as resets and taken-out keys leave until a sweep shrinks it) cannot
        // use up the search before other shards are tried.
        let mut budget = Budget { keys: per_shard, slots: SLOTS };
        // Bits of the new key's hash that neither the shard nor the slot use: where the
        // samples fall, and which shard the search goes on to, without a shared counter.
        let seed = hash >> 16;
        if let Some(freed) = self.search(own, counts, (now, seed), guard, evict, &mut budget, per_shard) {
            return Some(freed);
        }
        let first = (hash >> 32) as usize;
        let mut tried = 0usize;
        budget.keys = if evict { SAMPLE } else { LOOK_OTHERS };
        for i in 0..SHARDS {
            if budget.keys == 0 || tried == OTHER_SHARDS {
                break;
            }
            let at = first.wrapping_add(i) % SHARDS;
            // Relaxed: a hint (module docs); `u64::MAX` says the shard holds no key.
            let hint = self.hints.get(at).map_or(u64::MAX, |hint| hint.load(Ordering::Relaxed));
            if at == own.index || hint == u64::MAX || (!evict && hint > now) {
                continue;
            }
            let Some(shard) = self.shards.get(at) else { continue };
            let Ok(mut other) = shard.writer.try_lock() else { continue };
            if other.live == 0 {
                // Emptied by resets or searches since its hint was set: none idle until an
                // insert (Relaxed: under its mutex).
                self.hint(shard).store(u64::MAX, Ordering::Relaxed);
                continue;
            }
            tried = tried.saturating_add(1);
            budget.slots = SLOTS;
            if evict {
                // The new key's shard held no key: a sample of the first that does.
                budget.keys = SAMPLE;
            }
            if let Some(freed) =
                self.search(shard, &mut other, (now, seed), guard, evict, &mut budget, per_shard)
            {
                return Some(freed);
            }
        }
        None
    }

    /// The room hint of `shard` (module docs).
    #[allow(clippy::indexing_slicing, reason = "a shard's index is below SHARDS, the hints' length")]
    pub(super) fn hint(&self, shard: &Shard<K>) -> &AtomicU64 {
        &self.hints[shard.index]
    }

    /// Whether a new key's insert at `now` could make room in a full table, as far as the
    /// hints tell without a lock (for a peek, which writes nothing).
    pub(crate) fn may_make_room(&self, now: u64) -> bool {
        // Relaxed: hints.
        self.when_full == WhenFull::EvictLeastRecent
            || self.hints.iter().any(|hint| hint.load(Ordering::Relaxed) <= now)
    }

    /// Under `shard`'s mutex, at time `now`: looks at up to `quota` of the budget's keys, a
    /// quarter from the shard's hand (which keeps the shard's hint: module docs) and the
    /// rest one by one at random places (the first key at or after a random slot), and
    /// takes out the first idle one of those samples, else the first the hand passed; with
    /// `evict`, if none is idle, the least recently used of them. The random samples do the
    /// taking, so idle keys are taken evenly over the shard, and `s` samples in a shard
    /// where a fraction `f` of the keys is idle find none with odds about `(1 − f)^s`.
    /// Windows of neighbouring keys would not: a harvested stretch is refilled by new keys,
    /// all live, so liveness clusters; nor would a hand that took what it passed, leaving a
    /// run of live keys behind it. The hand is there for the lap's bound, and takes only
    /// what no sample finds (a key the lap passes is found even when few are idle).
    #[allow(clippy::too_many_arguments, reason = "one search's inputs; a struct would only rename them")]
    fn search(
        &self,
        shard: &Shard<K>,
        counts: &mut Counts,
        (now, seed): (u64, u64),
        guard: &Guard,
        evict: bool,
        budget: &mut Budget,
        quota: usize,
    ) -> Option<Freed> {
        // Relaxed: under the mutex, which orders every writer of the hint and the array.
        let hint = self.hint(shard);
        if !evict && hint.load(Ordering::Relaxed) > now {
            return None;
        }
        let Some(slots) = shard.array(Ordering::Relaxed, guard) else {
            // No array: no key (a sweep emptied the shard, or none came yet).
            hint.store(u64::MAX, Ordering::Relaxed);
            return None;
        };
        let len = slots.slots.len();
        let mut oldest: Option<(usize, u64)> = None;
        // The first idle key the hand passes: taken if no sample finds one, and counted in
        // the lap's bound only if it stays.
        let mut hand_idle: Option<(usize, u64)> = None;
        // No more looks than the shard has keys: a sample would find one it has seen.
        let mut quota = quota.min(budget.keys).min(counts.live);
        // The hand's half: it moves on, and keeps the lap's bound.
        let mut hand = counts.hand;
        let mut walked = 0usize;
        // A shard of no more keys than the quota: the hand looks at them all.
        let mut hand_quota = if quota >= counts.live { quota } else { quota.div_ceil(4) };
        while hand_quota > 0 && walked < len && budget.slots > 0 {
            if hand >= len {
                // The last slot was passed: a lap. Every node now in the shard was passed in
                // it or inserted behind the hand during it, and `lap_min` is the earliest
                // any of them can be idle (the idle key held back, too: it may stay).
                if let Some((_, idle_at)) = hand_idle {
                    counts.lap_min = counts.lap_min.min(idle_at);
                }
                hint.store(counts.lap_min, Ordering::Relaxed);
                counts.lap_min = u64::MAX;
                hand = 0;
            }
            let at = hand;
            hand = hand.saturating_add(1);
            walked = walked.saturating_add(1);
            budget.slots = budget.slots.saturating_sub(1);
            let Some(node) = Self::node_at(slots, at) else { continue };
            (hand_quota, quota) = (hand_quota.saturating_sub(1), quota.saturating_sub(1));
            budget.keys = budget.keys.saturating_sub(1);
            let (state, policy) = (node.state(), node.policy());
            let touched = state.touched();
            if state.is_retired() {
                continue;
            }
            let idle_at = touched.saturating_add(policy.expiry);
            if idle_at <= now && hand_idle.is_none() {
                // Taken only if no sample finds one: a hand that took every idle key it
                // passed would leave a run of live keys behind it, where samples then
                // land in vain.
                hand_idle = Some((at, idle_at));
            } else {
                counts.lap_min = counts.lap_min.min(idle_at);
            }
            if oldest.map_or(true, |(_, least)| touched < least) {
                oldest = Some((at, touched));
            }
        }
        counts.hand = hand;
        // The samples: each the first key at or after a random slot (xorshift64, seeded by
        // the new key's hash; odd, so never 0). No bound is kept from them: they are no lap.
        let mut random = seed | 1;
        while quota > 0 && budget.slots > 0 {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            let start = (random as usize).checked_rem(len).unwrap_or(0);
            let mut found = None;
            for step in 0..len {
                if budget.slots == 0 {
                    break;
                }
                budget.slots = budget.slots.saturating_sub(1);
                let at = start.wrapping_add(step).checked_rem(len).unwrap_or(0);
                if let Some(node) = Self::node_at(slots, at) {
                    found = Some((at, node));
                    break;
                }
            }
            let Some((at, node)) = found else { break };
            quota = quota.saturating_sub(1);
            budget.keys = budget.keys.saturating_sub(1);
            let (state, policy) = (node.state(), node.policy());
            let touched = state.touched();
            if state.is_retired() {
                continue;
            }
            if state.retire(policy, now) {
                if let Some((_, idle_at)) = hand_idle {
                    counts.lap_min = counts.lap_min.min(idle_at);
                }
                self.take_out(shard, counts, at, node, now, guard);
                return Some(Freed::Idle);
            }
            if oldest.map_or(true, |(_, least)| touched < least) {
                oldest = Some((at, touched));
            }
        }
        if let Some((at, idle_at)) = hand_idle {
            match Self::node_at(slots, at) {
                Some(node) if node.state().retire(node.policy(), now) => {
                    self.take_out(shard, counts, at, node, now, guard);
                    return Some(Freed::Idle);
                }
                _ => counts.lap_min = counts.lap_min.min(idle_at),
            }
        }
        let (at, _) = oldest.filter(|_| evict)?;
        // Under the mutex: the node looked at above is still there.
        let node = Self::node_at(slots, at)?;
        node.state().retire_now(node.policy());
        self.take_out(shard, counts, at, node, now, guard);
        Some(Freed::Evicted)
    }

    /// The node in slot `at`, if one is there (read under the shard's mutex).
    fn node_at<'g>(slots: &'g super::Slots<K>, at: usize) -> Option<Node<'g, K>> {
        // Relaxed: under the mutex, which orders every writer of the slots.
        let found = slots.slots.get(at)?.load(Ordering::Relaxed);
        let ptr = NonNull::new(untagged(found).0).filter(|_| found != tombstone())?;
        Some(Node { ptr, _guard: PhantomData })
    }

    /// Takes out the node in slot `at`, whose state was just retired, as a sweep does (the
    /// floor first, then the tombstone) but leaving the table's count of keys as it is: the
    /// place goes to the insert that made room.
    fn take_out(
        &self,
        shard: &Shard<K>,
        counts: &mut Counts,
        at: usize,
        node: Node<'_, K>,
        now: u64,
        guard: &Guard,
    ) {
        Self::raise_floor(shard, &Change::Remove, now);
        if let Some(slots) = shard.array(Ordering::Relaxed, guard) {
            if let Some(slot) = slots.slots.get(at) {
                // Relaxed: readers that load the tombstone simply probe on.
                slot.store(tombstone(), Ordering::Relaxed);
                counts.live = counts.live.saturating_sub(1);
            }
        }
        Self::retire_nodes(vec![SendPtr(node.ptr.as_ptr())], guard);
    }
}

/// Keeps a shard's room hint after a change under its mutex (module docs).
impl Counts {
    /// A node inserted in slot `at`, at `now`, under a policy whose keys expire after
    /// `expiry`.
    pub(super) fn inserted(&mut self, hint: &AtomicU64, at: usize, now: u64, expiry: u64) {
        let idle = now.saturating_add(expiry);
        if at < self.hand {
            // Behind the hand: this lap will not pass it.
            self.lap_min = self.lap_min.min(idle);
        }
        // Relaxed: under the mutex, which orders every writer; stored only when lower, so
        // that inserts write no line that searches read unless the hint changes.
        if idle < hint.load(Ordering::Relaxed) {
            hint.store(idle, Ordering::Relaxed);
        }
    }

    /// A node replaced or repointed in place, now idle from `idle` on (its expiry may be
    /// earlier than before). Its slot may be behind the hand or ahead of it: counted in the
    /// lap's bound either way.
    pub(super) fn changed(&mut self, hint: &AtomicU64, idle: u64) {
        self.lap_min = self.lap_min.min(idle);
        // Relaxed: under the mutex, which orders every writer.
        if idle < hint.load(Ordering::Relaxed) {
            hint.store(idle, Ordering::Relaxed);
        }
    }

    /// The array was rebuilt: nodes moved across the hand, so a lap starts again from the
    /// first slot, every node ahead of it.
    pub(super) fn moved(&mut self) {
        self.hand = 0;
        self.lap_min = u64::MAX;
    }
}
