//! Checks per second and latency of the Redis-backed limiters against a Redis on loopback:
//! `cargo run --release --example redis_report --features redis -- --url redis://127.0.0.1:6379`.
//!
//! * `RedisLimiter`: one multiplexed connection, 64 checks in flight (64 tasks), 1000 keys;
//! * the seed-style fixed window (`INCR` + `PEXPIRE` in a script) on the same connection
//!   and load, as the baseline;
//! * redis-cell's `CL.THROTTLE` (GCRA in a Redis module) when `--cell-url` points at a Redis
//!   that loaded it (`bash .ci/redis-cell` builds the module);
//! * `HybridLimiter`: checks in process, syncing every 50 ms in the background.
//!
//! `--quick` runs fewer checks (CI).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;
use slidegate::redis::{DecidedBy, RedisLimiter};
use slidegate::Limit;

const IN_FLIGHT: u64 = 64;
const KEYS: u64 = 1000;

struct Row {
    name: &'static str,
    per_second: f64,
    p50: u64,
    p99: u64,
}

fn row(name: &'static str, checks: u64, elapsed: Duration, latencies: &Histogram<u64>) -> Row {
    Row {
        name,
        per_second: checks as f64 / elapsed.as_secs_f64(),
        p50: latencies.value_at_quantile(0.5),
        p99: latencies.value_at_quantile(0.99),
    }
}

/// `checks` calls of `call` from `IN_FLIGHT` tasks; the wall time and every latency (ns).
async fn load<F, Fut>(checks: u64, call: F) -> Result<(Duration, Histogram<u64>), Box<dyn std::error::Error>>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..IN_FLIGHT {
        let call = Arc::clone(&call);
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
            let mut failures = 0u64;
            for i in 0..checks / IN_FLIGHT {
                let key = (t * 7919 + i * 104_729) % KEYS;
                let at = Instant::now();
                failures += u64::from(!call(key).await);
                h.saturating_record(at.elapsed().as_nanos() as u64);
            }
            Ok::<_, String>((h, failures))
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for task in tasks {
        let (h, failures) = task.await??;
        if failures > 0 {
            return Err(format!("{failures} checks did not reach Redis").into());
        }
        all.add(h)?;
    }
    Ok((start.elapsed(), all))
}

/// slidegate's Redis backends on loopback, beside redis-cell when --cell-url is given.
#[derive(argh::FromArgs)]
struct Args {
    /// the Redis to measure (default redis://127.0.0.1:6379)
    #[argh(option, default = "String::from(\"redis://127.0.0.1:6379\")")]
    url: String,
    /// a Redis with the redis-cell module loaded, to compare CL.THROTTLE
    #[argh(option)]
    cell_url: Option<String>,
    /// fewer checks (CI)
    #[argh(switch)]
    quick: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { url, cell_url, quick } = argh::from_env();
    let checks: u64 = if quick { 6_400 } else { 128_000 };
    let limit = Limit::per_second(1_000_000);
    let mut rows = Vec::new();

    let limiter = Arc::new(
        RedisLimiter::<u64>::builder()
            .url(&url)
            .limit(limit)
            .prefix("bench:")
            .timeout(Duration::from_secs(1))
            .build()
            .await?,
    );
    let redis = Arc::clone(&limiter);
    let (elapsed, latencies) = load(checks, move |key| {
        let redis = Arc::clone(&redis);
        async move { redis.check(&key).await.decided_by() == DecidedBy::Server }
    })
    .await?;
    rows.push(row("RedisLimiter (sliding window, 1 s slots)", checks, elapsed, &latencies));

    let conn = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let script = Arc::new(redis::Script::new(
        "local c = redis.call('INCR', KEYS[1]) if c == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end return c",
    ));
    let (elapsed, latencies) = load(checks, move |key| {
        let (mut conn, script) = (conn.clone(), Arc::clone(&script));
        async move {
            let window =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let count: redis::RedisResult<u64> =
                script.key(format!("fixed:{key}:{window}")).arg(1000).invoke_async(&mut conn).await;
            count.is_ok()
        }
    })
    .await?;
    rows.push(row("fixed window, INCR + PEXPIRE script (baseline)", checks, elapsed, &latencies));

    if let Some(cell_url) = cell_url {
        let conn = ConnectionManager::new(redis::Client::open(cell_url.as_str())?).await?;
        let (elapsed, latencies) = load(checks, move |key| {
            let mut conn = conn.clone();
            async move {
                let mut cmd = redis::cmd("CL.THROTTLE");
                cmd.arg(format!("cell:{key}")).arg(999_999).arg(1_000_000).arg(1).arg(1);
                let reply: redis::RedisResult<Vec<i64>> = cmd.query_async(&mut conn).await;
                reply.is_ok()
            }
        })
        .await?;
        rows.push(row("redis-cell CL.THROTTLE (GCRA module)", checks, elapsed, &latencies));
    }

    let hybrid =
        RedisLimiter::<u64>::builder().url(&url).limit(limit).prefix("bench-hybrid:").build_hybrid().await?;
    let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let local_checks = checks * 10;
    let start = Instant::now();
    for i in 0..local_checks {
        let at = Instant::now();
        let _ = std::hint::black_box(hybrid.check(&(i % KEYS)));
        latencies.saturating_record(at.elapsed().as_nanos() as u64);
    }
    let elapsed = start.elapsed();
    hybrid.sync_now().await;
    rows.push(row("HybridLimiter (in process, one thread)", local_checks, elapsed, &latencies));

    println!("Redis on loopback ({url}), {IN_FLIGHT} checks in flight on one connection, {KEYS} keys (`cargo run --release --example redis_report --features redis`)\n");
    println!("| limiter | checks/s | p50 | p99 |\n|---|---:|---:|---:|");
    for r in rows {
        let us =
            |ns: u64| if ns < 10_000 { format!("{ns} ns") } else { format!("{:.0} µs", ns as f64 / 1000.0) };
        println!("| {} | {:.0} | {} | {} |", r.name, r.per_second, us(r.p50), us(r.p99));
    }
    Ok(())
}
