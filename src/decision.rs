//! [`Decision`]: what a check answers, with everything an HTTP 429 needs.

use std::time::Duration;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Denial {
    /// The limit at this index (in the order given to the builder) has no room now;
    /// [`Decision::retry_after`] says when it will.
    Limit(usize),
    /// The cost is larger than the `max` of the limit at this index: the request can never
    /// pass, and [`Decision::retry_after`] is `None`.
    CostTooLarge(usize),
    /// The key is new and the limiter already holds `max_keys` keys. Nothing was recorded;
    /// room comes back as idle keys are swept.
    TooManyKeys,
}

/// The answer to a check: admitted or not, how much room is left, and when to retry.
///
/// ```
/// use std::time::Duration;
/// use slidegate::{Denial, Limit, Limiter, ManualClock};
///
/// let clock = ManualClock::new();
/// let limiter = Limiter::<u64>::builder()
///     .limit(Limit::per_second(2))
///     .clock(clock.clone())
///     .build()?;
/// assert_eq!(limiter.check(&7).remaining(), 1);
/// assert!(limiter.check(&7).is_allowed());
/// let d = limiter.check(&7);
/// assert!(!d.is_allowed());
/// assert_eq!(d.denial(), Some(Denial::Limit(0)));
/// // The two units of slot [0 s, 1 s) weigh 2 × (1 − f) in the next slot: ≤ 1 from f = ½.
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a Decision says whether the request may proceed"]
pub struct Decision {
    pub(crate) denial: Option<Denial>,
    pub(crate) remaining: u64,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) tightest: usize,
}

impl Decision {
    /// `true` when the request was admitted (and counted, unless it was a `peek`).
    ///
    /// ```
    /// # use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn is_allowed(&self) -> bool {
        self.denial.is_none()
    }

    /// Units still available in the tightest limit after this decision (an admitted request
    /// is already subtracted; a denied one is not). Whole units, rounded down.
    ///
    /// ```
    /// # use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(5)).build()?;
    /// assert_eq!(limiter.check_n(&1, 2).remaining(), 3);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// For a request refused by a limit: the time after which the same request would be
    /// admitted if no other traffic came (exact to the nanosecond on the limiter's clock,
    /// never early). `None` when admitted, and when waiting cannot help
    /// ([`Denial::CostTooLarge`], [`Denial::TooManyKeys`]).
    ///
    /// ```
    /// # use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// assert_eq!(limiter.check(&1).retry_after(), None);
    /// assert!(limiter.check(&1).retry_after().is_some());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Why the request was refused, or `None` if it was admitted.
    ///
    /// ```
    /// # use slidegate::{Denial, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// assert_eq!(limiter.check_n(&1, 2).denial(), Some(Denial::CostTooLarge(0)));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn denial(&self) -> Option<Denial> {
        self.denial
    }

    /// Index (in builder order) of the limit with the least room after this decision: the
    /// one to report in `RateLimit` headers. For a denial by a limit, that limit.
    ///
    /// ```
    /// # use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(10))
    ///     .limit(Limit::per_minute(3))
    ///     .build()?;
    /// assert_eq!(limiter.check(&1).tightest_limit(), 1);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn tightest_limit(&self) -> usize {
        self.tightest
    }
}
