//! Feature `metrics`: a limiter reports admitted, denied, shadow-denied and too-many-keys
//! units per policy (denials per refusing limit, by its string form), evictions and live
//! keys through the `metrics` facade, to whatever recorder the application installed (here
//! metrics-util's debugging recorder), whether it installed it before or after building
//! the limiter; and with a recorder installed, checks on existing keys still allocate
//! nothing.
//!
//! A process has one global recorder, installed once: this file holds a single test, and
//! is the only user of the global recorder in its binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use slidegate::metrics::{
    ADMITTED_UNITS, DENIED_UNITS, EVICTED_KEYS, EVICTED_LIVE_KEYS, KEYS, LIMIT, LIMITER, POLICY,
    SHADOW_DENIED_UNITS, TOO_MANY_KEYS_UNITS, UNKNOWN_POLICY,
};
use slidegate::{Carry, Limit, Limiter, ManualClock, PolicyConfig, WhenFull};

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}
use support::counting_alloc::{allocations_during, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A series: its name, and its `policy` and `limit` labels.
type Series = (String, Option<String>, Option<String>);

/// The series of limiter `limiter`, from one snapshot (the debugging recorder resets
/// counters on each snapshot: values are deltas).
fn snapshot(snapshotter: &Snapshotter, limiter: &str) -> HashMap<Series, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let label = |l: &str| key.labels().find(|x| x.key() == l).map(|x| x.value().to_owned());
            (label(LIMITER).as_deref() == Some(limiter))
                .then(|| ((key.name().to_owned(), label(POLICY), label(LIMIT)), value))
        })
        .collect()
}

/// Looks a series up: `name`, `policy`, `limit`.
fn get<'a>(
    series: &'a HashMap<Series, DebugValue>,
    name: &str,
    policy: Option<&str>,
    limit: Option<&str>,
) -> Option<&'a DebugValue> {
    series.get(&(name.to_owned(), policy.map(str::to_owned), limit.map(str::to_owned)))
}

#[test]
fn limiters_built_before_and_after_the_recorder_report_units_by_policy_and_limit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();

    // Built, and used, before the application installs its recorder.
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .name("api")
        .limit(Limit::per_second(3))
        .limit(Limit::per_minute(5))
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(limiter.check(&1).is_allowed()); // reported nowhere: no recorder yet
    recorder.install().unwrap();
    for _ in 0..3 {
        let _ = limiter.check(&1); // 2 admitted (3/s), the 3rd refused by 3/s
    }
    let _ = limiter.check_n(&1, 10); // can never fit 3/s: 10 units denied there
    clock.advance(Duration::from_secs(2));
    for _ in 0..3 {
        let _ = limiter.check(&1); // 2 admitted (5/min: 3 used), then refused by 5/min
    }
    let _ = limiter.check(&2);
    let _ = limiter.check(&3); // the table is full: 1 unit
    let _ = limiter.check_n(&3, 2); // and 2 more
    let _ = limiter.peek(&1); // peeks are not decisions that count
    let series = snapshot(&snapshotter, "api");
    let default = Some("default");
    assert_eq!(get(&series, ADMITTED_UNITS, default, None), Some(&DebugValue::Counter(5)), "{series:?}");
    assert_eq!(get(&series, DENIED_UNITS, default, Some("3/s")), Some(&DebugValue::Counter(11)));
    assert_eq!(get(&series, DENIED_UNITS, default, Some("5/min")), Some(&DebugValue::Counter(1)));
    // Units, like the others: 1 + 2.
    assert_eq!(get(&series, TOO_MANY_KEYS_UNITS, default, None), Some(&DebugValue::Counter(3)));
    assert_eq!(get(&series, KEYS, None, None), Some(&DebugValue::Gauge(2.0.into())));
    assert_eq!(get(&series, SHADOW_DENIED_UNITS, default, Some("3/s")), Some(&DebugValue::Counter(0)));

    // Checks on existing keys allocate nothing, with a recorder installed after the build.
    let n = allocations_during(|| {
        for i in 0..10_000u64 {
            let _ = limiter.check(&(1 + i % 2));
        }
    });
    assert_eq!(n, 0, "checks with metrics on allocated {n} times");

    clock.advance(Duration::from_secs(3600));
    let _ = snapshot(&snapshotter, "api"); // start the deltas afresh
    assert_eq!(limiter.sweep(), 2);
    let _ = limiter.check(&7);
    let series = snapshot(&snapshotter, "api");
    assert_eq!(get(&series, EVICTED_KEYS, None, None), Some(&DebugValue::Counter(2)));
    assert_eq!(get(&series, ADMITTED_UNITS, default, None), Some(&DebugValue::Counter(1)));
    assert_eq!(get(&series, KEYS, None, None), Some(&DebugValue::Gauge(1.0.into())), "two evicted, one new");

    // Built after the recorder, with named policies: every series carries the key's
    // policy; a shadow policy's would-be refusals have a series of their own (the
    // requests were let through), never the enforced denials'.
    let tiers = Limiter::<u64>::builder()
        .name("tiers")
        .policy("free", PolicyConfig::new([Limit::per_second(2)]))
        .policy("trial", PolicyConfig::new([Limit::per_second(1), Limit::per_minute(1)]).shadow(true))
        .resolver(|key: &u64| (*key >= 100).then_some("trial"))
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    let free = (0..3).filter(|_| tiers.check(&1).is_allowed()).count();
    let trial = (0..3).filter(|_| tiers.check(&100).is_allowed()).count();
    assert_eq!((free, trial), (2, 3));
    // Refused by the free key (full): counted once, under free.
    assert!(!tiers.check_all(&[&1, &100], 1).unwrap().is_allowed());
    // A third key: the table is full; counted under the policy it would have had.
    assert!(!tiers.check_all(&[&1, &101], 2).unwrap().is_allowed());
    let series = snapshot(&snapshotter, "tiers");
    let (free, trial) = (Some("free"), Some("trial"));
    assert_eq!(get(&series, ADMITTED_UNITS, free, None), Some(&DebugValue::Counter(2)), "{series:?}");
    assert_eq!(get(&series, DENIED_UNITS, free, Some("2/s")), Some(&DebugValue::Counter(2)));
    assert_eq!(get(&series, ADMITTED_UNITS, trial, None), Some(&DebugValue::Counter(1)));
    // (Refused by the limit that frees up last: the minute.)
    assert_eq!(get(&series, SHADOW_DENIED_UNITS, trial, Some("1/min")), Some(&DebugValue::Counter(2)));
    assert_eq!(get(&series, DENIED_UNITS, trial, Some("1/min")), Some(&DebugValue::Counter(0)));
    assert_eq!(get(&series, TOO_MANY_KEYS_UNITS, trial, None), Some(&DebugValue::Counter(2)));
    assert_eq!(get(&series, TOO_MANY_KEYS_UNITS, free, None), Some(&DebugValue::Counter(0)));

    // A new version of a policy reports under the same policy label, with its own limits.
    tiers.update_policy("free", PolicyConfig::new([Limit::per_second(1)]), Carry::Conservative).unwrap();
    let _ = tiers.check(&1); // the 2 units of this second carried over: refused
    let series = snapshot(&snapshotter, "tiers");
    assert_eq!(get(&series, DENIED_UNITS, free, Some("1/s")), Some(&DebugValue::Counter(1)), "{series:?}");

    // A limiter in shadow mode: every refusal is a shadow one.
    let trying = Limiter::<u64>::builder()
        .name("trying")
        .limit(Limit::per_minute(2))
        .shadow(true)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!((0..5).all(|_| trying.check(&1).is_allowed()));
    let series = snapshot(&snapshotter, "trying");
    assert_eq!(get(&series, ADMITTED_UNITS, default, None), Some(&DebugValue::Counter(2)), "{series:?}");
    assert_eq!(get(&series, SHADOW_DENIED_UNITS, default, Some("2/min")), Some(&DebugValue::Counter(3)));
    assert_eq!(get(&series, DENIED_UNITS, default, Some("2/min")), Some(&DebugValue::Counter(0)));

    // A full table making room: an idle key's place is an eviction, a live key's (under
    // `EvictLeastRecent`) one of its own; a resolver naming no policy is counted.
    let full = Limiter::<u64>::builder()
        .name("full")
        .limit(Limit::per_second(1))
        .max_keys(1)
        .when_full(WhenFull::EvictLeastRecent)
        .resolver(|key: &u64| (*key == 5).then_some("gold"))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(full.check(&1).is_allowed());
    clock.advance(Duration::from_secs(3));
    assert!(full.check(&2).is_allowed()); // key 1 is idle
    assert!(full.check(&3).is_allowed()); // key 2 is live
    assert!(full.check(&5).is_allowed()); // no policy "gold": the default, and key 3 evicted
    let series = snapshot(&snapshotter, "full");
    assert_eq!(get(&series, EVICTED_KEYS, None, None), Some(&DebugValue::Counter(1)), "{series:?}");
    assert_eq!(get(&series, EVICTED_LIVE_KEYS, None, None), Some(&DebugValue::Counter(2)));
    assert_eq!(get(&series, UNKNOWN_POLICY, None, None), Some(&DebugValue::Counter(1)));
}
