//! A key the layer holds costs its own bytes, whatever else its request carried. hyper
//! parses a request's head in the connection's read buffer and hands out header values as
//! views into it: a key kept as such a view would keep the whole buffer (every other header
//! of the request) alive for as long as the limiter holds the key. Here the requests go
//! over TCP to a real axum server on loopback, each with a 16 KB or 200 KB header beside its
//! short API key, and a counting global allocator measures the heap each held key costs.
//! A single test: no other test thread allocates meanwhile. `--nocapture` shows the figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use slidegate::tower::{HeaderKey, RateLimitLayer};
use slidegate::{Limit, Limiter, ManualClock};
use support::counting_alloc::{live_bytes, Counting};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most heap one held key may cost. A key of this test is 15 bytes; the limiter's entry
/// for it (table slot, node header, window state) is about 270 B (`tests/gateway_spray.rs`
/// prints the figure for keys kept by themselves), and the table's growth by doubling adds
/// at most as much again, amortised. A key that kept any part of its request's read buffer
/// alive would cost at least the other header it came with (16 KB, 200 KB): 1 KB separates
/// the two by more than an order of magnitude, and leaves room for allocator noise.
const PER_KEY_BOUND: usize = 1024;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One request on a connection of its own, carrying `key` and `padding` bytes of another
/// header; the status code.
async fn send(addr: SocketAddr, key: &str, padding: usize) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!("GET /hello HTTP/1.1\r\nhost: test\r\nx-api-key: {key}\r\nx-padding: ");
    request.extend(std::iter::repeat('p').take(padding));
    request.push_str("\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    std::str::from_utf8(response.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The heap once the server has dropped its finished connections: read until it holds
/// still over several readings.
async fn settled_heap() -> usize {
    let mut last = live_bytes();
    let mut still = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = live_bytes();
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still == 5 {
            break;
        }
    }
    last
}

/// Sends `keys` new keys, each with `padding` bytes of another header, and returns the heap
/// each held key costs.
async fn heap_per_key(keys: usize, padding: usize) -> usize {
    let limiter = Arc::new(
        Limiter::<Vec<u8>>::builder()
            .limit(Limit::per_minute(60))
            .max_keys(100_000)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let layer =
        RateLimitLayer::new("api", Arc::clone(&limiter), HeaderKey::new("x-api-key").unwrap()).unwrap();
    let addr = serve(Router::new().route("/hello", get(|| async { "hello" })).layer(layer)).await;
    // The runtime's, the listener's and the first connections' one-time allocations.
    for i in 0..20 {
        assert_eq!(send(addr, &format!("warm-up-{i:06}"), padding).await, 200);
    }
    let before = settled_heap().await;
    for i in 0..keys {
        assert_eq!(send(addr, &format!("client-{i:08}"), padding).await, 200);
    }
    let after = settled_heap().await;
    assert_eq!(limiter.len(), keys + 20);
    let per_key = after.saturating_sub(before) / keys;
    println!(
        "{keys} keys, each with a {padding} B header beside it: heap +{} B, {per_key} B per held key",
        after.saturating_sub(before)
    );
    per_key
}

#[tokio::test(flavor = "current_thread")]
async fn a_held_key_costs_its_own_bytes_not_its_requests() {
    let mut costs = Vec::new();
    for (keys, padding) in [(1000, 16 * 1024), (200, 200 * 1024)] {
        costs.push((padding, heap_per_key(keys, padding).await));
    }
    for (padding, per_key) in costs {
        assert!(
            per_key <= PER_KEY_BOUND,
            "each held key costs {per_key} B with a {padding} B header beside it (bound {PER_KEY_BOUND} B)"
        );
    }
}
