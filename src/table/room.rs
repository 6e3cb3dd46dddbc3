//! Room for a new key in a full table (`max_keys`).
//!
//! A table at `max_keys` first looks for a held key that is *idle*: expired, so its
//! windows count nothing (`KeyState::retire` says so, by the same CAS a sweep uses). Such a
//! key gives up its place to the new one at once, without waiting for a sweep. Nothing is
//! forgotten, so this is always on. When no idle key is found, [`WhenFull`] decides:
//! refuse the new key, or evict the least recently used key of the sample looked at.
//!
//! The search is bounded, because under a key spray it runs for nearly every request:
//! - one search looks at [`LOOK`] keys at most (an eviction at [`SAMPLE`]); each shard
//!   keeps a *hand*, the slot where its last search stopped, so successive searches go
//!   round the whole shard;
//! - each shard has a *hint*, a time before which none of its keys can be idle,
//!   learned from the keys its hand passed over a whole lap and lowered by every insert
//!   (`u64::MAX` while it holds none). A shard whose keys are all live is skipped for one
//!   atomic load until that time, so a spray against a table of live keys costs a few
//!   loads per request, not a scan;
//! - the new key's own shard is searched first (its mutex is held already), then other
//!   shards whose hint allows an idle key, in turn from one the new key's hash picks, taken with
//!   `try_lock` (never waiting, so two inserts searching each other's shards cannot
//!   deadlock) until the search has looked at its keys.
//!
//! The hint is only a hint: a key is only ever taken out by `retire`'s CAS, which re-checks
//! its expiry, so a hint that is too late only delays a new key, and one that is too early
//! only costs a search.

use std::hash::Hash;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::grace::Guard;
use crate::sync::{AtomicU64, Ordering};

use super::writers::Change;
use super::{tombstone, untagged, Counts, Node, Shard, Table, SHARDS};

/// Keys one search for an idle key looks at, in the new key's shard and others.
const LOOK: usize = 32;
/// Keys [`WhenFull::EvictLeastRecent`] chooses the least recently used of.
const SAMPLE: usize = 8;

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

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    /// Makes room for a new key whose shard is `own` (its mutex held: `counts`), at time
    /// `now`: takes out an idle key of `own` or of other shards (looking at [`LOOK`] keys at
    /// most), or, with [`WhenFull::EvictLeastRecent`], a key of `own` (or of the first other
    /// shard that holds one): an idle one of [`SAMPLE`] if any, else the least recently
    /// used of them. `None` when nothing was taken out.
    pub(super) fn make_room(
        &self,
        own: &Shard<K>,
        counts: &mut Counts,
        now: u64,
        hash: u64,
        guard: &Guard,
    ) -> Option<Freed> {
        let evict = self.when_full == WhenFull::EvictLeastRecent;
        let fresh_budget = || if evict { SAMPLE } else { LOOK };
        let mut budget = fresh_budget();
        if let Some(freed) = self.search(own, counts, now, guard, evict, &mut budget) {
            return Some(freed);
        }
        // From a shard the new key's hash picks (bits the shard and the slot do not use),
        // so that searches spread over the shards without a shared counter.
        let first = (hash >> 32) as usize;
        for i in 0..SHARDS {
            if budget == 0 {
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
            if evict {
                // The new key's shard held no key: a sample of the first that does.
                budget = fresh_budget();
            }
            if let Some(freed) = self.search(shard, &mut other, now, guard, evict, &mut budget) {
                return Some(freed);
            }
            if evict && budget < SAMPLE {
                // It held keys and none could go (all retired meanwhile): give up.
                break;
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

    /// Under `shard`'s mutex: looks at up to `budget` nodes from the shard's hand (counting
    /// them off) and takes out the first idle one; with `evict`, if none is idle, the least
    /// recently used of them.
    fn search(
        &self,
        shard: &Shard<K>,
        counts: &mut Counts,
        now: u64,
        guard: &Guard,
        evict: bool,
        budget: &mut usize,
    ) -> Option<Freed> {
        // Relaxed: under the mutex, which orders every writer of the hint and the array.
        let hint = self.hint(shard);
        if !evict && hint.load(Ordering::Relaxed) > now {
            return None;
        }
        let slots = shard.array(Ordering::Relaxed, guard)?;
        let len = slots.slots.len();
        let mut hand = counts.hand;
        let mut steps = 0usize;
        let mut oldest: Option<(usize, u64)> = None;
        while *budget > 0 && steps < len {
            if hand >= len {
                // The last slot was passed: a lap. Every node now in the shard was passed in
                // it or inserted behind the hand during it, and `lap_min` is the earliest
                // any of them can be idle.
                hint.store(counts.lap_min, Ordering::Relaxed);
                counts.lap_min = u64::MAX;
                hand = 0;
            }
            let at = hand;
            steps = steps.saturating_add(1);
            hand = hand.saturating_add(1);
            let Some(slot) = slots.slots.get(at) else { break };
            // Relaxed: under the mutex, which orders every writer of the slots.
            let found = slot.load(Ordering::Relaxed);
            let Some(ptr) = NonNull::new(untagged(found).0).filter(|_| found != tombstone()) else {
                continue;
            };
            *budget = budget.saturating_sub(1);
            let node = Node { ptr, _guard: PhantomData };
            let (state, policy) = (node.state(), node.policy());
            let touched = state.touched();
            if state.is_retired() {
                continue;
            }
            if state.retire(policy, now) {
                counts.hand = hand;
                self.take_out(shard, counts, slot, node, now, guard);
                return Some(Freed::Idle);
            }
            counts.lap_min = counts.lap_min.min(touched.saturating_add(policy.expiry));
            if oldest.map_or(true, |(_, least)| touched < least) {
                oldest = Some((at, touched));
            }
        }
        counts.hand = hand;
        let (at, _) = oldest.filter(|_| evict)?;
        let slot = slots.slots.get(at)?;
        // Relaxed: under the mutex; the node looked at above is still there.
        let ptr = NonNull::new(untagged(slot.load(Ordering::Relaxed)).0)?;
        let node = Node { ptr, _guard: PhantomData };
        node.state().retire_now(node.policy());
        self.take_out(shard, counts, slot, node, now, guard);
        Some(Freed::Evicted)
    }

    /// Removes a node whose state was just retired, as a sweep does: the floor first.
    fn take_out(
        &self,
        shard: &Shard<K>,
        counts: &mut Counts,
        slot: &crate::sync::AtomicPtr<super::Header<K>>,
        node: Node<'_, K>,
        now: u64,
        guard: &Guard,
    ) {
        let change = Change::Remove;
        Self::raise_floor(shard, &change, now);
        let dead = self.apply(shard, slot, node, change, counts, guard);
        Self::retire_nodes(dead.into_iter().collect(), guard);
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

    /// A node replaced or repointed (its expiry may be earlier now): nothing is known
    /// until a lap that starts after this ends.
    pub(super) fn unknown(&mut self, hint: &AtomicU64) {
        self.lap_min = 0;
        // Relaxed: under the mutex.
        hint.store(0, Ordering::Relaxed);
    }

    /// The array was rebuilt: nodes moved across the hand, so a lap starts again from the
    /// first slot, every node ahead of it.
    pub(super) fn moved(&mut self) {
        self.hand = 0;
        self.lap_min = u64::MAX;
    }
}
