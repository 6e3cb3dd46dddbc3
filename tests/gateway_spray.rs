//! A spray of client-chosen keys through the tower layer cannot grow memory past the
//! route limiter's `max_keys`: once the table is full, new keys are answered 503 and the
//! heap stays where it was (the layer itself allocates nothing it keeps per key). Counted
//! with a counting global allocator, in process (`tower::ServiceExt::oneshot`), so the
//! figures are exact; run with `--nocapture` to see them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use slidegate::tower::{HeaderKey, RateLimitLayer};
use slidegate::{Limit, Limiter, ManualClock};
use support::counting_alloc::{live_bytes, Counting};
use tower::{Layer, ServiceExt};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CAP: usize = 20_000;

#[tokio::test(flavor = "current_thread")]
async fn a_key_spray_stops_growing_the_heap_at_max_keys() {
    let limiter = Arc::new(
        Limiter::<Vec<u8>>::builder()
            .limit(Limit::per_minute(60))
            .max_keys(CAP)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let layer =
        RateLimitLayer::new("api", Arc::clone(&limiter), HeaderKey::new("x-api-key").unwrap()).unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(()))
    }));
    let send = |key: String| {
        let service = service.clone();
        async move {
            let req = Request::get("/x").header("x-api-key", key).body(()).unwrap();
            service.oneshot(req).await.unwrap().status()
        }
    };

    let before = live_bytes();
    for i in 0..CAP {
        assert_eq!(send(format!("client-{i:08}")).await, StatusCode::OK);
    }
    let full = live_bytes();
    assert_eq!(limiter.len(), CAP);
    // Ten times as many new keys again: each refused, none kept.
    let mut refused = 0;
    for i in CAP..CAP * 11 {
        refused += usize::from(send(format!("client-{i:08}")).await == StatusCode::SERVICE_UNAVAILABLE);
    }
    let after = live_bytes();
    assert_eq!(refused, CAP * 10);
    assert_eq!(limiter.len(), CAP);
    // Keys already held are still served.
    assert_eq!(send("client-00000007".to_owned()).await, StatusCode::OK);
    let per_key = full.saturating_sub(before) / CAP;
    println!(
        "{CAP} keys: heap +{} B ({per_key} B per key); {} more new keys refused: heap {:+} B",
        full.saturating_sub(before),
        CAP * 10,
        after as i64 - full as i64
    );
    assert!(after <= full + 4096, "the spray grew the heap from {full} B to {after} B");
}
