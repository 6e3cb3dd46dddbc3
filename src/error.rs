//! [`ConfigError`]: everything that can be wrong with a limiter's configuration;
//! [`IdentitiesError`]: what can be wrong with the keys given to one
//! [`check_all`](crate::Limiter::check_all).

use std::fmt;
use std::time::Duration;

use crate::limit::Limit;

/// A configuration the limiter refuses, saying what is wrong.
///
/// Returned by [`LimiterBuilder::build`](crate::LimiterBuilder::build),
/// [`Limit::validate`] and `str::parse::<Limit>()`. Nothing in slidegate panics on a bad
/// configuration.
///
/// ```
/// use slidegate::{ConfigError, Limiter};
///
/// let err = Limiter::<u64>::builder().build().unwrap_err();
/// assert_eq!(err, ConfigError::NoLimits);
/// assert_eq!(err.to_string(), "no limits: add at least one with .limit(...)");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The builder was given no limit.
    NoLimits,
    /// A limit with `max` 0 would refuse everything.
    ZeroMax {
        /// The offending limit.
        limit: Limit,
    },
    /// `max` does not fit the 32-bit counters.
    MaxTooLarge {
        /// The offending limit.
        limit: Limit,
        /// The largest `max` allowed.
        most: u64,
    },
    /// A zero-length window.
    ZeroWindow {
        /// The offending limit.
        limit: Limit,
    },
    /// A window longer than [`MAX_WINDOW`](crate::MAX_WINDOW) (100 years).
    WindowTooLong {
        /// The offending limit.
        limit: Limit,
        /// The longest window allowed.
        most: Duration,
    },
    /// A zero-length slot.
    ZeroPrecision {
        /// The offending limit.
        limit: Limit,
    },
    /// Window and precision must be whole milliseconds.
    NotWholeMilliseconds {
        /// The offending limit.
        limit: Limit,
    },
    /// The slot is longer than the window.
    PrecisionLongerThanWindow {
        /// The offending limit.
        limit: Limit,
    },
    /// The window is not a whole number of slots.
    PrecisionDoesNotDivideWindow {
        /// The offending limit.
        limit: Limit,
    },
    /// The window has more slots than [`MAX_SLOTS`](crate::MAX_SLOTS).
    TooManySlots {
        /// The offending limit.
        limit: Limit,
        /// `window / precision`.
        slots: u64,
        /// The most slots allowed.
        most: u64,
    },
    /// The longest window spans more than 2^30 slots of `limit`: the 32-bit slot tags
    /// (compared within 2^31 slots, with a 2^30 margin for stale readers) could then not
    /// tell an idle key's old slots from new ones.
    SpanTooWide {
        /// The limit with the finest precision.
        limit: Limit,
        /// The longest window of the limiter.
        longest_window: Duration,
    },
    /// A limit string that does not parse.
    Parse {
        /// The string given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// More limits than [`MAX_LIMITS`](crate::MAX_LIMITS) on one limiter.
    TooManyLimits {
        /// How many were given.
        given: usize,
        /// The most allowed.
        most: usize,
    },
    /// The limiter's background thread (clock ticker or sweeper) could not be started.
    ThreadSpawn {
        /// Which thread.
        thread: &'static str,
        /// The operating system's reason.
        reason: String,
    },
    /// `max_keys(0)` would refuse every key.
    ZeroMaxKeys,
    /// A zero sweep interval would spin the sweeper.
    ZeroSweepInterval,
    /// A [`burst`](Limit::burst) of 0 units would refuse everything.
    ZeroBurst {
        /// The offending limit.
        limit: Limit,
    },
    /// A [`burst`](Limit::burst) larger than the counters hold.
    BurstTooLarge {
        /// The offending limit.
        limit: Limit,
        /// The largest burst allowed.
        most: u64,
    },
    /// A [`burst`](Limit::burst) under an algorithm other than
    /// [`Gcra`](crate::Algorithm::Gcra), which has no bucket to size.
    BurstNeedsGcra {
        /// The offending limit.
        limit: Limit,
    },
    /// A clock tick shorter than the ticker can keep: it would spin the ticker thread for
    /// no finer decisions.
    ClockTickTooShort {
        /// The tick asked for.
        given: Duration,
        /// The shortest tick allowed.
        least: Duration,
    },
    /// A [`SlidingLog`](crate::Algorithm::SlidingLog) limit whose `max` would make each
    /// key's log too large (one 8-byte timestamp per unit in the window).
    LogTooLong {
        /// The offending limit.
        limit: Limit,
        /// The largest `max` a log limit may have ([`MAX_LOG_UNITS`](crate::MAX_LOG_UNITS)).
        most: u64,
    },
    /// A [`Gcra`](crate::Algorithm::Gcra) limit of more than one unit per nanosecond: the
    /// emission interval `window / max` would round to zero.
    RateTooHigh {
        /// The offending limit.
        limit: Limit,
    },
    /// No policy of that name (given to [`Limiter::set_policy`](crate::Limiter::set_policy),
    /// [`Limiter::update_policy`](crate::Limiter::update_policy) or
    /// [`LimiterBuilder::default_policy`](crate::LimiterBuilder::default_policy)).
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// Two policies of one limiter share a name.
    DuplicatePolicy {
        /// The name.
        name: String,
    },
    /// A named policy's limits are invalid.
    InPolicy {
        /// The policy's name.
        name: String,
        /// What is wrong with its limits.
        error: Box<ConfigError>,
    },
    /// A setting of a backend beyond one process (feature `memcached`: its key prefix, its
    /// pool size) that the backend cannot use.
    InvalidBackendSetting {
        /// The setting, as the builder's method names it (`"prefix"`, `"pool_size"`).
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoLimits => f.write_str("no limits: add at least one with .limit(...)"),
            ConfigError::ZeroMax { limit } => {
                write!(f, "limit {limit}: max is 0, so it would refuse every request")
            }
            ConfigError::MaxTooLarge { limit, most } => {
                write!(f, "limit {limit}: max is larger than {most}; count in larger units")
            }
            ConfigError::ZeroWindow { limit } => write!(f, "limit {limit}: the window is zero"),
            ConfigError::WindowTooLong { limit, most } => write!(
                f,
                "limit {limit}: the window ({:?}) is longer than {} days",
                limit.window(),
                most.as_secs() / 86_400
            ),
            ConfigError::ZeroPrecision { limit } => write!(f, "limit {limit}: the precision is zero"),
            ConfigError::NotWholeMilliseconds { limit } => write!(
                f,
                "limit {limit}: window ({:?}) and precision ({:?}) must be whole milliseconds",
                limit.window(),
                limit.get_precision()
            ),
            ConfigError::PrecisionLongerThanWindow { limit } => write!(
                f,
                "limit {limit}: the precision ({:?}) is longer than the window ({:?})",
                limit.get_precision(),
                limit.window()
            ),
            ConfigError::PrecisionDoesNotDivideWindow { limit } => write!(
                f,
                "limit {limit}: the window ({:?}) is not a whole number of slots of {:?}",
                limit.window(),
                limit.get_precision()
            ),
            ConfigError::TooManySlots { limit, slots, most } => write!(
                f,
                "limit {limit}: {slots} slots per window, more than {most}; use a coarser precision"
            ),
            ConfigError::SpanTooWide { limit, longest_window } => write!(
                f,
                "limit {limit}: the longest window ({longest_window:?}) spans more than 2^30 of its \
                 {:?} slots; use a coarser precision",
                limit.get_precision()
            ),
            ConfigError::Parse { input, reason } => write!(f, "cannot parse limit {input:?}: {reason}"),
            ConfigError::TooManyLimits { given, most } => {
                write!(f, "{given} limits given; at most {most} apply together")
            }
            ConfigError::ThreadSpawn { thread, reason } => {
                write!(f, "cannot start the {thread} thread: {reason}")
            }
            ConfigError::ZeroMaxKeys => f.write_str("max_keys is 0, so every key would be refused"),
            ConfigError::ZeroSweepInterval => f.write_str("the sweep interval is zero"),
            ConfigError::ZeroBurst { limit } => write!(f, "limit {limit}: a burst of 0 units would refuse everything"),
            ConfigError::BurstTooLarge { limit, most } => {
                write!(f, "limit {limit}: the burst is larger than {most}, the most a counter holds")
            }
            ConfigError::BurstNeedsGcra { limit } => write!(
                f,
                "limit {limit}: a burst sizes GCRA's bucket; the other algorithms have none (use .algorithm(Algorithm::Gcra))"
            ),
            ConfigError::ClockTickTooShort { given, least } => {
                write!(
                    f,
                    "a clock tick of {given:?} is shorter than the shortest the ticker keeps, {least:?}"
                )
            }
            ConfigError::LogTooLong { limit, most } => write!(
                f,
                "limit {limit}: a sliding log keeps one 8-byte timestamp per unit, and {} units \
                 per window would let each key's log reach {} bytes; at most {most} units per \
                 window (count in larger units, or use the sliding window)",
                limit.max(),
                limit.max().saturating_mul(8)
            ),
            ConfigError::RateTooHigh { limit } => write!(
                f,
                "limit {limit}: GCRA spaces units at least 1 ns apart, and {} per {:?} is faster",
                limit.max(),
                limit.window()
            ),
            ConfigError::UnknownPolicy { name } => write!(f, "no policy named {name:?}"),
            ConfigError::DuplicatePolicy { name } => write!(f, "two policies are named {name:?}"),
            ConfigError::InPolicy { name, error } => write!(f, "policy {name:?}: {error}"),
            ConfigError::InvalidBackendSetting { setting, reason } => write!(f, "{setting}: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Keys [`Limiter::check_all`](crate::Limiter::check_all) cannot charge one request to: an
/// error in the call, not in the limiter's configuration. Nothing is counted.
///
/// ```
/// use slidegate::{IdentitiesError, Limit, Limiter, MAX_IDENTITIES};
/// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
/// assert_eq!(limiter.check_all(&[], 1).unwrap_err(), IdentitiesError::NoKeys);
/// let keys: Vec<u64> = (0..=MAX_IDENTITIES as u64).collect();
/// let refs: Vec<&u64> = keys.iter().collect();
/// let err = limiter.check_all(&refs, 1).unwrap_err();
/// assert_eq!(err, IdentitiesError::TooManyKeys { given: MAX_IDENTITIES + 1, most: MAX_IDENTITIES });
/// assert_eq!(err.to_string(), "5 keys given to check_all; at most 4 are charged together");
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentitiesError {
    /// No key: a request charged to nobody has no decision.
    NoKeys,
    /// More keys than [`MAX_IDENTITIES`](crate::MAX_IDENTITIES).
    TooManyKeys {
        /// How many were given.
        given: usize,
        /// The most allowed.
        most: usize,
    },
}

impl fmt::Display for IdentitiesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentitiesError::NoKeys => {
                f.write_str("no keys given to check_all: a request needs at least one")
            }
            IdentitiesError::TooManyKeys { given, most } => {
                write!(f, "{given} keys given to check_all; at most {most} are charged together")
            }
        }
    }
}

impl std::error::Error for IdentitiesError {}
