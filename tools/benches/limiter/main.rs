//! slidegate against governor on identical workloads: `cargo bench -p slidegate-tools --bench limiter`.
//!
//! One harness, a module per kind of scenario. The workloads themselves live in
//! `workloads.rs`, shared with the `bench_report` tool (`slidegate_tools::workloads`), so the criterion figures and the
//! README's table time the same loops. Threaded cases use `iter_custom` and report the wall
//! time per check per thread.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main};

#[cfg(feature = "gateway")]
mod overhead;
mod single_thread;
mod sweep;
mod threads;
mod uptime;

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
#[cfg(feature = "gateway")]
criterion_group!(features, overhead::layer, overhead::metrics);
#[cfg(feature = "gateway")]
criterion_main!(benches, features);
#[cfg(not(feature = "gateway"))]
criterion_main!(benches);
