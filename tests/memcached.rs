//! The two-bucket estimate on a real memcached (loopback; see `support/servers.rs`): the
//! seed article's worked example; the same decisions as the in-process one-slot sliding
//! window on random sequential traffic; the documented contention bound (checks in flight
//! at once may all pass); keys that differ never share a counter (escaped, or hashed when
//! too long); concurrent checks run on several pooled connections; the fallback when
//! memcached goes away; and a throughput figure (64 checks in flight over 1,000 keys).
//!
//! A `libtest-mimic` binary (`harness = false`): a test whose server is missing reports
//! `ignored` with the reason, or fails under `SLIDEGATE_REQUIRE_SERVERS` (see
//! `support/servers.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod rng;
    pub mod servers;
}
use support::rng::Rng;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slidegate::memcached::{DecidedBy, Fallback, MemcachedLimiter};
use slidegate::{Denial, Limit, Limiter, ManualClock};
use support::servers::{trial, Memcached};

fn main() -> std::process::ExitCode {
    support::servers::run(vec![
        trial(
            "the_seed_worked_example_and_the_in_process_decisions",
            0,
            Memcached::get,
            the_seed_worked_example_and_the_in_process_decisions,
        ),
        trial(
            "checks_in_flight_at_once_can_all_pass_within_the_documented_bound",
            4,
            Memcached::get,
            checks_in_flight_at_once_can_all_pass_within_the_documented_bound,
        ),
        trial(
            "keys_the_old_mapping_merged_have_budgets_of_their_own",
            0,
            Memcached::get,
            keys_the_old_mapping_merged_have_budgets_of_their_own,
        ),
        // Servers of their own: one to count connections on, one to stop.
        trial(
            "concurrent_checks_run_on_several_connections_at_most_the_pool_size",
            2,
            Memcached::start,
            concurrent_checks_run_on_several_connections_at_most_the_pool_size,
        ),
        trial(
            "a_vanished_memcached_is_answered_by_the_fallback",
            0,
            Memcached::start,
            a_vanished_memcached_is_answered_by_the_fallback,
        ),
        trial(
            "an_absurd_cost_is_cost_too_large_with_memcached_away",
            0,
            Memcached::start,
            an_absurd_cost_is_cost_too_large_with_memcached_away,
        ),
        trial(
            "a_spray_through_the_fallback_stays_within_max_keys",
            0,
            Memcached::start,
            a_spray_through_the_fallback_stays_within_max_keys,
        ),
        trial(
            "counters_of_windows_over_15_days_are_kept",
            0,
            Memcached::get,
            counters_of_windows_over_15_days_are_kept,
        ),
        trial(
            "throughput_64_in_flight_over_1000_keys",
            2,
            Memcached::get,
            throughput_64_in_flight_over_1000_keys,
        ),
    ])
}

fn prefix(test: &str) -> String {
    format!(
        "t-{test}-{}-{}:",
        std::process::id(),
        std::time::SystemTime::now().elapsed().map_or(0, |d| d.as_nanos())
    )
}

async fn the_seed_worked_example_and_the_in_process_decisions(server: Memcached) {
    let clock = ManualClock::new();
    let limiter = MemcachedLimiter::<u64>::builder()
        .addr(&server.addr)
        .limit(Limit::per_minute(500))
        .clock(clock.clone())
        .prefix(&prefix("seed"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // 400 in the previous minute, 250 so far in this one; 45 s in: 250 + 400 × 15/60 = 350.
    clock.advance(Duration::from_secs(10));
    assert!(limiter.check_n(&1, 400).await.is_allowed());
    clock.advance(Duration::from_secs(94));
    assert!(limiter.check_n(&1, 250).await.is_allowed());
    clock.advance(Duration::from_secs(1));
    let d = limiter.check(&1).await;
    assert_eq!((d.decided_by(), d.is_allowed(), d.remaining()), (DecidedBy::Server, true, 149));

    // Random sequential traffic: the same decisions as the in-process one-slot window.
    for (set, limits) in
        [vec![Limit::per_minute(5)], vec![Limit::per_minute(7), Limit::new(20, Duration::from_secs(600))]]
            .into_iter()
            .enumerate()
    {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(1000));
        let mut ours = Limiter::<u64>::builder().clock(clock.clone());
        let mut theirs = MemcachedLimiter::<u64>::builder()
            .addr(&server.addr)
            .clock(clock.clone())
            .prefix(&prefix(&format!("same{set}")))
            .timeout(Duration::from_secs(2));
        for l in &limits {
            ours = ours.limit(l.precision(l.window()));
            theirs = theirs.limit(*l);
        }
        let (ours, theirs) = (ours.build().unwrap(), theirs.build().unwrap());
        let mut rng = Rng(set as u64 + 7);
        for step in 0..300 {
            if rng.below(3) == 0 {
                let span = if rng.below(2) == 0 { 3_000 } else { 90_000 };
                clock.advance(Duration::from_millis(1 + rng.below(span)));
            }
            let key = rng.below(2);
            let cost = [0, 1, 1, 2, 3][rng.below(5) as usize];
            let (a, b) = (ours.check_n(&key, cost), theirs.check_n(&key, cost).await);
            let what =
                format!("set {set} step {step} key {key} cost {cost} at {:?}: {a:?} vs {b:?}", clock.now());
            assert_eq!(b.decided_by(), DecidedBy::Server, "{what}");
            assert_eq!(
                (b.is_allowed(), b.remaining(), b.denial(), b.tightest_limit()),
                (a.is_allowed(), a.remaining(), a.denial(), a.tightest_limit()),
                "{what}"
            );
            let ms = |d: Option<Duration>| d.map(|d| d.as_nanos().div_ceil(1_000_000));
            assert_eq!(ms(b.retry_after()), ms(a.retry_after()), "{what}");
        }
    }
}

async fn checks_in_flight_at_once_can_all_pass_within_the_documented_bound(server: Memcached) {
    const MAX: u64 = 50;
    const CONNECTIONS: u64 = 4;
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(100));
    let prefix = prefix("contention");
    let mut limiters = Vec::new();
    for _ in 0..CONNECTIONS {
        let l = MemcachedLimiter::<u64>::builder()
            .addr(&server.addr)
            .limit(Limit::per_minute(MAX))
            .clock(clock.clone())
            .prefix(&prefix)
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        limiters.push(Arc::new(l));
    }
    let mut tasks = Vec::new();
    for limiter in &limiters {
        let limiter = Arc::clone(limiter);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..40 {
                admitted += u64::from(limiter.check(&9).await.is_allowed());
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    // Each limiter has at most one check in flight: at most CONNECTIONS - 1 extra.
    assert!((MAX..=MAX + CONNECTIONS - 1).contains(&admitted), "{admitted} admitted");
}

/// A server of its own, to stop.
async fn a_vanished_memcached_is_answered_by_the_fallback(server: Memcached) {
    let clock = ManualClock::new();
    let build = |fallback| {
        MemcachedLimiter::<u64>::builder()
            .addr(&server.addr)
            .limit(Limit::per_minute(3))
            .clock(clock.clone())
            .timeout(Duration::from_millis(200))
            .fallback(fallback)
            .build()
            .unwrap()
    };
    let (local, closed, open) = (build(Fallback::Local), build(Fallback::Closed), build(Fallback::Open));
    // A closed refusal waits the smallest precision of the limits, as Redis's does: one
    // minute for 100/h (1 min slots) beside 3/min's one second would be 1 s; alone, 1 min.
    let hourly = MemcachedLimiter::<u64>::builder()
        .addr(&server.addr)
        .limit(Limit::per_hour(100))
        .clock(clock.clone())
        .timeout(Duration::from_millis(200))
        .fallback(Fallback::Closed)
        .build()
        .unwrap();
    assert_eq!(local.check(&1).await.decided_by(), DecidedBy::Server);
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let d = local.check(&1).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Local, true));
    assert!(started.elapsed() < Duration::from_millis(400));
    let d = closed.check(&1).await;
    assert_eq!((d.decided_by(), d.retry_after()), (DecidedBy::FailClosed, Some(Duration::from_secs(1))));
    let d = hourly.check(&1).await;
    assert_eq!((d.decided_by(), d.retry_after()), (DecidedBy::FailClosed, Some(Duration::from_secs(60))));
    assert_eq!(open.check(&1).await.decided_by(), DecidedBy::FailOpen);
}

/// Review finding 4: with memcached away, `Fallback::Open` admitted `check_n(k, u64::MAX)`
/// and `Fallback::Closed` refused it as `Limit` (retry later, which never helps). A cost
/// above a limit's `max` is `CostTooLarge` whoever decides, as it is with memcached up.
async fn an_absurd_cost_is_cost_too_large_with_memcached_away(server: Memcached) {
    let build = |fallback| {
        MemcachedLimiter::<u64>::builder()
            .addr(&server.addr)
            .limit(Limit::per_minute(5))
            .limit(Limit::per_hour(100))
            .prefix(&prefix("cost"))
            .timeout(Duration::from_millis(200))
            .fallback(fallback)
            .build()
            .unwrap()
    };
    let limiters = [build(Fallback::Open), build(Fallback::Closed), build(Fallback::Local)];
    for limiter in &limiters {
        let d = limiter.check_n(&1, 6).await;
        assert_eq!((d.decided_by(), d.denial()), (DecidedBy::Server, Some(Denial::CostTooLarge(0))), "{d:?}");
    }
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (limiter, by) in limiters.iter().zip([DecidedBy::FailOpen, DecidedBy::FailClosed, DecidedBy::Local]) {
        for cost in [u64::MAX, 101, 6] {
            let d = limiter.check_n(&1, cost).await;
            let what = format!("{by:?}, cost {cost}: {d:?}");
            assert_eq!((d.decided_by(), d.denial()), (by, Some(Denial::CostTooLarge(0))), "{what}");
            assert_eq!(d.retry_after(), None, "{what}");
        }
        assert!(limiter.check(&1).await.decided_by() == by);
    }
}

/// Finding 7: `Fallback::Local`'s in-process limiter had no `max_keys`, so while memcached
/// was away every sprayed key stayed in it. With `max_keys(1000)`, a spray of 5,000 keys
/// leaves it holding 1,000, the keys beyond are refused `TooManyKeys` (decided locally),
/// and a key it held keeps its limit.
async fn a_spray_through_the_fallback_stays_within_max_keys(server: Memcached) {
    let clock = ManualClock::new();
    let limiter = MemcachedLimiter::<u64>::builder()
        .addr(&server.addr)
        .limit(Limit::per_minute(3))
        .clock(clock.clone())
        .timeout(Duration::from_millis(500))
        .max_keys(1000)
        .build()
        .unwrap();
    assert_eq!(limiter.check(&7).await.decided_by(), DecidedBy::Server);
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let d = limiter.check(&7).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Local, true));
    let mut refused = 0;
    for key in 0..5000u64 {
        let d = limiter.check(&(1_000_000 + key)).await;
        assert_eq!(d.decided_by(), DecidedBy::Local);
        if !d.is_allowed() {
            assert_eq!(d.denial(), Some(Denial::TooManyKeys), "key {key}");
            refused += 1;
        }
    }
    let held = limiter.local().map_or(0, Limiter::len);
    assert!(held <= 1000, "the fallback holds {held} keys after a spray of 5000 (max_keys 1000)");
    assert_eq!(refused, 5000 - 999);
    // Key 7 keeps its limit in the fallback: 3 per minute, 1 admitted there so far.
    for _ in 0..2 {
        assert!(limiter.check(&7).await.is_allowed());
    }
    let d = limiter.check(&7).await;
    assert_eq!((d.decided_by(), d.denial()), (DecidedBy::Local, Some(Denial::Limit(0))));
}

/// Pairs of keys that the mapping before the escaped one (blanks and controls replaced by
/// `_`, the prefix glued to the key) sent to one counter, and keys too long for memcached
/// (which it refused, so every check of them fell back): each must get a budget of its own
/// on the server. At 1 per minute, a second key on a shared counter would be refused.
async fn keys_the_old_mapping_merged_have_budgets_of_their_own(server: Memcached) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1000));
    let build = |prefix: &str| {
        MemcachedLimiter::<String>::builder()
            .addr(&server.addr)
            .limit(Limit::per_minute(1))
            .clock(clock.clone())
            .prefix(prefix)
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let base = prefix("keys");
    let long = "k".repeat(300);
    let keys: Vec<String> = [
        "a_b",
        "a b",
        "a\tb",
        "a\nb",
        "a\u{0}b",
        "a\u{2003}b", // an em space: whitespace to the old mapping
        "a%20b",      // what "a b" escapes to, unescaped
        "a%2520b",
        "a:b",
        "a%3Ab",
        "#a",
        "é",
        "",
        &long,
        &format!("{long}x"),
        &"é".repeat(200), // 400 bytes, 1,200 escaped
    ]
    .iter()
    .map(|k| (*k).to_owned())
    .collect();
    let limiter = build(&base);
    for key in &keys {
        let d = limiter.check(key).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, true), "first check of {key:?}");
    }
    // Each key's counter is there: the second check of each is refused, by the server.
    for key in &keys {
        let d = limiter.check(key).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, false), "second check of {key:?}");
    }
    // Prefix and key are told apart too: prefix P with key ":x" is not prefix "P:" with "x".
    let (a, b) = (build(&base), build(&format!("{base}:")));
    let d = a.check(&":x".to_owned()).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, true));
    let d = b.check(&"x".to_owned()).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, true));
}

/// memcached's `total_connections` (every connection it accepted since it started), asked
/// on `stats`. (Not `curr_connections`: memcached counts a closed connection out when a
/// worker thread gets to it, so the probe that `Memcached::start` closed just before the
/// test could still be counted in the first reading and gone from the next.)
fn total_connections(stats: &mut BufReader<TcpStream>) -> u64 {
    stats.get_mut().write_all(b"stats\r\n").unwrap();
    let mut found = None;
    loop {
        let mut line = String::new();
        assert!(stats.read_line(&mut line).unwrap() > 0, "memcached closed the stats connection");
        if line.starts_with("END") {
            return found.expect("no total_connections in stats");
        }
        if let Some(n) = line.strip_prefix("STAT total_connections ") {
            found = Some(n.trim().parse().unwrap());
        }
    }
}

/// 64 checks at once on a limiter of pool size 1 open one connection (the old client's
/// behaviour, every check queued on it); on one of pool size 8, several and at most 8.
/// Counted as connections opened, on a server of the test's own.
async fn concurrent_checks_run_on_several_connections_at_most_the_pool_size(server: Memcached) {
    let mut stats = BufReader::new(TcpStream::connect(&server.addr).unwrap());
    let build = |size| {
        Arc::new(
            MemcachedLimiter::<u64>::builder()
                .addr(&server.addr)
                .limit(Limit::per_minute(1_000_000))
                .prefix(&prefix("pool"))
                .timeout(Duration::from_secs(2))
                .pool_size(size)
                .build()
                .unwrap(),
        )
    };
    let burst = |limiter: &Arc<MemcachedLimiter<u64>>| {
        let mut tasks = tokio::task::JoinSet::new();
        for key in 0..64 {
            let limiter = Arc::clone(limiter);
            tasks.spawn(async move { limiter.check(&key).await.decided_by() });
        }
        tasks
    };
    let before = total_connections(&mut stats);
    let one = build(1);
    let mut tasks = burst(&one);
    while let Some(by) = tasks.join_next().await {
        assert_eq!(by.unwrap(), DecidedBy::Server);
    }
    let with_one = total_connections(&mut stats);
    assert_eq!(with_one - before, 1, "pool size 1 opened {} connections", with_one - before);

    let eight = build(8);
    let mut tasks = burst(&eight);
    while let Some(by) = tasks.join_next().await {
        assert_eq!(by.unwrap(), DecidedBy::Server);
    }
    let opened = total_connections(&mut stats) - with_one;
    assert!((2..=8).contains(&opened), "pool size 8 opened {opened} connections for 64 checks at once");
    eprintln!("64 checks at once: pool size 1 opened 1 connection, pool size 8 opened {opened}");
    drop((one, eight));
}

/// Checks per second with 64 in flight over 1,000 keys (each check a multi-get and an
/// `incr`), one connection (`pool_size(1)`) against the default pool, alternating, 5 rounds
/// each. Prints each round and the medians; fails only if memcached did not decide every
/// check.
async fn throughput_64_in_flight_over_1000_keys(server: Memcached) {
    const IN_FLIGHT: u64 = 64;
    const PER_TASK: u64 = 300;
    let run = |pool: Option<usize>, round: usize| {
        let addr = server.addr.clone();
        async move {
            let mut builder = MemcachedLimiter::<u64>::builder()
                .addr(&addr)
                .limit(Limit::per_minute(1_000_000))
                .prefix(&prefix(&format!("throughput-{pool:?}-{round}")))
                .timeout(Duration::from_secs(5));
            if let Some(size) = pool {
                builder = builder.pool_size(size);
            }
            let limiter = Arc::new(builder.build().unwrap());
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for t in 0..IN_FLIGHT {
                let limiter = Arc::clone(&limiter);
                tasks.spawn(async move {
                    for i in 0..PER_TASK {
                        let d = limiter.check(&((t * PER_TASK + i) % 1000)).await;
                        assert_eq!(d.decided_by(), DecidedBy::Server);
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap();
            }
            (IN_FLIGHT * PER_TASK) as f64 / started.elapsed().as_secs_f64()
        }
    };
    let (mut single, mut pooled) = (Vec::new(), Vec::new());
    for round in 0..5 {
        single.push(run(Some(1), round).await);
        pooled.push(run(None, round).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "memcached throughput, {IN_FLIGHT} in flight over 1000 keys, 5 alternating rounds: pool_size(1) {:.0}, default pool {:.0} checks/s (medians; rounds {single:.0?} and {pooled:.0?})",
        median(&mut single),
        median(&mut pooled)
    );
}

/// memcached reads an expiry over 30 days as a Unix time: a counter's TTL (two windows) must
/// not become a date in 1970, which would expire the counter at once and admit everything.
async fn counters_of_windows_over_15_days_are_kept(server: Memcached) {
    for days in [14, 16, 365] {
        let limiter = MemcachedLimiter::<u64>::builder()
            .addr(&server.addr)
            .limit(Limit::new(1, Duration::from_secs(days * 86_400)))
            .prefix(&prefix(&format!("long{days}")))
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let d = limiter.check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, true), "{days} days");
        let d = limiter.check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, false), "{days} days");
    }
}
