//! Bytes per key, slidegate beside governor, against the core's memory targets:
//! `cargo run --release -p slidegate-tools --bin memory [-- --strict] [-- --keys N]`.
//!
//! A counting global allocator records live heap bytes; each configuration inserts 1,000,000
//! `u64` keys (`--keys N`: N keys; a table's arrays grow in steps, so a figure per key
//! moves between key counts, for governor's map as for slidegate's table) into a fresh limiter and reports (heap after − heap before) / keys, which
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
//! comparison. A second table gives the target rows at 0.7 and 1.4 times the key count too:
//! bytes per key move with each table's growth steps, for both libraries. The last line counts the targets met and missed. Memory is deterministic, so
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

/// Keys inserted per configuration, unless `--keys` says otherwise.
const KEYS: u64 = 1_000_000;

/// Resident bytes now (0 where `/proc` is missing).
fn resident() -> u64 {
    rss::resident_bytes().unwrap_or(0)
}

/// Heap and RSS bytes per key for slidegate with `limits`, and its state's bytes per key.
fn slidegate(algorithm: Algorithm, limits: &[Limit], keys: u64) -> Result<(f64, f64, usize), ConfigError> {
    let (before, resident_before) = (live(), resident());
    let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(ManualClock::new());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    let limiter = builder.build()?;
    for k in 0..keys {
        let _ = limiter.check(&k);
    }
    let per_key = (live() - before) as f64 / keys as f64;
    let rss_per_key = resident().saturating_sub(resident_before) as f64 / keys as f64;
    Ok((per_key, rss_per_key, limiter.state_bytes_per_key()))
}

/// Heap and RSS bytes per key for governor, one keyed limiter per quota (its way of
/// composing limits), in its default DashMap store.
fn governor(quotas: &[Quota], keys: u64) -> (f64, f64) {
    let (before, resident_before) = (live(), resident());
    let limiters: Vec<_> = quotas.iter().map(|q| RateLimiter::keyed(*q)).collect();
    for k in 0..keys {
        for l in &limiters {
            let _ = l.check_key(&k);
        }
    }
    let per_key = (live() - before) as f64 / keys as f64;
    let rss_per_key = resident().saturating_sub(resident_before) as f64 / keys as f64;
    drop(limiters);
    (per_key, rss_per_key)
}

/// Runs this program again for row `row` (slidegate, or governor with `governor`) in a
/// fresh process, so that neither the other rows' freed memory nor the other library's
/// pages are in its RSS, and parses the figures it prints.
fn in_child(row: usize, governor: bool, keys: u64) -> Result<Vec<f64>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command.args(["--row", &row.to_string(), "--keys", &keys.to_string()]);
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

/// The target rows' RSS per key at 0.7 and 1.4 times `keys` beside the main table's (at
/// `keys`, given in `at_keys` as (row, slidegate, governor)): a table's arrays grow in steps
/// (slidegate's shards double, governor's map doubles), so bytes per key rise just after a
/// step and fall as the keys fill the new room; one key count is one point of that cycle.
fn growth(configs: &[Config], at_keys: &[(usize, f64, f64)], keys: u64) -> Result<(), String> {
    println!(
        "\nRSS growth per key of the target rows at three key counts (a table's arrays grow in steps, so \
         one count is one point of the cycle; each figure a fresh process):\n"
    );
    println!("| policy | keys | slidegate RSS | governor RSS | slidegate / governor |");
    println!("|---|---:|---:|---:|---:|");
    for &(row, rss, their_rss) in at_keys {
        let name = configs.get(row).map_or("?", |c| c.name);
        let mut points = Vec::new();
        for count in [keys / 10 * 7, keys, keys / 10 * 14] {
            let (ours, theirs) = if count == keys {
                (rss, their_rss)
            } else {
                let first = |v: Vec<f64>| v.get(1).copied().ok_or(format!("row {row}: no RSS"));
                (first(in_child(row, false, count.max(1))?)?, first(in_child(row, true, count.max(1))?)?)
            };
            points.push((count, ours, theirs));
        }
        for (count, ours, theirs) in points {
            println!("| {name} | {count} | {ours:.0} B | {theirs:.0} B | {:.2} |", ours / theirs);
        }
    }
    Ok(())
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
    /// keys inserted per configuration (default 1,000,000; at least 1)
    #[argh(option, default = "KEYS")]
    keys: u64,
}

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Args { strict, row, governor: measure_governor, keys } = argh::from_env();
    let keys = keys.max(1);
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
            let (heap, rss) = governor(&config.quotas, keys);
            println!("{heap} {rss}");
        } else {
            let (heap, rss, state) = slidegate(config.algorithm, &config.limits, keys)?;
            println!("{heap} {rss} {state}");
        }
        return Ok(ExitCode::SUCCESS);
    }

    println!("## `{command}`\n");
    println!(
        "Heap per key (table, spare capacity and state) and RSS growth per key (each row and each library \
         in a fresh process), {keys} u64 keys, slidegate beside governor 0.10:\n"
    );
    println!(
        "| policy | algorithm | slots per key | slidegate state | slidegate heap | governor heap | ratio | \
         slidegate RSS | governor RSS | target (RSS) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let (mut met, mut missed) = (0, 0);
    // RSS per key (slidegate, governor) of the target rows at `keys`, for the growth table.
    let mut at_keys = Vec::new();
    for (row, config) in configs.iter().enumerate() {
        let slots = match config.algorithm {
            Algorithm::SlidingWindow => config.limits.iter().map(Limit::slots).sum::<u64>().to_string(),
            _ => "—".to_owned(),
        };
        let ours = in_child(row, false, keys)?;
        let theirs = in_child(row, true, keys)?;
        let (Some(&heap), Some(&rss), Some(&state)) = (ours.first(), ours.get(1), ours.get(2)) else {
            return Err(format!("row {row}: {ours:?}").into());
        };
        let (Some(&their_heap), Some(&their_rss)) = (theirs.first(), theirs.get(1)) else {
            return Err(format!("row {row}: {theirs:?}").into());
        };
        let ours = heap;
        if config.target.is_some() {
            at_keys.push((row, rss, their_rss));
        }
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
    growth(&configs, &at_keys, keys)?;
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
