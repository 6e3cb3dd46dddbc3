//! One thread: a hot key (admitted, refused), 1,000 keys round-robin, 1 M keys in random
//! order (one slot, sixty 1-second slots, the three-limit policy), the three-limit policy on
//! 1,000 keys, and insert-heavy traffic.

use criterion::{BenchmarkId, Criterion};

use slidegate_tools::workloads::{self, Governor, Policy, Slidegate, FEW_KEYS, MANY_KEYS};

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

/// Both contenders cycling through `keys` under `policy`; `prefill`: keys inserted first.
fn cycle_both(c: &mut Criterion, group: &str, policy: Policy, keys: &[u64], prefill: bool) {
    let (s, g) = both(policy);
    if prefill {
        workloads::prefill(&s, keys.iter().copied());
        workloads::prefill(&g, keys.iter().copied());
    }
    let mut group = c.benchmark_group(group);
    let mut at = 0;
    group.bench_function("slidegate", |b| b.iter_custom(|iters| workloads::cycle(&s, keys, &mut at, iters)));
    let mut at = 0;
    group.bench_function("governor", |b| b.iter_custom(|iters| workloads::cycle(&g, keys, &mut at, iters)));
    group.finish();
}

pub fn many_keys(c: &mut Criterion) {
    cycle_both(c, "keys_1k_round_robin", Policy::Open, &(0..FEW_KEYS).collect::<Vec<_>>(), true);
    let random = workloads::shuffled(MANY_KEYS);
    cycle_both(c, "keys_1m_random", Policy::Open, &random, true);
    cycle_both(c, "keys_1m_random_60_slots", Policy::Minute, &random, true);
    cycle_both(c, "keys_1m_random_three_limits", Policy::ThreeLimits, &random, true);
}

pub fn three_limits(c: &mut Criterion) {
    // 1,000 keys round-robin under 10/s + 120/min + 240/h: the first checks of each key are
    // admitted, then the steady state is mostly refusals by the 10/s limit.
    cycle_both(c, "three_limits_1k_keys", Policy::ThreeLimits, &(0..FEW_KEYS).collect::<Vec<_>>(), false);
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
