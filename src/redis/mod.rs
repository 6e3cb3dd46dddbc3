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
mod fallback;
mod hybrid;
mod keys;
mod owed;
mod reply;

pub use hybrid::{HybridLimiter, SyncStats, DEFAULT_SYNC_KEYS};

pub use crate::remote::{Checked, DecidedBy, Fallback};

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{RedisError, RedisResult, Script};

use crate::{ConfigError, Limit, Limiter, ManualClock};
use batch::Batcher;
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

/// The connection: one multiplexed connection (reconnecting by itself), or a Cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where time comes from.
#[derive(Clone)]
enum Time {
    Server,
    Local,
    Manual(ManualClock),
}

impl Time {
    /// The caller's time in ms, or `None` for the server's.
    fn now_ms(&self) -> Option<u64> {
        match self {
            Time::Server => None,
            Time::Local => Some(wall_ms()),
            Time::Manual(clock) => Some(u64::try_from(clock.now().as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the script is asked to do.
#[derive(Clone, Copy)]
enum Mode {
    Check,
    Peek,
    Add,
    Push,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::Peek => "peek",
            Mode::Add => "add",
            Mode::Push => "push",
        }
    }
}

/// Everything a call needs, shared by clones and by the hybrid limiter.
struct Remote {
    conn: Conn,
    script: Script,
    prefix: String,
    /// The limits as script arguments, and the hash's TTL.
    limit_args: Vec<u64>,
    /// The largest `max` of the limits: a check or peek of a larger cost is sent with
    /// `most + 1` (refused as `CostTooLarge` all the same, and within what the script
    /// computes exactly and the module parses).
    most: u64,
    ttl_ms: u64,
    time: Time,
    timeout: Duration,
    /// The server has slidegate's module (`SLIDEGATE.RUN`), and the builder allows it;
    /// cleared if the server stops knowing the command, set again when a recheck finds it.
    native: AtomicBool,
    /// While `native` is clear and the builder allows the module: when (ms since `born`)
    /// one call next tries it; `u64::MAX` when the builder does not allow it.
    module_recheck_at: AtomicU64,
    module_recheck_ms: u64,
    born: Instant,
}

impl Remote {
    /// `key`'s windows key in Redis: the prefix and a digest of the key as its hash tag
    /// (see [`keys`]).
    fn key(&self, key: &impl fmt::Display) -> String {
        keys::windows_key(&self.prefix, key)
    }

    /// The cost sent for an entry: a check's or peek's above every `max` as `most + 1`.
    fn sent_cost(&self, e: &Entry<'_>) -> u64 {
        match e.mode {
            Mode::Check | Mode::Peek => e.cost.min(self.most.saturating_add(1)),
            Mode::Add | Mode::Push => e.cost,
        }
    }

    /// The first limit whose `max` is below `cost`: a request no path may admit.
    fn too_large(&self, cost: u64) -> Option<usize> {
        self.limit_args.chunks(4).position(|limit| limit.first().is_some_and(|&max| cost > max))
    }

    /// Runs the script (or the module) for `key` (already a Redis key) within the timeout:
    /// its five replies. `entry` is an `add`'s client id and sequence number.
    async fn call(
        &self,
        redis_key: &str,
        mode: Mode,
        cost: u64,
        at_ms: Option<u64>,
        entry: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        self.invoke(&[Entry { redis_key, mode, cost }], at_ms, entry).await
    }

    /// Runs `entries` in one call within the timeout: through the server's `SLIDEGATE.RUN`
    /// when it has it and the entries only check and peek, else through the script.
    async fn invoke(
        &self,
        entries: &[Entry<'_>],
        at_ms: Option<u64>,
        add: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        self.invoke_within(entries, at_ms, add, self.timeout).await
    }

    /// [`invoke`](Remote::invoke) within `limit` rather than the timeout.
    async fn invoke_within(
        &self,
        entries: &[Entry<'_>],
        at_ms: Option<u64>,
        add: Option<(&str, u64)>,
        limit: Duration,
    ) -> RedisResult<Vec<i64>> {
        let now = at_ms.or_else(|| self.time.now_ms()).map_or(String::new(), |ms| ms.to_string());
        let limits = self.limit_args.len() / 4;
        // Relaxed: a hint about the server, corrected by the server's own answer below.
        let native = entries.iter().all(|e| matches!(e.mode, Mode::Check | Mode::Peek))
            && (self.native.load(Ordering::Relaxed) || self.module_recheck_due());
        let run = async {
            if native {
                // The module takes each entry's windows key only, the first also in front.
                let mut cmd = ::redis::cmd("SLIDEGATE.RUN");
                cmd.arg(entries.first().map(|e| e.redis_key)).arg(entries.len());
                for e in entries {
                    cmd.arg(e.redis_key);
                }
                cmd.arg(&now).arg(self.ttl_ms).arg(limits).arg(&self.limit_args[..]);
                for e in entries {
                    cmd.arg(e.mode.name()).arg(self.sent_cost(e));
                }
                let reply = match self.conn.clone() {
                    Conn::Single(mut conn) => cmd.query_async(&mut conn).await,
                    Conn::Cluster(mut conn) => cmd.query_async(&mut conn).await,
                };
                match reply {
                    // The module is gone (unloaded, or a failover to a server without it), or
                    // a recheck found it still missing: this call and the later ones go
                    // through the script until the next recheck.
                    Err(e) if e.to_string().contains("unknown command") => {
                        self.native.store(false, Ordering::Relaxed);
                        self.module_recheck_at.store(
                            self.ms_since_born().saturating_add(self.module_recheck_ms),
                            Ordering::Relaxed,
                        );
                        self.script_call(entries, &now, limits, add).await
                    }
                    Ok(reply) => {
                        // A recheck found it: back on the module (a load first, so that the
                        // calls that already use it write nothing shared).
                        if !self.native.load(Ordering::Relaxed) {
                            self.native.store(true, Ordering::Relaxed);
                        }
                        Ok(reply)
                    }
                    reply => reply,
                }
            } else {
                self.script_call(entries, &now, limits, add).await
            }
        };
        match tokio::time::timeout(limit, run).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "redis check timed out",
            ))),
        }
    }

    fn ms_since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether this call should try the module although it is not in use: the recheck is
    /// due, and this call is the one that moved it on (so one call in each interval tries).
    fn module_recheck_due(&self) -> bool {
        let due = self.module_recheck_at.load(Ordering::Relaxed);
        let now = self.ms_since_born();
        now >= due
            && self
                .module_recheck_at
                .compare_exchange(
                    due,
                    now.saturating_add(self.module_recheck_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// `entries` through the script.
    async fn script_call(
        &self,
        entries: &[Entry<'_>],
        now: &str,
        limits: usize,
        add: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        let mut invocation = self.script.prepare_invoke();
        for e in entries {
            invocation.key(e.redis_key).key(book_key(e.redis_key));
        }
        invocation.arg(now).arg(self.ttl_ms).arg(limits).arg(&self.limit_args[..]);
        for e in entries {
            invocation.arg(e.mode.name()).arg(self.sent_cost(e));
        }
        if let Some((client, seq)) = add {
            invocation.arg(client).arg(seq);
        }
        match self.conn.clone() {
            Conn::Single(mut conn) => invocation.invoke_async(&mut conn).await,
            Conn::Cluster(mut conn) => invocation.invoke_async(&mut conn).await,
        }
    }
}

/// One check (or peek, add, push) in a call.
struct Entry<'a> {
    redis_key: &'a str,
    mode: Mode,
    cost: u64,
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

/// Configures a [`RedisLimiter`] or a [`HybridLimiter`].
pub struct RedisLimiterBuilder<K> {
    target: Option<Target>,
    limits: Vec<Limit>,
    timeout: Duration,
    fallback: Fallback,
    time: Time,
    prefix: String,
    sync_interval: Duration,
    batch: u64,
    module: bool,
    module_recheck: Duration,
    max_keys: usize,
    sync_keys: usize,
    _key: std::marker::PhantomData<fn() -> K>,
}

#[derive(Clone)]
enum Target {
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
    /// [`DEFAULT_MAX_KEYS`]): `RedisLimiter`'s [`Fallback::Local`] limiter, and the keys it
    /// owes Redis (at most this many: while that many owe, the fallback refuses other keys
    /// with `Denial::TooManyKeys` rather than admit what it could not record), and
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
        let closed_retry =
            self.limits.iter().map(Limit::get_precision).min().unwrap_or(Duration::from_secs(1));
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
