//! A small reverse proxy (axum) in front of an upstream it starts itself, rate-limited by
//! slidegate's tower layer:
//!
//! * every client IP: 100 requests per second, and `GET /login` 5 per minute;
//! * `/api/...`: 10 per second and 300 per minute per API key (`X-Api-Key`; requests
//!   without one share the key `anonymous`).
//!
//! `cargo run --example http_gateway --features axum` listens on `127.0.0.1:8080`
//! (`--listen ADDR` to change) and prints curl commands to try; Ctrl-C stops it cleanly.
//! `--demo` sends those requests itself (a sixth `/login` within the minute gets the 429)
//! and exits.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{Request, Response, StatusCode, Uri};
use axum::Router;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slidegate::tower::{HeaderKey, PeerIp, RateLimitLayer};
use slidegate::{Limit, Limiter};
use tokio::net::TcpListener;

#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    client: Client<HttpConnector, Body>,
}

/// Forwards the request, as the client sent it, to the upstream.
async fn proxy(
    State(upstream): State<Upstream>,
    OriginalUri(original): OriginalUri,
    mut req: Request<Body>,
) -> Result<Response<Body>, StatusCode> {
    let path = original.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("http://{}{path}", upstream.addr).parse().map_err(|_| StatusCode::BAD_REQUEST)?;
    *req.uri_mut() = uri;
    let response = upstream.client.request(req).await.map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(response.map(Body::new))
}

/// The upstream: answers every request with what it saw.
async fn start_upstream() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = Router::new().fallback(|req: Request<Body>| async move {
        format!("upstream saw {} {}\n", req.method(), req.uri())
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The most keys (client IPs, API keys) each limiter holds at once. Both come from
/// clients, and the `X-Api-Key` header is whatever a client sends: without a bound, random
/// values would grow the limiters without end. At the bound a new key gets a 503 until idle
/// ones are swept (a key idle for its longest window holds no count).
const MAX_KEYS: usize = 100_000;

/// The gateway's router: the per-IP layer outside, the per-API-key layer on `/api`.
fn gateway(upstream: Upstream) -> Result<Router, Box<dyn std::error::Error>> {
    let per_ip = Limiter::<IpAddr>::builder()
        .name("per-ip")
        .limit(Limit::per_second(100))
        .max_keys(MAX_KEYS)
        .build()?;
    let login =
        Limiter::<IpAddr>::builder().name("login").limit(Limit::per_minute(5)).max_keys(MAX_KEYS).build()?;
    let per_key = Limiter::<Vec<u8>>::builder()
        .name("api-key")
        .limit(Limit::per_second(10))
        .limit(Limit::per_minute(300))
        .max_keys(MAX_KEYS)
        .build()?;
    // Every spelling of /login (//login, /%6Cogin, /login;x=1) counts as /login; a dot
    // segment (/api/../login) is refused with 400.
    let ip_layer = RateLimitLayer::new("per-ip", per_ip, PeerIp)?.route("/login", "login", login)?;
    let key_layer = RateLimitLayer::new("api-key", per_key, HeaderKey::new("x-api-key")?)?
        .fallback_key(b"anonymous".to_vec());
    let api = Router::new().fallback(proxy).layer(key_layer);
    Ok(Router::new().nest("/api", api).fallback(proxy).layer(ip_layer).with_state(upstream))
}

/// Sends the requests the printed curl commands would, and prints what came back.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new()).build_http();
    let show = |what: &str, r: &Response<hyper::body::Incoming>| {
        let h = |name: &str| {
            let values: Vec<&str> =
                r.headers().get_all(name).iter().filter_map(|v| v.to_str().ok()).collect();
            if values.is_empty() {
                "-".to_owned()
            } else {
                values.join(", ")
            }
        };
        println!(
            "{what:<28} {} RateLimit: {}  Retry-After: {}",
            r.status().as_u16(),
            h("ratelimit"),
            h("retry-after")
        );
    };
    let mut statuses = Vec::new();
    for i in 1..=6 {
        let r = client.request(Request::get(format!("http://{addr}/login")).body(Body::empty())?).await?;
        show(&format!("GET /login #{i}"), &r);
        statuses.push(r.status());
    }
    for i in 1..=3 {
        let req = Request::get(format!("http://{addr}/api/items"))
            .header("x-api-key", "k-123")
            .body(Body::empty())?;
        let r = client.request(req).await?;
        show(&format!("GET /api/items (k-123) #{i}"), &r);
    }
    if statuses[..5].iter().all(|s| s.is_success()) && statuses[5] == StatusCode::TOO_MANY_REQUESTS {
        println!("\nthe sixth /login within the minute got the 429, as configured");
        Ok(())
    } else {
        Err(format!("unexpected statuses for /login: {statuses:?}").into())
    }
}

/// a reverse proxy rate-limited per client IP and per API key.
#[derive(argh::FromArgs)]
struct Args {
    /// the address to listen on (default 127.0.0.1:8080)
    #[argh(option, default = "String::from(\"127.0.0.1:8080\")")]
    listen: String,
    /// send the printed requests itself, then exit
    #[argh(switch)]
    demo: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Args = argh::from_env();
    let listen = args.listen.as_str();
    let upstream = Upstream {
        addr: start_upstream().await?,
        client: Client::builder(TokioExecutor::new()).build_http(),
    };
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    let app = gateway(upstream.clone())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    println!("gateway on http://{addr} -> upstream http://{}", upstream.addr);
    println!("  per client IP: 100/s; GET /login: 5/min; /api: 10/s and 300/min per X-Api-Key\n");
    if args.demo {
        let outcome = demo(addr).await;
        let _ = stop.send(());
        server.await??;
        return outcome;
    }
    println!("try:");
    println!(
        "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/login; done"
    );
    println!("  curl -i http://{addr}/login            # RateLimit and Retry-After headers");
    println!("  curl -i -H 'X-Api-Key: k-123' http://{addr}/api/items");
    println!("  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'X-Api-Key: k-123' http://{addr}/api/items; done; echo");
    println!("Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    println!("shutting down");
    let _ = stop.send(());
    server.await??;
    Ok(())
}
