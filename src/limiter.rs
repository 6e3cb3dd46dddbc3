//! [`Limiter`]: the keyed front end. A sharded `DashMap` (hashed with `ahash`) maps each key
//! to its [`KeyState`]; the builder wires up the clock and the sweeper.
//!
//! # Eviction and why no epoch
//! A check runs entirely under the shard *read* guard that `DashMap::get` returns, and a key
//! is removed or reset only under that shard's *write* lock, after re-checking that it is
//! expired. The lock is therefore the grace period: no check can hold a key's state while
//! it is removed, so no count is lost and no memory is freed under a reader. An epoch scheme
//! (`crossbeam-epoch`) would add a pin to every check to protect a pointer that the guard
//! already protects. The per-key protocol itself takes no lock.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use crate::algorithm::Algorithm;
use crate::background::Periodic;
use crate::cache::HotKeys;
use crate::clock::{start_coarse_clock, ManualClock, Now};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limit::Limit;
use crate::metrics::Metrics;
use crate::window::{KeyState, Outcome, Policy, MAX_IDENTITIES};

/// Shards in the key map: enough that a sweep holds any one shard's lock only briefly and
/// that two cores rarely meet on one shard.
const SHARDS: usize = 256;

/// The default resolution of the real clock.
const DEFAULT_TICK: Duration = Duration::from_millis(1);

struct Shared<K> {
    /// Per-thread caches of hot keys' states, and the second hash that identifies a key
    /// there (with the map's own).
    hot: HotKeys,
    second_hash: ahash::RandomState,
    map: DashMap<K, Held, ahash::RandomState>,
    policy: Policy,
    now: Now,
    max_keys: usize,
    /// Keys in the map, kept by insert and remove so `len()` and `max_keys` cost O(1).
    live: AtomicUsize,
    /// [`Shared::release_all`] for this `K` (`Drop` cannot require `K: Hash + Eq`).
    on_drop: fn(&Shared<K>),
    name: String,
    metrics: Metrics,
    /// Shadow mode: refusals are reported but admitted.
    shadow: bool,
}

impl<K> Drop for Shared<K> {
    fn drop(&mut self) {
        (self.on_drop)(self);
    }
}

/// A key's entry in the map: its state, and a copy of the state's `touched` time that
/// the sweeper reads without leaving the map's table. The copy is a lower bound: checks
/// through the per-thread caches do not refresh it, and the sweeper then looks at the state
/// itself before deciding anything.
struct Held {
    touched: AtomicU64,
    state: KeyState,
}

impl Held {
    fn new(state: KeyState) -> Held {
        Held { touched: AtomicU64::new(state.touched()), state }
    }

    /// After a check through the map: keep the copy current. It moves once per slot, so
    /// this writes the entry's line once per slot, not once per check.
    #[inline]
    fn refresh(&self) {
        // Relaxed: a hint (see the type's docs); `retire` decides.
        let touched = self.state.touched();
        if touched > self.touched.load(Ordering::Relaxed) {
            self.touched.store(touched, Ordering::Relaxed);
        }
    }
}

impl std::ops::Deref for Held {
    type Target = KeyState;

    fn deref(&self) -> &KeyState {
        &self.state
    }
}

/// A keyed sliding-window rate limiter. Cheap to share: `&Limiter` from many threads, or
/// an `Arc<Limiter>`.
///
/// ```
/// use std::time::Duration;
/// use slidegate::{Limit, Limiter, ManualClock};
///
/// let clock = ManualClock::new();
/// let limiter = Limiter::<String>::builder()
///     .limit(Limit::per_second(10))
///     .limit(Limit::per_minute(120))
///     .limit(Limit::new(240, Duration::from_secs(3600)).precision(Duration::from_secs(60)))
///     .clock(clock.clone())
///     .build()?;
///
/// for _ in 0..10 {
///     assert!(limiter.check("user_a").is_allowed());
/// }
/// let refused = limiter.check("user_a");
/// assert!(!refused.is_allowed());
/// // Interpolated: one second later the old slot still weighs 10 × (1 − f); one more
/// // request fits once that is ≤ 9, at f = 0.1.
/// assert_eq!(refused.retry_after(), Some(Duration::from_millis(1100)));
/// assert!(limiter.check("user_b").is_allowed()); // keys are independent
///
/// clock.advance(Duration::from_millis(1099));
/// assert!(!limiter.check("user_a").is_allowed());
/// clock.advance(Duration::from_millis(1));
/// assert!(limiter.check("user_a").is_allowed());
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
pub struct Limiter<K> {
    shared: Arc<Shared<K>>,
    // Dropped after `shared` is released by this handle; each joins its thread.
    _sweeper: Option<Periodic>,
    _ticker: Option<Periodic>,
}

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
            clock: None,
            max_keys: None,
            sweep_interval: None,
            tick: DEFAULT_TICK,
            _key: PhantomData,
        }
    }

    /// Checks a request of cost 1 for `key`, counting it if admitted. Same as
    /// [`check_n`](Self::check_n)`(key, 1)`.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(1)).build()?;
    /// assert!(limiter.check("alice").is_allowed());
    /// assert!(!limiter.check("alice").is_allowed());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Checks a request weighing `cost` units. It is admitted only if every limit has room
    /// for all of it, and then counted in every limit; a refused request changes nothing.
    /// A cost of 0 consumes nothing and never inserts a key. A cost above some limit's
    /// `max` is refused with [`Denial::CostTooLarge`](crate::Denial::CostTooLarge) and no `retry_after`.
    ///
    /// ```
    /// use slidegate::{Denial, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.check_n(&1, 4).remaining(), 6);
    /// assert_eq!(limiter.check_n(&1, 7).denial(), Some(Denial::Limit(0)));
    /// assert_eq!(limiter.check_n(&1, 11).denial(), Some(Denial::CostTooLarge(0)));
    /// assert_eq!(limiter.check_n(&1, 6).remaining(), 0);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let decision = self.decide::<Q, false>(key, cost);
        self.shared.metrics.decided(&decision, cost);
        if self.shared.shadow {
            return decision.shadowed();
        }
        decision
    }

    /// Checks one request against several keys at once (its user, its API key, its IP: at
    /// most [`MAX_IDENTITIES`](crate::MAX_IDENTITIES)): admitted only if every key has room
    /// in every limit, and then counted against all of them; a refusal counts against none.
    /// Exact under contention like a single key, and lock-free on the states (the keys are
    /// looked up one at a time, so no order of keys can deadlock). The decision is about
    /// [`key`](Identities::key): the key with the least room when admitted, the one that
    /// frees up last when refused. Keys checked together are inserted before the check
    /// (a refused request can leave an empty state, swept like any idle key); a key listed
    /// twice counts once.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<&str>::builder().limit(Limit::per_minute(3)).build()?;
    /// let _ = limiter.check_n(&"user:7", 2);
    /// let d = limiter.check_all(&[&"user:7", &"ip:203.0.113.9"], 1)?;
    /// assert!(d.is_allowed());
    /// assert_eq!((d.key(), d.remaining()), (0, 0)); // user:7 is now full
    /// let d = limiter.check_all(&[&"user:7", &"ip:203.0.113.9"], 1)?;
    /// assert_eq!((d.is_allowed(), d.key()), (false, 0));
    /// assert_eq!(limiter.check(&"ip:203.0.113.9").remaining(), 1); // the refusal took nothing
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn check_all<Q>(&self, keys: &[&Q], cost: u64) -> Result<Identities, ConfigError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if keys.len() > MAX_IDENTITIES {
            return Err(ConfigError::TooManyIdentities { given: keys.len(), most: MAX_IDENTITIES });
        }
        let shared = &*self.shared;
        let policy = &shared.policy;
        let now = shared.now.nanos();
        let decided = |decision: Decision, key: usize| {
            shared.metrics.decided(&decision, cost);
            let decision = if shared.shadow { decision.shadowed() } else { decision };
            Ok(Identities { decision, key })
        };
        if keys.is_empty() || cost == 0 {
            let peeks = keys.iter().map(|k| self.decide::<Q, false>(k, 0)).enumerate();
            let (key, decision) = peeks.min_by_key(|(_, d)| d.remaining()).unwrap_or((0, policy.fresh(0)));
            return Ok(Identities { decision, key });
        }
        if let Some(index) = policy.oversized(cost) {
            let room = self.decide::<Q, false>(keys[0], 0).remaining();
            return decided(policy.never(index, room), 0);
        }
        loop {
            let mut states: [Option<KeyState>; MAX_IDENTITIES] = Default::default();
            for (i, key) in keys.iter().enumerate() {
                match self.state_of(*key, now) {
                    Some(state) => states[i] = Some(state),
                    None => return decided(Decision::too_many_keys(), i),
                }
            }
            // Distinct states only (a key listed twice counts once), remembering each
            // state's first key.
            let Some(first) = states.iter().flatten().next() else { return decided(policy.fresh(cost), 0) };
            let mut refs: [&KeyState; MAX_IDENTITIES] = [first; MAX_IDENTITIES];
            let mut first_key = [0usize; MAX_IDENTITIES];
            let mut n = 0;
            for (i, state) in states.iter().enumerate() {
                let Some(state) = state else { continue };
                if !refs[..n].iter().any(|d| d.same(state)) {
                    refs[n] = state;
                    first_key[n] = i;
                    n += 1;
                }
            }
            match KeyState::check_many(&refs[..n], policy, now, cost) {
                (Outcome::Decided(decision), s) => return decided(decision, first_key[s]),
                // Expired (replaced by `state_of` on the next round) or retired: again.
                (Outcome::Expired | Outcome::Retired, _) => {}
            }
        }
    }

    /// The state of `key`, inserted fresh if absent and replaced if expired or retired;
    /// `None` if it is absent and the table is at `max_keys`.
    fn state_of<Q>(&self, key: &Q, now: u64) -> Option<KeyState>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let policy = &shared.policy;
        if let Some(held) = shared.map.get(key) {
            if !held.is_retired() && now.saturating_sub(held.touched()) < policy.expiry() {
                held.refresh();
                return Some(held.state.clone());
            }
        }
        match shared.map.entry(key.to_owned()) {
            Entry::Occupied(mut entry) => {
                if entry.get().retire(policy, now) || entry.get().is_retired() {
                    entry.insert(Held::new(KeyState::new(policy, now)));
                }
                Some(entry.get().state.clone())
            }
            Entry::Vacant(entry) => {
                // Relaxed: `live` is a counter; the shard lock orders the map itself.
                if shared.live.fetch_add(1, Ordering::Relaxed) >= shared.max_keys {
                    shared.live.fetch_sub(1, Ordering::Relaxed);
                    return None;
                }
                shared.metrics.keys(shared.live.load(Ordering::Relaxed));
                let state = KeyState::new(policy, now);
                entry.insert(Held::new(state.clone()));
                Some(state)
            }
        }
    }

    /// Counts `cost` units for `key` without checking them: units admitted elsewhere (by
    /// another replica, see `HybridLimiter` with feature `redis`), so that this limiter's
    /// later decisions include them. Counts saturate; the decision returned is the state
    /// afterwards (it may say `remaining() == 0` with the key over its limits).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.record(&1, 8).remaining(), 2);
    /// assert_eq!(limiter.record(&1, 8).remaining(), 0); // 16 counted: over the limit
    /// assert!(!limiter.check(&1).is_allowed());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn record<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide::<Q, true>(key, cost)
    }

    /// Waits until `cost` units of `key` are admitted, sleeping for each refusal's
    /// `retry_after` (feature `tokio`, on the tokio timer), and returns the admission; or
    /// returns the refusal at once when waiting cannot help (a cost above a limit's `max`, or
    /// the table full at `max_keys`).
    ///
    /// Cancellation-safe: nothing is consumed until the admission itself, which happens
    /// inside one poll, so dropping the future while it sleeps (e.g. in `tokio::select!` or
    /// under a timeout) leaves the key's budget untouched. Waiters are not queued: when
    /// several wait on one key, whoever checks first after the wait takes the room.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), slidegate::ConfigError> {
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    ///
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(20)).build()?;
    /// let started = std::time::Instant::now();
    /// for _ in 0..21 {
    ///     assert!(limiter.until_ready(&7, 1).await.is_ok());
    /// }
    /// assert!(started.elapsed() >= Duration::from_millis(40)); // the 21st waited
    /// assert!(limiter.until_ready(&7, 100).await.is_err()); // can never fit 20/s
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn until_ready<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let decision = self.check_n(key, cost);
            match (decision.is_allowed(), decision.retry_after()) {
                (true, _) => return Ok(decision),
                (false, Some(wait)) => tokio::time::sleep(wait).await,
                (false, None) => return Err(decision),
            }
        }
    }

    /// [`check_n`](Self::check_n) before the metrics; with `FORCE`, [`record`](Self::record).
    #[inline(always)]
    fn decide<Q, const FORCE: bool>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let policy = &shared.policy;
        let now = shared.now.nanos();
        if let Some(index) = policy.oversized(cost).filter(|_| !FORCE) {
            let room = match shared.map.get(key) {
                Some(state) => state.room(policy, now),
                None => policy.fresh(0).remaining(),
            };
            return policy.never(index, room);
        }
        // A key this thread checks again and again: no map, no shard lock (see `cache.rs`).
        let hash = shared.map.hasher().hash_one(key);
        let second = || shared.second_hash.hash_one(key);
        let cached =
            shared.hot.with_cached(hash, second, |state| match state.run::<FORCE>(policy, now, cost) {
                Outcome::Decided(decision) => Some(decision),
                Outcome::Expired | Outcome::Retired => None,
            });
        if let Some(decision) = cached {
            return decision;
        }
        loop {
            let Some(state) = shared.map.get(key) else { break };
            match state.run::<FORCE>(policy, now, cost) {
                Outcome::Decided(decision) => {
                    state.refresh();
                    shared.hot.missed(hash, second, &state);
                    return decision;
                }
                // Expired, or (defensively: a state is retired only as it leaves the map)
                // retired: replace it below.
                Outcome::Expired | Outcome::Retired => {}
            }
            drop(state);
            // Expired: replace it with a fresh state under the shard's write lock (checks
            // through caches may still hold the old one: `retire` sends them back here),
            // then check again (the fresh state cannot be expired at `now`).
            if let Some(mut state) = shared.map.get_mut(key) {
                if state.retire(policy, now) || state.is_retired() {
                    *state = Held::new(KeyState::new(policy, now));
                }
            }
        }
        if cost == 0 {
            return policy.fresh(0);
        }
        self.insert::<Q, FORCE>(key, now, cost)
    }

    #[cold]
    fn insert<Q, const FORCE: bool>(&self, key: &Q, now: u64, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let policy = &shared.policy;
        match shared.map.entry(key.to_owned()) {
            // Another thread inserted it meanwhile. We hold the write lock: an expired state
            // is replaced (after retiring it for the caches), and no other thread can retire
            // the one we check.
            Entry::Occupied(mut entry) => {
                if entry.get().retire(policy, now) {
                    entry.insert(Held::new(KeyState::new(policy, now)));
                }
                match entry.get().run::<FORCE>(policy, now, cost) {
                    Outcome::Decided(decision) => decision,
                    Outcome::Expired | Outcome::Retired => policy.fresh(cost),
                }
            }
            Entry::Vacant(entry) => {
                // Relaxed: `live` is a counter; the shard lock orders the map itself.
                if shared.live.fetch_add(1, Ordering::Relaxed) >= shared.max_keys {
                    shared.live.fetch_sub(1, Ordering::Relaxed);
                    return Decision::too_many_keys();
                }
                shared.metrics.keys(shared.live.load(Ordering::Relaxed));
                let state = KeyState::new(policy, now);
                let decision = match state.run::<FORCE>(policy, now, cost) {
                    Outcome::Decided(decision) => decision,
                    Outcome::Expired | Outcome::Retired => policy.fresh(cost),
                };
                entry.insert(Held::new(state));
                decision
            }
        }
    }

    /// Would a request of cost 1 be admitted now? Consumes nothing and inserts no key;
    /// `remaining()` is what it would be if the request were admitted. For a key not held
    /// while the table is at `max_keys`, the answer is [`Denial::TooManyKeys`](crate::Denial::TooManyKeys), as a check
    /// would be.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(3)).build()?;
    /// assert_eq!(limiter.peek(&9).remaining(), 2);
    /// assert_eq!(limiter.len(), 0);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shared = &*self.shared;
        let now = shared.now.nanos();
        match shared.map.get(key) {
            Some(state) => match state.check(&shared.policy, now, 1, false) {
                Outcome::Decided(decision) => decision,
                // A retired state is being replaced or removed: both read as empty.
                Outcome::Expired | Outcome::Retired => shared.policy.fresh(1),
            },
            // A new key would be refused while the table is full (until a sweep frees room).
            None if shared.live.load(Ordering::Relaxed) >= shared.max_keys => Decision::too_many_keys(),
            None => shared.policy.fresh(1),
        }
    }

    /// Forgets `key`: its windows start empty. Returns whether it was present.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// let _ = limiter.check(&1);
    /// assert!(limiter.reset(&1));
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some((_, state)) = self.shared.map.remove(key) else { return false };
        // Checks that hold the state through a cache start over on the map.
        state.retire_now(&self.shared.policy);
        let live = self.shared.live.fetch_sub(1, Ordering::Relaxed);
        self.shared.metrics.keys(live.saturating_sub(1));
        true
    }

    /// Evicts every key idle for long enough that all its windows are empty and returns how
    /// many: a key is evicted once its last admission is older than the largest `window +
    /// precision` of the limits (a key whose windows happen to be empty earlier, e.g. its
    /// last unit was early in a slot, waits for that). The background sweeper calls
    /// this; with a [`ManualClock`] call it yourself. Evicting such a key changes no
    /// decision.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter, ManualClock};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).clock(clock.clone()).build()?;
    /// let _ = limiter.check(&1);
    /// assert_eq!(limiter.sweep(), 0);
    /// clock.advance(Duration::from_secs(2));
    /// assert_eq!(limiter.sweep(), 1);
    /// assert_eq!(limiter.len(), 0);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.shared.sweep()
    }

    /// The number of keys held.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// let _ = limiter.check(&1);
    /// let _ = limiter.check(&2);
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// `true` when no key is held.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// assert!(limiter.is_empty());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limits this limiter applies, in builder order (the index a
    /// [`Denial::Limit`](crate::Denial::Limit) names).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit("10/s".parse()?).build()?;
    /// assert_eq!(limiter.limits().next(), Some(&Limit::per_second(10)));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn limits(&self) -> impl Iterator<Item = &Limit> + '_ {
        self.shared.policy.limits()
    }

    /// Heap bytes one key's counters take (the map entry and allocator overhead come on
    /// top; see the README's memory table).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.state_bytes_per_key(), 8 * 4); // touched, current slot, 2 ring slots
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn state_bytes_per_key(&self) -> usize {
        self.shared.policy.words_per_key() * 8
    }

    /// The limiter's name (see [`LimiterBuilder::name`]).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.name(), "slidegate");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The algorithm every limit runs.
    ///
    /// ```
    /// use slidegate::{Algorithm, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.algorithm(), Algorithm::SlidingWindow);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn algorithm(&self) -> Algorithm {
        self.shared.policy.algorithm()
    }
}

/// [`Limiter::check_all`]'s decision, and which key it is about (an index into the keys
/// given). Derefs to the [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identities {
    decision: Decision,
    key: usize,
}

impl Identities {
    /// The decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The index of the key the decision is about: the one with the least room when
    /// admitted, the one that frees up last when refused.
    pub fn key(&self) -> usize {
        self.key
    }
}

impl std::ops::Deref for Identities {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.decision
    }
}

impl<K: Hash + Eq + Clone> Shared<K> {
    /// Frees what the held states own beyond their words (sliding logs), as the limiter
    /// goes away.
    fn release_all(&self) {
        if self.policy.algorithm() == Algorithm::SlidingLog {
            for held in self.map.iter() {
                held.retire_now(&self.policy);
            }
        }
    }

    fn sweep(&self) -> usize {
        let now = self.now.nanos();
        let expiry = self.policy.expiry();
        // Find candidates under the shards' read locks, so checks never wait for the scan: a
        // key whose in-map copy of `touched` is recent is passed over without a look at its
        // state. Then each candidate is evicted under its shard's write lock if `retire`
        // succeeds: it re-checks expiry on the state and, by its CAS, wins or loses against
        // any check still counting into it, including checks that hold it through a cache.
        let mut candidates = Vec::new();
        for shard in self.map.shards() {
            let table = shard.read();
            // SAFETY: the shard's read guard is held for the whole walk, so no insert or
            // removal can reallocate the table or move its entries, and the buckets the
            // iterator yields stay valid (full and initialised) until it is dropped.
            // `DashMap::iter` walks the table the same way, but clones an `Arc` of the
            // guard for every entry.
            #[allow(unsafe_code)]
            for bucket in unsafe { table.iter() } {
                // SAFETY: as above; the reference does not outlive `table`.
                #[allow(unsafe_code)]
                let (key, held) = unsafe { bucket.as_ref() };
                // Relaxed: a hint; `retire` decides.
                if now.saturating_sub(held.get().touched.load(Ordering::Relaxed)) >= expiry {
                    candidates.push(key.clone());
                }
            }
        }
        let mut evicted = 0;
        for key in candidates {
            match self.map.remove_if(&key, |_, held| held.retire(&self.policy, now)) {
                Some(_) => evicted += 1,
                // Still in use (through a cache, so its copy of `touched` was stale).
                None => {
                    if let Some(held) = self.map.get(&key) {
                        held.refresh();
                    }
                }
            }
        }
        let live = self.live.fetch_sub(evicted, Ordering::Relaxed);
        self.metrics.keys(live.saturating_sub(evicted));
        self.metrics.evicted(evicted);
        evicted
    }
}

impl<K> fmt::Debug for Limiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.shared.name)
            .field("limits", &self.shared.policy.limits().collect::<Vec<_>>())
            .field("keys", &self.shared.live.load(Ordering::Relaxed))
            .field("max_keys", &self.shared.max_keys)
            .finish()
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
    clock: Option<ManualClock>,
    max_keys: Option<usize>,
    sweep_interval: Option<Duration>,
    tick: Duration,
    _key: PhantomData<fn() -> K>,
}

impl<K> fmt::Debug for LimiterBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("name", &self.name)
            .field("shadow", &self.shadow)
            .field("algorithm", &self.algorithm)
            .field("limits", &self.limits)
            .field("manual_clock", &self.clock.is_some())
            .field("max_keys", &self.max_keys)
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
    /// assert_eq!(limiter.limits().count(), 2);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
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

    /// Shadow mode: every decision is computed and reported (metrics count the denials as
    /// usual), but a request a limit refuses is admitted anyway, with the denial it would
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

    /// Holds at most `max_keys` keys: a new key beyond that is refused with
    /// [`Denial::TooManyKeys`](crate::Denial::TooManyKeys), and nothing already held is touched. Default: unbounded.
    ///
    /// ```
    /// use slidegate::{Denial, Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).max_keys(1).build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert_eq!(limiter.check(&2).denial(), Some(Denial::TooManyKeys));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// How often the background sweeper evicts idle keys. Default: the shortest window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_hour(100))
    ///     .sweep_interval(Duration::from_secs(30))
    ///     .build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = Some(interval);
        self
    }

    /// Resolution of the real clock: how often its ticker thread refreshes the time every
    /// check reads. Default 1 ms. Ignored with a [`ManualClock`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(100))
    ///     .clock_tick(Duration::from_micros(500))
    ///     .build()?;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn clock_tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Validates the configuration and starts the limiter (and, with the real clock, its
    /// ticker and sweeper threads, which stop when the limiter is dropped).
    ///
    /// ```
    /// use slidegate::{ConfigError, Limit, Limiter};
    /// let err = Limiter::<u64>::builder().limit(Limit::per_second(0)).build().unwrap_err();
    /// assert!(matches!(err, ConfigError::ZeroMax { .. }));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<Limiter<K>, ConfigError> {
        let policy = Policy::with_algorithm(&self.limits, self.algorithm)?;
        if self.max_keys == Some(0) {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let sweep_interval = match self.sweep_interval {
            Some(interval) if interval.is_zero() => return Err(ConfigError::ZeroSweepInterval),
            Some(interval) => interval,
            None => self.limits.iter().map(Limit::window).min().unwrap_or(Duration::from_secs(1)),
        };
        let spawn_error =
            |thread| move |e: std::io::Error| ConfigError::ThreadSpawn { thread, reason: e.to_string() };
        let (now, ticker) = match &self.clock {
            Some(clock) => (clock.source(), None),
            None => {
                let tick = self.tick.max(Duration::from_micros(50));
                let (now, ticker) = start_coarse_clock(tick).map_err(spawn_error("clock"))?;
                (now, Some(ticker))
            }
        };
        let shared = Arc::new(Shared {
            hot: HotKeys::new(),
            second_hash: ahash::RandomState::new(),
            map: DashMap::with_hasher_and_shard_amount(ahash::RandomState::new(), SHARDS),
            policy,
            now,
            max_keys: self.max_keys.unwrap_or(usize::MAX),
            live: AtomicUsize::new(0),
            on_drop: Shared::release_all,
            metrics: Metrics::new(&self.name, self.limits.len()),
            name: self.name,
            shadow: self.shadow,
        });
        let sweeper = match ticker {
            None => None,
            Some(_) => {
                let sweeping = Arc::clone(&shared);
                let sweeper = Periodic::spawn("slidegate-sweeper", sweep_interval, move || {
                    sweeping.sweep();
                })
                .map_err(spawn_error("sweeper"))?;
                Some(sweeper)
            }
        };
        Ok(Limiter { shared, _sweeper: sweeper, _ticker: ticker })
    }
}
