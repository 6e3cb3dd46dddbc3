//! slidegate against governor on identical workloads: `cargo bench --bench limiter`.
//!
//! One harness, a module per kind of scenario. The workloads themselves live in
//! `workloads.rs`, shared with `examples/bench_report.rs`, so the criterion figures and the
//! README's table time the same loops. Threaded cases use `iter_custom` and report the wall
//! time per check per thread.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main};

#[cfg(all(feature = "tower", feature = "metrics"))]
#[allow(dead_code)]
mod gateway;
#[cfg(all(feature = "tower", feature = "metrics"))]
mod overhead;
mod single_thread;
mod sweep;
mod threads;
mod uptime;
#[allow(dead_code)]
mod workloads;

criterion_group!(
    benches,
    single_thread::hot_key,
    single_thread::many_keys,
    single_thread::three_limits,
    single_thread::inserts,
    threads::two_threads,
    sweep::sweep,
    uptime::jumps
);
#[cfg(all(feature = "tower", feature = "metrics"))]
criterion_group!(features, overhead::layer, overhead::metrics);
#[cfg(all(feature = "tower", feature = "metrics"))]
criterion_main!(benches, features);
#[cfg(not(all(feature = "tower", feature = "metrics")))]
criterion_main!(benches);
