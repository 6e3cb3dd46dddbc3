//! A limiter's keys read out for a snapshot and merged back in from one, key by key,
//! while checks go on: the table walked without its locks ([`Limiter::each_saved`]), and a
//! loaded key inserted with its counts in place or merged into the key's held state
//! ([`Limiter::merge_saved`]). The file is `snapshot.rs`'s (feature `serde`); what a key's
//! counts are and how they are laid back out is `protocol/snapshot.rs`'s.

use std::hash::Hash;

use crate::grace;
use crate::layout::Policy;
use crate::limit::Limit;
use crate::protocol::{replay_into, History};
use crate::table::{Change, Freed, Refused};

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
}

/// How many times a merge into a held key follows it through policy changes racing it.
const MERGE_ROUNDS: usize = 4;

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Calls `f` with every held key, its policy's name and version, and what each limit of
    /// that version counts at the time the limiter's clock reads then (per key: the walk
    /// takes a while), until `f` returns an error. Expired keys are passed over. Checks,
    /// inserts and sweeps go on meanwhile: a key inserted or removed during the walk may
    /// be met or not; one held throughout is met once.
    pub(crate) fn each_saved<E>(
        &self,
        mut f: impl FnMut(&K, &str, &Policy, u64, History) -> Result<(), E>,
    ) -> Result<(), E> {
        let shared = &*self.shared;
        for shard in 0..shared.table.shards() {
            // Pinned per shard, not for the whole walk: the grace periods of frees go on.
            let guard = grace::pin();
            let mut result = Ok(());
            shared.table.for_each_in_shard(shard, &guard, |node| {
                if result.is_err() {
                    return;
                }
                let now = shared.now.nanos();
                let state = node.state();
                let policy = state.policy();
                if let Some(history) = state.history(now).filter(|h| h.iter().any(|l| !l.is_empty())) {
                    result = f(node.key(), shared.tiers.name(policy.tier()), policy, now, history);
                }
            });
            result?;
        }
        Ok(())
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
        let now = shared.now.nanos();
        let guard = grace::pin();
        let hash = shared.table.hash(key);
        let tier = shared.tiers.index(policy).unwrap_or_else(|| self.tier_of(key));
        let mut inserted = false;
        let mut nothing = false;
        let node = shared.table.insert(
            hash,
            key,
            now,
            &guard,
            |owned| match self.override_of::<K>(owned) {
                Some(set) => shared.tiers.current(set),
                None => shared.tiers.current(tier),
            },
            |freed| match freed {
                Freed::Idle => shared.metrics.evicted(1),
                Freed::Evicted => shared.metrics.evicted_live(),
            },
            |policy, now, words| {
                inserted = true;
                matched(policy, limits, now, scratch);
                nothing = scratch.iter().all(Vec::is_empty);
                replay_into(policy, scratch, now, words);
                true
            },
        );
        match node {
            Err(Refused::Full) => return Merged::Full,
            Ok(_) if inserted => {
                shared.metrics.keys(shared.table.len());
                // A key whose loaded units have all left its windows is held as a fresh one
                // (the sweeper takes it), as a check of cost 0 never inserts one: rare, and
                // no different from a key checked once and idle since.
                return if nothing { Merged::Nothing } else { Merged::Inserted };
            }
            Ok(_) => {}
        }
        let mut added = None;
        for _ in 0..MERGE_ROUNDS {
            shared.table.update(hash, key, &guard, now, |node, now| {
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
                let (merged, at) = state.merge_at(&current, scratch, || now.max(shared.now.nanos()));
                Change::Replace(merged, at)
            });
            if let Some(added) = added {
                return added;
            }
        }
        // Moved again and again by policy changes, or removed meanwhile: merged as a new key.
        Merged::Nothing
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
