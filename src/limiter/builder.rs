//! [`LimiterBuilder`]: a limiter's configuration, from [`Limiter::builder`] to
//! [`build`](LimiterBuilder::build), which validates it, compiles the policies and takes a
//! share of the process's clock ticker and sweeper (with the real clock).

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;

use super::{Limiter, Resolver, Shared, Tracked};
use crate::algorithm::Algorithm;
use crate::clock::{real_clock, ManualClock};
use crate::error::ConfigError;
use crate::housekeeper;
use crate::limit::Limit;
use crate::metrics::Metrics;
use crate::offenders::Offenders;
use crate::policy::{PolicyConfig, Tiers, DEFAULT_POLICY};
use crate::table::{Table, WhenFull};

/// The default resolution of the real clock.
const DEFAULT_TICK: Duration = Duration::from_millis(1);

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Starts configuring a limiter.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(5)).build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn builder() -> LimiterBuilder<K> {
        LimiterBuilder {
            name: "slidegate".to_owned(),
            shadow: false,
            algorithm: Algorithm::default(),
            limits: Vec::new(),
            policies: Vec::new(),
            default_policy: None,
            resolver: None,
            clock: None,
            max_keys: None,
            when_full: WhenFull::default(),
            sweep_interval: None,
            tick: DEFAULT_TICK,
            track_refused: 0,
            _key: PhantomData,
        }
    }
}

/// The shortest clock tick [`LimiterBuilder::clock_tick`] takes: a finer one would keep the
/// ticker thread spinning.
const SHORTEST_TICK: Duration = Duration::from_micros(50);

impl Limiter<()> {
    /// A limiter with no keys (governor's direct limiter): one budget for everything
    /// checked through it, such as the calls a client makes to an upstream; check it with
    /// `check(&())`. For more than one limit, or any other setting, use
    /// [`Limiter::builder`] with `()` keys.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let upstream = Limiter::direct(Limit::per_second(20))?;
    /// assert!(upstream.check(&()).is_allowed());
    /// assert_eq!(upstream.check(&()).remaining(), 18);
    /// let parsed = Limiter::direct("100/min".parse()?)?;
    /// # let _ = parsed;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn direct(limit: Limit) -> Result<Limiter<()>, ConfigError> {
        Limiter::<()>::builder().limit(limit).max_keys(1).build()
    }
}

/// Configures a [`Limiter`]; see [`Limiter::builder`].
///
/// ```
/// use std::time::Duration;
/// use slidegate::{Limit, Limiter};
///
/// let limiter = Limiter::<std::net::IpAddr>::builder()
///     .limit("10/s".parse()?)
///     .limit("120/min".parse()?)
///     .max_keys(1_000_000)
///     .sweep_interval(Duration::from_secs(5))
///     .build()?;
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until .build()"]
pub struct LimiterBuilder<K> {
    name: String,
    shadow: bool,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    policies: Vec<(String, PolicyConfig)>,
    default_policy: Option<String>,
    resolver: Option<Resolver<K>>,
    clock: Option<ManualClock>,
    max_keys: Option<usize>,
    when_full: WhenFull,
    sweep_interval: Option<Duration>,
    tick: Duration,
    track_refused: usize,
    _key: PhantomData<fn() -> K>,
}

impl<K> fmt::Debug for LimiterBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("name", &self.name)
            .field("shadow", &self.shadow)
            .field("algorithm", &self.algorithm)
            .field("limits", &self.limits)
            .field("policies", &self.policies)
            .field("default_policy", &self.default_policy)
            .field("resolver", &self.resolver.is_some())
            .field("manual_clock", &self.clock.is_some())
            .field("max_keys", &self.max_keys)
            .field("when_full", &self.when_full)
            .field("sweep_interval", &self.sweep_interval)
            .field("tick", &self.tick)
            .finish()
    }
}

impl<K> LimiterBuilder<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Adds a limit. Repeatable: every limit applies to every request.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(10))
    ///     .limit(Limit::per_minute(120))
    ///     .build()?;
    /// assert_eq!(limiter.limits().len(), 2);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Adds a named policy (a tier: `"free"`, `"paid"`, `"internal"`). Each key is checked
    /// against one policy: the one [`Limiter::set_policy`] gave it, else the one the
    /// [`resolver`](Self::resolver) names, else the [default](Self::default_policy). The
    /// limits given with [`limit`](Self::limit) form a policy named `"default"`. A key's
    /// state holds a pointer to its policy, not a copy of the limits. One algorithm runs
    /// every policy.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<String>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_second(2)]))
    ///     .policy("paid", PolicyConfig::new([Limit::per_second(20)]))
    ///     .resolver(|key: &String| key.split_once(':').map(|(tier, _)| tier))
    ///     .build()?;
    /// assert_eq!(limiter.check("paid:acme").remaining(), 19);
    /// assert_eq!(limiter.check("free:bob").remaining(), 1);
    /// assert_eq!(limiter.check("bob").remaining(), 1); // no tier: the default (the first)
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn policy(mut self, name: &str, config: PolicyConfig) -> Self {
        self.policies.push((name.to_owned(), config));
        self
    }

    /// The policy of keys that have no override and that the resolver names no policy for.
    /// Default: `"default"` (the limits given with [`limit`](Self::limit)) if there are
    /// any, else the first [`policy`](Self::policy). A name that is no policy's makes
    /// [`build`](Self::build) fail.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_second(2)]))
    ///     .policy("trial", PolicyConfig::new([Limit::per_second(1)]))
    ///     .default_policy("trial")
    ///     .build()?;
    /// assert_eq!(limiter.policy_of(&5), "trial");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn default_policy(mut self, name: &str) -> Self {
        self.default_policy = Some(name.to_owned());
        self
    }

    /// Chooses a key's policy by name from the key itself. Called once when a key's state
    /// is created (not on every check), so it must depend on the key alone; `None`, or a
    /// name that is no policy's, gives the default (a name that is no policy's is counted
    /// in [`metrics::UNKNOWN_POLICY`](crate::metrics::UNKNOWN_POLICY): refusing the key
    /// would turn a mistake in the resolver into an outage). Clients choose their keys, so
    /// look the key up in records of your own rather than read a tier from its text. To
    /// change one key's policy at runtime, use [`Limiter::set_policy`].
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder()
    ///     .policy("users", PolicyConfig::new([Limit::per_second(10)]))
    ///     .policy("internal", PolicyConfig::new([Limit::per_second(1000)]))
    ///     .resolver(|id: &u64| (*id < 100).then_some("internal"))
    ///     .build()?;
    /// assert_eq!(limiter.policy_of(&7), "internal");
    /// assert_eq!(limiter.policy_of(&700), "users");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn resolver(mut self, resolver: impl Fn(&K) -> Option<&str> + Send + Sync + 'static) -> Self {
        self.resolver = Some(Box::new(resolver));
        self
    }

    /// Names the limiter: the `limiter` label of its metrics (feature `metrics`) and its
    /// `Debug` output. Default: `"slidegate"`.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().name("login").limit(Limit::per_minute(5)).build()?;
    /// assert_eq!(limiter.name(), "login");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// Shadow mode: every decision is computed and reported (metrics count the would-be
    /// refusals in their own series, [`SHADOW_DENIED_UNITS`](crate::metrics::SHADOW_DENIED_UNITS)), but a request a limit refuses is admitted anyway, with the denial it would
    /// have got in [`Decision::shadow_denial`]; as refusals never consume, a shadow denial
    /// consumes nothing. For trying a new limit on live traffic before enforcing it. A full
    /// table (`max_keys`) still refuses: that is capacity, not policy. Default: off.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let trial = Limiter::<u64>::builder().limit(Limit::per_minute(100)).shadow(true).build()?;
    /// let would_refuse = (0..150).filter(|_| trial.check(&7).shadow_denial().is_some()).count();
    /// assert_eq!(would_refuse, 50);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    ///
    /// [`Decision::shadow_denial`]: crate::Decision::shadow_denial
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Chooses how every limit counts (default: [`Algorithm::SlidingWindow`]).
    ///
    /// ```
    /// use slidegate::{Algorithm, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder()
    ///     .algorithm(Algorithm::FixedWindow)
    ///     .limit(Limit::per_minute(100))
    ///     .build()?;
    /// assert_eq!(limiter.algorithm(), Algorithm::FixedWindow);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Drives the limiter from a [`ManualClock`] instead of the real clock. Such a limiter
    /// starts no background thread; call [`Limiter::sweep`] to evict idle keys.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, ManualClock};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).clock(clock.clone()).build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Holds at most `max_keys` keys. A new key beyond that takes the place of a held key
    /// that is idle (its windows count nothing, so nothing is forgotten), found at the new
    /// key's check without waiting for a sweep; when every key looked at is live,
    /// [`when_full`](Self::when_full) decides (by default the new key is refused with
    /// [`Denial::TooManyKeys`](crate::Denial::TooManyKeys) and nothing held is touched).
    /// Default: unbounded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Denial, Limit, Limiter, ManualClock};
    /// let clock = ManualClock::new();
    /// let limiter =
    ///     Limiter::<u64>::builder().limit(Limit::per_second(1)).max_keys(1).clock(clock.clone()).build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert_eq!(limiter.check(&2).denial(), Some(Denial::TooManyKeys));
    /// // Once key 1's window holds nothing, key 2 takes its place.
    /// clock.advance(Duration::from_secs(3));
    /// assert!(limiter.check(&2).is_allowed());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// What a table at [`max_keys`](Self::max_keys) does with a new key when no held key it
    /// looks at is idle: refuse it ([`WhenFull::Refuse`], the default) or evict the least
    /// recently used of them ([`WhenFull::EvictLeastRecent`]). See [`WhenFull`] for the
    /// trade-off.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, WhenFull};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(10))
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::EvictLeastRecent)
    ///     .build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// How often the background sweeper evicts this limiter's idle keys. Default: the
    /// shortest window. One sweeper thread (`slidegate-sweeper`) serves every real-clock
    /// limiter of the process, each on its own interval: it sweeps a limiter one interval
    /// after its previous sweep ended (sweeps due within 1/32 of their interval, at most
    /// 20 ms, of each other run together), so a long sweep of one limiter delays the others'.
    /// Ignored with a [`ManualClock`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    /// // Both are swept by the same thread, each on its own schedule.
    /// let hourly = Limiter::<u64>::builder()
    ///     .limit(Limit::per_hour(100))
    ///     .sweep_interval(Duration::from_secs(30))
    ///     .build()?;
    /// let login = Limiter::<u64>::builder()
    ///     .limit(Limit::per_minute(5))
    ///     .sweep_interval(Duration::from_secs(5))
    ///     .build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = Some(interval);
        self
    }

    /// Resolution of the real clock: how often the ticker thread refreshes the time every
    /// check reads. Default 1 ms; at least 50 µs ([`ConfigError::ClockTickTooShort`]
    /// otherwise, from `build`). Ignored with a [`ManualClock`].
    ///
    /// Every real-clock limiter of the process reads the same clock, kept by one ticker
    /// thread (`slidegate-clock`) that ticks at the finest tick among the live limiters, so
    /// a finer tick here makes every limiter's clock finer while this one lives. The ticker
    /// sleeps while no check reads the clock (100 ms after the last one woke it); a check
    /// that finds it asleep takes the exact time from the OS clock and wakes it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    /// let fine = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(100))
    ///     .clock_tick(Duration::from_micros(500))
    ///     .build()?;
    /// // Shares the ticker: its clock ticks every 500 µs too while `fine` lives.
    /// let coarse = Limiter::<u64>::builder().limit(Limit::per_minute(100)).build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn clock_tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Keeps track of the keys refused the most, for [`Limiter::top_refused`]: up to
    /// `capacity` keys per core (a heavy-hitter summary, Filtered Space-Saving), whatever the
    /// number of distinct keys refused. Off (0) by default: an admission never pays for it,
    /// a refusal then does (a few tens of ns, in the performance guide). Counts halve every
    /// longest window of the limiter's policies at build, so the list is about the recent
    /// past. Refusals by a limit are counted (a cost over a limit's `max` too; a shadow
    /// refusal too, as it would be refused); a new key refused because the table is full
    /// is not (it has no state to be refused by), nor a refusal made from inside the
    /// summary (a key's `Clone` or `Eq` that checks the limiter: it would wait for a lock
    /// its own thread holds).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(1)).track_refused(128).build()?;
    /// for _ in 0..5 {
    ///     let _ = limiter.check("mallory");
    /// }
    /// let _ = limiter.check("alice");
    /// assert_eq!(limiter.top_refused(10), [("mallory".to_owned(), 4)]);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn track_refused(mut self, capacity: usize) -> Self {
        self.track_refused = capacity;
        self
    }

    /// Validates the configuration and starts the limiter. With the real clock it takes a
    /// share of the process's ticker and sweeper threads, starting them if it is the only
    /// real-clock limiter; they stop (and are joined) when the last real-clock limiter is
    /// dropped. So any number of limiters add at most two threads.
    ///
    /// ```
    /// use slidegate::{ConfigError, Limit, Limiter};
    /// let err = Limiter::<u64>::builder().limit(Limit::per_second(0)).build().unwrap_err();
    /// assert!(matches!(err, ConfigError::ZeroMax { .. }));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<Limiter<K>, ConfigError> {
        let metrics = Metrics::new(&self.name);
        let mut policies = Vec::with_capacity(self.policies.len().saturating_add(1));
        if !self.limits.is_empty() || self.policies.is_empty() {
            policies.push((DEFAULT_POLICY.to_owned(), PolicyConfig::new(self.limits.iter().copied())));
        }
        policies.extend(self.policies);
        let shortest = policies.iter().flat_map(|(_, p)| &p.limits).map(Limit::window).min();
        let longest = policies.iter().flat_map(|(_, p)| &p.limits).map(Limit::window).max();
        let tiers = Tiers::new(policies, self.default_policy.as_deref(), self.algorithm, &metrics)?;
        if self.max_keys == Some(0) {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let sweep_interval = match self.sweep_interval {
            Some(interval) if interval.is_zero() => return Err(ConfigError::ZeroSweepInterval),
            Some(interval) => interval,
            None => shortest.unwrap_or(Duration::from_secs(1)),
        };
        let spawn_error =
            |thread| move |e: std::io::Error| ConfigError::ThreadSpawn { thread, reason: e.to_string() };
        if self.tick < SHORTEST_TICK {
            return Err(ConfigError::ClockTickTooShort { given: self.tick, least: SHORTEST_TICK });
        }
        let (now, ticker) = match &self.clock {
            Some(clock) => (clock.source(), None),
            None => {
                let (now, lease) = real_clock(self.tick).map_err(spawn_error("clock"))?;
                (now, Some(lease))
            }
        };
        let shared = Arc::new(Shared {
            table: Table::new(self.max_keys.unwrap_or(usize::MAX), self.when_full),
            tiers,
            overrides: DashMap::with_hasher(ahash::RandomState::new()),
            any_override: AtomicBool::new(false),
            resolver: self.resolver,
            algorithm: self.algorithm,
            now,
            on_drop: Shared::release_all,
            metrics,
            name: self.name,
            shadow: self.shadow,
            tracked: (self.track_refused > 0).then(|| {
                let half_life = longest.map_or(0, |w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX));
                Box::new(Tracked {
                    offenders: Offenders::new(self.track_refused, half_life),
                    exported: std::sync::Mutex::new(Vec::new()),
                })
            }),
            #[cfg(feature = "tokio")]
            manual: self.clock,
        });
        let sweeper = match ticker {
            None => None,
            Some(_) => {
                let target: Weak<Shared<K>> = Arc::downgrade(&shared);
                Some(housekeeper::register(target, sweep_interval).map_err(spawn_error("sweeper"))?)
            }
        };
        Ok(Limiter { shared, _sweeper: sweeper, _ticker: ticker })
    }
}
