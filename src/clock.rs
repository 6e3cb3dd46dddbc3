//! Time for the limiter: one shared atomic holding nanoseconds since the clock's origin.
//! The hot path reads that atomic and never the OS clock. Either a [`ManualClock`] sets it
//! (tests, simulations) or the process's one ticker thread keeps it current from `quanta`.
//!
//! # The real clock: one ticker per process
//! Every real-clock limiter reads the same atomic, and one thread (`slidegate-clock`) keeps
//! it current, however many limiters there are. The first [`real_clock`] lease starts the
//! thread; it ticks at the finest tick among the live leases
//! ([`LimiterBuilder::clock_tick`](crate::LimiterBuilder::clock_tick)); dropping the last
//! lease stops and joins it. Time is counted from one origin per process (taken once), so
//! it never runs backwards when the ticker stops and starts again.
//!
//! A thread waking 1000 times a second costs 2–3 % of a core on a virtual machine (measured
//! with tools/src/bin/idle.rs and a ticker that never sleeps), so the ticker does not tick while
//! nobody reads the clock: [`AWAKE`] after it was last woken it sets the top bit of the
//! atomic ([`STALE`]), which no time ever has (every clock stops at [`END_OF_TIME`] = 2⁶²),
//! and parks. A read is still one load (and a test of that bit); a read that sees the bit
//! takes the exact time from `quanta` (not a tick late), stores it without the bit, and
//! wakes the ticker. Reads after it find a plain time again: the one stored, until the
//! ticker's next tick, as between any two ticks. A busy process pays one wake-up and one OS
//! clock read per [`AWAKE`], never one per check (a mark kept until the ticker runs would
//! send every check to the OS clock, and to a write of the shared atomic, for as long as
//! the scheduler keeps the ticker waiting); an idle one no ticks at all. The sweeper's reads ([`quiet_reads`]) take the exact time without
//! waking the ticker, so sweeping idle limiters does not keep it awake.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

/// Where every clock stands still: 2⁶² ns (about 146 years) after its origin. With windows
/// of at most [`MAX_WINDOW`](crate::MAX_WINDOW), every time computed from it (a slot's end,
/// a retry time, an expiry) stays far below 2⁶⁴, so no arithmetic on times saturates into a
/// wrong answer (tests/uptime.rs runs the clock to this end).
pub(crate) const END_OF_TIME: u64 = 1 << 62;

/// The top bit of the real clock's atomic: set while the ticker sleeps (see the module's
/// docs). No time has it: every clock stops at [`END_OF_TIME`] = 2⁶².
const STALE: u64 = 1 << 63;

/// How long the ticker keeps ticking after it was last woken by a read that found the clock
/// stale. A busy process pays one wake-up (one `unpark`) per `AWAKE`.
const AWAKE: Duration = Duration::from_millis(100);

/// What the limiter reads on every check: nanoseconds since the clock's origin.
///
/// Only the number itself is communicated (no other memory is published with it), so every
/// access is `Relaxed`. Writers only ever raise it (`fetch_max`), so it never runs backwards,
/// and never past [`END_OF_TIME`]. The real clock's atomic may also carry [`STALE`]; a
/// [`ManualClock`]'s never does. A reading returns a time stored in the atomic (a quiet
/// reading too, with the mark kept), so of two readings where one happens-before the other,
/// the first is never the later (coherence).
#[derive(Debug, Clone, Default)]
pub(crate) struct Now(Arc<AtomicU64>);

impl Now {
    #[inline]
    pub(crate) fn nanos(&self) -> u64 {
        let seen = self.0.load(Ordering::Relaxed);
        if seen & STALE == 0 {
            return seen;
        }
        self.refresh(seen)
    }

    /// The real clock, read while its ticker sleeps: the exact time from `quanta`, stored in
    /// the atomic without the mark, and the ticker woken, unless this thread reads quietly
    /// (then stored with the mark kept: the ticker sleeps on).
    #[cold]
    #[inline(never)]
    fn refresh(&self, seen: u64) -> u64 {
        let now = real_nanos().max(seen & !STALE);
        if QUIET.with(Cell::get) {
            return self.store_quietly(seen, now);
        }
        // Only a marked value is replaced: an unmarked one is a time the ticker or another
        // reader stored since, which stands. SeqCst, with the ticker's SeqCst `WOKEN` store
        // and mark (`tick_until`) and the `WOKEN` accesses below: the mark this CAS clears
        // comes after the ticker's `WOKEN = false` in their single total order, so the load
        // below cannot see an older `true` and skip the wake-up (which would leave the
        // ticker parked and this time standing still).
        let mut cur = seen;
        let mut time = now;
        while cur & STALE != 0 {
            time = now.max(cur & !STALE);
            match self.0.compare_exchange_weak(cur, time, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                // Another reader or the ticker stored a time: that is the time read.
                Err(actual) if actual & STALE == 0 => {
                    time = actual;
                    break;
                }
                Err(actual) => cur = actual,
            }
        }
        // Relaxed: only the flag's own value matters; `unpark` synchronizes with the `park`
        // it ends (documented by std), so the ticker then sees it set.
        // SeqCst: see the CAS above.
        if !WOKEN.load(Ordering::SeqCst) && !WOKEN.swap(true, Ordering::SeqCst) {
            if let Some(ticker) = lock(&WAKER).as_ref() {
                ticker.unpark();
            }
        }
        // Only a time stored in the atomic is returned (ours, or the one that beat ours), so
        // readings are coherent: a reading that happens-before another is at most as late
        // (`KeyState::migrate_at` relies on it to time a move after the commits it carries).
        time
    }

    /// A quiet reading is stored too, with the mark kept (the ticker sleeps on), so that
    /// every time any thread returns was stored in the atomic: the sweeper's times reach
    /// other threads through the shards' floors, and a later reading (a move's, see
    /// `KeyState::migrate_at`) must not be earlier than a time a check decided at. A reader
    /// refreshing from an older marked value then fails its CAS and stores at least this.
    fn store_quietly(&self, seen: u64, now: u64) -> u64 {
        let mut cur = seen;
        loop {
            let time = now.max(cur & !STALE);
            // Relaxed: only the number (and the mark, kept as found) is communicated; the
            // wake-up protocol's SeqCst CAS that clears a mark is ordered after the ticker's
            // `fetch_or` by coherence alone, whatever RMWs came between.
            match self.0.compare_exchange_weak(
                cur,
                (cur & STALE) | time,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return time,
                Err(actual) => cur = actual,
            }
        }
    }

    fn raise_to(&self, nanos: u64) {
        self.0.fetch_max(nanos.min(END_OF_TIME), Ordering::Relaxed);
    }
}

/// A clock that moves only when told to. Clones share one time. It starts at zero and
/// stands still 2⁶² ns (about 146 years) later.
///
/// Give it to [`LimiterBuilder::clock`](crate::LimiterBuilder::clock) to drive a limiter in
/// tests or simulations; such a limiter starts no background thread (call
/// [`Limiter::sweep`](crate::Limiter::sweep) yourself).
///
/// [`Limiter::until_ready`](crate::Limiter::until_ready) (feature `tokio`) on such a limiter
/// waits for this clock, not the tokio timer: a refused waiter sleeps until
/// [`advance`](Self::advance) or [`set`](Self::set) moves the clock past its `retry_after`
/// (plus its jitter), measured on this clock, and then checks again. If nothing moves the
/// clock, it waits for ever (cancellably: wrap it in `tokio::time::timeout` in tests).
///
/// ```
/// use std::time::Duration;
/// use slidegate::ManualClock;
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now(), Duration::from_millis(1500));
/// shared.set(Duration::from_secs(1)); // never backwards: ignored
/// assert_eq!(clock.now(), Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Now,
    /// The tasks of `until_ready` waiting for this clock to move (feature `tokio`).
    #[cfg(feature = "tokio")]
    waiters: Arc<Mutex<Vec<std::task::Waker>>>,
}

impl ManualClock {
    /// A new clock at time zero.
    ///
    /// ```
    /// assert_eq!(slidegate::ManualClock::new().now(), std::time::Duration::ZERO);
    /// ```
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `by`, to at most 2⁶² ns (about 146 years) after its origin,
    /// where it stands still.
    ///
    /// ```
    /// let clock = slidegate::ManualClock::new();
    /// clock.advance(std::time::Duration::from_secs(2));
    /// assert_eq!(clock.now().as_secs(), 2);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: see `Now`. A CAS-free add would wrap; saturate instead.
        let mut cur = self.now.nanos();
        loop {
            let next = cur.saturating_add(by).min(END_OF_TIME);
            match self.now.0.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        self.moved();
    }

    /// Moves the clock to `to` since its origin (at most 2⁶² ns), if that is later than
    /// now: a limiter's time never runs backwards, so an earlier time is ignored.
    ///
    /// ```
    /// let clock = slidegate::ManualClock::new();
    /// clock.set(std::time::Duration::from_secs(60));
    /// assert_eq!(clock.now().as_secs(), 60);
    /// ```
    pub fn set(&self, to: Duration) {
        self.now.raise_to(u64::try_from(to.as_nanos()).unwrap_or(u64::MAX));
        self.moved();
    }

    /// Wakes the waiters of `until_ready`, after the time moved (each checks whether its
    /// time has come).
    fn moved(&self) {
        #[cfg(feature = "tokio")]
        for waiter in std::mem::take(&mut *lock(&self.waiters)) {
            waiter.wake();
        }
    }

    /// Ready once this clock reads at least `until` (ns since its origin; at most
    /// [`END_OF_TIME`], where the clock stops).
    #[cfg(feature = "tokio")]
    pub(crate) fn reached(&self, until: u64) -> impl std::future::Future<Output = ()> + '_ {
        let until = until.min(END_OF_TIME);
        std::future::poll_fn(move |cx| {
            if self.now.nanos() >= until {
                return std::task::Poll::Ready(());
            }
            let mut waiters = lock(&self.waiters);
            // Again under the lock: `moved` takes it after the time moved, so either it
            // finds this waker or this finds the new time.
            if self.now.nanos() >= until {
                return std::task::Poll::Ready(());
            }
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            std::task::Poll::Pending
        })
    }

    /// The current time since the clock's origin.
    ///
    /// ```
    /// assert!(slidegate::ManualClock::new().now().is_zero());
    /// ```
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now.nanos())
    }

    pub(crate) fn source(&self) -> Now {
        self.now.clone()
    }
}

/// Reads of the real clock on this thread never wake the ticker: a stale clock is read
/// from `quanta` each time instead. For the sweeper thread, so that sweeping idle limiters
/// does not keep the ticker awake.
pub(crate) fn quiet_reads() {
    QUIET.with(|quiet| quiet.set(true));
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// The process's real time: `quanta`'s clock, the origin every real-clock `Now` counts
/// from (taken once, so time stays monotonic when the ticker stops and starts again), and
/// the one atomic they all read.
struct Source {
    #[cfg(not(slidegate_loom))]
    clock: quanta::Clock,
    #[cfg(not(slidegate_loom))]
    origin: quanta::Instant,
    /// Under loom (whose `--cfg crossbeam_loom` build has no `quanta`), std's clock.
    #[cfg(slidegate_loom)]
    origin: std::time::Instant,
    now: Arc<AtomicU64>,
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| {
        // Stale until the first lease stores the time: a read before that asks `quanta`.
        let now = Arc::new(AtomicU64::new(STALE));
        #[cfg(not(slidegate_loom))]
        {
            let clock = quanta::Clock::new();
            let origin = clock.now();
            Source { clock, origin, now }
        }
        #[cfg(slidegate_loom)]
        Source { origin: std::time::Instant::now(), now }
    })
}

/// Where the real clock starts: 366 days after its origin, not at 0, so that a snapshot
/// loaded into a new process (`Limiter::load`, feature `serde`) can place units counted
/// up to that long before the process started at their own times (older ones are placed
/// at its start, which only keeps them longer). 2⁶² ns (146 years) still leave 145 years.
const REAL_START: u64 = 366 * 86_400 * 1_000_000_000;

/// Nanoseconds since the process's origin plus [`REAL_START`], at most [`END_OF_TIME`].
fn real_nanos() -> u64 {
    let source = source();
    #[cfg(not(slidegate_loom))]
    let elapsed = source.clock.now().saturating_duration_since(source.origin);
    #[cfg(slidegate_loom)]
    let elapsed = source.origin.elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).saturating_add(REAL_START).min(END_OF_TIME)
}

/// Locks a mutex of this module. Nothing under them can panic halfway through an update,
/// so a poisoned lock (a panic elsewhere while it was held) is taken as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live leases and the ticker thread, if running. The ticker itself never takes this
/// lock, so the last lease's drop joins it while holding it (and a new first lease waits
/// for that join: never two tickers at once).
struct Ticker {
    /// Live leases by tick (in ns): the ticker ticks at the finest.
    leases: BTreeMap<u64, usize>,
    running: Option<Running>,
}

struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

static TICKER: Mutex<Ticker> = Mutex::new(Ticker { leases: BTreeMap::new(), running: None });

/// The finest tick among the live leases, in ns; the ticker reads it before every sleep.
static TICK: AtomicU64 = AtomicU64::new(1_000_000);

/// Set by the first read that finds the clock stale (which then wakes the ticker); cleared
/// by the ticker before it marks the clock stale again.
static WOKEN: AtomicBool = AtomicBool::new(false);

/// The running ticker, for a read that finds the clock stale to wake it. Separate from
/// [`TICKER`] so that such a read never waits for a join.
static WAKER: Mutex<Option<Thread>> = Mutex::new(None);

/// Keeps the process's ticker running (at `tick` or finer) while it lives; see
/// [`real_clock`].
#[derive(Debug)]
pub(crate) struct ClockLease {
    tick: u64,
}

/// The real clock: the `Now` every real-clock limiter reads, and a lease on the process's
/// one ticker thread, which the first lease starts, which ticks at the finest `tick` among
/// the live leases, and which the last lease's drop stops and joins. The time is current
/// when this returns (also when the ticker had been stopped).
pub(crate) fn real_clock(tick: Duration) -> std::io::Result<(Now, ClockLease)> {
    let tick = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1);
    let source = source();
    let mut ticker = lock(&TICKER);
    let count = ticker.leases.entry(tick).or_insert(0);
    *count = count.saturating_add(1);
    let finest = ticker.leases.keys().next().copied().unwrap_or(tick);
    // Relaxed: the ticker only needs some recent value; `unpark` below makes it look again.
    let before = TICK.swap(finest, Ordering::Relaxed);
    match &ticker.running {
        Some(running) => {
            if finest < before {
                running.thread.thread().unpark();
            }
        }
        None => {
            // Relaxed: see `Now`. Current for the new limiter before its first check.
            source.now.fetch_and(!STALE, Ordering::Relaxed);
            source.now.fetch_max(real_nanos(), Ordering::Relaxed);
            let stop = Arc::new(AtomicBool::new(false));
            let (flag, now) = (Arc::clone(&stop), Arc::clone(&source.now));
            let spawned = thread::Builder::new()
                .name("slidegate-clock".to_owned())
                .spawn(move || tick_until(&flag, &now));
            match spawned {
                Ok(thread) => {
                    *lock(&WAKER) = Some(thread.thread().clone());
                    ticker.running = Some(Running { stop, thread });
                }
                Err(e) => {
                    drop_lease(&mut ticker, tick);
                    source.now.fetch_or(STALE, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
    }
    Ok((Now(Arc::clone(&source.now)), ClockLease { tick }))
}

/// Removes one lease of `tick`; the finest remaining one is the ticker's tick.
fn drop_lease(ticker: &mut Ticker, tick: u64) {
    if let Some(count) = ticker.leases.get_mut(&tick) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            ticker.leases.remove(&tick);
        }
    }
    if let Some(&finest) = ticker.leases.keys().next() {
        // Relaxed: a coarser tick is taken at the ticker's next sleep; nothing to wake.
        TICK.store(finest, Ordering::Relaxed);
    }
}

impl Drop for ClockLease {
    fn drop(&mut self) {
        let mut ticker = lock(&TICKER);
        drop_lease(&mut ticker, self.tick);
        if !ticker.leases.is_empty() {
            return;
        }
        let Some(running) = ticker.running.take() else { return };
        *lock(&WAKER) = None;
        // Relaxed: `unpark` synchronizes with the `park` it ends (documented by std), so
        // the ticker sees the flag when it wakes; it checks it before every tick.
        running.stop.store(true, Ordering::Relaxed);
        running.thread.thread().unpark();
        // The ticker runs no code of anyone else's, so this drop never runs on it; were it
        // to, it must not join itself.
        if running.thread.thread().id() != thread::current().id() {
            // The ticker cannot panic (it only reads a clock and stores); a Drop must not
            // panic in turn either way.
            let _ = running.thread.join();
        }
        // Marked stale, so the next first lease's reads start exact. (No limiter reads the
        // clock without a lease: a limiter drops its lease last.)
        source().now.fetch_or(STALE, Ordering::Relaxed);
    }
}

/// The ticker: stores the time every tick while awake; after [`AWAKE`] marks the clock
/// [`STALE`] and parks until a read clears the mark (or a lease change, or `stop`).
fn tick_until(stop: &AtomicBool, now: &AtomicU64) {
    let awake = u64::try_from(AWAKE.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let until = real_nanos().saturating_add(awake);
        loop {
            // Relaxed: see `ClockLease::drop`.
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let time = real_nanos();
            // Relaxed: see `Now`.
            now.fetch_max(time, Ordering::Relaxed);
            if time >= until {
                break;
            }
            thread::park_timeout(Duration::from_nanos(TICK.load(Ordering::Relaxed)));
        }
        // SeqCst (both): pairs with the reader's SeqCst CAS and `WOKEN` accesses in
        // `Now::refresh`: a read that clears this mark sees `WOKEN` false (or a later true)
        // and unparks this thread; the `unpark` synchronizes with the `park` below that it
        // ends. A read still setting `WOKEN` from an earlier stale spell only wakes this
        // thread early.
        WOKEN.store(false, Ordering::SeqCst);
        now.fetch_or(STALE, Ordering::SeqCst);
        loop {
            // Relaxed: see `ClockLease::drop`.
            if stop.load(Ordering::Relaxed) {
                return;
            }
            // SeqCst: see above.
            if WOKEN.load(Ordering::SeqCst) {
                break;
            }
            // A backstop: were a wake-up ever missed, the clock would stand still for at most
            // this long.
            thread::park_timeout(Duration::from_secs(1));
        }
        // Relaxed: see `Now`. Readers raised the time meanwhile; the first tick follows.
        now.fetch_and(!STALE, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The real clock moves, never backwards, also across the ticker's stop and restart
    /// (when no other test holds a lease meanwhile) and across its sleep.
    #[test]
    fn real_time_is_monotonic_across_restarts_and_sleeps() {
        let mut last = 0;
        for _ in 0..5 {
            let (now, lease) = real_clock(Duration::from_millis(1)).unwrap();
            let first = now.nanos();
            assert!(first >= last, "{first} after {last}");
            // The ticker moves it (a loaded machine may be slow to schedule a new thread).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut later = now.nanos();
            while later == first {
                assert!(std::time::Instant::now() < deadline, "the clock did not move in 10 s");
                thread::sleep(Duration::from_millis(1));
                later = now.nanos();
            }
            assert!(later > first);
            drop(lease);
            last = later;
        }
        // Stale (asleep or stopped): reads are exact and keep moving.
        let (now, lease) = real_clock(Duration::from_millis(1)).unwrap();
        thread::sleep(AWAKE + Duration::from_millis(50));
        let a = now.nanos();
        let b = now.nanos();
        assert!(a >= last && b >= a && b < END_OF_TIME);
        drop(lease);
    }
}
