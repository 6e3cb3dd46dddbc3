//! The public API and the promises of the README's usage and the semantics guide, one focused
//! test each: the documented snippets, limit strings, the seed article's worked example,
//! strict versus interpolated accuracy, what counts, cost 0 and `peek`, `retry_after`
//! exactness, monotonic time, `max_keys`, `sweep`, `reset`, every `ConfigError`, key types,
//! and that no public function panics on odd input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use slidegate::{
    Accuracy, Algorithm, ConfigError, Decision, Denial, Limit, Limiter, ManualClock, MAX_LIMITS,
    MAX_LOG_UNITS, MAX_UNITS,
};

#[allow(dead_code)]
mod support {
    pub mod rng;
}
use support::rng::Rng;

const NS: Duration = Duration::from_nanos(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A limiter on a fresh manual clock.
fn manual<K>(limits: &[Limit]) -> (ManualClock, Limiter<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let clock = ManualClock::new();
    let mut builder = Limiter::<K>::builder().clock(clock.clone());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    let limiter = builder.build().unwrap_or_else(|e| panic!("{limits:?}: {e}"));
    (clock, limiter)
}

/// Sends `n` requests of `cost` now and returns how many were admitted.
fn hammer(limiter: &Limiter<u64>, key: u64, n: usize, cost: u64) -> usize {
    (0..n).filter(|_| limiter.check_n(&key, cost).is_allowed()).count()
}

/// The most admitted units in any closed interval `[t, t + window]` of a sorted log of
/// admission times (ns).
fn densest(log: &[u64], window: u64) -> usize {
    let mut best = 0;
    let mut inside = VecDeque::new();
    for &t in log {
        inside.push_back(t);
        while inside.front().is_some_and(|&first| first + window < t) {
            inside.pop_front();
        }
        best = best.max(inside.len());
    }
    best
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

#[test]
fn the_documented_snippet_compiles_and_behaves() -> Result<(), ConfigError> {
    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .limit(Limit::per_second(10))
        .limit(Limit::per_minute(120))
        .limit(Limit::new(240, Duration::from_secs(3600)).precision(Duration::from_secs(60)))
        .clock(clock.clone())
        .build()?;

    let d: Decision = limiter.check("user_a");
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.retry_after(), d.denial(), d.tightest_limit()), (9, None, None, 0));
    let d = limiter.check_n("user_a", 5);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 4);
    let d = limiter.peek("user_a");
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 3, "peek answers as if a cost-1 request were admitted");
    assert_eq!(limiter.peek("user_a"), d, "peek consumed nothing");
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.sweep(), 0, "user_a is active");

    // Clones share one time: the limiter reads the time of the clone it was given.
    clock.advance(Duration::from_millis(1500));
    assert_eq!(clock.now(), ms(1500));
    // 1.5 s: the 6 units of slot [0 s, 1 s) weigh 6 × ½ = 3 in the 1 s window.
    assert_eq!(limiter.peek("user_a").remaining(), 10 - 3 - 1);

    assert!(limiter.reset("user_a"));
    assert!(!limiter.reset("user_a"));
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.peek("user_a").remaining(), 9);
    assert_eq!(limiter.check(&String::from("user_a")).remaining(), 9, "&String works as well");

    let l: Limit = "120/min".parse()?;
    assert_eq!(l, Limit::per_minute(120));
    Ok(())
}

#[test]
fn limit_strings_parse_to_the_constructors_and_display_round_trips() -> Result<(), ConfigError> {
    let cases = [
        ("120/min", Limit::per_minute(120), "120/min"),
        ("10/s", Limit::per_second(10), "10/s"),
        ("240/h", Limit::per_hour(240), "240/h"),
        ("500/15min", Limit::new(500, secs(900)), "500/15min"),
        ("240/h@1min", Limit::new(240, secs(3600)).precision(secs(60)), "240/h"),
        ("240/h@10min", Limit::per_hour(240).precision(secs(600)), "240/h@10min"),
        ("60/min strict", Limit::per_minute(60).strict(), "60/min strict"),
        ("5/2s@500ms", Limit::new(5, secs(2)).precision(ms(500)), "5/2s@500ms"),
    ];
    for (text, want, canonical) in cases {
        let got: Limit = text.parse()?;
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string(), canonical, "{text}");
        assert_eq!(got.to_string().parse::<Limit>()?, got, "{text} -> {got}");
    }
    let l: Limit = "500/15min".parse()?;
    assert_eq!((l.max(), l.window(), l.get_precision(), l.slots()), (500, secs(900), secs(15), 60));
    assert_eq!(l.accuracy(), Accuracy::Interpolated);
    assert_eq!("60/min strict".parse::<Limit>()?.accuracy(), Accuracy::Strict);
    assert_eq!(Limit::per_minute(1).get_precision(), secs(1));
    assert_eq!(Limit::per_hour(1).get_precision(), secs(60));
    Ok(())
}

#[test]
fn seed_article_worked_example() {
    // 500/min in ONE 60 s slot: the two-bucket estimate.
    let (clock, limiter) = manual::<u64>(&[Limit::per_minute(500).precision(secs(60))]);
    clock.set(secs(10));
    assert!(limiter.check_n(&1, 400).is_allowed(), "400 in the previous minute");
    // (At 100 s the previous minute still weighs 400 × 20/60, so 250 fit.)
    clock.set(secs(60 + 40));
    assert!(limiter.check_n(&1, 250).is_allowed(), "250 so far in this one");
    clock.set(secs(60 + 45));
    // 250 + 400 × 15/60 = 350.
    assert_eq!(limiter.peek(&1).remaining(), 149);
    let d = limiter.check(&1);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 149);
    // 351 are counted now: exactly 149 more fit, not 150.
    assert_eq!(limiter.check_n(&1, 150).denial(), Some(Denial::Limit(0)));
    let d = limiter.check_n(&1, 149);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
}

#[test]
fn strict_never_admits_more_than_max_in_any_window() {
    let (clock, limiter) = manual::<u64>(&[Limit::per_minute(60).strict()]);
    let mut log = Vec::new();
    // Bursts just before, at and just after every second boundary, and in the middle.
    for second in 0..200u64 {
        for at in [second * 1000, second * 1000 + 1, second * 1000 + 500, second * 1000 + 999] {
            clock.set(ms(at));
            for _ in 0..70 {
                if limiter.check(&1).is_allowed() {
                    log.push(nanos(clock.now()));
                }
            }
        }
    }
    assert_eq!(densest(&log, nanos(secs(60))), 60);
    // Strict gives `max` per `window + precision` to a steady sender: 3 full cycles of 61 s
    // and the start of a fourth (admitted at 183 s and after) fit into 200 s.
    assert_eq!(log.len(), 4 * 60, "admitted in 200 s");
}

#[test]
fn interpolated_worst_case_exceeds_max_but_stays_below_twice_max() {
    for (limit, want) in [(Limit::per_minute(60), 119), (Limit::per_minute(60).strict(), 60)] {
        let (clock, limiter) = manual::<u64>(&[limit]);
        // A slot's whole budget at its very end...
        clock.set(ms(59_999));
        let first = hammer(&limiter, 1, 100, 1);
        assert_eq!(first, 60, "{limit}");
        // ...then a burst one window later: the old slot weighs 60 × 1/1000 = 0.06.
        clock.set(ms(119_999));
        let second = hammer(&limiter, 1, 100, 1);
        // Both bursts lie in the closed interval [59.999 s, 119.999 s] of length 60 s.
        assert_eq!(first + second, want, "{limit}");
        assert!(first + second < 120, "{limit}");
    }
}

#[test]
fn only_admitted_requests_count() {
    let (clock, limiter) = manual::<u64>(&[Limit::per_second(10), Limit::per_minute(120)]);
    let first = limiter.check_n(&1, 0);
    assert_eq!((first.remaining(), first.tightest_limit()), (10, 0));
    assert_eq!(hammer(&limiter, 1, 1000, 1), 10, "1000 in one instant: the 1 s limit admits 10");
    let refused = limiter.check(&1);
    assert_eq!(refused.denial(), Some(Denial::Limit(0)));
    assert_eq!(refused.remaining(), 0);
    assert_eq!(refused.retry_after(), Some(ms(1100)));
    // Every 2 s the 1 s window is empty again; the minute has 110 left for 11 more bursts.
    for burst in 1..12u64 {
        clock.set(secs(2 * burst));
        let peek = limiter.peek(&1);
        assert_eq!(peek.remaining(), (9_u64).min(120 - 10 * burst - 1), "burst {burst}");
        assert_eq!(hammer(&limiter, 1, 1000, 1), 10, "burst {burst}");
    }
    clock.set(secs(24));
    let peek = limiter.peek(&1);
    assert_eq!(peek.denial(), Some(Denial::Limit(1)), "the minute is full now");
    assert_eq!(hammer(&limiter, 1, 1000, 1), 0);
    // 11 × 1000 refused requests burnt nothing: slot 0's 10 units fade out of the minute
    // from 60 s: 110 + 10 × (1 − f) ≤ 119 at f = 0.1.
    assert_eq!(limiter.check(&1).retry_after(), Some(ms(36_100)));
}

#[test]
fn cost_zero_and_peek_consume_nothing_and_insert_no_key() {
    let (_clock, limiter) = manual::<String>(&[Limit::per_second(10), Limit::per_minute(4)]);
    let d = limiter.check_n("k", 0);
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.tightest_limit(), d.retry_after()), (4, 1, None));
    let d = limiter.peek("k");
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.tightest_limit()), (3, 1), "as if a cost-1 request were admitted");
    assert_eq!(limiter.len(), 0, "neither cost 0 nor peek inserts a key");
    assert!(limiter.is_empty());

    assert_eq!(limiter.check_n("k", 3).remaining(), 1);
    assert_eq!(limiter.len(), 1);
    for _ in 0..5 {
        assert_eq!(limiter.check_n("k", 0).remaining(), 1);
        assert_eq!(limiter.peek("k").remaining(), 0);
    }
    // Peek's "as if admitted" is exactly what the check then says.
    let peek = limiter.peek("k");
    let check = limiter.check("k");
    assert_eq!(peek, check);
    let peek = limiter.peek("k");
    assert_eq!(peek.denial(), Some(Denial::Limit(1)));
    assert_eq!(peek.remaining(), 0);
    assert_eq!(peek, limiter.check("k"), "a refused check and a refused peek agree");
    assert!(limiter.check_n("k", 0).is_allowed(), "cost 0 always fits");
}

#[test]
fn cost_above_a_max_can_never_pass() {
    let (_clock, limiter) = manual::<u64>(&[Limit::per_second(10), Limit::per_minute(4)]);
    assert!(limiter.check(&1).is_allowed());
    for (cost, index) in [(5, 1), (10, 1), (11, 0), (1_000, 0), (u64::from(u32::MAX) + 1, 0), (u64::MAX, 0)] {
        for key in [1, 2] {
            let d = limiter.check_n(&key, cost);
            assert!(!d.is_allowed(), "cost {cost}");
            assert_eq!(d.denial(), Some(Denial::CostTooLarge(index)), "cost {cost}");
            assert_eq!(d.retry_after(), None, "cost {cost}");
            assert_eq!(d.tightest_limit(), index, "cost {cost}");
            // The room the key has (cost 0), unchanged by the refusal.
            assert_eq!(d.remaining(), if key == 1 { 3 } else { 4 }, "cost {cost}, key {key}");
        }
    }
    assert_eq!(limiter.len(), 1, "no key inserted by a refusal");
    assert_eq!(limiter.check_n(&1, 3).remaining(), 0, "nothing consumed by the refusals");
}

/// Every denial in a deterministic random traffic script: waiting exactly `retry_after`
/// admits the same request, waiting 1 ns less does not.
#[test]
fn retry_after_is_exact_to_the_nanosecond() {
    let configs: Vec<Vec<Limit>> = vec![
        vec![Limit::per_second(3)],
        vec![Limit::per_second(3).strict()],
        vec!["5/2s@500ms".parse().unwrap()],
        vec!["5/2s@500ms strict".parse().unwrap()],
        vec!["10/s@100ms".parse().unwrap(), "7/min@10s".parse().unwrap()],
        vec!["7/min@10s strict".parse().unwrap(), "10/s@100ms".parse().unwrap()],
        vec!["4/3s@1s strict".parse().unwrap(), "10/s@100ms strict".parse().unwrap()],
        vec![Limit::per_second(10), Limit::per_minute(120), "240/h@1min".parse().unwrap()],
        vec![Limit::per_minute(500).precision(secs(60))],
    ];
    let mut rng = Rng(7);
    let mut verified = 0;
    for limits in &configs {
        let min_max = limits.iter().map(Limit::max).min().unwrap();
        for cost in [1, 2, 3, min_max] {
            let (clock, limiter) = manual::<u64>(limits);
            for _ in 0..300 {
                clock.advance(match rng.below(4) {
                    0 => Duration::ZERO,
                    1 => Duration::from_nanos(rng.below(1_000_000)),
                    2 => ms(rng.below(300)),
                    _ => ms(rng.below(5_000)),
                });
                let d = limiter.check_n(&1, cost);
                if d.is_allowed() {
                    assert_eq!(d.retry_after(), None);
                    continue;
                }
                let Some(Denial::Limit(index)) = d.denial() else { panic!("{limits:?}: {d:?}") };
                assert!(index < limits.len());
                assert_eq!(d.tightest_limit(), index);
                let wait = d.retry_after().unwrap_or_else(|| panic!("{limits:?}: {d:?}"));
                assert!(wait > Duration::ZERO, "{limits:?}: {d:?}");
                let at = clock.now();
                clock.advance(wait - NS);
                let early = limiter.check_n(&1, cost);
                assert_eq!(early.denial(), d.denial(), "{limits:?} cost {cost} at {at:?}+{wait:?}-1ns");
                assert_eq!(early.retry_after(), Some(NS), "{limits:?} cost {cost} at {at:?}+{wait:?}-1ns");
                clock.advance(NS);
                let on_time = limiter.check_n(&1, cost);
                assert!(on_time.is_allowed(), "{limits:?} cost {cost} at {at:?}+{wait:?}: {on_time:?}");
                verified += 1;
            }
        }
    }
    assert!(verified > 500, "only {verified} denials verified");
}

#[test]
fn a_denial_names_the_limit_that_frees_up_last() {
    let cases: [(&[Limit], usize, usize); 4] = [
        (&[Limit::per_second(3), Limit::per_minute(100)], 3, 0),
        (&[Limit::per_second(10), Limit::per_minute(3)], 3, 1),
        // Both refuse; the minute frees up later than the second.
        (&[Limit::per_second(2), Limit::per_minute(2)], 2, 1),
        (&[Limit::per_minute(2), Limit::per_second(2)], 2, 0),
    ];
    for (limits, fill, index) in cases {
        let (_clock, limiter) = manual::<u64>(limits);
        assert_eq!(hammer(&limiter, 1, fill, 1), fill);
        let d = limiter.check(&1);
        assert_eq!(d.denial(), Some(Denial::Limit(index)), "{limits:?}");
        assert_eq!(d.tightest_limit(), index, "{limits:?}");
        let window = limits[index].window();
        let wait = d.retry_after().unwrap();
        assert!(wait > window / 2 && wait <= window * 2, "{limits:?}: {wait:?}");
    }
}

#[test]
fn time_never_runs_backwards() {
    let (clock, limiter) = manual::<u64>(&[Limit::per_second(10).strict()]);
    assert_eq!(hammer(&limiter, 1, 20, 1), 10);
    // Strict: slot [0 s, 1 s) counts whole until 2 s.
    clock.set(secs(1));
    let refused = limiter.check(&1);
    assert_eq!(refused.retry_after(), Some(secs(1)));
    clock.set(secs(2));
    let before = limiter.peek(&1);
    assert!(before.is_allowed());
    clock.set(ms(1500));
    assert_eq!(clock.now(), secs(2), "set to an earlier time is ignored");
    clock.clone().set(Duration::ZERO);
    assert_eq!(clock.now(), secs(2));
    assert_eq!(limiter.peek(&1), before, "the limiter still sees 2 s");
    assert_eq!(hammer(&limiter, 1, 20, 1), 10);
    clock.set(ms(2500));
    assert_eq!(clock.now(), ms(2500), "a later time is taken");
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), Duration::from_nanos(1 << 62), "advance stops at the end of time");
    clock.set(Duration::MAX);
    assert_eq!(clock.now(), Duration::from_nanos(1 << 62), "so does set");
    clock.set(secs(3));
    assert_eq!(clock.now(), Duration::from_nanos(1 << 62));
}

#[test]
fn max_keys_refuses_new_keys_and_leaves_held_ones_alone() {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(3))
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(hammer(&limiter, 1, 2, 1), 2);
    assert_eq!(hammer(&limiter, 2, 1, 1), 1);
    assert_eq!(limiter.len(), 2);
    for _ in 0..3 {
        let d = limiter.check(&3);
        assert!(!d.is_allowed());
        assert_eq!((d.denial(), d.retry_after(), d.remaining()), (Some(Denial::TooManyKeys), None, 0));
        assert_eq!(limiter.check_n(&4, 2).denial(), Some(Denial::TooManyKeys));
    }
    assert_eq!(limiter.len(), 2);
    // Held keys keep their exact counts: 1 left for key 1, 2 for key 2.
    assert_eq!(limiter.check(&1).remaining(), 0);
    assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0)));
    assert_eq!(limiter.check_n(&2, 2).remaining(), 0);
    assert_eq!(limiter.check(&3).denial(), Some(Denial::TooManyKeys));

    // Expiry is window + slot = 2 s after the last admission; a sweep frees the room.
    clock.set(ms(1999));
    assert_eq!(limiter.sweep(), 0);
    assert_eq!(limiter.check(&3).denial(), Some(Denial::TooManyKeys));
    clock.set(secs(2));
    assert_eq!(limiter.sweep(), 2);
    assert_eq!(limiter.len(), 0);
    assert!(limiter.check(&3).is_allowed());
    assert!(limiter.check(&4).is_allowed());
    assert_eq!(limiter.check(&5).denial(), Some(Denial::TooManyKeys));
    // reset() also frees room.
    assert!(limiter.reset(&3));
    assert!(limiter.check(&5).is_allowed());
    assert_eq!(limiter.len(), 2);
}

/// `peek` promises to answer "would a request of cost 1 be admitted now?", but for a new key
/// when the table is full it says yes while the check refuses with `TooManyKeys`.
#[test]
fn peek_predicts_too_many_keys() {
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(3))
        .max_keys(1)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    assert!(limiter.check(&1).is_allowed());
    let peek = limiter.peek(&2);
    let check = limiter.check(&2);
    assert_eq!(check.denial(), Some(Denial::TooManyKeys));
    assert_eq!(peek.is_allowed(), check.is_allowed(), "peek {peek:?} vs check {check:?}");
}

#[test]
fn sweep_evicts_idle_keys_only_and_returns_how_many() {
    // Expiry: the longest window plus one of its slots = 61 s.
    let (clock, limiter) = manual::<u64>(&[Limit::per_second(10), Limit::per_minute(20)]);
    assert_eq!(hammer(&limiter, 1, 5, 1), 5);
    assert_eq!(hammer(&limiter, 2, 5, 1), 5);
    clock.set(secs(30));
    assert_eq!(hammer(&limiter, 2, 5, 1), 5);
    assert_eq!(hammer(&limiter, 3, 1, 1), 1);
    assert_eq!(limiter.sweep(), 0);
    clock.set(ms(60_999));
    assert_eq!(limiter.sweep(), 0, "key 1's units are still partly in the minute window");
    // 5 units at 0 s weigh 5/1000 in the minute 60.999 s: min(10, floor(20 - 0.005)).
    assert_eq!(limiter.check_n(&1, 0).remaining(), 10);
    clock.set(secs(61));
    assert_eq!(limiter.sweep(), 1, "key 1 only");
    assert_eq!(limiter.len(), 2);
    assert!(!limiter.reset(&1), "key 1 was evicted");
    // Key 2 is kept with its 5 units of 30 s (slot 0 has just left the minute window).
    assert_eq!(limiter.check_n(&2, 10).remaining(), 0);
    clock.set(secs(63));
    assert_eq!(limiter.check_n(&2, 5).remaining(), 0, "20 - 5 - 10 - 5 in the minute");
    assert_eq!(limiter.check(&2).denial(), Some(Denial::Limit(1)));
    clock.set(secs(91));
    assert_eq!(limiter.sweep(), 1, "key 3 (idle since 30 s)");
    assert_eq!(limiter.sweep(), 0);
    clock.set(secs(3600));
    assert_eq!(limiter.sweep(), 1);
    assert!(limiter.is_empty());
}

/// Two limiters on one clock get the same traffic; one sweeps after every step, the other
/// never. Every decision must be the same.
#[test]
fn sweeping_changes_no_decision() {
    let limits =
        ["5/2s@500ms".parse::<Limit>().unwrap(), "7/min@10s strict".parse().unwrap(), Limit::per_second(3)];
    let clock = ManualClock::new();
    let build = || {
        let mut builder = Limiter::<u64>::builder().clock(clock.clone());
        for l in limits {
            builder = builder.limit(l);
        }
        builder.build().unwrap()
    };
    let (swept, kept) = (build(), build());
    let mut rng = Rng(11);
    let mut evicted = 0;
    for step in 0..5_000 {
        clock.advance(match rng.below(10) {
            0 => ms(rng.below(200_000)),
            1..=3 => ms(rng.below(5_000)),
            _ => ms(rng.below(300)),
        });
        let key = rng.below(6);
        let cost = rng.below(5);
        let (a, b) = match rng.below(3) {
            0 => (swept.peek(&key), kept.peek(&key)),
            _ => (swept.check_n(&key, cost), kept.check_n(&key, cost)),
        };
        assert_eq!(a, b, "step {step}, key {key}, cost {cost}, at {:?}", clock.now());
        evicted += swept.sweep();
        assert!(swept.len() <= kept.len());
    }
    assert!(evicted > 100, "only {evicted} evictions: the test does not exercise eviction");
}

#[test]
fn reset_forgets_a_key_and_len_counts_keys() {
    let (_clock, limiter) = manual::<String>(&[Limit::per_second(2)]);
    assert_eq!(limiter.len(), 0);
    assert!(!limiter.reset("a"));
    for key in ["a", "b", "c"] {
        assert!(limiter.check(key).is_allowed());
        assert!(limiter.check(key).is_allowed());
        assert!(!limiter.check(key).is_allowed());
    }
    assert_eq!(limiter.len(), 3);
    assert!(limiter.reset("b"));
    assert_eq!(limiter.len(), 2);
    assert!(!limiter.reset("b"));
    assert_eq!(limiter.len(), 2);
    assert_eq!(limiter.check("b").remaining(), 1, "b starts empty");
    assert!(!limiter.check("a").is_allowed(), "a is untouched");
    assert_eq!(limiter.len(), 3);
    assert!(format!("{limiter:?}").contains("keys: 3"));
}

#[test]
fn every_bad_configuration_is_a_config_error_that_says_what_is_wrong() {
    fn build(limits: &[Limit]) -> Result<Limiter<u64>, ConfigError> {
        let mut builder = Limiter::<u64>::builder().clock(ManualClock::new());
        for l in limits {
            builder = builder.limit(*l);
        }
        builder.build()
    }
    fn expect(result: Result<Limiter<u64>, ConfigError>, check: fn(&ConfigError) -> bool, words: &str) {
        let err = result.expect_err("configuration accepted");
        assert!(check(&err), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(words), "{err:?} displays as {text:?}, without {words:?}");
    }
    let one_s = Limit::per_second(1);
    expect(build(&[]), |e| *e == ConfigError::NoLimits, "no limits");
    expect(build(&[Limit::per_second(0)]), |e| matches!(e, ConfigError::ZeroMax { .. }), "max is 0");
    expect(
        build(&[Limit::per_second(u64::from(u32::MAX) + 1)]),
        |e| matches!(e, ConfigError::MaxTooLarge { most: 4_294_967_295, .. }),
        "larger than 4294967295",
    );
    assert!(build(&[Limit::per_second(u64::from(u32::MAX))]).is_ok(), "2^32 - 1 is allowed");
    expect(
        build(&[Limit::new(1, Duration::ZERO)]),
        |e| matches!(e, ConfigError::ZeroWindow { .. }),
        "window is zero",
    );
    expect(
        build(&[one_s.precision(Duration::ZERO)]),
        |e| matches!(e, ConfigError::ZeroPrecision { .. }),
        "precision is zero",
    );
    expect(
        build(&[one_s.precision(secs(2))]),
        |e| matches!(e, ConfigError::PrecisionLongerThanWindow { .. }),
        "longer than the window",
    );
    expect(
        build(&[Limit::per_minute(1).precision(secs(7))]),
        |e| matches!(e, ConfigError::PrecisionDoesNotDivideWindow { .. }),
        "not a whole number of slots",
    );
    expect(
        build(&[Limit::new(1, Duration::from_micros(1500))]),
        |e| matches!(e, ConfigError::NotWholeMilliseconds { .. }),
        "whole milliseconds",
    );
    expect(
        build(&[Limit::per_hour(1).precision(ms(999))]),
        |e| matches!(e, ConfigError::PrecisionDoesNotDivideWindow { .. }),
        "not a whole number of slots",
    );
    expect(
        build(&[Limit::new(1, secs(3601)).precision(secs(1))]),
        |e| matches!(e, ConfigError::TooManySlots { slots: 3601, most: 3600, .. }),
        "3601 slots",
    );
    assert!(build(&[Limit::per_hour(1).precision(secs(1))]).is_ok(), "3600 slots are allowed");
    expect(
        build(&[one_s; MAX_LIMITS + 1]),
        |e| matches!(e, ConfigError::TooManyLimits { given: 9, most: 8 }),
        "9 limits",
    );
    assert!(build(&[one_s; MAX_LIMITS]).is_ok(), "8 limits are allowed");
    // Slot tags: the longest window may span at most 2^30 of the finest slots.
    expect(
        build(&[Limit::new(1, ms(1)), Limit::new(1, secs(2_000_000)).precision(secs(1_000))]),
        |e| matches!(e, ConfigError::SpanTooWide { .. }),
        "2^30",
    );
    expect(
        Limiter::<u64>::builder().limit(one_s).max_keys(0).build(),
        |e| *e == ConfigError::ZeroMaxKeys,
        "max_keys is 0",
    );
    expect(
        Limiter::<u64>::builder().limit(one_s).sweep_interval(Duration::ZERO).build(),
        |e| *e == ConfigError::ZeroSweepInterval,
        "sweep interval is zero",
    );
    // A burst sizes GCRA's bucket only, and must be 1 to 2^32 − 1 units.
    expect(
        build(&[Limit::per_second(10).burst(50)]),
        |e| matches!(e, ConfigError::BurstNeedsGcra { .. }),
        "GCRA's bucket",
    );
    let gcra = |limit: Limit| Limiter::<u64>::builder().algorithm(Algorithm::Gcra).limit(limit).build();
    expect(
        gcra(Limit::per_second(10).burst(0)),
        |e| matches!(e, ConfigError::ZeroBurst { .. }),
        "burst of 0",
    );
    expect(
        gcra(Limit::per_second(10).burst(MAX_UNITS + 1)),
        |e| matches!(e, ConfigError::BurstTooLarge { most: MAX_UNITS, .. }),
        "burst is larger",
    );
    assert!(gcra(Limit::per_second(10).burst(MAX_UNITS)).is_ok());
    for text in ["10/s burst 50", "100/min burst 5 strict", "1/h@10min burst 3"] {
        let limit: Limit = text.parse().unwrap();
        assert_eq!(limit.to_string(), text);
        assert_eq!(limit.to_string().parse::<Limit>().unwrap(), limit);
    }
    assert!(matches!("10/s burst many".parse::<Limit>(), Err(ConfigError::Parse { .. })));
    assert!(matches!("10/s burst 0".parse::<Limit>(), Err(ConfigError::ZeroBurst { .. })));
    for tick in [Duration::ZERO, Duration::from_nanos(1), Duration::from_micros(49)] {
        expect(
            Limiter::<u64>::builder().limit(one_s).clock_tick(tick).build(),
            |e| matches!(e, ConfigError::ClockTickTooShort { least, .. } if *least == Duration::from_micros(50)),
            "shorter than the shortest the ticker keeps, 50µs",
        );
    }
    assert!(Limiter::<u64>::builder().limit(one_s).clock_tick(Duration::from_micros(50)).build().is_ok());
    // The first bad limit is reported, whatever its place.
    expect(
        build(&[one_s, Limit::per_minute(0)]),
        |e| matches!(e, ConfigError::ZeroMax { limit } if limit.window() == secs(60)),
        "max is 0",
    );
}

#[test]
fn bad_limit_strings_are_config_errors() {
    for text in [
        "",
        "abc",
        "10/",
        "/s",
        "10/xyz",
        "-1/s",
        "10/s@7s",
        "1.5/s",
        "10/s strict strict",
        "10/sstrict",
        " ",
    ] {
        match text.parse::<Limit>() {
            Ok(l) => panic!("{text:?} parsed as {l:?}"),
            Err(e) => {
                let shown = e.to_string();
                assert!(!shown.is_empty(), "{text:?}");
                if let ConfigError::Parse { input, reason } = &e {
                    assert_eq!(input, text);
                    assert!(!reason.is_empty());
                    assert!(shown.contains("cannot parse"), "{shown}");
                }
            }
        }
    }
    assert!(matches!("10/s@7s".parse::<Limit>(), Err(ConfigError::PrecisionLongerThanWindow { .. })));
    assert!(matches!("10/xyz".parse::<Limit>(), Err(ConfigError::Parse { .. })));
    assert!(matches!("-1/s".parse::<Limit>(), Err(ConfigError::Parse { .. })));
    assert!(matches!("10/s@0s".parse::<Limit>(), Err(ConfigError::ZeroPrecision { .. })));
    assert!(matches!("10/0s".parse::<Limit>(), Err(ConfigError::ZeroWindow { .. })));
    assert!(matches!("0/s".parse::<Limit>(), Err(ConfigError::ZeroMax { .. })));
}

#[test]
fn limiters_cross_threads_with_any_hashable_key() {
    fn shareable<T: Send + Sync>(_: &T) {}
    let v4 = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);

    let (_c, by_id) = manual::<u64>(&[Limit::per_second(2)]);
    let (_c, by_ip) = manual::<IpAddr>(&[Limit::per_second(2)]);
    let (_c, by_socket) = manual::<(IpAddr, u16)>(&[Limit::per_second(2)]);
    let (_c, by_name) = manual::<String>(&[Limit::per_second(2)]);
    shareable(&by_id);
    shareable(&by_ip);
    shareable(&by_socket);
    shareable(&by_name);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!((0..3).filter(|_| by_id.check(&7).is_allowed()).count(), 2);
            assert!(by_id.check(&8).is_allowed());
        });
        s.spawn(|| {
            assert_eq!((0..3).filter(|_| by_ip.check(&v4).is_allowed()).count(), 2);
            assert!(by_ip.check(&v6).is_allowed());
        });
        s.spawn(|| {
            assert_eq!((0..3).filter(|_| by_socket.check(&(v4, 443)).is_allowed()).count(), 2);
            assert!(by_socket.check(&(v4, 80)).is_allowed());
        });
        s.spawn(|| {
            assert_eq!((0..3).filter(|_| by_name.check("203.0.113.7").is_allowed()).count(), 2);
            assert!(by_name.check("2001:db8::1").is_allowed());
        });
    });
    assert_eq!([by_id.len(), by_ip.len(), by_socket.len(), by_name.len()], [2, 2, 2, 2]);
    // A limiter moves into a thread too (with the real clock and its threads).
    let real = Limiter::<String>::builder().limit(Limit::per_minute(1)).build().unwrap();
    let joined = std::thread::spawn(move || real.check("x").is_allowed() && !real.check("x").is_allowed());
    assert!(joined.join().unwrap());
}

fn any_span() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..5_000).prop_map(Duration::from_millis),
        (1u64..100).prop_map(|n| Duration::from_secs(n * 60)),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_secs),
        Just(Duration::MAX),
    ]
}

fn any_cost() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..20, Just(u64::from(u32::MAX)), Just(u64::MAX), any::<u64>()]
}

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(200),
        // A failing case is saved in tests/api.regressions and replayed first next time.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// No public function panics: odd strings, odd limits, odd costs, odd clock moves, under
    /// every algorithm, through `check_n`, `record` and `check_all`.
    #[test]
    fn nothing_panics(
        text in "\\PC{0,16}|[0-9]{1,22}/[0-9]{0,22}(ms|s|min|h|d|x)?(@[0-9]{0,8}(ms|s|min|h|d))?( strict)?",
        raw in prop::collection::vec(
            (prop_oneof![1u64..12, 0..=u64::from(u32::MAX) + 1], any_span(), prop::option::of(any_span()), any::<bool>()),
            0..4,
        ),
        algorithm in prop::sample::select(ALGORITHMS.to_vec()),
        ops in prop::collection::vec((any_span(), any_cost(), 0u8..4, 0u8..3), 0..40),
    ) {
        if let Ok(limit) = text.parse::<Limit>() {
            prop_assert!(limit.validate().is_ok());
            prop_assert_eq!(limit.to_string().parse::<Limit>(), Ok(limit));
        }
        let limits: Vec<Limit> = raw
            .iter()
            .map(|&(max, window, precision, strict)| {
                let l = Limit::new(max, window);
                let l = precision.map_or(l, |p| l.precision(p));
                if strict { l.strict() } else { l }
            })
            .collect();
        for l in &limits {
            let _ = (l.slots(), l.validate(), l.to_string());
        }
        let clock = ManualClock::new();
        let mut builder = Limiter::<u8>::builder().clock(clock.clone()).algorithm(algorithm).max_keys(2);
        for l in &limits {
            builder = builder.limit(*l);
        }
        let Ok(limiter) = builder.build() else { return Ok(()) };
        for (advance, cost, key, op) in ops {
            clock.advance(advance);
            match op {
                0 => {}
                1 => {
                    let _ = limiter.record(&key, cost);
                }
                _ => {
                    let _ = limiter.check_all(&[&key, &(key ^ 1)], cost);
                }
            }
            let d = limiter.check_n(&key, cost);
            match d.denial() {
                None => prop_assert_eq!(d.retry_after(), None),
                Some(Denial::Limit(i)) => prop_assert!(i < limits.len() && d.retry_after().is_some()),
                Some(Denial::CostTooLarge(i)) => {
                    prop_assert!(cost > limits[i].max());
                    prop_assert_eq!(d.retry_after(), None);
                }
                Some(Denial::TooManyKeys) => prop_assert_eq!(d.retry_after(), None),
                Some(other) => prop_assert!(false, "unknown denial {:?}", other),
            }
            let _ = (limiter.peek(&key), limiter.sweep(), limiter.len());
            if cost % 7 == 3 {
                let _ = limiter.reset(&key);
            }
        }
    }
}

/// `record` takes any cost (units admitted elsewhere): counts saturate at their 32-bit
/// limit instead of overflowing (a second huge record used to wrap a full count back below
/// `max`), and the sliding log keeps at most its newest `MAX_LOG_UNITS` entries, which
/// changes no decision (a huge cost used to be a huge allocation, and `u64::MAX` a length
/// that wrapped to an empty, dangling snapshot: a segfault in release builds).
#[test]
fn record_takes_any_cost_under_every_algorithm() {
    for algorithm in ALGORITHMS {
        for max in [1, 10, MAX_LOG_UNITS, MAX_UNITS] {
            let clock = ManualClock::new();
            let built = Limiter::<u64>::builder()
                .algorithm(algorithm)
                .limit(Limit::per_minute(max))
                .clock(clock.clone())
                .build();
            let Ok(limiter) = built else {
                assert!(algorithm == Algorithm::SlidingLog && max > MAX_LOG_UNITS);
                continue;
            };
            for cost in [u64::MAX, u64::MAX, 1 << 40, u64::from(u32::MAX) + 1, u64::MAX] {
                assert_eq!(limiter.record(&1, cost).remaining(), 0, "{algorithm:?} {max} {cost}");
                let d = limiter.check(&1);
                assert!(!d.is_allowed() && d.retry_after().is_some(), "{algorithm:?} {max} {cost}: {d:?}");
            }
            if algorithm == Algorithm::SlidingLog {
                // Its units leave the window exactly when they would have, all of them.
                assert_eq!(limiter.check(&1).retry_after(), Some(secs(60)), "{max}");
            }
            if algorithm != Algorithm::Gcra {
                // GCRA keeps recorded units until they have passed at the sustained rate.
                clock.advance(secs(121));
                assert!(limiter.check(&1).is_allowed(), "{algorithm:?} {max}");
            }
            clock.advance(Duration::MAX);
            // At the end of the clock (2^62 ns) every window has long passed; GCRA's recorded
            // units (u32::MAX a record at most, each one interval) have too, unless they add
            // up to more than the clock's 2^62 ns: then they outlast it and keep the key
            // refused, as they should.
            let interval = 60_000_000_000u64.div_ceil(max);
            let recorded = 5 * u128::from(u32::MAX) * u128::from(interval);
            let outlasting = algorithm == Algorithm::Gcra && recorded > 1 << 62;
            assert_eq!(limiter.check(&1).is_allowed(), !outlasting, "{algorithm:?} {max}");
        }
    }
}

/// The `tower` layer's `RateLimit-Policy` field states the longest window allowed in whole
/// seconds (rounding a window near `Duration::MAX` up used to overflow, before such windows
/// were refused: a panic in debug builds, and `w=0` in release builds).
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_layer_states_a_window_near_duration_max() {
    use axum::http::{Request, Response};
    use tower::{Layer, ServiceExt};

    let window = slidegate::MAX_WINDOW;
    let limiter = Limiter::<IpAddr>::builder()
        .limit(Limit::new(5, window).precision(window))
        .max_keys(10)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let layer = slidegate::tower::RateLimitLayer::new("huge", limiter, slidegate::tower::PeerIp).unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
    let mut request = Request::new(());
    request.extensions_mut().insert(std::net::SocketAddr::from(([127, 0, 0, 1], 9)));
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.headers()["ratelimit-policy"], "\"huge\";q=5;w=3153600000");
}

/// A stand-in for memcached on loopback: every `get` is answered with `reply(its first
/// key)`, every `incr` with 1. Returns its address.
#[cfg(feature = "memcached")]
async fn fake_memcached(reply: fn(&str) -> String) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = BufReader::new(stream);
                let mut line = String::new();
                while conn.read_line(&mut line).await.is_ok_and(|n| n > 0) {
                    let mut words = line.split_whitespace();
                    let answer = match words.next() {
                        Some("get") => reply(words.next().unwrap_or_default()),
                        Some("incr") => "1\r\n".to_owned(),
                        _ => "ERROR\r\n".to_owned(),
                    };
                    if conn.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

/// What a memcached server sends is input too: a counter at `u64::MAX` is refused (adding
/// the cost to it overflowed), a value longer than any item is an error that the fallback
/// answers (its length plus 2 overflowed, or sized a huge allocation), and a window of
/// `MAX_WINDOW` (100 years) saturates in the counters' TTL and in `retry_after` (both overflowed).
#[cfg(feature = "memcached")]
#[tokio::test]
async fn memcached_replies_and_windows_out_of_range() {
    use slidegate::memcached::{DecidedBy, Fallback, MemcachedLimiter};

    let full = fake_memcached(|key| format!("VALUE {key} 0 20\r\n{}\r\nEND\r\n", u64::MAX)).await;
    let endless = fake_memcached(|key| format!("VALUE {key} 0 {}\r\nX", usize::MAX)).await;
    let empty = fake_memcached(|_| "END\r\n".to_owned()).await;
    for limit in [Limit::per_minute(10), Limit::new(10, slidegate::MAX_WINDOW)] {
        let limiter = |addr: &str| {
            MemcachedLimiter::<u64>::builder()
                .addr(addr)
                .limit(limit)
                .clock(ManualClock::new())
                .timeout(secs(10))
                .fallback(Fallback::Open)
                .build()
                .unwrap()
        };
        let d = limiter(&full).check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed(), d.remaining()), (DecidedBy::Server, false, 0), "{limit}");
        assert!(d.retry_after().is_some(), "{limit}");
        let d = limiter(&endless).check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::FailOpen, true), "{limit}");
        let d = limiter(&empty).check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed(), d.remaining()), (DecidedBy::Server, true, 9), "{limit}");
    }
}

/// Shadow mode admits everything, reports what it would have refused, and consumes
/// nothing for the shadow denials: once the window has passed, exactly `max` pass
/// unshadowed again.
#[test]
fn shadow_mode_reports_denials_without_enforcing_or_consuming() {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(3).strict())
        .shadow(true)
        .clock(clock.clone())
        .build()
        .unwrap();
    for round in 0..3 {
        let decisions: Vec<Decision> = (0..10).map(|_| limiter.check(&1)).collect();
        assert!(decisions.iter().all(Decision::is_allowed), "round {round}: {decisions:?}");
        let shadowed = decisions.iter().filter(|d| d.shadow_denial() == Some(Denial::Limit(0))).count();
        assert_eq!(shadowed, 7, "round {round}: {decisions:?}");
        assert!(decisions[..3].iter().all(|d| d.shadow_denial().is_none()));
        assert!(decisions.iter().all(|d| d.denial().is_none() && d.retry_after().is_none()));
        // A strict 3/s holds its units for a window and a slot.
        clock.advance(Duration::from_secs(2));
    }
    // A cost that can never fit is shadowed too; several keys together as well.
    assert_eq!(limiter.check_n(&2, 4).shadow_denial(), Some(Denial::CostTooLarge(0)));
    let together = limiter.check_all(&[&1, &3], 4).unwrap();
    assert!(together.is_allowed() && together.shadow_denial().is_some());
    // Enforcing limiters never shadow.
    let enforcing = Limiter::<u64>::builder().limit(Limit::per_second(1)).clock(clock).build().unwrap();
    let _ = enforcing.check(&1);
    let refused = enforcing.check(&1);
    assert_eq!((refused.is_allowed(), refused.shadow_denial()), (false, None));
}

/// The README's first lines: a one-slot window (`per_second`'s default) can pass up to
/// twice its limit in one window across a slot edge, and a strict one never more than its
/// limit. 100/s; 100 units at the end of slot 0, then a request every millisecond: the
/// densest closed second holds 199 admissions interpolated (fewer than 200), 100 strict.
#[test]
fn a_one_slot_window_passes_at_most_twice_its_limit_across_an_edge_and_strict_none() {
    for (strict, most) in [(false, 199), (true, 100)] {
        let clock = ManualClock::new();
        let limit = if strict { Limit::per_second(100).strict() } else { Limit::per_second(100) };
        let limiter = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build().unwrap();
        clock.set(ms(999));
        let mut log = Vec::new();
        for _ in 0..100 {
            assert!(limiter.check(&1).is_allowed());
            log.push(nanos(clock.now()));
        }
        for _ in 0..3000 {
            clock.advance(ms(1));
            if limiter.check(&1).is_allowed() {
                log.push(nanos(clock.now()));
            }
        }
        assert_eq!(densest(&log, nanos(secs(1))), most, "strict: {strict}");
    }
}

/// `limit_of` names the limit a decision is about in the key's own policy, held or not,
/// and nothing for a full table.
#[test]
fn limit_of_names_the_refusing_limit_of_the_keys_policy() {
    use slidegate::PolicyConfig;
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .policy("free", PolicyConfig::new([Limit::per_second(10), Limit::per_minute(2)]))
        .policy("paid", PolicyConfig::new([Limit::per_second(1), Limit::per_hour(100)]))
        .max_keys(2)
        .clock(clock)
        .build()
        .unwrap();
    limiter.set_policy(&2, "paid").unwrap();
    let _ = (limiter.check(&1), limiter.check(&1));
    let refused = limiter.check(&1);
    assert_eq!(refused.denial(), Some(Denial::Limit(1)));
    assert_eq!(limiter.limit_of(&1, &refused), Some(Limit::per_minute(2)));
    let _ = limiter.check(&2);
    let refused = limiter.check(&2);
    assert_eq!(refused.denial(), Some(Denial::Limit(0)));
    assert_eq!(limiter.limit_of(&2, &refused), Some(Limit::per_second(1)));
    let full = limiter.check(&3);
    assert_eq!(full.denial(), Some(Denial::TooManyKeys));
    assert_eq!(limiter.limit_of(&3, &full), None);
    // A key not held: the limit of the policy it would get (free, the default).
    let about_limit_1 = limiter.check(&1);
    assert_eq!(limiter.limit_of(&9, &about_limit_1), Some(Limit::per_minute(2)));
}
