//! The hidden-cost guard: a check on a key the limiter already holds allocates nothing,
//! whether it goes through the map or through the per-thread cache, admitted or refused,
//! with one limit or several. A counting global allocator sees every allocation of the
//! process; this file holds a single test so no other test thread allocates meanwhile, and
//! the limiter runs on a `ManualClock` so it has no background thread either.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Limit, Limiter, ManualClock};

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}
use support::counting_alloc::{allocations_during, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn checks_on_existing_keys_do_not_allocate() {
    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .limit(Limit::per_second(10))
        .limit(Limit::per_minute(120))
        .limit(Limit::per_hour(240).precision(Duration::from_secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let keys: Vec<String> = (0..64).map(|i| format!("client-{i}")).collect();
    // Insert every key (allocating its state and its map entry) and warm the cache up.
    for key in &keys {
        for _ in 0..3 {
            let _ = limiter.check(key.as_str());
        }
    }
    let mut admitted = 0;
    let mut refused = 0;
    let n = allocations_during(|| {
        for round in 0..200u64 {
            // Move through slots, minutes and hours so slot rotation is on the path too.
            clock.advance(Duration::from_millis(137 + round * 31));
            for key in &keys {
                let d = limiter.check(key.as_str());
                if d.is_allowed() {
                    admitted += 1;
                } else {
                    refused += 1;
                }
                let _ = limiter.check_n(key.as_str(), 2);
                let _ = limiter.peek(key.as_str());
            }
            // The same hot key again and again: the per-thread cache's path.
            for _ in 0..50 {
                let _ = limiter.check("client-7");
            }
        }
    });
    assert!(admitted > 0 && refused > 0, "both paths exercised: {admitted} admitted, {refused} refused");
    assert_eq!(n, 0, "checks on existing keys allocated {n} times");
    // The guard itself works: a new key does allocate.
    assert!(
        allocations_during(|| {
            let _ = limiter.check("a new key");
        }) > 0
    );
}
