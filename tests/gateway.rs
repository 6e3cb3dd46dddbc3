//! The tower layer inside a real axum/hyper server on 127.0.0.1 (ephemeral port), driven by
//! a real HTTP client: a burst gets exactly the limit's 200s, then 429s with the right
//! `Retry-After`, `RateLimit-Policy` and `RateLimit` fields; two routes keep separate
//! budgets; a spoofed `X-Forwarded-For` beyond the trusted hop does not change the key;
//! a request without a key gets a 500 or the fallback key's budget. The limiters run on a
//! `ManualClock`, so every figure is exact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};

use axum::routing::get;
use axum::Router;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slidegate::tower::{ForwardedFor, HeaderKey, PeerIp, RateLimitLayer};
use slidegate::{Limit, Limiter, ManualClock};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// Serves `app` on an ephemeral loopback port (with peer addresses for `PeerIp`).
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap();
    });
    addr
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn get_with(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap) {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = client.request(req.body(Empty::new()).unwrap()).await.unwrap();
    (response.status(), response.headers().clone())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap())
}

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    limit: Limit,
    clock: &ManualClock,
) -> Limiter<K> {
    Limiter::builder().limit(limit).clock(clock.clone()).build().unwrap()
}

fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello" })).route("/login", get(|| async { "login" }))
}

#[tokio::test]
async fn a_burst_gets_the_limit_then_429s_with_exact_headers_and_routes_keep_separate_budgets() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(Limit::per_minute(20), &clock), PeerIp)
        .route("/login", "login", limiter::<IpAddr>(Limit::per_minute(5), &clock));
    let addr = serve(app().layer(layer)).await;
    let client = client();

    for i in 0..5 {
        let (status, headers) = get_with(&client, addr, "/login", &[]).await;
        assert_eq!(status, StatusCode::OK, "request {i}");
        assert_eq!(header(&headers, "ratelimit-policy"), Some("\"login\";q=5;w=60"));
        assert_eq!(header(&headers, "ratelimit"), Some(format!("\"login\";r={}", 4 - i).as_str()));
        assert_eq!(header(&headers, "retry-after"), None);
    }
    for _ in 0..3 {
        let (status, headers) = get_with(&client, addr, "/login", &[]).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        // 5 units in the slot [0 s, 1 s) of an interpolated 5/min at 1 s precision: one
        // more fits once 5 × (1 − f) ≤ 4 in the slot starting at 60 s, i.e. at 60.2 s,
        // rounded up to whole seconds.
        assert_eq!(header(&headers, "retry-after"), Some("61"));
        assert_eq!(header(&headers, "ratelimit-policy"), Some("\"login\";q=5;w=60"));
        assert_eq!(header(&headers, "ratelimit"), Some("\"login\";r=0;t=61"));
    }
    // The other route still has its own 20.
    for i in 0..20 {
        let (status, headers) = get_with(&client, addr, "/hello", &[]).await;
        assert_eq!(status, StatusCode::OK, "request {i}");
        assert_eq!(header(&headers, "ratelimit"), Some(format!("\"default\";r={}", 19 - i).as_str()));
    }
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    // `/login/x` belongs to the login route, `/loginx` does not.
    assert_eq!(get_with(&client, addr, "/login/x", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    // Time passes: both budgets come back.
    clock.advance(std::time::Duration::from_secs(121));
    assert_eq!(get_with(&client, addr, "/login", &[]).await.0, StatusCode::OK);
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_spoofed_forwarded_for_beyond_the_trusted_hop_does_not_change_the_key() {
    let clock = ManualClock::new();
    let layer =
        RateLimitLayer::new("proxied", limiter::<IpAddr>(Limit::per_minute(3), &clock), ForwardedFor::new(1));
    let addr = serve(app().layer(layer)).await;
    let client = client();
    // The trusted proxy appended 203.0.113.9; the client made up the hops before it.
    let mut admitted = 0;
    for spoof in ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4", "5.5.5.5"] {
        let xff = format!("{spoof}, 203.0.113.9");
        let (status, _) = get_with(&client, addr, "/hello", &[("x-forwarded-for", &xff)]).await;
        admitted += usize::from(status == StatusCode::OK);
    }
    assert_eq!(admitted, 3, "one client, one budget, whatever it claims");
    // Two header lines form one list: the last hop is still the trusted one.
    let (status, _) = get_with(
        &client,
        addr,
        "/hello",
        &[("x-forwarded-for", "9.9.9.9"), ("x-forwarded-for", "203.0.113.9")],
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy has its own budget.
    let (status, _) =
        get_with(&client, addr, "/hello", &[("x-forwarded-for", "1.1.1.1, 198.51.100.4")]).await;
    assert_eq!(status, StatusCode::OK);
    // No header at all: the peer (127.0.0.1) is the key.
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_request_without_a_key_is_a_500_or_takes_the_fallback_budget() {
    let clock = ManualClock::new();
    let strict = RateLimitLayer::new(
        "keys",
        limiter::<HeaderValue>(Limit::per_minute(2), &clock),
        HeaderKey::new("x-api-key"),
    );
    let addr = serve(app().layer(strict)).await;
    let client = client();
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    for _ in 0..2 {
        assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "k1")]).await.0, StatusCode::OK);
    }
    assert_eq!(
        get_with(&client, addr, "/hello", &[("x-api-key", "k1")]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "k2")]).await.0, StatusCode::OK);

    let lenient = RateLimitLayer::new(
        "keys",
        limiter::<HeaderValue>(Limit::per_minute(2), &clock),
        HeaderKey::new("x-api-key"),
    )
    .fallback_key(HeaderValue::from_static("anonymous"))
    .headers_on_success(false);
    let addr = serve(app().layer(lenient)).await;
    let (status, headers) = get_with(&client, addr, "/hello", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "ratelimit"), None, "headers_on_success(false)");
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);
    // A real key is not the fallback's budget.
    assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "anonymous-not")]).await.0, StatusCode::OK);
}

#[tokio::test]
async fn cost_comes_from_the_request_and_a_full_table_is_a_503() {
    let clock = ManualClock::new();
    let limiter =
        Limiter::<IpAddr>::builder().limit(Limit::per_minute(10)).clock(clock.clone()).build().unwrap();
    let layer = RateLimitLayer::new("weighted", limiter, PeerIp).cost(|req: &Request<axum::body::Body>| {
        if req.uri().path() == "/login" {
            4
        } else {
            1
        }
    });
    let addr = serve(app().layer(layer)).await;
    let client = client();
    let (_, headers) = get_with(&client, addr, "/login", &[]).await;
    assert_eq!(header(&headers, "ratelimit"), Some("\"weighted\";r=6"));
    let (_, headers) = get_with(&client, addr, "/login", &[]).await;
    assert_eq!(header(&headers, "ratelimit"), Some("\"weighted\";r=2"));
    let (status, headers) = get_with(&client, addr, "/login", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "ratelimit").map(|v| v.starts_with("\"weighted\";r=2;t=")), Some(true));
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);

    // max_keys(1): the loopback peer holds the only slot, a second key gets 503.
    let full = Limiter::<HeaderValue>::builder()
        .limit(Limit::per_minute(10))
        .max_keys(1)
        .clock(clock)
        .build()
        .unwrap();
    let layer = RateLimitLayer::new("full", full, HeaderKey::new("x-api-key"));
    let addr = serve(app().layer(layer)).await;
    assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "a")]).await.0, StatusCode::OK);
    assert_eq!(
        get_with(&client, addr, "/hello", &[("x-api-key", "b")]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}
