//! [`Decision`]: what a check answers, with everything an HTTP 429 needs.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

/// Why a request was refused.
///
/// ```
/// use slidegate::{Denial, Limit, Limiter, ManualClock};
///
/// let limiter = Limiter::<u64>::builder()
///     .limit(Limit::per_second(2))
///     .limit(Limit::per_minute(3))
///     .max_keys(1)
///     .clock(ManualClock::new())
///     .build()?;
/// assert!(limiter.check_n(&1, 2).is_allowed());
/// assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0))); // 2/s is spent
/// assert_eq!(limiter.check_n(&1, 4).denial(), Some(Denial::CostTooLarge(0))); // never fits
/// assert_eq!(limiter.check(&2).denial(), Some(Denial::TooManyKeys)); // max_keys(1)
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
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
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a Decision says whether the request may proceed"]
pub struct Decision {
    // Two words, so that a check returns it in two registers rather than through memory.
    /// Nanoseconds; `NO_RETRY` when there is no retry time.
    retry_after: u64,
    /// `remaining` (32 bits, as `max` is at most 2³² − 1) | kind << 32 | limit << 40, where
    /// the limit is the one a denial names, or the tightest one.
    /// Never zero (kinds start at 1), which lets `Option<Decision>` stay two words.
    packed: NonZeroU64,
}

const NO_RETRY: u64 = u64::MAX;

const ALLOWED: u64 = 1;
const LIMIT: u64 = 2;
const COST_TOO_LARGE: u64 = 3;
const TOO_MANY_KEYS: u64 = 4;
/// Set on a refusal a shadow-mode limiter turned into an admission.
const SHADOW: u64 = 0x80;

impl Decision {
    #[inline]
    fn new(kind: u64, limit: usize, remaining: u64, retry_after: u64) -> Decision {
        // Limit indices are below MAX_LIMITS (8); room is at most MAX_UNITS (2³² − 1).
        let limit = (limit as u64).min(0xFF);
        let packed = remaining.min(u64::from(u32::MAX)) | kind << 32 | limit << 40;
        Decision { retry_after, packed: NonZeroU64::new(packed).unwrap_or(NonZeroU64::MIN) }
    }

    #[inline]
    pub(crate) fn allowed(remaining: u64, tightest: usize) -> Decision {
        Decision::new(ALLOWED, tightest, remaining, NO_RETRY)
    }

    /// Refused by limit `limit`, admissible again after `retry_after` ns (saturating just
    /// below the "none" marker).
    #[inline]
    pub(crate) fn limited(limit: usize, remaining: u64, retry_after: u64) -> Decision {
        Decision::new(LIMIT, limit, remaining, retry_after.min(NO_RETRY - 1))
    }

    /// The same decision with `remaining` replaced.
    pub(crate) fn with_remaining(self, remaining: u64) -> Decision {
        let packed = (self.packed.get() & !0xFFFF_FFFF) | remaining.min(u64::from(u32::MAX));
        Decision { retry_after: self.retry_after, packed: NonZeroU64::new(packed).unwrap_or(self.packed) }
    }

    pub(crate) fn cost_too_large(limit: usize, remaining: u64) -> Decision {
        Decision::new(COST_TOO_LARGE, limit, remaining, NO_RETRY)
    }

    pub(crate) fn too_many_keys() -> Decision {
        Decision::new(TOO_MANY_KEYS, 0, 0, NO_RETRY)
    }

    #[inline]
    fn kind(&self) -> u64 {
        (self.packed.get() >> 32) & 0x7F
    }

    fn is_shadow(&self) -> bool {
        (self.packed.get() >> 32) & SHADOW != 0
    }

    /// This refusal, admitted by a limiter in shadow mode (see
    /// [`shadow_denial`](Self::shadow_denial)).
    pub(crate) fn shadowed(self) -> Decision {
        if self.kind() == ALLOWED || self.kind() == TOO_MANY_KEYS {
            return self;
        }
        let packed = self.packed.get() | SHADOW << 32;
        Decision { retry_after: self.retry_after, packed: NonZeroU64::new(packed).unwrap_or(self.packed) }
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("denial", &self.denial())
            .field("shadow_denial", &self.shadow_denial())
            .field("remaining", &self.remaining())
            .field("retry_after", &self.retry_after())
            .field("tightest_limit", &self.tightest_limit())
            .finish()
    }
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
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.kind() == ALLOWED || self.is_shadow()
    }

    /// In shadow mode ([`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow)): the
    /// denial this admitted request would have got; `None` otherwise. A shadow denial
    /// consumes nothing (a refusal never does), so enabling enforcement later changes
    /// nothing but the answers.
    ///
    /// ```
    /// use slidegate::{Denial, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).shadow(true).build()?;
    /// assert_eq!(limiter.check(&1).shadow_denial(), None);
    /// let second = limiter.check(&1);
    /// assert!(second.is_allowed());
    /// assert_eq!(second.shadow_denial(), Some(Denial::Limit(0)));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn shadow_denial(&self) -> Option<Denial> {
        if !self.is_shadow() {
            return None;
        }
        match self.kind() {
            LIMIT => Some(Denial::Limit(self.tightest_limit())),
            COST_TOO_LARGE => Some(Denial::CostTooLarge(self.tightest_limit())),
            _ => None,
        }
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
        self.packed.get() & 0xFFFF_FFFF
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
        (self.retry_after != NO_RETRY && !self.is_shadow()).then(|| Duration::from_nanos(self.retry_after))
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
        if self.is_shadow() {
            return None;
        }
        let limit = self.tightest_limit();
        match self.kind() {
            LIMIT => Some(Denial::Limit(limit)),
            COST_TOO_LARGE => Some(Denial::CostTooLarge(limit)),
            TOO_MANY_KEYS => Some(Denial::TooManyKeys),
            _ => None,
        }
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
        (self.packed.get() >> 40) as usize
    }
}
