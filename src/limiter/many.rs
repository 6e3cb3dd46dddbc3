//! [`Limiter::check_all`]: one request charged to several keys (its user, its API key, its
//! IP) at once, with [`Identities`], its decision and the key it is about. The keys are
//! looked up one at a time (`node_of`: inserted or renewed as needed), then checked together
//! by the per-key protocol (`KeyState::check_many`, `protocol/many.rs`); keys under a shadow
//! policy are checked after the others (`shadow_check`).

use std::borrow::Borrow;
use std::hash::Hash;

use crate::grace::{self, Guard};

use super::Limiter;
use crate::decision::Decision;
use crate::error::IdentitiesError;
use crate::layout::Policy;
use crate::metrics::PolicyMetrics;
use crate::protocol::{KeyState, Outcome, MAX_IDENTITIES};
use crate::table::{Node, Refused};

/// How many times [`Limiter::check_all`] looks its keys up again after finding one of
/// their states retired, before it answers that they do not fit. A retirement by a sweep
/// or a policy change sends a request round once or twice; a table that evicts the
/// request's own keys to insert its others would send it round for ever.
const LOOKUP_ROUNDS: usize = 64;

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Checks one request against several keys at once (its user, its API key, its IP: at
    /// most [`MAX_IDENTITIES`](crate::MAX_IDENTITIES)): admitted only if every key has room
    /// in every limit of its policy, and then counted against all of them; a refusal counts
    /// against none. Exact under contention like a single key, and lock-free on the states
    /// (the keys are looked up one at a time, so no order of keys can deadlock). The
    /// decision is about [`key`](Identities::key): the key with the least room when
    /// admitted, the one that frees up last when refused. Keys checked together are
    /// inserted before the check (a refused request can leave an empty state, swept like
    /// any idle key); a key listed twice counts once. No key, or more than
    /// `MAX_IDENTITIES`, is an [`IdentitiesError`](crate::IdentitiesError).
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all<Q>(&self, keys: &[&Q], cost: u64) -> Result<Identities, IdentitiesError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if keys.is_empty() {
            return Err(IdentitiesError::NoKeys);
        }
        if keys.len() > MAX_IDENTITIES {
            return Err(IdentitiesError::TooManyKeys { given: keys.len(), most: MAX_IDENTITIES });
        }
        let shared = &*self.shared;
        let mut now = shared.now.nanos();
        let decided = |decision: Decision, key: usize, metrics: &PolicyMetrics| {
            metrics.decided(&decision, cost, shared.shadow);
            let decision = if shared.shadow { decision.shadowed() } else { decision };
            Ok(Identities { decision, key })
        };
        if cost == 0 {
            let peeks = keys.iter().map(|k| self.decide::<Q, false>(k, 0, |d, _| d)).enumerate();
            let fresh = || shared.tiers.current(shared.tiers.default_index()).fresh(0);
            let (key, decision) = peeks.min_by_key(|(_, d)| d.remaining()).unwrap_or_else(|| (0, fresh()));
            return Ok(Identities { decision, key });
        }
        let guard = grace::pin();
        let mut rounds = 0usize;
        'lookup: loop {
            rounds = rounds.saturating_add(1);
            if rounds > LOOKUP_ROUNDS {
                // The keys keep losing their states to one another: a full table under
                // `WhenFull::EvictLeastRecent` that cannot hold them all at once (each
                // insert evicts a key the request just inserted). They do not fit.
                let policy = shared
                    .tiers
                    .current(keys.first().map_or(shared.tiers.default_index(), |k| self.tier_of(*k)));
                return decided(Decision::too_many_keys(), 0, policy.metrics());
            }
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
                    self.refused_of(keys, key_of(s), cost, now);
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
                if !decision.is_allowed() {
                    self.refused_of(keys, key_of(s), cost, now);
                }
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

    /// A refusal of `check_all` by `keys[key]`, for [`top_refused`](Self::top_refused).
    fn refused_of<Q>(&self, keys: &[&Q], key: usize, cost: u64, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(key) = keys.get(key) {
            self.refused(self.shared.table.hash(*key), *key, cost, now);
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
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
