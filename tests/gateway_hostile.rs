//! What a hostile client sends through a real axum server on loopback cannot escape a limit:
//! dot segments are refused rather than routed past a limited route. Requests are written on
//! the socket as they are (no client normalises them); the limiters run on a `ManualClock`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use slidegate::tower::{PeerIp, RateLimitLayer};
use slidegate::{Limit, Limiter, ManualClock};

/// Serves `app` on an ephemeral loopback port (with peer addresses).
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

/// Sends `GET target` as written, with `headers` (each line ending in CRLF); the status.
async fn status(addr: SocketAddr, target: &str, headers: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nhost: test\r\n{headers}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    per_minute: u64,
    clock: &ManualClock,
) -> Limiter<K> {
    Limiter::builder()
        .limit(Limit::per_minute(per_minute))
        .max_keys(10_000)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn dot_segments_cannot_carry_a_request_past_a_limited_route() {
    let clock = ManualClock::new();
    // axum routes `/users/..` to `/users/{id}` with `id` "..": it does not resolve dot
    // segments, so a layer that did would count such a request on another route.
    let reached = Arc::new(AtomicUsize::new(0));
    let (list, one) = (Arc::clone(&reached), Arc::clone(&reached));
    let app = Router::new()
        .route(
            "/users",
            get(move || {
                list.fetch_add(1, Ordering::SeqCst);
                async { "users" }
            }),
        )
        .route(
            "/users/{id}",
            get(move |Path(id): Path<String>| {
                one.fetch_add(1, Ordering::SeqCst);
                async move { format!("user {id}") }
            }),
        );
    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(1000, &clock), PeerIp)
        .unwrap()
        .route("/users", "users", limiter::<IpAddr>(1, &clock))
        .unwrap();
    let addr = serve(app.layer(layer)).await;
    assert_eq!(status(addr, "/users", "").await, 200);
    assert_eq!(status(addr, "/users", "").await, 429);
    assert_eq!(status(addr, "/users/7", "").await, 429, "below the limited route");
    for dots in [
        "/users/..",
        "/users/..;x=1",
        "/users/%2e%2e",
        "/users/%2E%2e;x=1",
        "/users/.",
        "/users/./",
        "/users/.%2e/",
        "/users/x/../..",
        "/./users",
        "/x/../users",
    ] {
        assert_eq!(status(addr, dots, "").await, 400, "{dots}");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 1, "only the first /users reached a handler");
    // Dots inside a segment are no dot segment.
    assert_eq!(status(addr, "/users/...", "").await, 429);
    assert_eq!(status(addr, "/.well-known/x", "").await, 404);
}
