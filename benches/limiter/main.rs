//! slidegate against governor on identical workloads: `cargo bench -p slidegate-benches
//! --bench limiter [-- FILTER]` (the layer and metrics groups with `--features gateway`).
//!
//! One harness, a module per kind of scenario. The workloads themselves live in
//! `slidegate_tools::workloads`, shared with `bench_report`, so the criterion figures and
//! the performance guide's table time the same loops under the same rules (that module's
//! docs list them: random insertion and visit orders, real clocks with a frozen variant,
//! refusals against older and current slots, governor's `check_key` called directly,
//! GCRA against GCRA, limits as users build them). Threaded cases use `iter_custom` and
//! report the wall time per check per thread.

// criterion_group! generates an undocumented `pub fn`; a bench fails by panicking.
#![allow(missing_docs, clippy::panic, clippy::unwrap_used, clippy::expect_used)]

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
    single_thread::gcra,
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
