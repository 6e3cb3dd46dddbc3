//! A small per-thread cache of the states of the keys a thread checks again and again, so
//! that a hot key's check skips the map: no shard lock is taken, and the only shared write
//! is the check's own compare-and-swap on the key's counters. That is what lets one hot key
//! cost a few nanoseconds, and two threads on one hot key bounce one cache line instead of
//! three (the shard lock's, twice, and the state's).
//!
//! Each thread holds, per limiter, [`SLOTS`] direct-mapped entries indexed by the key's
//! hash (`thread_local::ThreadLocal`, dropped with the limiter). An entry holds a clone of
//! the key's [`KeyState`] (an `Arc`, so a state the map has dropped stays valid memory
//! here) and identifies the key by two independent 64-bit hashes (the map's, and a second
//! one with its own random seed): holding no clone of the key, the cache never allocates,
//! and a wrong match needs two distinct keys whose 128 bits of hash all agree (for 10⁹
//! distinct keys, a chance below 10⁻²⁰). A key enters the cache when it misses twice in a
//! row on the same entry.
//!
//! Safety against eviction comes from [`KeyState::retire`]: the map retires a state before
//! dropping or replacing it, and a check through the cache that finds its state retired
//! (before or after its commit) drops the entry and starts over on the map.
//!
//! The entries sit in a `RefCell`; `try_borrow_mut` keeps any re-entrant use from
//! panicking (it falls back to the map).

use std::cell::RefCell;

use crossbeam_utils::CachePadded;
use thread_local::ThreadLocal;

use crate::window::KeyState;

/// Entries per thread and limiter.
pub(crate) const SLOTS: usize = 16;

#[derive(Default)]
struct Entry {
    hash: u64,
    /// The key's second hash.
    check: u64,
    /// The hash that last missed here: a second miss in a row installs it.
    missed: u64,
    state: Option<KeyState>,
}

/// Padded: each thread writes its `RefCell`'s flag on every check, and must not share a
/// cache line with another thread's entries.
type Entries = CachePadded<RefCell<[Entry; SLOTS]>>;

/// The per-thread caches of one limiter.
pub(crate) struct HotKeys {
    threads: ThreadLocal<Entries>,
}

impl HotKeys {
    pub(crate) fn new() -> HotKeys {
        HotKeys { threads: ThreadLocal::new() }
    }

    #[inline]
    fn entries(&self) -> &Entries {
        self.threads.get_or(|| CachePadded::new(RefCell::new(std::array::from_fn(|_| Entry::default()))))
    }

    /// Runs `check` on this thread's cached state of the key with hash `hash` and second
    /// hash `second()` (computed only when `hash` matches), if any. `check` returns `None`
    /// when the state cannot answer (retired, or expired and in need of the map): the entry
    /// is then dropped and the caller goes to the map.
    #[inline]
    pub(crate) fn with_cached<R>(
        &self,
        hash: u64,
        second: impl FnOnce() -> u64,
        check: impl FnOnce(&KeyState) -> Option<R>,
    ) -> Option<R> {
        let mut entries = self.entries().try_borrow_mut().ok()?;
        let entry = entries.get_mut(slot(hash))?;
        if entry.hash != hash || entry.state.is_none() || entry.check != second() {
            return None;
        }
        let answer = check(entry.state.as_ref()?);
        if answer.is_none() {
            *entry = Entry::default();
        }
        answer
    }

    /// Tells the cache that the key with hash `hash` (and second hash `second()`, computed
    /// only if it is cached now) missed it and was found in the map as `state`: on the
    /// second miss in a row on its entry, it is cached.
    #[inline]
    pub(crate) fn missed(&self, hash: u64, second: impl FnOnce() -> u64, state: &KeyState) {
        let Ok(mut entries) = self.entries().try_borrow_mut() else { return };
        let Some(entry) = entries.get_mut(slot(hash)) else { return };
        if entry.missed != hash {
            entry.missed = hash;
            return;
        }
        *entry = Entry { hash, check: second(), missed: 0, state: Some(state.clone()) };
    }
}

#[inline]
fn slot(hash: u64) -> usize {
    // The map uses the hash's low bits to pick a shard and a bucket; the top bits choose the
    // entry here, so that keys of one shard spread over the cache too.
    (hash >> 60) as usize % SLOTS
}
