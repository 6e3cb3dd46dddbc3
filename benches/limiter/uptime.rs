//! Long uptime: one check on a key whose last check was a jump of the clock ago (one slot,
//! one window, a day, a month, ten years). A move to a later slot costs O(slots moved),
//! capped at the ring; a key idle past every window is replaced by a fresh state, O(slots);
//! neither may grow with the time elapsed, so from one window on the figures must be flat.
//!
//! Each batch builds a limiter on its own `ManualClock`, checks `KEYS` keys once, advances
//! the clock by the jump (all untimed), then times one check on each key: the timed loop
//! holds nothing but those checks. The keys are checked once before the jump, so they are
//! not in the per-thread cache: each timed check goes through the map (and, for an expired
//! key, its shard's write lock to replace the state).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use slidegate::{Limit, Limiter, ManualClock};

/// Keys per batch: each timed check is on a different key.
const KEYS: u64 = 256;

const SECOND: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(86_400);

/// The README's three limits, and one limit of 3600 one-millisecond slots (the largest
/// ring): `(name, limits, one slot, the longest window)`.
const POLICIES: [(&str, &[&str], Duration, Duration); 2] = [
    ("three_limits", &["10/s", "120/min", "240/h@1min"], SECOND, Duration::from_secs(3600)),
    ("3600_slots_of_1ms", &["1000/3600ms@1ms"], Duration::from_millis(1), Duration::from_millis(3600)),
];

fn limiter(limits: &[&str], clock: &ManualClock) -> Limiter<u64> {
    let mut builder = Limiter::<u64>::builder().clock(clock.clone());
    for text in limits {
        let limit: Limit = text.parse().unwrap_or_else(|e| unreachable!("valid benchmark limit {text}: {e}"));
        builder = builder.limit(limit);
    }
    builder.build().unwrap_or_else(|e| unreachable!("valid benchmark policy: {e}"))
}

/// The time `iters` checks take, each on a key last checked `jump` earlier.
fn after_jump(limits: &[&str], jump: Duration, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let batch = left.min(KEYS);
        let clock = ManualClock::new();
        // Not at 0: the keys' windows hold a day of (empty) history.
        clock.set(DAY);
        let limiter = limiter(limits, &clock);
        for key in 0..batch {
            let _ = limiter.check(&key);
        }
        clock.advance(jump);
        let mut admitted = 0;
        let start = Instant::now();
        for key in 0..batch {
            admitted += u64::from(limiter.check(black_box(&key)).is_allowed());
        }
        total += start.elapsed();
        // Every key held one unit: the check after any jump admits.
        assert_eq!(black_box(admitted), batch);
        left -= batch;
    }
    total
}

pub fn jumps(c: &mut Criterion) {
    let mut group = c.benchmark_group("uptime_jump");
    for (policy, limits, slot, window) in POLICIES {
        let jumps = [
            ("1_slot", slot),
            ("1_window", window),
            ("1_day", DAY),
            ("1_month", 30 * DAY),
            ("10_years", 3653 * DAY),
        ];
        for (name, jump) in jumps {
            group.bench_function(BenchmarkId::new(policy, name), |b| {
                b.iter_custom(|iters| after_jump(limits, jump, iters))
            });
        }
    }
    group.finish();
}
