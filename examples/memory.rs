//! Heap bytes per key, slidegate beside governor: `cargo run --release --example memory`.
//!
//! A counting global allocator records live heap bytes; each configuration inserts 1,000,000
//! `u64` keys into a fresh limiter and reports (heap after − heap before) / keys, which
//! includes the map's table, its spare capacity and each key's state: what a process
//! really pays. Prints one markdown table.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use slidegate::{Algorithm, ConfigError, Limit, Limiter, ManualClock};

#[allow(dead_code)]
#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{live_bytes as live, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;

/// Heap bytes per key for slidegate with `limits`.
fn slidegate(algorithm: Algorithm, limits: &[Limit]) -> Result<(f64, usize), ConfigError> {
    let before = live();
    let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(ManualClock::new());
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
    let three = vec![
        Limit::per_second(10),
        Limit::per_minute(120),
        Limit::per_hour(240).precision(Duration::from_secs(60)),
    ];
    let three_quotas =
        vec![Quota::per_second(nonzero(10)), Quota::per_minute(nonzero(120)), Quota::per_hour(nonzero(240))];
    let minute = vec![Limit::per_minute(60)];
    let minute_quota = vec![Quota::per_minute(nonzero(60))];
    let sliding = Algorithm::SlidingWindow;
    let configs = [
        ("10/s", sliding, vec![Limit::per_second(10)], vec![Quota::per_second(nonzero(10))]),
        ("60/min at 1 s precision", sliding, minute.clone(), minute_quota.clone()),
        ("10/s + 120/min + 240/h@1min", sliding, three.clone(), three_quotas.clone()),
        ("60/min", Algorithm::FixedWindow, minute.clone(), minute_quota.clone()),
        ("60/min", Algorithm::Gcra, minute, minute_quota),
        ("10/s + 120/min + 240/h", Algorithm::Gcra, three, three_quotas),
    ];
    println!("Heap per key, {KEYS} u64 keys (`cargo run --release --example memory`):\n");
    println!(
        "| policy | algorithm | slots per key | slidegate state | slidegate total | governor total | ratio |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (name, algorithm, limits, quotas) in configs {
        let slots = match algorithm {
            Algorithm::SlidingWindow => limits.iter().map(Limit::slots).sum::<u64>().to_string(),
            _ => "—".to_owned(),
        };
        let (ours, state) = slidegate(algorithm, &limits)?;
        let theirs = governor(&quotas);
        println!(
            "| {name} | {algorithm:?} | {slots} | {state} B | {ours:.0} B | {theirs:.0} B | {:.2} |",
            ours / theirs
        );
    }
    Ok(())
}
