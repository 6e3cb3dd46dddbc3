//! The gateway glue's costs, one markdown table:
//! `cargo run --release -p slidegate-tools --bin gateway_report --features gateway`.
//!
//! * the tower layer's overhead per request, in process: a hello-world tower service called
//!   directly, with and without the layer (keyed by peer IP, 1000 clients, nothing refused);
//! * requests per second through a real hyper server (axum) on loopback, one keep-alive
//!   connection, with and without the layer;
//! * a check on 1000 keys with a `metrics` recorder installed, against the same limiter
//!   with no recorder (no-op handles).
//!
//! Rounds are interleaved and medians reported (`--rounds N`, default 7).

use slidegate_tools::gateway;

use std::net::SocketAddr;
use std::time::Instant;

use axum::routing::get;
use axum::Router;
use gateway::{checks, hello, limited, open_limiter, requests};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_util::debugging::DebuggingRecorder;
use slidegate::tower::{PeerIp, RateLimitLayer};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

async fn serve(app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
    });
    Ok(addr)
}

/// Requests per second over `n` sequential GETs on one keep-alive connection.
async fn per_second(addr: SocketAddr, n: u32) -> Result<f64, Box<dyn std::error::Error>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: hyper::Uri = format!("http://{addr}/").parse()?;
    let start = Instant::now();
    for _ in 0..n {
        let response = client.get(uri.clone()).await?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()).into());
        }
    }
    Ok(f64::from(n) / start.elapsed().as_secs_f64())
}

/// what the gateway glue costs: the tower layer in process, over HTTP, and the metrics.
#[derive(argh::FromArgs)]
struct Args {
    /// interleaved rounds (default 7)
    #[argh(option, default = "7")]
    rounds: usize,
    /// fewer calls per round (CI)
    #[argh(switch)]
    quick: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { rounds, quick } = argh::from_env();
    let (calls, http, checks_n) = if quick { (20_000, 300, 100_000) } else { (300_000, 3_000, 2_000_000) };

    // 1. In process.
    let (mut plain, mut layered, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let a = requests(hello(), calls).await.as_nanos() as f64 / calls as f64;
        let b = requests(limited(), calls).await.as_nanos() as f64 / calls as f64;
        plain.push(a);
        layered.push(b);
        overhead.push(b - a);
    }

    // 2. Through hyper on loopback.
    let app = || Router::new().route("/", get(|| async { "hello" }));
    let bare = serve(app()).await?;
    let layer = RateLimitLayer::new("bench", open_limiter::<std::net::IpAddr>(), PeerIp)
        .unwrap_or_else(|e| unreachable!("a bounded limiter: {e}"));
    let with_layer = serve(app().layer(layer)).await?;
    let (mut bare_rps, mut layer_rps) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        bare_rps.push(per_second(bare, http).await?);
        layer_rps.push(per_second(with_layer, http).await?);
    }

    // 3. Metrics.
    let quiet = open_limiter::<u64>();
    let recorder = DebuggingRecorder::new();
    recorder.install()?;
    let counted = open_limiter::<u64>();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off.push(checks(&quiet, checks_n).as_nanos() as f64 / checks_n as f64);
        on.push(checks(&counted, checks_n).as_nanos() as f64 / checks_n as f64);
    }

    println!("slidegate gateway glue, {rounds} interleaved rounds, medians (`cargo run --release -p slidegate-tools --bin gateway_report --features gateway`)\n");
    println!("| measure | without | with | difference |\n|---|---:|---:|---:|");
    println!(
        "| tower service call, in process (ns per request) | {:.0} | {:.0} | {:+.0} ns |",
        median(plain),
        median(layered),
        median(overhead)
    );
    let (b, l) = (median(bare_rps), median(layer_rps));
    println!(
        "| hyper on loopback, one connection (requests/s) | {b:.0} | {l:.0} | {:+.1} % |",
        100.0 * (l / b - 1.0)
    );
    let (a, b) = (median(off), median(on));
    println!(
        "| check, 1000 keys: no recorder / metrics recorder installed (ns) | {a:.1} | {b:.1} | {:+.1} ns |",
        b - a
    );
    Ok(())
}
