//! `Limiter::top_refused`: the keys refused the most, through the limiter's own refusal
//! paths (`check`, `check_n`, `check_all`, a cost over `max`), from many threads; a spray
//! of one-off keys does not push the heavy ones out; counts decay by half-lives of the
//! longest window; the metrics export sets and clears its gauges.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use slidegate::{Limit, Limiter, ManualClock};

/// A tiny seeded PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` draws from a Zipf(s) law over keys 0..keys (rank 0 the most frequent), by inverting
/// its cumulative distribution.
fn zipf(keys: usize, s: f64, n: usize, seed: u64) -> Vec<u64> {
    let weights: Vec<f64> = (1..=keys).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(keys);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cumulative.push(acc);
    }
    let mut rng = Rng(seed);
    (0..n).map(|_| cumulative.partition_point(|&c| c < rng.unit()).min(keys - 1) as u64).collect()
}

fn limiter(clock: &ManualClock, capacity: usize) -> Limiter<u64> {
    Limiter::<u64>::builder()
        .limit(Limit::per_second(1))
        .track_refused(capacity)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The true refused counts: every check after a key's first is refused (the clock stands
/// still), so a key checked `c` times was refused `c − 1` times.
fn truth(stream: &[u64]) -> Vec<(u64, u64)> {
    let mut counts: HashMap<u64, u64> = HashMap::new();
    for &k in stream {
        *counts.entry(k).or_default() += 1;
    }
    let mut refused: Vec<(u64, u64)> =
        counts.into_iter().map(|(k, c)| (k, c - 1)).filter(|&(_, c)| c > 0).collect();
    refused.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    refused
}

#[test]
fn the_true_top_keys_come_back_in_order_and_a_spray_does_not_push_them_out() {
    let clock = ManualClock::new();
    let limiter = Arc::new(limiter(&clock, 1024));
    // 50,000 keys, 1,000,000 checks from two threads. Every reported count must be within
    // the documented bound of the truth (at least it, at most it + N / m, N the refused units,
    // m the capacity), and the ranks the bound cannot blur must be exactly the truth's.
    let stream = zipf(50_000, 1.1, 1_000_000, 7);
    let (a, b) = stream.split_at(stream.len() / 2);
    std::thread::scope(|scope| {
        for half in [a, b] {
            let limiter = Arc::clone(&limiter);
            scope.spawn(move || {
                for k in half {
                    let _ = limiter.check(k);
                }
            });
        }
    });
    let truth = truth(&stream);
    let refused_units: u64 = truth.iter().map(|&(_, c)| c).sum();
    let bound = refused_units / 1024;
    let top = limiter.top_refused(10);
    assert_eq!(top.len(), 10);
    for (i, ((key, count), (true_key, true_count))) in top.iter().zip(&truth).enumerate() {
        // Only where the truth leaves no doubt: a neighbour within the bound may swap.
        let clear = truth[i + 1].1 + bound < *true_count && (i == 0 || truth[i - 1].1 > true_count + bound);
        if clear {
            assert_eq!(key, true_key, "rank {i}: {top:?}\ntruth {:?}", &truth[..12]);
        }
        let true_of_reported = truth.iter().find(|(k, _)| k == key).map_or(0, |&(_, c)| c);
        assert!(
            *count >= true_of_reported && *count <= true_of_reported + bound,
            "{key}: {count}, truly {true_of_reported}"
        );
    }
    // The top 5 are far apart: always in order.
    let keys: Vec<u64> = top.iter().take(5).map(|&(k, _)| k).collect();
    assert_eq!(keys, truth.iter().take(5).map(|&(k, _)| k).collect::<Vec<_>>());

    // A spray of 1,000,000 one-off keys, each refused once (a cost over `max`).
    for k in 0..1_000_000u64 {
        assert!(!limiter.check_n(&(1 << 40 | k), 2).is_allowed());
    }
    let after: Vec<u64> = limiter.top_refused(5).into_iter().map(|(k, _)| k).collect();
    assert_eq!(after, keys, "the spray pushed heavy keys out");
}

#[test]
fn off_by_default_and_exact_with_few_keys_from_many_threads() {
    let clock = ManualClock::new();
    let untracked =
        Limiter::<u64>::builder().limit(Limit::per_second(1)).clock(clock.clone()).build().unwrap();
    let _ = (untracked.check(&1), untracked.check(&1));
    assert!(untracked.top_refused(10).is_empty());

    let limiter = Arc::new(limiter(&clock, 64));
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let limiter = Arc::clone(&limiter);
            scope.spawn(move || {
                for i in 0..10_000u64 {
                    let _ = limiter.check_n(&(i % 3), 1 + t % 2);
                }
            });
        }
    });
    // Costs of 2 never fit `1/s`; each key's first check of cost 1 is admitted, and the clock
    // stands still: every other unit is refused, and with fewer keys than the capacity the
    // counts are exact.
    let top = limiter.top_refused(10);
    assert_eq!(top.len(), 3);
    let total: u64 = top.iter().map(|&(_, c)| c).sum();
    let checked: u64 = (0..4u64).map(|t| 10_000 * (1 + t % 2)).sum();
    assert_eq!(total, checked - 3);
    for (key, count) in &top {
        let per_key: u64 =
            (0..4u64).map(|t| (0..10_000u64).filter(|i| i % 3 == *key).count() as u64 * (1 + t % 2)).sum();
        assert_eq!(*count, per_key - 1, "key {key}");
    }
}

#[test]
fn check_all_counts_the_refusing_identity_and_counts_decay() {
    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .limit(Limit::per_second(100))
        .limit(Limit::per_minute(3))
        .track_refused(64)
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(limiter.check_all(&["ip:1", "key:a"], 1).unwrap().is_allowed());
    }
    // key:a is out of its minute; ip:2 is fresh: the refusal is key:a's.
    for _ in 0..8 {
        let d = limiter.check_all(&["ip:2", "key:a"], 1).unwrap();
        assert_eq!((d.is_allowed(), d.key()), (false, 1));
    }
    assert_eq!(limiter.top_refused(5), [("key:a".to_owned(), 8)]);
    // Half-lives of the longest window (a minute): 8 → 4 → 2.
    clock.advance(Duration::from_secs(60));
    assert_eq!(limiter.top_refused(5), [("key:a".to_owned(), 4)]);
    clock.advance(Duration::from_secs(60));
    assert_eq!(limiter.top_refused(5), [("key:a".to_owned(), 2)]);
    // A key refused now outranks one refused more, two minutes ago.
    for _ in 0..6 {
        let _ = limiter.check("late"); // 3 admitted, 3 refused
    }
    assert_eq!(limiter.top_refused(5), [("late".to_owned(), 3), ("key:a".to_owned(), 2)]);
}

#[cfg(feature = "metrics")]
#[test]
fn the_export_sets_the_listed_keys_and_clears_those_that_left() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use slidegate::metrics::{KEY, LIMITER, TOP_REFUSED_UNITS};

    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .name("edge")
        .limit(Limit::per_second(1))
        .track_refused(64)
        .clock(clock.clone())
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauges = || -> HashMap<String, f64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == TOP_REFUSED_UNITS)
            .filter_map(|(key, _, _, value)| {
                let labels: HashMap<&str, &str> = key.key().labels().map(|l| (l.key(), l.value())).collect();
                assert_eq!(labels.get(LIMITER), Some(&"edge"));
                match value {
                    DebugValue::Gauge(v) => Some((labels.get(KEY)?.to_string(), v.into_inner())),
                    _ => None,
                }
            })
            .collect()
    };
    for (key, times) in [("a", 4), ("b", 3), ("c", 2)] {
        for _ in 0..times {
            let _ = limiter.check(key);
        }
    }
    metrics::with_local_recorder(&recorder, || limiter.export_top_refused(2, String::clone));
    assert_eq!(gauges(), HashMap::from([("a".to_owned(), 3.0), ("b".to_owned(), 2.0)]));
    for _ in 0..10 {
        let _ = limiter.check("c");
    }
    metrics::with_local_recorder(&recorder, || limiter.export_top_refused(2, String::clone));
    assert_eq!(
        gauges(),
        HashMap::from([("c".to_owned(), 11.0), ("a".to_owned(), 3.0), ("b".to_owned(), 0.0)])
    );
}
