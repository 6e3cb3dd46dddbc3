//! One thread: a hot key (admitted, refused), 1,000 keys round-robin, 1 M keys in random
//! order, the three-limit policy, and insert-heavy traffic.

use criterion::{BenchmarkId, Criterion};

use crate::workloads::{self, Governor, Policy, Slidegate, FEW_KEYS, MANY_KEYS};

fn both(policy: Policy) -> (Slidegate, Governor) {
    (Slidegate::new(policy), Governor::new(policy))
}

pub fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key");
    for (name, policy) in [("allowed", Policy::Open), ("denied", Policy::Closed)] {
        let (s, g) = both(policy);
        group.bench_function(BenchmarkId::new("slidegate", name), |b| {
            b.iter_custom(|iters| workloads::hot_key(&s, iters))
        });
        group.bench_function(BenchmarkId::new("governor", name), |b| {
            b.iter_custom(|iters| workloads::hot_key(&g, iters))
        });
    }
    group.finish();
}

fn cycle_both(c: &mut Criterion, group: &str, keys: &[u64]) {
    let (s, g) = both(Policy::Open);
    workloads::prefill(&s, keys.iter().copied());
    workloads::prefill(&g, keys.iter().copied());
    let mut group = c.benchmark_group(group);
    group.bench_function("slidegate", |b| b.iter_custom(|iters| workloads::cycle(&s, keys, iters)));
    group.bench_function("governor", |b| b.iter_custom(|iters| workloads::cycle(&g, keys, iters)));
    group.finish();
}

pub fn many_keys(c: &mut Criterion) {
    cycle_both(c, "keys_1k_round_robin", &(0..FEW_KEYS).collect::<Vec<_>>());
    cycle_both(c, "keys_1m_random", &workloads::shuffled(MANY_KEYS));
}

pub fn three_limits(c: &mut Criterion) {
    // 1,000 keys round-robin under 10/s + 120/min + 240/h: the first checks of each key are
    // admitted, then the steady state is mostly refusals by the 10/s limit.
    let (s, g) = both(Policy::ThreeLimits);
    let keys: Vec<u64> = (0..FEW_KEYS).collect();
    let mut group = c.benchmark_group("three_limits_1k_keys");
    group.bench_function("slidegate", |b| b.iter_custom(|iters| workloads::cycle(&s, &keys, iters)));
    group.bench_function("governor", |b| b.iter_custom(|iters| workloads::cycle(&g, &keys, iters)));
    group.finish();
}

pub fn inserts(c: &mut Criterion) {
    let mut group = c.benchmark_group("insert_every_check");
    group.sample_size(20);
    group.bench_function("slidegate", |b| {
        b.iter_custom(|iters| workloads::insert_heavy(|| Slidegate::new(Policy::Open), iters))
    });
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| workloads::insert_heavy(|| Governor::new(Policy::Open), iters))
    });
    group.finish();
}
