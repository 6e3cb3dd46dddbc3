//! What a limiter reports through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`; the application installs the exporter). Every series carries the label
//! `limiter` (the builder's [`name`](crate::LimiterBuilder::name)):
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `slidegate_admitted_units_total` | counter | `limiter` | units admitted |
//! | `slidegate_denied_units_total` | counter | `limiter`, `limit` | units refused, by the index of the limit that refused (also for a cost above its `max`) |
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
        admitted: Counter,
        denied: Box<[Counter]>,
        too_many_keys: Counter,
        evicted: Counter,
        keys: Gauge,
    }

    impl Metrics {
        pub(crate) fn new(name: &str, limits: usize) -> Metrics {
            let name = name.to_owned();
            Metrics {
                admitted: metrics::counter!("slidegate_admitted_units_total", "limiter" => name.clone()),
                denied: (0..limits)
                    .map(|i| {
                        metrics::counter!("slidegate_denied_units_total", "limiter" => name.clone(), "limit" => i.to_string())
                    })
                    .collect(),
                too_many_keys: metrics::counter!("slidegate_too_many_keys_total", "limiter" => name.clone()),
                evicted: metrics::counter!("slidegate_evicted_keys_total", "limiter" => name.clone()),
                keys: metrics::gauge!("slidegate_keys", "limiter" => name),
            }
        }

        #[inline]
        pub(crate) fn decided(&self, decision: &Decision, cost: u64) {
            match decision.denial() {
                None => self.admitted.increment(cost),
                Some(Denial::Limit(i) | Denial::CostTooLarge(i)) => {
                    if let Some(counter) = self.denied.get(i) {
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
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::Decision;

    pub(crate) struct Metrics;

    impl Metrics {
        pub(crate) fn new(_: &str, _: usize) -> Metrics {
            Metrics
        }

        #[inline(always)]
        pub(crate) fn decided(&self, _: &Decision, _: u64) {}

        #[inline(always)]
        pub(crate) fn keys(&self, _: usize) {}

        #[inline(always)]
        pub(crate) fn evicted(&self, _: usize) {}
    }
}

pub(crate) use imp::Metrics;
