//! Feature `tokio`: `until_ready` waits out a refusal and then admits; gives up at once when
//! waiting cannot help; a waiter cancelled mid-sleep (a timeout) consumed nothing; jitter
//! spreads the waiters of one key; and on a `ManualClock` a waiter waits for that clock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use slidegate::{Denial, Jitter, Limit, Limiter, ManualClock};

#[tokio::test]
async fn waits_then_admits_gives_up_when_hopeless_and_cancellation_consumes_nothing() {
    let window = Duration::from_millis(300);
    let limiter = Limiter::<u64>::builder().limit(Limit::new(2, window).strict()).build().unwrap();
    for _ in 0..2 {
        assert!(limiter.until_ready(&1, 1).await.is_ok());
    }
    // Full: a waiter cancelled after 20 ms has taken nothing.
    let cancelled = tokio::time::timeout(Duration::from_millis(20), limiter.until_ready(&1, 1)).await;
    assert!(cancelled.is_err(), "the key is full: the waiter must still be waiting");
    assert!(!limiter.peek(&1).is_allowed());
    // A waiter that is left alone gets through once the window has passed.
    let started = Instant::now();
    let admitted = limiter.until_ready(&1, 1).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200), "{:?}", started.elapsed());
    // Exactly one more fits: the cancelled waiter did not take the other.
    assert_eq!(admitted.remaining(), 1);
    // Hopeless: a cost above max is refused at once.
    let started = Instant::now();
    let refused = limiter.until_ready(&1, 3).await.unwrap_err();
    assert_eq!(refused.denial(), Some(Denial::CostTooLarge(0)));
    assert!(started.elapsed() < Duration::from_millis(100));
}

/// When each of `waiters` tasks, all refused together on one full key, is admitted
/// (elapsed since the key filled, sorted), waiting with `jitter`; and the key's
/// `retry_after` once full.
async fn admissions(waiters: u64, window: Duration, jitter: Jitter) -> (Vec<Duration>, Duration) {
    let limiter =
        Arc::new(Limiter::<u64>::builder().limit(Limit::new(waiters, window).strict()).build().unwrap());
    assert!(limiter.check_n(&1, waiters).is_allowed());
    let full = Instant::now();
    let retry = limiter.peek(&1).retry_after().unwrap();
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let admitted = limiter.until_ready_with_jitter(&1, 1, jitter).await;
                assert!(admitted.is_ok(), "{admitted:?}");
                full.elapsed()
            })
        })
        .collect();
    let mut at = Vec::new();
    for task in tasks {
        at.push(tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap());
    }
    at.sort();
    (at, retry)
}

#[tokio::test(flavor = "current_thread")]
async fn jitter_spreads_the_waiters_of_one_key_and_none_changes_nothing() {
    let window = Duration::from_millis(200);
    let slack = Duration::from_millis(5);
    // Without jitter, sixteen waiters refused together all wake after the key's
    // retry_after and are all admitted then, within a few milliseconds of each other.
    let (at, retry) = admissions(16, window, Jitter::NONE).await;
    let (first, last) = (at[0], at[15]);
    assert!(first + slack >= retry, "{retry:?}: {at:?}");
    assert!(last - first < Duration::from_millis(40), "without jitter they wake together: {at:?}");
    // With up to 300 ms of jitter they wake spread over it: for sixteen uniform draws to
    // fall within 40 ms of each other has odds below 1e-11.
    let jitter = Duration::from_millis(300);
    let (at, retry) = admissions(16, window, Jitter::up_to(jitter)).await;
    let (first, last) = (at[0], at[15]);
    assert!(first + slack >= retry, "{retry:?}: {at:?}");
    assert!(last - first >= Duration::from_millis(40), "with jitter they must not wake together: {at:?}");
    // Each admitted at its first wake: no later than retry_after + jitter (and scheduling).
    assert!(last < retry + jitter + Duration::from_millis(150), "{retry:?}: {at:?}");
}

#[tokio::test]
async fn on_a_manual_clock_until_ready_waits_for_the_clock_and_wakes_when_it_moves() {
    let clock = ManualClock::new();
    let limiter =
        Arc::new(Limiter::<u64>::builder().limit(Limit::per_hour(1)).clock(clock.clone()).build().unwrap());
    assert!(limiter.until_ready(&1, 1).await.is_ok());
    // Nobody moves the clock: it waits (cancellably, consuming nothing).
    assert!(tokio::time::timeout(Duration::from_millis(50), limiter.until_ready(&1, 1)).await.is_err());
    // A waiter sleeps until the clock passes its retry_after. (The old loop slept an hour
    // on the tokio timer here, and the timeouts below failed.)
    let waiter = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.until_ready(&1, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    clock.advance(Duration::from_secs(30 * 60)); // half way: not yet
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());
    clock.advance(Duration::from_secs(31 * 60));
    let admitted = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken by advance");
    assert!(admitted.unwrap().unwrap().is_allowed());
    assert!(!limiter.peek(&1).is_allowed(), "the waiter took the hour's unit");

    // With jitter, the extra wait is on the manual clock too: the bare retry_after is not
    // enough (a draw of exactly 0 ns out of ten minutes' worth is the only way it could be).
    let waiter = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.until_ready_with_jitter(&1, 1, Jitter::up_to(Duration::from_secs(600))).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let retry = limiter.peek(&1).retry_after().unwrap();
    clock.advance(retry);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "woke before its jitter");
    clock.set(clock.now() + Duration::from_secs(601));
    let admitted = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken by set");
    assert!(admitted.unwrap().unwrap().is_allowed());
}
