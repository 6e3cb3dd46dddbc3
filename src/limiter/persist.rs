//! A limiter's keys read out for a snapshot and merged back in from one, key by key,
//! while checks go on: the table walked without its locks ([`Limiter::each_saved`]), and a
//! loaded key inserted with its counts in place or merged into the key's held state
//! ([`Limiter::merge_saved`]). The file is `snapshot.rs`'s (feature `serde`); what a key's
//! counts are and how they are laid back out is `protocol/snapshot.rs`'s.

use std::hash::Hash;
use std::sync::Arc;

use crate::grace;
use crate::layout::Policy;
use crate::limit::Limit;
use crate::protocol::{replay_into, History, MOVED};
use crate::table::{Change, Freed, Hooks, Refused};

use super::admin::move_state;
use super::Limiter;

/// What [`Limiter::merge_saved`] did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merged {
    /// Not held: inserted with the loaded counts.
    Inserted,
    /// Held: the loaded counts added to its own.
    Added,
    /// Not held, and the table is full (no idle key gave its place).
    Full,
    /// Nothing loaded counts any more in a limit of its policy: left as it was.
    Nothing,
    /// Other threads moved or removed the key each time the merge came to it (a policy
    /// changed again and again, sweeps or resets): not loaded.
    Raced,
}

/// How many times a merge follows its key through other threads' changes racing it (a
/// policy change moving it, a sweep or a reset removing it between the insert that found
/// it and the merge).
const MERGE_ROUNDS: usize = 4;

/// How many times the walk of a save looks a key up again that it met moved or retired.
const LOOKUPS: usize = 4;

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Calls `f` with every held key, its policy's name and version, and what each limit of
    /// that version counts at the time the limiter's clock reads then (per key: the walk
    /// takes a while), and `shard_done` after each shard, once the walk no longer holds any
    /// node, until one returns an error. Expired keys are passed over. Checks, inserts and
    /// sweeps go on meanwhile: a key inserted or removed during the walk may be met or not;
    /// one held throughout is met once. A key whose node the walk meets moved (a policy
    /// change, a load's merge, since the walk loaded the shard's array) is looked up again,
    /// once the mover has let the shard's mutex go, and read where it lives now; one met
    /// retired (removed, or replaced as expired) held nothing that still counts. Returns
    /// how many keys were still found moved after a few lookups (left out).
    pub(crate) fn each_saved<E>(
        &self,
        mut f: impl FnMut(&K, &str, &Policy, u64, History) -> Result<(), E>,
        mut shard_done: impl FnMut() -> Result<(), E>,
    ) -> Result<u64, E> {
        let shared = &*self.shared;
        // Keys found moved at every lookup (other threads moving them again and again).
        let mut raced = 0u64;
        for shard in 0..shared.table.shards() {
            // Pinned per shard, not for the whole walk: the grace periods of frees go on.
            let guard = grace::pin();
            let mut result = Ok(());
            shared.table.for_each_in_shard(shard, &guard, |met| {
                if result.is_err() {
                    return;
                }
                let mut node = met;
                for _ in 0..LOOKUPS {
                    let now = shared.now.nanos();
                    let state = node.state();
                    let policy = state.policy();
                    match state.history(now) {
                        Some(history) => {
                            if history.iter().any(|l| !l.is_empty()) {
                                result =
                                    f(node.key(), shared.tiers.name(policy.tier()), policy, now, history);
                            }
                            return;
                        }
                        // Moved (a policy change, a load's merge): its state went on in a new node
                        // of the same key. Retired (removed, or replaced as expired): what it
                        // held no longer counts; a key inserted since may be met or not.
                        None if state.touched() != MOVED => return,
                        None => {
                            let hash = shared.table.hash(met.key());
                            // The mover holds the shard's mutex until the new node is in
                            // place: wait for it, or a lookup finds the old node again.
                            shared.table.update(hash, met.key(), &guard, 0, |_, _| Change::Keep);
                            match shared.table.get(hash, met.key(), &guard) {
                                Some(found) => node = found,
                                None => return,
                            }
                        }
                    }
                }
                raced = raced.saturating_add(1);
            });
            drop(guard);
            result?;
            shard_done()?;
        }
        Ok(raced)
    }

    /// Merges a loaded key's counts: `limits` (each saved limit, with its units by time on
    /// this limiter's clock, oldest first) matched to the limits of the key's policy (see
    /// [`matched`]). A held key keeps its policy and gets the units on top of its own. A
    /// key not held goes under its override, else the policy named `policy` if there is
    /// one, else the one a check would give it, and is inserted unless the table is full.
    pub(crate) fn merge_saved(
        &self,
        key: &K,
        policy: &str,
        limits: &[(Limit, Vec<(u64, u64)>)],
        scratch: &mut History,
    ) -> Merged {
        let shared = &*self.shared;
        let guard = grace::pin();
        let hash = shared.table.hash(key);
        let tier = shared.tiers.index(policy).unwrap_or_else(|| self.tier_of(key));
        for _ in 0..MERGE_ROUNDS {
            let now = shared.now.nanos();
            let mut inserted = None;
            let node = shared.table.insert(
                hash,
                key,
                now,
                &guard,
                |owned| match self.override_of::<K>(owned) {
                    Some(set) => shared.tiers.current(set),
                    None => shared.tiers.current(tier),
                },
                Hooks {
                    on_freed: |freed| match freed {
                        Freed::Idle => shared.metrics.evicted(1),
                        Freed::Evicted => shared.metrics.evicted_live(),
                    },
                    init: |policy: &Arc<Policy>, now: u64, words: &mut [u64]| {
                        matched(policy, limits, now, scratch);
                        inserted = Some(scratch.iter().all(Vec::is_empty));
                        replay_into(policy, scratch, now, words);
                        true
                    },
                    // A load never evicts a live key (it never lowers a count), and waits for
                    // a busy shard rather than be refused.
                    check: false,
                },
            );
            match (node, inserted) {
                (Err(Refused::Full), _) => return Merged::Full,
                (Ok(_), Some(nothing)) => {
                    shared.metrics.keys(shared.table.len());
                    // A key whose loaded units all left its windows is held as a fresh one
                    // (the sweeper takes it): rare, and no different from a key checked once.
                    return if nothing { Merged::Nothing } else { Merged::Inserted };
                }
                (Ok(_), None) => {}
            }
            // Held: merged into its state, under its shard's mutex. A sweep, a reset or a room
            // search may take the key out after the insert found it (then: insert again), or a
            // policy change move it (then: merge into the moved state).
            let mut added = None;
            let held = shared.table.update(hash, key, &guard, now, |node, now| {
                let state = node.state();
                let current = shared.tiers.current(state.policy().tier());
                if !std::ptr::eq(state.policy(), &*current) {
                    // A newer version first, as a check would move it (`renew`).
                    return move_state(state, &current, || now.max(shared.now.nanos()), current.carry());
                }
                matched(&current, limits, now, scratch);
                if scratch.iter().all(Vec::is_empty) {
                    added = Some(Merged::Nothing);
                    return Change::Keep;
                }
                added = Some(Merged::Added);
                let (merged, at) = state.merge_at(&current, scratch, || now.max(shared.now.nanos()), &guard);
                Change::Replace(merged, at)
            });
            if let (true, Some(added)) = (held, added) {
                return added;
            }
        }
        Merged::Raced
    }
}

/// The loaded units for each limit of `policy`, oldest first, those that still count at
/// `now`: a limit gets the saved limit equal to it, or else the first saved limit of the
/// same window (its `max`, precision or accuracy changed: its units carry over, as
/// [`Limiter::update_policy`] carries them, each into the slot that holds the end of its
/// saved slot). A limit with no saved limit of its window starts empty; a saved limit that
/// no limit takes is dropped.
fn matched(policy: &Policy, saved: &[(Limit, Vec<(u64, u64)>)], now: u64, into: &mut History) {
    into.resize_with(policy.rules.len(), Vec::new);
    for (limit, kept) in policy.limits().zip(into.iter_mut()) {
        kept.clear();
        let found = saved
            .iter()
            .find(|(s, _)| s == limit)
            .or_else(|| saved.iter().find(|(s, _)| s.window() == limit.window()));
        let Some((_, entries)) = found else { continue };
        // Out of the window once `window + precision` has passed (a slot's units leave the
        // interpolated window by the end of the slot after it), or for GCRA once its lead
        // has drained (`units` intervals of `window / max`; more than a window when units
        // were recorded beyond `max`).
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let span = ns(limit.window().saturating_add(limit.get_precision()));
        let per_unit = ns(limit.window()).div_ceil(limit.max().max(1));
        kept.extend(entries.iter().copied().filter(|&(at, units)| {
            units > 0 && at.saturating_add(span.max(units.saturating_mul(per_unit))) > now
        }));
        if kept.windows(2).any(|pair| matches!(pair, [a, b] if a.0 > b.0)) {
            kept.sort_by_key(|&(at, _)| at);
        }
    }
}
