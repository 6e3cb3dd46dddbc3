//! Feature `metrics`: a limiter reports admitted and denied units (per policy and refusing
//! limit, shadow denials included),
//! `max_keys` refusals, evictions and live keys through the `metrics` facade, to whatever
//! recorder the application installed (here metrics-util's debugging recorder); and with a
//! recorder installed, checks on existing keys still allocate nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use slidegate::{Carry, Limit, Limiter, ManualClock, PolicyConfig};

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}
use support::counting_alloc::{allocations_during, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The series of limiter `limiter` by (name, `policy/limit` labels), from one snapshot
/// (the debugging recorder resets counters on each snapshot: values are deltas).
fn snapshot(snapshotter: &Snapshotter, limiter: &str) -> HashMap<(String, Option<String>), DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let label = |l: &str| key.labels().find(|x| x.key() == l).map(|x| x.value().to_owned());
            (label("limiter").as_deref() == Some(limiter)).then(|| {
                let limit = label("limit").map(|l| format!("{}/{l}", label("policy").unwrap_or_default()));
                ((key.name().to_owned(), limit), value)
            })
        })
        .collect()
}

#[test]
fn a_limiter_reports_its_decisions_keys_and_evictions_without_allocating() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .name("api")
        .limit(Limit::per_second(3))
        .limit(Limit::per_minute(5))
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..4 {
        let _ = limiter.check(&1); // 3 admitted, the 4th refused by limit 0
    }
    let _ = limiter.check_n(&1, 10); // can never fit limit 0: 10 units denied there
    clock.advance(Duration::from_secs(2));
    for _ in 0..3 {
        let _ = limiter.check(&1); // 2 admitted (minute: 5), then refused by limit 1
    }
    let _ = limiter.check(&2);
    let _ = limiter.check(&3); // the table is full
    let _ = limiter.peek(&1); // peeks are not decisions that count
    let series = snapshot(&snapshotter, "api");
    let get = |name: &str, limit: Option<&str>| series.get(&(name.to_owned(), limit.map(str::to_owned)));
    assert_eq!(get("slidegate_admitted_units_total", None), Some(&DebugValue::Counter(6)));
    assert_eq!(get("slidegate_denied_units_total", Some("default/0")), Some(&DebugValue::Counter(11)));
    assert_eq!(get("slidegate_denied_units_total", Some("default/1")), Some(&DebugValue::Counter(1)));
    assert_eq!(get("slidegate_too_many_keys_total", None), Some(&DebugValue::Counter(1)));
    assert_eq!(get("slidegate_keys", None), Some(&DebugValue::Gauge(2.0.into())));

    // Checks on existing keys allocate nothing, with a recorder installed.
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
    let get = |name: &str| series.get(&(name.to_owned(), None));
    assert_eq!(get("slidegate_evicted_keys_total"), Some(&DebugValue::Counter(2)));
    assert_eq!(get("slidegate_admitted_units_total"), Some(&DebugValue::Counter(1)));
    assert_eq!(get("slidegate_keys"), Some(&DebugValue::Gauge(1.0.into())), "two evicted, one new");

    // Named policies: denials carry the key's policy; a shadow policy's would-be denials
    // are counted as denials too (that is what trying a limit in shadow is for), though
    // the requests are admitted.
    let tiers = Limiter::<u64>::builder()
        .name("tiers")
        .policy("free", PolicyConfig::new([Limit::per_second(2)]))
        .policy("trial", PolicyConfig::new([Limit::per_second(1), Limit::per_minute(1)]).shadow(true))
        .resolver(|key: &u64| (*key >= 100).then_some("trial"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let free = (0..3).filter(|_| tiers.check(&1).is_allowed()).count();
    let trial = (0..3).filter(|_| tiers.check(&100).is_allowed()).count();
    assert_eq!((free, trial), (2, 3));
    let series = snapshot(&snapshotter, "tiers");
    let get = |name: &str, limit: Option<&str>| series.get(&(name.to_owned(), limit.map(str::to_owned)));
    assert_eq!(get("slidegate_admitted_units_total", None), Some(&DebugValue::Counter(3)));
    assert_eq!(get("slidegate_denied_units_total", Some("free/0")), Some(&DebugValue::Counter(1)));
    // (Refused by the limit that frees up last: the minute.)
    assert_eq!(get("slidegate_denied_units_total", Some("trial/1")), Some(&DebugValue::Counter(2)));
    // A new version of a policy reports under the same labels.
    tiers.update_policy("free", PolicyConfig::new([Limit::per_second(1)]), Carry::Reset).unwrap();
    let _ = tiers.check(&1);
    let series = snapshot(&snapshotter, "tiers");
    let get = |name: &str, limit: Option<&str>| series.get(&(name.to_owned(), limit.map(str::to_owned)));
    assert_eq!(get("slidegate_denied_units_total", Some("free/0")), Some(&DebugValue::Counter(1)));
}
