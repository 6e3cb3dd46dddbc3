//! The process's one sweeper thread (`slidegate-sweeper`), serving every real-clock
//! limiter's sweep schedule.
//!
//! Each limiter [`register`]s a weak reference to what it sweeps and its interval
//! ([`LimiterBuilder::sweep_interval`](crate::LimiterBuilder::sweep_interval)). The thread
//! keeps a schedule of next-due times, sleeps until the earliest, runs that sweep, and
//! schedules the next one an interval after it ends (as a thread of the limiter's own
//! would). Sweeps due within a small slack ([`slack`]: 1/32 of the interval, at most
//! 20 ms) of each other run in one wake-up, so limiters built together are swept together.
//! Registering wakes the thread (the new entry may be due first); the first registration
//! starts it, and dropping the last one stops and joins it.
//!
//! A [`Registration`]'s drop removes the entry and waits for a sweep of it that is running,
//! so once the drop returns no sweep of that target runs or starts. The thread holds a
//! strong reference only while it sweeps; if that reference turns out to be the last one,
//! the target is dropped on the sweeper thread, and a registration dropped there (the
//! target's own, or any other) neither waits for its own sweep nor joins its own thread: it
//! leaves the thread to stop by itself, and the next [`register`] joins it.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Something the sweeper thread sweeps: a limiter's keys.
pub(crate) trait Sweep: Send + Sync {
    /// Evicts what has expired; returns how many keys went.
    fn sweep(&self) -> usize;
}

/// A target's place in the schedule; dropping it removes the target (see the module's docs).
#[derive(Debug)]
pub(crate) struct Registration {
    id: u64,
}

struct Entry {
    id: u64,
    target: Weak<dyn Sweep>,
    interval: Duration,
    due: Instant,
}

struct Schedule {
    entries: Vec<Entry>,
    next_id: u64,
    /// The entry whose sweep is running (its target upgraded), if any.
    running: Option<u64>,
    /// Set when the last registration goes: the thread stops at its next look.
    stop: bool,
}

/// The schedule. The thread sleeps on [`WAKE`] while holding nothing else; a drop waits on
/// [`DONE`] for a running sweep. No sweep runs under this lock.
static SCHEDULE: Mutex<Schedule> =
    Mutex::new(Schedule { entries: Vec::new(), next_id: 0, running: None, stop: false });
static WAKE: Condvar = Condvar::new();
static DONE: Condvar = Condvar::new();

/// The thread, if started. Held by `register` across the start and by the last
/// registration's drop across the join (taken before [`SCHEDULE`], never on the thread
/// itself), so there is never more than one sweeper thread at a time but in the case the
/// module's docs describe.
static THREAD: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

thread_local! {
    /// True on the sweeper thread.
    static ON_SWEEPER: Cell<bool> = const { Cell::new(false) };
}

/// A sweep due within this much of now runs now: 1/32 of the interval, at most 20 ms.
fn slack(interval: Duration) -> Duration {
    interval.checked_div(32).unwrap_or_default().min(Duration::from_millis(20))
}

/// `from + interval`, or about a century later if that overflows `Instant`.
fn after(from: Instant, interval: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(interval).or_else(|| from.checked_add(CENTURY)).unwrap_or(from)
}

/// See the clock's `lock`: nothing under these locks panics halfway through an update.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sweeps `target` every `interval` (the first time one interval from now) on the
/// process's sweeper thread, starting the thread if this is the only registration, until
/// the returned registration drops (or the target is gone).
pub(crate) fn register(target: Weak<dyn Sweep>, interval: Duration) -> std::io::Result<Registration> {
    let mut thread = lock(&THREAD);
    if lock(&SCHEDULE).stop {
        // The last registration went on the sweeper thread itself: it stops (or has
        // stopped) by itself; join it before starting another.
        if let Some(old) = thread.take() {
            if old.thread().id() != thread::current().id() {
                let _ = old.join();
            }
        }
    }
    let mut schedule = lock(&SCHEDULE);
    schedule.stop = false;
    let id = schedule.next_id;
    schedule.next_id = id.wrapping_add(1);
    schedule.entries.push(Entry { id, target, interval, due: after(Instant::now(), interval) });
    drop(schedule);
    // The new entry may be due before the one the thread sleeps for.
    WAKE.notify_one();
    if thread.is_none() {
        let spawned = thread::Builder::new().name("slidegate-sweeper".to_owned()).spawn(run);
        match spawned {
            Ok(handle) => *thread = Some(handle),
            Err(e) => {
                lock(&SCHEDULE).entries.retain(|entry| entry.id != id);
                return Err(e);
            }
        }
    }
    Ok(Registration { id })
}

impl Drop for Registration {
    fn drop(&mut self) {
        let on_sweeper = ON_SWEEPER.with(Cell::get);
        let mut thread = if on_sweeper { None } else { Some(lock(&THREAD)) };
        let mut schedule = lock(&SCHEDULE);
        schedule.entries.retain(|entry| entry.id != self.id);
        // A sweep of this target that is running finishes first (on the sweeper thread,
        // this drop may be inside that very sweep: no wait there).
        while !on_sweeper && schedule.running == Some(self.id) {
            schedule = DONE.wait(schedule).unwrap_or_else(PoisonError::into_inner);
        }
        let last = schedule.entries.is_empty();
        if last {
            schedule.stop = true;
        }
        drop(schedule);
        WAKE.notify_one();
        if last {
            if let Some(handle) = thread.as_mut().and_then(|thread| thread.take()) {
                // Only a panic on the thread makes this fail (sweeps are caught); a Drop
                // must not panic in turn.
                let _ = handle.join();
            }
        }
    }
}

/// The sweeper thread.
fn run() {
    ON_SWEEPER.with(|on| on.set(true));
    crate::clock::quiet_reads();
    let mut schedule = lock(&SCHEDULE);
    loop {
        if schedule.stop {
            return;
        }
        let now = Instant::now();
        let ready =
            schedule.entries.iter_mut().find(|e| e.due.saturating_duration_since(now) <= slack(e.interval));
        let Some(entry) = ready else {
            let earliest = schedule.entries.iter().map(|e| e.due.saturating_duration_since(now)).min();
            schedule = match earliest {
                Some(wait) => WAKE.wait_timeout(schedule, wait).unwrap_or_else(PoisonError::into_inner).0,
                None => WAKE.wait(schedule).unwrap_or_else(PoisonError::into_inner),
            };
            continue;
        };
        let id = entry.id;
        // Rescheduled again when the sweep ends; this keeps a target whose owner is going
        // away (not upgradable, not yet deregistered) from being picked in a loop.
        entry.due = after(now, entry.interval);
        let Some(target) = entry.target.upgrade() else { continue };
        schedule.running = Some(id);
        drop(schedule);
        // A sweep does not panic by construction; if one did, this thread would stay up
        // for the other limiters (and the target's drop must not wait for it forever).
        let _ = catch_unwind(AssertUnwindSafe(move || {
            target.sweep();
            // Perhaps the last strong reference: the target is then dropped here, before
            // a drop waiting for this sweep returns.
            drop(target);
        }));
        schedule = lock(&SCHEDULE);
        schedule.running = None;
        let end = Instant::now();
        if let Some(entry) = schedule.entries.iter_mut().find(|e| e.id == id) {
            entry.due = after(end, entry.interval);
        }
        DONE.notify_all();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// Counts its sweeps; dropping it drops the registrations it holds (on whatever thread
    /// drops the last `Arc`).
    struct Target {
        sweeps: AtomicUsize,
        held: Mutex<Vec<Registration>>,
        /// Sleeps this long in each sweep.
        slow: Duration,
    }

    impl Sweep for Target {
        fn sweep(&self) -> usize {
            thread::sleep(self.slow);
            self.sweeps.fetch_add(1, Ordering::Relaxed);
            0
        }
    }

    fn target(slow: Duration) -> Arc<Target> {
        Arc::new(Target { sweeps: AtomicUsize::new(0), held: Mutex::new(Vec::new()), slow })
    }

    fn weak(t: &Arc<Target>) -> Weak<dyn Sweep> {
        let weak: Weak<Target> = Arc::downgrade(t);
        weak
    }

    /// Once a registration's drop returns, no sweep of its target runs or starts, also when
    /// the drop came in the middle of a sweep.
    #[test]
    fn no_sweep_after_the_drop() {
        let t = target(Duration::from_millis(5));
        let reg = register(weak(&t), Duration::from_millis(1)).unwrap();
        while t.sweeps.load(Ordering::Relaxed) < 3 {
            thread::sleep(Duration::from_millis(1));
        }
        drop(reg);
        let after = t.sweeps.load(Ordering::Relaxed);
        thread::sleep(Duration::from_millis(50));
        assert_eq!(t.sweeps.load(Ordering::Relaxed), after);
    }

    /// The last strong reference dropped on the sweeper thread, at the end of a sweep, takes
    /// the target's registrations with it (there, so without waiting or joining): no
    /// deadlock, and registering again afterwards works.
    #[test]
    fn registrations_dropped_on_the_sweeper_thread() {
        for _ in 0..20 {
            let t = target(Duration::from_millis(2));
            let own = register(weak(&t), Duration::from_millis(1)).unwrap();
            t.held.lock().unwrap().push(own);
            let other = target(Duration::ZERO);
            t.held.lock().unwrap().push(register(weak(&other), Duration::from_secs(3600)).unwrap());
            let gone = Arc::downgrade(&t);
            while t.sweeps.load(Ordering::Relaxed) == 0 {
                thread::sleep(Duration::from_millis(1));
            }
            // Very likely mid-sweep: the sweeper holds the last `Arc` then.
            drop(t);
            let deadline = Instant::now() + Duration::from_secs(10);
            while gone.strong_count() > 0 {
                assert!(Instant::now() < deadline, "target never dropped");
                thread::sleep(Duration::from_millis(1));
            }
            let again = target(Duration::ZERO);
            let reg = register(weak(&again), Duration::from_millis(1)).unwrap();
            while again.sweeps.load(Ordering::Relaxed) == 0 {
                assert!(Instant::now() < deadline, "no sweep after registering again");
                thread::sleep(Duration::from_millis(1));
            }
            drop(reg);
        }
    }
}
