//! A small per-thread cache of the states of the keys a thread checks again and again, so
//! that a hot key's check skips the map: no shard lock is taken, and the only shared write
//! is the check's own compare-and-swap on the key's counters. That is what lets one hot key
//! cost a few nanoseconds, and two threads on one hot key bounce one cache line instead of
//! three (the shard lock's, twice, and the state's).
//!
//! Each thread holds [`SLOTS`] direct-mapped entries, indexed by the key's hash and tagged
//! with the limiter's id. An entry owns a clone of the key and a clone of its
//! [`KeyState`] (an `Arc`, so a state the map has dropped stays valid memory here). A key
//! enters the cache only when it misses twice in a row on the same entry, so traffic over
//! many keys does not churn it.
//!
//! Safety against eviction comes from [`KeyState::retire`]: the map retires a state before
//! dropping or replacing it, and a check through the cache that finds its state retired
//! (before or after its commit) drops the entry and starts over on the map. A dropped
//! limiter's entries are never matched again (ids are unique) and are overwritten as the
//! thread moves on; until then they hold their states' memory: at most `SLOTS` per thread.
//!
//! The cache is a `RefCell`: `try_borrow_mut` makes a re-entrant use (a key whose `Eq`
//! checks a limiter) fall back to the map instead of panicking.

use std::any::Any;
use std::borrow::Borrow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::window::KeyState;

/// Entries per thread, shared by all limiters.
pub(crate) const SLOTS: usize = 16;

/// A fresh id for a limiter (0 marks an empty entry).
pub(crate) fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: only uniqueness matters.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

struct Cached<K> {
    key: K,
    state: KeyState,
}

struct Entry {
    owner: u64,
    hash: u64,
    /// The `(owner, hash)` that last missed here: a second miss in a row installs it.
    missed: (u64, u64),
    cached: Option<Box<dyn Any>>,
}

impl Entry {
    const EMPTY: Entry = Entry { owner: 0, hash: 0, missed: (0, 0), cached: None };
}

thread_local! {
    static CACHE: RefCell<[Entry; SLOTS]> = const { RefCell::new([Entry::EMPTY; SLOTS]) };
}

/// Runs `check` on this thread's cached state of `key` (of the limiter `owner`), if any.
/// `check` returns `None` when the state cannot answer (retired, or expired and in need of
/// the map): the entry is then dropped and the caller goes to the map.
#[inline]
pub(crate) fn with_cached<K, Q, R>(
    owner: u64,
    hash: u64,
    key: &Q,
    check: impl FnOnce(&KeyState) -> Option<R>,
) -> Option<R>
where
    K: Borrow<Q> + 'static,
    Q: Eq + ?Sized,
{
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let entry = cache.get_mut(slot(hash))?;
            if entry.owner != owner || entry.hash != hash {
                return None;
            }
            let cached = entry.cached.as_ref()?.downcast_ref::<Cached<K>>()?;
            if cached.key.borrow() != key {
                return None;
            }
            let answer = check(&cached.state);
            if answer.is_none() {
                *entry = Entry::EMPTY;
            }
            answer
        })
        .ok()
        .flatten()
}

/// Tells the cache that `key` missed it and was found in the map as `state`: on the
/// second miss in a row on its entry, the key is cached (cloning it and the state).
#[inline]
pub(crate) fn missed<K, Q>(owner: u64, hash: u64, key: &Q, state: &KeyState)
where
    K: Borrow<Q> + 'static,
    Q: ToOwned<Owned = K> + ?Sized,
{
    let _ = CACHE.try_with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else { return };
        let Some(entry) = cache.get_mut(slot(hash)) else { return };
        if entry.missed != (owner, hash) {
            entry.missed = (owner, hash);
            return;
        }
        let cached: Box<dyn Any> = Box::new(Cached { key: key.to_owned(), state: state.clone() });
        *entry = Entry { owner, hash, missed: (0, 0), cached: Some(cached) };
    });
}

#[inline]
fn slot(hash: u64) -> usize {
    // The map uses the hash's low bits to pick a shard and a bucket; the top bits choose the
    // entry here, so that keys of one shard spread over the cache too.
    (hash >> 60) as usize % SLOTS
}
