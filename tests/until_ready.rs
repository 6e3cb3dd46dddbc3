//! Feature `tokio`: `until_ready` waits out a refusal and then admits; gives up at once when
//! waiting cannot help; and a waiter cancelled mid-sleep (a timeout) consumed nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use slidegate::{Denial, Limit, Limiter};

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
