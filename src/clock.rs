//! Time for the limiter: one shared atomic holding nanoseconds since the clock's origin.
//! The hot path reads that atomic and never the OS clock. Either a [`ManualClock`] sets it
//! (tests, simulations) or a background ticker keeps it current from `quanta`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::background::Periodic;

/// Where every clock stands still: 2⁶² ns (about 146 years) after its origin. With windows
/// of at most [`MAX_WINDOW`](crate::MAX_WINDOW), every time computed from it (a slot's end,
/// a retry time, an expiry) stays far below 2⁶⁴, so no arithmetic on times saturates into a
/// wrong answer (tests/uptime.rs runs the clock to this end).
pub(crate) const END_OF_TIME: u64 = 1 << 62;

/// What the limiter reads on every check: nanoseconds since the clock's origin.
///
/// Only the number itself is communicated (no other memory is published with it), so every
/// access is `Relaxed`. Writers only ever raise it (`fetch_max`), so it never runs backwards,
/// and never past [`END_OF_TIME`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Now(Arc<AtomicU64>);

impl Now {
    #[inline]
    pub(crate) fn nanos(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
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
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
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

/// The real clock: a thread wakes every `tick` and stores `quanta`'s monotonic time into the
/// shared atomic. Reading it costs one load; its resolution is the tick.
pub(crate) fn start_coarse_clock(tick: Duration) -> std::io::Result<(Now, Periodic)> {
    let now = Now::default();
    let clock = quanta::Clock::new();
    let origin = clock.now();
    let writer = now.clone();
    let ticker = Periodic::spawn("slidegate-clock", tick, move || {
        let elapsed = clock.now().saturating_duration_since(origin);
        writer.raise_to(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
    })?;
    Ok((now, ticker))
}
