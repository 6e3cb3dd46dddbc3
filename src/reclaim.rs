//! Memory reclamation for the key table: epochs whose readers write only their own slot.
//!
//! A check finds a key's node through the table's arrays without a lock, so a node or an
//! array taken out of the table may still be in a reader's hands; it is freed only once no
//! reader can hold it. This is epoch-based reclamation (as in `crossbeam-epoch`) with one
//! difference, which is why it is written here: a reader's *pin* is two plain stores to
//! its own thread's slot and no fence instruction. `crossbeam-epoch` pins with a full fence
//! (a locked instruction on x86, about a third of a check on one hot key) and every 128th
//! pin writes the shared global epoch; here the cost moves to the rare writer, which
//! issues a process-wide barrier (`membarrier(2)` on Linux, through the `membarrier` crate;
//! a fence elsewhere) before it looks at the readers' slots.
//!
//! # Protocol
//! * The global epoch `E` only grows. Each thread that reads has a [`Participant`] slot:
//!   `0` when not pinned, else `(e << 1) | 1` for a pin taken when the epoch was `e`.
//! * **Pin**: load `E` (Acquire), store it in the slot (Relaxed), then a compiler-only
//!   barrier; then the table's loads. **Unpin**: store `0` (Release).
//! * **Retire**: an object already unlinked from the table goes into its thread's bag; a
//!   full bag ([`BATCH`] objects), or any bag at a [`collect`], is handed over under
//!   [`COLLECTOR`]'s mutex with tag `g`, the epoch read there (never less than the epoch at
//!   any of its unlinks, which came before in the thread's order).
//! * **Advance** (under the mutex): a heavy barrier, then if every pinned slot holds the
//!   current epoch `e`, store `e + 1` (Release); objects tagged `g ≤ e + 1 − 2` are freed
//!   (after the mutex is released, since freeing runs user `Drop` code).
//!
//! # Why an object tagged `g` is unreachable once `E ≥ g + 2`
//! Take a reader R that loaded a pointer to the object. The unlink happens-before the
//! hand-over, which (by the mutex) happens-before both advances `g → g+1` and `g+1 → g+2`.
//! * R's epoch is at most `g`: had R's Acquire load of `E` read `g + 1` or more, it would
//!   synchronize with the advance's Release store, which follows the unlink, and R's later
//!   pointer load would see the unlink.
//! * Each of the two advances runs its heavy barrier after the unlink. R's pin store is
//!   either before the barrier's point in R, and then visible to the advance's scan, or
//!   after it, and then so is R's pointer load, which then sees the unlink (the barrier
//!   orders everything the advancer saw before it ahead of R's later loads). So the scan
//!   sees R pinned at `≤ g` unless R has unpinned since; the advance `g+1 → g+2` then
//!   cannot happen while R holds the pointer.
//! * If the scan reads R's `0` (or a later pin), the Acquire load synchronizes with R's
//!   Release unpin: R's reads of the object happen-before the free.
//!
//! A pinned reader delays reclamation (never correctness); readers stay pinned for one
//! check, nanoseconds. Under loom both barriers are `SeqCst` fences, the classic form of
//! the same protocol: `loom-tests/tests/reclaim.rs` checks the epoch logic (it fails if an
//! advance ignores a pinned reader); the barriers' pairing rests on the argument above, as
//! loom does not explore every store-buffering outcome.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem;

use crossbeam_utils::CachePadded;

use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// Objects a thread retires before it hands them to the collector (one lock) and tries to
/// advance the epoch (a heavy barrier, a few µs): both amortised over this many.
const BATCH: usize = 64;

/// A thread's pin slot.
struct Participant {
    /// `0`, or `(epoch << 1) | 1` while pinned.
    state: CachePadded<AtomicU64>,
    /// Owned by a live thread (or a pin taken while thread-locals are being destroyed).
    in_use: AtomicBool,
}

/// What the mutex guards: the slots and the retired objects.
struct Registry {
    participants: Vec<Arc<Participant>>,
    garbage: Vec<(u64, Deferred)>,
}

type Deferred = Box<dyn FnOnce() + Send>;

/// The process's one collector.
struct Collector {
    epoch: CachePadded<AtomicU64>,
    registry: Mutex<Registry>,
}

#[cfg(not(slidegate_loom))]
static COLLECTOR: Collector = Collector {
    epoch: CachePadded::new(AtomicU64::new(0)),
    registry: Mutex::new(Registry { participants: Vec::new(), garbage: Vec::new() }),
};

#[cfg(slidegate_loom)]
loom::lazy_static! {
    static ref COLLECTOR: Collector = Collector {
        epoch: CachePadded::new(AtomicU64::new(0)),
        registry: Mutex::new(Registry { participants: Vec::new(), garbage: Vec::new() }),
    };
}

/// This thread's slot and how many guards it holds.
struct Local {
    participant: Arc<Participant>,
    guards: Cell<usize>,
    /// What this thread retired and has not handed over yet (at most [`BATCH`]).
    bag: RefCell<Vec<Deferred>>,
}

impl Drop for Local {
    fn drop(&mut self) {
        // Under loom the main thread's locals outlive the model's statics: what is left in
        // its bag is leaked there (a model's end frees nothing anyway).
        #[cfg(not(slidegate_loom))]
        hand_over(std::mem::take(self.bag.get_mut()));
        // Release: a later owner's pins come after everything this thread did.
        self.participant.in_use.store(false, Ordering::Release);
    }
}

#[cfg(not(slidegate_loom))]
thread_local! {
    static LOCAL: Local = Local { participant: register(), guards: Cell::new(0), bag: RefCell::new(Vec::new()) };
}

#[cfg(slidegate_loom)]
loom::thread_local! {
    static LOCAL: Local = Local { participant: register(), guards: Cell::new(0), bag: RefCell::new(Vec::new()) };
}

/// A free slot, or a new one.
fn register() -> Arc<Participant> {
    let mut registry = lock();
    // Acquire: pairs with the Release in `Local::drop`.
    if let Some(free) = registry
        .participants
        .iter()
        .find(|p| p.in_use.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok())
    {
        return Arc::clone(free);
    }
    let fresh =
        Arc::new(Participant { state: CachePadded::new(AtomicU64::new(0)), in_use: AtomicBool::new(true) });
    registry.participants.push(Arc::clone(&fresh));
    fresh
}

fn lock() -> crate::sync::MutexGuard<'static, Registry> {
    // A panic in here leaves the lists consistent (pushes and swaps only): go on.
    COLLECTOR.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Proof that this thread is pinned: pointers loaded from the table stay valid while it
/// lives. Not `Send`: it is a fact about this thread.
pub struct Guard {
    /// A slot of its own, for a pin taken while this thread's locals are being destroyed.
    own: Option<Arc<Participant>>,
    _not_send: PhantomData<*const ()>,
}

/// Pins this thread (re-entrant).
#[inline]
pub fn pin() -> Guard {
    let pinned = LOCAL.try_with(|local| {
        let guards = local.guards.get();
        if guards == 0 {
            enter(&local.participant);
        }
        local.guards.set(guards.saturating_add(1));
    });
    match pinned {
        Ok(()) => Guard { own: None, _not_send: PhantomData },
        Err(_) => pin_without_locals(),
    }
}

#[cold]
fn pin_without_locals() -> Guard {
    let participant = register();
    enter(&participant);
    Guard { own: Some(participant), _not_send: PhantomData }
}

#[inline]
fn enter(participant: &Participant) {
    // Acquire: pairs with the Release store of an advance (see the module docs).
    let epoch = COLLECTOR.epoch.load(Ordering::Acquire);
    participant.state.store((epoch << 1) | 1, Ordering::Relaxed);
    light_barrier();
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        if let Some(own) = self.own.take() {
            own.state.store(0, Ordering::Release);
            own.in_use.store(false, Ordering::Release);
            return;
        }
        let _ = LOCAL.try_with(|local| {
            let guards = local.guards.get().saturating_sub(1);
            local.guards.set(guards);
            if guards == 0 {
                // Release: this thread's reads of anything it loaded while pinned
                // happen-before an advance that reads this 0 (Acquire), hence before a free.
                local.participant.state.store(0, Ordering::Release);
            }
        });
    }
}

impl Guard {
    /// Runs `f` once no reader can still hold what it frees: `f` must free only objects
    /// already unlinked from every place a reader could load them from.
    pub fn defer(&self, f: impl FnOnce() + Send + 'static) {
        let mut f: Option<Deferred> = Some(Box::new(f));
        // Kept in this thread's bag until it holds a batch: no lock per retirement.
        let full = LOCAL.try_with(|local| match (local.bag.try_borrow_mut(), f.take()) {
            (Ok(mut bag), Some(f)) => {
                bag.push(f);
                (bag.len() >= BATCH).then(|| std::mem::take(&mut *bag))
            }
            // Re-entered from a deferred function's drop: hand it over directly.
            (Err(_), f) => Some(f.into_iter().collect()),
            (Ok(_), None) => None,
        });
        match full {
            Ok(None) => {}
            Ok(Some(batch)) => {
                hand_over(batch);
                collect();
            }
            // This thread's locals are being destroyed: straight to the collector.
            Err(_) => hand_over(f.into_iter().collect()),
        }
    }
}

/// Queues `batch` with the current epoch as its tag. The epoch when it is read here is at
/// least the one when each object was unlinked (it only grows), so the tag is safe.
fn hand_over(batch: Vec<Deferred>) {
    if batch.is_empty() {
        return;
    }
    let mut registry = lock();
    let tag = COLLECTOR.epoch.load(Ordering::Relaxed);
    registry.garbage.extend(batch.into_iter().map(|f| (tag, f)));
}

/// Advances the epoch as far as the pinned readers allow (at most twice) and frees what
/// that makes safe: everything retired before the call, unless a reader pinned before it
/// is still pinned.
pub fn collect() {
    // This thread's bag first (a sweep's retirements are in it).
    if let Ok(Some(batch)) =
        LOCAL.try_with(|local| local.bag.try_borrow_mut().ok().map(|mut b| std::mem::take(&mut *b)))
    {
        hand_over(batch);
    }
    let ready = {
        let mut registry = lock();
        for _ in 0..2 {
            if !try_advance(&registry) {
                break;
            }
        }
        let epoch = COLLECTOR.epoch.load(Ordering::Relaxed);
        let garbage = mem::take(&mut registry.garbage);
        let (ready, waiting): (Vec<_>, Vec<_>) =
            garbage.into_iter().partition(|&(tag, _)| tag.saturating_add(2) <= epoch);
        registry.garbage = waiting;
        ready
    };
    // Outside the mutex: freeing drops keys, whose `Drop` is the user's.
    for (_, free) in ready {
        free();
    }
}

/// One advance, if every pinned reader is at the current epoch. Under the mutex.
fn try_advance(registry: &Registry) -> bool {
    heavy_barrier();
    let epoch = COLLECTOR.epoch.load(Ordering::Relaxed);
    let pinned_at = (epoch << 1) | 1;
    // Acquire: pairs with a reader's Release unpin (see the module docs).
    let all_current = registry
        .participants
        .iter()
        .map(|p| p.state.load(Ordering::Acquire))
        .all(|s| s == 0 || s == pinned_at);
    if all_current {
        // Release: pairs with the Acquire load in `enter`.
        COLLECTOR.epoch.store(epoch.saturating_add(1), Ordering::Release);
    }
    all_current
}

/// The readers' half of the asymmetric barrier: keeps the compiler from moving the table's
/// loads above the pin's store; the hardware is handled by [`heavy_barrier`].
#[inline(always)]
fn light_barrier() {
    #[cfg(not(slidegate_loom))]
    membarrier2::light();
    #[cfg(slidegate_loom)]
    crate::sync::fence(Ordering::SeqCst);
}

/// The writer's half: every thread of the process runs a full barrier before this returns.
fn heavy_barrier() {
    #[cfg(not(slidegate_loom))]
    membarrier2::heavy();
    #[cfg(slidegate_loom)]
    crate::sync::fence(Ordering::SeqCst);
}

#[cfg(all(test, not(slidegate_loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn a_deferred_free_waits_for_a_pinned_reader() {
        static FREED: AtomicUsize = AtomicUsize::new(0);
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let _guard = pin();
            pinned_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
        pinned_rx.recv().unwrap();
        pin().defer(|| {
            FREED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..3 {
            collect();
        }
        assert_eq!(FREED.load(std::sync::atomic::Ordering::SeqCst), 0, "freed under a pinned reader");
        release_tx.send(()).unwrap();
        reader.join().unwrap();
        // Other tests' threads may pin meanwhile: they only postpone the free.
        for _ in 0..10_000 {
            collect();
            if FREED.load(std::sync::atomic::Ordering::SeqCst) == 1 {
                return;
            }
            std::thread::yield_now();
        }
        panic!("never freed after the reader unpinned");
    }
}
