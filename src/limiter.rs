//! [`Limiter`]: the keyed front end. A [`Table`] (sharded, lock-free reads, see `table.rs`)
//! holds each key's counters; the builder wires up the clock and the sweeper.
//!
//! # The path of a check
//! [`Limiter::check_n`] → `decide`: pin the epoch, hash the key once, find its node, and
//! run the per-key protocol (`protocol.rs`) on its counters under the node's policy, at the
//! clock's time or the shard's floor if that is later (`table.rs`: a check delayed across
//! an eviction decides no earlier than the eviction). Only when that cannot answer does it
//! take the shard's mutex: the key is new (`insert`), its state expired or was retired
//! (`renew` replaces it), or its policy has a newer version (`renew` moves it). Everything
//! else a limiter does (several keys at once, peeks, resets, policy changes, sweeps) goes
//! through the same lookup and the same `renew`.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_epoch::{self as epoch, Guard};
use dashmap::DashMap;

use crate::algorithm::Algorithm;
use crate::clock::{real_clock, ClockLease, ManualClock, Now};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::housekeeper::{self, Registration, Sweep};
use crate::layout::Policy;
use crate::limit::Limit;
use crate::metrics::{Metrics, PolicyMetrics};
use crate::policy::{PolicyConfig, Tiers, DEFAULT_POLICY};
use crate::protocol::{Carry, KeyState, Outcome, OwnedState, MAX_IDENTITIES};
use crate::table::{Change, Node, Refused, Table};

/// The default resolution of the real clock.
const DEFAULT_TICK: Duration = Duration::from_millis(1);

struct Shared<K> {
    table: Table<K>,
    /// The named policies, and the keys given one explicitly (`set_policy`); the others
    /// get the resolver's choice, or the default.
    tiers: Tiers,
    overrides: DashMap<K, usize, ahash::RandomState>,
    /// Set by the first `set_policy`: until then no lookup in `overrides` is needed.
    any_override: AtomicBool,
    resolver: Option<Resolver<K>>,
    algorithm: Algorithm,
    now: Now,
    /// [`Shared::release_all`] for this `K` (`Drop` cannot require `K: Hash + Eq`).
    on_drop: fn(&mut Shared<K>),
    name: String,
    metrics: Metrics,
    /// Shadow mode: refusals are reported but admitted.
    shadow: bool,
    /// The manual clock, if the limiter runs on one: `until_ready` waits for it.
    #[cfg(feature = "tokio")]
    manual: Option<ManualClock>,
}

/// Chooses a key's policy by name (see [`LimiterBuilder::resolver`]).
type Resolver<K> = Box<dyn Fn(&K) -> Option<&str> + Send + Sync>;

impl<K> Drop for Shared<K> {
    fn drop(&mut self) {
        (self.on_drop)(self);
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
    // Dropped first: then no sweep of `shared` runs or starts on the shared sweeper thread
    // (the last registration stops and joins it), so `shared` is released here.
    _sweeper: Option<Registration>,
    shared: Arc<Shared<K>>,
    // The last real-clock limiter's lease stops and joins the shared ticker.
    _ticker: Option<ClockLease>,
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
            policies: Vec::new(),
            default_policy: None,
            resolver: None,
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
        self.check_n_seen(key, cost, |_| {})
    }

    /// Checks one request against several keys at once (its user, its API key, its IP: at
    /// most [`MAX_IDENTITIES`](crate::MAX_IDENTITIES)): admitted only if every key has room
    /// in every limit of its policy, and then counted against all of them; a refusal counts
    /// against none. Exact under contention like a single key, and lock-free on the states
    /// (the keys are looked up one at a time, so no order of keys can deadlock). The
    /// decision is about [`key`](Identities::key): the key with the least room when
    /// admitted, the one that frees up last when refused. Keys checked together are
    /// inserted before the check (a refused request can leave an empty state, swept like
    /// any idle key); a key listed twice counts once.
    ///
    /// Keys whose policy is in shadow mode are checked after the others have admitted the
    /// request, one by one: each counts the request if it has room, and the first that
    /// has none makes the decision (admitted, with its [`shadow_denial`](Decision::shadow_denial)).
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
        let mut now = shared.now.nanos();
        let decided = |decision: Decision, key: usize, metrics: &PolicyMetrics| {
            metrics.decided(&decision, cost, shared.shadow);
            let decision = if shared.shadow { decision.shadowed() } else { decision };
            Ok(Identities { decision, key })
        };
        if keys.is_empty() || cost == 0 {
            let peeks = keys.iter().map(|k| self.decide::<Q, false>(k, 0, |d, _| d)).enumerate();
            let fresh = || shared.tiers.current(shared.tiers.default_index()).fresh(0);
            let (key, decision) = peeks.min_by_key(|(_, d)| d.remaining()).unwrap_or_else(|| (0, fresh()));
            return Ok(Identities { decision, key });
        }
        let guard = epoch::pin();
        'lookup: loop {
            let mut states: [Option<KeyState<'_>>; MAX_IDENTITIES] = Default::default();
            for (i, (slot, key)) in states.iter_mut().zip(keys).enumerate() {
                let hash = shared.table.hash(*key);
                match self.node_of(hash, *key, &mut now, &guard) {
                    Ok(node) => *slot = Some(node.state()),
                    Err(Refused::Full) => {
                        // Counted under the policy the key would have had.
                        let policy = shared.tiers.current(self.tier_of(*key));
                        return decided(Decision::too_many_keys(), i, policy.metrics());
                    }
                }
            }
            // Distinct states only (a key listed twice counts once), remembering each
            // state's first key; enforced policies first, shadow ones after.
            let Some(first) = states.iter().flatten().next().copied() else { continue };
            let mut refs: [KeyState<'_>; MAX_IDENTITIES] = [first; MAX_IDENTITIES];
            let mut first_key = [0usize; MAX_IDENTITIES];
            let (mut n, mut enforced) = (0, 0);
            #[allow(
                clippy::indexing_slicing,
                clippy::arithmetic_side_effects,
                reason = "n counts distinct states of at most MAX_IDENTITIES keys (checked above)"
            )]
            for shadow in [false, true] {
                for (i, state) in states.iter().enumerate() {
                    let Some(state) = state.filter(|s| s.policy().shadow() == shadow) else {
                        continue;
                    };
                    if !refs[..n].iter().any(|d| d.same(&state)) {
                        refs[n] = state;
                        first_key[n] = i;
                        n += 1;
                    }
                }
                if !shadow {
                    enforced = n;
                }
            }
            let refs = refs.get(..n).unwrap_or_default();
            let key_of = |s: usize| first_key.get(s).copied().unwrap_or(0);
            let enforced_refs = refs.get(..enforced).unwrap_or_default();
            // A cost above some enforced limit's `max` never fits. (One above a shadow
            // policy's is that policy's shadow denial, below: it must not decide for the
            // enforced keys.)
            for (s, state) in enforced_refs.iter().enumerate() {
                let policy = state.policy();
                if let Some(index) = policy.oversized(cost) {
                    if state.is_retired() {
                        continue 'lookup;
                    }
                    let never = policy.never(index, state.room(policy, now));
                    return decided(never, key_of(s), policy.metrics());
                }
            }
            let (decision, s) = match KeyState::check_many(enforced_refs, now, cost) {
                _ if enforced == 0 => (shared.tiers.current(shared.tiers.default_index()).fresh(cost), 0),
                (Outcome::Decided(decision), s) => (decision, s),
                // Expired (replaced by `node_of` on the next round) or retired: again.
                (Outcome::Expired | Outcome::Retired, _) => continue,
            };
            #[allow(
                clippy::indexing_slicing,
                reason = "s is one of the enforced states, or 0 when there are none (and n > 0: `first`)"
            )]
            let metrics = refs[s].policy().metrics();
            if !decision.is_allowed() || enforced == n {
                return decided(decision, key_of(s), metrics);
            }
            metrics.decided(&decision, cost, shared.shadow);
            let mut outcome = Identities { decision, key: key_of(s) };
            for (s, state) in refs.iter().enumerate().skip(enforced) {
                let (shadow, policy) = match keys.get(key_of(s)) {
                    Some(key) => self.shadow_check(*state, *key, &mut now, cost, &guard),
                    None => (state.policy().fresh(cost), state.policy()),
                };
                policy.metrics().decided(&shadow, cost, true);
                if !shadow.is_allowed() && outcome.decision.shadow_denial().is_none() {
                    outcome = Identities { decision: shadow.shadowed(), key: key_of(s) };
                }
            }
            return Ok(outcome);
        }
    }

    /// A shadow policy's check of `key` in [`check_all`](Self::check_all), on `state`
    /// first: counted if it has room. A state retired or expired under the check is
    /// renewed and checked again, so the request is counted where the key now lives.
    /// The decision, and the policy version that made it.
    fn shadow_check<'g, Q>(
        &'g self,
        state: KeyState<'g>,
        key: &Q,
        now: &mut u64,
        cost: u64,
        guard: &'g Guard,
    ) -> (Decision, &'g Policy)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut state = state;
        loop {
            let policy = state.policy();
            let outcome = match policy.oversized(cost) {
                Some(index) => Outcome::Decided(policy.never(index, state.room(policy, *now))),
                None => state.check(policy, *now, cost, true),
            };
            if let Outcome::Decided(decision) = outcome {
                return (decision, policy);
            }
            let hash = self.shared.table.hash(key);
            match self.node_of(hash, key, now, guard) {
                Ok(node) => state = node.state(),
                // The table filled up meanwhile: the request was not counted for this key.
                Err(Refused::Full) => return (Decision::too_many_keys(), policy),
            }
        }
    }

    /// The node of `key`: inserted fresh if absent, replaced if expired or retired, and
    /// moved to its policy's current version if that changed. Refused if it is absent and
    /// the table is at `max_keys`. Raises `now` to the shard's floor (see `decide`).
    fn node_of<'g, Q>(
        &'g self,
        hash: u64,
        key: &Q,
        now: &mut u64,
        guard: &'g Guard,
    ) -> Result<Node<'g, K>, Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let table = &self.shared.table;
        loop {
            let Some(node) = table.get(hash, key, guard) else {
                let tier = self.tier_of(key);
                self.insert_node(hash, key, (tier, self.shared.tiers.current(tier)), *now, guard)?;
                // Found again, with the floor, like any other node.
                continue;
            };
            *now = (*now).max(table.floor(hash));
            let state = node.state();
            let policy = state.policy();
            if !policy.is_replaced()
                && !state.is_retired()
                && now.saturating_sub(state.touched()) < policy.expiry()
            {
                return Ok(node);
            }
            self.renew(hash, key, *now, guard);
        }
    }

    /// Inserts a fresh state for `key` under policy `tier` (unless an override, re-checked
    /// under the shard's mutex, says otherwise), or finds the one another thread inserted.
    fn insert_node<'g, Q>(
        &'g self,
        hash: u64,
        key: &Q,
        (tier, policy): (usize, Arc<Policy>),
        now: u64,
        guard: &'g Guard,
    ) -> Result<Node<'g, K>, Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let node = shared.table.insert(hash, key, now, guard, |owned| {
            // `set_policy` stores the override before it moves the key's state under this
            // mutex: either the move finds this state or this finds the override.
            match self.override_of::<K>(owned) {
                Some(set) if set != tier => shared.tiers.current(set),
                _ => policy,
            }
        })?;
        shared.metrics.keys(shared.table.len());
        Ok(node)
    }

    /// The policy for a key that has no state yet: its override (`set_policy`), else the
    /// resolver's choice, else the default. A name the resolver gives that is no policy's
    /// gets the default too.
    fn tier_of<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        if let Some(tier) = self.override_of(key) {
            return tier;
        }
        let resolved = shared.resolver.as_ref().and_then(|resolve| {
            let owned = key.to_owned();
            let name = resolve(&owned)?;
            shared.tiers.index(name)
        });
        resolved.unwrap_or(shared.tiers.default_index())
    }

    /// The policy `set_policy` gave `key`, if any. Called again under the shard's mutex before a state is created: `set_policy` stores the override before it moves
    /// the key's state under that lock, so either the move finds the new state or the
    /// re-check finds the override.
    fn override_of<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shared = &*self.shared;
        if !shared.any_override.load(Ordering::Relaxed) {
            return None;
        }
        shared.overrides.get(key).map(|tier| *tier)
    }

    /// Under the key's shard mutex: moves its state to its policy's current version if that
    /// changed (carrying its counts over as the new version says), or replaces it with a
    /// fresh state if it is expired or retired (retiring it first, for checks still on it).
    fn renew<Q>(&self, hash: u64, key: &Q, now: u64, guard: &Guard)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let tiers = &self.shared.tiers;
        self.shared.table.update(hash, key, guard, now, |node, now| {
            let state = node.state();
            let policy = state.policy();
            let current = tiers.current(policy.tier());
            if policy.is_replaced() {
                return move_state(state, &current, || now.max(self.shared.now.nanos()), current.carry());
            }
            if state.retire(policy, now) || state.is_retired() {
                return Change::Replace(OwnedState::new(&current, now), now);
            }
            Change::Keep
        });
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
        self.decide::<Q, true>(key, cost, |decision, _| decision)
    }

    /// Waits until `cost` units of `key` are admitted, sleeping for each refusal's
    /// `retry_after` (feature `tokio`, on the tokio timer), and returns the admission; or
    /// returns the refusal at once when waiting cannot help (a cost above a limit's `max`, or
    /// the table full at `max_keys`). The same as
    /// [`until_ready_with_jitter`](Self::until_ready_with_jitter) with [`Jitter::NONE`].
    ///
    /// Cancellation-safe: nothing is consumed until the admission itself, which happens
    /// inside one poll, so dropping the future while it sleeps (e.g. in `tokio::select!` or
    /// under a timeout) leaves the key's budget untouched. Waiters are not queued: when
    /// several wait on one key, whoever checks first after the wait takes the room (and
    /// without jitter they all check at the same instant: see
    /// [`until_ready_with_jitter`](Self::until_ready_with_jitter)).
    ///
    /// On a [`ManualClock`] the waits are on that clock, not the tokio timer: a refused
    /// waiter sleeps until [`ManualClock::advance`] or [`ManualClock::set`] moves the clock
    /// past its `retry_after`, then checks again. Nothing else wakes it: if nothing moves
    /// the clock it waits for ever (wrap it in `tokio::time::timeout` in a test).
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
        self.until_ready_with_jitter(key, cost, Jitter::NONE).await
    }

    /// [`until_ready`](Self::until_ready), each wait lengthened by a random extra of up to
    /// `jitter`: waiters refused together (a burst on one key, clients retrying in step)
    /// then check again spread over that span instead of all at the same instant, where
    /// the first few would take the room and the rest go back to sleep together. Each wait
    /// is `retry_after` plus a fresh draw, uniform in `[0, jitter]`; with
    /// [`Jitter::NONE`] it is exactly `until_ready`. On a [`ManualClock`] the extra is
    /// measured on that clock too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), slidegate::ConfigError> {
    /// use std::time::{Duration, Instant};
    /// use slidegate::{Jitter, Limit, Limiter};
    ///
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(20)).build()?;
    /// let jitter = Jitter::up_to(Duration::from_millis(10));
    /// let started = Instant::now();
    /// for _ in 0..21 {
    ///     assert!(limiter.until_ready_with_jitter(&7, 1, jitter).await.is_ok());
    /// }
    /// assert!(started.elapsed() >= Duration::from_millis(40)); // the 21st waited
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn until_ready_with_jitter<Q>(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> Result<Decision, Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            let decision = self.check_n(key, cost);
            let wait = match (decision.is_allowed(), decision.retry_after()) {
                (true, _) => return Ok(decision),
                (false, Some(wait)) => wait.saturating_add(jitter.draw()),
                (false, None) => return Err(decision),
            };
            match &self.shared.manual {
                Some(clock) => {
                    let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                    clock.reached(self.shared.now.nanos().saturating_add(wait)).await;
                }
                None => tokio::time::sleep(wait).await,
            }
        }
    }

    /// [`check_n`](Self::check_n) before the metrics and shadow mode, which `finish` applies
    /// given the key's policy; with `FORCE`, [`record`](Self::record). The hot path: an
    /// existing key takes one hash, one probe and one run of the per-key protocol.
    #[inline(always)]
    fn decide<Q, const FORCE: bool>(
        &self,
        key: &Q,
        cost: u64,
        finish: impl Fn(Decision, &Policy) -> Decision,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let mut now = shared.now.nanos();
        let guard = epoch::pin();
        let hash = shared.table.hash(key);
        loop {
            let Some(node) = shared.table.get(hash, key, &guard) else {
                match self.insert::<Q, FORCE>(hash, key, now, cost, &guard, &finish) {
                    Some(decision) => return decision,
                    None => continue,
                }
            };
            // Not before the shard's last eviction (`table.rs`): a check whose clock read
            // an earlier time and was delayed across it would otherwise decide on a fresh
            // state at that time, without the units the evicted state still counted then.
            now = now.max(shared.table.floor(hash));
            let state = node.state();
            let policy = state.policy();
            if !policy.is_replaced() {
                if let Some(index) = policy.oversized(cost).filter(|_| !FORCE) {
                    // A retired state's policy may no longer be the key's.
                    if !state.is_retired() {
                        return finish(policy.never(index, state.room(policy, now)), policy);
                    }
                } else if let Outcome::Decided(decision) = state.run::<FORCE>(policy, now, cost) {
                    return finish(decision, policy);
                }
            }
            // Its policy has a newer version, or it expired, or it was retired under us.
            self.renew(hash, key, now, &guard);
        }
    }

    /// A check of a key not in the table: the answer when it needs no state (a cost that
    /// never fits, a cost of 0, a full table), else `None` once the key is inserted.
    #[cold]
    fn insert<Q, const FORCE: bool>(
        &self,
        hash: u64,
        key: &Q,
        now: u64,
        cost: u64,
        guard: &Guard,
        finish: &impl Fn(Decision, &Policy) -> Decision,
    ) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Chosen before the shard's mutex: the resolver is the caller's code.
        let tier = self.tier_of(key);
        let policy = self.shared.tiers.current(tier);
        if let Some(index) = policy.oversized(cost).filter(|_| !FORCE) {
            return Some(finish(policy.never(index, policy.fresh(0).remaining()), &policy));
        }
        if cost == 0 {
            return Some(finish(policy.fresh(0), &policy));
        }
        match self.insert_node(hash, key, (tier, Arc::clone(&policy)), now, guard) {
            Ok(_) => None,
            Err(Refused::Full) => Some(finish(Decision::too_many_keys(), &policy)),
        }
    }

    /// Shadow mode applied to a decision under `policy`.
    fn shadowed(&self, decision: Decision, policy: &Policy) -> Decision {
        if self.shared.shadow || policy.shadow() {
            decision.shadowed()
        } else {
            decision
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
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        let mut now = shared.now.nanos();
        let guard = epoch::pin();
        let hash = shared.table.hash(key);
        while let Some(node) = shared.table.get(hash, key, &guard) {
            // As in `decide`.
            now = now.max(shared.table.floor(hash));
            let state = node.state();
            let policy = state.policy();
            if !policy.is_replaced() {
                let decision = match state.check(policy, now, 1, false) {
                    Outcome::Decided(decision) => decision,
                    // Expired, or retired (being replaced or removed): both read as empty.
                    Outcome::Expired | Outcome::Retired => policy.fresh(1),
                };
                return self.shadowed(decision, policy);
            }
            self.renew(hash, key, now, &guard);
        }
        // A new key would be refused while the table is full (until a sweep frees room).
        if shared.table.is_full() {
            return Decision::too_many_keys();
        }
        let policy = shared.tiers.current(self.tier_of(key));
        self.shadowed(policy.fresh(1), &policy)
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
        let shared = &*self.shared;
        let guard = epoch::pin();
        // No time: a reset forgets every unit, whenever it was counted.
        let held = shared.table.update(shared.table.hash(key), key, &guard, 0, |node, _| {
            // Checks still on the state start over on the table.
            let state = node.state();
            state.retire_now(state.policy());
            Change::Remove
        });
        if held {
            shared.metrics.keys(shared.table.len());
        }
        held
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
        self.shared.table.len()
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

    /// The limits of the default policy, in builder order (the index a
    /// [`Denial::Limit`](crate::Denial::Limit) names). See [`policy`](Self::policy) for
    /// any policy's.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit("10/s".parse()?).build()?;
    /// assert_eq!(limiter.limits(), [Limit::per_second(10)]);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn limits(&self) -> Vec<Limit> {
        let tiers = &self.shared.tiers;
        tiers.current(tiers.default_index()).limits().copied().collect()
    }

    /// The current configuration of the policy named `name`, if there is one.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_second(5)]))
    ///     .build()?;
    /// assert_eq!(limiter.policy("free"), Some(PolicyConfig::new([Limit::per_second(5)])));
    /// assert_eq!(limiter.policy("gold"), None);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn policy(&self, name: &str) -> Option<PolicyConfig> {
        let policy = self.shared.tiers.current(self.shared.tiers.index(name)?);
        Some(PolicyConfig { limits: policy.limits().copied().collect(), shadow: policy.shadow() })
    }

    /// The names of the policies, in builder order.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder()
    ///     .limit(Limit::per_second(5))
    ///     .policy("paid", PolicyConfig::new([Limit::per_second(50)]))
    ///     .build()?;
    /// assert_eq!(limiter.policy_names().collect::<Vec<_>>(), ["default", "paid"]);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn policy_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.shared.tiers.names()
    }

    /// The name of the policy a check of `key` applies now: that of its state if it is
    /// held, else the one it would get (its override, the resolver's choice, or the
    /// default).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<String>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_second(5)]))
    ///     .policy("paid", PolicyConfig::new([Limit::per_second(50)]))
    ///     .resolver(|key: &String| key.starts_with("pk_").then_some("paid"))
    ///     .build()?;
    /// assert_eq!(limiter.policy_of("pk_42"), "paid");
    /// assert_eq!(limiter.policy_of("anonymous"), "free"); // the first is the default
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn policy_of<Q>(&self, key: &Q) -> &str
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let tiers = &self.shared.tiers;
        let guard = epoch::pin();
        match self.shared.table.get(self.shared.table.hash(key), key, &guard) {
            Some(node) => tiers.name(node.policy().tier()),
            None => tiers.name(self.tier_of(key)),
        }
    }

    /// Puts `key` under the policy named `name` from now on, whatever the resolver says,
    /// until [`clear_policy`](Self::clear_policy). If the key is held, its state moves to
    /// the policy at once, its counts carried over [conservatively](Carry::Conservative)
    /// (exactly if the two policies differ only in `max`): a key moved to a larger quota
    /// keeps what it used. A check racing the move counts under the old policy or the new
    /// one (a check that read the old version just before the move decides by it), never
    /// in neither. Overrides are kept until cleared (they are not swept), one small map
    /// entry each.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<String>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_minute(10)]))
    ///     .policy("paid", PolicyConfig::new([Limit::per_minute(100)]))
    ///     .build()?;
    /// assert_eq!(limiter.check_n("acme", 10).remaining(), 0);
    /// limiter.set_policy("acme", "paid")?; // upgraded mid-minute: keeps its 10 used
    /// assert_eq!(limiter.check("acme").remaining(), 89);
    /// assert!(limiter.set_policy("acme", "platinum").is_err());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn set_policy<Q>(&self, key: &Q, name: &str) -> Result<(), ConfigError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let tier = self
            .shared
            .tiers
            .index(name)
            .ok_or_else(|| ConfigError::UnknownPolicy { name: name.to_owned() })?;
        self.shared.overrides.insert(key.to_owned(), tier);
        // Relaxed: a key whose state is created while this is not yet visible gets its
        // override from `move_to` below, or from the re-check under the shard lock.
        self.shared.any_override.store(true, Ordering::Relaxed);
        self.move_to(key, tier);
        Ok(())
    }

    /// Removes `key`'s override: it goes back to the resolver's choice or the default (its
    /// state, if held, moves at once, as in [`set_policy`](Self::set_policy)). Returns
    /// whether it had one.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_minute(10)]))
    ///     .policy("banned", PolicyConfig::new([Limit::per_hour(1)]))
    ///     .build()?;
    /// limiter.set_policy(&7, "banned")?;
    /// assert_eq!(limiter.policy_of(&7), "banned");
    /// assert!(limiter.clear_policy(&7));
    /// assert_eq!(limiter.policy_of(&7), "free");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn clear_policy<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.shared.overrides.remove(key).is_none() {
            return false;
        }
        self.move_to(key, self.tier_of(key));
        true
    }

    /// Moves a held key's state to policy `tier` (under its shard's mutex).
    fn move_to<Q>(&self, key: &Q, tier: usize)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shared = &*self.shared;
        let now = shared.now.nanos();
        let policy = shared.tiers.current(tier);
        let guard = epoch::pin();
        shared.table.update(shared.table.hash(key), key, &guard, now, |node, now| {
            let state = node.state();
            if std::ptr::eq(state.policy(), &*policy) {
                return Change::Keep;
            }
            move_state(state, &policy, || now.max(shared.now.nanos()), Carry::Conservative)
        });
    }

    /// Replaces the limits (and shadow mode) of the policy named `name` while traffic
    /// flows. Checks take no lock for it: the new version is published with one atomic
    /// swap, and each key moves to it at its next check. What happens to the counts
    /// already recorded:
    ///
    /// * only `max` changed (same windows, precisions and accuracy, in the same order):
    ///   every count carries over exactly, whatever `carry` says; the new `max` applies to
    ///   checks from the change on. (With [`Algorithm::Gcra`] the units used carry over,
    ///   rounded up.)
    /// * a window, a precision or the number of limits changed: per `carry`, either
    ///   [`Carry::Conservative`] (each new limit starts with what the key is known to have
    ///   used, so no key can burst because of the change) or [`Carry::Reset`].
    ///
    /// A check racing the change is counted under the old version or the new one, never
    /// lost; at worst (a check committing while its key moves) it is counted in both,
    /// which errs towards refusing. Units carried over are not capped at the new `max`: a
    /// key over a lowered limit stays refused until they age out, and a later raise still
    /// sees them. The policy's name and the limiter's algorithm stay; an invalid
    /// configuration is an error (the error itself, not wrapped in
    /// [`ConfigError::InPolicy`]: the caller named the policy) and changes nothing.
    ///
    /// ```
    /// use slidegate::{Carry, Limit, Limiter, PolicyConfig};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_minute(10)).build()?;
    /// assert_eq!(limiter.check_n(&1, 10).remaining(), 0);
    /// // Incident over: raise the limit, counts carry over exactly.
    /// limiter.update_policy("default", PolicyConfig::new([Limit::per_minute(15)]), Carry::Reset)?;
    /// assert_eq!(limiter.check(&1).remaining(), 4);
    /// // A new window: what the key used is carried over, conservatively.
    /// limiter.update_policy("default", PolicyConfig::new([Limit::per_second(20)]), Carry::Conservative)?;
    /// assert_eq!(limiter.check(&1).remaining(), 8);
    /// assert!(limiter.update_policy("default", PolicyConfig::new([]), Carry::Reset).is_err());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn update_policy(&self, name: &str, config: PolicyConfig, carry: Carry) -> Result<(), ConfigError> {
        let shared = &*self.shared;
        let tier =
            shared.tiers.index(name).ok_or_else(|| ConfigError::UnknownPolicy { name: name.to_owned() })?;
        shared.tiers.replace(tier, &config, carry, &shared.metrics)
    }

    /// Heap bytes one key's counters take (the map entry and allocator overhead come on
    /// top; see the performance guide's memory table).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// // `touched`, the current slot, and one ring word holding both ring slots' 8-bit counts.
    /// assert_eq!(limiter.state_bytes_per_key(), 8 * 3);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn state_bytes_per_key(&self) -> usize {
        let tiers = &self.shared.tiers;
        tiers.current(tiers.default_index()).words_per_key().saturating_mul(8)
    }

    /// The table shard `key` lives in: for the loom models, which need keys that share a
    /// shard (to make an insert rebuild the array a check is reading). Not public API.
    #[cfg(slidegate_loom)]
    #[doc(hidden)]
    pub fn shard_of<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        Table::<K>::shard_index(self.shared.table.hash(key))
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

    /// The most keys the limiter holds at once ([`LimiterBuilder::max_keys`]), or `None` if
    /// it was built without a bound.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let bounded = Limiter::<u64>::builder().limit(Limit::per_second(1)).max_keys(1000).build()?;
    /// assert_eq!(bounded.max_keys(), Some(1000));
    /// let unbounded = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
    /// assert_eq!(unbounded.max_keys(), None);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> Option<usize> {
        Some(self.shared.table.max_keys()).filter(|&most| most != usize::MAX)
    }

    /// [`check_n`](Self::check_n), also showing `seen` the policy version that decided (the
    /// tower layer's headers describe it).
    #[inline(always)]
    pub(crate) fn check_n_seen<Q>(&self, key: &Q, cost: u64, seen: impl Fn(&Policy)) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        self.decide::<Q, false>(key, cost, |decision, policy| {
            seen(policy);
            let shadow = shared.shadow || policy.shadow();
            policy.metrics().decided(&decision, cost, shadow);
            if shadow {
                return decision.shadowed();
            }
            decision
        })
    }

    /// The name of policy `tier` (a policy version's `tier()`).
    #[cfg(feature = "tower")]
    pub(crate) fn tier_name(&self, tier: usize) -> &str {
        self.shared.tiers.name(tier)
    }

    /// How many named policies the limiter has.
    #[cfg(feature = "tower")]
    pub(crate) fn tier_count(&self) -> usize {
        self.shared.tiers.names().count()
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
        self.shared.algorithm
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
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(2)).build()?;
    /// assert_eq!(limiter.check_all(&[&1, &2], 1)?.decision().remaining(), 1);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The index of the key the decision is about: the one with the least room when
    /// admitted, the one that frees up last when refused.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(2)).build()?;
    /// let _ = limiter.check(&2);
    /// assert_eq!(limiter.check_all(&[&1, &2], 1)?.key(), 1); // key 2 has the least room
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
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

/// The change that moves `state` to policy `newer`: the node is pointed at it when the
/// layout is the same (every count carries over exactly, and checks on the node see the new
/// version at their next look), else replaced by a state laid out anew, per `carry`, at the
/// time `clock` reads once the old state's words are read ([`KeyState::migrate_at`]: not the
/// moving check's own reading, which may be long past).
fn move_state(state: KeyState<'_>, newer: &Arc<Policy>, clock: impl FnOnce() -> u64, carry: Carry) -> Change {
    if state.policy().same_layout(newer) {
        Change::Repoint(Arc::clone(newer))
    } else {
        let (moved, at) = state.migrate_at(newer, clock, carry);
        Change::Replace(moved, at)
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Sweep for Shared<K> {
    fn sweep(&self) -> usize {
        Shared::sweep(self)
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Shared<K> {
    /// Frees what the held states own beyond their words (sliding logs), as the limiter
    /// goes away.
    fn release_all(&mut self) {
        if self.algorithm == Algorithm::SlidingLog {
            self.table.for_each_exclusive(|node| {
                let state = node.state();
                state.retire_now(state.policy());
            });
        }
    }

    fn sweep(&self) -> usize {
        let now = self.now.nanos();
        let expiry = self.tiers.shortest_expiry();
        let mut evicted = 0usize;
        // Shard by shard, under each shard's mutex: checks never wait for it (they take no
        // lock); inserts into the shard being swept do, for as long as one shard's walk.
        // `retire` re-checks expiry on the state itself and, by its CAS, wins or loses
        // against any check still counting into it.
        for shard in 0..self.table.shards() {
            let here = self.table.sweep_shard(shard, now, |node| {
                let state = node.state();
                // A cheap first filter: most keys are recent.
                if now.saturating_sub(state.touched()) < expiry {
                    return Change::Keep;
                }
                if state.retire(state.policy(), now) {
                    Change::Remove
                } else {
                    Change::Keep
                }
            });
            evicted = evicted.saturating_add(here);
        }
        if evicted > 0 {
            Table::<K>::settle();
        }
        self.metrics.keys(self.table.len());
        self.metrics.evicted(evicted);
        evicted
    }
}

impl<K> fmt::Debug for Limiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.shared.name)
            .field("policies", &self.shared.tiers.names().collect::<Vec<_>>())
            .field("keys", &self.shared.table.len())
            .field("max_keys", &self.shared.table.max_keys())
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
    policies: Vec<(String, PolicyConfig)>,
    default_policy: Option<String>,
    resolver: Option<Resolver<K>>,
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
            .field("policies", &self.policies)
            .field("default_policy", &self.default_policy)
            .field("resolver", &self.resolver.is_some())
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
    /// name that is no policy's, gives the default. To change one key's policy at
    /// runtime, use [`Limiter::set_policy`].
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
    /// check reads (at least 50 µs). Default 1 ms. Ignored with a [`ManualClock`].
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
        let (now, ticker) = match &self.clock {
            Some(clock) => (clock.source(), None),
            None => {
                let tick = self.tick.max(Duration::from_micros(50));
                let (now, lease) = real_clock(tick).map_err(spawn_error("clock"))?;
                (now, Some(lease))
            }
        };
        let shared = Arc::new(Shared {
            table: Table::new(self.max_keys.unwrap_or(usize::MAX)),
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

/// A bound on the random extra wait of
/// [`Limiter::until_ready_with_jitter`] (feature `tokio`): each wait is the refusal's
/// `retry_after` plus a fresh draw, uniform in `[0, max]`, so that waiters refused together
/// do not all check again at the same instant.
///
/// The draws come from the standard library's randomly keyed SipHash (a new
/// `RandomState` per draw, hashing the current instant): no extra dependency, no
/// allocation, good enough to spread wake-ups (not meant for anything secret).
///
/// ```
/// use std::time::Duration;
/// use slidegate::Jitter;
///
/// let jitter = Jitter::up_to(Duration::from_millis(50));
/// assert_eq!(jitter.max(), Duration::from_millis(50));
/// assert_eq!(Jitter::default(), Jitter::NONE);
/// assert!(Jitter::NONE.max().is_zero());
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Jitter {
    max: Duration,
}

#[cfg(feature = "tokio")]
impl Jitter {
    /// No extra wait: [`Limiter::until_ready`].
    ///
    /// ```
    /// assert!(slidegate::Jitter::NONE.max().is_zero());
    /// ```
    pub const NONE: Jitter = Jitter { max: Duration::ZERO };

    /// Extra waits uniform in `[0, max]`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let jitter = slidegate::Jitter::up_to(Duration::from_secs(1));
    /// assert_eq!(jitter.max(), Duration::from_secs(1));
    /// ```
    pub const fn up_to(max: Duration) -> Jitter {
        Jitter { max }
    }

    /// The longest extra wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(slidegate::Jitter::up_to(Duration::from_millis(7)).max(), Duration::from_millis(7));
    /// ```
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// One extra wait, uniform in `[0, max]` (to the nanosecond; a `max` above 2⁶⁴ ns,
    /// some 584 years, counts as 2⁶⁴ - 1 ns).
    fn draw(self) -> Duration {
        use std::hash::BuildHasher;
        let max = u64::try_from(self.max.as_nanos()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        // Each `RandomState` has keys of its own (the thread's random keys, the first one
        // incremented per `new`): successive draws are independent SipHash outputs.
        let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
        let extra = match max.checked_add(1) {
            Some(span) => random.checked_rem(span).unwrap_or(0),
            None => random,
        };
        Duration::from_nanos(extra)
    }
}
