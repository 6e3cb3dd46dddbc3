//! [`RedisLimiterBuilder`]: a [`RedisLimiter`]'s or a [`HybridLimiter`]'s configuration,
//! and the setup that connects, loads the script and looks for the module.

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisResult, Script};

use super::batch::{self, Batcher};
use super::call::{Conn, Remote, Time};
use super::owed::Ledger;
use super::{hybrid, keys, Fallback, HybridLimiter, RedisLimiter, SetupError};
use crate::{ConfigError, Limit, Limiter, ManualClock};

/// Configures a [`RedisLimiter`] or a [`HybridLimiter`].
pub struct RedisLimiterBuilder<K> {
    pub(super) target: Option<Target>,
    pub(super) limits: Vec<Limit>,
    pub(super) timeout: Duration,
    pub(super) fallback: Fallback,
    pub(super) time: Time,
    pub(super) prefix: String,
    pub(super) sync_interval: Duration,
    pub(super) batch: u64,
    pub(super) module: bool,
    pub(super) module_recheck: Duration,
    pub(super) max_keys: usize,
    pub(super) sync_keys: usize,
    pub(super) _key: std::marker::PhantomData<fn() -> K>,
}

#[derive(Clone)]
pub(super) enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl<K> fmt::Debug for RedisLimiterBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("limits", &self.limits)
            .field("timeout", &self.timeout)
            .field("fallback", &self.fallback)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl<K> RedisLimiterBuilder<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// A single Redis server (`redis://host:port/db`).
    pub fn url(mut self, url: &str) -> Self {
        self.target = Some(Target::Single(url.to_owned()));
        self
    }

    /// A Redis Cluster, by the URLs of some of its nodes.
    pub fn cluster(mut self, urls: &[&str]) -> Self {
        self.target = Some(Target::Cluster(urls.iter().map(|u| (*u).to_owned()).collect()));
        self
    }

    /// Adds a limit (all apply together, as in [`Limiter`]).
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// How long a check may wait for Redis before the fallback decides (default 5 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What decides when Redis cannot (default [`Fallback::Local`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// Uses the caller's wall clock instead of the server's `TIME`.
    pub fn local_time(mut self) -> Self {
        self.time = Time::Local;
        self
    }

    /// Uses `clock` (milliseconds since its origin) instead of the server's `TIME`: for
    /// tests, and for callers who keep their own time.
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.time = Time::Manual(clock);
        self
    }

    /// Whether checks and peeks use slidegate's Redis module (`SLIDEGATE.RUN`, from
    /// `libslidegate_redis.so`, crate `slidegate-redis-module`) when the server has it
    /// (default: yes). The module decides exactly as the script, on the same data, at a
    /// third of its server time per check; servers without it (managed Redis often allows
    /// no modules) get the script. On a Cluster, load it on every node or on none.
    ///
    /// ```
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let script_only = RedisLimiter::<u64>::builder().limit(Limit::per_second(10)).module(false);
    /// # let _ = script_only;
    /// ```
    pub fn module(mut self, use_it: bool) -> Self {
        self.module = use_it;
        self
    }

    /// While the module is allowed but not in use (the server lacked it when the limiter was
    /// built, or stopped knowing it), one call in every `every` tries it again (default
    /// 30 s); the first that succeeds puts checks and peeks back on it. A call that finds it
    /// still missing goes through the script, at the cost of one more round trip.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let builder = RedisLimiter::<u64>::builder().limit(Limit::per_second(10)).module_recheck(Duration::from_secs(5));
    /// # let _ = builder;
    /// ```
    pub fn module_recheck(mut self, every: Duration) -> Self {
        self.module_recheck = every;
        self
    }

    /// The most keys the builder's in-process limiter holds (default
    /// [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS)): `RedisLimiter`'s [`Fallback::Local`]
    /// limiter, and the keys it owes Redis (at most this many: while that many owe, the
    /// fallback refuses other keys with `Denial::TooManyKeys` rather than admit what it
    /// could not record), and
    /// `HybridLimiter`'s local limiter, the keys it syncs and what waits for its next sync
    /// (see [`HybridLimiter`], *Memory*). A new key beyond it is refused with
    /// `Denial::TooManyKeys`, as [`LimiterBuilder::max_keys`](crate::LimiterBuilder::max_keys)
    /// refuses it; `0` is taken as 1.
    ///
    /// ```
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let builder = RedisLimiter::<u64>::builder().limit(Limit::per_second(10)).max_keys(10_000);
    /// # let _ = builder;
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The prefix of every Redis key (default `"slidegate:"`). It must not hold `{` or
    /// `}` (`build` answers [`SetupError::Prefix`]): each key's hash tag is a digest of the
    /// key, which a brace in the prefix would override.
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// [`HybridLimiter`]: how often a replica syncs (default 50 ms).
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.sync_interval = interval;
        self
    }

    /// [`HybridLimiter`]: sync early once this many units are pending (default 1000).
    pub fn batch(mut self, units: u64) -> Self {
        self.batch = units.max(1);
        self
    }

    /// The in-process limiter with the same limits (and clock, if manual).
    fn local(&self) -> Result<Limiter<K>, ConfigError> {
        let mut builder = Limiter::builder();
        for limit in &self.limits {
            builder = builder.limit(*limit);
        }
        if let Time::Manual(clock) = &self.time {
            builder = builder.clock(clock.clone());
        }
        builder.max_keys(self.max_keys).build()
    }

    async fn remote(&self) -> Result<Remote, SetupError> {
        if !keys::prefix_is_valid(&self.prefix) {
            return Err(SetupError::Prefix(self.prefix.clone()));
        }
        // The script computes in doubles: every product of a count and a slot length (ms)
        // must stay below 2^53 to be exact.
        for limit in &self.limits {
            let slot_ms = u64::try_from(limit.get_precision().as_millis()).unwrap_or(u64::MAX);
            #[allow(clippy::arithmetic_side_effects, reason = "a product of two u64 fits a u128")]
            let product = u128::from(limit.max()) * u128::from(slot_ms);
            if product >= 1 << 53 {
                return Err(SetupError::Config(ConfigError::MaxTooLarge {
                    limit: *limit,
                    most: (1u64 << 53).checked_div(slot_ms).unwrap_or(1 << 53),
                }));
            }
        }
        let mut limit_args = Vec::with_capacity(self.limits.len().saturating_mul(4));
        let mut ttl_ms = 0u64;
        for limit in &self.limits {
            let window = u64::try_from(limit.window().as_millis()).unwrap_or(u64::MAX);
            let slot = u64::try_from(limit.get_precision().as_millis()).unwrap_or(u64::MAX);
            limit_args.extend([
                limit.max(),
                window,
                slot,
                u64::from(limit.accuracy() == crate::Accuracy::Strict),
            ]);
            ttl_ms = ttl_ms.max(window.saturating_add(slot));
        }
        let conn = match self.target.clone() {
            None => return Err(SetupError::NoServer),
            Some(Target::Single(url)) => {
                let client = ::redis::Client::open(url)?;
                // The calls time themselves out (a batched call may outlast its checks'
                // timeout: see `batch`); the connection's own limit (500 ms by default) only
                // bounds what has none.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(100))))
                    .set_response_timeout(Some(self.timeout.max(batch::LONGEST_CALL)))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Conn::Single(ConnectionManager::new_with_config(client, config).await?)
            }
            Some(Target::Cluster(urls)) => {
                let client = ::redis::cluster::ClusterClient::new(urls)?;
                Conn::Cluster(client.get_async_connection().await?)
            }
        };
        let native = self.module && {
            let mut info = ::redis::cmd("COMMAND");
            info.arg("INFO").arg("slidegate.run");
            let reply: RedisResult<Vec<::redis::Value>> = match conn.clone() {
                Conn::Single(mut c) => info.query_async(&mut c).await,
                Conn::Cluster(mut c) => info.query_async(&mut c).await,
            };
            reply.is_ok_and(|r| r.first().is_some_and(|v| !matches!(v, ::redis::Value::Nil)))
        };
        let module_recheck_ms = u64::try_from(self.module_recheck.as_millis()).unwrap_or(u64::MAX);
        Ok(Remote {
            native: AtomicBool::new(native),
            module_recheck_at: AtomicU64::new(if self.module { module_recheck_ms } else { u64::MAX }),
            module_recheck_ms,
            born: Instant::now(),
            conn,
            script: Script::new(include_str!("limiter.lua")),
            prefix: self.prefix.clone(),
            most: self.limits.iter().map(Limit::max).max().unwrap_or(0),
            limit_args,
            ttl_ms,
            time: self.time.clone(),
            timeout: self.timeout,
        })
    }

    /// Validates the limits, connects, and returns the limiter.
    pub async fn build(self) -> Result<RedisLimiter<K>, SetupError> {
        let local = self.local()?;
        let remote = Arc::new(self.remote().await?);
        let closed_retry = Fallback::closed_wait(&self.limits);
        let batcher = match remote.conn {
            Conn::Single(_) => Some(Batcher::start(Arc::clone(&remote))),
            Conn::Cluster(_) => None,
        };
        Ok(RedisLimiter {
            batcher,
            remote,
            fallback: self.fallback,
            local: (self.fallback == Fallback::Local).then_some(local),
            owed: Mutex::new(Ledger::new(self.max_keys)),
            owing: AtomicBool::new(false),
            server_errors: AtomicU64::new(0),
            dropped_owed: AtomicU64::new(0),
            client: format!("{:x}", ahash::RandomState::new().hash_one(std::process::id())),
            seq: AtomicU64::new(0),
            closed_retry,
        })
    }

    /// Validates the limits, connects, and starts a [`HybridLimiter`] (its sync task runs on
    /// the current tokio runtime until the limiter is dropped).
    pub async fn build_hybrid(self) -> Result<HybridLimiter<K>, SetupError> {
        let local = self.local()?;
        let remote = self.remote().await?;
        let settings = hybrid::Settings {
            interval: self.sync_interval,
            batch: self.batch,
            max_keys: self.max_keys,
            sync_keys: self.sync_keys,
        };
        Ok(HybridLimiter::start(local, Arc::new(remote), settings))
    }
}
