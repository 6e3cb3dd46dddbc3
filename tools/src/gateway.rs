//! The tower layer's overhead per request and the cost of metrics per check (features
//! `tower`, `axum`, `metrics`): shared by the criterion bench (`cargo bench -p slidegate-benches --bench
//! limiter --features gateway -- gateway`) and `tools/src/bin/gateway_report.rs`, which prints the README's
//! figures.

use std::convert::Infallible;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use http::{Request, Response};
use slidegate::tower::{PeerIp, RateLimitLayer};
use slidegate::{Limit, Limiter};
use tower::{Layer, Service, ServiceExt};

/// Client addresses the requests come from.
pub const CLIENTS: u32 = 1000;

/// A limiter that never refuses during a benchmark (the admitting path is measured).
pub fn open_limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>() -> Limiter<K> {
    match Limiter::builder().limit(Limit::per_second(4_000_000_000)).max_keys(1 << 20).build() {
        Ok(limiter) => limiter,
        Err(e) => unreachable!("a valid limit: {e}"),
    }
}

/// The hello-world service.
pub fn hello() -> impl Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone {
    tower::service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::from("hello"))) })
}

/// The hello-world service behind the layer, keyed by peer IP.
pub fn limited() -> impl Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone {
    RateLimitLayer::new("bench", open_limiter::<IpAddr>(), PeerIp)
        .unwrap_or_else(|e| unreachable!("a bounded limiter: {e}"))
        .layer(hello())
}

/// `n` requests through `service`, from `CLIENTS` addresses in turn; the time taken.
pub async fn requests<S>(mut service: S, n: u64) -> Duration
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let start = Instant::now();
    for i in 0..n {
        let mut req = Request::new(());
        let ip = Ipv4Addr::from(0x0a00_0000 + (i as u32 % CLIENTS));
        req.extensions_mut().insert(SocketAddr::new(IpAddr::V4(ip), 40000));
        let ready = service.ready().await.unwrap_or_else(|never| match never {});
        let response = ready.call(req).await.unwrap_or_else(|never| match never {});
        black_box(response);
    }
    start.elapsed()
}

/// `n` checks cycling through 1000 keys of `limiter`; the time taken.
pub fn checks(limiter: &Limiter<u64>, n: u64) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        let _ = black_box(limiter.check(black_box(&(i % 1000))));
    }
    start.elapsed()
}
