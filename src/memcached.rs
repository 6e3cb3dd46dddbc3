//! The two-bucket estimate on memcached (feature `memcached`), as the seed article builds
//! it: per key and limit, one counter per window-long bucket; a check reads the current and
//! the previous bucket with one multi-get, estimates `previous × (1 − f) + current` (`f`
//! the part of the current bucket elapsed), and if the request fits, `incr`s the current
//! bucket (creating it with `add` when missing), with a TTL of two buckets (none for
//! windows over 15 days: memcached reads an expiry over 30 days as a date, so such counters
//! stay until memcached's LRU evicts them).
//!
//! This is the sliding window with one slot per window (the in-process default for 1 s
//! windows, and `Limit::precision(window)` otherwise): the same decisions, sequentially.
//! What memcached cannot do that Redis can: **run the check and the increment atomically**.
//! Two checks of one key that read the counters before either increments can both be
//! admitted, so under contention a key can exceed `max` by the checks in flight at once
//! (at most `(c − 1) × cost` for `c` concurrent checks of the key); and with several limits
//! there is no atomic admission across them (each is incremented after the decision, none
//! is rolled back). Time is the caller's (memcached has no clock to lend). The fallback
//! when memcached fails or times out is the Redis backend's [`Fallback`] (a cost above a
//! limit's `max` is `CostTooLarge` under each of them, as with memcached up); under
//! [`Fallback::Local`] its in-process limiter holds at most
//! [`max_keys`](MemcachedLimiterBuilder::max_keys) keys (default [`DEFAULT_MAX_KEYS`]), and
//! refuses a new key beyond that with `Denial::TooManyKeys`.
//!
//! # Connections
//!
//! Checks run on a pool of at most [`pool_size`](MemcachedLimiterBuilder::pool_size)
//! connections (default [`DEFAULT_POOL_SIZE`], 8), opened on demand by the checks that
//! need them (none by `build`), so concurrent checks are not serialised on one connection.
//! A check that finds every connection busy waits for one, within its
//! [`timeout`](MemcachedLimiterBuilder::timeout): the wait counts, and a check that waited
//! too long is answered by the fallback like any other. A connection whose exchange failed
//! or was cut short by the timeout is never reused (its replies could be out of step): it
//! is closed, and a later check opens a new one.
//!
//! # Keys
//!
//! The counter of key `k`, limit `i` (its place among the builder's limits) and bucket `n`
//! (milliseconds since the epoch divided by the window) is named
//! `{prefix}:{k'}:{i}:{n}`, where `k'` is `k`'s [`Display`](fmt::Display) text with every
//! byte that memcached refuses in a key (space, control characters), every non-ASCII byte
//! and the three bytes `%`, `:` and `#` written as `%XX` (upper-case hex). That mapping is
//! injective: `k'` holds no `:`, so the last three `:` split a name back into prefix, key,
//! limit and bucket, and percent-escaping is undone byte for byte. Keys whose texts differ
//! (`"a b"` and `"a_b"`, `"a:0"` and `"a%3A0"`) never share a counter, and neither do the
//! limiters of two different prefixes. (Keys are told apart by their `Display` text: a key
//! type whose different values print alike shares their budget.)
//!
//! memcached keys are at most 250 bytes. A key whose escaped text does not fit is named by
//! its SHA-256 instead: `{prefix}:#{64 hex digits}:{i}:{n}`. No escaped key starts with
//! `#`, so such names never meet an escaped one, and two long keys share a counter only if
//! their texts collide under SHA-256. Every key is accepted and no check fails for its key.
//!
//! The prefix (default `"slidegate"`) is used as given; `build` refuses one longer than
//! [`MAX_PREFIX_BYTES`] or with a space or a control character
//! ([`ConfigError::InvalidBackendSetting`]). Counters written by a version before this
//! layout (prefix and key joined with no `:`, blanks replaced by `_`) are not read: on an
//! upgrade each key starts a fresh window.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use slidegate::memcached::MemcachedLimiter;
//! use slidegate::Limit;
//!
//! let limiter = MemcachedLimiter::<u64>::builder()
//!     .addr("127.0.0.1:11211")
//!     .limit(Limit::per_minute(500))
//!     .pool_size(16)
//!     .build()?;
//! let checked = limiter.check(&7).await;
//! # let _ = checked;
//! # Ok(())
//! # }
//! ```

mod wire;

use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool::managed;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use sha2::{Digest, Sha256};

pub use crate::remote::{Checked, DecidedBy, Fallback};
use crate::{ConfigError, Decision, Limit, Limiter, ManualClock};
use wire::{get_multi, incr, Connector};

/// How many connections a [`MemcachedLimiter`] opens at most unless
/// [`pool_size`](MemcachedLimiterBuilder::pool_size) says otherwise.
///
/// ```
/// assert_eq!(slidegate::memcached::DEFAULT_POOL_SIZE, 8);
/// ```
pub const DEFAULT_POOL_SIZE: usize = 8;

/// The most keys [`Fallback::Local`]'s in-process limiter holds unless
/// [`max_keys`](MemcachedLimiterBuilder::max_keys) says otherwise.
///
/// ```
/// assert_eq!(slidegate::memcached::DEFAULT_MAX_KEYS, 100_000);
/// ```
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// The longest key prefix [`build`](MemcachedLimiterBuilder::build) accepts, in bytes: with
/// it, the longest name (a hashed key, limit index and bucket) still fits memcached's 250.
///
/// ```
/// use slidegate::memcached::{MemcachedLimiter, MAX_PREFIX_BYTES};
/// use slidegate::{ConfigError, Limit};
///
/// let long = "p".repeat(MAX_PREFIX_BYTES + 1);
/// let built = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).prefix(&long).build();
/// assert!(matches!(built, Err(ConfigError::InvalidBackendSetting { setting: "prefix", .. })));
/// ```
pub const MAX_PREFIX_BYTES: usize = 128;

/// memcached's longest key.
const MAX_KEY_BYTES: usize = 250;

/// The longest `:{i}:{n}` ending a name (two `usize`/`u64` of at most 20 digits).
const MAX_SUFFIX_BYTES: usize = 42;

/// What the escaped key text never holds: what memcached refuses (controls, space), `%` (so
/// escaping is undone byte for byte), `:` (the separator) and `#` (the mark of a hashed key).
/// `utf8_percent_encode` escapes every non-ASCII byte as well.
const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b':').add(b'#');

/// One limit in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    max: u64,
    window: u64,
}

/// A two-bucket limiter on memcached: see the [module docs](self).
pub struct MemcachedLimiter<K> {
    addr: String,
    pool: managed::Pool<Connector>,
    buckets: Vec<Bucket>,
    prefix: String,
    timeout: Duration,
    clock: Option<ManualClock>,
    fallback: Fallback,
    /// A [`Fallback::Closed`] refusal's wait ([`Fallback::closed_wait`]).
    closed_wait: Duration,
    local: Option<Limiter<K>>,
}

impl<K> fmt::Debug for MemcachedLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedLimiter")
            .field("addr", &self.addr)
            .field("buckets", &self.buckets)
            .field("pool", &self.pool.status())
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
    pool_size: usize,
    max_keys: usize,
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

    /// The prefix of every memcached key (default `"slidegate"`); a `:` separates it from
    /// the key (see [Keys](self#keys)). At most [`MAX_PREFIX_BYTES`], with no space or
    /// control character, or `build` refuses it.
    ///
    /// ```
    /// use slidegate::memcached::MemcachedLimiter;
    /// use slidegate::{ConfigError, Limit};
    ///
    /// let ok = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).prefix("api-v2").build();
    /// assert!(ok.is_ok());
    /// let bad = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).prefix("api v2").build();
    /// assert!(matches!(bad, Err(ConfigError::InvalidBackendSetting { setting: "prefix", .. })));
    /// ```
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// How long a check may wait for memcached (default 5 ms), a free connection of the
    /// pool included.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// At most `size` connections to memcached, each carrying one check at a time (default
    /// [`DEFAULT_POOL_SIZE`]); they are opened as concurrent checks need them. `build`
    /// refuses 0.
    ///
    /// ```
    /// use slidegate::memcached::MemcachedLimiter;
    /// use slidegate::{ConfigError, Limit};
    ///
    /// let limiter = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).pool_size(32).build();
    /// assert!(limiter.is_ok());
    /// let none = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).pool_size(0).build();
    /// assert!(matches!(none, Err(ConfigError::InvalidBackendSetting { setting: "pool_size", .. })));
    /// ```
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
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

    /// The most keys [`Fallback::Local`]'s in-process limiter holds (default
    /// [`DEFAULT_MAX_KEYS`]; `0` is taken as 1). While memcached cannot answer, a new key
    /// beyond it is refused with [`Denial::TooManyKeys`](crate::Denial::TooManyKeys) (decided
    /// [`DecidedBy::Local`]), as [`LimiterBuilder::max_keys`](crate::LimiterBuilder::max_keys)
    /// refuses it; the keys it holds keep their limits, and room comes back as idle keys are
    /// swept.
    ///
    /// ```
    /// use slidegate::memcached::MemcachedLimiter;
    /// use slidegate::Limit;
    /// let limiter = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).max_keys(10_000).build()?;
    /// assert_eq!(limiter.local().and_then(|l| l.max_keys()), Some(10_000));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Validates the limits, the prefix and the pool size (connections are opened by the
    /// checks, and reopened after a failure).
    pub fn build(self) -> Result<MemcachedLimiter<K>, ConfigError> {
        let mut local = Limiter::builder().max_keys(self.max_keys);
        for limit in &self.limits {
            local = local.limit(limit.precision(limit.window()));
        }
        if let Some(clock) = &self.clock {
            local = local.clock(clock.clone());
        }
        let local = local.build()?;
        let invalid = |setting, reason: String| ConfigError::InvalidBackendSetting { setting, reason };
        if self.prefix.len() > MAX_PREFIX_BYTES {
            return Err(invalid(
                "prefix",
                format!("{} bytes, more than {MAX_PREFIX_BYTES}", self.prefix.len()),
            ));
        }
        if self.prefix.chars().any(|c| c == ' ' || c.is_control()) {
            return Err(invalid("prefix", format!("{:?} holds a space or a control character", self.prefix)));
        }
        if self.pool_size == 0 {
            return Err(invalid("pool_size", "0 connections could carry no check".to_owned()));
        }
        let pool = managed::Pool::builder(Connector { addr: self.addr.clone() })
            .max_size(self.pool_size)
            .build()
            .map_err(|e| invalid("pool_size", e.to_string()))?;
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
            pool,
            buckets,
            prefix: self.prefix,
            timeout: self.timeout,
            clock: self.clock,
            fallback: self.fallback,
            closed_wait: Fallback::closed_wait(&self.limits),
            local: (self.fallback == Fallback::Local).then_some(local),
        })
    }
}

/// `{prefix}:{k'}`: the part of a counter's name that the key decides (see
/// [Keys](self#keys)): the escaped text, or `#` and its SHA-256 when that does not fit.
fn stem(prefix: &str, key: &str) -> String {
    let escaped: Cow<'_, str> = utf8_percent_encode(key, ESCAPED).into();
    let room = MAX_KEY_BYTES.saturating_sub(MAX_SUFFIX_BYTES).saturating_sub(prefix.len()).saturating_sub(1);
    if escaped.len() <= room {
        format!("{prefix}:{escaped}")
    } else {
        format!("{prefix}:#{:x}", Sha256::digest(key.as_bytes()))
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
            prefix: "slidegate".to_owned(),
            timeout: Duration::from_millis(5),
            clock: None,
            fallback: Fallback::default(),
            pool_size: DEFAULT_POOL_SIZE,
            max_keys: DEFAULT_MAX_KEYS,
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
            // A connection in an unknown state is not reused: it went back to the pool
            // unclean, and the pool closes it (see `Conn`).
            _ => self.fall_back(key, cost),
        }
    }

    /// [`Fallback::Local`]'s in-process limiter (`None` under the other fallbacks): what it
    /// holds is what the fallback admitted while memcached could not answer.
    ///
    /// ```
    /// use slidegate::memcached::{Fallback, MemcachedLimiter};
    /// use slidegate::Limit;
    /// let limiter = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.local().map(|l| l.len()), Some(0));
    /// let open = MemcachedLimiter::<u64>::builder().limit(Limit::per_second(10)).fallback(Fallback::Open).build()?;
    /// assert!(open.local().is_none());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn local(&self) -> Option<&Limiter<K>> {
        self.local.as_ref()
    }

    /// The fallback's decision ([`Fallback::decide`], as Redis's; the local limiter answers
    /// a cost above a limit's `max` as `CostTooLarge` itself).
    fn fall_back(&self, key: &K, cost: u64) -> Checked {
        match (self.fallback, &self.local) {
            (Fallback::Local, Some(local)) => Checked::new(local.check_n(key, cost), DecidedBy::Local),
            (fallback, _) => {
                fallback.decide(self.buckets.iter().position(|b| cost > b.max), self.closed_wait)
            }
        }
    }

    async fn decide(&self, key: &K, cost: u64, now: u64) -> std::io::Result<Decision> {
        let stem = stem(&self.prefix, &key.to_string());
        let names: Vec<(String, String, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bucket = now.checked_div(b.window).unwrap_or(now);
                let name = |n: u64| format!("{stem}:{i}:{n}");
                (name(bucket), name(bucket.saturating_sub(1)), bucket)
            })
            .collect();
        let mut conn = self.pool.get().await.map_err(|e| match e {
            managed::PoolError::Backend(e) => e,
            other => std::io::Error::other(other.to_string()),
        })?;
        let conn = &mut *conn;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::arithmetic_side_effects, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    /// A name is a memcached key: at most 250 bytes with the longest `:{i}:{n}`, and no
    /// space or control byte.
    fn assert_valid(name: &str) {
        assert!(name.len() + MAX_SUFFIX_BYTES <= MAX_KEY_BYTES, "{name:?}: {} bytes", name.len());
        assert!(name.bytes().all(|b| b > b' ' && b != 0x7f), "{name:?}");
    }

    /// The key back from a name: `None` for a hashed one.
    fn key_of(prefix: &str, name: &str) -> Option<String> {
        let (p, k) = name.rsplit_once(':').unwrap();
        assert_eq!(p, prefix);
        if k.starts_with('#') {
            return None;
        }
        Some(percent_encoding::percent_decode_str(k).decode_utf8().unwrap().into_owned())
    }

    proptest! {
        /// Every key gets a valid name that gives the key back (so distinct keys get
        /// distinct names), or, when escaping does not fit, `#` and 64 hex digits.
        #[test]
        fn names_are_memcached_keys_and_give_the_key_back(
            key in prop_oneof!["[ a_%:#\t\u{0}\u{7f}é\u{2003}]{0,8}", any::<String>(), ".{60,130}"],
            prefix in "[!-~]{0,128}",
        ) {
            let name = stem(&prefix, &key);
            assert_valid(&name);
            match key_of(&prefix, &name) {
                Some(back) => prop_assert_eq!(back, key),
                None => {
                    let hash = name.rsplit_once(":#").unwrap().1;
                    let room = MAX_KEY_BYTES - MAX_SUFFIX_BYTES - prefix.len() - 1;
                    prop_assert!(utf8_percent_encode(&key, ESCAPED).to_string().len() > room);
                    prop_assert_eq!(hash.len(), 64);
                    prop_assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
                }
            }
        }
    }

    #[test]
    fn the_old_mappings_pairs_get_distinct_names() {
        let pairs = [("a b", "a_b"), ("a\tb", "a_b"), ("a\u{2003}b", "a b"), ("a%20b", "a b"), ("#", "%23")];
        for (a, b) in pairs {
            assert_ne!(stem("slidegate", a), stem("slidegate", b), "{a:?} {b:?}");
        }
        assert_eq!(stem("slidegate", "a b"), "slidegate:a%20b");
        assert_ne!(stem("p", ":x"), stem("p:", "x"));
        let long = "k".repeat(300);
        assert_ne!(stem("p", &long), stem("p", &format!("{long}x")));
        assert_valid(&stem(&"p".repeat(MAX_PREFIX_BYTES), &long));
    }
}
