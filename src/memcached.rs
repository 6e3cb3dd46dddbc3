//! The two-bucket estimate on memcached (feature `memcached`), as the seed article builds
//! it: per key and limit, one counter per window-long bucket; a check reads the current and
//! the previous bucket with one multi-get, estimates `previous × (1 − f) + current` (`f`
//! the part of the current bucket elapsed), and if the request fits, `incr`s the current
//! bucket (creating it with `add` when missing), with a TTL of two buckets.
//!
//! This is the sliding window with one slot per window (the in-process default for 1 s
//! windows, and `Limit::precision(window)` otherwise): the same decisions, sequentially.
//! What memcached cannot do that Redis can: **run the check and the increment atomically**.
//! Two checks of one key that read the counters before either increments can both be
//! admitted, so under contention a key can exceed `max` by the checks in flight at once
//! (at most `(c − 1) × cost` for `c` concurrent checks of the key); and with several limits
//! there is no atomic admission across them (each is incremented after the decision, none
//! is rolled back). Time is the caller's (memcached has no clock to lend). The fallback
//! when memcached fails or times out is the Redis backend's [`Fallback`].
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate::memcached::MemcachedLimiter;
//! use slidegate::Limit;
//!
//! let limiter = MemcachedLimiter::<u64>::builder().addr("127.0.0.1:11211").limit(Limit::per_minute(500)).build()?;
//! let checked = limiter.check(&7).await;
//! # let _ = checked;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::hash::Hash;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

pub use crate::remote::{Checked, DecidedBy, Fallback};
use crate::{ConfigError, Decision, Limit, Limiter, ManualClock};

/// One limit in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    max: u64,
    window: u64,
}

/// A two-bucket limiter on memcached: see the [module docs](self).
pub struct MemcachedLimiter<K> {
    addr: String,
    conn: Mutex<Option<BufReader<TcpStream>>>,
    buckets: Vec<Bucket>,
    prefix: String,
    timeout: Duration,
    clock: Option<ManualClock>,
    fallback: Fallback,
    local: Option<Limiter<K>>,
}

impl<K> fmt::Debug for MemcachedLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedLimiter")
            .field("addr", &self.addr)
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

/// Configures a [`MemcachedLimiter`].
#[derive(Debug)]
pub struct MemcachedLimiterBuilder<K> {
    addr: String,
    limits: Vec<Limit>,
    prefix: String,
    timeout: Duration,
    clock: Option<ManualClock>,
    fallback: Fallback,
    _key: std::marker::PhantomData<fn() -> K>,
}

impl<K> MemcachedLimiterBuilder<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// The server, `host:port` (default `127.0.0.1:11211`).
    pub fn addr(mut self, addr: &str) -> Self {
        addr.clone_into(&mut self.addr);
        self
    }

    /// Adds a limit; its precision is ignored (one bucket per window).
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// The prefix of every memcached key (default `"slidegate:"`).
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// How long a check may wait for memcached (default 5 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Time from `clock` (ms) instead of the wall clock.
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// What decides when memcached cannot (default [`Fallback::Local`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// Validates the limits (the connection is made by the first check, and remade after
    /// a failure).
    pub fn build(self) -> Result<MemcachedLimiter<K>, ConfigError> {
        let mut local = Limiter::builder();
        for limit in &self.limits {
            local = local.limit(limit.precision(limit.window()));
        }
        if let Some(clock) = &self.clock {
            local = local.clock(clock.clone());
        }
        let local = local.build()?;
        let buckets = self
            .limits
            .iter()
            .map(|l| Bucket {
                max: l.max(),
                window: u64::try_from(l.window().as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        Ok(MemcachedLimiter {
            addr: self.addr,
            conn: Mutex::new(None),
            buckets,
            prefix: self.prefix,
            timeout: self.timeout,
            clock: self.clock,
            fallback: self.fallback,
            local: (self.fallback == Fallback::Local).then_some(local),
        })
    }
}

/// The estimate for one limit: units in the current bucket, in the previous one, and the
/// weight (ms out of `window`) with which the previous one still counts.
struct Estimate {
    current: u64,
    previous: u64,
    weight: u64,
    bucket: u64,
}

/// `a × b`, exact.
#[allow(clippy::arithmetic_side_effects, reason = "a product of two u64 fits a u128")]
fn product(a: u64, b: u64) -> u128 {
    u128::from(a) * u128::from(b)
}

// The counts come from the server and may be anything: sums saturate. Times saturate too
// (a window can be as long as `u64::MAX` ms).
impl Estimate {
    fn admits(&self, b: &Bucket, cost: u64) -> bool {
        let Some(free) = b.max.checked_sub(self.current.saturating_add(cost)) else { return false };
        product(self.previous, self.weight) <= product(free, b.window)
    }

    fn room(&self, b: &Bucket, cost: u64) -> u64 {
        let free = b.max.saturating_sub(self.current.saturating_add(cost));
        let share = product(self.previous, self.weight).div_ceil(u128::from(b.window));
        free.saturating_sub(u64::try_from(share).unwrap_or(u64::MAX))
    }

    /// The earliest time (ms) `cost` fits: within this bucket as the previous one fades,
    /// or in the next one, where this one fades in turn.
    fn earliest(&self, b: &Bucket, now: u64, cost: u64) -> u64 {
        let allowed = b.max.saturating_sub(cost);
        let start = self.bucket.saturating_mul(b.window);
        let end = start.saturating_add(b.window);
        // Here: previous × (w − e) ≤ (allowed − current) × w.
        if let Some(left) = allowed.checked_sub(self.current) {
            if let Some(fits) = product(left, b.window).checked_div(u128::from(self.previous)) {
                let e = b.window.saturating_sub(u64::try_from(fits).unwrap_or(u64::MAX));
                if e < b.window {
                    return start.saturating_add(e).max(now);
                }
            }
        }
        // Next bucket: current × (w − e) ≤ allowed × w.
        let Some(fits) = product(allowed, b.window).checked_div(u128::from(self.current)) else {
            return end;
        };
        end.saturating_add(b.window.saturating_sub(u64::try_from(fits).unwrap_or(u64::MAX)))
    }
}

impl<K> MemcachedLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// Starts configuring.
    ///
    /// ```
    /// use slidegate::memcached::MemcachedLimiter;
    /// use slidegate::Limit;
    /// let limiter = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// # let _ = limiter;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn builder() -> MemcachedLimiterBuilder<K> {
        MemcachedLimiterBuilder {
            addr: "127.0.0.1:11211".to_owned(),
            limits: Vec::new(),
            prefix: "slidegate:".to_owned(),
            timeout: Duration::from_millis(5),
            clock: None,
            fallback: Fallback::default(),
            _key: std::marker::PhantomData,
        }
    }

    fn now_ms(&self) -> u64 {
        match &self.clock {
            Some(clock) => u64::try_from(clock.now().as_millis()).unwrap_or(u64::MAX),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// Checks a request of cost 1.
    pub async fn check(&self, key: &K) -> Checked {
        self.check_n(key, 1).await
    }

    /// Checks a request weighing `cost` units.
    pub async fn check_n(&self, key: &K, cost: u64) -> Checked {
        let now = self.now_ms();
        match tokio::time::timeout(self.timeout, self.decide(key, cost, now)).await {
            Ok(Ok(decision)) => Checked::new(decision, DecidedBy::Server),
            _ => {
                // A connection in an unknown state is not reused.
                if let Ok(mut conn) = self.conn.try_lock() {
                    *conn = None;
                }
                self.fall_back(key, cost)
            }
        }
    }

    fn fall_back(&self, key: &K, cost: u64) -> Checked {
        match (self.fallback, &self.local) {
            (Fallback::Local, Some(local)) => Checked::new(local.check_n(key, cost), DecidedBy::Local),
            (Fallback::Closed, _) => {
                Checked::new(Decision::limited(0, 0, 1_000_000_000), DecidedBy::FailClosed)
            }
            _ => Checked::new(Decision::allowed(0, 0), DecidedBy::FailOpen),
        }
    }

    async fn decide(&self, key: &K, cost: u64, now: u64) -> std::io::Result<Decision> {
        let names: Vec<(String, String, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bucket = now.checked_div(b.window).unwrap_or(now);
                let name = |n: u64| {
                    format!("{}{key}:{i}:{n}", self.prefix)
                        .replace(|c: char| c.is_whitespace() || c.is_control(), "_")
                };
                (name(bucket), name(bucket.saturating_sub(1)), bucket)
            })
            .collect();
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            *guard = Some(BufReader::new(TcpStream::connect(&self.addr).await?));
        }
        let Some(conn) = guard.as_mut() else { return Err(std::io::ErrorKind::NotConnected.into()) };
        let keys: Vec<&str> = names.iter().flat_map(|(c, p, _)| [c.as_str(), p.as_str()]).collect();
        let values = get_multi(conn, &keys).await?;
        let estimates: Vec<Estimate> = self
            .buckets
            .iter()
            .zip(&names)
            .map(|(b, (c, p, bucket))| Estimate {
                current: values.iter().find(|v| &v.0 == c).map_or(0, |v| v.1),
                previous: values.iter().find(|v| &v.0 == p).map_or(0, |v| v.1),
                weight: b.window.saturating_sub(now.checked_rem(b.window).unwrap_or(0)),
                bucket: *bucket,
            })
            .collect();
        if let Some(i) = self.buckets.iter().position(|b| cost > b.max) {
            let room = self.buckets.iter().zip(&estimates).map(|(b, e)| e.room(b, 0)).min().unwrap_or(0);
            return Ok(Decision::cost_too_large(i, room));
        }
        let admits = self.buckets.iter().zip(&estimates).all(|(b, e)| e.admits(b, cost));
        if admits {
            if cost > 0 {
                for ((b, (current, _, _)), _) in self.buckets.iter().zip(&names).zip(&estimates) {
                    incr(conn, current, cost, b.window.saturating_mul(2)).await?;
                }
            }
            let (tightest, room) = self
                .buckets
                .iter()
                .zip(&estimates)
                .map(|(b, e)| e.room(b, cost))
                .enumerate()
                .min_by_key(|&(_, r)| r)
                .unwrap_or((0, 0));
            return Ok(Decision::allowed(room, tightest));
        }
        let remaining = self.buckets.iter().zip(&estimates).map(|(b, e)| e.room(b, 0)).min().unwrap_or(0);
        let (limit, at) = self
            .buckets
            .iter()
            .zip(&estimates)
            .enumerate()
            .filter(|(_, (b, e))| !e.admits(b, cost))
            .map(|(i, (b, e))| (i, e.earliest(b, now, cost)))
            .max_by_key(|&(i, at)| (at, std::cmp::Reverse(i)))
            .unwrap_or((0, now));
        Ok(Decision::limited(limit, remaining, at.saturating_sub(now).saturating_mul(1_000_000)))
    }
}

/// The longest value `get_multi` reads: memcached's default largest item (1 MiB).
const MAX_VALUE_BYTES: usize = 1 << 20;

/// `get k1 k2 ...`: the numeric values found.
async fn get_multi(conn: &mut BufReader<TcpStream>, keys: &[&str]) -> std::io::Result<Vec<(String, u64)>> {
    conn.get_mut().write_all(format!("get {}\r\n", keys.join(" ")).as_bytes()).await?;
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("END") => return Ok(out),
            Some("VALUE") => {
                let key = parts.next().unwrap_or_default().to_owned();
                let bytes: usize = parts.nth(1).and_then(|b| b.parse().ok()).unwrap_or(0);
                // memcached stores nothing longer by default; a reply that says more is no
                // counter of ours, and must not size an allocation.
                if bytes > MAX_VALUE_BYTES {
                    return Err(std::io::Error::other(format!("memcached: a value of {bytes} bytes")));
                }
                let mut data = vec![0u8; bytes.saturating_add(2)];
                conn.read_exact(&mut data).await?;
                let value = data
                    .get(..bytes)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                out.push((key, value));
            }
            _ => return Err(std::io::Error::other(format!("memcached: unexpected reply {line:?}"))),
        }
    }
}

/// `incr key cost`, creating the counter with `add` (TTL `ttl_ms`) when it is missing.
async fn incr(conn: &mut BufReader<TcpStream>, key: &str, cost: u64, ttl_ms: u64) -> std::io::Result<()> {
    for _ in 0..2 {
        conn.get_mut().write_all(format!("incr {key} {cost}\r\n").as_bytes()).await?;
        let mut line = String::new();
        conn.read_line(&mut line).await?;
        if !line.starts_with("NOT_FOUND") {
            return Ok(());
        }
        // Add-if-missing; a racing add that wins is fine: the incr retries on its counter.
        let ttl = ttl_ms.div_ceil(1000).max(1);
        conn.get_mut().write_all(format!("add {key} 0 {ttl} 1\r\n0\r\n").as_bytes()).await?;
        line.clear();
        conn.read_line(&mut line).await?;
    }
    Err(std::io::Error::other("memcached: counter vanished twice"))
}
