//! [`Limiter`]: the keyed front end. A [`Table`] (sharded, lock-free reads, see `table/`)
//! holds each key's counters; the builder wires up the clock and the sweeper.
//!
//! # The path of a check
//! [`Limiter::check_n`] → `decide`: pin (`grace.rs`), hash the key once, find its node, and
//! run the per-key protocol (`protocol/`) on its counters under the node's policy, at the
//! clock's time or the shard's floor if that is later (`table/mod.rs`: a check delayed across
//! an eviction decides no earlier than the eviction). Only when that cannot answer does it
//! take the shard's mutex: the key is new (`insert`), its state expired or was retired
//! (`renew` replaces it), or its policy has a newer version (`renew` moves it). Everything
//! else a limiter does (several keys at once, peeks, resets, policy changes, sweeps) goes
//! through the same lookup and the same `renew`.
//!
//! # Files
//! * `mod.rs` (this file): the [`Limiter`] and the `Shared` state its sweeps run on; the
//!   front end for one key (`check`, `check_n`, `record`, `peek`, `reset`) and, in reading
//!   order, its hot path (`check_n` → `check_n_seen` → `decide`, and when the state cannot
//!   answer, `insert` or `renew`); sweeping and the number of keys held.
//! * `many.rs`: [`Limiter::check_all`], one request charged to several keys, and its
//!   answer, [`Identities`].
//! * `admin.rs`: the configuration read back (name, algorithm, `max_keys`, limits), and
//!   policy administration: reading the policies, a key's override
//!   (`set_policy`, `clear_policy`), replacing a policy while traffic flows
//!   (`update_policy`), and the move of a key's state to another policy (`move_state`).
//! * `builder.rs`: [`LimiterBuilder`], from [`Limiter::builder`] to `build`.
//! * `ready.rs` (feature `tokio`): `until_ready`, `until_ready_with_jitter` and `Jitter`.

mod admin;
mod builder;
mod many;
#[cfg(feature = "serde")]
mod persist;
#[cfg(feature = "tokio")]
mod ready;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::grace::{self, Guard};
use dashmap::DashMap;

use crate::algorithm::Algorithm;
#[cfg(feature = "tokio")]
use crate::clock::ManualClock;
use crate::clock::{ClockLease, Now};
use crate::decision::Decision;
use crate::housekeeper::{Registration, Sweep};
use crate::layout::Policy;
use crate::metrics::Metrics;
use crate::offenders::Offenders;
use crate::policy::Tiers;
use crate::protocol::{Outcome, OwnedState};
use crate::table::{Change, Freed, Hooks, Node, Refused, Table};

use admin::move_state;
pub use builder::LimiterBuilder;
pub use many::Identities;
#[cfg(feature = "serde")]
pub(crate) use persist::Merged;
#[cfg(feature = "tokio")]
pub use ready::Jitter;

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
    /// The keys refused the most (`LimiterBuilder::track_refused`), if tracked: behind one
    /// pointer, so that the fields a check reads keep their places.
    tracked: Option<Box<Tracked<K>>>,
    /// The manual clock, if the limiter runs on one: `until_ready` waits for it.
    #[cfg(feature = "tokio")]
    manual: Option<ManualClock>,
}

/// [`Limiter::top_refused`]'s summary, and the labels the last
/// [`Limiter::export_top_refused`] set.
struct Tracked<K> {
    offenders: Offenders<K>,
    exported: std::sync::Mutex<Vec<String>>,
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

    /// [`check_n`](Self::check_n), also showing `seen` the policy version that decided, if
    /// it enforces its decision (the tower layer's headers describe it: a shadow policy's
    /// quota binds no one, so a client is told nothing of it).
    #[inline(always)]
    pub(crate) fn check_n_seen<Q>(&self, key: &Q, cost: u64, seen: impl Fn(&Policy)) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shared = &*self.shared;
        self.decide::<Q, false>(key, cost, |decision, policy| {
            let shadow = shared.shadow || policy.shadow();
            if !shadow {
                seen(policy);
            }
            policy.metrics().decided(&decision, cost, shadow);
            if shadow {
                return decision.shadowed();
            }
            decision
        })
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
        let guard = grace::pin();
        let hash = shared.table.hash(key);
        loop {
            let Some(node) = shared.table.get(hash, key, &guard) else {
                match self.insert::<Q, FORCE>(hash, key, now, cost, &guard, &finish) {
                    Some(decision) => return decision,
                    None => continue,
                }
            };
            // Not before the shard's last eviction (`table/mod.rs`): a check whose clock read
            // an earlier time and was delayed across it would otherwise decide on a fresh
            // state at that time, without the units the evicted state still counted then.
            now = now.max(shared.table.floor(hash));
            let state = node.state();
            let policy = state.policy();
            if !policy.is_replaced() {
                if let Some(index) = policy.oversized(cost).filter(|_| !FORCE) {
                    // A retired state's policy may no longer be the key's.
                    if !state.is_retired() {
                        self.refused(hash, key, cost, now);
                        return finish(policy.never(index, state.room(policy, now)), policy);
                    }
                } else if let Outcome::Decided(decision) = state.run::<FORCE>(policy, now, cost) {
                    if !FORCE && !decision.is_allowed() {
                        self.refused(hash, key, cost, now);
                    }
                    return finish(decision, policy);
                }
            }
            // Its policy has a newer version, or it expired, or it was retired under us.
            self.renew(hash, key, now, &guard);
        }
    }

    /// A refusal of `cost` for `key` (its hash `hash`), for [`top_refused`](Self::top_refused):
    /// one load and a branch when refusals are not tracked (the default), on the path of a
    /// key under attack.
    #[inline(always)]
    pub(super) fn refused<Q>(&self, hash: u64, key: &Q, cost: u64, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(tracked) = &self.shared.tracked {
            Self::track(tracked, hash, key, cost, now);
        }
    }

    /// [`refused`](Self::refused)'s recording, out of the check's code.
    #[cold]
    #[inline(never)]
    fn track<Q>(tracked: &Tracked<K>, hash: u64, key: &Q, cost: u64, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        tracked.offenders.refused(hash, key, cost, now);
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
            self.refused(hash, key, cost, now);
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
        let node = shared.table.insert(
            hash,
            key,
            now,
            guard,
            |owned| {
                // `set_policy` stores the override before it moves the key's state under
                // this mutex: either the move finds this state or this finds the override.
                match self.override_of::<K>(owned) {
                    Some(set) if set != tier => shared.tiers.current(set),
                    _ => policy,
                }
            },
            Hooks {
                // A key that gave its place is an eviction, as a sweep's.
                on_freed: |freed| match freed {
                    Freed::Idle => shared.metrics.evicted(1),
                    Freed::Evicted => shared.metrics.evicted_live(),
                },
                init: |_: &Arc<Policy>, _: u64, _: &mut [u64]| false,
                check: true,
            },
        )?;
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
            let index = shared.tiers.index(name);
            if index.is_none() {
                // The default then: refusing the key for a name the code got wrong would
                // turn a bug into an outage. The metric shows it.
                shared.metrics.unknown_policy();
            }
            index
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

    /// Would a request of cost 1 be admitted now? Consumes nothing and inserts no key;
    /// `remaining()` is what it would be if the request were admitted. For a key not held
    /// while the table is at `max_keys`, the answer is
    /// [`Denial::TooManyKeys`](crate::Denial::TooManyKeys) unless a held key may make
    /// room for it ([`WhenFull`](crate::WhenFull)), which a peek judges from the table's
    /// hints without looking at keys: a check may still be refused where the peek was not.
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
        let guard = grace::pin();
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
        // A new key in a full table is refused unless a held key can make room (as far as
        // the table's hints tell: a peek takes no lock and writes nothing).
        if shared.table.is_full() && !shared.table.may_make_room(now) {
            return Decision::too_many_keys();
        }
        let policy = shared.tiers.current(self.tier_of(key));
        self.shadowed(policy.fresh(1), &policy)
    }

    /// Shadow mode applied to a decision under `policy`.
    fn shadowed(&self, decision: Decision, policy: &Policy) -> Decision {
        if self.shared.shadow || policy.shadow() {
            decision.shadowed()
        } else {
            decision
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
        let shared = &*self.shared;
        let guard = grace::pin();
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

    /// The keys refused the most units over the recent past, most first, at most `n`: the
    /// operator's answer to "who is being limited right now?". Empty unless the limiter was
    /// built with [`LimiterBuilder::track_refused`]. Counts halve every longest window (of
    /// the policies at build), so a key refused a minute ago weighs more than one refused an
    /// hour ago. Each count is at least the key's decayed refused units and at most that
    /// plus `N / m` (`N` all refused units, decayed alike; `m` the capacity): the list is
    /// exact and in order wherever neighbouring counts differ by more than that, and exact
    /// outright while fewer keys than `m` are refused. Locks one stripe of the summary at a
    /// time; refusals go on meanwhile.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u32>::builder().limit(Limit::per_second(2)).track_refused(64).build()?;
    /// for client in [7, 7, 7, 7, 7, 9, 9, 9, 1] {
    ///     let _ = limiter.check(&client);
    /// }
    /// assert_eq!(limiter.top_refused(5), [(7, 3), (9, 1)]);
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn top_refused(&self, n: usize) -> Vec<(K, u64)> {
        match &self.shared.tracked {
            Some(tracked) => tracked.offenders.top(n, self.shared.now.nanos()),
            None => Vec::new(),
        }
    }

    /// Heap bytes the [`top_refused`](Self::top_refused) summary holds (its arrays, not
    /// what its keys own): for the measuring tools. Not public API.
    #[doc(hidden)]
    pub fn top_refused_bytes(&self) -> usize {
        self.shared.tracked.as_ref().map_or(0, |tracked| tracked.offenders.bytes())
    }

    /// Exports [`top_refused`](Self::top_refused)`(n)` through the `metrics` facade (feature
    /// `metrics`; without it, does nothing): the gauge
    /// [`TOP_REFUSED_UNITS`](crate::metrics::TOP_REFUSED_UNITS) with the key as a label,
    /// written by `label`. Call it on a timer (every few seconds): each call sets the keys
    /// listed and sets those the previous call listed, and this one does not, to 0, so at
    /// most `n` series are above 0 at a time (see the gauge's docs on series kept over
    /// time). Keys are client input: `label` should write them so that a hostile key cannot
    /// inflate the series (cut long keys; `n` bounds how many there are).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(1)).track_refused(64).build()?;
    /// let _ = (limiter.check("a"), limiter.check("a"));
    /// limiter.export_top_refused(10, |key| key.chars().take(64).collect());
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn export_top_refused(&self, n: usize, label: impl Fn(&K) -> String) {
        let listed = self.top_refused(n).into_iter().map(|(key, units)| (label(&key), units)).collect();
        let Some(tracked) = &self.shared.tracked else { return };
        let mut previous = tracked.exported.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.shared.metrics.top_refused(listed, &mut previous);
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

    /// The time on the limiter's clock (ns since its origin).
    #[cfg(feature = "serde")]
    pub(crate) fn clock_nanos(&self) -> u64 {
        self.shared.now.nanos()
    }

    /// The table shard `key` lives in: for the loom models and tests, which need keys that
    /// share a shard (to make an insert rebuild the array a check is reading, or a shard's
    /// array sparse). Not public API.
    #[doc(hidden)]
    pub fn shard_of<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        Table::<K>::shard_index(self.shared.table.hash(key))
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
