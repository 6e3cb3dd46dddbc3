//! The sliding log: per limit, one word pointing to an immutable, sorted snapshot of the
//! timestamps (ns) of the admitted units still inside the window. An admission builds the
//! next snapshot (the entries still in the window, plus `cost` copies of its time) and
//! publishes it with one CAS on the word; the replaced snapshot is freed after a grace
//! period (`grace.rs`) once no check can still be reading it. A refusal writes nothing.
//!
//! The word holds `EMPTY` (no entries, no allocation), `DETACHED` (the state was retired:
//! checks start over on the map, and nothing may be published into it again), or the
//! address of a snapshot `[len, t₀ ≤ t₁ ≤ … ≤ t_len−1]` allocated as one boxed slice.

// The snapshots are shared through raw addresses, so this module reads and frees them with
// `unsafe`; each use says why it is sound.
#![allow(unsafe_code)]

use crate::algorithm::counter::{set, Counter, Rule, Words};
use crate::algorithm::MAX_LOG_UNITS;
use crate::sync::Ordering;

const EMPTY: u64 = 0;
/// Never an address: snapshots are 8-byte aligned.
const DETACHED: u64 = 1;

pub(crate) struct Log;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct View {
    /// The slot (of the limit's precision) and ns into it of `stamp`, for `touched`.
    slot: u64,
    elapsed: u64,
    /// The time an admission from this view records: `now`, or the newest entry if a
    /// racing check's clock is ahead (entries stay sorted).
    stamp: u64,
    /// The word as loaded: the commit's expected value.
    seen: u64,
    /// Entries in the snapshot, and the index of the first one still inside the window.
    len: usize,
    first: usize,
    retired: bool,
}

impl View {
    #[allow(clippy::arithmetic_side_effects, reason = "first is a partition point of the entries, or len")]
    fn in_window(&self) -> u64 {
        (self.len - self.first) as u64
    }
}

/// The entries of the snapshot at `bits` (not `EMPTY` nor `DETACHED`).
///
/// # Safety
/// `bits` was loaded from a log word while the caller's [`reclaim::Pin`] was held, and the
/// pin is still held: snapshots are freed only through [`reclaim::defer_free`] after they
/// have been unlinked from their word, so it cannot be freed before the pin is dropped.
unsafe fn entries<'pin>(bits: u64) -> &'pin [u64] {
    let base = bits as usize as *const u64;
    // SAFETY: per the contract, `base` points to a live `[len, entries...]` allocation
    // written before the Release CAS that published it (the load that produced `bits` was
    // Acquire), and snapshots are never written after publication.
    unsafe {
        let len = *base as usize;
        std::slice::from_raw_parts(base.add(1), len)
    }
}

/// Allocates a snapshot of `len` entries that `fill` pushes (sorted), in one allocation;
/// `EMPTY` if there are none.
fn publishable(len: usize, fill: impl FnOnce(&mut Vec<u64>)) -> u64 {
    if len == 0 {
        return EMPTY;
    }
    let mut words = Vec::with_capacity(len.saturating_add(1));
    words.push(len as u64);
    fill(&mut words);
    debug_assert_eq!(words.len(), len.saturating_add(1));
    // Exact capacity: `into_boxed_slice` does not reallocate.
    Box::into_raw(words.into_boxed_slice()) as *mut u64 as usize as u64
}

/// Frees a snapshot.
///
/// # Safety
/// `bits` came from [`publishable`], is not `EMPTY`, and no thread can read it any more
/// (it was never shared, or it was unlinked and every pin that could see it has dropped).
#[allow(clippy::arithmetic_side_effects, reason = "the snapshot holds len + 1 words, so that fits")]
unsafe fn free(bits: u64) {
    let base = bits as usize as *mut u64;
    // SAFETY: per the contract, `base` is the start of a live boxed slice of `len + 1`
    // words that nothing else references; rebuilding the box frees it exactly once.
    unsafe {
        let len = *base as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, len + 1)));
    }
}

#[cfg(not(slidegate_loom))]
mod reclaim {
    /// Held by a check while it reads snapshots (inside the table's pin: a nested pin
    /// costs a counter).
    pub(super) type Pin = crate::grace::Guard;

    pub(super) fn pin() -> Pin {
        crate::grace::pin()
    }

    /// Frees the unlinked snapshot `bits` once no pinned check can still read it.
    pub(super) fn defer_free(bits: u64) {
        let guard = crate::grace::pin();
        // SAFETY: the caller has just unlinked `bits` from its word (its CAS or swap
        // succeeded), so only checks pinned before now can hold it, and the grace period
        // runs the closure only after all of them have unpinned.
        unsafe { guard.defer(move || super::free(bits)) }
    }
}

/// Under loom the models check the CAS protocol; unlinked snapshots are leaked rather than
/// handed to `grace`, whose own model is `loom-tests/tests/grace.rs`.
#[cfg(slidegate_loom)]
mod reclaim {
    pub(super) type Pin = ();

    pub(super) fn pin() {}

    pub(super) fn defer_free(_: u64) {}
}

impl Log {
    /// Unlinks the limit's snapshot from a retired state and frees it once no check reads it.
    pub(crate) fn release(state: &Words, rule: &Rule) {
        // AcqRel: Acquire pairs with the Release CAS that published the snapshot we free;
        // Release orders the retirement before it for checks that load `DETACHED`.
        let bits = state.word(rule.at()).swap(DETACHED, Ordering::AcqRel);
        if bits != EMPTY && bits != DETACHED {
            reclaim::defer_free(bits);
        }
    }

    /// Lays out the limit's log of a state no other thread sees yet, empty until now, as
    /// holding `entries` (`(time, units)`, oldest first): the newest [`Counter::MOST`] stamps
    /// in one snapshot (one allocation, not one per entry as commits would make). The
    /// newest stamp, for `touched` to cover; `None` if there are none.
    #[cfg(feature = "serde")]
    pub(crate) fn lay_out(state: &Words, rule: &Rule, entries: &[(u64, u64)]) -> Option<u64> {
        let mut stamps: Vec<u64> = Vec::new();
        // Newest first, then reversed: the newest `MOST` are what every decision needs.
        for &(at, units) in entries.iter().rev() {
            let room = (Log::MOST as usize).saturating_sub(stamps.len());
            let n = usize::try_from(units).unwrap_or(usize::MAX).min(room);
            stamps.resize(stamps.len().saturating_add(n), at);
        }
        stamps.reverse();
        let newest = stamps.last().copied()?;
        let next = publishable(stamps.len(), |words| words.extend_from_slice(&stamps));
        // Unshared, empty (`EMPTY`): nothing to race; were it not empty, the entries are
        // dropped rather than the state's (as a failed commit leaves them).
        let _ = Log::replace(state, rule, EMPTY, next);
        Some(newest)
    }

    /// Publishes `next` in place of `seen`; `false` (and `next` freed) if the word changed.
    fn replace(state: &Words, rule: &Rule, seen: u64, next: u64) -> bool {
        // Release pairs with the Acquire loads in `view` and `rollback`: the snapshot's
        // entries, written before, are visible to whoever loads its address. Acquire pairs
        // with the RMWs of `KeyState::migrate_at` (a policy change).
        match state.word(rule.at()).compare_exchange(seen, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                if seen != EMPTY {
                    reclaim::defer_free(seen);
                }
                true
            }
            Err(_) => {
                if next != EMPTY {
                    // SAFETY: `next` was never published: this thread alone knows it.
                    unsafe { free(next) };
                }
                false
            }
        }
    }
}

impl Counter for Log {
    type View = View;
    type Pin = reclaim::Pin;
    /// Entries beyond the newest `MOST` change no decision for any `max` (at most
    /// `MAX_LOG_UNITS`): a cost fits once the `in_window + cost − max` oldest entries in the
    /// window have left, and that is the same entry whether or not older ones are kept. So
    /// a commit keeps at most `MOST` (a check's never has more), and a huge recorded cost
    /// is not a huge allocation.
    const MOST: u64 = MAX_LOG_UNITS;
    #[inline]
    fn pin() -> reclaim::Pin {
        reclaim::pin()
    }
    fn words(_: &Rule) -> usize {
        1
    }
    fn reset(words: &mut [u64], rule: &Rule, _: u64) {
        set(words, rule.at(), EMPTY);
    }
    fn view(state: &Words, rule: &Rule, now: u64, expired: bool) -> View {
        // Acquire: pairs with the Release CAS in `replace` (see there).
        let seen = state.word(rule.at()).load(Ordering::Acquire);
        let (slot, elapsed) = rule.slot_of(now);
        let mut view = View { slot, elapsed, stamp: now, seen, ..View::default() };
        if seen == DETACHED {
            view.retired = true;
            return view;
        }
        if seen == EMPTY || expired {
            // An expired key's entries are all outside the window: a peek sees none.
            view.first = view.len;
            return view;
        }
        // SAFETY: loaded just above, under the check's pin (`check_with`).
        let entries = unsafe { entries(seen) };
        view.len = entries.len();
        // A unit at `t` counts while `now < t + window`.
        view.first = entries.partition_point(|&t| t.saturating_add(rule.window) <= now);
        if let Some(&newest) = entries.last() {
            if newest > now {
                view.stamp = newest;
                (view.slot, view.elapsed) = rule.slot_of(newest);
            }
        }
        view
    }
    #[inline]
    fn retired(view: &View) -> bool {
        view.retired
    }
    fn admits(rule: &Rule, view: &View, cost: u64) -> bool {
        view.in_window().saturating_add(cost) <= rule.max
    }
    fn commit(state: &Words, rule: &Rule, view: &View, cost: u64) -> bool {
        let kept: &[u64] = if view.seen == EMPTY || view.first == view.len {
            &[]
        } else {
            // SAFETY: `view.seen` was loaded in `view` under the pin this check still holds.
            let entries = unsafe { entries(view.seen) };
            entries.get(view.first..).unwrap_or_default()
        };
        // At most the newest `MOST` entries (see there), a small number: the casts are exact.
        let cost = cost.min(Log::MOST) as usize;
        let room = (Log::MOST as usize).saturating_sub(cost);
        let kept = kept.get(kept.len().saturating_sub(room)..).unwrap_or_default();
        let next = publishable(kept.len().saturating_add(cost), |words| {
            words.extend_from_slice(kept);
            words.resize(words.len().saturating_add(cost), view.stamp);
        });
        Log::replace(state, rule, view.seen, next)
    }
    /// Takes our `cost` entries out of the snapshot. Exact while the log holds fewer than
    /// `MOST` entries: entries with one stamp are interchangeable, and they leave the
    /// window (and the log) together. A log at `MOST` entries may have dropped its oldest
    /// (`commit` keeps the newest `MOST`), ours among them, and then the entries at our
    /// stamp may be another check's: it stays as it is (conservative).
    fn rollback(state: &Words, rule: &Rule, view: &View, cost: u64) {
        loop {
            // Acquire: as in `view`.
            let cur = state.word(rule.at()).load(Ordering::Acquire);
            if cur == EMPTY || cur == DETACHED {
                return;
            }
            // SAFETY: loaded just above, under the check's pin.
            let entries = unsafe { entries(cur) };
            if entries.len() as u64 >= Log::MOST {
                return;
            }
            // Our units are `cost` entries equal to our stamp (any entries with that time
            // are interchangeable); some may have left the window and been dropped already.
            let from = entries.partition_point(|&t| t < view.stamp);
            let to = entries.partition_point(|&t| t <= view.stamp);
            let gone = to.saturating_sub(from).min(usize::try_from(cost).unwrap_or(usize::MAX));
            if gone == 0 {
                return;
            }
            // Partition points: from ≤ to ≤ len, so nothing here saturates or comes up short.
            let (before, after) = entries.split_at_checked(to).unwrap_or((entries, &[]));
            let kept = before.get(..before.len().saturating_sub(gone)).unwrap_or_default();
            let next = publishable(kept.len().saturating_add(after.len()), |words| {
                words.extend_from_slice(kept);
                words.extend_from_slice(after);
            });
            if Log::replace(state, rule, cur, next) {
                return;
            }
        }
    }
    fn room(rule: &Rule, view: &View, cost: u64) -> u64 {
        rule.max.saturating_sub(view.in_window().saturating_add(cost))
    }
    fn used(_: &Rule, view: &View) -> u64 {
        view.in_window()
    }
    fn admissible_at(_: &Words, rule: &Rule, view: &View, cost: u64) -> Result<u64, u64> {
        let excess = view.in_window().saturating_add(cost).saturating_sub(rule.max) as usize;
        if excess == 0 || view.seen == EMPTY {
            return Ok(view.stamp);
        }
        // SAFETY: `view.seen` was loaded in `view` under the pin this check still holds.
        let entries = unsafe { entries(view.seen) };
        // `cost` fits once the `excess` oldest units in the window have left it.
        #[allow(clippy::arithmetic_side_effects, reason = "excess ≥ 1 (returned above), first ≤ len")]
        let oldest = view.first + excess - 1;
        Ok(entries.get(oldest).map_or(view.stamp, |t| t.saturating_add(rule.window)))
    }
    fn at(_: &Rule, view: &View, _: u64) -> (u64, u64) {
        (view.slot, view.elapsed)
    }
    /// The entries still inside the window, one pair per distinct time. Called under the
    /// caller's pin (`Counter::pin`), as a check's view is.
    #[cfg(feature = "serde")]
    fn history(state: &Words, rule: &Rule, now: u64, out: &mut Vec<(u64, u64)>) -> bool {
        let view = Log::view(state, rule, now, false);
        if view.retired {
            // Detached by a move or a retirement after the caller read `touched`: read again
            // (it then finds the marker and looks the key up where it went).
            return false;
        }
        if view.seen == EMPTY || view.first == view.len {
            return true;
        }
        // SAFETY: `view.seen` was loaded in `view` under the pin the caller holds.
        let entries = unsafe { entries(view.seen) };
        // As stamped (a racing check's clock may be ahead of `now`: a load places a unit no
        // later than its own time anyway).
        for &t in entries.get(view.first..).unwrap_or_default() {
            match out.last_mut() {
                Some((last, units)) if *last == t => *units = units.saturating_add(1),
                _ => out.push((t, 1)),
            }
        }
        true
    }
}
