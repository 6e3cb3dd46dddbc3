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
//! A lookup pins `crossbeam-epoch` (a compare-and-swap on this thread's own epoch slot;
//! one pin in 128 also tries to advance the global epoch, the one shared write a read can
//! make, amortised), loads the shard's array, probes it and compares tags and keys. Everything that changes the table
//! (an insert, a removal, a node replaced, an array rebuilt) happens under the shard's
//! mutex, which checks never take. A node or an array taken out of the table is freed
//! through the epoch once no pinned reader can still hold it, so a reader never touches
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
//! the latest time at which it took a node out (swept, replaced or moved), raised under
//! its mutex before the node leaves; an insert creates its node at the floor or later, and
//! a check that finds a node decides at the shard's floor or later ([`Table::floor`]). A
//! check behind the floor then decides at a time that has already passed, where the old
//! units no longer count.
//!
//! # One hash
//! Every path hashes a key the same way, through [`Table::hash`] (a `Hasher` fed by the
//! key's `Hash`): lookups, inserts and the rebuild of an array (which hashes each key again
//! rather than keep 8 bytes of hash per node), so no path can disagree with another about
//! where a key lives.

use std::alloc::{self, Layout};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::{Arc, PoisonError, TryLockError};

use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use crossbeam_utils::CachePadded;

use crate::layout::{fill_initial, initial_words, Policy};
use crate::protocol::{KeyState, OwnedState};
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

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
    /// life); the count of the old one is given back through the epoch, since readers may
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
        // mutex, which is held); nodes are freed only through the epoch, after every guard
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
        // released through the epoch (`repoint`), after every guard that could have loaded it.
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

/// The allocation of a node with `words` counters: the header, then the counters.
fn layout<K>(words: usize) -> Option<Layout> {
    let header = Layout::new::<Header<K>>().align_to(NODE_ALIGN).ok()?;
    let (layout, _) = header.extend(Layout::array::<AtomicU64>(words).ok()?).ok()?;
    Some(layout.pad_to_align())
}

/// Nodes are aligned to 8 bytes (the counters' alignment; a key type aligned to more raises
/// it), so a slot keeps 3 bits of the key's hash in the low bits of the node's address: a
/// probe passes over 7 of 8 other keys' nodes without reading them. The tag only filters a
/// probe (keys are compared in full), so the alignment trades memory against probe misses.
/// 16 bytes would keep a 4th bit but pad a 10/s node from 40 to 48 B and a 60/min one from
/// 168 to 176 B, which glibc's malloc rounds to 64 and 192 B chunks (48 and 176 B here): 16 B
/// more resident per key, to spare about 0.03 cache misses per check at 1 M keys, which
/// throughput does not show (see the design guide).
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

/// Where a node's counters start: the header's size rounded up to an `AtomicU64`'s alignment
/// (what `Layout::extend` computes in [`layout`]: the header's layout is aligned to
/// [`NODE_ALIGN`], which changes its alignment, not its size).
#[inline(always)]
const fn words_at<K>() -> usize {
    let align = std::mem::align_of::<AtomicU64>();
    std::mem::size_of::<Header<K>>().next_multiple_of(align)
}

/// A new node for `key`: counters holding `words`, laid out for `policy`.
fn new_node<K>(key: K, policy: Arc<Policy>, words: &[u64]) -> *mut Header<K> {
    // At most MAX_LIMITS limits of at most MAX_SLOTS slots: the layout always exists.
    let Some(layout) = layout::<K>(words.len()) else { std::process::abort() };
    // SAFETY: `layout` has a non-zero size (the header holds a u64). The header is written at
    // the start and the counters right behind it, each exactly once, before the pointer is
    // returned; `free_node` reads them back with the same layout.
    #[allow(unsafe_code)]
    unsafe {
        let raw = alloc::alloc(layout);
        if raw.is_null() {
            alloc::handle_alloc_error(layout);
        }
        let header = raw.cast::<Header<K>>();
        let policy = AtomicPtr::new(Arc::into_raw(policy).cast_mut());
        header.write(Header { policy, key });
        let first = raw.add(words_at::<K>()).cast::<AtomicU64>();
        for (i, &word) in words.iter().enumerate() {
            first.add(i).write(AtomicU64::new(word));
        }
        header
    }
}

/// Frees a node no one can reach any more.
///
/// # Safety
/// `node` came from [`new_node`], is in no table, and no guard that could have found it
/// (or a reference to it) is alive.
#[allow(unsafe_code)]
unsafe fn free_node<K>(node: *mut Header<K>) {
    // SAFETY: per the contract, the node is initialised and ours alone; its policy lays out
    // as many words as `new_node` wrote.
    unsafe {
        let policy = Arc::from_raw((*node).policy.load(Ordering::Relaxed).cast_const());
        let words = policy.words_per_key();
        drop(policy);
        let first = node.cast::<u8>().add(words_at::<K>()).cast::<AtomicU64>();
        for i in 0..words {
            ptr::drop_in_place(first.add(i));
        }
        ptr::drop_in_place(node);
        if let Some(layout) = layout::<K>(words) {
            alloc::dealloc(node.cast::<u8>(), layout);
        }
    }
}

/// A pointer that may cross to the thread that runs the epoch's deferred functions.
struct SendPtr<T>(*mut T);
// SAFETY: it only carries a node or a policy to the function that frees it, which may run
// on another thread: sound for what may be sent (a node holds its key and a policy).
#[allow(unsafe_code)]
unsafe impl<T: Send> Send for SendPtr<T> {}

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

/// What the shard's mutex guards: its counts.
#[derive(Default)]
struct Counts {
    /// Nodes in the array.
    live: usize,
    /// Slots holding a node or a tombstone (what probing walks through).
    used: usize,
}

struct Shard<K> {
    slots: Atomic<Slots<K>>,
    writer: Mutex<Counts>,
    /// The latest time (ns) at which a node left this shard, swept, replaced or moved
    /// (module docs). Raised under the mutex, read by checks without it.
    floor: AtomicU64,
    /// The hash of the key the mutex's holder is inserting (0 once it is done): a check
    /// that finds the table full and the mutex busy waits for the mutex only if it is
    /// inserting the same key ([`Table::insert`]).
    inserting: AtomicU64,
}

impl<K> Shard<K> {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // A panic under the lock cannot leave the array inconsistent (every change is one
        // pointer store), so a poisoned lock is still good.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Why [`Table::insert`] did not insert.
pub(crate) enum Refused {
    /// The table holds its `max_keys`.
    Full,
}

/// The key table. See the module docs.
pub(crate) struct Table<K> {
    shards: Box<[CachePadded<Shard<K>>]>,
    hasher: ahash::RandomState,
    /// Keys held, kept by insert and remove so that `len()` and `max_keys` cost O(1); never
    /// above `max_keys` (a key is counted before it is inserted, and only if there is room).
    live: AtomicUsize,
    max_keys: usize,
}

impl<K> Table<K> {
    /// The shard `hash` falls in (for the loom models, which need keys that share one).
    #[cfg(slidegate_loom)]
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

    /// Frees what the epoch holds and can free now: after a sweep, so that the memory of the
    /// keys it evicted comes back at once rather than as later checks collect it. Each
    /// flush advances the epoch if every pinned thread allows it and frees what two
    /// advances have made safe; pinned checks only postpone it to the next sweep.
    pub(crate) fn settle() {
        for _ in 0..4 {
            epoch::pin().flush();
        }
    }

    /// How many shards [`sweep_shard`](Self::sweep_shard) walks.
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    pub(crate) fn new(max_keys: usize) -> Table<K> {
        let shards = (0..SHARDS)
            .map(|_| {
                CachePadded::new(Shard {
                    slots: Atomic::null(),
                    writer: Mutex::new(Counts::default()),
                    floor: AtomicU64::new(0),
                    inserting: AtomicU64::new(0),
                })
            })
            .collect();
        Table { shards, hasher: hasher(), live: AtomicUsize::new(0), max_keys }
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
        // Acquire pairs with the Release store that published the array (`rebuild`).
        let slots = self.shard(hash).slots.load(Ordering::Acquire, guard);
        // SAFETY: an array is freed only through the epoch once unreachable; we are pinned.
        #[allow(unsafe_code)]
        let slots = unsafe { slots.as_ref() }?;
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

    /// Inserts a node for `key` with a fresh state at `now`, or at the shard's floor if that
    /// is later, under the policy `policy_of` chooses (called under the shard's mutex, with
    /// the owned key), unless the key is held already; either way, the key's node. Refused
    /// when the table holds `max_keys` keys.
    pub(crate) fn insert<'g, Q>(
        &'g self,
        hash: u64,
        key: &Q,
        now: u64,
        guard: &'g Guard,
        policy_of: impl FnOnce(&K) -> Arc<Policy>,
    ) -> Result<Node<'g, K>, Refused>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(hash);
        // Acquire: pairs with the Release reservation below, of the insert that filled the
        // table (see `TryLockError::WouldBlock`).
        let mut counts = if self.live.load(Ordering::Acquire) >= self.max_keys {
            // A full table refuses a new key without waiting for the shard's mutex: under a key
            // spray that is nearly every request, and the legitimate keys' inserts into the
            // same shard must not queue behind it. A free mutex is still taken, so a key that
            // another thread inserted meanwhile is found rather than refused.
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
                    // that reservation, the table was full without this key: refusing it
                    // is the answer at that moment. Any other key is refused at once.
                    if shard.inserting.load(Ordering::Acquire) == hash {
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
        let current = shard.slots.load(Ordering::Relaxed, guard);
        // SAFETY: as in `get`.
        #[allow(unsafe_code)]
        if let Some(current) = unsafe { current.as_ref() } {
            if let Some((_, node)) = Self::find(current, hash, key, Ordering::Relaxed) {
                return Ok(node);
            }
        }
        // Release: pairs with the Acquire load of a check that finds the mutex busy (above).
        shard.inserting.store(hash, Ordering::Release);
        // Counted before it is inserted, and only if there is room: `len()` never exceeds
        // `max_keys`, and no insert is refused for another's passing count. Release: pairs
        // with the Acquire load of the count above, publishing the hint just stored.
        let reserved = self.live.fetch_update(Ordering::Release, Ordering::Relaxed, |live| {
            (live < self.max_keys).then(|| live.saturating_add(1))
        });
        if reserved.is_err() {
            // Release: as the clearing store below (nothing was published).
            shard.inserting.store(0, Ordering::Release);
            return Err(Refused::Full);
        }
        // Relaxed: under the mutex, which orders every writer of the floor.
        let now = now.max(shard.floor.load(Ordering::Relaxed));
        // The caller's code runs next (`to_owned`, `Hash` and `Eq` in `policy_of`): if it
        // panics, the room reserved is given back.
        let reservation = Reservation(&self.live);
        let owned = key.to_owned();
        let policy = policy_of(&owned);
        std::mem::forget(reservation);
        // Grown (or rebuilt) only now, for a key that is really going in.
        let slots = self.slots_for_insert(shard, &mut counts, guard);
        // Small layouts (one limit of up to ~30 slots) start on the stack: no allocation
        // beyond the node.
        let mut small = [0u64; 32];
        let node = match small.get_mut(..policy.words_per_key()) {
            Some(words) => {
                fill_initial(&policy, now, words);
                new_node(owned, policy, words)
            }
            None => {
                let words = initial_words(&policy, now);
                new_node(owned, policy, &words)
            }
        };
        let mut free = None;
        for slot in slots.probe(hash) {
            // Relaxed: under the mutex, which orders every writer.
            let here = slot.load(Ordering::Relaxed);
            if here.is_null() || here == tombstone() {
                free = Some((slot, here.is_null()));
                break;
            }
        }
        // `slots_for_insert` leaves at least one empty slot.
        let Some((slot, was_empty)) = free else { std::process::abort() };
        // Release pairs with the readers' Acquire load in `find`: the node's header and
        // counters, written above, are visible to whoever finds the node.
        slot.store(tagged(node, tag(hash)), Ordering::Release);
        // Release: a check that reads this (the mutex busy, the table full) then finds the
        // node stored just above.
        shard.inserting.store(0, Ordering::Release);
        counts.live = counts.live.saturating_add(1);
        if was_empty {
            counts.used = counts.used.saturating_add(1);
        }
        // SAFETY: just stored; `new_node` never returns null.
        let ptr = NonNull::new(node).unwrap_or_else(|| std::process::abort());
        Ok(Node { ptr, _guard: PhantomData })
    }

    /// The shard's array, grown or rebuilt first if one more node would fill it past 3/4.
    fn slots_for_insert<'g>(&self, shard: &Shard<K>, counts: &mut Counts, guard: &'g Guard) -> &'g Slots<K> {
        // Relaxed: under the mutex, which orders every writer of the array pointer.
        let current = shard.slots.load(Ordering::Relaxed, guard);
        // SAFETY: as in `get` (and only this mutex's holder replaces it).
        #[allow(unsafe_code)]
        let len = unsafe { current.as_ref() }.map_or(0, |s| s.slots.len());
        if counts.used.saturating_add(1).saturating_mul(4) > len.saturating_mul(3) {
            // Room for twice the live keys: a rebuild then happens after as many inserts again.
            let wanted = counts.live.saturating_add(1).saturating_mul(2).max(SMALLEST).next_power_of_two();
            self.rebuild(shard, counts, wanted, guard);
        }
        let current = shard.slots.load(Ordering::Relaxed, guard);
        // SAFETY: as above; `rebuild` always leaves an array.
        #[allow(unsafe_code)]
        unsafe { current.as_ref() }.unwrap_or_else(|| std::process::abort())
    }

    /// Replaces the shard's array with one of `len` slots holding the same nodes (and no
    /// tombstones). Under the shard's mutex.
    fn rebuild(&self, shard: &Shard<K>, counts: &mut Counts, len: usize, guard: &Guard) {
        let fresh = Slots::with_len(len);
        let old = shard.slots.load(Ordering::Relaxed, guard);
        // SAFETY: as in `get`.
        #[allow(unsafe_code)]
        if let Some(old) = unsafe { old.as_ref() } {
            // Nodes are scattered: hashing a key is a cache miss. Batches of nodes are hashed
            // in a loop of independent loads, so that the CPU overlaps their misses, before
            // any of them is placed.
            const BATCH: usize = 16;
            let mut nodes = old
                .slots
                .iter()
                .map(|slot| slot.load(Ordering::Relaxed))
                .filter(|&value| !value.is_null() && value != tombstone());
            loop {
                let mut batch = [(ptr::null_mut(), 0u64); BATCH];
                let mut n = 0usize;
                for (entry, value) in batch.iter_mut().zip(nodes.by_ref()) {
                    // SAFETY: a node in the array under the mutex is alive.
                    #[allow(unsafe_code)]
                    let hash = self.hash(unsafe { &(*untagged(value).0).key });
                    *entry = (value, hash);
                    n = n.saturating_add(1);
                }
                for &(value, hash) in batch.iter().take(n) {
                    if let Some(free) = fresh.probe(hash).find(|s| s.load(Ordering::Relaxed).is_null()) {
                        free.store(value, Ordering::Relaxed);
                    }
                }
                if n < BATCH {
                    break;
                }
            }
        }
        counts.used = counts.live;
        // Release pairs with the readers' Acquire load of the array: its slots, written above,
        // are visible to whoever loads it (the nodes themselves were published before).
        let old = shard.slots.swap(Owned::new(fresh), Ordering::Release, guard);
        if !old.is_null() {
            // SAFETY: unreachable from now on; readers pinned before may still probe it, and
            // the epoch frees it only after they unpin. (Its nodes live on in the new array.)
            #[allow(unsafe_code)]
            unsafe {
                guard.defer_destroy(old);
            }
        }
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
        let slots = shard.slots.load(Ordering::Relaxed, guard);
        // SAFETY: as in `get`.
        #[allow(unsafe_code)]
        let Some(slots) = (unsafe { slots.as_ref() }) else {
            return false;
        };
        let Some((slot, node)) = Self::find(slots, hash, key, Ordering::Relaxed) else { return false };
        // Relaxed: under the mutex, which orders every writer of the floor.
        let now = now.max(shard.floor.load(Ordering::Relaxed));
        let change = change(node, now);
        Self::raise_floor(shard, &change, now);
        let retired = self.apply(slot, node, change, &mut counts, guard);
        drop(counts);
        if let Some(node) = retired {
            Self::retire_nodes(vec![node], guard);
            // Hand the retired node to the epoch now rather than leave it in this thread's
            // bag (a node can be kilobytes, and this thread may go idle).
            guard.flush();
        }
        true
    }

    /// Before a node leaves the shard (`change` replaces or removes it): the floor rises to
    /// `now`, the time of its retirement (under the mutex; see [`floor`](Self::floor)).
    fn raise_floor(shard: &Shard<K>, change: &Change, now: u64) {
        let at = match change {
            Change::Replace(_, at) => now.max(*at),
            Change::Remove => now,
            Change::Keep | Change::Repoint(_) => return,
        };
        // Release pairs with the Acquire load in `floor` (see there); within the shard the
        // mutex and the slot store that follows (Release for a replacement) publish it.
        shard.floor.fetch_max(at, Ordering::Release);
    }

    fn apply(
        &self,
        slot: &AtomicPtr<Header<K>>,
        node: Node<'_, K>,
        change: Change,
        counts: &mut Counts,
        guard: &Guard,
    ) -> Option<SendPtr<Header<K>>> {
        match change {
            Change::Keep => None,
            Change::Repoint(newer) => {
                let newer = Arc::into_raw(newer).cast_mut();
                // Release pairs with the Acquire load in `Node::policy`: the new version is
                // initialised for whoever loads it.
                let old = node.header().policy.swap(newer, Ordering::Release);
                let old = SendPtr(old);
                // SAFETY: readers pinned before the swap may still use the old version; the
                // epoch drops the node's count of it after they unpin.
                #[allow(unsafe_code)]
                unsafe {
                    guard.defer_unchecked(move || {
                        let old = old;
                        drop(Arc::from_raw(old.0.cast_const()));
                    });
                }
                None
            }
            Change::Replace(state, _) => {
                let (policy, words) = state.into_parts();
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
    /// function for the lot (a sweep's thousands of nodes are one entry of the epoch's
    /// queue, freed at its next collection rather than a bag of 64 at a time).
    fn retire_nodes(dead: Vec<SendPtr<Header<K>>>, guard: &Guard) {
        if dead.is_empty() {
            return;
        }
        // SAFETY: the nodes are in no array any more; readers pinned before may still hold
        // them, and the epoch runs this after they unpin.
        #[allow(unsafe_code)]
        unsafe {
            guard.defer_unchecked(move || {
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
        let guard = epoch::pin();
        let mut counts = shard.lock();
        let slots = shard.slots.load(Ordering::Relaxed, &guard);
        // SAFETY: as in `get`.
        #[allow(unsafe_code)]
        let Some(slots) = (unsafe { slots.as_ref() }) else {
            return 0;
        };
        let mut dead = Vec::new();
        for slot in slots.slots.iter() {
            let found = slot.load(Ordering::Relaxed);
            let Some(ptr) = NonNull::new(untagged(found).0).filter(|_| found != tombstone()) else {
                continue;
            };
            let node = Node { ptr, _guard: PhantomData };
            let change = change(node);
            Self::raise_floor(shard, &change, now);
            dead.extend(self.apply(slot, node, change, &mut counts, &guard));
        }
        let removed = dead.len();
        Self::retire_nodes(dead, &guard);
        let len = slots.slots.len();
        let tombstones = counts.used.saturating_sub(counts.live);
        if counts.live == 0 {
            // An empty shard gives its array back too (the table then holds nothing but its
            // shards, as when new).
            counts.used = 0;
            let old = shard.slots.swap(epoch::Shared::null(), Ordering::Release, &guard);
            // SAFETY: unreachable from now on (readers that load null find nothing); readers
            // pinned before may still probe it, and the epoch frees it after they unpin.
            #[allow(unsafe_code)]
            unsafe {
                guard.defer_destroy(old);
            }
        } else if len > SMALLEST && counts.live.saturating_mul(8) <= len {
            let wanted = counts.live.saturating_mul(2).max(SMALLEST).next_power_of_two();
            self.rebuild(shard, &mut counts, wanted, &guard);
        } else if tombstones.saturating_mul(4) >= len && tombstones > 0 {
            self.rebuild(shard, &mut counts, len, &guard);
        }
        drop(counts);
        // Hand what this sweep freed to the epoch now, so memory comes back promptly.
        guard.flush();
        removed
    }

    /// Every node, for a table no one else can use any more (its owner is dropping it).
    pub(crate) fn for_each_exclusive(&mut self, mut f: impl FnMut(Node<'_, K>)) {
        // SAFETY: `&mut self`: no other thread can reach the table.
        #[allow(unsafe_code)]
        let guard = unsafe { epoch::unprotected() };
        for shard in self.shards.iter() {
            let slots = shard.slots.load(Ordering::Relaxed, guard);
            // SAFETY: exclusive access.
            #[allow(unsafe_code)]
            let Some(slots) = (unsafe { slots.as_ref() }) else {
                continue;
            };
            for slot in slots.slots.iter() {
                let found = slot.load(Ordering::Relaxed);
                if let Some(ptr) = NonNull::new(untagged(found).0).filter(|_| found != tombstone()) {
                    f(Node { ptr, _guard: PhantomData });
                }
            }
        }
    }
}

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

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader is left, so nodes and arrays are freed at once.
        #[allow(unsafe_code)]
        let guard = unsafe { epoch::unprotected() };
        for shard in self.shards.iter() {
            let slots = shard.slots.swap(epoch::Shared::null(), Ordering::Relaxed, guard);
            if slots.is_null() {
                continue;
            }
            // SAFETY: exclusive access; the array and its nodes are ours to free.
            #[allow(unsafe_code)]
            unsafe {
                let slots = slots.into_owned();
                for slot in slots.slots.iter() {
                    let value = slot.load(Ordering::Relaxed);
                    if !value.is_null() && value != tombstone() {
                        free_node(untagged(value).0);
                    }
                }
            }
        }
    }
}
