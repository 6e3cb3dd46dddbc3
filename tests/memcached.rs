//! The two-bucket estimate on a real memcached (loopback; see `support/servers.rs`): the
//! seed article's worked example; the same decisions as the in-process one-slot sliding
//! window on random sequential traffic; the documented contention bound (checks in flight
//! at once may all pass); and the fallback when memcached goes away.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod rng;
    pub mod servers;
}
use support::rng::Rng;

use std::sync::Arc;
use std::time::Duration;

use slidegate::memcached::{DecidedBy, Fallback, MemcachedLimiter};
use slidegate::{Limit, Limiter, ManualClock};
use support::servers::Memcached;

fn prefix(test: &str) -> String {
    format!(
        "t-{test}-{}-{}:",
        std::process::id(),
        std::time::SystemTime::now().elapsed().map_or(0, |d| d.as_nanos())
    )
}

#[tokio::test]
async fn the_seed_worked_example_and_the_in_process_decisions() {
    let Some(server) = Memcached::get() else { return };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checks_in_flight_at_once_can_all_pass_within_the_documented_bound() {
    let Some(server) = Memcached::get() else { return };
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
    // Each connection has at most one check in flight: at most CONNECTIONS - 1 extra.
    assert!((MAX..=MAX + CONNECTIONS - 1).contains(&admitted), "{admitted} admitted");
}

#[tokio::test]
async fn a_vanished_memcached_is_answered_by_the_fallback() {
    // A server of our own, to stop.
    let Some(server) = Memcached::start() else { return };
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
    assert_eq!(local.check(&1).await.decided_by(), DecidedBy::Server);
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let d = local.check(&1).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Local, true));
    assert!(started.elapsed() < Duration::from_millis(400));
    assert_eq!(closed.check(&1).await.decided_by(), DecidedBy::FailClosed);
    assert_eq!(open.check(&1).await.decided_by(), DecidedBy::FailOpen);
}
