//! The workloads slidegate and governor are compared on, defined once and driven both by the
//! criterion harness (`tools/benches/limiter/main.rs`) and by the one-table report
//! (`tools/src/bin/bench_report.rs`, which includes this file by path).
//!
//! Each workload is a function of the contender and an iteration count that returns the
//! time those iterations took, so criterion's `iter_custom` and the report's interleaved
//! rounds time exactly the same loop. Threaded workloads return the wall time of the whole
//! run, which is per-thread latency when each thread does `iters` checks.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use governor::clock::QuantaUpkeepClock;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use slidegate::{Limit, Limiter};

/// Keys in the "many keys" workload.
pub const MANY_KEYS: u64 = 1_000_000;
/// Keys in the round-robin and disjoint-threads workloads.
pub const FEW_KEYS: u64 = 1_000;

/// The policy a contender enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// One slot (precision = window = 1 s, which is also `Limit::per_second`'s default) that
    /// never refuses during a benchmark (4·10⁹ per second, 10⁹ per second for governor, whose
    /// GCRA needs a whole nanosecond per unit): measures the admitting path.
    Open,
    /// A per-minute limit in sixty 1-second slots (`Limit::per_minute`'s default precision)
    /// that never refuses during a benchmark: 4·10⁹ per minute, and governor's equivalent
    /// quota, 4·10⁹ per minute (15 ns per unit). Measures the admitting path of a key with a
    /// 60-slot ring, the shape of `per_minute(60)`, whatever the number of checks per key.
    Minute,
    /// One unit per hour, already used: measures the refusing path.
    Closed,
    /// 10/s + 120/min + 240/h at 1-minute precision (governor: three keyed limiters checked in
    /// order, the way a governor user composes limits).
    ThreeLimits,
}

/// Something that answers "may `key` proceed now?".
pub trait Contender: Send + Sync + 'static {
    /// Admits or refuses one unit for `key`.
    fn check(&self, key: u64) -> bool;
}

/// slidegate with its real coarse clock.
pub struct Slidegate(pub Limiter<u64>);

impl Slidegate {
    pub fn new(policy: Policy) -> Slidegate {
        let builder = Limiter::<u64>::builder();
        let builder = match policy {
            Policy::Open => builder.limit(Limit::per_second(4_000_000_000).precision(Duration::from_secs(1))),
            Policy::Minute => {
                builder.limit(Limit::per_minute(4_000_000_000).precision(Duration::from_secs(1)))
            }
            Policy::Closed => builder.limit(Limit::per_hour(1)),
            Policy::ThreeLimits => builder
                .limit(Limit::per_second(10))
                .limit(Limit::per_minute(120))
                .limit(Limit::per_hour(240).precision(Duration::from_secs(60))),
        };
        Slidegate(builder.build().unwrap_or_else(|e| unreachable!("valid benchmark policy: {e}")))
    }
}

impl Contender for Slidegate {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.check(&key).is_allowed()
    }
}

type KeyedGovernor = RateLimiter<
    u64,
    DashMapStateStore<u64, ahash::RandomState>,
    QuantaUpkeepClock,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
>;

/// governor in its fastest keyed configuration: DashMap store hashed with ahash, and the
/// coarse upkeep clock (the same kind of clock slidegate uses). A policy of several limits is
/// several limiters checked in order, stopping at the first refusal.
pub struct Governor(pub Vec<KeyedGovernor>);

/// quanta allows one upkeep thread per process: every governor shares this clock.
fn governor_clock() -> QuantaUpkeepClock {
    static CLOCK: std::sync::OnceLock<QuantaUpkeepClock> = std::sync::OnceLock::new();
    CLOCK
        .get_or_init(|| {
            QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .unwrap_or_else(|e| unreachable!("one upkeep thread: {e}"))
        })
        .clone()
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

impl Governor {
    pub fn new(policy: Policy) -> Governor {
        let quotas = match policy {
            Policy::Open => vec![Quota::per_second(nonzero(1_000_000_000))],
            Policy::Minute => vec![Quota::per_minute(nonzero(4_000_000_000))],
            Policy::Closed => vec![Quota::per_hour(nonzero(1))],
            Policy::ThreeLimits => vec![
                Quota::per_second(nonzero(10)),
                Quota::per_minute(nonzero(120)),
                Quota::per_hour(nonzero(240)),
            ],
        };
        let limiters = quotas
            .into_iter()
            .map(|q| {
                RateLimiter::dashmap_with_clock_and_hasher(q, governor_clock(), ahash::RandomState::new())
            })
            .collect();
        Governor(limiters)
    }
}

impl Contender for Governor {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.0.iter().all(|l| l.check_key(&key).is_ok())
    }
}

/// A fixed pseudo-random permutation of `0..n` (xorshift-driven Fisher-Yates), so both
/// contenders see the same order.
pub fn shuffled(n: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (0..n).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..keys.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        keys.swap(i, j);
    }
    keys
}

/// Inserts `keys` so a workload measures lookups of existing keys.
pub fn prefill(c: &impl Contender, keys: impl IntoIterator<Item = u64>) {
    for k in keys {
        black_box(c.check(k));
    }
}

/// One thread, one key, `iters` checks.
pub fn hot_key(c: &impl Contender, iters: u64) -> Duration {
    c.check(7);
    let start = Instant::now();
    for _ in 0..iters {
        black_box(c.check(black_box(7)));
    }
    start.elapsed()
}

/// `iters` checks cycling through `keys`, starting at index `from`; returns where the next
/// run should start.
fn run_cycle(c: &impl Contender, keys: &[u64], from: usize, iters: u64) -> usize {
    let from = if from < keys.len() { from } else { 0 };
    let tail = keys.get(from..).unwrap_or_default();
    for &key in tail.iter().chain(keys.iter().cycle()).take(iters as usize) {
        black_box(c.check(black_box(key)));
    }
    match keys.len() {
        0 => 0,
        n => (from + (iters % n as u64) as usize) % n,
    }
}

/// One thread cycling through `keys` (already inserted), starting where the previous run on
/// the same cursor stopped: successive runs of fewer checks than keys (1 M keys) walk the
/// whole set instead of the same prefix, which would stay in the caches.
pub fn cycle(c: &impl Contender, keys: &[u64], cursor: &mut usize, iters: u64) -> Duration {
    let start = Instant::now();
    *cursor = run_cycle(c, keys, *cursor, iters);
    start.elapsed()
}

/// Two threads, each doing `iters` checks, thread `t` on `keys(t)`; the wall time of the run.
pub fn two_threads<C: Contender>(c: &Arc<C>, iters: u64, keys: impl Fn(usize) -> Vec<u64>) -> Duration {
    const THREADS: usize = 2;
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, barrier, keys) = (Arc::clone(c), Arc::clone(&barrier), keys(t));
            thread::spawn(move || {
                barrier.wait();
                run_cycle(&*c, &keys, 0, iters);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for w in workers {
        w.join().unwrap_or_else(|_| unreachable!("benchmark thread panicked"));
    }
    start.elapsed()
}

/// Two threads on one hot key.
pub fn two_threads_hot<C: Contender>(c: &Arc<C>, iters: u64) -> Duration {
    two_threads(c, iters, |_| vec![7])
}

/// Two threads on disjoint sets of `FEW_KEYS` keys (inserted before timing).
pub fn two_threads_disjoint<C: Contender>(c: &Arc<C>, iters: u64) -> Duration {
    let set = |t: usize| (0..FEW_KEYS).map(|k| k + t as u64 * FEW_KEYS).collect::<Vec<u64>>();
    prefill(&**c, (0..2).flat_map(set));
    two_threads(c, iters, set)
}

/// Every check a new key: `iters` inserts into a fresh contender (built outside the timing).
pub fn insert_heavy<C: Contender>(make: impl Fn() -> C, iters: u64) -> Duration {
    let c = make();
    let start = Instant::now();
    for k in 0..iters {
        black_box(c.check(k));
    }
    let elapsed = start.elapsed();
    drop(c);
    elapsed
}
