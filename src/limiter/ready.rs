//! Waiting for room (feature `tokio`): [`Limiter::until_ready`] and
//! [`Limiter::until_ready_with_jitter`] check again after each refusal's `retry_after`,
//! lengthened by a random extra of up to a [`Jitter`].

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use super::Limiter;
use crate::decision::Decision;

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Waits until `cost` units of `key` are admitted, sleeping for each refusal's
    /// `retry_after` (feature `tokio`, on the tokio timer), and returns the admission; or
    /// returns the refusal at once when waiting cannot help (a cost above a limit's `max`, or
    /// the table full at `max_keys`). The same as
    /// [`until_ready_with_jitter`](Self::until_ready_with_jitter) with [`Jitter::NONE`].
    ///
    /// Cancellation-safe: nothing is consumed until the admission itself, which happens
    /// inside one poll, so dropping the future while it sleeps (e.g. in `tokio::select!` or
    /// under a timeout) leaves the key's budget untouched. Waiters are not queued: when
    /// several wait on one key, whoever checks first after the wait takes the room (and
    /// without jitter they all check at the same instant: see
    /// [`until_ready_with_jitter`](Self::until_ready_with_jitter)).
    ///
    /// On a [`ManualClock`] the waits are on that clock, not the tokio timer: a refused
    /// waiter sleeps until [`ManualClock::advance`] or [`ManualClock::set`] moves the clock
    /// past its `retry_after`, then checks again. Nothing else wakes it: if nothing moves
    /// the clock it waits for ever (wrap it in `tokio::time::timeout` in a test).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), slidegate::ConfigError> {
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    ///
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(20)).build()?;
    /// let started = std::time::Instant::now();
    /// for _ in 0..21 {
    ///     assert!(limiter.until_ready(&7, 1).await.is_ok());
    /// }
    /// assert!(started.elapsed() >= Duration::from_millis(40)); // the 21st waited
    /// assert!(limiter.until_ready(&7, 100).await.is_err()); // can never fit 20/s
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`ManualClock`]: crate::ManualClock
    /// [`ManualClock::advance`]: crate::ManualClock::advance
    /// [`ManualClock::set`]: crate::ManualClock::set
    #[cfg(feature = "tokio")]
    pub async fn until_ready<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_ready_with_jitter(key, cost, Jitter::NONE).await
    }

    /// [`until_ready`](Self::until_ready), each wait lengthened by a random extra of up to
    /// `jitter`: waiters refused together (a burst on one key, clients retrying in step)
    /// then check again spread over that span instead of all at the same instant, where
    /// the first few would take the room and the rest go back to sleep together. Each wait
    /// is `retry_after` plus a fresh draw, uniform in `[0, jitter]`; with
    /// [`Jitter::NONE`] it is exactly `until_ready`. On a [`ManualClock`] the extra is
    /// measured on that clock too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), slidegate::ConfigError> {
    /// use std::time::{Duration, Instant};
    /// use slidegate::{Jitter, Limit, Limiter};
    ///
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(20)).build()?;
    /// let jitter = Jitter::up_to(Duration::from_millis(10));
    /// let started = Instant::now();
    /// for _ in 0..21 {
    ///     assert!(limiter.until_ready_with_jitter(&7, 1, jitter).await.is_ok());
    /// }
    /// assert!(started.elapsed() >= Duration::from_millis(40)); // the 21st waited
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`ManualClock`]: crate::ManualClock
    #[cfg(feature = "tokio")]
    pub async fn until_ready_with_jitter<Q>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let decision = self.check_n(key, cost);
            let wait = match (decision.is_allowed(), decision.retry_after()) {
                (true, _) => return Ok(decision),
                (false, Some(wait)) => wait.saturating_add(jitter.draw()),
                (false, None) => return Err(decision),
            };
            match &self.shared.manual {
                Some(clock) => {
                    let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                    clock.reached(self.shared.now.nanos().saturating_add(wait)).await;
                }
                None => tokio::time::sleep(wait).await,
            }
        }
    }
}

/// A bound on the random extra wait of
/// [`Limiter::until_ready_with_jitter`] (feature `tokio`): each wait is the refusal's
/// `retry_after` plus a fresh draw, uniform in `[0, max]`, so that waiters refused together
/// do not all check again at the same instant.
///
/// The draws come from the standard library's randomly keyed SipHash (a new
/// `RandomState` per draw, hashing the current instant): no extra dependency, no
/// allocation, good enough to spread wake-ups (not meant for anything secret).
///
/// ```
/// use std::time::Duration;
/// use slidegate::Jitter;
///
/// let jitter = Jitter::up_to(Duration::from_millis(50));
/// assert_eq!(jitter.max(), Duration::from_millis(50));
/// assert_eq!(Jitter::default(), Jitter::NONE);
/// assert!(Jitter::NONE.max().is_zero());
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Jitter {
    max: Duration,
}

#[cfg(feature = "tokio")]
impl Jitter {
    /// No extra wait: [`Limiter::until_ready`].
    ///
    /// ```
    /// assert!(slidegate::Jitter::NONE.max().is_zero());
    /// ```
    pub const NONE: Jitter = Jitter { max: Duration::ZERO };

    /// Extra waits uniform in `[0, max]`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let jitter = slidegate::Jitter::up_to(Duration::from_secs(1));
    /// assert_eq!(jitter.max(), Duration::from_secs(1));
    /// ```
    pub const fn up_to(max: Duration) -> Jitter {
        Jitter { max }
    }

    /// The longest extra wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(slidegate::Jitter::up_to(Duration::from_millis(7)).max(), Duration::from_millis(7));
    /// ```
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// One extra wait, uniform in `[0, max]` (to the nanosecond; a `max` above 2⁶⁴ ns,
    /// some 584 years, counts as 2⁶⁴ - 1 ns).
    fn draw(self) -> Duration {
        use std::hash::BuildHasher;
        let max = u64::try_from(self.max.as_nanos()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        // Each `RandomState` has keys of its own (the thread's random keys, the first one
        // incremented per `new`): successive draws are independent SipHash outputs.
        let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
        let extra = match max.checked_add(1) {
            Some(span) => random.checked_rem(span).unwrap_or(0),
            None => random,
        };
        Duration::from_nanos(extra)
    }
}
