//! What a limiter was built with (its name, algorithm, `max_keys`, the bytes a key takes),
//! and policy administration: the limits and policies it has, the policy of a key, a
//! key's override ([`Limiter::set_policy`], [`Limiter::clear_policy`]), the replacement of a
//! policy while traffic flows ([`Limiter::update_policy`]), and `move_state`, the change
//! that moves a key's state to another policy (for those, and for `renew`).

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::grace;

use super::Limiter;
use crate::algorithm::Algorithm;
use crate::decision::{Decision, Denial};
use crate::error::ConfigError;
use crate::layout::{Carry, Policy};
use crate::limit::Limit;
use crate::policy::PolicyConfig;
use crate::protocol::KeyState;
use crate::table::Change;

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The limiter's name (see [`LimiterBuilder::name`]).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// assert_eq!(limiter.name(), "slidegate");
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    ///
    /// [`LimiterBuilder::name`]: super::LimiterBuilder::name
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
        self.shared.algorithm
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
    ///
    /// [`LimiterBuilder::max_keys`]: super::LimiterBuilder::max_keys
    pub fn max_keys(&self) -> Option<usize> {
        Some(self.shared.table.max_keys()).filter(|&most| most != usize::MAX)
    }

    /// Heap bytes one key's counters take (the map entry and allocator overhead come on
    /// top; see the performance guide's memory table).
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
    /// // `touched`, and one word holding the current and the previous slot's counts.
    /// assert_eq!(limiter.state_bytes_per_key(), 8 * 2);
    /// // `touched`, `cur`, `sum`, sixty-one 6-bit slot counts eight to a word, and the
    /// // latest slot a rollback lowered.
    /// let minute = Limiter::<u64>::builder().limit(Limit::per_minute(60)).build()?;
    /// assert_eq!(minute.state_bytes_per_key(), 8 * (3 + 8 + 1));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn state_bytes_per_key(&self) -> usize {
        let tiers = &self.shared.tiers;
        tiers.current(tiers.default_index()).words_per_key().saturating_mul(8)
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
    /// use std::collections::HashSet;
    /// use slidegate::{Limit, Limiter, PolicyConfig};
    /// // The tier comes from the gateway's records of the key, never from its text.
    /// let paid: HashSet<String> = ["k-42".to_owned()].into();
    /// let limiter = Limiter::<String>::builder()
    ///     .policy("free", PolicyConfig::new([Limit::per_second(5)]))
    ///     .policy("paid", PolicyConfig::new([Limit::per_second(50)]))
    ///     .resolver(move |key: &String| paid.contains(key).then_some("paid"))
    ///     .build()?;
    /// assert_eq!(limiter.policy_of("k-42"), "paid");
    /// assert_eq!(limiter.policy_of("anonymous"), "free"); // the first is the default
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn policy_of<Q>(&self, key: &Q) -> &str
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let tiers = &self.shared.tiers;
        let guard = grace::pin();
        match self.shared.table.get(self.shared.table.hash(key), key, &guard) {
            Some(node) => tiers.name(node.policy().tier()),
            None => tiers.name(self.tier_of(key)),
        }
    }

    /// The limit `decision` (a check of `key`) is about: its
    /// [`tightest_limit`](Decision::tightest_limit), the refusing limit of a refusal,
    /// in the policy a check of `key` applies now (as [`policy_of`](Self::policy_of)). `None`
    /// for a decision about no limit ([`Denial::TooManyKeys`](crate::Denial::TooManyKeys)).
    /// Allocates nothing, for a log line or a header on every refusal.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).limit(Limit::per_minute(1)).build()?;
    /// let _ = limiter.check(&7);
    /// let refused = limiter.check(&7);
    /// assert_eq!(limiter.limit_of(&7, &refused), Some(Limit::per_minute(1)));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn limit_of<Q>(&self, key: &Q, decision: &Decision) -> Option<Limit>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if decision.denial() == Some(Denial::TooManyKeys) {
            return None;
        }
        let index = decision.tightest_limit();
        let guard = grace::pin();
        match self.shared.table.get(self.shared.table.hash(key), key, &guard) {
            Some(node) => node.policy().limits().nth(index).copied(),
            None => self.shared.tiers.current(self.tier_of(key)).limits().nth(index).copied(),
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
        let guard = grace::pin();
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
}

/// The change that moves `state` to policy `newer`: the node is pointed at it when the
/// layout is the same (every count carries over exactly, and checks on the node see the new
/// version at their next look), else replaced by a state laid out anew, per `carry`, at the
/// time `clock` reads once the old state's words are read ([`KeyState::migrate_at`]: not the
/// moving check's own reading, which may be long past).
pub(super) fn move_state(
    state: KeyState<'_>,
    newer: &Arc<Policy>,
    clock: impl FnOnce() -> u64,
    carry: Carry,
) -> Change {
    if state.policy().same_layout(newer) {
        Change::Repoint(Arc::clone(newer))
    } else {
        let (moved, at) = state.migrate_at(newer, clock, carry);
        Change::Replace(moved, at)
    }
}
