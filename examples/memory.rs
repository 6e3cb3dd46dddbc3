//! Heap bytes per key, slidegate beside governor: `cargo run --release --example memory`.
//!
//! A counting global allocator records live heap bytes; each configuration inserts 1,000,000
//! `u64` keys into a fresh limiter and reports (heap after − heap before) / keys, which
//! includes the map's table, its spare capacity and each key's state: what a process
//! really pays. Prints one markdown table.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use slidegate::{ConfigError, Limit, Limiter, ManualClock};

#[allow(dead_code)]
#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{live_bytes as live, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;

/// Heap bytes per key for slidegate with `limits`.
fn slidegate(limits: &[Limit]) -> Result<(f64, usize), ConfigError> {
    let before = live();
    let mut builder = Limiter::<u64>::builder().clock(ManualClock::new());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    let limiter = builder.build()?;
    for k in 0..KEYS {
        let _ = limiter.check(&k);
    }
    let per_key = (live() - before) as f64 / KEYS as f64;
    Ok((per_key, limiter.state_bytes_per_key()))
}

/// Heap bytes per key for governor, one keyed limiter per quota (its way of composing
/// limits), in its default DashMap store.
fn governor(quotas: &[Quota]) -> f64 {
    let before = live();
    let limiters: Vec<_> = quotas.iter().map(|q| RateLimiter::keyed(*q)).collect();
    for k in 0..KEYS {
        for l in &limiters {
            let _ = l.check_key(&k);
        }
    }
    let per_key = (live() - before) as f64 / KEYS as f64;
    drop(limiters);
    per_key
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

fn main() -> Result<(), ConfigError> {
    let configs: [(&str, Vec<Limit>, Vec<Quota>); 3] = [
        ("10/s", vec![Limit::per_second(10)], vec![Quota::per_second(nonzero(10))]),
        ("60/min at 1 s precision", vec![Limit::per_minute(60)], vec![Quota::per_minute(nonzero(60))]),
        (
            "10/s + 120/min + 240/h@1min",
            vec![
                Limit::per_second(10),
                Limit::per_minute(120),
                Limit::per_hour(240).precision(Duration::from_secs(60)),
            ],
            vec![
                Quota::per_second(nonzero(10)),
                Quota::per_minute(nonzero(120)),
                Quota::per_hour(nonzero(240)),
            ],
        ),
    ];
    println!("Heap per key, {KEYS} u64 keys (`cargo run --release --example memory`):\n");
    println!("| policy | slots per key | slidegate state | slidegate total | governor total | ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, limits, quotas) in configs {
        let slots: u64 = limits.iter().map(Limit::slots).sum();
        let (ours, state) = slidegate(&limits)?;
        let theirs = governor(&quotas);
        println!("| {name} | {slots} | {state} B | {ours:.0} B | {theirs:.0} B | {:.2} |", ours / theirs);
    }
    Ok(())
}
