//! What a limiter reports through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`; the application installs the exporter). Every series carries the label
//! `limiter` (the builder's [`name`](crate::LimiterBuilder::name)):
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `slidegate_admitted_units_total` | counter | `limiter` | units admitted |
//! | `slidegate_denied_units_total` | counter | `limiter`, `policy`, `limit` | units refused, by the key's policy and the index of its limit that refused (also for a cost above its `max`); in shadow mode, the units that would have been refused |
//! | `slidegate_too_many_keys_total` | counter | `limiter` | requests refused because the table was at `max_keys` |
//! | `slidegate_evicted_keys_total` | counter | `limiter` | keys evicted by sweeps |
//! | `slidegate_keys` | gauge | `limiter` | keys held |
//!
//! The handles are registered once, when the limiter is built, so a check only bumps a
//! counter it already holds: no allocation, no lookup by name. Without the feature this
//! module is a set of empty inline functions.

#[cfg(feature = "metrics")]
mod imp {
    use metrics::{Counter, Gauge};

    use crate::{Decision, Denial};

    pub(crate) struct Metrics {
        name: String,
        admitted: Counter,
        too_many_keys: Counter,
        evicted: Counter,
        keys: Gauge,
    }

    impl Metrics {
        pub(crate) fn new(name: &str) -> Metrics {
            let name = name.to_owned();
            Metrics {
                admitted: metrics::counter!("slidegate_admitted_units_total", "limiter" => name.clone()),
                too_many_keys: metrics::counter!("slidegate_too_many_keys_total", "limiter" => name.clone()),
                evicted: metrics::counter!("slidegate_evicted_keys_total", "limiter" => name.clone()),
                keys: metrics::gauge!("slidegate_keys", "limiter" => name.clone()),
                name,
            }
        }

        /// The denial counters of one version of a named policy of `limits` limits.
        pub(crate) fn denials(&self, policy: &str, limits: usize) -> Denials {
            let counter = |i: usize| {
                let (limiter, policy) = (self.name.clone(), policy.to_owned());
                metrics::counter!("slidegate_denied_units_total", "limiter" => limiter, "policy" => policy, "limit" => i.to_string())
            };
            Denials { denied: (0..limits).map(counter).collect() }
        }

        /// `decision` (before shadow mode turns a refusal into an admission) for a request
        /// of `cost` units on a key whose policy counts its denials in `denials`.
        #[inline]
        pub(crate) fn decided(&self, decision: &Decision, cost: u64, denials: &Denials) {
            match decision.denial() {
                None => self.admitted.increment(cost),
                Some(Denial::Limit(i) | Denial::CostTooLarge(i)) => {
                    if let Some(counter) = denials.denied.get(i) {
                        counter.increment(cost);
                    }
                }
                Some(Denial::TooManyKeys) => self.too_many_keys.increment(1),
            }
        }

        #[inline]
        pub(crate) fn keys(&self, held: usize) {
            self.keys.set(held as f64);
        }

        #[inline]
        pub(crate) fn evicted(&self, keys: usize) {
            self.evicted.increment(keys as u64);
        }
    }

    /// A policy's denial counters, by limit.
    #[derive(Debug, Default)]
    pub(crate) struct Denials {
        denied: Box<[Counter]>,
    }

    impl Denials {
        pub(crate) fn none() -> Denials {
            Denials::default()
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::Decision;

    pub(crate) struct Metrics;

    #[derive(Debug, Default)]
    pub(crate) struct Denials;

    impl Denials {
        pub(crate) fn none() -> Denials {
            Denials
        }
    }

    impl Metrics {
        pub(crate) fn new(_: &str) -> Metrics {
            Metrics
        }

        pub(crate) fn denials(&self, _: &str, _: usize) -> Denials {
            Denials
        }

        #[inline(always)]
        pub(crate) fn decided(&self, _: &Decision, _: u64, _: &Denials) {}

        #[inline(always)]
        pub(crate) fn keys(&self, _: usize) {}

        #[inline(always)]
        pub(crate) fn evicted(&self, _: usize) {}
    }
}

pub(crate) use imp::{Denials, Metrics};
