//! Named policies (tiers): a limiter holds several, each key is checked against one. Every
//! policy's current version sits behind an `ArcSwap`, loaded only when a key's state is
//! created or moved; a check uses the version its state holds (see `window::KeyState`), so
//! replacing a policy takes no lock on the check path: the old version is marked
//! `replaced`, and each state moves to the new one at its next check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::algorithm::Algorithm;
use crate::error::ConfigError;
use crate::layout::{ring_entry_bits, Carry, Policy, MAX_LIMITS, NARROWEST};
use crate::limit::Limit;
use crate::metrics::Metrics;

/// The name of the policy that [`LimiterBuilder::limit`](crate::LimiterBuilder::limit)
/// adds to.
///
/// ```
/// use slidegate::{Limit, Limiter, DEFAULT_POLICY};
/// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(1)).build()?;
/// assert_eq!(limiter.policy_of(&7), DEFAULT_POLICY);
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
pub const DEFAULT_POLICY: &str = "default";

/// One named policy's configuration: its limits, and whether it runs in shadow mode.
/// With feature `serde` it loads from a gateway's configuration (limits in their string
/// form; `shadow` may be left out).
///
/// ```
/// use slidegate::{Limit, PolicyConfig};
/// let free = PolicyConfig::new(["10/s".parse()?, "1000/h@1min".parse()?]);
/// let trial = PolicyConfig::new([Limit::per_second(5)]).shadow(true);
/// assert_eq!(free.limits.len(), 2);
/// assert!(trial.shadow);
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct PolicyConfig {
    /// Every limit applies to every request of a key with this policy.
    pub limits: Vec<Limit>,
    /// Shadow mode for this policy alone: its refusals are reported (and counted in metrics)
    /// but admitted, and consume nothing. See [`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow).
    #[cfg_attr(feature = "serde", serde(default))]
    pub shadow: bool,
}

impl PolicyConfig {
    /// A policy of these limits, enforced.
    ///
    /// ```
    /// use slidegate::{Limit, PolicyConfig};
    /// let paid = PolicyConfig::new([Limit::per_second(100), Limit::per_minute(3000)]);
    /// assert!(!paid.shadow);
    /// ```
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> PolicyConfig {
        PolicyConfig { limits: limits.into_iter().collect(), shadow: false }
    }

    /// Sets shadow mode.
    ///
    /// ```
    /// use slidegate::{Limit, PolicyConfig};
    /// assert!(PolicyConfig::new([Limit::per_second(1)]).shadow(true).shadow);
    /// ```
    #[must_use]
    pub fn shadow(mut self, on: bool) -> PolicyConfig {
        self.shadow = on;
        self
    }
}

struct Tier {
    name: String,
    current: ArcSwap<Policy>,
}

/// A limiter's named policies.
pub(crate) struct Tiers {
    tiers: Box<[Tier]>,
    default: usize,
    algorithm: Algorithm,
    /// The shortest expiry of any version ever published: the sweeper's first filter.
    shortest_expiry: AtomicU64,
    /// How wide every policy's ring entries are, per limit position (in bits): wide enough for the largest `max` any policy has had there. Only
    /// ever widens, and every current version uses it, so that moving a key between
    /// policies, or to a new version, never narrows its entries (which could saturate a
    /// count and make the move inexact). Held while a version is published.
    widest: Mutex<[u32; MAX_LIMITS]>,
}

impl Tiers {
    /// Compiles every policy; `default` names the one for keys nothing else chooses for
    /// (`None`: [`DEFAULT_POLICY`] if present, else the first).
    pub(crate) fn new(
        configs: Vec<(String, PolicyConfig)>,
        default: Option<&str>,
        algorithm: Algorithm,
        metrics: &Metrics,
    ) -> Result<Tiers, ConfigError> {
        let mut widest = [NARROWEST; MAX_LIMITS];
        for (_, config) in &configs {
            widen(&mut widest, &config.limits);
        }
        let mut tiers = Vec::with_capacity(configs.len());
        for (tier, (name, config)) in configs.into_iter().enumerate() {
            if tiers.iter().any(|t: &Tier| t.name == name) {
                return Err(ConfigError::DuplicatePolicy { name });
            }
            let policy = compile(&name, tier, &config, algorithm, Carry::default(), metrics, &widest)
                .map_err(|error| {
                    // The unnamed policy of `.limit()` reports its errors as they are.
                    if name == DEFAULT_POLICY {
                        error
                    } else {
                        ConfigError::InPolicy { name: name.clone(), error: Box::new(error) }
                    }
                })?;
            tiers.push(Tier { name, current: ArcSwap::from_pointee(policy) });
        }
        if tiers.is_empty() {
            return Err(ConfigError::NoLimits);
        }
        let find = |name: &str| tiers.iter().position(|t| t.name == name);
        let default = match default {
            Some(name) => find(name).ok_or_else(|| ConfigError::UnknownPolicy { name: name.to_owned() })?,
            None => find(DEFAULT_POLICY).unwrap_or(0),
        };
        let shortest = tiers.iter().map(|t| t.current.load().expiry()).min().unwrap_or(0);
        Ok(Tiers {
            tiers: tiers.into_boxed_slice(),
            default,
            algorithm,
            shortest_expiry: AtomicU64::new(shortest),
            widest: Mutex::new(widest),
        })
    }

    /// No key whose last admission is more recent than this (ns) can be expired, whatever
    /// version of whichever policy it is under.
    pub(crate) fn shortest_expiry(&self) -> u64 {
        // Relaxed: a hint for the sweeper's scan; `retire` decides with the state's own.
        self.shortest_expiry.load(Ordering::Relaxed)
    }

    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.tiers.iter().position(|t| t.name == name)
    }

    pub(crate) fn default_index(&self) -> usize {
        self.default
    }

    /// Policy `tier`'s name (`tier` from [`index`](Self::index) or a policy's `tier()`).
    pub(crate) fn name(&self, tier: usize) -> &str {
        self.tiers.get(tier).map_or(DEFAULT_POLICY, |t| t.name.as_str())
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.tiers.iter().map(|t| t.name.as_str())
    }

    /// The current version of policy `tier`.
    pub(crate) fn current(&self, tier: usize) -> Arc<Policy> {
        #[allow(
            clippy::indexing_slicing,
            reason = "`default` is an index into the tiers, found by `Tiers::new`"
        )]
        let tier = self.tiers.get(tier).unwrap_or(&self.tiers[self.default]);
        tier.current.load_full()
    }

    /// Publishes a new version of policy `tier` built from `config`, then marks the old one
    /// replaced, so every state of it moves to the new one at its next check (with `carry`,
    /// when its layout changes).
    pub(crate) fn replace(
        &self,
        tier: usize,
        config: &PolicyConfig,
        carry: Carry,
        metrics: &Metrics,
    ) -> Result<(), ConfigError> {
        let Some(slot) = self.tiers.get(tier) else {
            return Err(ConfigError::UnknownPolicy { name: format!("#{tier}") });
        };
        let mut widest = self.widest.lock().unwrap_or_else(PoisonError::into_inner);
        let mut wider = *widest;
        if self.algorithm == Algorithm::SlidingWindow {
            widen(&mut wider, &config.limits);
        }
        let policy = compile(&slot.name, tier, config, self.algorithm, carry, metrics, &wider)?;
        self.shortest_expiry.fetch_min(policy.expiry(), Ordering::Relaxed);
        if wider != *widest {
            // Every other policy gets a version as wide: its keys move to it, slot by slot,
            // at their next check (`KeyState::migrate_at`).
            for (other, t) in self.tiers.iter().enumerate().filter(|&(other, _)| other != tier) {
                let current = t.current.load_full();
                let config =
                    PolicyConfig { limits: current.limits().copied().collect(), shadow: current.shadow() };
                let same =
                    compile(&t.name, other, &config, self.algorithm, current.carry(), metrics, &wider)?;
                publish(t, same);
            }
            *widest = wider;
        }
        publish(slot, policy);
        Ok(())
    }
}

/// Makes `policy` the current version of `tier`, and marks the old one replaced.
fn publish(tier: &Tier, policy: Policy) {
    // The swap is SeqCst, and happens-before the Release store in `mark_replaced`: whoever
    // sees that flag (Acquire) loads this version or a later one.
    let old = tier.current.swap(Arc::new(policy));
    old.mark_replaced();
}

/// Widens `widest` to hold each of `limits`' `max`.
fn widen(widest: &mut [u32; MAX_LIMITS], limits: &[Limit]) {
    for (w, limit) in widest.iter_mut().zip(limits) {
        *w = (*w).max(ring_entry_bits(limit.max()));
    }
}

fn compile(
    name: &str,
    tier: usize,
    config: &PolicyConfig,
    algorithm: Algorithm,
    carry: Carry,
    metrics: &Metrics,
    widest: &[u32; MAX_LIMITS],
) -> Result<Policy, ConfigError> {
    let policy = Policy::with_entries(&config.limits, algorithm, widest)?;
    let series = metrics.policy(name, &config.limits);
    Ok(policy.of_tier(tier, config.shadow, carry, series))
}
