//! [`Algorithm`]: how a limiter counts each limit, one file per algorithm (`sliding/`,
//! `fixed.rs`, `log.rs`, `gcra.rs`), all run by the same admission protocol (`protocol/`:
//! views, one CAS per limit, rollback across limits, retirement) through the `Counter`
//! trait. That trait, and what the algorithms work on (a limit's `Rule`, a key's `Words`,
//! the packing of a word), are in `counter.rs`, which the protocol and the per-key layout
//! (`layout.rs`) build on: nothing in `algorithm/` depends on either.

pub(crate) mod counter;
mod fixed;
mod gcra;
mod log;
mod sliding;

pub(crate) use fixed::Fixed;
pub(crate) use gcra::Gcra;
pub(crate) use log::Log;
pub(crate) use sliding::Sliding;

use crate::error::ConfigError;
use crate::limit::Limit;
use counter::{Counter, Rule};

/// The most units a [`Algorithm::SlidingLog`] limit may allow per window: the log keeps one
/// 8-byte timestamp per admitted unit inside the window, so this bounds a key's log at
/// 32 KiB per limit.
///
/// ```
/// use slidegate::{Algorithm, ConfigError, Limit, Limiter, MAX_LOG_UNITS};
///
/// let log = |max| Limiter::<u64>::builder().algorithm(Algorithm::SlidingLog).limit(Limit::per_minute(max)).build();
/// assert!(log(MAX_LOG_UNITS).is_ok());
/// assert!(matches!(log(MAX_LOG_UNITS + 1), Err(ConfigError::LogTooLong { most: MAX_LOG_UNITS, .. })));
/// ```
pub const MAX_LOG_UNITS: u64 = 4096;

/// How each limit of a limiter counts: chosen once, on the builder, for all its limits.
/// Every algorithm shares the rest: the map, eviction, the clock, several limits at once,
/// costs, [`Decision`](crate::Decision)s with `retry_after` and `remaining`, `peek`,
/// `reset` and `max_keys`, lock-free admission on an existing key, and exact counts under
/// contention (only admitted units count).
///
/// | algorithm | state per limit and key | over-admission in any window |
/// |---|---|---|
/// | `SlidingWindow` interpolated | at most `(n + 1) × 8` B + 16 B (ring entries as narrow as `max` allows); 8 B for one slot and `max` below 65,535 | below 2 × `max` worst case, ≈ exact on smooth traffic |
/// | `SlidingWindow` strict | same | none (≤ 1 × `max`); may refuse up to one slot early |
/// | `FixedWindow` | 8 B | up to 2 × `max` across a boundary |
/// | `SlidingLog` | 8 B + 8 B per unit in the window | none, and none refused wrongly |
/// | `Gcra` | 8 B | up to 2 × `max` (a full burst, then the refill) |
///
/// The semantics guide's "Choosing an algorithm" measures each on the same traffic
/// (`cargo run --release -p slidegate-tools --bin accuracy`). With feature `serde` it (de)serializes as
/// its variant's name (`"SlidingWindow"`, `"Gcra"`, ...).
///
/// ```
/// use slidegate::{Algorithm, Limit, Limiter};
///
/// let limiter = Limiter::<String>::builder()
///     .algorithm(Algorithm::Gcra)
///     .limit(Limit::per_second(2))
///     .build()?;
/// assert!(limiter.check("a").is_allowed());
/// assert!(limiter.check("a").is_allowed());
/// assert!(!limiter.check("a").is_allowed()); // the burst of 2 is spent; one unit per 500 ms
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Algorithm {
    /// A ring of per-slot counters per key (the default). Interpolated: the oldest slot
    /// counts for the part of it still inside the window, as in the two-bucket estimate.
    /// Strict ([`Limit::strict`]): the oldest slot counts whole, so no interval of length
    /// `window` ever holds more than `max`.
    #[default]
    SlidingWindow,
    /// One counter per window, reset at each multiple of the window (`[k·w, (k+1)·w)` on
    /// the limiter's clock): the naive baseline. A burst at the end of one window and
    /// another at the start of the next admit up to `2 × max` within one window's length.
    /// The limit's precision is ignored.
    FixedWindow,
    /// An exact log of admitted units: a unit counts while it is less than `window` old.
    /// Only admitted units are stored (at most `max` per limit and key, at most
    /// [`MAX_LOG_UNITS`]); each admission writes a new copy of the key's log (an allocation),
    /// freed after a grace period once no check can read the old one.
    SlidingLog,
    /// The generic cell rate algorithm: one theoretical arrival time per limit, advanced by
    /// `window / max` per admitted unit, with a tolerance of `max` units: a token bucket of
    /// `max` tokens refilled at `max` per `window` (governor's `Quota`, redis-cell, Envoy's
    /// token bucket). The interval is rounded up to the nanosecond, so a limit may not allow
    /// more than one unit per nanosecond.
    Gcra,
}

impl Algorithm {
    /// Checks what `limit` needs from this algorithm beyond [`Limit::validate`].
    pub(crate) fn validate(self, limit: &Limit) -> Result<(), ConfigError> {
        match self {
            Algorithm::SlidingLog if limit.max() > MAX_LOG_UNITS => {
                Err(ConfigError::LogTooLong { limit: *limit, most: MAX_LOG_UNITS })
            }
            Algorithm::Gcra if limit.window().as_nanos() < u128::from(limit.max()) => {
                Err(ConfigError::RateTooHigh { limit: *limit })
            }
            Algorithm::SlidingWindow | Algorithm::FixedWindow | Algorithm::SlidingLog
                if limit.get_burst().is_some() =>
            {
                Err(ConfigError::BurstNeedsGcra { limit: *limit })
            }
            _ => Ok(()),
        }
    }

    /// Words of per-key state for `rule`.
    pub(crate) fn words(self, rule: &Rule) -> usize {
        match self {
            Algorithm::SlidingWindow => Sliding::words(rule),
            Algorithm::FixedWindow => Fixed::words(rule),
            Algorithm::SlidingLog => Log::words(rule),
            Algorithm::Gcra => Gcra::words(rule),
        }
    }
}
