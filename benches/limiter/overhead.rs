//! Criterion: the tower layer's overhead per request, and a check with a metrics recorder
//! installed against one without (features `tower`, `axum`, `metrics`).

use criterion::Criterion;
use metrics_util::debugging::DebuggingRecorder;

use slidegate_tools::gateway::{checks, hello, limited, open_limiter, requests};

pub fn layer(c: &mut Criterion) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else { return };
    let mut group = c.benchmark_group("gateway");
    group.bench_function("hello world", |b| b.iter_custom(|n| runtime.block_on(requests(hello(), n))));
    group.bench_function("hello world + layer", |b| {
        b.iter_custom(|n| runtime.block_on(requests(limited(), n)))
    });
    group.finish();
}

pub fn metrics(c: &mut Criterion) {
    // Built before a recorder exists: its metric handles are no-ops.
    let quiet = open_limiter::<u64>();
    let recorder = DebuggingRecorder::new();
    let _ = recorder.install();
    let counted = open_limiter::<u64>();
    let mut group = c.benchmark_group("metrics");
    group.bench_function("check, no recorder", |b| b.iter_custom(|n| checks(&quiet, n)));
    group.bench_function("check, recorder installed", |b| b.iter_custom(|n| checks(&counted, n)));
    group.finish();
}
