//! `HybridLimiter` under a key spray, against a real Redis on loopback (see
//! `support/servers.rs`; each test starts a server of its own, so that `INFO commandstats`
//! counts only its own calls):
//!
//! * after 20,000 sprayed keys, a sync of a few active keys makes a bounded number of Redis
//!   calls (counted by the server, not timed), and the active keys' units still reach Redis
//!   and the other replicas within that sync;
//! * the background task's early syncs (as soon as `batch` units wait) share their
//!   interval's budget of keys;
//! * replicas keep hearing each other's units for a key during a spray;
//! * a client that goes round four replicas, one request at a time, gets the limit once, not
//!   once per replica (pulls of a key back off only while they find nothing new);
//! * on a Redis Cluster, each key is its own call, and replicas hear each other;
//! * a key whose Redis bookkeeping holds another type (so the script fails for every key of
//!   the call) is dropped and counted, and the keys it shared a call with still sync;
//! * while Redis is away a replica keeps admitting, owes its units per key, and pushes them
//!   all once Redis is back;
//! * what waits for a stalled sync stays within `max_keys`, and loses no unit of the keys
//!   waiting;
//! * rounds of key sprays beyond `max_keys` leave the heap where the first left it, and the
//!   limit of a key in use still holds across replicas;
//! * a push Redis refuses for a passing reason (out of memory, too few replicas, a master
//!   demoted to a replica) keeps its units owed until Redis takes writes again;
//! * a key a replica sees again after evicting it (or a replica sees for the first time)
//!   counts what the key's window in Redis holds, not its running total: it is not refused
//!   for a window while the fleet's count is below `max`, and admits no more than is left;
//! * a sync ends while producers keep the queue full.
//!
//! The memory tests read a counting allocator's live bytes, so the trials run one at a
//! time.
//!
//! A `libtest-mimic` binary (`harness = false`): a test whose server is missing reports
//! `ignored` with the reason, or fails under `SLIDEGATE_REQUIRE_SERVERS`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
    pub mod rng;
    pub mod servers;
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slidegate::redis::{HybridLimiter, RedisLimiter};
use slidegate::{Limit, ManualClock};
use support::counting_alloc::{live_bytes, Counting};
use support::rng::Rng;
use support::servers::{redis_command, trial, Cluster, RedisServer};

/// The memory tests count every heap byte of the process: the trials run one at a time.
#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    let trials = vec![
        trial(
            "a_sync_after_a_key_spray_makes_a_bounded_number_of_calls",
            2,
            || RedisServer::start(&[]),
            a_sync_after_a_key_spray_makes_a_bounded_number_of_calls,
        ),
        trial(
            "early_syncs_share_their_intervals_budget",
            2,
            || RedisServer::start(&[]),
            early_syncs_share_their_intervals_budget,
        ),
        trial(
            "replicas_hear_each_other_during_a_spray",
            2,
            || RedisServer::start(&[]),
            replicas_hear_each_other_during_a_spray,
        ),
        trial(
            "a_client_going_round_the_replicas_gets_the_limit_once",
            2,
            || RedisServer::start(&[]),
            a_client_going_round_the_replicas_gets_the_limit_once,
        ),
        trial(
            "replicas_sync_on_a_cluster_one_call_per_key_sent_together",
            2,
            Cluster::get,
            replicas_sync_on_a_cluster_one_call_per_key_sent_together,
        ),
        trial(
            "a_key_redis_refuses_is_dropped_counted_and_spares_its_call_mates",
            0,
            || RedisServer::start(&[]),
            a_key_redis_refuses_is_dropped_counted_and_spares_its_call_mates,
        ),
        trial(
            "while_redis_is_away_units_are_owed_per_key_and_all_arrive_when_it_is_back",
            0,
            || RedisServer::start(&[]),
            while_redis_is_away_units_are_owed_per_key_and_all_arrive_when_it_is_back,
        ),
        trial(
            "a_stalled_sync_keeps_what_waits_within_max_keys",
            0,
            || RedisServer::start(&[]),
            a_stalled_sync_keeps_what_waits_within_max_keys,
        ),
        trial(
            "a_key_spray_beyond_max_keys_keeps_memory_bounded",
            0,
            || RedisServer::start(&[]),
            a_key_spray_beyond_max_keys_keeps_memory_bounded,
        ),
        trial(
            "units_redis_cannot_take_for_now_stay_owed_until_it_can",
            0,
            || Ok((RedisServer::start(&[])?, RedisServer::start(&[])?)),
            units_redis_cannot_take_for_now_stay_owed_until_it_can,
        ),
        trial(
            "a_key_back_after_eviction_counts_its_window_not_its_running_total",
            0,
            || RedisServer::start(&[]),
            a_key_back_after_eviction_counts_its_window_not_its_running_total,
        ),
        trial(
            "a_sync_ends_while_producers_keep_the_queue_full",
            2,
            || RedisServer::start(&[]),
            a_sync_ends_while_producers_keep_the_queue_full,
        ),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}

/// Keys sprayed through one replica: each checked once.
const SPRAY: u64 = 20_000;
/// The most keys a sync touches by default, and the most keys per Redis call: a sync makes
/// at most `SYNC_KEYS / KEYS_PER_CALL` calls.
const SYNC_KEYS: u64 = 1024;
const KEYS_PER_CALL: u64 = 128;

fn prefix(test: &str) -> String {
    format!("t-{test}-{}-{}:", std::process::id(), Instant::now().elapsed().as_nanos())
}

/// Script calls the server ran since the last `CONFIG RESETSTAT` (`EVALSHA`, and `EVAL`
/// when the script was not loaded yet).
fn script_calls(port: u16) -> u64 {
    let info = redis_command(port, "INFO commandstats").unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split_once("calls=")?.1.split(',').next()?.parse::<u64>().ok())
        .sum()
}

async fn replica(server: &RedisServer, prefix: &str, clock: &ManualClock) -> HybridLimiter<u64> {
    RedisLimiter::<u64>::builder()
        .url(&server.url())
        .limit(Limit::per_minute(10))
        .clock(clock.clone())
        .prefix(prefix)
        // Syncs are driven below (no early sync either: `INFO commandstats` counts ours).
        .sync_interval(Duration::from_secs(3600))
        .batch(u64::MAX)
        .timeout(Duration::from_secs(5))
        .build_hybrid()
        .await
        .unwrap()
}

/// Finding 7: each sync made one sequential Redis call per key seen within the TTL, idle
/// ones included, so after a spray every sync took seconds. A sync after the spray touches
/// at most the per-sync bound's keys, in calls of at most 128 keys; the active keys (which
/// owe more units than any sprayed key) go first.
async fn a_sync_after_a_key_spray_makes_a_bounded_number_of_calls(server: RedisServer) {
    let clock = ManualClock::new();
    let prefix = prefix("spray");
    let (a, b) = (replica(&server, &prefix, &clock).await, replica(&server, &prefix, &clock).await);
    let started = Instant::now();
    for key in 0..SPRAY {
        assert!(a.check(&(1_000_000 + key)).is_allowed());
    }
    let spray = started.elapsed();
    // The first sync after the spray: pushes what it may.
    let started = Instant::now();
    a.sync_now().await;
    let first = started.elapsed();
    // Ten active keys, three units each on `a`, one on `b`.
    for key in 0..10u64 {
        for _ in 0..3 {
            assert!(a.check(&key).is_allowed());
        }
        assert!(b.check(&key).is_allowed());
    }
    redis_command(server.port, "CONFIG RESETSTAT").unwrap();
    let started = Instant::now();
    a.sync_now().await;
    let second = started.elapsed();
    let calls = script_calls(server.port);
    eprintln!(
        "{SPRAY} keys sprayed in {spray:.2?}; the sync after the spray took {first:.2?}, the sync of 10 active keys after it {second:.2?} and {calls} script calls"
    );
    let most = SYNC_KEYS.div_ceil(KEYS_PER_CALL);
    assert!(calls <= most, "a sync after a spray of {SPRAY} keys made {calls} script calls (at most {most})");
    let stats = a.stats();
    assert!(stats.last_sync_keys as u64 <= SYNC_KEYS, "{stats:?}");
    assert_eq!(stats.last_sync_calls as u64, calls, "{stats:?}");
    // The active keys' units reached Redis in that sync: `b` hears of them at its own sync.
    b.sync_now().await;
    for key in 0..10u64 {
        let d = b.local().peek(&key);
        assert_eq!(d.remaining(), 10 - 1 - 3 - 1, "key {key}: b's view holds a's 3 units and its own 1");
    }
    // The sprayed keys' units wait, and all reach Redis within `owing ÷ (SYNC_KEYS ÷ 4)`
    // syncs: none is lost.
    let mut syncs = 0;
    while a.stats().owed_units > 0 {
        syncs += 1;
        assert!(syncs <= SPRAY / (SYNC_KEYS / 4) + 1, "{:?} after {syncs} more syncs", a.stats());
        a.sync_now().await;
    }
    let stats = a.stats();
    assert_eq!((stats.owing_keys, stats.pending_units, stats.dropped_units), (0, 0, 0), "{stats:?}");
    assert_eq!(stats.keys as u64, SPRAY + 10, "{stats:?}");
    eprintln!("the spray's units all reached Redis after {syncs} more syncs: {stats:?}");
}

/// Early syncs (here one as soon as a unit waits) come out of their interval's budget: in a
/// first interval of an hour, the background task pushes at most `SYNC_KEYS` of 20,000
/// sprayed keys, whatever the number of early syncs; the rest waits for the next interval.
async fn early_syncs_share_their_intervals_budget(server: RedisServer) {
    let clock = ManualClock::new();
    let a = RedisLimiter::<u64>::builder()
        .url(&server.url())
        .limit(Limit::per_minute(10))
        .clock(clock.clone())
        .prefix(&prefix("early"))
        .sync_interval(Duration::from_secs(3600))
        .batch(1)
        .timeout(Duration::from_secs(5))
        .build_hybrid()
        .await
        .unwrap();
    redis_command(server.port, "CONFIG RESETSTAT").unwrap();
    for key in 0..SPRAY {
        assert!(a.check(&key).is_allowed());
    }
    // Ample time for many 5 ms ticks of the background task.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = script_calls(server.port);
    let stats = a.stats();
    eprintln!("early syncs in the first second: {calls} script calls; {stats:?}");
    // Pushed: what neither waits in the queue nor is owed by the keys the syncs took in.
    let pushed = SPRAY - stats.owed_units - stats.pending_units;
    assert!((1..=SYNC_KEYS).contains(&pushed), "{pushed} keys pushed in the first interval: {stats:?}");
    assert_eq!(stats.keys - stats.owing_keys, pushed as usize, "{stats:?}");
    assert!(calls >= SYNC_KEYS.div_ceil(KEYS_PER_CALL).min(pushed), "{calls} script calls: {stats:?}");
}

/// A key both replicas use: while 20,000 sprayed keys wait on `a`, `b`'s units for the
/// key still reach `a` within a few syncs (pulls are not starved by the spray's pushes).
async fn replicas_hear_each_other_during_a_spray(server: RedisServer) {
    let clock = ManualClock::new();
    let prefix = prefix("hear");
    let (a, b) = (replica(&server, &prefix, &clock).await, replica(&server, &prefix, &clock).await);
    assert!(a.check(&7).is_allowed());
    a.sync_now().await;
    for key in 0..SPRAY {
        assert!(a.check(&(1_000_000 + key)).is_allowed());
    }
    for _ in 0..5 {
        assert!(b.check(&7).is_allowed());
    }
    b.sync_now().await;
    let mut syncs = 0;
    while a.local().peek(&7).remaining() != 10 - 1 - 5 - 1 {
        syncs += 1;
        assert!(syncs <= 4, "a did not hear of b's 5 units within 4 syncs: {:?}", a.local().peek(&7));
        a.sync_now().await;
    }
    eprintln!("a heard of b's units after {syncs} syncs, with {SPRAY} sprayed keys waiting");
}

/// Requests at random gaps (50 ms to 1.5 s, so that some come close together after a quiet
/// spell), each to the next of four replicas, for 150 s of simulated time, syncing every
/// 50 ms: every 60 s window holds at most the limit (`strict`, 1 s slots: never above an
/// exact count, and the window reopens a slot at a time). A replica whose view of the key
/// is at the limit keeps pulling it every sync, so it hears of a unit another replica
/// admitted as the window reopens before its own next request.
async fn a_client_going_round_the_replicas_gets_the_limit_once(server: RedisServer) {
    const MAX: u64 = 10;
    let clock = ManualClock::new();
    let prefix = prefix("round");
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let r = RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(MAX).precision(Duration::from_secs(1)).strict())
            .clock(clock.clone())
            .prefix(&prefix)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
            .await
            .unwrap();
        replicas.push(r);
    }
    let mut rng = Rng(22);
    let (mut now, mut next, mut turn) = (0u64, 0u64, 0usize);
    let mut admitted = Vec::new(); // ms
    while now < 150_000 {
        while next <= now {
            if replicas[turn % 4].check(&7).is_allowed() {
                admitted.push(now);
            }
            turn += 1;
            next += 50 + rng.below(1450);
        }
        clock.advance(Duration::from_millis(50));
        now += 50;
        for r in &replicas {
            r.sync_now().await;
        }
    }
    let densest =
        admitted.iter().map(|&t| admitted.iter().filter(|&&u| u >= t && u < t + 60_000).count() as u64).max();
    eprintln!(
        "round the replicas: {} of {turn} admitted in 150 s, densest minute {densest:?}",
        admitted.len()
    );
    assert!(densest.unwrap_or(0) <= MAX, "densest minute {densest:?}: admitted at {admitted:?} ms");
    assert!(admitted.len() as u64 >= 2 * MAX, "only {} admitted in 150 s", admitted.len());
}

/// A replica whose syncs stall (none for the whole test: a long interval, no early sync)
/// while 100,000 units are admitted over 10 keys: one queue entry per admission made the
/// heap grow by megabytes; with `max_keys(1000)` at most 1000 entries wait, then one sum per
/// key. Once it syncs, Redis has every unit: the other replica's view holds them.
async fn a_stalled_sync_keeps_what_waits_within_max_keys(server: RedisServer) {
    const ADMITTED: u64 = 100_000;
    let clock = ManualClock::new();
    let prefix = prefix("stall");
    let build = || {
        RedisLimiter::<String>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(1_000_000))
            .clock(clock.clone())
            .prefix(&prefix)
            .max_keys(1000)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let keys: Vec<String> = (0..10).map(|k| format!("key-{k}")).collect();
    let before = live_bytes();
    for i in 0..ADMITTED {
        assert!(a.check(&keys[(i % 10) as usize]).is_allowed());
    }
    let grown = live_bytes().saturating_sub(before);
    eprintln!("{ADMITTED} admissions over 10 keys with no sync: the heap grew by {grown} B");
    assert!(grown < 256 * 1024, "{ADMITTED} admissions waiting for a sync grew the heap by {grown} B");
    let stats = a.stats();
    assert_eq!((stats.pending_units, stats.dropped_units), (ADMITTED, 0), "{stats:?}");
    a.sync_now().await;
    for key in &keys {
        assert!(b.check(key).is_allowed());
    }
    b.sync_now().await;
    for key in &keys {
        let seen = 1_000_000 - b.local().peek(key).remaining() - 1;
        assert_eq!(seen, ADMITTED / 10 + 1, "{key}: b's view holds a's units and its own");
    }
    let stats = a.stats();
    assert_eq!((stats.pending_units, stats.owed_units, stats.dropped_units), (0, 0, 0), "{stats:?}");

    // Beyond the side table's max_keys keys, an admission counts locally and is dropped,
    // counted: 100 keys twice (100 queued, 100 summed), then, the local limiter swept, 100
    // new keys that neither can take.
    let c = RedisLimiter::<String>::builder()
        .url(&server.url())
        .limit(Limit::per_minute(10))
        .clock(clock.clone())
        .prefix(&prefix)
        .max_keys(100)
        .sync_interval(Duration::from_secs(3600))
        .batch(u64::MAX)
        .timeout(Duration::from_secs(5))
        .build_hybrid()
        .await
        .unwrap();
    for _ in 0..2 {
        for k in 0..100 {
            assert!(c.check(&format!("old-{k}")).is_allowed());
        }
    }
    clock.advance(Duration::from_secs(61));
    assert_eq!(c.local().sweep(), 100);
    for k in 0..100 {
        assert!(c.check_n(&format!("new-{k}"), 3).is_allowed());
    }
    let stats = c.stats();
    assert_eq!((stats.pending_units, stats.dropped_units), (200, 300), "{stats:?}");
    c.sync_now().await;
    let stats = c.stats();
    assert_eq!((stats.keys, stats.owed_units, stats.dropped_units), (100, 0, 300), "{stats:?}");
}

/// 16 rounds: 600 new keys of 200 bytes through replica `a` (whose local limiter holds at
/// most 500 keys, so 100 are refused `TooManyKeys`), a sync, then a minute, after which the
/// local limiter sweeps them. The keys the replica syncs used to stay for the TTL (a minute
/// of the replica's own clock: the whole test), 8,000 of them; they stay within
/// `max_keys`, so the heap after the last round is where it was after the second. And
/// `alice`, checked every round, keeps her limit across the replicas.
async fn a_key_spray_beyond_max_keys_keeps_memory_bounded(server: RedisServer) {
    const MAX_KEYS: usize = 500;
    let clock = ManualClock::new();
    let prefix = prefix("bounded");
    let build = || {
        RedisLimiter::<String>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(10))
            .clock(clock.clone())
            .prefix(&prefix)
            .max_keys(MAX_KEYS)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let alice = "alice".to_owned();
    let mut baseline = 0;
    for round in 0..16 {
        assert!(a.check(&alice).is_allowed(), "round {round}");
        let mut refused = 0;
        for i in 0..600 {
            let d = a.check(&format!("{round:02}-{i:04}-{}", "x".repeat(200)));
            if !d.is_allowed() {
                assert_eq!(d.denial(), Some(slidegate::Denial::TooManyKeys), "round {round}, key {i}");
                refused += 1;
            }
        }
        assert_eq!(refused, 600 - (MAX_KEYS - 1), "round {round}");
        a.sync_now().await;
        if round == 1 {
            baseline = live_bytes();
        }
        clock.advance(Duration::from_secs(61));
        assert_eq!(a.local().sweep(), MAX_KEYS, "round {round}");
    }
    let grown = live_bytes().saturating_sub(baseline);
    eprintln!(
        "16 rounds of 600 sprayed keys at max_keys({MAX_KEYS}): the heap grew by {grown} B after the second"
    );
    assert!(grown < 512 * 1024, "the heap grew by {grown} B over 14 rounds of {MAX_KEYS} new keys");
    let stats = a.stats();
    assert_eq!((stats.keys, stats.owed_units, stats.dropped_units), (MAX_KEYS, 0, 0), "{stats:?}");
    // Alice's limit holds on both replicas: 10 of 12 on `a`, then `b` hears of them.
    let admitted = (0..12).filter(|_| a.check(&alice).is_allowed()).count();
    assert_eq!(admitted, 10);
    a.sync_now().await;
    let _ = b.check(&alice);
    b.sync_now().await;
    assert!(!b.check(&alice).is_allowed(), "b's view holds a's 10 units of alice");
}

/// On a Cluster a script call may touch one slot only: each key is its own call (sent
/// together), and the replicas hear each other's units as on one server.
async fn replicas_sync_on_a_cluster_one_call_per_key_sent_together(cluster: Cluster) {
    let urls = cluster.urls();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let clock = ManualClock::new();
    let prefix = prefix("cluster");
    let build = || {
        RedisLimiter::<u64>::builder()
            .cluster(&refs)
            .limit(Limit::per_minute(10))
            .clock(clock.clone())
            .prefix(&prefix)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    for key in 0..300u64 {
        for _ in 0..3 {
            assert!(a.check(&key).is_allowed());
        }
        assert!(b.check(&key).is_allowed());
    }
    a.sync_now().await;
    let stats = a.stats();
    assert_eq!((stats.last_sync_keys, stats.last_sync_calls, stats.owed_units), (300, 300, 0), "{stats:?}");
    b.sync_now().await;
    for key in 0..300u64 {
        assert_eq!(b.local().peek(&key).remaining(), 10 - 3 - 1 - 1, "key {key}");
    }
}

/// A key whose `:book` holds another type: its push fails (`WRONGTYPE`), and failed the
/// whole script call after the keys before it were pushed, which were then pushed again.
/// The script answers that entry alone; the others sync once, and the refused key's units
/// are dropped and counted rather than retried at every sync.
async fn a_key_redis_refuses_is_dropped_counted_and_spares_its_call_mates(server: RedisServer) {
    let clock = ManualClock::new();
    let prefix = prefix("poison");
    let (a, b) = (replica(&server, &prefix, &clock).await, replica(&server, &prefix, &clock).await);
    let names = RedisLimiter::<u64>::builder()
        .url(&server.url())
        .limit(Limit::per_minute(10))
        .prefix(&prefix)
        .build()
        .await
        .unwrap();
    let book = format!("{}:book", names.redis_key(&13));
    assert_eq!(redis_command(server.port, &format!("SET {book} not-a-hash")).as_deref(), Some("+OK\r\n"));
    for key in 10..20u64 {
        for _ in 0..2 {
            assert!(a.check(&key).is_allowed());
        }
    }
    a.sync_now().await;
    let stats = a.stats();
    assert_eq!((stats.last_sync_keys, stats.last_sync_calls), (10, 1), "{stats:?}");
    assert_eq!((stats.keys, stats.owed_units, stats.dropped_units), (9, 0, 2), "{stats:?}");
    for key in 10..20u64 {
        let _ = b.check(&key);
    }
    b.sync_now().await;
    for key in 10..20u64 {
        let seen = 10 - b.local().peek(&key).remaining() - 1;
        assert_eq!(seen, if key == 13 { 1 } else { 3 }, "key {key}: b's view");
    }
    // The next sync does not retry the dropped units.
    a.sync_now().await;
    assert_eq!(a.stats().dropped_units, 2);
}

/// Redis stopped: syncs fail (the first call of each ends it), the replica keeps admitting
/// locally and owes its units per key; once Redis is back (its data on disk), every owed
/// unit arrives, and the other replica hears of them.
async fn while_redis_is_away_units_are_owed_per_key_and_all_arrive_when_it_is_back(mut server: RedisServer) {
    let clock = ManualClock::new();
    let prefix = prefix("away");
    let (a, b) = (replica(&server, &prefix, &clock).await, replica(&server, &prefix, &clock).await);
    for key in 0..3u64 {
        for _ in 0..2 {
            assert!(a.check(&key).is_allowed());
        }
    }
    server.stop();
    a.sync_now().await;
    let stats = a.stats();
    assert_eq!((stats.owing_keys, stats.owed_units, stats.dropped_units), (3, 6, 0), "{stats:?}");
    assert!(stats.last_sync_calls <= 1, "{stats:?}");
    for key in 0..3u64 {
        assert!(a.check(&key).is_allowed());
    }
    a.sync_now().await;
    assert_eq!(a.stats().owed_units, 9, "{:?}", a.stats());
    assert!(server.restart(), "Redis did not come back");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stats().owed_units > 0 {
        assert!(Instant::now() < deadline, "owed units never arrived: {:?}", a.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.sync_now().await;
    }
    assert_eq!(a.stats().dropped_units, 0);
    for key in 0..3u64 {
        let _ = b.check(&key);
    }
    // `b` reconnects too: its first sync may find the connection still down.
    b.sync_now().await;
    while b.stats().owed_units > 0 {
        assert!(Instant::now() < deadline, "b never synced: {:?}", b.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.sync_now().await;
    }
    for key in 0..3u64 {
        assert_eq!(10 - b.local().peek(&key).remaining() - 1, 3 + 1, "key {key}: b's view");
    }
}

/// Review finding 1: a push that Redis refused for a passing reason (out of memory under
/// `noeviction`, too few replicas for `min-replicas-to-write`, a master just demoted to a
/// replica) was taken for a key Redis refuses for good: its units were dropped and the key
/// forgotten, so no other replica heard of them. They stay owed, nothing is dropped, and
/// once Redis takes writes again every unit arrives and the other replica hears of it.
async fn units_redis_cannot_take_for_now_stay_owed_until_it_can((server, other): (RedisServer, RedisServer)) {
    let clock = ManualClock::new();
    let prefix = prefix("passing");
    let (a, b) = (replica(&server, &prefix, &clock).await, replica(&server, &prefix, &clock).await);
    // A first sync loads the script while the server takes everything.
    assert!(a.check(&1_000).is_allowed());
    a.sync_now().await;
    let port = server.port;
    let demote = format!("REPLICAOF 127.0.0.1 {}", other.port);
    let states: [(&str, Vec<&str>, Vec<&str>); 3] = [
        (
            "out of memory",
            vec!["CONFIG SET maxmemory-policy noeviction", "CONFIG SET maxmemory 1"],
            vec!["CONFIG SET maxmemory 0"],
        ),
        (
            "too few replicas",
            vec!["CONFIG SET min-replicas-to-write 1"],
            vec!["CONFIG SET min-replicas-to-write 0"],
        ),
        // Last: the demoted server may load its master's (empty) data set.
        ("demoted to a replica", vec![demote.as_str()], vec!["REPLICAOF NO ONE"]),
    ];
    for (phase, (state, enter, leave)) in states.iter().enumerate() {
        let keys: Vec<u64> = (0..3).map(|k| phase as u64 * 10 + k).collect();
        for key in &keys {
            for _ in 0..2 {
                assert!(a.check(key).is_allowed());
            }
        }
        for command in enter {
            assert_eq!(redis_command(port, command).as_deref(), Some("+OK\r\n"), "{state}: {command}");
        }
        a.sync_now().await;
        let stats = a.stats();
        eprintln!("{state}: a sync leaves {stats:?}");
        assert_eq!(
            (stats.owing_keys, stats.owed_units, stats.dropped_units),
            (3, 6, 0),
            "{state}: {stats:?}"
        );
        for command in leave {
            assert_eq!(redis_command(port, command).as_deref(), Some("+OK\r\n"), "{state}: {command}");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.stats().owed_units > 0 {
            assert!(Instant::now() < deadline, "{state}: the owed units never arrived: {:?}", a.stats());
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.sync_now().await;
        }
        assert_eq!(a.stats().dropped_units, 0, "{state}");
        for key in &keys {
            assert!(b.check(key).is_allowed());
        }
        b.sync_now().await;
        for key in &keys {
            assert_eq!(10 - b.local().peek(key).remaining() - 1, 2 + 1, "{state}, key {key}: b's view");
        }
    }
}

/// Review finding 2: a replica's first sync of a key counted everything in Redis's running
/// total for it (every unit pushed since the key's bookkeeping last expired, which a key in
/// steady use never lets happen) as current. Here `b` admits 5 units of `k` every 6 s for 10
/// minutes (50 in any minute, 500 in all) at 100 per minute; `a` used `k` once, hears of
/// `b`'s units, evicts `k` at `max_keys` (a spray of new keys), and sees it again: its first
/// sync recorded 501 units and refused `k` for a minute although the minute held 51. It
/// records what the key's window in Redis holds beyond what its own view holds: it admits
/// what the window leaves (49), and no more. A replica that has never seen the key (`c`)
/// counts the whole window.
async fn a_key_back_after_eviction_counts_its_window_not_its_running_total(server: RedisServer) {
    const MAX: u64 = 100;
    let clock = ManualClock::new();
    let prefix = prefix("back");
    let build = |max_keys: usize| {
        RedisLimiter::<String>::builder()
            .url(&server.url())
            .limit(Limit::per_minute(MAX).precision(Duration::from_secs(1)).strict())
            .clock(clock.clone())
            .prefix(&prefix)
            .max_keys(max_keys)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
    };
    let (a, b) = (build(10).await.unwrap(), build(1000).await.unwrap());
    let k = "k".to_owned();
    // `k` first: the least recently admitted of `a`'s ten keys.
    assert!(a.check(&k).is_allowed());
    for f in 0..9 {
        assert!(a.check(&format!("f{f}")).is_allowed());
    }
    a.sync_now().await;
    for _ in 0..100 {
        for _ in 0..5 {
            assert!(b.check(&k).is_allowed());
        }
        b.sync_now().await;
        a.sync_now().await;
        clock.advance(Duration::from_secs(6));
    }
    // Ten minutes on: `a`'s fillers are out of their window, `k` holds what `a` heard.
    assert_eq!(a.local().sweep(), 9);
    for g in 0..9 {
        assert!(a.check(&format!("g{g}")).is_allowed());
    }
    a.sync_now().await;
    let stats = a.stats();
    assert_eq!((stats.keys, stats.owed_units, stats.dropped_units), (10, 0, 0), "{stats:?}");
    // `k` again on `a`, which evicted it: its first sync since.
    assert!(a.check(&k).is_allowed());
    a.sync_now().await;
    let admitted = (0..MAX).filter(|_| a.check(&k).is_allowed()).count() as u64;
    eprintln!(
        "k back on a after its eviction: {admitted} more admitted (the window held 50 of b's and 1 of a's)"
    );
    assert!(admitted >= 40, "k refused on a after its first sync since the eviction: {admitted} admitted");
    assert!(admitted < MAX - 50, "a admitted {admitted}: beyond what the window left (49)");
    // A replica new to `k`: its first sync counts the window, now full.
    a.sync_now().await;
    let c = build(1000).await.unwrap();
    assert!(c.check(&k).is_allowed(), "before its first sync a replica knows only its own units");
    c.sync_now().await;
    assert!(
        !c.check(&k).is_allowed(),
        "c's first sync did not count the window's {} units",
        50 + 1 + admitted
    );
}

/// Review finding 5: a sync drained the queue until it found it empty, and each entry it
/// took made room for a producer to add one: with producers that keep up with the drain, one
/// sync never ended (and never reached Redis). Here three producers top the queue up to just
/// under `max_keys` (20,000) units as fast as the sync takes from it, for at most 30 s;
/// the sync takes what waited when it began (at most `max_keys` entries) and ends while
/// they are still at it.
async fn a_sync_ends_while_producers_keep_the_queue_full(server: RedisServer) {
    const MAX_KEYS: u64 = 20_000;
    let clock = ManualClock::new();
    let hybrid = Arc::new(
        RedisLimiter::<u64>::builder()
            .url(&server.url())
            .limit(Limit::per_second(1_000_000_000))
            .clock(clock)
            .prefix(&prefix("drain"))
            .max_keys(MAX_KEYS as usize)
            .sync_interval(Duration::from_secs(3600))
            .batch(u64::MAX)
            .timeout(Duration::from_secs(5))
            .build_hybrid()
            .await
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..3u64)
        .map(|t| {
            let (hybrid, stop) = (Arc::clone(&hybrid), Arc::clone(&stop));
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut i = t;
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(30) {
                    // Below the bound by more than the producers can overshoot: nothing spills.
                    if hybrid.stats().pending_units < MAX_KEYS - 64 {
                        assert!(hybrid.check(&(i % MAX_KEYS)).is_allowed());
                        i += 3;
                    }
                }
            })
        })
        .collect();
    while hybrid.stats().pending_units < MAX_KEYS - 64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    hybrid.sync_now().await;
    let took = started.elapsed();
    let still_producing = producers.iter().any(|p| !p.is_finished());
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let stats = hybrid.stats();
    eprintln!("a sync with 3 producers keeping the queue full took {took:.2?}; {stats:?}");
    assert!(still_producing, "the sync ended only once the producers stopped ({took:.2?})");
    assert_eq!(stats.dropped_units, 0, "{stats:?}");
    assert!(stats.last_sync_keys > 0, "{stats:?}");
}
