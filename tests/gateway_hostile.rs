//! What a hostile client sends through a real axum server on loopback cannot escape a limit
//! or page the operator: dot segments are refused rather than routed past a limited route,
//! `PathKey` keys every spelling of a path as one, a malformed client-IP header is the
//! client's 400, every spelling of one `Authorization` shares its budget, a repeated key
//! header and an overlong key are refused. Requests are written on the socket as they are
//! (no client normalises them); the limiters run on a `ManualClock`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use slidegate::tower::{
    AuthorizationKey, ForwardedFor, HeaderKey, OnMalformed, PathKey, PeerIp, RateLimitLayer,
};
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

/// An upstream that answers every path, counting what reaches it.
fn counting_upstream() -> (Router, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reached);
    let app = Router::new().fallback(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        async { "reached" }
    });
    (app, reached)
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

#[tokio::test]
async fn path_key_keys_every_spelling_of_a_path_as_one() {
    let clock = ManualClock::new();
    let (app, reached) = counting_upstream();
    let layer = RateLimitLayer::new("paths", limiter::<String>(1, &clock), PathKey::new()).unwrap();
    let addr = serve(app.layer(layer)).await;
    assert_eq!(status(addr, "/search?q=1", "").await, 200);
    for spelling in ["//search", "/%73earch", "/search;x=1", "///search?q=2"] {
        assert_eq!(status(addr, spelling, "").await, 429, "{spelling} is /search, already used");
    }
    assert_eq!(status(addr, "/./search", "").await, 400, "a dot segment is refused");
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    assert_eq!(status(addr, "/search/x", "").await, 200, "another path, another budget");
}

#[tokio::test]
async fn a_malformed_client_ip_header_is_the_clients_400() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("p", limiter::<IpAddr>(1, &clock), ForwardedFor::new(1)).unwrap();
    let addr = serve(counting_upstream().0.layer(layer)).await;
    for header in [
        "x-forwarded-for: 198.51.100.7,\r\n",
        "x-forwarded-for: garbage\r\n",
        "x-forwarded-for: 198.51.100.7, 203.0.113.9,,\r\n",
        "x-forwarded-for: \r\n",
        "x-forwarded-for: unknown\r\n",
        "x-forwarded-for: 198.51.100.7:99999\r\n",
    ] {
        assert_eq!(status(addr, "/", header).await, 400, "{header:?}");
    }
    // What a trusted proxy appended is still read past the client's own garbage.
    assert_eq!(status(addr, "/", "x-forwarded-for: garbage,, 203.0.113.9\r\n").await, 200);
    assert_eq!(status(addr, "/", "x-forwarded-for: 203.0.113.9\r\n").await, 429);

    // Trusted networks: the entry left of the trusted proxies is the client's own.
    let networks = ForwardedFor::trusting(["127.0.0.0/8", "10.0.0.0/8"]).unwrap();
    let layer = RateLimitLayer::new("p", limiter::<IpAddr>(1, &clock), networks).unwrap();
    let addr = serve(counting_upstream().0.layer(layer)).await;
    assert_eq!(status(addr, "/", "x-forwarded-for: nonsense, 10.0.0.7\r\n").await, 400);
    assert_eq!(status(addr, "/", "x-forwarded-for: ,10.0.0.7\r\n").await, 400);
    let layer =
        RateLimitLayer::new("p", limiter::<IpAddr>(1, &clock), ForwardedFor::new(1).rfc7239()).unwrap();
    let addr = serve(counting_upstream().0.layer(layer)).await;
    assert_eq!(status(addr, "/", "forwarded: for=\r\n").await, 400);
    assert_eq!(status(addr, "/", "forwarded: proto=https\r\n").await, 400);

    // Configured to, the peer's address keys what does not parse: one budget for all such
    // requests (here the loopback peer's, 1 per minute).
    let lenient = ForwardedFor::new(1).on_malformed(OnMalformed::Peer);
    let layer = RateLimitLayer::new("p", limiter::<IpAddr>(1, &clock), lenient).unwrap();
    let addr = serve(counting_upstream().0.layer(layer)).await;
    assert_eq!(status(addr, "/", "x-forwarded-for: 198.51.100.7,\r\n").await, 200);
    assert_eq!(status(addr, "/", "x-forwarded-for: garbage\r\n").await, 429);
    assert_eq!(status(addr, "/", "x-forwarded-for: 198.51.100.7\r\n").await, 200, "a client of its own");
}

#[tokio::test]
async fn one_token_one_budget_whatever_the_schemes_spelling() {
    let clock = ManualClock::new();
    let (app, reached) = counting_upstream();
    let layer = RateLimitLayer::new("auth", limiter::<Vec<u8>>(3, &clock), AuthorizationKey::new()).unwrap();
    let addr = serve(app.layer(layer)).await;
    for _ in 0..3 {
        assert_eq!(status(addr, "/", "authorization: Bearer T0KEN\r\n").await, 200);
    }
    for spelling in ["bearer T0KEN", "BEARER T0KEN", "Bearer  T0KEN", "bEaReR \t T0KEN"] {
        let header = format!("authorization: {spelling}\r\n");
        assert_eq!(status(addr, "/", &header).await, 429, "{spelling:?} is Bearer T0KEN");
    }
    // The credentials are compared byte for byte.
    assert_eq!(status(addr, "/", "authorization: Bearer t0ken\r\n").await, 200);
    assert_eq!(status(addr, "/", "authorization: Basic T0KEN\r\n").await, 200, "another scheme");
    assert_eq!(status(addr, "/", "authorization: =T0KEN\r\n").await, 400, "no scheme");
    assert_eq!(reached.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn a_repeated_key_header_is_refused() {
    let clock = ManualClock::new();
    let (app, reached) = counting_upstream();
    let layer = RateLimitLayer::new("auth", limiter::<Vec<u8>>(3, &clock), AuthorizationKey::new()).unwrap();
    let addr = serve(app.layer(layer)).await;
    let doubled = "authorization: Bearer FRESH-1\r\nauthorization: Bearer VICTIM\r\n";
    assert_eq!(status(addr, "/", doubled).await, 400);
    assert_eq!(reached.load(Ordering::SeqCst), 0, "the doubled Authorization reached the upstream");
    let (app, reached2) = counting_upstream();
    let layer =
        RateLimitLayer::new("keys", limiter::<Vec<u8>>(3, &clock), HeaderKey::new("x-api-key").unwrap())
            .unwrap();
    let addr2 = serve(app.layer(layer)).await;
    assert_eq!(status(addr2, "/", "x-api-key: a\r\nX-Api-Key: b\r\n").await, 400);
    assert_eq!(reached2.load(Ordering::SeqCst), 0, "the doubled x-api-key reached the upstream");
    assert_eq!(status(addr2, "/", "x-api-key: a, b\r\n").await, 200, "one line is one value");
    assert_eq!(reached2.load(Ordering::SeqCst), 1, "only the one-line request reached the upstream");
}

#[tokio::test]
async fn an_overlong_key_is_refused() {
    let clock = ManualClock::new();
    let (app, reached) = counting_upstream();
    let layer =
        RateLimitLayer::new("keys", limiter::<Vec<u8>>(3, &clock), HeaderKey::new("x-api-key").unwrap())
            .unwrap();
    let addr = serve(app.clone().layer(layer)).await;
    // HeaderKey::DEFAULT_MAX_LEN is 256 bytes.
    let longest = format!("x-api-key: {}\r\n", "k".repeat(256));
    assert_eq!(status(addr, "/", &longest).await, 200);
    let too_long = format!("x-api-key: {}\r\n", "k".repeat(257));
    assert_eq!(status(addr, "/", &too_long).await, 431);

    // AuthorizationKey::DEFAULT_MAX_LEN is 4096 bytes of `Scheme credentials`: a JWT fits.
    let layer = RateLimitLayer::new("auth", limiter::<Vec<u8>>(3, &clock), AuthorizationKey::new()).unwrap();
    let addr = serve(app.clone().layer(layer)).await;
    let jwt = format!("authorization: Bearer {}\r\n", "j".repeat(4096 - 7));
    assert_eq!(status(addr, "/", &jwt).await, 200);
    let too_long = format!("authorization: Bearer {}\r\n", "j".repeat(4096 - 6));
    assert_eq!(status(addr, "/", &too_long).await, 431);

    // PathKey::DEFAULT_MAX_LEN is 1024 bytes of the normal form.
    let layer = RateLimitLayer::new("paths", limiter::<String>(3, &clock), PathKey::new()).unwrap();
    let addr = serve(app.layer(layer)).await;
    let longest = format!("//{}?{}", "p".repeat(1023), "q".repeat(2000));
    assert_eq!(status(addr, &longest, "").await, 200);
    assert_eq!(status(addr, &format!("/{}", "p".repeat(1024)), "").await, 431);
    assert_eq!(reached.load(Ordering::SeqCst), 3);
}
