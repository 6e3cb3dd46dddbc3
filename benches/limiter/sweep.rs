//! `sweep()` over 1 M keys (inserted in a random order), none expired and all expired
//! (slidegate only: governor evicts nothing by itself; its caller runs `retain_recent`).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use slidegate::{Limit, Limiter, ManualClock};

use slidegate_tools::workloads::{self, MANY_KEYS};

fn filled() -> (Limiter<u64>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(10))
        .clock(clock.clone())
        .build()
        .unwrap_or_else(|e| unreachable!("{e}"));
    for k in workloads::shuffled(0, MANY_KEYS) {
        let _ = limiter.check(&k);
    }
    (limiter, clock)
}

pub fn sweep(c: &mut Criterion) {
    let mut group = c.benchmark_group("sweep_1m_keys");
    group.sample_size(10);
    let (limiter, _clock) = filled();
    group.bench_function(BenchmarkId::new("slidegate", "none_expired"), |b| b.iter(|| limiter.sweep()));
    group.bench_function(BenchmarkId::new("slidegate", "all_expired"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (limiter, clock) = filled();
                clock.advance(Duration::from_secs(10));
                let start = Instant::now();
                let evicted = limiter.sweep();
                total += start.elapsed();
                assert_eq!(evicted, MANY_KEYS as usize);
            }
            total
        })
    });
    group.finish();
}
