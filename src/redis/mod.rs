//! One budget per key across many processes (feature `redis`): [`RedisLimiter`] runs the
//! sliding window inside Redis, and [`HybridLimiter`] admits locally and syncs with Redis.
//!
//! **`RedisLimiter`** keeps, per key, one Redis string (`<prefix>{<digest>}`, the digest the
//! first 128 bits of the SHA-256 of the key's `Display` text in hex: the hash tag puts all
//! of a key's data on one Cluster slot, and no key can choose that slot;
//! [`RedisLimiter::redis_key`]) holding every limit's window as the in-process limiter does: the current slot, its units, the units of the closed slots wholly inside
//! the window (a running sum), and a ring of the closed slots' units. It decides with one
//! Lua script (`limiter.lua`, loaded once, called by SHA, reloaded on `NOSCRIPT`) that reads
//! O(limits) values of that string (not one per slot), admits only if all limits have room,
//! counts the cost in all of them, and computes `remaining` and `retry_after` (only a
//! refusal walks the ring): the same semantics as the in-process sliding window
//! (interpolated or strict, several limits, cost, only admitted units counted), at
//! millisecond resolution. Time is the Redis server's (`TIME` inside the script, so all
//! replicas agree) unless a caller clock is given; a time older than the key's latest never
//! rewinds it. The string expires after the longest `window + precision` without an
//! admission: by then every window is empty, so the expiry changes no decision, and refused
//! requests never touch it (no "refresh extends the window"). A second key,
//! `<prefix>{<digest>}:book`, holds what hybrid replicas and fallbacks need (units pushed,
//! the last `add` applied per client).
//!
//! A server that loaded slidegate's Redis module (crate `slidegate-redis-module`,
//! `libslidegate_redis.so`) answers checks and peeks through its command `SLIDEGATE.RUN`:
//! the same window in native code, on the same data, with the script's arguments and
//! replies. The limiter looks for it when built, falls back to the script if the server
//! stops knowing it, and tries it again every 30 s while it is not in use
//! ([`RedisLimiterBuilder::module`], [`RedisLimiterBuilder::module_recheck`],
//! [`RedisLimiter::uses_module`]).
//!
//! On one server, checks and peeks in flight at once share calls: while two script calls
//! (four module calls) are out, new ones queue, and the next call takes every queued one
//! (at most 64), which the script runs one after the other in arrival order, each
//! decided exactly as if alone. A lone check goes at once; a burst pays one round trip and
//! one script start for many. On a Cluster, whose keys live on different nodes, each check
//! is its own call. Each check's timeout runs from the moment it is queued. At most 4,096
//! checks wait: one that finds the queue full is decided by the fallback at once. A check
//! that gave up waiting is never sent (the fallback decided it), and a call keeps its place
//! until its reply comes (at most 1 s, or the timeout if longer), so while Redis stalls at
//! most one round of calls (128 checks, 256 through the module) per second of the stall
//! reaches it late and is counted there as well.
//!
//! A check that fails (connection error, a server in a transient state such as `LOADING`
//! or `CLUSTERDOWN`) or takes longer than the timeout (default 5 ms) is decided by the
//! [`Fallback`]: fail open, fail closed, or a local in-process limiter with the same limits
//! (at most [`max_keys`](RedisLimiterBuilder::max_keys) keys), whose admissions are added
//! to Redis once it answers again. The connection reconnects by itself.
//! [`Checked::decided_by`] says which path decided. Two refusals hold whatever the
//! fallback: a cost above a limit's `max` is `CostTooLarge` on every path (a larger cost
//! is sent as the largest `max + 1`), and a check the server answers with an error that
//! retrying cannot change (`WRONGTYPE`, `NOPERM`, an entry error) is refused as
//! `Fallback::Closed` refuses and counted ([`RedisLimiter::server_errors`]); what the
//! fallback owes for such a key is dropped and counted
//! ([`RedisLimiter::dropped_owed_units`]), never owed for ever.
//!
//! ```no_run
//! # async fn run() -> Result<(), slidegate::redis::SetupError> {
//! use slidegate::redis::{Fallback, RedisLimiter};
//! use slidegate::Limit;
//!
//! let limiter = RedisLimiter::<String>::builder()
//!     .url("redis://127.0.0.1:6379")                    // or .cluster(&[...])
//!     .limit(Limit::per_second(10))
//!     .limit(Limit::per_minute(120))
//!     .fallback(Fallback::Local)
//!     .build()
//!     .await?;
//! let checked = limiter.check(&"203.0.113.7".to_owned()).await;
//! if !checked.is_allowed() { /* 429, Retry-After: checked.retry_after() */ }
//! # Ok(())
//! # }
//! ```

mod batch;
mod builder;
mod call;
mod fallback;
mod hybrid;
mod keys;
mod owed;
mod reply;

pub use builder::RedisLimiterBuilder;
pub use hybrid::{HybridLimiter, SyncStats, DEFAULT_SYNC_KEYS};

pub use crate::remote::{Checked, DecidedBy, Fallback};

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::{RedisError, RedisResult};

use crate::{ConfigError, Limiter};
use batch::Batcher;
use call::{Conn, Mode, Remote, Time};
use keys::book_key;
use owed::Ledger;
use reply::Answer;

/// Why a Redis limiter could not be built.
#[derive(Debug)]
pub enum SetupError {
    /// The limits (or a Redis-specific bound on them).
    Config(ConfigError),
    /// No server URL was given.
    NoServer,
    /// Connecting failed.
    Redis(RedisError),
    /// The key prefix holds `{` or `}`: Redis Cluster would hash part of the prefix rather
    /// than each key's own hash tag.
    Prefix(String),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Config(e) => write!(f, "{e}"),
            SetupError::NoServer => f.write_str("no Redis server: give .url(...) or .cluster(...)"),
            SetupError::Redis(e) => write!(f, "cannot connect to Redis: {e}"),
            SetupError::Prefix(prefix) => {
                write!(f, "the Redis key prefix {prefix:?} holds a brace ({{ or }}), which would choose the Cluster slot")
            }
        }
    }
}

impl std::error::Error for SetupError {}

impl From<ConfigError> for SetupError {
    fn from(e: ConfigError) -> Self {
        SetupError::Config(e)
    }
}

impl From<RedisError> for SetupError {
    fn from(e: RedisError) -> Self {
        SetupError::Redis(e)
    }
}

/// The default of [`RedisLimiterBuilder::max_keys`]: the most keys an in-process limiter of
/// a Redis-backed limiter holds (its fallback's, or a hybrid replica's), and the most keys
/// `Fallback::Local` owes Redis at once.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// A sliding-window limiter whose state lives in Redis: see the [module docs](self).
pub struct RedisLimiter<K> {
    remote: Arc<Remote>,
    fallback: Fallback,
    local: Option<Limiter<K>>,
    /// Units the local fallback admitted while Redis was unreachable, per Redis key (at
    /// most `max_keys` keys), added to Redis by the checks that reach it ([`owed`]).
    owed: Mutex<Ledger>,
    /// Set (under `owed`'s lock) while `owed` holds anything: checks skip the lock otherwise.
    owing: AtomicBool,
    /// Checks refused because the server answered an error that retrying cannot change.
    server_errors: AtomicU64,
    /// Owed units dropped because Redis refused to add them (an error no retry changes).
    dropped_owed: AtomicU64,
    /// This limiter's id in Redis, and the sequence numbers of what it owes, so that an
    /// `add` whose reply was lost (a timeout) and is retried is applied once.
    client: String,
    seq: AtomicU64,
    /// `retry_after` of a fail-closed refusal.
    closed_retry: Duration,
    /// The queue of checks and peeks batched into shared calls (a standalone server; on a
    /// Cluster, whose keys live on different nodes, each goes alone).
    batcher: Option<Batcher>,
}

impl<K> fmt::Debug for RedisLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.remote.prefix)
            .field("fallback", &self.fallback)
            .field("timeout", &self.remote.timeout)
            .finish_non_exhaustive()
    }
}

impl<K> RedisLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// Starts configuring a Redis limiter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::redis::{Fallback, RedisLimiter};
    /// use slidegate::Limit;
    /// let builder = RedisLimiter::<u64>::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .limit(Limit::per_second(10))
    ///     .timeout(Duration::from_millis(2))
    ///     .fallback(Fallback::Closed);
    /// # let _ = builder;
    /// ```
    pub fn builder() -> RedisLimiterBuilder<K> {
        RedisLimiterBuilder {
            target: None,
            limits: Vec::new(),
            timeout: Duration::from_millis(5),
            fallback: Fallback::default(),
            time: Time::Server,
            prefix: "slidegate:".to_owned(),
            sync_interval: Duration::from_millis(50),
            module: true,
            module_recheck: Duration::from_secs(30),
            max_keys: DEFAULT_MAX_KEYS,
            sync_keys: DEFAULT_SYNC_KEYS,
            batch: 1000,
            _key: std::marker::PhantomData,
        }
    }

    /// Whether checks and peeks go to slidegate's Redis module (`SLIDEGATE.RUN`) rather
    /// than the script: [`module`](RedisLimiterBuilder::module) allows it and the server had
    /// it at the last call that tried it (at build, then at every call through it, and at
    /// each [`module_recheck`](RedisLimiterBuilder::module_recheck) while it is not in use).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let limiter = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build().await?;
    /// println!("native window: {}", limiter.uses_module());
    /// # Ok(())
    /// # }
    /// ```
    pub fn uses_module(&self) -> bool {
        self.remote.native.load(Ordering::Relaxed)
    }

    /// Checks a request of cost 1.
    pub async fn check(&self, key: &K) -> Checked {
        self.check_n(key, 1).await
    }

    /// Checks a request weighing `cost` units: admitted only if every limit has room, then
    /// counted in all of them, atomically in Redis.
    pub async fn check_n(&self, key: &K, cost: u64) -> Checked {
        self.run(key, Mode::Check, cost).await
    }

    /// Would a request of cost 1 be admitted now? Consumes nothing.
    pub async fn peek(&self, key: &K) -> Checked {
        self.run(key, Mode::Peek, 1).await
    }

    /// The name of `key`'s windows in Redis (its bookkeeping is the same name with `:book`
    /// after it): the prefix, then the first 128 bits of the SHA-256 of the key's
    /// `Display` text, in hex, as the Cluster hash tag. The key's own bytes never reach a
    /// Redis key name, so no key can choose its slot or split its two Redis keys.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let limiter = RedisLimiter::<String>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build().await?;
    /// // `printf 203.0.113.7 | sha256sum` begins fec52565aa0cf18f57d7cf5b3ac72850
    /// assert_eq!(limiter.redis_key(&"203.0.113.7".to_owned()), "slidegate:{fec52565aa0cf18f57d7cf5b3ac72850}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn redis_key(&self, key: &K) -> String {
        self.remote.key(key)
    }

    /// Forgets `key` in Redis: `true` if it held anything.
    pub async fn reset(&self, key: &K) -> RedisResult<bool> {
        let redis_key = self.remote.key(key);
        let mut cmd = ::redis::cmd("DEL");
        cmd.arg(&redis_key).arg(book_key(&redis_key));
        let deleted: i64 = match self.remote.conn.clone() {
            Conn::Single(mut conn) => cmd.query_async(&mut conn).await?,
            Conn::Cluster(mut conn) => cmd.query_async(&mut conn).await?,
        };
        if let Some(local) = &self.local {
            local.reset(key);
        }
        Ok(deleted > 0)
    }

    async fn run(&self, key: &K, mode: Mode, cost: u64) -> Checked {
        let redis_key = self.remote.key(key);
        // Redis decides a key only once it holds what the fallback admitted for it.
        if !self.repay(&redis_key).await {
            return self.fall_back(key, &redis_key, mode, cost);
        }
        let reply = match &self.batcher {
            Some(batcher) if matches!(mode, Mode::Check | Mode::Peek) => {
                batcher.run(self.remote.timeout, redis_key.clone(), mode, cost).await
            }
            _ => Some(self.remote.call(&redis_key, mode, cost, None, None).await),
        };
        match reply::answer(reply.as_ref()) {
            Answer::Decided(decision) => Checked::new(decision, DecidedBy::Server),
            Answer::Refused => self.refuse_on_server_error(),
            Answer::Unavailable => self.fall_back(key, &redis_key, mode, cost),
        }
    }
}
