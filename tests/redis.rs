//! `RedisLimiter` and `HybridLimiter` against real Redis servers on loopback (standalone and
//! a three-primary Cluster; see `support/servers.rs`):
//!
//! * the same decisions as the in-process limiter, step by step, on random traffic over
//!   several keys and limits (strict and interpolated), with the clock passed explicitly:
//!   admitted, remaining, denial and tightest limit equal, and `retry_after` the in-process
//!   one rounded up to Redis's millisecond;
//! * many tasks on several connections hammering one key admit exactly the limit;
//! * faults: a stopped server is answered by the fallback within the timeout, and once it
//!   is back no admitted unit is missing from its count; a server that stalls does not
//!   stall checks; fail open and fail closed say so;
//! * four hybrid replicas sharing one Redis stay within the documented bound.
//!
//! A `libtest-mimic` binary (`harness = false`): a test whose server is missing reports
//! `ignored` with the reason, or fails under `SLIDEGATE_REQUIRE_SERVERS` (see
//! `support/servers.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod rng;
    pub mod servers;
}
use support::rng::Rng;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slidegate::redis::{DecidedBy, Fallback, RedisLimiter};
use slidegate::{Limit, Limiter, ManualClock};
use support::servers::{redis_command, redis_module, trial, Cluster, RedisServer, Standalone};

fn main() -> std::process::ExitCode {
    support::servers::run(vec![
        trial(
            "standalone_redis_decides_exactly_as_the_in_process_limiter",
            0,
            Standalone::get,
            standalone_redis_decides_exactly_as_the_in_process_limiter,
        ),
        trial(
            "redis_cluster_decides_exactly_as_the_in_process_limiter",
            0,
            Cluster::get,
            redis_cluster_decides_exactly_as_the_in_process_limiter,
        ),
        trial(
            "many_tasks_on_several_connections_admit_exactly_the_limit",
            4,
            Standalone::get,
            many_tasks_on_several_connections_admit_exactly_the_limit,
        ),
        trial(
            "a_stopped_server_is_answered_by_the_fallback_and_nothing_admitted_is_lost",
            0,
            || RedisServer::start(&["--enable-debug-command", "yes"]),
            a_stopped_server_is_answered_by_the_fallback_and_nothing_admitted_is_lost,
        ),
        trial(
            "four_hybrid_replicas_stay_within_the_documented_bound",
            2,
            Standalone::get,
            four_hybrid_replicas_stay_within_the_documented_bound,
        ),
        trial(
            "concurrent_checks_share_script_calls_and_decide_exactly",
            2,
            || RedisServer::start(&[]),
            concurrent_checks_share_script_calls_and_decide_exactly,
        ),
        trial(
            "the_module_decides_exactly_as_the_in_process_limiter",
            0,
            with_module,
            the_module_decides_exactly_as_the_in_process_limiter,
        ),
        trial(
            "the_module_and_the_script_take_turns_on_the_same_keys",
            0,
            with_module,
            the_module_and_the_script_take_turns_on_the_same_keys,
        ),
        trial(
            "concurrent_checks_through_the_module_share_calls_and_decide_exactly",
            2,
            with_module,
            concurrent_checks_share_script_calls_and_decide_exactly,
        ),
        trial(
            "the_module_answers_malformed_calls_with_errors",
            0,
            with_module,
            the_module_answers_malformed_calls_with_errors,
        ),
        trial(
            "a_server_that_loses_the_module_is_answered_by_the_script",
            0,
            || {
                let module = redis_module()?;
                RedisServer::start(&["--loadmodule", &module, "--enable-module-command", "yes"])
            },
            a_server_that_loses_the_module_is_answered_by_the_script,
        ),
        trial(
            "a_caller_clock_behind_the_stored_time_does_not_rewind_it",
            0,
            Standalone::get,
            a_caller_clock_behind_the_stored_time_does_not_rewind_it,
        ),
    ])
}

fn prefix(test: &str) -> String {
    format!("t-{test}-{}-{}:", std::process::id(), Instant::now().elapsed().as_nanos())
}

/// Long windows: Redis expires idle hashes on its own (real) clock after the longest
/// window plus a slot, so the simulated time of a run must stay far below that.
fn limit_sets() -> Vec<Vec<Limit>> {
    let p = |s: &str| s.parse::<Limit>().unwrap();
    vec![
        vec![p("5/min")],
        vec![p("7/2min@10s strict")],
        vec![p("4/min@30s"), p("10/10min strict"), p("20/h@1min")],
        vec![p("500/min@60s")],
    ]
}

/// Random traffic through both limiters on one clock; every decision must agree.
async fn same_decisions_as_in_process(
    builder: impl Fn(&ManualClock, &[Limit], &str) -> slidegate::redis::RedisLimiterBuilder<u64>,
    test: &str,
) {
    for (set, limits) in limit_sets().iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(1_000_000));
        let redis = builder(&clock, limits, &format!("{}{set}", prefix(test))).build().await.unwrap();
        let mut local = Limiter::<u64>::builder().clock(clock.clone());
        for limit in limits {
            local = local.limit(*limit);
        }
        let local = local.build().unwrap();
        let mut rng = Rng(set as u64 + 1);
        for step in 0..400 {
            if rng.below(10) < 3 {
                clock.advance(Duration::from_millis(match rng.below(4) {
                    0 => 1 + rng.below(10),
                    1 => 1 + rng.below(2_000),
                    2 => 1 + rng.below(30_000),
                    _ => 1 + rng.below(600_000),
                }));
            }
            let key = rng.below(3);
            let peek = rng.below(6) == 0;
            let cost = if peek { 1 } else { [0, 1, 1, 1, 2, 3, 7][rng.below(7) as usize] };
            let (ours, theirs) = if peek {
                (local.peek(&key), redis.peek(&key).await)
            } else {
                (local.check_n(&key, cost), redis.check_n(&key, cost).await)
            };
            let what =
                format!("set {set} step {step} key {key} cost {cost} peek {peek} at {:?}", clock.now());
            assert_eq!(theirs.decided_by(), DecidedBy::Server, "{what}");
            assert_eq!(theirs.is_allowed(), ours.is_allowed(), "{what}: {ours:?} vs {theirs:?}");
            assert_eq!(theirs.remaining(), ours.remaining(), "{what}: {ours:?} vs {theirs:?}");
            assert_eq!(theirs.denial(), ours.denial(), "{what}: {ours:?} vs {theirs:?}");
            assert_eq!(theirs.tightest_limit(), ours.tightest_limit(), "{what}: {ours:?} vs {theirs:?}");
            let ms = |d: Option<Duration>| d.map(|d| d.as_nanos().div_ceil(1_000_000));
            assert_eq!(ms(theirs.retry_after()), ms(ours.retry_after()), "{what}: {ours:?} vs {theirs:?}");
        }
    }
}

fn standalone_builder(
    url: String,
) -> impl Fn(&ManualClock, &[Limit], &str) -> slidegate::redis::RedisLimiterBuilder<u64> {
    move |clock, limits, prefix| {
        let mut b = RedisLimiter::<u64>::builder()
            .url(&url)
            .clock(clock.clone())
            .prefix(prefix)
            .timeout(Duration::from_secs(2));
        for l in limits {
            b = b.limit(*l);
        }
        b
    }
}

async fn standalone_redis_decides_exactly_as_the_in_process_limiter(server: Standalone) {
    same_decisions_as_in_process(standalone_builder(server.url()), "same").await;
}

async fn redis_cluster_decides_exactly_as_the_in_process_limiter(cluster: Cluster) {
    let urls = cluster.urls();
    let builder = move |clock: &ManualClock, limits: &[Limit], prefix: &str| {
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let mut b = RedisLimiter::<u64>::builder()
            .cluster(&refs)
            .clock(clock.clone())
            .prefix(prefix)
            .timeout(Duration::from_secs(2));
        for l in limits {
            b = b.limit(*l);
        }
        b
    };
    same_decisions_as_in_process(builder, "cluster").await;
}

async fn many_tasks_on_several_connections_admit_exactly_the_limit(server: Standalone) {
    const MAX: u64 = 150;
    for round in 0..5 {
        let clock = ManualClock::new();
        clock.advance(Duration::from_secs(100));
        let prefix = format!("{}{round}", prefix("hammer"));
        let mut limiters = Vec::new();
        for _ in 0..4 {
            let limiter = RedisLimiter::<u64>::builder()
                .url(&server.url())
                .limit(Limit::per_minute(MAX))
                .clock(clock.clone())
                .prefix(&prefix)
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
            limiters.push(Arc::new(limiter));
        }
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..16 {
            let (limiter, admitted) = (Arc::clone(&limiters[t % 4]), Arc::clone(&admitted));
            tasks.push(tokio::spawn(async move {
                let mut remainings = Vec::new();
                for _ in 0..20 {
                    let d = limiter.check(&7).await;
                    assert_eq!(d.decided_by(), DecidedBy::Server);
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        remainings.push(d.remaining());
                    }
                }
                remainings
            }));
        }
        let mut remainings = Vec::new();
        for task in tasks {
            remainings.extend(task.await.unwrap());
        }
        assert_eq!(admitted.load(Ordering::Relaxed), MAX, "round {round}");
        // One exact sequence: every remaining from MAX-1 down to 0 exactly once.
        remainings.sort_unstable();
        assert_eq!(remainings, (0..MAX).collect::<Vec<_>>(), "round {round}");
    }
}

async fn a_stopped_server_is_answered_by_the_fallback_and_nothing_admitted_is_lost(mut server: RedisServer) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(10));
    let timeout = Duration::from_millis(100);
    let build = |fallback| {
        RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(20))
            .clock(clock.clone())
            .prefix("fault:")
            .timeout(timeout)
            .fallback(fallback)
            .build()
    };
    let local = build(Fallback::Local).await.unwrap();
    let open = build(Fallback::Open).await.unwrap();
    let closed = build(Fallback::Closed).await.unwrap();
    for _ in 0..3 {
        let d = local.check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, true));
    }
    // A server that stalls (DEBUG SLEEP blocks it) does not stall a check past the timeout.
    let port = server.port;
    let sleeper = std::thread::spawn(move || redis_command(port, "DEBUG SLEEP 1"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let d = local.peek(&1).await;
    assert_eq!(d.decided_by(), DecidedBy::Local);
    assert!(started.elapsed() < timeout + Duration::from_millis(150), "{:?}", started.elapsed());
    sleeper.join().unwrap();

    server.stop();
    let started = Instant::now();
    let mut during = 0;
    for _ in 0..4 {
        let d = local.check(&1).await;
        assert_eq!(d.decided_by(), DecidedBy::Local);
        during += u64::from(d.is_allowed());
    }
    assert_eq!(during, 4, "the local fallback admits on its own budget");
    assert!(started.elapsed() < 4 * (timeout + Duration::from_millis(150)), "{:?}", started.elapsed());
    assert_eq!(local.owed_units(), 4);
    let d = open.check(&2).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::FailOpen, true));
    let d = closed.check(&2).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::FailClosed, false));
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));

    assert!(server.restart());
    // The connection comes back by itself; the owed units are added first.
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        let d = local.peek(&1).await;
        if d.decided_by() == DecidedBy::Server {
            break d;
        }
        assert!(Instant::now() < deadline, "Redis did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(local.owed_units(), 0);
    // 3 admitted by Redis before the stop (persisted), 4 by the fallback: 7 of 20 counted.
    assert_eq!(back.remaining(), 20 - 7 - 1, "peek reports the room after one more");
}

async fn four_hybrid_replicas_stay_within_the_documented_bound(server: Standalone) {
    const MAX: u64 = 100;
    const REPLICAS: u64 = 4;
    let sync = Duration::from_millis(50);
    let window = Duration::from_secs(1);
    let clock = ManualClock::new();
    let prefix = prefix("hybrid");
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        let replica = RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit(Limit::per_second(MAX).precision(Duration::from_millis(100)).strict())
            .clock(clock.clone())
            .prefix(&prefix)
            .sync_interval(Duration::from_secs(3600)) // syncs are driven below, on simulated time
            .timeout(Duration::from_secs(2))
            .build_hybrid()
            .await
            .unwrap();
        replicas.push(replica);
    }
    // 5 s of simulated time in 10 ms steps; every replica is offered 10 checks a step
    // (40 × the limit each) and syncs every 50 ms.
    let mut admitted: Vec<u64> = Vec::new(); // admission times, ms
    for step in 0..500u64 {
        let now = step * 10;
        for replica in &replicas {
            for _ in 0..10 {
                if replica.check(&42).is_allowed() {
                    admitted.push(now);
                }
            }
        }
        clock.advance(Duration::from_millis(10));
        if (step + 1) % (sync.as_millis() as u64 / 10) == 0 {
            for replica in &replicas {
                replica.sync_now().await;
            }
        }
    }
    let window_ms = window.as_millis() as u64;
    let densest = |from: u64| {
        admitted
            .iter()
            .filter(|&&t| t >= from)
            .map(|&t| admitted.iter().filter(|&&u| u >= t && u < t + window_ms).count() as u64)
            .max()
            .unwrap_or(0)
    };
    // Worst case (a key new everywhere, bursting on every replica at once): R × max.
    let first = densest(0);
    assert!(first <= REPLICAS * MAX, "densest window {first}");
    // Once every replica has heard of the others, a window holds at most max plus what the
    // other replicas admitted within one sync interval of not having heard: the units that
    // leave the window in one interval, (R − 1) × max × sync / window, plus one interval of
    // arrival lag (the documented bound, doubled for the slot the units are placed in).
    let steady = densest(2 * window_ms);
    let bound = MAX + 2 * (REPLICAS - 1) * MAX * sync.as_millis() as u64 / window_ms;
    assert!(steady <= bound, "steady densest window {steady} > {bound}");
    // And the replicas do not starve each other: the key gets most of its budget.
    let total = admitted.len() as u64;
    assert!(total >= 4 * MAX, "only {total} admitted in 5 windows");
    eprintln!("hybrid: first window {first}, steady densest {steady} (bound {bound}), total {total} in 5 s");
}

async fn a_caller_clock_behind_the_stored_time_does_not_rewind_it(server: Standalone) {
    let prefix = prefix("rewind");
    let (ahead, behind) = (ManualClock::new(), ManualClock::new());
    ahead.advance(Duration::from_secs(100));
    behind.advance(Duration::from_secs(50));
    let build = |clock: &ManualClock| {
        RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit("1/min strict".parse().unwrap())
            .clock(clock.clone())
            .prefix(&prefix)
            .timeout(Duration::from_secs(2))
            .build()
    };
    let (a, b) = (build(&ahead).await.unwrap(), build(&behind).await.unwrap());
    assert!(a.check(&1).await.is_allowed());
    // The replica whose clock says 50 s is judged at the stored 100 s: the unit counted at
    // 100 s (slot [100 s, 101 s) of a strict minute at 1 s slots) frees at 161 s.
    let d = b.check(&1).await;
    assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, false));
    assert_eq!(d.retry_after(), Some(Duration::from_secs(61)));
}

/// 256 checks in flight at once over 32 keys (8 per key, limit 5 per minute) on a server of
/// the test's own (with or without the module): every key admits exactly 5, with the
/// remaining counts a sequence of separate calls would give, and the server ran fewer calls
/// than checks (batches).
async fn concurrent_checks_share_script_calls_and_decide_exactly(server: RedisServer) {
    let limiter = Arc::new(
        RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(5))
            .prefix(&prefix("batch"))
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap(),
    );
    redis_command(server.port, "CONFIG RESETSTAT").unwrap();
    let mut tasks = Vec::new();
    for i in 0..256u64 {
        let limiter = Arc::clone(&limiter);
        tasks.push(tokio::spawn(async move { (i % 32, limiter.check(&(i % 32)).await) }));
    }
    let mut remaining: Vec<Vec<u64>> = vec![Vec::new(); 32];
    for task in tasks {
        let (key, d) = task.await.unwrap();
        assert_eq!(d.decided_by(), DecidedBy::Server);
        if d.is_allowed() {
            remaining[key as usize].push(d.remaining());
        } else {
            assert!(d.retry_after().is_some(), "a refusal says when");
        }
    }
    for (key, mut r) in remaining.into_iter().enumerate() {
        r.sort_unstable();
        assert_eq!(r, vec![0, 1, 2, 3, 4], "key {key}");
    }
    let stats = redis_command(server.port, "INFO commandstats").unwrap();
    // Script calls, or the module's command's.
    let calls: u64 = stats
        .lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| l.strip_prefix("cmdstat_slidegate.run:calls="))
        })
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum();
    eprintln!("256 concurrent checks took {calls} script calls");
    assert!((1..256).contains(&calls), "{calls} script calls for 256 checks: not batched");
}

/// A server of the test's own with slidegate's module loaded.
fn with_module() -> Result<RedisServer, String> {
    let module = redis_module()?;
    RedisServer::start(&["--loadmodule", &module])
}

async fn the_module_decides_exactly_as_the_in_process_limiter(server: RedisServer) {
    let url = server.url();
    let probe = RedisLimiter::<u64>::builder().url(&url).limit(Limit::per_second(1)).build().await.unwrap();
    assert!(probe.uses_module(), "the server has the module");
    same_decisions_as_in_process(standalone_builder(url), "module").await;
}

/// One limiter through the module, one through the script, on the same keys in turns at
/// random: every decision is the in-process limiter's (they read and write the same data).
async fn the_module_and_the_script_take_turns_on_the_same_keys(server: RedisServer) {
    let url = server.url();
    for (set, limits) in limit_sets().iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(1_000_000));
        let prefix = format!("{}{set}", prefix("turns"));
        let build = |module: bool| {
            let mut b = standalone_builder(url.clone())(&clock, limits, &prefix).module(module);
            b = b.timeout(Duration::from_secs(2));
            b.build()
        };
        let (native, script) = (build(true).await.unwrap(), build(false).await.unwrap());
        assert!(native.uses_module() && !script.uses_module());
        let mut local = Limiter::<u64>::builder().clock(clock.clone());
        for limit in limits {
            local = local.limit(*limit);
        }
        let local = local.build().unwrap();
        let mut rng = Rng(set as u64 + 11);
        for step in 0..300 {
            if rng.below(10) < 3 {
                let span = [10, 2_000, 30_000, 600_000][rng.below(4) as usize];
                clock.advance(Duration::from_millis(1 + rng.below(span)));
            }
            let key = rng.below(3);
            let cost = [0, 1, 1, 1, 2, 3][rng.below(6) as usize];
            let remote = if rng.below(2) == 0 { &native } else { &script };
            let (ours, theirs) = (local.check_n(&key, cost), remote.check_n(&key, cost).await);
            let what = format!("set {set} step {step} key {key} cost {cost} module {}", remote.uses_module());
            assert_eq!(theirs.decided_by(), DecidedBy::Server, "{what}");
            assert_eq!(
                (theirs.is_allowed(), theirs.remaining()),
                (ours.is_allowed(), ours.remaining()),
                "{what}"
            );
            let ms = |d: Option<Duration>| d.map(|d| d.as_nanos().div_ceil(1_000_000));
            assert_eq!(ms(theirs.retry_after()), ms(ours.retry_after()), "{what}");
        }
    }
}

/// Any client may send `SLIDEGATE.RUN`: calls of the wrong shape get an error (never a
/// crash, never an allocation the arguments choose without bound), an entry whose key holds
/// another type gets its own entry error, and a good call still works after.
async fn the_module_answers_malformed_calls_with_errors(server: RedisServer) {
    let port = server.port;
    redis_command(port, "RPUSH alist x").unwrap();
    for call in [
        "SLIDEGATE.RUN",
        "SLIDEGATE.RUN k",
        "SLIDEGATE.RUN k 2 k k:book",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 3 1000 1000 0 check",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 3 1000 1000 0 check -1",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 3 1000 1000 0 add 1",
        "SLIDEGATE.RUN k 99999999999 k",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 99999999 3 1000 1000 0 check 1",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 3 4000000000 1 0 check 1",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 3 1000 0 0 check 1",
        "SLIDEGATE.RUN k 2 k k:book 1000 2000 1 -3 1000 1000 0 check 1",
        "SLIDEGATE.RUN k 2 k k:book x 2000 1 3 1000 1000 0 check 1",
    ] {
        let reply = redis_command(port, call).unwrap_or_default();
        assert!(reply.starts_with('-'), "{call}: {reply:?}");
    }
    let reply = redis_command(port, "SLIDEGATE.RUN alist 1 alist 1000 2000 1 3 1000 1000 0 check 1").unwrap();
    assert_eq!(reply, "*5\r\n:3\r\n:3\r\n:0\r\n:0\r\n:1000\r\n", "WRONGTYPE, as entry error 3");
    assert_eq!(redis_command(port, "LLEN alist").as_deref(), Some(":1\r\n"), "the list is left alone");
    assert_eq!(redis_command(port, "PING").as_deref(), Some("+PONG\r\n"));
    let reply = redis_command(port, "SLIDEGATE.RUN k 1 k 1000 2000 1 3 1000 1000 0 check 1").unwrap();
    assert!(reply.starts_with("*5\r\n:0\r\n:0\r\n:2\r\n"), "{reply:?}");
}

/// The module unloaded under a running limiter (or a failover to a server without it): the
/// next check goes through the script, on the same data, decided by the server; loaded
/// again, a recheck puts the checks back on it.
async fn a_server_that_loses_the_module_is_answered_by_the_script(server: RedisServer) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(100));
    let recheck = Duration::from_millis(200);
    let limiter = RedisLimiter::<u64>::builder()
        .url(&server.url())
        .limit(Limit::per_minute(3))
        .clock(clock.clone())
        .prefix(&prefix("unload"))
        .timeout(Duration::from_secs(2))
        .module_recheck(recheck)
        .build()
        .await
        .unwrap();
    assert!(limiter.uses_module());
    assert_eq!(limiter.check(&1).await.remaining(), 2);
    let reply = redis_command(server.port, "MODULE UNLOAD slidegate").unwrap_or_default();
    assert!(reply.starts_with("+OK"), "{reply:?}");
    let d = limiter.check(&1).await;
    assert_eq!((d.decided_by(), d.remaining()), (DecidedBy::Server, 1), "the script read the module's data");
    assert!(!limiter.uses_module());
    // Rechecks while the module is still missing: answered by the script all the same.
    tokio::time::sleep(recheck * 2).await;
    let d = limiter.check(&1).await;
    assert_eq!((d.decided_by(), d.remaining()), (DecidedBy::Server, 0));
    assert!(!limiter.uses_module());
    assert!(!limiter.check(&1).await.is_allowed());

    // The module back: within a few rechecks the checks are on it, on the same data.
    let module = redis_module().unwrap();
    let reply = redis_command(server.port, &format!("MODULE LOAD {module}")).unwrap_or_default();
    assert!(reply.starts_with("+OK"), "{reply:?}");
    let began = std::time::Instant::now();
    while !limiter.uses_module() {
        assert!(began.elapsed() < Duration::from_secs(10), "the limiter never went back to the module");
        tokio::time::sleep(recheck / 2).await;
        let d = limiter.check(&1).await;
        assert_eq!((d.decided_by(), d.is_allowed()), (DecidedBy::Server, false), "the key is still full");
    }
    let before = module_calls(server.port);
    clock.advance(Duration::from_secs(62));
    let d = limiter.check(&1).await;
    assert_eq!((d.decided_by(), d.remaining()), (DecidedBy::Server, 2), "a new window, through the module");
    assert_eq!(module_calls(server.port), before + 1, "that check went through SLIDEGATE.RUN");
}

/// How many times the server ran `SLIDEGATE.RUN` (`INFO commandstats`).
fn module_calls(port: u16) -> u64 {
    let info = redis_command(port, "INFO commandstats").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_slidegate.run:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
