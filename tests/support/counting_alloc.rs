//! A global allocator that counts: allocations made, live heap bytes and their high-water
//! mark. Shared by the allocation guard (`tests/alloc.rs`) and the memory reports
//! (`tools/src/bin/memory.rs`, `spray.rs`, `churn.rs`), each of which installs it with
//! `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// Allocations made by this thread (const-initialised: reading it never allocates).
    static MINE: Cell<usize> = const { Cell::new(0) };
}

fn count_mine() {
    // `try_with`: the thread-local may be gone while a thread is being torn down.
    let _ = MINE.try_with(|n| n.set(n.get() + 1));
}

/// Forwards to the system allocator, counting as it goes.
pub struct Counting;

/// Allocations (and reallocations) made so far.
pub static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
/// Heap bytes currently allocated.
pub static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// The most heap bytes allocated at once since the start or [`reset_peak`].
pub static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Raises the high-water mark to `live` if it is higher (a load first: the common case
/// writes nothing).
fn note_peak(live: usize) {
    if live > PEAK_BYTES.load(Ordering::Relaxed) {
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are only
// bookkeeping (Relaxed: nothing is published with them) and never affect the pointers.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        count_mine();
        note_peak(LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size());
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        count_mine();
        note_peak(LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed) + new_size);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations this thread made while `f` ran (other threads, such as the test harness's,
/// do not count: the checks under test run on this thread).
pub fn allocations_during(f: impl FnOnce()) -> usize {
    let before = MINE.with(Cell::get);
    f();
    MINE.with(Cell::get) - before
}

/// Heap bytes allocated now.
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The most heap bytes allocated at once since the start or the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts a new high-water mark from the heap bytes allocated now.
pub fn reset_peak() {
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}
