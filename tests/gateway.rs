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
use http::{HeaderMap, Request, StatusCode};
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
    Limiter::builder().limit(limit).max_keys(10_000).clock(clock.clone()).build().unwrap()
}

fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello" })).route("/login", get(|| async { "login" }))
}

#[tokio::test]
async fn a_burst_gets_the_limit_then_429s_with_exact_headers_and_routes_keep_separate_budgets() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(Limit::per_minute(20), &clock), PeerIp)
        .unwrap()
        .route("/login", "login", limiter::<IpAddr>(Limit::per_minute(5), &clock))
        .unwrap();
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
        RateLimitLayer::new("proxied", limiter::<IpAddr>(Limit::per_minute(3), &clock), ForwardedFor::new(1))
            .unwrap();
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
        limiter::<Vec<u8>>(Limit::per_minute(2), &clock),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .unwrap();
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
        limiter::<Vec<u8>>(Limit::per_minute(2), &clock),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .unwrap()
    .fallback_key(b"anonymous".to_vec())
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
    let limiter = Limiter::<IpAddr>::builder()
        .limit(Limit::per_minute(10))
        .max_keys(10)
        .clock(clock.clone())
        .build()
        .unwrap();
    let layer =
        RateLimitLayer::new("weighted", limiter, PeerIp).unwrap().cost(|req: &Request<axum::body::Body>| {
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
    let full =
        Limiter::<Vec<u8>>::builder().limit(Limit::per_minute(10)).max_keys(1).clock(clock).build().unwrap();
    let layer = RateLimitLayer::new("full", full, HeaderKey::new("x-api-key").unwrap()).unwrap();
    let addr = serve(app().layer(layer)).await;
    assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "a")]).await.0, StatusCode::OK);
    assert_eq!(
        get_with(&client, addr, "/hello", &[("x-api-key", "b")]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// Sends `GET target` as written (no client normalises it) and returns the status code and
/// the body.
async fn raw_get(addr: SocketAddr, target: &str, headers: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nhost: test\r\n{headers}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// An upstream that routes every path (as one that normalises would route the spellings
/// below to `/login`), counting the requests that reach it.
fn counting_upstream() -> (Router, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&reached);
    let app = Router::new().fallback(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { "reached" }
    });
    (app, reached)
}

#[tokio::test]
async fn no_spelling_of_a_limited_path_escapes_its_limit() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(Limit::per_minute(1000), &clock), PeerIp)
        .unwrap()
        .route("/login", "login", limiter::<IpAddr>(Limit::per_minute(1), &clock))
        .unwrap();
    let (app, reached) = counting_upstream();
    let addr = serve(app.layer(layer)).await;
    assert_eq!(raw_get(addr, "/login", "").await.0, 200);
    let spellings = ["//login", "/%6Cogin", "/%6cogin", "/login;jsessionid=1", "/;x/login", "///login/"];
    for spelling in spellings {
        assert_eq!(raw_get(addr, spelling, "").await.0, 429, "{spelling} is /login, already used");
    }
    // No single normal form: refused whatever the route (dot segments too:
    // tests/gateway_hostile.rs shows why, against axum's own routing).
    for unsafe_path in [
        "/%2Flogin",
        "/%2flogin",
        "/%5Clogin",
        "/%256Cogin",
        "/%zzlogin",
        "/%00login",
        "/./login",
        "/api/../login",
        "/LOGIN/../login",
        "/x/..;/login",
        "/%2e%2e/login",
        "/login/.",
    ] {
        assert_eq!(raw_get(addr, unsafe_path, "").await.0, 400, "{unsafe_path}");
    }
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the first /login reached the upstream"
    );
    // Other paths keep the default budget.
    assert_eq!(raw_get(addr, "/loginx", "").await.0, 200);
    assert_eq!(raw_get(addr, "/LOGIN", "").await.0, 200, "case-sensitive by default");

    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(Limit::per_minute(1000), &clock), PeerIp)
        .unwrap()
        .ignore_case(true)
        .route("/Login", "login", limiter::<IpAddr>(Limit::per_minute(1), &clock))
        .unwrap();
    let (app, _) = counting_upstream();
    let addr = serve(app.layer(layer)).await;
    assert_eq!(raw_get(addr, "/login", "").await.0, 200);
    for spelling in ["/LOGIN", "/LoGiN/", "/%4Cogin"] {
        assert_eq!(raw_get(addr, spelling, "").await.0, 429, "{spelling} with ignore_case");
    }
}

#[tokio::test]
async fn headers_come_from_the_policy_version_that_decided() {
    use slidegate::{Carry, PolicyConfig};
    let clock = ManualClock::new();
    let limiter = Limiter::<Vec<u8>>::builder()
        .policy("free", PolicyConfig::new([Limit::per_second(10)]))
        .policy("paid", PolicyConfig::new([Limit::per_second(100), Limit::per_minute(3000)]))
        .max_keys(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let limiter = std::sync::Arc::new(limiter);
    limiter.set_policy(&b"gold-key"[..], "paid").unwrap();
    let layer =
        RateLimitLayer::new("api", std::sync::Arc::clone(&limiter), HeaderKey::new("x-api-key").unwrap())
            .unwrap();
    let addr = serve(app().layer(layer)).await;
    let client = client();

    let (_, headers) = get_with(&client, addr, "/hello", &[("x-api-key", "someone")]).await;
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"api.free\";q=10;w=1"));
    assert_eq!(header(&headers, "ratelimit"), Some("\"api.free\";r=9"));
    let (_, headers) = get_with(&client, addr, "/hello", &[("x-api-key", "gold-key")]).await;
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some("\"api.paid.0\";q=100;w=1, \"api.paid.1\";q=3000;w=60")
    );
    assert_eq!(header(&headers, "ratelimit"), Some("\"api.paid.0\";r=99"));

    // A runtime update is advertised from the next request on.
    limiter.update_policy("free", PolicyConfig::new([Limit::per_second(20)]), Carry::default()).unwrap();
    let (_, headers) = get_with(&client, addr, "/hello", &[("x-api-key", "someone")]).await;
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"api.free\";q=20;w=1"));
    assert_eq!(header(&headers, "ratelimit"), Some("\"api.free\";r=18"));

    // A window that is not whole seconds is advertised by its quota alone.
    let fast = Limiter::<IpAddr>::builder()
        .limit(Limit::new(10, std::time::Duration::from_millis(100)))
        .max_keys(10)
        .clock(clock)
        .build()
        .unwrap();
    let addr = serve(app().layer(RateLimitLayer::new("fast", fast, PeerIp).unwrap())).await;
    let (_, headers) = get_with(&client, addr, "/hello", &[]).await;
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"fast\";q=10"));
}

#[tokio::test]
async fn refusals_can_be_shaped_and_a_cost_that_never_fits_is_a_413() {
    use slidegate::tower::{Refusal, RefusalKind};
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("api", limiter::<IpAddr>(Limit::per_minute(2), &clock), PeerIp)
        .unwrap()
        .cost(|req: &Request<axum::body::Body>| if req.uri().path() == "/login" { 5 } else { 1 })
        .problem_json();
    let addr = serve(app().layer(layer)).await;
    let (status, body) = raw_get(addr, "/login", "").await;
    assert_eq!(status, 413, "a cost of 5 never fits 2/min");
    assert!(body.contains("\"status\":413") && !body.contains("retry_after"), "{body}");
    for _ in 0..2 {
        assert_eq!(raw_get(addr, "/hello", "").await.0, 200);
    }
    let (status, body) = raw_get(addr, "/%2F", "").await;
    assert_eq!(status, 400);
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 400);
    assert!(problem["detail"].as_str().unwrap().contains("'\\'"), "{body}");
    let client = client();
    let req = Request::get(format!("http://{addr}/hello")).body(Empty::new()).unwrap();
    let response = client.request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(response.headers(), "content-type"), Some("application/problem+json"));
    assert_eq!(header(response.headers(), "retry-after"), Some("61"));
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["retry_after"], 61);

    // A handler of the caller's own: a missing key is the client's fault here.
    let layer = RateLimitLayer::new(
        "keys",
        limiter::<Vec<u8>>(Limit::per_minute(2), &clock),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .unwrap()
    .on_refusal(|refusal: &Refusal| {
        let mut response = refusal.response(axum::body::Body::from(format!("no: {}", refusal.detail())));
        if refusal.kind() == RefusalKind::MissingKey {
            *response.status_mut() = StatusCode::UNAUTHORIZED;
        }
        response
    });
    let addr = serve(app().layer(layer)).await;
    let (status, body) = raw_get(addr, "/hello", "").await;
    assert_eq!((status, body.as_str()), (401, "no: the request carries no rate-limiting key"));
    let (status, body) = raw_get(addr, "/%2F", "x-api-key: k\r\n").await;
    assert_eq!(status, 400);
    assert!(body.starts_with("no: the request path has no single normal form"), "{body}");
}

#[test]
fn a_layer_is_checked_when_it_is_built() {
    use slidegate::tower::LayerError;
    let bounded = || Limiter::<IpAddr>::builder().limit(Limit::per_second(1)).max_keys(10).build().unwrap();
    let unbounded = Limiter::<IpAddr>::builder().limit(Limit::per_second(1)).build().unwrap();
    let err = RateLimitLayer::new("api", unbounded, PeerIp).unwrap_err();
    assert!(matches!(err, LayerError::UnboundedKeys { .. }));
    assert!(err.to_string().contains("max_keys"), "{err}");
    assert!(matches!(
        RateLimitLayer::new("apí", bounded(), PeerIp).unwrap_err(),
        LayerError::InvalidName { .. }
    ));
    assert!(matches!(
        RateLimitLayer::new("", bounded(), PeerIp).unwrap_err(),
        LayerError::InvalidName { .. }
    ));
    let layer = RateLimitLayer::new("api", bounded(), PeerIp).unwrap();
    assert!(matches!(
        layer.clone().route("/%2Fx", "x", bounded()).unwrap_err(),
        LayerError::InvalidRoute { .. }
    ));
    assert!(matches!(layer.route("/x", "x\n", bounded()).unwrap_err(), LayerError::InvalidName { .. }));
    assert!(matches!(HeaderKey::new("x api key").unwrap_err(), LayerError::InvalidHeaderName { .. }));
}

#[tokio::test]
async fn clients_behind_trusted_proxies_are_found_whatever_they_spoof() {
    let clock = ManualClock::new();
    // 1 request per minute per client: a 200 means a fresh budget (a new key).
    let serve_with = |key: ForwardedFor| {
        let layer = RateLimitLayer::new("p", limiter::<IpAddr>(Limit::per_minute(1), &clock), key).unwrap();
        serve(app().layer(layer))
    };
    let status = |addr, headers: &'static str| async move { raw_get(addr, "/hello", headers).await.0 };

    // One trusted hop: ports, bracketed IPv6 and spoofed entries to the left.
    let addr = serve_with(ForwardedFor::new(1)).await;
    assert_eq!(status(addr, "x-forwarded-for: 203.0.113.9:4711\r\n").await, 200);
    assert_eq!(status(addr, "x-forwarded-for: 203.0.113.9\r\n").await, 429, "the port is not the key");
    assert_eq!(status(addr, "x-forwarded-for: 1.1.1.1, 203.0.113.9:1\r\n").await, 429, "spoofed hop");
    assert_eq!(status(addr, "x-forwarded-for: [2001:db8::1]:443\r\n").await, 200);
    assert_eq!(status(addr, "x-forwarded-for: 2001:db8::2\r\n").await, 429, "same /64");
    assert_eq!(
        status(addr, "x-forwarded-for: \"a, [2001:db8::ffff]\r\n").await,
        429,
        "an open quote swallows nothing"
    );
    // An obfuscated client is no address: the client's 400.
    assert_eq!(status(addr, "x-forwarded-for: unknown\r\n").await, 400);

    // RFC 7239 `Forwarded`, on two lines, with an obfuscated port.
    let addr = serve_with(ForwardedFor::new(1).rfc7239()).await;
    assert_eq!(status(addr, "forwarded: for=\"[2001:db8:cafe::17]:4711\";proto=https\r\n").await, 200);
    assert_eq!(
        status(addr, "forwarded: for=6.6.6.6\r\nforwarded: for=\"[2001:db8:cafe::99]:_p\"\r\n").await,
        429
    );
    assert_eq!(status(addr, "forwarded: for=_hidden\r\n").await, 400);
    assert_eq!(status(addr, "forwarded: for=198.51.100.1;by=10.0.0.1\r\n").await, 200);

    // Trusted networks: the loopback peer is a trusted proxy, so is 10.0.0.0/8; the first
    // untrusted address from the right is the client, whatever it put further left.
    let addr = serve_with(ForwardedFor::trusting(["127.0.0.0/8", "10.0.0.0/8"]).unwrap()).await;
    assert_eq!(status(addr, "x-forwarded-for: 9.9.9.9, 198.51.100.50, 10.0.0.7\r\n").await, 200);
    for spoof in ["1.1.1.1", "2.2.2.2, 3.3.3.3", "10.9.9.9"] {
        let headers = format!("x-forwarded-for: {spoof}, 198.51.100.50, 10.0.0.7\r\n");
        let headers: &'static str = Box::leak(headers.into_boxed_str());
        assert_eq!(status(addr, headers).await, 429, "{spoof}");
    }
    // All hops trusted: the leftmost is the client.
    assert_eq!(status(addr, "x-forwarded-for: 10.1.1.1, 10.0.0.7\r\n").await, 200);
    assert_eq!(status(addr, "x-forwarded-for: 10.1.1.1\r\n").await, 429);

    // A peer outside the trusted networks is the client: its header is ignored.
    let addr = serve_with(ForwardedFor::trusting(["10.0.0.0/8"]).unwrap()).await;
    assert_eq!(status(addr, "x-forwarded-for: 198.51.100.60\r\n").await, 200);
    assert_eq!(status(addr, "x-forwarded-for: 198.51.100.61\r\n").await, 429, "keyed by the peer");
    assert!(matches!(
        ForwardedFor::trusting(["10.0.0.0/33"]).unwrap_err(),
        slidegate::tower::LayerError::InvalidNetwork { .. }
    ));
}

/// A shadow policy's quota binds no one: a key under it gets no `RateLimit` fields, even
/// past its shadow limit, while keys of the enforced policy get theirs; a shadow layer
/// stacked inside an enforced one leaves only the enforced layer's fields.
#[tokio::test]
async fn a_shadow_policy_advertises_nothing_and_an_enforced_layer_still_does() {
    use slidegate::PolicyConfig;
    let clock = ManualClock::new();
    let api = Limiter::<Vec<u8>>::builder()
        .policy("free", PolicyConfig::new([Limit::per_second(10)]))
        .policy("trial", PolicyConfig::new([Limit::per_second(2)]).shadow(true))
        .default_policy("free")
        .max_keys(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    api.set_policy(&b"trialist"[..], "trial").unwrap();
    let layer = RateLimitLayer::new("api", api, HeaderKey::new("x-api-key").unwrap()).unwrap();
    let addr = serve(app().layer(layer)).await;
    let client = client();
    for i in 0..4 {
        let (status, headers) = get_with(&client, addr, "/hello", &[("x-api-key", "trialist")]).await;
        assert_eq!(status, StatusCode::OK, "request {i}: shadow mode never refuses");
        assert_eq!(header(&headers, "ratelimit-policy"), None, "request {i}");
        assert_eq!(header(&headers, "ratelimit"), None, "request {i}");
    }
    let (_, headers) = get_with(&client, addr, "/hello", &[("x-api-key", "someone")]).await;
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"api.free\";q=10;w=1"));
    assert_eq!(header(&headers, "ratelimit"), Some("\"api.free\";r=9"));

    // A shadow layer (every policy shadow) inside an enforced one.
    let trial = Limiter::<IpAddr>::builder()
        .limit(Limit::per_second(1))
        .shadow(true)
        .max_keys(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let per_ip = limiter::<IpAddr>(Limit::per_second(100), &clock);
    let app = app()
        .layer(RateLimitLayer::new("trial", trial, PeerIp).unwrap())
        .layer(RateLimitLayer::new("per-ip", per_ip, PeerIp).unwrap());
    let addr = serve(app).await;
    for i in 0..3u64 {
        let (status, headers) = get_with(&client, addr, "/hello", &[]).await;
        assert_eq!(status, StatusCode::OK);
        let policies: Vec<&str> =
            headers.get_all("ratelimit-policy").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(policies, ["\"per-ip\";q=100;w=1"], "request {i}");
        let remaining = format!("\"per-ip\";r={}", 99 - i);
        let fields: Vec<&str> = headers.get_all("ratelimit").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(fields, [remaining.as_str()], "request {i}");
    }
}

/// The gateway guide's router: the API-key layer through `route_layer`, merged into an app
/// that the per-IP layer wraps. Requests for unknown paths (404) are charged per IP but not
/// to the API-key budget (its `anonymous` fallback key included); through `layer` they were,
/// since `layer` also wraps the merged router's fallback.
#[tokio::test]
async fn unknown_paths_are_not_charged_to_the_api_key_budget() {
    use axum::routing::post;
    let clock = ManualClock::new();
    let per_ip = limiter::<IpAddr>(Limit::per_second(100), &clock);
    let per_key = limiter::<Vec<u8>>(Limit::per_minute(3), &clock);
    let api = Router::new().route("/api/items", get(|| async { "items" })).route_layer(
        RateLimitLayer::new("api-key", per_key, HeaderKey::new("x-api-key").unwrap())
            .unwrap()
            .fallback_key(b"anonymous".to_vec()),
    );
    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/", get(|| async { "hello" }))
        .merge(api)
        .layer(RateLimitLayer::new("per-ip", per_ip, PeerIp).unwrap());
    let addr = serve(app).await;
    let client = client();
    for path in ["/nope", "/api", "/api/other", "/api/items/x"] {
        let (status, headers) = get_with(&client, addr, path, &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        let fields: Vec<&str> = headers.get_all("ratelimit").iter().map(|v| v.to_str().unwrap()).collect();
        assert!(fields.iter().all(|f| f.starts_with("\"per-ip\"")), "{path}: {fields:?}");
    }
    let (status, headers) = get_with(&client, addr, "/api/items", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let fields: Vec<&str> = headers.get_all("ratelimit").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(fields, ["\"api-key\";r=2", "\"per-ip\";r=95"], "the anonymous budget is untouched");
}

/// `ForwardedFor::new(1)` believes `X-Forwarded-For` from whoever connects: a client that
/// reaches the server directly writes the header itself and gets a fresh budget with each
/// value. `ForwardedFor::trusting` ignores the header of a peer outside the trusted
/// networks, so the same client has one budget.
#[tokio::test]
async fn a_direct_client_rotates_forwarded_for_past_a_hop_count_but_not_past_trusted_networks() {
    let clock = ManualClock::new();
    let client = client();
    let by_hops =
        RateLimitLayer::new("login", limiter::<IpAddr>(Limit::per_minute(5), &clock), ForwardedFor::new(1))
            .unwrap();
    let by_networks = RateLimitLayer::new(
        "login",
        limiter::<IpAddr>(Limit::per_minute(5), &clock),
        ForwardedFor::trusting(["10.0.0.0/8"]).unwrap(),
    )
    .unwrap();
    let mut admitted = Vec::new();
    for layer in [by_hops, by_networks] {
        let addr = serve(app().layer(layer)).await;
        let mut ok = 0;
        for i in 0..8 {
            let xff = format!("198.51.100.{i}");
            let (status, _) = get_with(&client, addr, "/login", &[("x-forwarded-for", &xff)]).await;
            ok += usize::from(status == StatusCode::OK);
        }
        admitted.push(ok);
    }
    assert_eq!(admitted, [8, 5], "hop count: every made-up address admitted; trusted networks: one budget");
}

/// `problem_json_with`: the problem object carries the gateway's `type` URI and its
/// extension members, escaped as JSON, through a real server.
#[tokio::test]
async fn a_problem_object_has_the_gateways_type_and_members() {
    use slidegate::tower::ProblemJson;
    let clock = ManualClock::new();
    let problem = ProblemJson::new()
        .type_uri("https://api.example.com/problems/rate-limited")
        .member("support", "https://api.example.com/limits")
        .unwrap()
        .member("note", "say \"please\"\n")
        .unwrap();
    let layer = RateLimitLayer::new("api", limiter::<IpAddr>(Limit::per_minute(1), &clock), PeerIp)
        .unwrap()
        .problem_json_with(problem);
    let addr = serve(app().layer(layer)).await;
    assert_eq!(raw_get(addr, "/hello", "").await.0, 200);
    let (status, body) = raw_get(addr, "/hello", "").await;
    assert_eq!(status, 429);
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["type"], "https://api.example.com/problems/rate-limited");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["retry_after"], 61); // a window and a slot: the unit leaves at 61 s
    assert_eq!(problem["support"], "https://api.example.com/limits");
    assert_eq!(problem["note"], "say \"please\"\n");
}

/// `route_for`: a POST-only `/login` limit counts sign-in attempts, not the form's GETs
/// (they go to the default route); a GET route also counts HEAD, which axum answers with
/// the GET handler.
#[tokio::test]
async fn method_routes_count_only_their_methods_and_head_counts_as_get() {
    use http::Method;
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new("default", limiter::<IpAddr>(Limit::per_second(100), &clock), PeerIp)
        .unwrap()
        .route_for(&[Method::POST], "/login", "login", limiter::<IpAddr>(Limit::per_minute(2), &clock))
        .unwrap()
        .route_for(&[Method::GET], "/report", "report", limiter::<IpAddr>(Limit::per_minute(1), &clock))
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "form" }).post(|| async { "welcome" }))
        .route("/report", get(|| async { "report" }))
        .layer(layer);
    let addr = serve(app).await;
    let client = client();
    let send = |method: Method, path: &'static str| {
        let client = client.clone();
        async move {
            let req = Request::builder()
                .method(method)
                .uri(format!("http://{addr}{path}"))
                .body(Empty::new())
                .unwrap();
            let response = client.request(req).await.unwrap();
            let fields: Vec<String> = response
                .headers()
                .get_all("ratelimit")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            (response.status(), fields)
        }
    };
    for _ in 0..5 {
        let (status, fields) = send(Method::GET, "/login").await;
        assert_eq!(status, StatusCode::OK);
        assert!(fields[0].starts_with("\"default\""), "{fields:?}");
    }
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(Method::POST, "/login").await.0);
    }
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    // HEAD runs GET /report's handler: it uses the route's one unit, and the GET is refused.
    assert_eq!(send(Method::HEAD, "/report").await.0, StatusCode::OK);
    assert_eq!(send(Method::GET, "/report").await.0, StatusCode::TOO_MANY_REQUESTS);
}

/// `ClientIpHeader`: a one-address header (here `X-Real-IP`, `CF-Connecting-IP`) is the
/// key only from a trusted peer; from any other peer the header is ignored and the peer is
/// the key, so a client that connects directly and rotates the header keeps one budget.
#[tokio::test]
async fn client_address_headers_are_believed_from_trusted_peers_only() {
    use slidegate::tower::ClientIpHeader;
    let clock = ManualClock::new();
    let client = client();
    // The test client connects from 127.0.0.1.
    let trusted = ClientIpHeader::x_real_ip(["127.0.0.0/8"]).unwrap();
    let untrusted = ClientIpHeader::cf_connecting_ip(["10.0.0.0/8"]).unwrap();
    let mut admitted = Vec::new();
    for (name, key) in [("x-real-ip", trusted), ("cf-connecting-ip", untrusted)] {
        let layer = RateLimitLayer::new("ip", limiter::<IpAddr>(Limit::per_minute(2), &clock), key).unwrap();
        let addr = serve(app().layer(layer)).await;
        let mut ok = 0;
        for i in 0..5 {
            let value = format!("198.51.100.{i}");
            ok += usize::from(get_with(&client, addr, "/hello", &[(name, &value)]).await.0 == StatusCode::OK);
        }
        admitted.push(ok);
        if name == "x-real-ip" {
            // From the trusted peer: no header is the proxy's mistake, garbage the client's.
            assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::INTERNAL_SERVER_ERROR);
            assert_eq!(get_with(&client, addr, "/hello", &[(name, "nope")]).await.0, StatusCode::BAD_REQUEST);
        }
    }
    assert_eq!(admitted, [5, 2], "trusted: five clients; untrusted: the peer's one budget");
}

/// Exemptions: a health-check path, an internal network (the test client's 127.0.0.1) and
/// an allow-listed key pass without a check and without `RateLimit` fields, while other
/// requests are limited as usual.
#[tokio::test]
async fn exempt_paths_networks_and_keys_pass_unchecked() {
    let clock = ManualClock::new();
    let client = client();
    let app = || app().route("/healthz", get(|| async { "ok" }));

    let by_path = RateLimitLayer::new("ip", limiter::<IpAddr>(Limit::per_minute(1), &clock), PeerIp)
        .unwrap()
        .exempt_paths(["/healthz"])
        .unwrap();
    let addr = serve(app().layer(by_path)).await;
    for _ in 0..3 {
        let (status, headers) = get_with(&client, addr, "/healthz", &[]).await;
        assert_eq!((status, header(&headers, "ratelimit")), (StatusCode::OK, None));
    }
    // Another spelling of the same path is exempt too (axum itself does not serve it: 404,
    // uncounted); other paths are limited.
    for _ in 0..2 {
        let (status, headers) = get_with(&client, addr, "//healthz", &[]).await;
        assert_eq!((status, header(&headers, "ratelimit")), (StatusCode::NOT_FOUND, None));
    }
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
    assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::TOO_MANY_REQUESTS);

    let by_network = RateLimitLayer::new("ip", limiter::<IpAddr>(Limit::per_minute(1), &clock), PeerIp)
        .unwrap()
        .exempt_networks(["127.0.0.0/8"])
        .unwrap();
    let addr = serve(app().layer(by_network)).await;
    for _ in 0..3 {
        assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
    }

    let by_key = RateLimitLayer::new(
        "api",
        limiter::<Vec<u8>>(Limit::per_minute(1), &clock),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .unwrap()
    .exempt_keys([b"batch-job".to_vec()]);
    let addr = serve(app().layer(by_key)).await;
    for _ in 0..3 {
        assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "batch-job")]).await.0, StatusCode::OK);
    }
    assert_eq!(get_with(&client, addr, "/hello", &[("x-api-key", "someone")]).await.0, StatusCode::OK);
    assert_eq!(
        get_with(&client, addr, "/hello", &[("x-api-key", "someone")]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// `legacy_headers(true)`: `X-RateLimit-Limit` and `X-RateLimit-Remaining` on admissions,
/// and `X-RateLimit-Reset` (seconds, as `Retry-After`) on refusals, beside the draft's
/// fields; off by default.
#[tokio::test]
async fn legacy_rate_limit_headers_are_an_option() {
    let clock = ManualClock::new();
    let client = client();
    let layer = RateLimitLayer::new("api", limiter::<IpAddr>(Limit::per_minute(2), &clock), PeerIp)
        .unwrap()
        .legacy_headers(true);
    let addr = serve(app().layer(layer)).await;
    let (status, headers) = get_with(&client, addr, "/hello", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), None);
    assert_eq!(header(&headers, "ratelimit"), Some("\"api\";r=1"));
    let _ = get_with(&client, addr, "/hello", &[]).await;
    let (status, headers) = get_with(&client, addr, "/hello", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), header(&headers, "retry-after"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), Some("61"));

    let plain = RateLimitLayer::new("api", limiter::<IpAddr>(Limit::per_minute(2), &clock), PeerIp).unwrap();
    let addr = serve(app().layer(plain)).await;
    let (_, headers) = get_with(&client, addr, "/hello", &[]).await;
    assert_eq!(header(&headers, "x-ratelimit-limit"), None);
}

/// `on_shadow_denial`: the hook sees each request a shadow policy would have refused (the
/// route, the key, the decision), and nothing else; every request is let through.
#[tokio::test]
async fn the_shadow_denial_hook_sees_each_would_be_refusal() {
    use std::sync::{Arc, Mutex};
    let clock = ManualClock::new();
    let client = client();
    let trial = Limiter::<IpAddr>::builder()
        .limit(Limit::per_minute(1))
        .shadow(true)
        .max_keys(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let layer =
        RateLimitLayer::new("trial", trial, PeerIp).unwrap().on_shadow_denial(move |route, ip, decision| {
            record.lock().unwrap().push((
                route.to_owned(),
                *ip,
                decision.shadow_denial(),
                decision.is_allowed(),
            ));
        });
    let addr = serve(app().layer(layer)).await;
    for _ in 0..3 {
        assert_eq!(get_with(&client, addr, "/hello", &[]).await.0, StatusCode::OK);
    }
    let localhost: IpAddr = "127.0.0.1".parse().unwrap();
    let denial = Some(slidegate::Denial::Limit(0));
    let expected = vec![("trial".to_owned(), localhost, denial, true); 2];
    assert_eq!(*seen.lock().unwrap(), expected);
}

/// `ClientIpHeader` against what a client sends as raw bytes from a trusted peer: a
/// repeated header, a list, braces, spaces, 10 KB of digits, an empty value. None of them
/// reaches the upstream or gets a key of its own; a well-formed address with a port is
/// keyed by its address, so its budget is the plain address's.
#[tokio::test]
async fn a_client_address_header_from_a_trusted_peer_fails_closed_on_garbage() {
    use slidegate::tower::ClientIpHeader;
    let clock = ManualClock::new();
    let key = ClientIpHeader::x_real_ip(["127.0.0.0/8"]).unwrap();
    let layer = RateLimitLayer::new("ip", limiter::<IpAddr>(Limit::per_minute(1), &clock), key).unwrap();
    let (upstream, reached) = counting_upstream();
    let addr = serve(upstream.layer(layer)).await;
    let long = "1".repeat(10_000);
    for headers in [
        "x-real-ip: 198.51.100.7\r\nx-real-ip: 198.51.100.8\r\n".to_owned(),
        "x-real-ip: 198.51.100.7, 203.0.113.9\r\n".to_owned(),
        "x-real-ip: {198.51.100.7}\r\n".to_owned(),
        "x-real-ip: 198.51 .100.7\r\n".to_owned(),
        format!("x-real-ip: {long}\r\n"),
        "x-real-ip: \r\n".to_owned(),
    ] {
        let (status, _) = raw_get(addr, "/hello", &headers).await;
        assert_eq!(status, 400, "{headers:?}");
    }
    assert_eq!(reached.load(std::sync::atomic::Ordering::Relaxed), 0, "nothing failed open");
    assert_eq!(raw_get(addr, "/hello", "x-real-ip: 198.51.100.7:4711\r\n").await.0, 200);
    assert_eq!(raw_get(addr, "/hello", "x-real-ip: 198.51.100.7\r\n").await.0, 429);
}
