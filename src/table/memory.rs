//! Nodes and arrays in memory: a node's allocation (its header, then its counters), its
//! freeing, the rebuild of a shard's array, and freeing everything when the table is dropped.

use std::alloc::{self, Layout};
use std::hash::Hash;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::grace::Guard;
use crate::layout::Policy;
use crate::sync::{AtomicPtr, AtomicU64, Ordering};

use super::{tombstone, untagged, Counts, Header, Node, Shard, Slots, Table, NODE_ALIGN, SMALLEST};

/// The allocation of a node with `words` counters: the header, then the counters.
fn layout<K>(words: usize) -> Option<Layout> {
    let header = Layout::new::<Header<K>>().align_to(NODE_ALIGN).ok()?;
    let (layout, _) = header.extend(Layout::array::<AtomicU64>(words).ok()?).ok()?;
    Some(layout.pad_to_align())
}

/// Where a node's counters start: the header's size rounded up to an `AtomicU64`'s alignment
/// (what `Layout::extend` computes in [`layout`]: the header's layout is aligned to
/// [`NODE_ALIGN`], which changes its alignment, not its size).
#[inline(always)]
pub(super) const fn words_at<K>() -> usize {
    let align = std::mem::align_of::<AtomicU64>();
    std::mem::size_of::<Header<K>>().next_multiple_of(align)
}

/// A new node for `key`: counters holding `words`, laid out for `policy`.
pub(super) fn new_node<K>(key: K, policy: Arc<Policy>, words: &[u64]) -> *mut Header<K> {
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
pub(super) unsafe fn free_node<K>(node: *mut Header<K>) {
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

/// A pointer that may cross to the thread that runs the deferred functions of a grace period.
pub(super) struct SendPtr<T>(pub(super) *mut T);
// SAFETY: it only carries a node, an array or a policy to the function that frees it, which
// may run on another thread: sound for what may be sent (a node holds its key and a policy).
#[allow(unsafe_code)]
unsafe impl<T: Send> Send for SendPtr<T> {}

impl<K: Send + Sync + 'static> Shard<K> {
    /// Makes `fresh` (or no array) the shard's array, and frees the one it replaces after a
    /// grace period. Under the mutex.
    pub(super) fn publish(&self, fresh: Option<Slots<K>>, guard: &Guard) {
        let fresh = fresh.map_or(ptr::null_mut(), |slots| Box::into_raw(Box::new(slots)));
        // Release pairs with the readers' Acquire load of the array (`Shard::array`): its
        // slots, written before, are visible to whoever loads it (the nodes were published
        // before that). A reader that loads null finds nothing.
        let old = SendPtr(self.slots.swap(fresh, Ordering::Release));
        if old.0.is_null() {
            return;
        }
        // SAFETY: unreachable from now on; readers pinned before may still probe it, and the
        // grace period frees it (not its nodes, which the new array holds, or which were
        // retired on their own) only after they unpin.
        #[allow(unsafe_code)]
        unsafe {
            guard.defer_large(move || {
                let old = old;
                drop(Box::from_raw(old.0));
            });
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Table<K> {
    /// The shard's array, grown or rebuilt first if one more node would fill it past 3/4.
    pub(super) fn slots_for_insert<'g>(
        &self,
        shard: &'g Shard<K>,
        counts: &mut Counts,
        guard: &'g Guard,
    ) -> &'g Slots<K> {
        // Relaxed: under the mutex, which orders every writer of the array pointer.
        let len = shard.array(Ordering::Relaxed, guard).map_or(0, |s| s.slots.len());
        if counts.used.saturating_add(1).saturating_mul(4) > len.saturating_mul(3) {
            // Room for twice the live keys: a rebuild then happens after as many inserts again.
            let wanted = counts.live.saturating_add(1).saturating_mul(2).max(SMALLEST).next_power_of_two();
            self.rebuild(shard, counts, wanted, guard);
        }
        // `rebuild` always leaves an array.
        shard.array(Ordering::Relaxed, guard).unwrap_or_else(|| std::process::abort())
    }

    /// Replaces the shard's array with one of `len` slots holding the same nodes (and no
    /// tombstones). Under the shard's mutex.
    pub(super) fn rebuild(&self, shard: &Shard<K>, counts: &mut Counts, len: usize, guard: &Guard) {
        counts.moved();
        let fresh = Slots::with_len(len);
        if let Some(old) = shard.array(Ordering::Relaxed, guard) {
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
        // Its nodes live on in the new array.
        shard.publish(Some(fresh), guard);
    }

    /// Every node of shard `index`, read as a check reads the table (no lock, under
    /// `guard`): a node inserted or removed during the walk may be met or not; every node
    /// held throughout is met once (an array rebuilt meanwhile is not followed: the walk
    /// reads the array it loaded, whose nodes stay valid under the guard).
    #[cfg(feature = "serde")]
    pub(crate) fn for_each_in_shard<'g>(
        &'g self,
        index: usize,
        guard: &'g Guard,
        mut f: impl FnMut(Node<'g, K>),
    ) {
        let Some(shard) = self.shards.get(index) else { return };
        // Acquire: as in `get` (pairs with `publish`'s Release).
        let Some(slots) = shard.array(Ordering::Acquire, guard) else { return };
        for slot in slots.slots.iter() {
            // Acquire: as in `find` (pairs with the Release store that published the node).
            let found = slot.load(Ordering::Acquire);
            if let Some(ptr) = NonNull::new(untagged(found).0).filter(|_| found != tombstone()) {
                f(Node { ptr, _guard: PhantomData });
            }
        }
    }

    /// Every node, for a table no one else can use any more (its owner is dropping it).
    pub(crate) fn for_each_exclusive(&mut self, mut f: impl FnMut(Node<'_, K>)) {
        for shard in self.shards.iter() {
            let slots = shard.slots.load(Ordering::Relaxed);
            // SAFETY: `&mut self`: no other thread can reach the table, so the array (from
            // `Box::into_raw`, freed only by `publish` or `drop`) is alive while this runs.
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

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        for shard in self.shards.iter() {
            let slots = shard.slots.swap(ptr::null_mut(), Ordering::Relaxed);
            if slots.is_null() {
                continue;
            }
            // SAFETY: `&mut self`: no reader is left, so the array (from `Box::into_raw`)
            // and its nodes are ours to free at once.
            #[allow(unsafe_code)]
            unsafe {
                let slots = Box::from_raw(slots);
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

/// Asks the processor to start loading the lines a sweep reads of the node at `ptr` (its
/// policy pointer and `touched`), so that a shard's walk has several nodes' cache misses in
/// flight at once instead of one after another. A hint: it reads nothing the program sees
/// and never faults, whatever `ptr` is (a tombstone, a node freed since), so any value
/// loaded from a slot will do.
#[cfg(not(slidegate_loom))]
#[inline(always)]
pub(super) fn prefetch_node<K>(ptr: *const Header<K>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let touched = ptr.cast::<u8>().wrapping_add(words_at::<K>());
        // SAFETY: `prefetch` has no effect the program can observe and does not fault on
        // any address (Intel SDM, PREFETCHh); SSE, which it needs, is in every x86_64.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ptr.cast());
            _mm_prefetch::<_MM_HINT_T0>(touched.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
