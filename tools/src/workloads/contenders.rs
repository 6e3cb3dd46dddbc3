//! The two contenders as a user of each library builds them, behind one [`Contender`] trait
//! whose `check` every workload calls through a generic (monomorphized, no `dyn`, no loop
//! over a list of limiters).
//!
//! - [`Slidegate`]: a `Limiter<u64>` built from `Limit::per_second(n)` / `per_minute(n)` /
//!   `per_hour(n)` with their default precision, on the real clock or on a `ManualClock`
//!   that never moves ([`Slidegate::frozen`]).
//! - [`Governor`]: one keyed governor 0.10 limiter in its fastest configuration (DashMap
//!   hashed with ahash, `QuantaUpkeepClock`), or on a `FakeRelativeClock` that never moves;
//!   `check` is `check_key` on it.
//! - [`GovernorThree`]: three governor limiters as fields, checked in order, stopping at the
//!   first refusal: the way a governor user composes limits.

use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::Duration;

use governor::clock::{Clock, FakeRelativeClock, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use slidegate::{Algorithm, Limit, Limiter, ManualClock};

/// Something that answers "may `key` proceed now?" for one unit.
pub trait Contender: Send + Sync + 'static {
    /// Admits (true) or refuses (false) one unit for `key`.
    fn check(&self, key: u64) -> bool;
}

/// The most a hot key's limit admits per minute: far more than any run checks in a minute
/// (a check takes over 10 ns, and no scenario checks one key for a whole minute), so it
/// never refuses. governor's GCRA adds one unit every 15 ns at this rate.
pub const HOT_MAX: u64 = 4_000_000_000;

/// A one-limit policy, spelled the same way for both libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `per_minute(4·10⁹)` (sixty 1-second slots of 32-bit counts): never refuses in a run.
    /// The hot-key rows, on one thread and on two.
    HotMinute,
    /// `per_second(10⁹)` (one slot; governor's GCRA adds one unit per nanosecond, its
    /// finest rate): never refuses in a run. The 1,000-key rows, on one thread and on two.
    HotSecond,
    /// `per_second(1_000)` (one slot): at 1 M keys a key is checked far less than 1,000
    /// times in any second, so it never refuses.
    PerSecond,
    /// `per_minute(60_000)` (sixty 1-second slots of 16-bit counts, as any `max` from
    /// 32,767 to 65,534): 1,000 per second like [`Policy::PerSecond`], in sixty slots. Never
    /// refuses at 1 M keys, even on a frozen clock (a key would need 60,000 checks).
    PerMinute,
    /// `per_minute(1)`: one admission, then refusals for the next minute.
    OnePerMinute,
}

impl Policy {
    /// slidegate's spelling.
    pub fn limit(self) -> Limit {
        match self {
            Policy::HotMinute => Limit::per_minute(HOT_MAX),
            Policy::HotSecond => Limit::per_second(1_000_000_000),
            Policy::PerSecond => Limit::per_second(1_000),
            Policy::PerMinute => Limit::per_minute(60_000),
            Policy::OnePerMinute => Limit::per_minute(1),
        }
    }

    /// governor's spelling.
    pub fn quota(self) -> Quota {
        match self {
            Policy::HotMinute => Quota::per_minute(nonzero(HOT_MAX)),
            Policy::HotSecond => Quota::per_second(nonzero(1_000_000_000)),
            Policy::PerSecond => Quota::per_second(nonzero(1_000)),
            Policy::PerMinute => Quota::per_minute(nonzero(60_000)),
            Policy::OnePerMinute => Quota::per_minute(nonzero(1)),
        }
    }
}

/// The three-limit policy: 10/s + 120/min + 240/h, each with its default precision (one
/// 1-second slot; sixty 1-second slots; sixty 1-minute slots).
pub fn three_limits() -> [Limit; 3] {
    [Limit::per_second(10), Limit::per_minute(120), Limit::per_hour(240)]
}

fn nonzero(n: u64) -> NonZeroU32 {
    NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN)
}

/// slidegate: one `Limiter<u64>`.
pub struct Slidegate(pub Limiter<u64>);

/// How long a real-clock benchmark limiter waits between background sweeps: a day, so that
/// no sweep runs during a measurement (of this scenario or another) and the keys a scenario
/// inserted are the keys it checks, as in governor, which evicts nothing by itself. A key
/// idle past its windows is still replaced by a fresh state when it is next checked: that
/// is part of a check. The sweep's own cost is measured apart.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(86_400);

impl Slidegate {
    /// `limits` with `algorithm`, on the real clock.
    pub fn new(limits: &[Limit], algorithm: Algorithm) -> Slidegate {
        let mut builder = Limiter::<u64>::builder().algorithm(algorithm).sweep_interval(SWEEP_INTERVAL);
        for &limit in limits {
            builder = builder.limit(limit);
        }
        Slidegate(builder.build().unwrap_or_else(|e| unreachable!("valid benchmark policy: {e}")))
    }

    /// `limits` with `algorithm`, on a `ManualClock` that is never moved.
    pub fn frozen(limits: &[Limit], algorithm: Algorithm) -> Slidegate {
        Slidegate::manual(limits, algorithm, ManualClock::new())
    }

    /// `limits` with `algorithm`, on `clock`, which the caller moves (no sweeper runs on a
    /// `ManualClock`).
    pub fn manual(limits: &[Limit], algorithm: Algorithm, clock: ManualClock) -> Slidegate {
        let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(clock);
        for &limit in limits {
            builder = builder.limit(limit);
        }
        Slidegate(builder.build().unwrap_or_else(|e| unreachable!("valid benchmark policy: {e}")))
    }

    /// One policy's limit, the default algorithm (the sliding window), the real clock.
    pub fn sliding(policy: Policy) -> Slidegate {
        Slidegate::new(&[policy.limit()], Algorithm::SlidingWindow)
    }
}

impl Contender for Slidegate {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check(&key).is_allowed()
    }
}

/// One keyed governor limiter on clock `C`.
pub type KeyedGovernor<C> =
    RateLimiter<u64, DashMapStateStore<u64, ahash::RandomState>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// governor: one keyed limiter, checked with `check_key`.
pub struct Governor<C: Clock = QuantaUpkeepClock>(pub KeyedGovernor<C>);

/// quanta allows one upkeep thread per process: every governor shares this clock, which
/// its thread refreshes every millisecond (slidegate's ticker's default too).
fn quanta_clock() -> QuantaUpkeepClock {
    static CLOCK: OnceLock<QuantaUpkeepClock> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .unwrap_or_else(|e| unreachable!("one upkeep thread: {e}"))
        })
        .clone()
}

fn keyed<C: Clock>(quota: Quota, clock: C) -> KeyedGovernor<C> {
    RateLimiter::dashmap_with_clock_and_hasher(quota, clock, ahash::RandomState::new())
}

impl Governor {
    /// `policy` on the coarse upkeep clock.
    pub fn new(policy: Policy) -> Governor {
        Governor(keyed(policy.quota(), quanta_clock()))
    }
}

impl Governor<FakeRelativeClock> {
    /// `policy` on a `FakeRelativeClock` that is never advanced.
    pub fn frozen(policy: Policy) -> Governor<FakeRelativeClock> {
        Governor::manual(policy, FakeRelativeClock::default())
    }

    /// `policy` on `clock`, which the caller advances.
    pub fn manual(policy: Policy, clock: FakeRelativeClock) -> Governor<FakeRelativeClock> {
        Governor(keyed(policy.quota(), clock))
    }
}

impl<C> Contender for Governor<C>
where
    C: Clock + Send + Sync + 'static,
    C::Instant: Send + Sync,
{
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

/// governor with [`three_limits`]: three keyed limiters, checked in order; the first that
/// refuses ends the check (the earlier ones have counted the unit).
pub struct GovernorThree {
    per_second: KeyedGovernor<QuantaUpkeepClock>,
    per_minute: KeyedGovernor<QuantaUpkeepClock>,
    per_hour: KeyedGovernor<QuantaUpkeepClock>,
}

impl GovernorThree {
    pub fn new() -> GovernorThree {
        GovernorThree {
            per_second: keyed(Quota::per_second(nonzero(10)), quanta_clock()),
            per_minute: keyed(Quota::per_minute(nonzero(120)), quanta_clock()),
            per_hour: keyed(Quota::per_hour(nonzero(240)), quanta_clock()),
        }
    }
}

impl Default for GovernorThree {
    fn default() -> GovernorThree {
        GovernorThree::new()
    }
}

impl Contender for GovernorThree {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.per_second.check_key(&key).is_ok()
            && self.per_minute.check_key(&key).is_ok()
            && self.per_hour.check_key(&key).is_ok()
    }
}
