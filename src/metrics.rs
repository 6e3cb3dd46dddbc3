//! What a limiter reports through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`; the application installs the recorder, that is the exporter). The names and
//! label keys are the constants of this module; without the feature they still exist, and
//! nothing is reported.
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | [`ADMITTED_UNITS`] `slidegate_admitted_units_total` | counter | `limiter`, `policy` | units admitted by every limit of the key's policy |
//! | [`DENIED_UNITS`] `slidegate_denied_units_total` | counter | `limiter`, `policy`, `limit` | units refused, by the limit that refused them (also for a cost above that limit's `max`) |
//! | [`SHADOW_DENIED_UNITS`] `slidegate_shadow_denied_units_total` | counter | `limiter`, `policy`, `limit` | units a limit would have refused but shadow mode (the limiter's or the policy's) let through |
//! | [`TOO_MANY_KEYS_UNITS`] `slidegate_too_many_keys_units_total` | counter | `limiter`, `policy` | units refused because the key was new and the table held `max_keys` keys (`policy`: the one the key would have had) |
//! | [`EVICTED_KEYS`] `slidegate_evicted_keys_total` | counter | `limiter` | idle keys evicted, by sweeps or to make room for a new key in a full table (a count of keys, not units) |
//! | [`EVICTED_LIVE_KEYS`] `slidegate_evicted_live_keys_total` | counter | `limiter` | keys evicted while their windows still counted units, to make room under [`WhenFull::EvictLeastRecent`](crate::WhenFull::EvictLeastRecent) (each such key's budget restarted) |
//! | [`UNKNOWN_POLICY`] `slidegate_unknown_policy_total` | counter | `limiter` | new keys whose resolver named no policy of the limiter (they got the default policy) |
//! | [`KEYS`] `slidegate_keys` | gauge | `limiter` | keys held (set when a key is inserted and after each sweep) |
//! | [`TOP_REFUSED_UNITS`] `slidegate_top_refused_units` | gauge | `limiter`, `key` | the keys refused the most and their decayed refused units, set by each [`Limiter::export_top_refused`](crate::Limiter::export_top_refused) call (at most `n` series above 0 at a time) |
//!
//! The label values: `limiter` is the builder's [`name`](crate::LimiterBuilder::name),
//! `policy` the key's [named policy](crate::LimiterBuilder::policy)
//! ([`DEFAULT_POLICY`](crate::DEFAULT_POLICY) for limits given with
//! [`limit`](crate::LimiterBuilder::limit)), and `limit` the limit's string form
//! ([`Limit`](crate::Limit)'s `Display`, e.g. `10/s`, `1000/h@1min`, `5/s strict`).
//!
//! Every check of a key counts its units in exactly one of the four `_units_total` series
//! of its policy, so per policy `admitted + denied + shadow_denied + too_many_keys` is
//! every unit checked, the units let through are `admitted + shadow_denied`, and the
//! denial ratio of a tier is `denied / (admitted + denied + shadow_denied + too_many_keys)`.
//! [`peek`](crate::Limiter::peek) is not a check and counts nothing.
//! [`check_all`](crate::Limiter::check_all) counts the request once under the policy of
//! the enforced key that decided it, and once more under each key whose policy is in
//! shadow mode.
//!
//! # When the recorder is installed
//! A limiter reports to the recorder installed before it was built, and equally to one
//! installed afterwards: the series are registered when the limiter (or a policy version)
//! is built, with the recorder in use then; if that was `metrics`' no-op recorder, each
//! check compares the recorder in use with it (a thread-local read and one atomic load,
//! no allocation, no lock), and the first check that finds another one registers the
//! series again with it, once (that check allocates the handles). From then on, as for a
//! limiter built after the recorder, a check costs one load and the counter's increment.
//! The gauge and the eviction counter follow at the next insertion or sweep.
//!
//! (A limiter built while no recorder is in use binds to the first other recorder one of
//! its checks sees, which is the global one unless that check ran inside
//! `metrics::with_local_recorder`.)
//!
//! ```
//! # #[cfg(feature = "metrics")] {
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use slidegate::{metrics, Limit, Limiter};
//!
//! // Built before the application installs its recorder...
//! let limiter = Limiter::<u64>::builder().name("api").limit(Limit::per_second(2)).build()?;
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! recorder.install().expect("the first recorder of this process");
//! // ...and it reports all the same.
//! for _ in 0..3 {
//!     let _ = limiter.check(&7);
//! }
//! let denied = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
//!     let key = key.key();
//!     let label = |name: &str| key.labels().find(|l| l.key() == name).map(|l| l.value().to_owned());
//!     (key.name() == metrics::DENIED_UNITS).then(|| (label(metrics::POLICY), label(metrics::LIMIT), value))
//! });
//! assert_eq!(denied, Some((Some("default".into()), Some("2/s".into()), DebugValue::Counter(1))));
//! # }
//! # Ok::<(), slidegate::ConfigError>(())
//! ```

/// Counter: units admitted by every limit of the key's policy. Labels [`LIMITER`],
/// [`POLICY`].
///
/// ```
/// assert_eq!(slidegate::metrics::ADMITTED_UNITS, "slidegate_admitted_units_total");
/// ```
pub const ADMITTED_UNITS: &str = "slidegate_admitted_units_total";

/// Counter: units refused, by the refusing limit. Labels [`LIMITER`], [`POLICY`],
/// [`LIMIT`].
///
/// ```
/// assert_eq!(slidegate::metrics::DENIED_UNITS, "slidegate_denied_units_total");
/// ```
pub const DENIED_UNITS: &str = "slidegate_denied_units_total";

/// Counter: units a limit would have refused, let through by shadow mode. Labels
/// [`LIMITER`], [`POLICY`], [`LIMIT`].
///
/// ```
/// assert_eq!(slidegate::metrics::SHADOW_DENIED_UNITS, "slidegate_shadow_denied_units_total");
/// ```
pub const SHADOW_DENIED_UNITS: &str = "slidegate_shadow_denied_units_total";

/// Counter: units refused because the key was new and the table held `max_keys` keys.
/// Labels [`LIMITER`], [`POLICY`] (the policy the key would have had).
///
/// ```
/// assert_eq!(slidegate::metrics::TOO_MANY_KEYS_UNITS, "slidegate_too_many_keys_units_total");
/// ```
pub const TOO_MANY_KEYS_UNITS: &str = "slidegate_too_many_keys_units_total";

/// Counter: idle keys evicted, by sweeps or to make room for a new key in a full table.
/// Label [`LIMITER`].
///
/// ```
/// assert_eq!(slidegate::metrics::EVICTED_KEYS, "slidegate_evicted_keys_total");
/// ```
pub const EVICTED_KEYS: &str = "slidegate_evicted_keys_total";

/// Counter: live keys evicted to make room for a new key
/// ([`WhenFull::EvictLeastRecent`](crate::WhenFull::EvictLeastRecent)); each one's windows
/// restarted empty. Label [`LIMITER`].
///
/// ```
/// assert_eq!(slidegate::metrics::EVICTED_LIVE_KEYS, "slidegate_evicted_live_keys_total");
/// ```
pub const EVICTED_LIVE_KEYS: &str = "slidegate_evicted_live_keys_total";

/// Counter: new keys for which the limiter's
/// [`resolver`](crate::LimiterBuilder::resolver) named a policy the limiter does not have;
/// each got the default policy. Label [`LIMITER`].
///
/// ```
/// assert_eq!(slidegate::metrics::UNKNOWN_POLICY, "slidegate_unknown_policy_total");
/// ```
pub const UNKNOWN_POLICY: &str = "slidegate_unknown_policy_total";

/// Gauge: keys held. Label [`LIMITER`].
///
/// ```
/// assert_eq!(slidegate::metrics::KEYS, "slidegate_keys");
/// ```
pub const KEYS: &str = "slidegate_keys";

/// Gauge: a key among the `n` refused the most ([`Limiter::top_refused`]), and its decayed
/// refused units. Labels [`LIMITER`], [`KEY`]. Set by each
/// [`Limiter::export_top_refused`] call: the keys listed get their counts, the keys the
/// previous call listed and this one does not get 0. So at most `n` series are above 0 at
/// a time; series set to 0 stay in the recorder until it drops them (an exporter's idle
/// timeout, e.g. metrics-exporter-prometheus's `idle_timeout`, bounds the series kept
/// over time: set it shorter than the export interval times a few).
///
/// [`Limiter::top_refused`]: crate::Limiter::top_refused
/// [`Limiter::export_top_refused`]: crate::Limiter::export_top_refused
///
/// ```
/// assert_eq!(slidegate::metrics::TOP_REFUSED_UNITS, "slidegate_top_refused_units");
/// ```
pub const TOP_REFUSED_UNITS: &str = "slidegate_top_refused_units";

/// Label key: a key, as [`Limiter::export_top_refused`](crate::Limiter::export_top_refused)'s
/// `label` writes it.
///
/// ```
/// assert_eq!(slidegate::metrics::KEY, "key");
/// ```
pub const KEY: &str = "key";

/// Label key: the limiter's [`name`](crate::LimiterBuilder::name).
///
/// ```
/// assert_eq!(slidegate::metrics::LIMITER, "limiter");
/// ```
pub const LIMITER: &str = "limiter";

/// Label key: the name of the key's policy.
///
/// ```
/// assert_eq!(slidegate::metrics::POLICY, "policy");
/// ```
pub const POLICY: &str = "policy";

/// Label key: the refusing limit's string form (`Limit`'s `Display`, e.g. `10/s`).
///
/// ```
/// assert_eq!(slidegate::metrics::LIMIT, "limit");
/// ```
pub const LIMIT: &str = "limit";

#[cfg(feature = "metrics")]
mod imp {
    use std::fmt;
    use std::sync::OnceLock;

    use ::metrics::{Counter, Gauge, Recorder};

    use super::{
        ADMITTED_UNITS, DENIED_UNITS, EVICTED_KEYS, EVICTED_LIVE_KEYS, KEY, KEYS, LIMIT, LIMITER, POLICY,
        SHADOW_DENIED_UNITS, TOO_MANY_KEYS_UNITS, TOP_REFUSED_UNITS, UNKNOWN_POLICY,
    };
    use crate::{Decision, Denial, Limit};

    /// The recorder `metrics` hands out now: its address (which identifies it: the global
    /// recorder is leaked once installed, the no-op one is a static) and whether it is
    /// zero-sized (as the no-op recorder is; a recorder that holds anything is not).
    fn recorder_in_use() -> (usize, bool) {
        ::metrics::with_recorder(|recorder: &dyn Recorder| {
            let address = (recorder as *const dyn Recorder).cast::<()>() as usize;
            (address, std::mem::size_of_val(recorder) == 0)
        })
    }

    /// Handles registered with the recorder in use when they were made, and registered
    /// again, once, with the first other recorder a use finds, if that first one could be
    /// the no-op recorder (see the module's docs).
    struct Bound<H> {
        initial: H,
        /// The recorder `initial` was registered with.
        at: usize,
        /// `initial` went to a recorder that is not the no-op one: nothing to look for.
        fixed: bool,
        late: OnceLock<H>,
    }

    impl<H> Bound<H> {
        fn new(register: impl FnOnce() -> H) -> Bound<H> {
            // The recorder first, then the registration: a recorder installed in between
            // is found by the first use (and registered with, again: the same series).
            let (at, zero_sized) = recorder_in_use();
            Bound { initial: register(), at, fixed: !zero_sized, late: OnceLock::new() }
        }

        /// Handles that register with nothing (policies made outside a limiter).
        fn fixed(handles: H) -> Bound<H> {
            Bound { initial: handles, at: 0, fixed: true, late: OnceLock::new() }
        }

        #[inline]
        fn get(&self, register: impl FnOnce() -> H) -> &H {
            if self.fixed {
                return &self.initial;
            }
            match self.late.get() {
                Some(handles) => handles,
                None => self.look(register),
            }
        }

        /// The no-op recorder (or a zero-sized one) was in use at registration: is another
        /// one in use now?
        #[inline]
        fn look(&self, register: impl FnOnce() -> H) -> &H {
            if recorder_in_use().0 == self.at {
                return &self.initial;
            }
            self.rebind(register)
        }

        #[cold]
        #[inline(never)]
        fn rebind(&self, register: impl FnOnce() -> H) -> &H {
            self.late.get_or_init(register)
        }
    }

    /// The limiter's own series.
    struct LimiterHandles {
        evicted: Counter,
        evicted_live: Counter,
        unknown_policy: Counter,
        keys: Gauge,
    }

    pub(crate) struct Metrics {
        name: String,
        handles: Bound<LimiterHandles>,
    }

    impl Metrics {
        pub(crate) fn new(name: &str) -> Metrics {
            let name = name.to_owned();
            Metrics { handles: Bound::new(|| Metrics::register(&name)), name }
        }

        fn register(name: &str) -> LimiterHandles {
            LimiterHandles {
                evicted: ::metrics::counter!(EVICTED_KEYS, LIMITER => name.to_owned()),
                evicted_live: ::metrics::counter!(EVICTED_LIVE_KEYS, LIMITER => name.to_owned()),
                unknown_policy: ::metrics::counter!(UNKNOWN_POLICY, LIMITER => name.to_owned()),
                keys: ::metrics::gauge!(KEYS, LIMITER => name.to_owned()),
            }
        }

        fn handles(&self) -> &LimiterHandles {
            self.handles.get(|| Metrics::register(&self.name))
        }

        /// The series of one version of the policy `policy` with these limits.
        pub(crate) fn policy(&self, policy: &str, limits: &[Limit]) -> PolicyMetrics {
            let labels = Labels {
                limiter: self.name.clone(),
                policy: policy.to_owned(),
                limits: limits.iter().map(Limit::to_string).collect(),
            };
            PolicyMetrics { handles: Bound::new(|| labels.register()), labels: Some(Box::new(labels)) }
        }

        #[inline]
        pub(crate) fn keys(&self, held: usize) {
            self.handles().keys.set(held as f64);
        }

        #[inline]
        pub(crate) fn evicted(&self, keys: usize) {
            self.handles().evicted.increment(keys as u64);
        }

        pub(crate) fn evicted_live(&self) {
            self.handles().evicted_live.increment(1);
        }

        pub(crate) fn unknown_policy(&self) {
            self.handles().unknown_policy.increment(1);
        }

        /// Sets the top refused keys' gauges to `listed`, and those of `previous` that are
        /// not listed to 0; `previous` becomes the labels listed.
        pub(crate) fn top_refused(&self, listed: Vec<(String, u64)>, previous: &mut Vec<String>) {
            for label in previous.iter().filter(|l| !listed.iter().any(|(k, _)| k == *l)) {
                ::metrics::gauge!(TOP_REFUSED_UNITS, LIMITER => self.name.clone(), KEY => label.clone())
                    .set(0.0);
            }
            previous.clear();
            for (label, units) in listed {
                ::metrics::gauge!(TOP_REFUSED_UNITS, LIMITER => self.name.clone(), KEY => label.clone())
                    .set(units as f64);
                previous.push(label);
            }
        }
    }

    struct Labels {
        limiter: String,
        policy: String,
        /// Each limit's string form, in the policy's order.
        limits: Box<[String]>,
    }

    impl Labels {
        fn register(&self) -> PolicyHandles {
            let (limiter, policy) = (&self.limiter, &self.policy);
            let per_limit = |name: &'static str| -> Box<[Counter]> {
                self.limits
                    .iter()
                    .map(|limit| {
                        ::metrics::counter!(name, LIMITER => limiter.clone(), POLICY => policy.clone(), LIMIT => limit.clone())
                    })
                    .collect()
            };
            PolicyHandles {
                admitted: ::metrics::counter!(ADMITTED_UNITS, LIMITER => limiter.clone(), POLICY => policy.clone()),
                too_many_keys: ::metrics::counter!(TOO_MANY_KEYS_UNITS, LIMITER => limiter.clone(), POLICY => policy.clone()),
                denied: per_limit(DENIED_UNITS),
                shadow_denied: per_limit(SHADOW_DENIED_UNITS),
            }
        }
    }

    struct PolicyHandles {
        admitted: Counter,
        too_many_keys: Counter,
        /// By limit, in the policy's order.
        denied: Box<[Counter]>,
        shadow_denied: Box<[Counter]>,
    }

    impl PolicyHandles {
        fn noop() -> PolicyHandles {
            PolicyHandles {
                admitted: Counter::noop(),
                too_many_keys: Counter::noop(),
                denied: Box::default(),
                shadow_denied: Box::default(),
            }
        }
    }

    /// The series of one version of a named policy.
    pub(crate) struct PolicyMetrics {
        handles: Bound<PolicyHandles>,
        /// `None` for a policy made outside a limiter, which reports nothing.
        labels: Option<Box<Labels>>,
    }

    impl fmt::Debug for PolicyMetrics {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let policy = self.labels.as_ref().map(|l| l.policy.as_str());
            f.debug_struct("PolicyMetrics").field("policy", &policy).finish_non_exhaustive()
        }
    }

    impl PolicyMetrics {
        pub(crate) fn none() -> PolicyMetrics {
            PolicyMetrics { handles: Bound::fixed(PolicyHandles::noop()), labels: None }
        }

        /// `decision` (before shadow mode turns a refusal into an admission) for a request
        /// of `cost` units; `shadow`: the refusal, if any, is not enforced.
        #[inline]
        pub(crate) fn decided(&self, decision: &Decision, cost: u64, shadow: bool) {
            // (A policy without labels is fixed: it never registers.)
            let handles =
                self.handles.get(|| self.labels.as_ref().map_or_else(PolicyHandles::noop, |l| l.register()));
            match decision.denial() {
                None => handles.admitted.increment(cost),
                Some(Denial::Limit(i) | Denial::CostTooLarge(i)) => {
                    let series = if shadow { &handles.shadow_denied } else { &handles.denied };
                    if let Some(counter) = series.get(i) {
                        counter.increment(cost);
                    }
                }
                Some(Denial::TooManyKeys) => handles.too_many_keys.increment(cost),
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::{Decision, Limit};

    pub(crate) struct Metrics;

    #[derive(Debug, Default)]
    pub(crate) struct PolicyMetrics;

    impl PolicyMetrics {
        pub(crate) fn none() -> PolicyMetrics {
            PolicyMetrics
        }

        #[inline(always)]
        pub(crate) fn decided(&self, _: &Decision, _: u64, _: bool) {}
    }

    impl Metrics {
        pub(crate) fn new(_: &str) -> Metrics {
            Metrics
        }

        pub(crate) fn policy(&self, _: &str, _: &[Limit]) -> PolicyMetrics {
            PolicyMetrics
        }

        #[inline(always)]
        pub(crate) fn keys(&self, _: usize) {}

        #[inline(always)]
        pub(crate) fn evicted(&self, _: usize) {}

        pub(crate) fn evicted_live(&self) {}

        pub(crate) fn unknown_policy(&self) {}

        pub(crate) fn top_refused(&self, _: Vec<(String, u64)>, _: &mut Vec<String>) {}
    }
}

pub(crate) use imp::{Metrics, PolicyMetrics};
