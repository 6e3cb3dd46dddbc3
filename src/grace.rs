//! Grace periods: memory a check may still be reading (a shard's array, a node, a policy
//! version) is freed only once every check that could have found it has ended.
//!
//! Epoch-based reclamation, as `crossbeam-epoch` does it, with one difference: a check's
//! pin is a plain store, not a locked instruction. Every thread that checks owns a *slot*
//! (registered at its first pin, dropped with the thread) holding the global epoch it
//! pinned at, or nothing. Memory taken out of reach is *deferred*: queued with the epoch
//! read after it left, and freed once the epoch is two further on. The epoch advances from
//! `e` to `e + 1` only when every pinned slot holds `e`, so a check pinned while the memory
//! was still reachable blocks the second advance until it unpins.
//!
//! # The fences
//! The argument is crossbeam's (its `internal.rs`): a reader's pin stores its slot and then
//! fences (SeqCst) before it loads any pointer; a writer fences (SeqCst) after unlinking,
//! before it reads the epoch to seal its garbage, and an advance fences before it reads the
//! slots. Of two SeqCst fences one comes first, so either the advance sees the reader's
//! slot, or the reader's loads after its fence see the unlink and never reach the memory.
//!
//! Here the reader's fence is a compiler fence only, and the writer's and the advance's
//! are *heavy*: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every running
//! thread of the process execute a full barrier before it returns. So each reader's
//! compiler-ordered store and loads are separated by a real barrier at some point of the
//! heavy fence's execution: the pair orders like two SeqCst fences (the asymmetric fences
//! of C++ P1202, as folly's hazard pointers and `seize` use them). Where membarrier is
//! missing (not Linux, or refused by a sandbox) both sides are `fence(SeqCst)`, which is
//! crossbeam's protocol exactly; the choice is made once, by the first pin or heavy fence
//! (a reader that finds it not yet made fences with SeqCst), and never changes. Under loom both sides are `fence(SeqCst)`: `loom-tests/tests/grace.rs` checks
//! that protocol through this file; the asymmetric substitution is the argument above.
//!
//! # When memory is freed
//! Garbage is sealed, the epoch advanced and what is two epochs old freed by
//! [`Guard::flush`] (the sweeper calls it after each sweep) and by the outermost guard of
//! a thread that unpins while 64 or more deferred items wait unsealed, or a large one (a
//! shard's replaced array) waits at all: so a free never
//! runs under a lock of the table (a key's `Drop` may check the limiter again), and a
//! check pays for a collection (two heavy fences, the frees) once per 64 deferrals at
//! most. Sealed garbage waits for the next collection: the next 64 deferrals or the next
//! sweep. A thread pinned for good would hold every free back, as with `crossbeam-epoch`;
//! checks unpin when they return.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::{self, ManuallyDrop};
use std::ptr::{self, NonNull};
use std::sync::{Arc, PoisonError};

use crossbeam_utils::CachePadded;

#[cfg(slidegate_loom)]
use crate::sync::fence;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// A slot's value while its thread is pinned at epoch `e`: `e << 1 | PINNED`; 0 unpinned;
/// `GONE` once its thread (or its guard, for a guard's own slot) has ended: the next
/// advance drops it from the list.
const PINNED: u64 = 1;
const GONE: u64 = 2;
/// Deferred items that make the next deferral seal them and try to free.
const BATCH: usize = 64;

type Slot = CachePadded<AtomicU64>;
type Deferred = Box<dyn FnOnce() + Send>;

/// The process-wide epoch, the threads' slots and the garbage waiting.
struct Collector {
    epoch: AtomicU64,
    /// Whether a collection is due (kept under the garbage's lock): [`BATCH`] or more items
    /// wait unsealed, or a large one waits at all. The outermost guard of a thread that
    /// unpins then collects.
    due: AtomicBool,
    /// Under loom only: pins and unpins so far, an RMW each (see `enter_slot`).
    #[cfg(slidegate_loom)]
    pins: AtomicU64,
    slots: Mutex<Vec<Arc<Slot>>>,
    garbage: Mutex<Garbage>,
}

/// An empty collector (one expression for [`Collector::new`]'s `const` and loom forms).
macro_rules! collector {
    () => {
        Collector {
            epoch: AtomicU64::new(0),
            due: AtomicBool::new(false),
            #[cfg(slidegate_loom)]
            pins: AtomicU64::new(0),
            slots: Mutex::new(Vec::new()),
            garbage: Mutex::new(Garbage { pending: Vec::new(), sealed: Vec::new(), large: 0 }),
        }
    };
}

struct Garbage {
    /// Deferred since the last seal, each with whether it is large.
    pending: Vec<(bool, Deferred)>,
    /// Sealed bags, oldest first, each with the epoch read when it was sealed.
    sealed: Vec<(u64, Vec<(bool, Deferred)>)>,
    /// Large items not yet freed, sealed or not.
    large: usize,
}

// A plain static: a pin reads the epoch with no lazy-initialisation check before it.
#[cfg(not(slidegate_loom))]
static COLLECTOR: Collector = Collector::new();
#[cfg(slidegate_loom)]
loom::lazy_static! {
    static ref COLLECTOR: Collector = Collector::new();
}

/// A thread's registration: its slot and how many of its guards are alive.
struct Local {
    slot: Arc<Slot>,
    depth: Cell<usize>,
}

#[cfg(not(slidegate_loom))]
thread_local! {
    static LOCAL: Local = Local::register();
}
#[cfg(slidegate_loom)]
loom::thread_local! {
    static LOCAL: Local = Local::register();
}

/// Proof that the current thread is pinned: memory reachable when it was created is not
/// freed while it lives. Not `Send`: it is its thread's.
///
/// A guard lives on the stack of the code that pinned (the crate never stores one, and
/// it is not `Send`), so it ends before its thread's thread-locals are destroyed.
pub struct Guard {
    pinned: Pinned,
    _thread: PhantomData<*mut ()>,
}

/// What a guard unpins when it ends.
enum Pinned {
    /// The thread's `Local`, reached again without a thread-local lookup.
    Local(NonNull<Local>),
    /// A slot registered for this guard alone: the pin was made where the thread's
    /// `Local` is gone (from a thread-local destructor at thread exit). Dropped by hand
    /// (`unpin_own`), out of line: the common guard's drop stays a few instructions.
    Own(ManuallyDrop<Arc<Slot>>),
}

/// Pins the current thread. The guard must stay on the caller's stack, never stored (in a
/// struct, a thread-local, a future across an `.await`): its drop reaches the thread's
/// registration through a pointer that only the stack's order keeps valid (`Guard`).
#[inline(always)]
pub fn pin() -> Guard {
    let pinned = match LOCAL.try_with(|local| {
        local.enter();
        NonNull::from(local)
    }) {
        Ok(local) => Pinned::Local(local),
        Err(_) => {
            let slot = COLLECTOR.register();
            enter_slot(&slot);
            Pinned::Own(ManuallyDrop::new(slot))
        }
    };
    Guard { pinned, _thread: PhantomData }
}

/// Marks `slot` pinned at the current epoch, then the reader's half of the fence pair.
#[inline(always)]
fn enter_slot(slot: &Slot) {
    // Relaxed: which epoch a pin reads only decides how long its garbage waits; the
    // fence below orders the slot's store before the reader's loads (module docs).
    let epoch = COLLECTOR.epoch.load(Ordering::Relaxed);
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "the epoch advances by 1 per advance: below 2⁶³ for ever"
    )]
    slot.store(epoch << 1 | PINNED, Ordering::Relaxed);
    fences::light();
    // Under loom, a pin is also an RMW on one word every pin shares, as a pin of
    // `crossbeam-epoch` is: loom then treats every two checks as racing from their start,
    // and explores the orders of the table operations behind them (the models of
    // `loom-tests/tests/{table,eviction}.rs` need a check delayed between its clock
    // reading and its lookup). It orders nothing the protocol relies on: Relaxed.
    #[cfg(slidegate_loom)]
    COLLECTOR.pins.fetch_add(1, Ordering::Relaxed);
}

impl Local {
    fn register() -> Local {
        Local { slot: COLLECTOR.register(), depth: Cell::new(0) }
    }

    #[inline(always)]
    fn enter(&self) {
        let depth = self.depth.get();
        if depth == 0 {
            enter_slot(&self.slot);
        }
        // One per live guard of this thread, each on its stack: far below usize::MAX.
        self.depth.set(depth.wrapping_add(1));
    }

    #[inline(always)]
    fn exit(&self) {
        let depth = self.depth.get().wrapping_sub(1);
        self.depth.set(depth);
        if depth == 0 {
            // Release: the reads made while pinned happen-before an advance that sees
            // this store (its Acquire load of the slot), and so before what it frees.
            self.slot.store(0, Ordering::Release);
            // Under loom, as at the pin (`enter_slot`).
            #[cfg(slidegate_loom)]
            COLLECTOR.pins.fetch_add(1, Ordering::Relaxed);
            // Unpinned, so this thread holds no epoch back; and its outermost guard, so
            // no lock of the table is held (every path that takes one pins first).
            // Relaxed: a hint (`collect` decides under the lock).
            if COLLECTOR.due.load(Ordering::Relaxed) {
                COLLECTOR.collect();
            }
        }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Release: as in `exit`. Not unregistered here: the collector may already be gone
        // at the end of the process (or of a loom model).
        self.slot.store(GONE, Ordering::Release);
    }
}

impl Drop for Guard {
    #[inline(always)]
    fn drop(&mut self) {
        match &mut self.pinned {
            Pinned::Local(local) => {
                debug_assert!(LOCAL.try_with(|now| ptr::eq(now, local.as_ptr())).unwrap_or(false));
                // SAFETY: `local` is this thread's `Local` (a guard is not `Send`), alive
                // when the guard was made; a thread-local is destroyed only once its
                // thread's code has returned, or by the destructors that run one after
                // another at thread exit, and a guard, on the stack of the code that made
                // it (see `Guard`), ends before either: the `Local` is still alive, and
                // only shared references to it exist (its fields are `Cell` and atomics).
                #[allow(unsafe_code)]
                unsafe { local.as_ref() }.exit();
            }
            Pinned::Own(slot) => unpin_own(slot),
        }
    }
}

/// Ends a guard's own slot (`Pinned::Own`), once.
#[cold]
fn unpin_own(slot: &mut ManuallyDrop<Arc<Slot>>) {
    slot.store(GONE, Ordering::Release);
    // SAFETY: called once, from the guard's drop; the slot is not used after it.
    #[allow(unsafe_code)]
    unsafe {
        ManuallyDrop::drop(slot);
    }
}

impl Guard {
    /// Runs `free` once every guard alive now, on any thread, has dropped.
    ///
    /// Only queues it: a deferral may be made under a lock (a shard's mutex), and what a
    /// free runs (a key's `Drop`) may take that lock again. The queue is collected when a
    /// guard unpins with [`BATCH`] or more items waiting, and by [`flush`](Self::flush).
    ///
    /// # Safety
    /// What `free` frees must be out of reach for any guard created after this call: only
    /// guards alive now may still hold it.
    #[allow(unsafe_code)]
    pub unsafe fn defer(&self, free: impl FnOnce() + Send + 'static) {
        COLLECTOR.push(false, Box::new(free));
    }

    /// As [`defer`](Self::defer), for memory large enough (a shard's replaced array) that
    /// the next guards to unpin collect until it is freed, rather than wait for a batch.
    ///
    /// # Safety
    /// As for [`defer`](Self::defer).
    #[allow(unsafe_code)]
    pub unsafe fn defer_large(&self, free: impl FnOnce() + Send + 'static) {
        COLLECTOR.push(true, Box::new(free));
    }

    /// Seals what was deferred, advances the epoch if every pinned thread allows it, and
    /// frees what two advances have made safe.
    pub fn flush(&self) {
        COLLECTOR.collect();
    }
}

impl Collector {
    #[cfg(not(slidegate_loom))]
    const fn new() -> Collector {
        collector!()
    }

    /// Loom's atomics and mutexes are not made in `const` contexts.
    #[cfg(slidegate_loom)]
    fn new() -> Collector {
        collector!()
    }

    fn register(&self) -> Arc<Slot> {
        let slot = Arc::new(CachePadded::new(AtomicU64::new(0)));
        self.slots.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::clone(&slot));
        slot
    }

    fn push(&self, large: bool, free: Deferred) {
        let mut garbage = self.lock_garbage();
        garbage.pending.push((large, free));
        garbage.large = garbage.large.saturating_add(usize::from(large));
        self.set_due(&garbage);
    }

    /// Publishes whether a collection is due (under the garbage's lock). Relaxed: a hint
    /// for `exit`; `collect` decides under the lock.
    fn set_due(&self, garbage: &Garbage) {
        self.due.store(garbage.pending.len() >= BATCH || garbage.large > 0, Ordering::Relaxed);
    }

    fn lock_garbage(&self) -> crate::sync::MutexGuard<'_, Garbage> {
        // Every change under this lock is a push or a move of whole vectors.
        self.garbage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Seal, advance, free (see [`Guard::flush`]).
    fn collect(&self) {
        let ready = {
            let mut garbage = self.lock_garbage();
            if garbage.pending.is_empty() && garbage.sealed.is_empty() {
                return;
            }
            if !garbage.pending.is_empty() {
                // Every unlink of the pending items happened before its `defer` took this
                // lock; the heavy fence orders them before the epoch read that seals them.
                fences::heavy();
                let epoch = self.epoch.load(Ordering::Relaxed);
                let bag = mem::take(&mut garbage.pending);
                garbage.sealed.push((epoch, bag));
            }
            let now = self.try_advance();
            let old = garbage.sealed.iter().take_while(|(sealed, _)| sealed.saturating_add(2) <= now).count();
            let ready: Vec<_> = garbage.sealed.drain(..old).flat_map(|(_, bag)| bag).collect();
            let large = ready.iter().filter(|(large, _)| *large).count();
            garbage.large = garbage.large.saturating_sub(large);
            self.set_due(&garbage);
            ready
        };
        // Outside the lock: a deferred function may drop something that defers again.
        for (_, free) in ready {
            free();
        }
    }

    /// Advances the epoch from `e` to `e + 1` if no slot is pinned at an earlier one;
    /// the epoch afterwards.
    fn try_advance(&self) -> u64 {
        let epoch = self.epoch.load(Ordering::Relaxed);
        // The advance's half of the fence pair: a reader's slot not seen below was stored
        // after this fence, and its loads see every unlink made before it (module docs).
        fences::heavy();
        {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let mut gone = false;
            for slot in slots.iter() {
                // Acquire pairs with the Release of `exit` (and of the stores of `GONE`): a
                // reader seen unpinned has finished its reads before what this advance frees.
                let seen = slot.load(Ordering::Acquire);
                if seen & PINNED != 0 && seen >> 1 != epoch {
                    return epoch;
                }
                gone |= seen == GONE;
            }
            if gone {
                // Relaxed: `GONE` is stored once, last, and read above with Acquire.
                slots.retain(|slot| slot.load(Ordering::Relaxed) != GONE);
            }
        }
        #[allow(
            clippy::arithmetic_side_effects,
            reason = "the epoch advances by 1 per advance: below 2⁶³ for ever"
        )]
        let next = epoch + 1;
        // Release: pins that read the new epoch happen after the scan above. Only this
        // CAS's winner advances; a loser reads the epoch a racing advance set.
        match self.epoch.compare_exchange(epoch, next, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => next,
            Err(current) => current,
        }
    }
}

/// The two halves of the fence pair (module docs).
mod fences {
    #[cfg(not(slidegate_loom))]
    use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

    /// Unknown until the first fence asks; then `ASYMMETRIC` or `SYMMETRIC`, for good.
    #[cfg(not(slidegate_loom))]
    static MODE: AtomicU8 = AtomicU8::new(0);
    #[cfg(not(slidegate_loom))]
    const ASYMMETRIC: u8 = 1;
    #[cfg(not(slidegate_loom))]
    const SYMMETRIC: u8 = 2;

    /// The reader's half: a compiler fence where membarrier serves the other half, else a
    /// SeqCst fence.
    #[inline(always)]
    pub(super) fn light() {
        #[cfg(not(slidegate_loom))]
        match MODE.load(Ordering::Relaxed) {
            ASYMMETRIC => compiler_fence(Ordering::SeqCst),
            SYMMETRIC => fence(Ordering::SeqCst),
            _ => {
                choose();
                fence(Ordering::SeqCst);
            }
        }
        #[cfg(slidegate_loom)]
        super::fence(super::Ordering::SeqCst);
    }

    /// The writer's and the advance's half: membarrier where it works, else a SeqCst fence.
    pub(super) fn heavy() {
        #[cfg(not(slidegate_loom))]
        if mode() == ASYMMETRIC {
            // Readers fence with the compiler only: no other fence would pair with theirs.
            // Registration succeeded, and the kernel refuses a registered process nothing
            // (man 2 membarrier), so this cannot fail; if it ever did, freeing memory a
            // reader may hold would be unsound, and stopping is the safe answer.
            if !membarrier::expedited() {
                std::process::abort();
            }
        } else {
            fence(Ordering::SeqCst);
        }
        #[cfg(slidegate_loom)]
        super::fence(super::Ordering::SeqCst);
    }

    #[cfg(not(slidegate_loom))]
    fn mode() -> u8 {
        match MODE.load(Ordering::Relaxed) {
            0 => choose(),
            mode => mode,
        }
    }

    /// Registers for membarrier once, and publishes the mode: a reader that sees
    /// `ASYMMETRIC` relies on the heavy side's membarrier, which registration made
    /// available before the mode was stored.
    #[cfg(not(slidegate_loom))]
    #[cold]
    fn choose() -> u8 {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let mode = if membarrier::register() { ASYMMETRIC } else { SYMMETRIC };
            MODE.store(mode, Ordering::SeqCst);
        });
        MODE.load(Ordering::SeqCst)
    }

    #[cfg(all(not(slidegate_loom), target_os = "linux"))]
    mod membarrier {
        const QUERY: libc::c_int = 0;
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

        fn call(cmd: libc::c_int) -> libc::c_long {
            // SAFETY: membarrier takes two integers and touches no memory of ours; an
            // unknown command or a refused call returns -1.
            #[allow(unsafe_code)]
            unsafe {
                libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int)
            }
        }

        /// Whether the process is now registered for private expedited barriers.
        pub(super) fn register() -> bool {
            let supported = call(QUERY);
            supported > 0
                && supported & libc::c_long::from(PRIVATE_EXPEDITED) != 0
                && call(REGISTER_PRIVATE_EXPEDITED) == 0
        }

        /// A full barrier on every running thread of the process; `false` if refused.
        pub(super) fn expedited() -> bool {
            call(PRIVATE_EXPEDITED) == 0
        }
    }

    #[cfg(all(not(slidegate_loom), not(target_os = "linux")))]
    mod membarrier {
        pub(super) fn register() -> bool {
            false
        }
        pub(super) fn expedited() -> bool {
            false
        }
    }
}
