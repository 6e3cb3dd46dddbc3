//! Bytes per key, slidegate beside governor, against the core's memory targets:
//! `cargo run --release -p slidegate-tools --bin memory [-- --strict]`.
//!
//! A counting global allocator records live heap bytes; each configuration inserts 1,000,000
//! `u64` keys into a fresh limiter and reports (heap after − heap before) / keys, which
//! includes the map's table, its spare capacity and each key's state: what a process
//! really pays. Beside it, RSS per key: each configuration and each library runs in a
//! fresh process (this program with `--row N`, and `--governor`), which reports the growth
//! of its resident pages (`/proc/self/statm`) over the inserts divided by the keys: the
//! allocator's own overhead (malloc's chunk headers and rounding) included. governor 0.10 runs keyed (one DashMap limiter per quota, its way of composing
//! limits). Prints one markdown table; the targets are bounds on slidegate's RSS growth per
//! key (what a process really pays, allocator overhead included):
//!
//! - 10/s (one 1-second slot): ≤ 48 B;
//! - 60/min at 1 s precision (60 slots): ≤ 160 B;
//! - 1000/min at 1 s precision (60 slots): ≤ 256 B.
//!
//! The other rows (three limits, the fixed window, GCRA) have no target and are there for
//! comparison. The last line counts the targets met and missed. Memory is deterministic, so
//! `--strict` makes the process exit with status 1 when a bound is missed (without it, the
//! exit status is 0 either way).

use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use slidegate::{Algorithm, ConfigError, Limit, Limiter, ManualClock};

use counting_alloc::{live_bytes as live, Counting};
use slidegate_tools::{counting_alloc, rss};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;

/// Resident bytes now (0 where `/proc` is missing).
fn resident() -> u64 {
    rss::resident_bytes().unwrap_or(0)
}

/// Heap and RSS bytes per key for slidegate with `limits`, and its state's bytes per key.
fn slidegate(algorithm: Algorithm, limits: &[Limit]) -> Result<(f64, f64, usize), ConfigError> {
    let (before, resident_before) = (live(), resident());
    let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(ManualClock::new());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    let limiter = builder.build()?;
    for k in 0..KEYS {
        let _ = limiter.check(&k);
    }
    let per_key = (live() - before) as f64 / KEYS as f64;
    let rss_per_key = resident().saturating_sub(resident_before) as f64 / KEYS as f64;
    Ok((per_key, rss_per_key, limiter.state_bytes_per_key()))
}

/// Heap and RSS bytes per key for governor, one keyed limiter per quota (its way of
/// composing limits), in its default DashMap store.
fn governor(quotas: &[Quota]) -> (f64, f64) {
    let (before, resident_before) = (live(), resident());
    let limiters: Vec<_> = quotas.iter().map(|q| RateLimiter::keyed(*q)).collect();
    for k in 0..KEYS {
        for l in &limiters {
            let _ = l.check_key(&k);
        }
    }
    let per_key = (live() - before) as f64 / KEYS as f64;
    let rss_per_key = resident().saturating_sub(resident_before) as f64 / KEYS as f64;
    drop(limiters);
    (per_key, rss_per_key)
}

/// Runs this program again for row `row` (slidegate, or governor with `governor`) in a
/// fresh process, so that neither the other rows' freed memory nor the other library's
/// pages are in its RSS, and parses the figures it prints.
fn in_child(row: usize, governor: bool) -> Result<Vec<f64>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command.args(["--row", &row.to_string()]);
    if governor {
        command.arg("--governor");
    }
    let out = command.output().map_err(|e| format!("row {row}: {e}"))?;
    if !out.status.success() {
        return Err(format!("row {row}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().map(|f| f.parse::<f64>().map_err(|e| format!("row {row}: {f:?}: {e}"))).collect()
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

/// One row of the table.
struct Config {
    name: &'static str,
    algorithm: Algorithm,
    limits: Vec<Limit>,
    quotas: Vec<Quota>,
    /// The core's bound on slidegate's RSS growth per key, if any.
    target: Option<f64>,
}

/// heap and RSS bytes per key, slidegate beside governor, against the core's memory targets.
#[derive(argh::FromArgs)]
struct Args {
    /// exit with status 1 when a bound is missed
    #[argh(switch)]
    strict: bool,
    /// measure only this row, in this process, and print its figures (used by the report)
    #[argh(option)]
    row: Option<usize>,
    /// with --row: measure governor instead of slidegate
    #[argh(switch)]
    governor: bool,
}

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Args { strict, row, governor: measure_governor } = argh::from_env();
    // The command line as given, for the report's title.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = if args.is_empty() {
        String::from("cargo run --release -p slidegate-tools --bin memory")
    } else {
        format!("cargo run --release -p slidegate-tools --bin memory -- {}", args.join(" "))
    };

    let second = Duration::from_secs(1);
    let three = vec![
        Limit::per_second(10),
        Limit::per_minute(120),
        Limit::per_hour(240).precision(Duration::from_secs(60)),
    ];
    let three_quotas =
        vec![Quota::per_second(nonzero(10)), Quota::per_minute(nonzero(120)), Quota::per_hour(nonzero(240))];
    let minute = vec![Limit::per_minute(60).precision(second)];
    let minute_quota = vec![Quota::per_minute(nonzero(60))];
    let sliding = Algorithm::SlidingWindow;
    let configs = [
        Config {
            name: "10/s",
            algorithm: sliding,
            limits: vec![Limit::per_second(10).precision(second)],
            quotas: vec![Quota::per_second(nonzero(10))],
            target: Some(48.0),
        },
        Config {
            name: "60/min at 1 s precision",
            algorithm: sliding,
            limits: minute.clone(),
            quotas: minute_quota.clone(),
            target: Some(160.0),
        },
        Config {
            name: "1000/min at 1 s precision",
            algorithm: sliding,
            limits: vec![Limit::per_minute(1000).precision(second)],
            quotas: vec![Quota::per_minute(nonzero(1000))],
            target: Some(256.0),
        },
        Config {
            name: "10/s + 120/min + 240/h@1min",
            algorithm: sliding,
            limits: three.clone(),
            quotas: three_quotas.clone(),
            target: None,
        },
        Config {
            name: "60/min",
            algorithm: Algorithm::FixedWindow,
            limits: minute.clone(),
            quotas: minute_quota.clone(),
            target: None,
        },
        Config {
            name: "60/min",
            algorithm: Algorithm::Gcra,
            limits: minute,
            quotas: minute_quota,
            target: None,
        },
        Config {
            name: "10/s + 120/min + 240/h",
            algorithm: Algorithm::Gcra,
            limits: three,
            quotas: three_quotas,
            target: None,
        },
    ];

    if let Some(row) = row {
        let config = configs.get(row).ok_or_else(|| format!("no row {row}"))?;
        if measure_governor {
            let (heap, rss) = governor(&config.quotas);
            println!("{heap} {rss}");
        } else {
            let (heap, rss, state) = slidegate(config.algorithm, &config.limits)?;
            println!("{heap} {rss} {state}");
        }
        return Ok(ExitCode::SUCCESS);
    }

    println!("## `{command}`\n");
    println!(
        "Heap per key (table, spare capacity and state) and RSS growth per key (each row and each library \
         in a fresh process), {KEYS} u64 keys, slidegate beside governor 0.10:\n"
    );
    println!(
        "| policy | algorithm | slots per key | slidegate state | slidegate heap | governor heap | ratio | \
         slidegate RSS | governor RSS | target (RSS) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let (mut met, mut missed) = (0, 0);
    for (row, config) in configs.iter().enumerate() {
        let slots = match config.algorithm {
            Algorithm::SlidingWindow => config.limits.iter().map(Limit::slots).sum::<u64>().to_string(),
            _ => "—".to_owned(),
        };
        let ours = in_child(row, false)?;
        let theirs = in_child(row, true)?;
        let (Some(&heap), Some(&rss), Some(&state)) = (ours.first(), ours.get(1), ours.get(2)) else {
            return Err(format!("row {row}: {ours:?}").into());
        };
        let (Some(&their_heap), Some(&their_rss)) = (theirs.first(), theirs.get(1)) else {
            return Err(format!("row {row}: {theirs:?}").into());
        };
        let ours = heap;
        let target = match config.target {
            Some(bound) if rss <= bound => {
                met += 1;
                format!("≤ {bound} B: met")
            }
            Some(bound) => {
                missed += 1;
                format!("≤ {bound} B: missed")
            }
            None => String::from("—"),
        };
        println!(
            "| {} | {:?} | {slots} | {state} B | {ours:.0} B | {their_heap:.0} B | {:.2} | {rss:.0} B | \
             {their_rss:.0} B | {target} |",
            config.name,
            config.algorithm,
            ours / their_heap
        );
    }
    println!(
        "\nTargets: {met} met, {missed} missed{}",
        match (strict, missed) {
            (true, 0) => " (--strict: exit status 0)",
            (true, _) => " (--strict: exit status 1)",
            (false, _) => "",
        }
    );
    Ok(if strict && missed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
