//! Two threads: on one hot key (both contend for the same state), and on disjoint 1,000-key
//! sets visited in random order. Figures are wall time per check per thread.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion};

use slidegate_tools::workloads::{
    self, Contender, Governor, Keys, Pass, Policy, Slidegate, Visits, FEW_KEYS, HOT_KEY, VISIT_SEED,
};

fn admitted(pass: Pass) -> std::time::Duration {
    assert!(pass.all_admitted(), "a check was refused in a workload that admits every check: {pass:?}");
    pass.elapsed
}

/// Thread `t` visits its own set, `t·FEW_KEYS..(t + 1)·FEW_KEYS`, in a random sequence.
fn disjoint(t: usize) -> Keys {
    Keys::Random(Visits::new(VISIT_SEED + t as u64, t as u64 * FEW_KEYS, FEW_KEYS))
}

/// `c` with both sets inserted, set by set, each in a random order.
fn filled<C: Contender>(c: C) -> Arc<C> {
    for t in 0..2 {
        let order = workloads::shuffled(t * FEW_KEYS, FEW_KEYS);
        assert_eq!(workloads::prefill(&c, &order), FEW_KEYS);
    }
    Arc::new(c)
}

pub fn two_threads(c: &mut Criterion) {
    let s = Arc::new(Slidegate::sliding(Policy::HotMinute));
    let g = Arc::new(Governor::new(Policy::HotMinute));
    let mut group = c.benchmark_group("two_threads");
    group.bench_function(BenchmarkId::new("slidegate", "hot_key"), |b| {
        b.iter_custom(|iters| admitted(workloads::two_threads(&s, iters, |_| Keys::Hot(HOT_KEY))))
    });
    group.bench_function(BenchmarkId::new("governor", "hot_key"), |b| {
        b.iter_custom(|iters| admitted(workloads::two_threads(&g, iters, |_| Keys::Hot(HOT_KEY))))
    });
    let s = filled(Slidegate::sliding(Policy::HotSecond));
    let g = filled(Governor::new(Policy::HotSecond));
    group.bench_function(BenchmarkId::new("slidegate", "disjoint_keys"), |b| {
        b.iter_custom(|iters| admitted(workloads::two_threads(&s, iters, disjoint)))
    });
    group.bench_function(BenchmarkId::new("governor", "disjoint_keys"), |b| {
        b.iter_custom(|iters| admitted(workloads::two_threads(&g, iters, disjoint)))
    });
    group.finish();
}
