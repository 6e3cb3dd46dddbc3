//! Two threads: on one hot key (both contend for the same state), and on disjoint key sets.
//! Figures are wall time per check per thread.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion};

use slidegate_tools::workloads::{self, Governor, Policy, Slidegate};

pub fn two_threads(c: &mut Criterion) {
    let s = Arc::new(Slidegate::new(Policy::Open));
    let g = Arc::new(Governor::new(Policy::Open));
    let mut group = c.benchmark_group("two_threads");
    group.bench_function(BenchmarkId::new("slidegate", "hot_key"), |b| {
        b.iter_custom(|iters| workloads::two_threads_hot(&s, iters))
    });
    group.bench_function(BenchmarkId::new("governor", "hot_key"), |b| {
        b.iter_custom(|iters| workloads::two_threads_hot(&g, iters))
    });
    group.bench_function(BenchmarkId::new("slidegate", "disjoint_keys"), |b| {
        b.iter_custom(|iters| workloads::two_threads_disjoint(&s, iters))
    });
    group.bench_function(BenchmarkId::new("governor", "disjoint_keys"), |b| {
        b.iter_custom(|iters| workloads::two_threads_disjoint(&g, iters))
    });
    group.finish();
}
