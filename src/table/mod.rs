//! The key table: where each key's counters live, found without taking a lock.
//!
//! # Layout
//! The table is [`SHARDS`] shards, chosen by the top bits of the key's hash. A shard is an
//! open-addressed array of slots (linear probing, a power of two long), each slot a pointer
//! to the key's *node*, with 3 bits of the key's hash in the pointer's alignment bits (a
//! probe passes over most other keys' nodes unread). A node is one allocation holding the
//! key's policy version, the key itself and, right behind them, its counters
//! (`[AtomicU64]`, as many words as the policy lays out). A check reads the slot, then the
//! node: no second pointer, and no allocation per key beyond the node.
//!
//! # Reads take no lock and write nothing shared
//! A lookup pins (`grace.rs`: a plain store to this thread's own slot, no locked
//! instruction), loads the shard's array, probes it and compares tags and keys.
//! Everything that changes the table (an insert, a removal, a node replaced, an array
//! rebuilt: `writers.rs`, `memory.rs`) happens under the shard's mutex, which checks never
//! take. A node or an array taken out of the table is freed
//! after a grace period (`grace.rs`), once no pinned reader can still hold it, so a reader never touches
//! freed memory; nodes never move, so a count written into a node is never copied away
//! from under its writer (arrays are rebuilt by copying pointers only).
//!
//! # Removing a key without losing a count
//! A removed or replaced node may still be in use by a check that found it just before.
//! Its counters are retired first ([`KeyState::retire`], `retire_now`, `migrate_at`, under
//! the shard's mutex): a check covers its slot in the state's `touched` before it commits,
//! so a retirement either finds that and fails, or leaves the check nothing to commit, or
//! only lets commits through whose units no longer count (see `protocol/`).
//!
//! # No decision before the table's time
//! A key retired because it expired at time `T` holds units that count before `T`: a
//! check whose clock read an earlier time, delayed across the retirement, must not start
//! the key afresh at its own time, which would forget them. So each shard keeps a *floor*,
//! the latest time at which it took a node out (swept, replaced, moved, or taken out to make
//! room for a new key: `room.rs`), raised under its mutex before the node leaves; an insert creates its node at the floor or later, and
//! a check that finds a node decides at the shard's floor or later ([`Table::floor`]). A
//! check behind the floor then decides at a time that has already passed, where the old
//! units no longer count.
//!
//! # One hash
//! Every path hashes a key the same way, through [`Table::hash`] (a `Hasher` fed by the
//! key's `Hash`): lookups, inserts and the rebuild of an array (which hashes each key again
//! rather than keep 8 bytes of hash per node), so no path can disagree with another about
//! where a key lives.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::PoisonError;

use crossbeam_utils::CachePadded;

use crate::grace::{self, Guard};
use crate::layout::Policy;
use crate::protocol::KeyState;
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

mod memory;
mod room;
mod writers;

use memory::words_at;
pub(crate) use room::Freed;
pub use room::WhenFull;
pub(crate) use writers::{Change, Hooks};

/// Shards per table: a rebuild rehashes one shard's keys (at 1 M keys, about 16 k), during
/// which only inserts into that shard wait; checks never do.
#[cfg(not(slidegate_loom))]
const SHARDS: usize = 64;
/// Under loom, 4: every shard runs the same code under its own mutex, and a model's keys
/// race in the shards that hold them; a sweep's walk through 60 more empty shards would
/// only multiply the interleavings loom explores (each lock a scheduling point).
#[cfg(slidegate_loom)]
const SHARDS: usize = 4;
/// `hash >> SHARD_SHIFT` picks the shard; the low bits pick the slot.
const SHARD_SHIFT: u32 = u64::BITS - SHARDS.trailing_zeros();
/// The shortest array a shard builds.
const SMALLEST: usize = 8;

/// A key's node: this header, then its counters. `repr(C)`, so the counters start at
/// `size_of::<Header<K>>()`, rounded up to 8 (see [`words_at`]). No hash is kept: a lookup
/// compares keys, and a rebuild hashes them again through [`Table::hash`].
#[repr(C)]
struct Header<K> {
    /// The policy version the counters are laid out for, from `Arc::into_raw`: the node holds
    /// one strong count of it. Swapped in place (under the shard's mutex) for a newer version
    /// that lays the counters out the same way (so `words_per_key` never changes in a node's
    /// life); the count of the old one is given back after a grace period, since readers may
    /// still hold it.
    policy: AtomicPtr<Policy>,
    key: K,
}

/// A node found in the table, valid while the guard `'g` it was found under is held.
pub(crate) struct Node<'g, K> {
    ptr: NonNull<Header<K>>,
    _guard: PhantomData<&'g Header<K>>,
}

impl<K> Clone for Node<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Node<'_, K> {}

impl<'g, K> Node<'g, K> {
    fn header(&self) -> &'g Header<K> {
        // SAFETY: `ptr` came from the table under a guard living for `'g` (or from the shard's
        // mutex, which is held); nodes are freed only after a grace period, after every guard
        // pinned while the node was reachable is gone.
        #[allow(unsafe_code)]
        unsafe {
            self.ptr.as_ref()
        }
    }

    /// The key.
    pub(crate) fn key(&self) -> &'g K {
        &self.header().key
    }

    /// The policy version the counters are laid out for now.
    pub(crate) fn policy(&self) -> &'g Policy {
        // Acquire pairs with the Release swap in `Table::repoint` (and the node's
        // initialisation, published by the slot's Release store): the policy is initialised.
        let policy = self.header().policy.load(Ordering::Acquire);
        // SAFETY: the node holds a strong count of its policy, and a policy swapped out is
        // released after a grace period (`repoint`), after every guard that could have loaded it.
        #[allow(unsafe_code)]
        unsafe {
            &*policy
        }
    }

    /// The key's counters, laid out for [`policy`](Self::policy).
    #[inline]
    pub(crate) fn state(&self) -> KeyState<'g> {
        let policy = self.policy();
        // SAFETY: the node was allocated by `new_node` with `policy.words_per_key()`
        // initialised `AtomicU64`s at `words_at::<K>()` bytes in (every policy the node points
        // to has the same layout), within the allocation `ptr` points to (whose provenance
        // covers it all), valid for `'g`.
        #[allow(unsafe_code)]
        let words = unsafe {
            let first = self.ptr.as_ptr().cast::<u8>().add(words_at::<K>());
            std::slice::from_raw_parts(first.cast::<AtomicU64>(), policy.words_per_key())
        };
        KeyState::from_parts(words, policy)
    }
}

/// Nodes are aligned to 8 bytes (the counters' alignment; a key type aligned to more raises
/// it), so a slot keeps 3 bits of the key's hash in the low bits of the node's address: a
/// probe passes over 7 of 8 other keys' nodes without reading them. The tag only filters a
/// probe (keys are compared in full), so the alignment trades memory against probe misses.
/// 16 bytes would keep a 4th bit but pad a node of three words (40 B: a `per_second` limit
/// above 65,534, or two fixed windows) to 48 B, which glibc's malloc serves from a 64 B
/// chunk (48 B here): 16 B more resident per such key, to spare about 0.03 cache misses per
/// check at 1 M keys, which throughput does not show (see the design guide). Nodes whose
/// size is a multiple of 16 (a 10/s one of 32 B, a 60/min one of 112 B) are the same either
/// way.
const NODE_ALIGN: usize = 8;
const TAG_MASK: usize = NODE_ALIGN - 1;

/// The tag of `hash`: bits the shard and slot choice do not use.
#[inline(always)]
fn tag(hash: u64) -> usize {
    // Truncation is the point: 3 bits.
    ((hash >> 32) as usize) & TAG_MASK
}

/// `node` with `tag` in its low bits (byte offsets from the node keep its provenance).
#[inline(always)]
fn tagged<K>(node: *mut Header<K>, tag: usize) -> *mut Header<K> {
    node.cast::<u8>().wrapping_add(tag & TAG_MASK).cast()
}

/// The node a slot's value points to, and the value's tag.
#[inline(always)]
fn untagged<K>(value: *mut Header<K>) -> (*mut Header<K>, usize) {
    let tag = (value as usize) & TAG_MASK;
    (value.cast::<u8>().wrapping_sub(tag).cast(), tag)
}

/// A removed slot: probing goes on past it; an insert may reuse it. (Address 1: no node,
/// 8-aligned, tagged or not, has it.)
fn tombstone<K>() -> *mut Header<K> {
    NonNull::<u8>::dangling().as_ptr().cast()
}

/// One shard's array of slots.
struct Slots<K> {
    mask: usize,
    slots: Box<[AtomicPtr<Header<K>>]>,
}

impl<K> Slots<K> {
    fn with_len(len: usize) -> Slots<K> {
        Slots {
            mask: len.saturating_sub(1),
            slots: (0..len).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
        }
    }

    /// The index of the `i`-th slot [`probe`](Self::probe) yields for `hash`.
    fn index(&self, hash: u64, i: usize) -> usize {
        ((hash as usize) & self.mask).wrapping_add(i) & self.mask
    }

    /// The slots of `hash`'s probe sequence, in order (each slot once).
    fn probe(&self, hash: u64) -> impl Iterator<Item = &AtomicPtr<Header<K>>> {
        // Truncation is the point: the low bits pick the first slot.
        let start = (hash as usize) & self.mask;
        let (tail, head) = self.slots.split_at(start.min(self.slots.len()));
        head.iter().chain(tail)
    }
}

/// The table's hasher: randomly seeded per table (a client choosing keys cannot aim them at
/// one shard or one probe sequence), fixed under loom, whose models must replay exactly.
fn hasher() -> ahash::RandomState {
    #[cfg(not(slidegate_loom))]
    return ahash::RandomState::new();
    #[cfg(slidegate_loom)]
    return ahash::RandomState::with_seeds(1, 2, 3, 4);
}

/// What the shard's mutex guards: its counts, and where a search for room stands
/// (`room.rs`).
struct Counts {
    /// Nodes in the array.
    live: usize,
    /// Slots holding a node or a tombstone (what probing walks through).
    used: usize,
    /// The slot where the next search for room starts: the array's length once the last
    /// slot was passed (that search first ends the lap).
    hand: usize,
    /// The earliest time any node passed in the hand's current lap, or inserted behind
    /// the hand during it, can be idle (`room.rs`).
    lap_min: u64,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { live: 0, used: 0, hand: 0, lap_min: u64::MAX }
    }
}

struct Shard<K> {
    /// From `Box::into_raw`, or null; replaced under the mutex ([`Shard::publish`]).
    slots: AtomicPtr<Slots<K>>,
    writer: Mutex<Counts>,
    /// The latest time (ns) at which a node left this shard, swept, replaced, moved or taken
    /// out to make room (module docs). Raised under the mutex, read by checks without it.
    floor: AtomicU64,
    /// The hash of the key the mutex's holder is inserting (0 once it is done): a check
    /// that finds the table full and the mutex busy waits for the mutex if it is inserting
    /// the same key (or if this shard may hold an idle key: [`Table::insert`]).
    inserting: AtomicU64,
    /// Its place in the table's shards, and in [`Table::hints`].
    index: usize,
}

impl<K> Shard<K> {
    /// The shard's array, if it has one, valid while `guard` lives. `order` is Acquire
    /// for readers (it pairs with the Release of [`publish`](Self::publish)) and Relaxed
    /// under the mutex.
    #[inline]
    fn array<'g>(&'g self, order: Ordering, _guard: &'g Guard) -> Option<&'g Slots<K>> {
        let array = self.slots.load(order);
        // SAFETY: an array comes from `Box::into_raw` and is freed only through the grace
        // period of `publish`, after every guard that was alive while it was reachable has
        // dropped; `_guard` is alive, so the array is too.
        #[allow(unsafe_code)]
        unsafe {
            array.as_ref()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // A panic under the lock cannot leave the array inconsistent (every change is one
        // pointer store), so a poisoned lock is still good.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why [`Table::insert`] did not insert.
pub(crate) enum Refused {
    /// The table holds its `max_keys`.
    Full,
}

/// The key table. See the module docs.
pub(crate) struct Table<K> {
    shards: Box<[CachePadded<Shard<K>>; SHARDS]>,
    hasher: ahash::RandomState,
    /// Keys held, kept by insert and remove so that `len()` and `max_keys` cost O(1); never
    /// above `max_keys` (a key is counted before it is inserted, and only if there is room).
    live: AtomicUsize,
    max_keys: usize,
    /// What a full table does when no held key is idle.
    when_full: WhenFull,
    /// Per shard, a time (ns) before which none of its keys is idle: hints for the search
    /// for room in a full table (`room.rs`), each written under its shard's mutex and read
    /// without it; side by side, so that a search reads them all in a few lines.
    hints: CachePadded<[AtomicU64; SHARDS]>,
}

impl<K> Table<K> {
    /// The shard `hash` falls in (for the loom models and tests, which need keys that share
    /// one).
    pub(crate) fn shard_index(hash: u64) -> usize {
        // At most SHARDS - 1.
        (hash >> SHARD_SHIFT) as usize
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        // Relaxed: a counter; the shards' mutexes order the table itself.
        self.live.load(Ordering::Relaxed)
    }

    /// The most keys the table holds.
    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Is the table at `max_keys`? (A hint: `insert` decides under the shard's mutex.)
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max_keys
    }

    /// Frees what waits for a grace period and can be freed now: after a sweep, so that the
    /// memory of the keys it evicted comes back at once rather than at a later collection.
    /// Each flush advances the epoch if every pinned thread allows it and frees what two
    /// advances have made safe; pinned checks only postpone it to the next sweep.
    pub(crate) fn settle() {
        for _ in 0..4 {
            grace::pin().flush();
        }
    }

    /// How many shards [`sweep_shard`](Self::sweep_shard) walks.
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    pub(crate) fn new(max_keys: usize, when_full: WhenFull) -> Table<K> {
        // An array, not a slice: a shard's index, below SHARDS, needs no bounds check.
        let shards = Box::new(std::array::from_fn(|index| {
            CachePadded::new(Shard {
                slots: AtomicPtr::new(ptr::null_mut()),
                writer: Mutex::new(Counts::default()),
                floor: AtomicU64::new(0),
                inserting: AtomicU64::new(0),
                index,
            })
        }));
        // No key yet: none idle before the end of time.
        let hints = CachePadded::new(std::array::from_fn(|_| AtomicU64::new(u64::MAX)));
        Table { shards, hasher: hasher(), live: AtomicUsize::new(0), max_keys, when_full, hints }
    }

    /// The hash of `key`, the same for every path (see the module docs).
    #[inline]
    #[allow(
        clippy::manual_hash_one,
        reason = "ahash's own `hash_one` is specialised per type on nightly; the Hasher path is the same for every caller"
    )]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        key.hash(&mut hasher);
        hasher.finish()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K> {
        #[allow(
            clippy::indexing_slicing,
            reason = "hash >> SHARD_SHIFT is below 2^(64 - SHARD_SHIFT) = SHARDS"
        )]
        &self.shards[(hash >> SHARD_SHIFT) as usize]
    }

    /// The shard floor of `hash` (module docs): a check that found a node in the shard (or,
    /// after `insert`, `update` or their mutex, none) decides at this time or later.
    ///
    /// Relaxed: the floor is raised under the shard's mutex before a node leaves the table
    /// (`update`, `sweep_shard`), so whoever took the mutex since, and whoever found a node
    /// that such a holder published (the Release store of its slot, read by `get`'s
    /// Acquire load), happens after the raise and reads it or a later value (coherence,
    /// on every memory model). A check that still finds the old node decides on that node,
    /// whose retirement protocol covers it.
    ///
    /// Acquire pairs with the Release of `raise_floor`: a check that reads a floor raised
    /// by another shard's holder (`check_all` and `check_many` raise `now` to the floor of
    /// every key's shard, then commit in all of them) has that holder's clock reading
    /// happen-before its commit, and so before a move that carries the commit and reads the
    /// clock after it (`KeyState::migrate_at`): the move is never timed before the commit.
    /// (A plain load on x86.)
    #[inline]
    pub(crate) fn floor(&self, hash: u64) -> u64 {
        self.shard(hash).floor.load(Ordering::Acquire)
    }

    /// The node of `key`, if held.
    #[inline]
    pub(crate) fn get<'g, Q>(&'g self, hash: u64, key: &Q, guard: &'g Guard) -> Option<Node<'g, K>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slots = self.shard(hash).array(Ordering::Acquire, guard)?;
        Self::find(slots, hash, key, Ordering::Acquire).map(|(_, node)| node)
    }

    /// Probes `slots` for `key`: its slot and node. `order` is Acquire for readers (it pairs
    /// with the Release store that published the node) and Relaxed under the mutex.
    #[inline]
    fn find<'g, Q>(
        slots: &'g Slots<K>,
        hash: u64,
        key: &Q,
        order: Ordering,
    ) -> Option<(&'g AtomicPtr<Header<K>>, Node<'g, K>)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let want = tag(hash);
        for slot in slots.probe(hash) {
            let found = slot.load(order);
            if found.is_null() {
                return None;
            }
            let (ptr, tag) = untagged(found);
            if tag != want || found == tombstone() {
                continue;
            }
            let Some(ptr) = NonNull::new(ptr) else { continue };
            let node = Node { ptr, _guard: PhantomData };
            if node.header().key.borrow() == key {
                return Some((slot, node));
            }
        }
        None
    }
}
