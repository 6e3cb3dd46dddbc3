//! The keys refused the most over the recent past, in bounded memory: the structure behind
//! `Limiter::top_refused`.
//!
//! # What it is
//! A *heavy-hitter summary* of refusals: every refusal adds its units to its key, counts
//! halve every half-life (the limiter passes its longest window), and [`Offenders::top`]
//! returns the `n` keys with the most, most first. Memory does not grow with the number of
//! distinct keys: a spray of a million one-off keys costs what a hundred keys cost.
//!
//! # Why this structure
//! *Filtered Space-Saving* (Homem and Carvalho, 2010), per stripe. Space-Saving (Metwally,
//! Agrawal and El Abbadi, 2005) keeps `m` entries (key, count, error); a key not among them
//! takes the place of the entry with the smallest count `μ`, starting from `μ`, so no count
//! is ever below the key's true count, and it is above it by at most `μ ≤ N / m` (`N`: the
//! units recorded). It is deterministic, needs no tuning and never underestimates, which is
//! what makes its top list certain where counts differ by more than the bound; HeavyKeeper
//! is probabilistic and underestimates. Plain Space-Saving, though, lets every unseen key
//! evict an entry: under a spray of one-off keys every refusal would clone a key and free
//! another. The filter in front fixes that: an array of `8m` counters indexed by the key's
//! hash, where a key not in the summary adds its units, entering the summary only when its
//! counter goes past `μ` (with that count, and that counter as its error). A counter is an
//! upper bound on the units of every key that hashes to it and is not in the summary (an
//! evicted entry's count is folded into its counter), and never exceeds `μ`. Units of
//! one-off keys are spread over `8m` counters, so a spray clones nothing until counters
//! reach `μ`. Past that, a key enters only from a counter at `μ`, at most `m` enter before
//! `μ` rises (each replaces an entry at `μ`), and every counter then takes one more one-off
//! before it is at the new `μ`: for a uniform spray about `m` clones per `m + 8m` one-offs,
//! one in nine, where plain Space-Saving clones for every one (measured: 11.5% of a pure
//! spray of 2 M keys in the `timing` test, 6% of 1 M one-offs among heavy keys in the
//! spray test).
//!
//! Per stripe the entries sit in a min-heap of counts (a hot key's increment compares with its
//! children only: hot keys are deep in it), found through a small open-addressed index of
//! `u32` positions keyed by the hash the limiter has already computed (the key itself is
//! compared only on a hash match and cloned only when it enters).
//!
//! # The bound
//! Per stripe `s`, with `N_s` the units recorded into it and `μ_s` its smallest count (0
//! while it is not full): every count in the summary is at least the key's true count in
//! `s` and at most that plus `μ_s`, and `μ_s ≤ N_s / m` (the counts never sum to more than
//! `N_s`: an entering key's count exceeds the one it replaces by at most its units). `top`
//! sums over the stripes, for a stripe that does not hold the key, that stripe's filter
//! counter (an upper bound there): so every reported count is between the true count and
//! the true count plus `Σ μ_s ≤ N / m`, `N` the units refused in all. Every key whose true
//! count exceeds `Σ μ_s` is in some summary, hence reported where it belongs: the top `n`
//! are exact, in order, wherever the true counts of adjacent ranks differ by more than
//! `N / m`. When the summary holds every key (fewer distinct keys than `m` per stripe), the
//! counts are exact.
//!
//! # Decay
//! Counts are "recent" by halving: every `half_life` ns all counts, errors and filter
//! counters of a stripe shift right by one, lazily, at the stripe's first touch in a later
//! epoch (`now / half_life`; 64 or more halvings clear it). A refusal of `u` units `k`
//! half-lives ago weighs `u / 2ᵏ` (rounded down at each halving), and the bound above holds
//! with `N` decayed the same way. Shifting keeps the heap's order, so the decay costs one
//! pass over the stripe per half-life and nothing per refusal but a division (by
//! multiplication, [`Divisor`]). A half-life of 0 means no decay. A `now` that arrives
//! slightly behind the stripe's epoch (threads' clocks are read out of order) counts in the
//! stripe's epoch.
//!
//! # The cost, and contention
//! An admission pays nothing: only the refusal path calls [`Offenders::refused`]. A refusal
//! locks one stripe (`try_lock`, one uncontended atomic exchange), finds its key through the
//! index, adds, and sifts the heap. Measured on one thread (release, the ignored `timing` test
//! in `tests.rs`, a 2-core Xeon VM): 19 ns for a key already tracked, 48 ns a refusal in a
//! spray of distinct 16-byte `String` keys (one in nine of which clones a key and frees
//! another). Stripes are cache-padded and as many as the machine's cores (at most 64); each
//! thread has a home stripe (threads are dealt round-robin), so refusals on two cores write
//! different lines. A thread whose home is busy (another thread dealt the same one, or `top`
//! copying it) tries the next, then the next; only if every stripe is busy does it wait for its
//! home. Units are never dropped. A key refused by several threads is held by several stripes,
//! which `top` merges. (The stripes' arrays are separate allocations: two may share the cache
//! line at their edges, a word rarely written.)
//!
//! # Memory
//! A stripe allocates at its first refusal `m` entries (the key, its hash and heap position,
//! plus a count, an error and an entry number in the heap: `size_of::<K>() + 40` bytes), an
//! index of `2m` rounded up to a power of two `u32`s and `8m` rounded up to a power of two
//! `u64` filter counters: for `m = 128` and `String` keys `128 · 64 + 256 · 4 + 1024 · 8 =
//! 17,408` bytes, plus 128 bytes of padded lock, plus the keys' own bytes. With 16 cores
//! that is at most 16 · 17.5 KB = 280 KB plus at most `16 · 128` key strings, whatever the
//! number of distinct keys. [`Offenders::bytes`] reports what is held.

#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::Hash;
// Not through `crate::sync`: nothing here is a lock-free protocol for loom to model. The
// stripe locks are held over plain memory only (no loom operation inside, so a loom thread
// never yields holding one), and the counter below only deals threads to stripes.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use crossbeam_utils::CachePadded;

use crate::divisor::Divisor;

/// Stripes at most (`top` keeps a stripe set in a `u64`).
const MAX_STRIPES: usize = 64;
/// Entries per stripe at most: positions are `u32`, and the index doubles it.
const MAX_CAPACITY: usize = 1 << 24;
/// Filter counters per entry (rounded up to a power of two in all).
const FILTER_PER_ENTRY: usize = 8;
/// An empty slot of the index.
const EMPTY: u32 = u32::MAX;

/// Deals home stripes round-robin to threads at their first refusal. Relaxed: only the
/// atomicity of the increment matters (two threads get different numbers).
static NEXT_HOME: AtomicUsize = AtomicUsize::new(0);

/// Marks this thread as inside a stripe's lock of one summary (in `refused` or `top`) for
/// as long as it lives: the caller's code run there (a key's `Clone`, `ToOwned`, `Eq`) may
/// check the limiter, and a refusal it makes into the same summary must not wait for a
/// lock its own thread holds. Other summaries (other limiters) are unaffected.
struct Inside(usize);

impl Inside {
    /// `None` if this thread is inside summary `id` already.
    fn enter(id: usize) -> Option<Inside> {
        // `try_with`: during the thread's teardown, record nothing.
        let entered = INSIDE
            .try_with(|inside| {
                let mut inside = inside.borrow_mut();
                let fresh = !inside.contains(&id);
                if fresh {
                    inside.push(id);
                }
                fresh
            })
            .unwrap_or(false);
        entered.then_some(Inside(id))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.borrow_mut().retain(|&id| id != self.0));
    }
}

thread_local! {
    /// The summaries (by address) whose stripe lock this thread holds ([`Inside`]).
    static INSIDE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// This thread's home stripe number (before reduction by the stripe count), or
    /// `usize::MAX` before its first refusal. A `const` cell with no destructor: readable
    /// at any point of the thread's life.
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The current thread's home stripe number.
fn home() -> usize {
    HOME.try_with(|home| {
        let mut number = home.get();
        if number == usize::MAX {
            number = NEXT_HOME.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
            home.set(number);
        }
        number
    })
    .unwrap_or(0)
}

/// A bounded-memory tracker of the keys refused the most, decayed (module docs).
pub(crate) struct Offenders<K> {
    stripes: Box<[CachePadded<Mutex<Stripe<K>>>]>,
    /// Entries per stripe (`m`).
    capacity: usize,
    /// `now` to epochs; `None`: no decay.
    half_life: Option<Divisor>,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Offenders<K> {
    /// `capacity`: keys tracked per stripe (the summary size m; 0 tracks nothing, more than
    /// 2²⁴ is taken as 2²⁴). `half_life`: ns after which a count weighs half (the limiter
    /// passes its longest window); 0 means no decay.
    pub(crate) fn new(capacity: usize, half_life: u64) -> Offenders<K> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Offenders::with_stripes(capacity, half_life, cores)
    }

    /// [`new`](Self::new) with `stripes` stripes (1 to 64) whatever the machine's cores.
    fn with_stripes(capacity: usize, half_life: u64, stripes: usize) -> Offenders<K> {
        let stripes = stripes.clamp(1, MAX_STRIPES);
        Offenders {
            stripes: (0..stripes).map(|_| CachePadded::new(Mutex::new(Stripe::new()))).collect(),
            capacity: capacity.min(MAX_CAPACITY),
            half_life: Divisor::new(half_life),
        }
    }

    /// This summary's identity for [`Inside`]: its address (it does not move while borrowed).
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// A refusal of `units` for `key`, whose 64-bit hash the limiter already computed, at
    /// `now` (ns). Never panics, never drops the units, and waits for another thread only
    /// when every stripe is busy (module docs). Clones the key only when it enters a
    /// summary. `units` of 0 records nothing.
    pub(crate) fn refused<Q>(&self, hash: u64, key: &Q, units: u64, now: u64)
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.capacity == 0 || units == 0 {
            return;
        }
        // A refusal from the caller's code run under a stripe's lock (a key's `Clone` or
        // `Eq` that checks the limiter) is not recorded: it would wait for the lock its own
        // thread holds.
        let epoch = self.epoch(now);
        let evicted = Inside::enter(self.id()).and_then(|_inside| {
            self.stripe().and_then(|mut stripe| stripe.add(hash, key, units, epoch, self.capacity))
        });
        // Dropped once the stripe's lock is given back: a key's `Drop` is the caller's code,
        // which may check the limiter and be refused (and so come back here).
        drop(evicted);
    }

    /// The `n` keys with the most (decayed) refused units as of `now`, most first; ties by
    /// hash. Each count is an upper bound, above the true one by at most `N / m` (module
    /// docs). Keys whose count has decayed to 0 are left out.
    pub(crate) fn top(&self, n: usize, now: u64) -> Vec<(K, u64)> {
        if n == 0 || self.capacity == 0 {
            return Vec::new();
        }
        let epoch = self.epoch(now);
        // One stripe locked at a time (refusals elsewhere go on), copied out and merged
        // outside the locks. The keys' `Clone` runs under them: a refusal it makes into this
        // summary is not recorded, and a `top` it asks for is empty (see `refused`).
        let snapshots: Vec<Snapshot<K>> = {
            let Some(_inside) = Inside::enter(self.id()) else { return Vec::new() };
            self.stripes
                .iter()
                .map(|stripe| {
                    let mut stripe = stripe.lock().unwrap_or_else(PoisonError::into_inner);
                    stripe.catch_up(epoch);
                    stripe.snapshot()
                })
                .collect()
        };
        // Per key: its hash, the sum of its counts, and which stripes hold it.
        let mut merged: HashMap<K, (u64, u64, u64)> = HashMap::new();
        for (number, snapshot) in snapshots.iter().enumerate() {
            let bit = 1u64.checked_shl(number as u32).unwrap_or(0);
            for (key, hash, count) in &snapshot.entries {
                let sum = merged.entry(key.clone()).or_insert((*hash, 0, 0));
                sum.1 = sum.1.saturating_add(*count);
                sum.2 |= bit;
            }
        }
        let mut top: Vec<(K, u64, u64)> = merged
            .into_iter()
            .map(|(key, (hash, mut sum, held))| {
                // Where a stripe does not hold the key, its filter counter bounds the key's
                // units there.
                for (number, snapshot) in snapshots.iter().enumerate() {
                    if held & 1u64.checked_shl(number as u32).unwrap_or(0) == 0 {
                        sum = sum.saturating_add(snapshot.filtered(hash));
                    }
                }
                (key, sum, hash)
            })
            .filter(|&(_, sum, _)| sum > 0)
            .collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        top.truncate(n);
        top.into_iter().map(|(key, sum, _)| (key, sum)).collect()
    }

    /// Heap bytes the structure holds: the stripes and their arrays, not what the keys own
    /// (a `String`'s bytes). At most `stripes · (128 + m · (size_of::<K>() + 40) + 8 ·
    /// index + 8 · filter)` (module docs).
    pub(crate) fn bytes(&self) -> usize {
        let stripes = std::mem::size_of_val::<[CachePadded<Mutex<Stripe<K>>>]>(&self.stripes);
        self.stripes.iter().fold(stripes, |bytes, stripe| {
            bytes.saturating_add(stripe.lock().unwrap_or_else(PoisonError::into_inner).bytes())
        })
    }

    fn epoch(&self, now: u64) -> u64 {
        self.half_life.map_or(0, |half_life| half_life.div_rem(now).0)
    }

    /// A stripe to record into: this thread's home if free, else the first free one after
    /// it, else (every stripe busy) the home, waited for. `None` only if there are no
    /// stripes, which `new` rules out.
    fn stripe(&self) -> Option<MutexGuard<'_, Stripe<K>>> {
        let count = self.stripes.len();
        let home = home().checked_rem(count)?;
        for step in 0..count {
            let number = home.wrapping_add(step).checked_rem(count)?;
            match self.stripes.get(number)?.try_lock() {
                Ok(stripe) => return Some(stripe),
                // Our code does not panic under the lock; a key's `Eq` or `Clone` might, and
                // the stripe is then still well formed, at worst off by that refusal.
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        Some(self.stripes.get(home)?.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Entries created (keys cloned) so far, over all stripes.
    #[cfg(test)]
    fn entered(&self) -> u64 {
        self.stripes.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).entered).sum()
    }

    /// `Σ μ_s` as of now: the most by which a count from `top` exceeds the true count.
    #[cfg(test)]
    fn bound(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| {
                let stripe = s.lock().unwrap_or_else(PoisonError::into_inner);
                if stripe.entries.len() < self.capacity {
                    0
                } else {
                    stripe.heap.first().map_or(0, |root| root.count)
                }
            })
            .sum()
    }
}

/// One stripe's Filtered Space-Saving summary.
struct Stripe<K> {
    /// The epoch its counts are at.
    epoch: u64,
    /// The tracked keys, in no order; an entry's number is stable while its key is tracked.
    entries: Vec<Entry<K>>,
    /// Min-heap of counts, each naming its entry.
    heap: Vec<Node>,
    /// Open-addressed (linear probing) from a hash to an entry number, or [`EMPTY`]; a
    /// power-of-two length at least twice the capacity, so at most half full.
    index: Vec<u32>,
    /// Upper bounds on the units of keys not in the summary, by hash; a power of two long.
    filter: Vec<u64>,
    #[cfg(test)]
    entered: u64,
}

struct Entry<K> {
    key: K,
    hash: u64,
    /// Its node's position in the heap.
    at: u32,
}

#[derive(Clone, Copy)]
struct Node {
    count: u64,
    /// How much of `count` may be other keys' units (what it entered with).
    error: u64,
    entry: u32,
}

/// A stripe copied out for `top`: entries as (key, hash, count), and its filter.
struct Snapshot<K> {
    entries: Vec<(K, u64, u64)>,
    filter: Vec<u64>,
}

impl<K> Snapshot<K> {
    fn filtered(&self, hash: u64) -> u64 {
        self.filter.get(bucket(hash, self.filter.len())).copied().unwrap_or(0)
    }
}

/// The filter counter of `hash` among `len` (a power of two): other bits than the index's.
fn bucket(hash: u64, len: usize) -> usize {
    (hash.rotate_left(32) as usize) & len.wrapping_sub(1)
}

/// `value` halved `halvings` times.
fn halve(value: u64, halvings: u64) -> u64 {
    u32::try_from(halvings).ok().and_then(|h| value.checked_shr(h)).unwrap_or(0)
}

impl<K> Stripe<K> {
    fn new() -> Stripe<K> {
        Stripe {
            epoch: 0,
            entries: Vec::new(),
            heap: Vec::new(),
            index: Vec::new(),
            filter: Vec::new(),
            #[cfg(test)]
            entered: 0,
        }
    }

    /// Allocates the arrays at the first refusal (an untouched stripe holds nothing).
    #[allow(clippy::arithmetic_side_effects, reason = "capacity ≤ MAX_CAPACITY = 2²⁴")]
    fn allocate(&mut self, capacity: usize) {
        if self.index.is_empty() {
            self.entries.reserve_exact(capacity);
            self.heap.reserve_exact(capacity);
            self.index = vec![EMPTY; (2 * capacity).next_power_of_two()];
            self.filter = vec![0; (FILTER_PER_ENTRY * capacity).next_power_of_two()];
        }
    }

    /// Halves everything once per epoch passed since the stripe's (module docs).
    fn catch_up(&mut self, epoch: u64) {
        let Some(halvings) = epoch.checked_sub(self.epoch).filter(|&h| h > 0) else {
            return;
        };
        self.epoch = epoch;
        // Shifting is monotone: the heap stays ordered, and every filter counter stays at
        // most the smallest count.
        for node in &mut self.heap {
            node.count = halve(node.count, halvings);
            node.error = halve(node.error, halvings);
        }
        for counter in &mut self.filter {
            *counter = halve(*counter, halvings);
        }
    }

    fn snapshot(&self) -> Snapshot<K>
    where
        K: Clone,
    {
        let entries = (self.heap.iter())
            .filter(|node| node.count > 0)
            .filter_map(|node| {
                let entry = self.entries.get(node.entry as usize)?;
                Some((entry.key.clone(), entry.hash, node.count))
            })
            .collect();
        Snapshot { entries, filter: self.filter.clone() }
    }

    fn bytes(&self) -> usize {
        use std::mem::size_of;
        let entries = self.entries.capacity().saturating_mul(size_of::<Entry<K>>());
        let heap = self.heap.capacity().saturating_mul(size_of::<Node>());
        let index = self.index.capacity().saturating_mul(size_of::<u32>());
        let filter = self.filter.capacity().saturating_mul(size_of::<u64>());
        entries.saturating_add(heap).saturating_add(index).saturating_add(filter)
    }

    /// Filtered Space-Saving's step (module docs).
    /// Adds `units` to `key`; returns the key an entering key took the place of (for the
    /// caller to drop outside the lock).
    fn add<Q>(&mut self, hash: u64, key: &Q, units: u64, epoch: u64, capacity: usize) -> Option<K>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.catch_up(epoch);
        self.allocate(capacity);
        if let Some(entry) = self.find(hash, key) {
            if let Some(at) = self.entries.get(entry).map(|e| e.at as usize) {
                if let Some(node) = self.heap.get_mut(at) {
                    node.count = node.count.saturating_add(units);
                    self.sift_down(at);
                }
            }
            return None;
        }
        let bucket = bucket(hash, self.filter.len());
        let &filtered = self.filter.get(bucket)?;
        let count = filtered.saturating_add(units);
        if self.entries.len() < capacity {
            // Not full: every filter counter is still 0.
            self.push(key.to_owned(), hash, count, filtered);
            return None;
        }
        let &smallest = self.heap.first()?;
        if count <= smallest.count {
            if let Some(counter) = self.filter.get_mut(bucket) {
                *counter = count;
            }
            return None;
        }
        self.replace(smallest, key.to_owned(), hash, count, filtered)
    }

    /// The entry number of `key`, if tracked.
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mask = self.index.len().wrapping_sub(1);
        let mut slot = hash as usize & mask;
        // At most half full: the probe meets an empty slot.
        for _ in 0..self.index.len() {
            let number = *self.index.get(slot)?;
            if number == EMPTY {
                return None;
            }
            let entry = self.entries.get(number as usize)?;
            if entry.hash == hash && entry.key.borrow() == key {
                return Some(number as usize);
            }
            slot = slot.wrapping_add(1) & mask;
        }
        None
    }

    /// A new entry, while the summary is not full.
    fn push(&mut self, key: K, hash: u64, count: u64, error: u64) {
        let (Ok(number), Ok(at)) = (u32::try_from(self.entries.len()), u32::try_from(self.heap.len())) else {
            return;
        };
        self.entries.push(Entry { key, hash, at });
        self.heap.push(Node { count, error, entry: number });
        self.insert(hash, number);
        self.sift_up(at as usize);
        #[cfg(test)]
        {
            self.entered = self.entered.saturating_add(1);
        }
    }

    /// The smallest entry gives its place to `key`; its count goes to its filter counter,
    /// which then still bounds the units of every key there not in the summary. Returns the
    /// key it held.
    fn replace(&mut self, smallest: Node, key: K, hash: u64, count: u64, error: u64) -> Option<K> {
        let old = self.entries.get(smallest.entry as usize).map(|e| e.hash)?;
        let bucket = bucket(old, self.filter.len());
        if let Some(counter) = self.filter.get_mut(bucket) {
            *counter = (*counter).max(smallest.count);
        }
        self.remove(old, smallest.entry);
        let evicted = self.entries.get_mut(smallest.entry as usize).map(|entry| {
            entry.hash = hash;
            std::mem::replace(&mut entry.key, key)
        });
        if let Some(root) = self.heap.first_mut() {
            root.count = count;
            root.error = error;
        }
        self.insert(hash, smallest.entry);
        self.sift_down(0);
        #[cfg(test)]
        {
            self.entered = self.entered.saturating_add(1);
        }
        evicted
    }

    fn insert(&mut self, hash: u64, number: u32) {
        let mask = self.index.len().wrapping_sub(1);
        let mut slot = hash as usize & mask;
        for _ in 0..self.index.len() {
            match self.index.get_mut(slot) {
                Some(free) if *free == EMPTY => {
                    *free = number;
                    return;
                }
                Some(_) => slot = slot.wrapping_add(1) & mask,
                None => return,
            }
        }
    }

    /// Takes entry `number` (of hash `hash`) out of the index, shifting back the entries
    /// after it in its run so that no probe stops short (no tombstones).
    fn remove(&mut self, hash: u64, number: u32) {
        let mask = self.index.len().wrapping_sub(1);
        let mut hole = hash as usize & mask;
        loop {
            match self.index.get(hole) {
                Some(&n) if n == number => break,
                Some(&n) if n != EMPTY => hole = hole.wrapping_add(1) & mask,
                _ => return,
            }
        }
        let mut next = hole;
        loop {
            next = next.wrapping_add(1) & mask;
            let Some(&moved) = self.index.get(next) else { return };
            if moved == EMPTY || next == hole {
                break;
            }
            let Some(home) = self.entries.get(moved as usize).map(|e| e.hash as usize & mask) else {
                return;
            };
            // `moved` may fill the hole unless its home lies cyclically in (hole, next].
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                if let Some(slot) = self.index.get_mut(hole) {
                    *slot = moved;
                }
                hole = next;
            }
        }
        if let Some(slot) = self.index.get_mut(hole) {
            *slot = EMPTY;
        }
    }

    /// Swaps heap positions `a` and `b`, keeping the entries' positions in step.
    fn swap(&mut self, a: usize, b: usize) {
        if a >= self.heap.len() || b >= self.heap.len() {
            return;
        }
        self.heap.swap(a, b);
        for at in [a, b] {
            let Some(number) = self.heap.get(at).map(|node| node.entry as usize) else { continue };
            if let Some(entry) = self.entries.get_mut(number) {
                entry.at = at as u32;
            }
        }
    }

    fn count_at(&self, at: usize) -> Option<u64> {
        self.heap.get(at).map(|node| node.count)
    }

    #[allow(clippy::arithmetic_side_effects, reason = "at ≥ 1 before subtracting")]
    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            match (self.count_at(at), self.count_at(parent)) {
                (Some(count), Some(above)) if count < above => self.swap(at, parent),
                _ => return,
            }
            at = parent;
        }
    }

    #[allow(clippy::arithmetic_side_effects, reason = "at < heap length ≤ 2²⁴")]
    fn sift_down(&mut self, mut at: usize) {
        while let Some(count) = self.count_at(at) {
            let left = 2 * at + 1;
            let Some(left_count) = self.count_at(left) else { return };
            let (child, child_count) = match self.count_at(left + 1) {
                Some(right_count) if right_count < left_count => (left + 1, right_count),
                _ => (left, left_count),
            };
            if child_count >= count {
                return;
            }
            self.swap(at, child);
            at = child;
        }
    }
}
