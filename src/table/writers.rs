//! The table's writers, under the shard's mutex: inserting a key, changing a node
//! (replacing, repointing or removing it) with the shard's floor raised first, and sweeping a
//! shard; nodes taken out are freed after a grace period (`grace.rs`).

use std::borrow::Borrow;
use std::hash::Hash;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, TryLockError};

use crate::grace::{self, Guard};
use crate::layout::{fill_initial, Policy, TOUCHED};
use crate::protocol::OwnedState;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

#[cfg(not(slidegate_loom))]
use super::memory::prefetch_node;
use super::memory::{free_node, new_node, SendPtr};
use super::room::{Freed, WhenFull};
use super::{tag, tagged, tombstone, untagged, Counts, Header, Node, Refused, Shard, Table, SMALLEST};

/// What a [`Table::insert`] does beyond inserting the key.
pub(crate) struct Hooks<F, I> {
    /// Told how a held key made room, if one did (the caller's metrics), once the shard's
    /// mutex is given back.
    pub(crate) on_freed: F,
    /// Lays the new state out instead of a fresh one (a loaded key's counts,
    /// `Limiter::load`): given the policy, the time and the node's words, it writes them and
    /// returns `true`. Called once the key is going in.
    pub(crate) init: I,
    /// A check's insert (`true`) or a load's (`false`). A check's may evict a live key under
    /// [`WhenFull::EvictLeastRecent`], and at a full table a busy shard mutex refuses it at
    /// once (a key spray must not queue up behind it). A load's never evicts a live key (a
    /// load never lowers a count) and waits for the mutex (a load is no spray: refusing it
    /// would drop its units while an idle key may be about to make room).
    pub(crate) check: bool,
}

/// Runs a function when dropped: declared before a guard, after that guard is dropped
/// (locals drop in reverse order, on an unwind too).
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Room reserved in a table's count of keys, given back if dropped (by a panic in the
/// caller's code between the reservation and the insert).
struct Reservation<'a>(&'a AtomicUsize);

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        // Relaxed: a counter.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    /// Inserts a node for `key` with a fresh state at `now`, or at the shard's floor if that
    /// is later, under the policy `policy_of` chooses (called under the shard's mutex, with
    /// the owned key), unless the key is held already; either way, the key's node. When the
    /// table holds `max_keys` keys, a held key makes room if one can (`room.rs`; `on_freed`
    /// is told how), else the new key is refused; [`Hooks`] say what else the caller wants.
    pub(crate) fn insert<'g, Q>(
        &'g self,
        hash: u64,
        key: &Q,
        now: u64,
        guard: &'g Guard,
        policy_of: impl FnOnce(&K) -> Arc<Policy>,
        hooks: Hooks<impl FnOnce(Freed), impl FnOnce(&Arc<Policy>, u64, &mut [u64]) -> bool>,
    ) -> Result<Node<'g, K>, Refused>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(hash);
        // The caller's code (metrics) on a key taken out to make room runs once the shard's
        // mutex is given back, which the guards declared after this one are.
        let mut told = OnDrop(None);
        // Acquire: pairs with the Release reservation below, of the insert that filled the
        // table (see `TryLockError::WouldBlock`).
        let full = self.live.load(Ordering::Acquire) >= self.max_keys;
        let Hooks { on_freed, init, check } = hooks;
        let evict = check && self.when_full == WhenFull::EvictLeastRecent;
        let mut counts = if full && check && !evict {
            // A full table does not queue a new key behind a busy shard's mutex unless the
            // key may get in there: under a key spray that is nearly every request, and the
            // legitimate keys' inserts into the same shard must not queue behind it. A free
            // mutex is still taken, so a key that another thread inserted meanwhile is found
            // rather than refused, and room is looked for. (Under `EvictLeastRecent` every
            // new key gets in, so it waits for the mutex as an insert into a table with room
            // does.)
            match shard.writer.try_lock() {
                Ok(counts) => counts,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    // The holder may be inserting this very key, its reservation being what
                    // filled the table: then wait for it and find the key. If the full
                    // count read above came from that reservation or a later change of the
                    // count (all RMWs, so in its release sequence), the Acquire load above
                    // synchronized with it, so the hint stored before it, or a later one,
                    // is read here; a hint stored later, or the one clearing it, is a
                    // Release store after the holder's slot store, and this Acquire load
                    // makes that slot visible to `get`. If the full count came from before
                    // that reservation, the table was full without this key.
                    // Then, if this shard may hold an idle key (its hint: `room.rs`), the
                    // key waits for the mutex and makes room, as it would have found it
                    // free; if not, it is refused at once. (Only this shard's hint: some
                    // hint among all the shards' is nearly always due, stale until its
                    // shard's next lap, and would queue a spray against live keys.)
                    let hint = self.hint(shard).load(Ordering::Relaxed);
                    if shard.inserting.load(Ordering::Acquire) == hash || hint <= now {
                        shard.lock()
                    } else {
                        return self.get(hash, key, guard).ok_or(Refused::Full);
                    }
                }
            }
        } else {
            shard.lock()
        };
        // Relaxed: under the mutex, which orders every writer of the array pointer.
        if let Some(current) = shard.array(Ordering::Relaxed, guard) {
            if let Some((_, node)) = Self::find(current, hash, key, Ordering::Relaxed) {
                return Ok(node);
            }
        }
        // Release: pairs with the Acquire load of a check that finds the mutex busy (above).
        shard.inserting.store(hash, Ordering::Release);
        // Counted before it is inserted, and only if there is room: `len()` never exceeds
        // `max_keys`, and no insert is refused for another's passing count. Release: pairs
        // with the Acquire load of the count above, publishing the hint just stored.
        let reserve = || {
            self.live.fetch_update(Ordering::Release, Ordering::Relaxed, |live| {
                (live < self.max_keys).then(|| live.saturating_add(1))
            })
        };
        let mut reserved = reserve();
        let mut freed = None;
        if reserved.is_err() {
            // Full: an idle key gives its place, or `WhenFull` says (`room.rs`). The place
            // is this insert's (the count was left as it was), so nothing else can take it.
            // The RMW still publishes the hint above, as a reservation does (Release: the
            // same pairing), to a check that reads the count it leaves.
            let at = now.max(shard.floor.load(Ordering::Relaxed));
            freed = self.make_room(shard, &mut counts, at, hash, guard, evict);
            if freed.is_some() {
                // A check of this key that finds the mutex busy and reads the count this
                // RMW leaves (or a later one) sees the hint above, as a reservation's would
                // show it. One that read the count before may still be refused, if no
                // idle key was due in this shard at its own, earlier time: an answer for
                // that time, when this insert had not made room yet.
                reserved = Ok(self.live.fetch_add(0, Ordering::Release));
            }
        }
        if reserved.is_err() {
            // Release: as the clearing store below (nothing was published).
            shard.inserting.store(0, Ordering::Release);
            return Err(Refused::Full);
        }
        told.0 = freed.map(|freed| move || on_freed(freed));
        // Relaxed: under the mutex, which orders every writer of the floor.
        let now = now.max(shard.floor.load(Ordering::Relaxed));
        // The caller's code runs next (`to_owned`, `Hash` and `Eq` in `policy_of`): if it
        // panics, the room reserved is given back.
        let reservation = Reservation(&self.live);
        let owned = key.to_owned();
        let policy = policy_of(&owned);
        let expiry = policy.expiry;
        // Grown (or rebuilt) only now, for a key that is really going in.
        let slots = self.slots_for_insert(shard, &mut counts, guard);
        // Small layouts (one limit of up to ~30 slots) start on the stack: no allocation
        // beyond the node.
        // A loaded key's state (`Limiter::load`) is laid out by `init` instead.
        let mut small = [0u64; 32];
        // And the time the state was last used at: `now` for a fresh one, a loaded one's
        // last unit (the room hint below counts its idleness from there).
        let (node, used) = match small.get_mut(..policy.words_per_key()) {
            Some(words) => {
                if !init(&policy, now, words) {
                    fill_initial(&policy, now, words);
                }
                let used = words.get(TOUCHED).copied().unwrap_or(now).min(now);
                (new_node(owned, policy, words), used)
            }
            None => {
                let mut words = vec![0u64; policy.words_per_key()];
                if !init(&policy, now, &mut words) {
                    fill_initial(&policy, now, &mut words);
                }
                let used = words.get(TOUCHED).copied().unwrap_or(now).min(now);
                (new_node(owned, policy, &words), used)
            }
        };
        let mut free = None;
        for (i, slot) in slots.probe(hash).enumerate() {
            // Relaxed: under the mutex, which orders every writer.
            let here = slot.load(Ordering::Relaxed);
            if here.is_null() || here == tombstone() {
                free = Some((slot, here.is_null(), slots.index(hash, i)));
                break;
            }
        }
        // `slots_for_insert` leaves at least one empty slot.
        let Some((slot, was_empty, at)) = free else { std::process::abort() };
        // Release pairs with the readers' Acquire load in `find`: the node's header and
        // counters, written above, are visible to whoever finds the node.
        slot.store(tagged(node, tag(hash)), Ordering::Release);
        // The key is in: its count stays (a rebuild above hashes keys, the caller's code,
        // and gives the room back if that panics).
        std::mem::forget(reservation);
        // Release: a check that reads this (the mutex busy, the table full) then finds the
        // node stored just above.
        shard.inserting.store(0, Ordering::Release);
        counts.live = counts.live.saturating_add(1);
        counts.inserted(self.hint(shard), at, used, expiry);
        if was_empty {
            counts.used = counts.used.saturating_add(1);
        }
        drop(counts);
        drop(told);
        // SAFETY: just stored; `new_node` never returns null.
        let ptr = NonNull::new(node).unwrap_or_else(|| std::process::abort());
        Ok(Node { ptr, _guard: PhantomData })
    }

    /// Under `key`'s shard mutex, offers its node to `change` with the time `now`, or the
    /// shard's floor if that is later; `change` may retire its state and return the state
    /// that replaces it ([`Change::Replace`]), point it at a newer policy with the same
    /// layout ([`Change::Repoint`]), retire it to be removed ([`Change::Remove`]), or leave
    /// it. A node replaced or removed raises the floor to that time. Returns whether the
    /// key was held.
    pub(crate) fn update<Q>(
        &self,
        hash: u64,
        key: &Q,
        guard: &Guard,
        now: u64,
        change: impl FnOnce(Node<'_, K>, u64) -> Change,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let shard = self.shard(hash);
        let mut counts = shard.lock();
        // Relaxed: under the mutex.
        let Some(slots) = shard.array(Ordering::Relaxed, guard) else {
            return false;
        };
        let Some((slot, node)) = Self::find(slots, hash, key, Ordering::Relaxed) else { return false };
        // Relaxed: under the mutex, which orders every writer of the floor.
        let now = now.max(shard.floor.load(Ordering::Relaxed));
        let change = change(node, now);
        Self::raise_floor(shard, &change, now);
        let retired = self.apply(shard, slot, node, change, &mut counts, guard);
        drop(counts);
        if let Some(node) = retired {
            // Freed by a later collection, once two epochs have passed (`grace.rs`).
            Self::retire_nodes(vec![node], guard);
        }
        true
    }

    /// Before a node leaves the shard (`change` replaces or removes it): the floor rises to
    /// `now`, the time of its retirement (under the mutex; see [`floor`](Self::floor)).
    pub(super) fn raise_floor(shard: &Shard<K>, change: &Change, now: u64) {
        let at = match change {
            Change::Replace(_, at) => now.max(*at),
            Change::Remove => now,
            Change::Keep | Change::Repoint(_) => return,
        };
        // Release pairs with the Acquire load in `floor` (see there); within the shard the
        // mutex and the slot store that follows (Release for a replacement) publish it.
        shard.floor.fetch_max(at, Ordering::Release);
    }

    pub(super) fn apply(
        &self,
        shard: &Shard<K>,
        slot: &AtomicPtr<Header<K>>,
        node: Node<'_, K>,
        change: Change,
        counts: &mut Counts,
        guard: &Guard,
    ) -> Option<SendPtr<Header<K>>> {
        match change {
            Change::Keep => None,
            Change::Repoint(newer) => {
                // The same counts under another expiry.
                counts.changed(self.hint(shard), node.state().touched().saturating_add(newer.expiry));
                let newer = Arc::into_raw(newer).cast_mut();
                // Release pairs with the Acquire load in `Node::policy`: the new version is
                // initialised for whoever loads it.
                let old = node.header().policy.swap(newer, Ordering::Release);
                let old = SendPtr(old);
                // SAFETY: readers pinned before the swap may still use the old version; the
                // grace period drops the node's count of it after they unpin.
                #[allow(unsafe_code)]
                unsafe {
                    guard.defer(move || {
                        let old = old;
                        drop(Arc::from_raw(old.0.cast_const()));
                    });
                }
                None
            }
            Change::Replace(state, _) => {
                let (policy, words) = state.into_parts();
                let touched = words.get(TOUCHED).copied().unwrap_or(0);
                counts.changed(self.hint(shard), touched.saturating_add(policy.expiry));
                let fresh = new_node(node.key().clone(), policy, &words);
                // The same key: the same tag. Release: as in `insert`.
                let (_, tag) = untagged(slot.load(Ordering::Relaxed));
                slot.store(tagged(fresh, tag), Ordering::Release);
                Some(SendPtr(node.ptr.as_ptr()))
            }
            Change::Remove => {
                // Relaxed: readers that load the tombstone simply probe on.
                slot.store(tombstone(), Ordering::Relaxed);
                counts.live = counts.live.saturating_sub(1);
                // Relaxed: a counter.
                self.live.fetch_sub(1, Ordering::Relaxed);
                Some(SendPtr(node.ptr.as_ptr()))
            }
        }
    }

    /// Frees nodes taken out of the table once no reader can hold them: one deferred
    /// function for the lot (a sweep's thousands of nodes are one deferred item).
    pub(super) fn retire_nodes(dead: Vec<SendPtr<Header<K>>>, guard: &Guard) {
        if dead.is_empty() {
            return;
        }
        // SAFETY: the nodes are in no array any more; readers pinned before may still hold
        // them, and the grace period runs this after they unpin.
        #[allow(unsafe_code)]
        unsafe {
            guard.defer(move || {
                for node in dead {
                    free_node(node.0);
                }
            });
        }
    }

    /// Walks shard `index` under its mutex, offering each node to `change` (as in
    /// [`update`](Self::update), at the sweeper's time `now`); then rebuilds the array
    /// smaller if at most an eighth of it holds nodes, or at the same length if tombstones
    /// fill a quarter of it. Returns the nodes removed. Checks never wait for this: only
    /// inserts into the shard do.
    pub(crate) fn sweep_shard(
        &self,
        index: usize,
        now: u64,
        mut change: impl FnMut(Node<'_, K>) -> Change,
    ) -> usize {
        let Some(shard) = self.shards.get(index) else { return 0 };
        let guard = grace::pin();
        let mut counts = shard.lock();
        let Some(slots) = shard.array(Ordering::Relaxed, &guard) else {
            return 0;
        };
        let mut dead = Vec::new();
        for (at, slot) in slots.slots.iter().enumerate() {
            #[cfg(not(slidegate_loom))]
            if let Some(ahead) = slots.slots.get(at.wrapping_add(SWEEP_AHEAD)) {
                // Relaxed: a hint's address; the node is read below only through its own load.
                let (node, _) = untagged(ahead.load(Ordering::Relaxed));
                // Empty or a tombstone (which untags to null): nothing to ask for.
                if !node.is_null() {
                    prefetch_node(node);
                }
            }
            #[cfg(slidegate_loom)]
            let _ = at;
            let found = slot.load(Ordering::Relaxed);
            let Some(ptr) = NonNull::new(untagged(found).0).filter(|_| found != tombstone()) else {
                continue;
            };
            let node = Node { ptr, _guard: PhantomData };
            let change = change(node);
            Self::raise_floor(shard, &change, now);
            dead.extend(self.apply(shard, slot, node, change, &mut counts, &guard));
        }
        let removed = dead.len();
        Self::retire_nodes(dead, &guard);
        let len = slots.slots.len();
        let tombstones = counts.used.saturating_sub(counts.live);
        if counts.live == 0 {
            // An empty shard gives its array back too (the table then holds nothing but its
            // shards, as when new).
            counts.used = 0;
            counts.moved();
            // No key: none idle before the end of time (`room.rs`).
            self.hint(shard).store(u64::MAX, Ordering::Relaxed);
            shard.publish(None, &guard);
        } else if len > SMALLEST && counts.live.saturating_mul(8) <= len {
            let wanted = counts.live.saturating_mul(2).max(SMALLEST).next_power_of_two();
            self.rebuild(shard, &mut counts, wanted, &guard);
        } else if tombstones.saturating_mul(4) >= len && tombstones > 0 {
            self.rebuild(shard, &mut counts, len, &guard);
        }
        drop(counts);
        // Free what this sweep and earlier changes retired, so memory comes back promptly.
        guard.flush();
        removed
    }
}

/// How many slots ahead of the one it offers a sweep asks for a node's lines
/// ([`prefetch_node`]): enough misses in flight to cover a memory access's latency with the
/// few ns each node takes once its lines are in.
#[cfg(not(slidegate_loom))]
const SWEEP_AHEAD: usize = 32;

/// What [`Table::update`] or [`Table::sweep_shard`] does to a node.
pub(crate) enum Change {
    /// Nothing.
    Keep,
    /// Point the node at a newer policy with the same layout (see [`Policy::same_layout`]).
    Repoint(Arc<Policy>),
    /// Replace the node with a new one holding this state (the old one is retired already),
    /// made at this time (at least the time `update` offered; the shard's floor rises to it).
    Replace(OwnedState, u64),
    /// Remove the key (its state is retired already).
    Remove,
}
