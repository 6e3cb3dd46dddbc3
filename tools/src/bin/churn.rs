//! Leaks under churn: `cargo run --release -p slidegate-tools --bin churn [-- --quick] [--cycles N] [--keys N]
//! [--algorithm NAME]...`.
//!
//! Each cycle inserts `--keys` new `u64` keys (1,000,000; `--quick` 200,000) into a limiter of
//! 10/s per key on a [`ManualClock`] (one admitted request each), records heap and RSS (the
//! cycle's peak), moves the clock 3 s on (past every key's 2 s life) and sweeps them all out,
//! and records heap and RSS again; `--cycles` cycles (100; `--quick` 10). For
//! `Algorithm::SlidingLog`, whose evicted logs are freed after a grace period, the heap
//! after the sweep is also recorded after the deferred frees have run ("settled": sweeps of a
//! second limiter, which holds keys in every shard, each seal, advance and free); for the
//! others the two are the same.
//!
//! Heap is live bytes from a counting allocator; RSS is resident pages from `/proc/self/statm`
//! × the page size. The verdicts, each of which makes the program exit non-zero when broken:
//! - RSS flat: over cycles 2..=N (cycle 1 is the warm-up, in which the map's tables and
//!   malloc's arenas grow to their working size), max/min of RSS at the peak ≤ 1.10;
//! - RSS after eviction bounded: over cycles 2..=N, its largest value is at most 1.10 × the
//!   least RSS at the peak (the working set: nothing piles up beyond it). glibc keeps most
//!   freed chunks in its arenas, so RSS after eviction is what the allocator kept, which
//!   varies with fragmentation (at 1,000,000 keys, between about 50 and 110 MiB from cycle to
//!   cycle in the runs measured, with the heap back to 0 B every time; `malloc_trim(0)` after
//!   each eviction brought it to 2.4–2.6 MiB); its max/min is printed, not held to 1.10;
//! - heap flat (no leak): the settled heap after every cycle's eviction is exactly cycle 1's;
//! - heap back to the start: the settled heap after every eviction is exactly what it was
//!   before cycle 1 (after a warm-up that allocates this thread's key cache, its grace-period
//!   registration and garbage lists, and the second limiter, and inserts nothing).
//!
//! Each algorithm runs in a fresh process of its own (this program with `--child NAME`), so
//! one run's malloc arenas do not blur the next one's RSS. Default algorithms: the sliding
//! window (the default) and the sliding log; `--algorithm all` runs all four.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Limit, Limiter, ManualClock};

use slidegate_tools::counting_alloc;
use slidegate_tools::rss;
use slidegate_tools::thousands as n;

use counting_alloc::{live_bytes, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type Error = Box<dyn std::error::Error>;

/// The largest max/min ratio of RSS over cycles 2..=N.
/// Heap the grace periods may still hold after settling: a few deferred frees whose epoch
/// has not advanced yet, and the capacity of the lists that hold them. Constant, not per key: a leak that grows with the
/// cycles passes it within a few cycles at more than ~100 keys (64 B each) in all.
const EPOCH_SLACK: i64 = 8 * 1024;

const RSS_FLAT: f64 = 1.10;

const ALGORITHMS: [(&str, Algorithm); 4] = [
    ("sliding-window", Algorithm::SlidingWindow),
    ("sliding-log", Algorithm::SlidingLog),
    ("fixed-window", Algorithm::FixedWindow),
    ("gcra", Algorithm::Gcra),
];

fn heap() -> u64 {
    live_bytes() as u64
}

fn rss() -> u64 {
    rss::resident_bytes().unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn signed(bytes: i64) -> String {
    if bytes.unsigned_abs() < 1024 * 1024 {
        format!("{bytes:+} B")
    } else {
        format!("{:+.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

struct Args {
    cycles: u64,
    keys: u64,
    algorithms: Vec<&'static str>,
    child: Option<&'static str>,
}

fn algorithm(name: &str) -> Result<(&'static str, Algorithm), Error> {
    ALGORITHMS.iter().copied().find(|(n, _)| *n == name).ok_or_else(|| {
        let names: Vec<_> = ALGORITHMS.iter().map(|(n, _)| *n).collect();
        format!("unknown algorithm {name} (one of {}, or all)", names.join(", ")).into()
    })
}

/// leaks under churn: cycles of inserting new keys, sweeping them out, and measuring heap
/// and RSS; each algorithm in a process of its own.
#[derive(argh::FromArgs)]
struct Flags {
    /// 10 cycles of 200,000 keys (CI)
    #[argh(switch)]
    quick: bool,
    /// cycles, at least 2 (default 100; 10 with --quick)
    #[argh(option, from_str_fn(number))]
    cycles: Option<u64>,
    /// new keys per cycle, `_` allowed (default 1_000_000; 200_000 with --quick)
    #[argh(option, from_str_fn(number))]
    keys: Option<u64>,
    /// an algorithm to run (repeatable), or `all` (default: sliding-window, sliding-log)
    #[argh(option)]
    algorithm: Vec<String>,
    /// internal: run one algorithm in this process
    #[argh(option)]
    child: Option<String>,
}

/// A count, with `_` between digits allowed.
fn number(value: &str) -> Result<u64, String> {
    value.replace('_', "").parse().map_err(|_| format!("not a number: {value}"))
}

fn args() -> Result<Args, Error> {
    let flags: Flags = argh::from_env();
    let quick = flags.quick;
    let cycles = flags.cycles.unwrap_or(if quick { 10 } else { 100 });
    let keys = flags.keys.unwrap_or(if quick { 200_000 } else { 1_000_000 });
    if cycles < 2 || keys == 0 {
        return Err("--cycles must be at least 2 (cycle 1 is the warm-up), --keys positive".into());
    }
    let mut algorithms = Vec::new();
    for name in &flags.algorithm {
        match name.as_str() {
            "all" => algorithms.extend(ALGORITHMS.iter().map(|(n, _)| *n)),
            name => algorithms.push(algorithm(name)?.0),
        }
    }
    let child = flags.child.as_deref().map(algorithm).transpose()?.map(|(name, _)| name);
    if algorithms.is_empty() {
        algorithms = vec!["sliding-window", "sliding-log"];
    }
    Ok(Args { cycles, keys, algorithms, child })
}

fn main() -> ExitCode {
    let result = args().and_then(|args| match args.child {
        Some(name) => child(&args, name),
        None => parent(&args),
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("churn: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs each algorithm in a child process, which prints its own tables.
fn parent(args: &Args) -> Result<bool, Error> {
    println!(
        "Churn: {} cycles of inserting {} new `u64` \
         keys (10/s, one request each), then moving the clock 3 s on and sweeping them all out.",
        args.cycles,
        n(args.keys)
    );
    let mut ok = true;
    for name in &args.algorithms {
        let status = Command::new(std::env::current_exe()?)
            .args(["--child", name, "--cycles", &args.cycles.to_string(), "--keys", &args.keys.to_string()])
            .status()?;
        ok &= status.success();
    }
    Ok(ok)
}

/// One cycle's measurements.
#[derive(Clone, Copy)]
struct Cycle {
    peak_heap: u64,
    peak_rss: u64,
    /// Right after the sweep.
    swept_heap: u64,
    /// After the deferred frees have run.
    settled_heap: u64,
    rss: u64,
    took: Duration,
}

/// Runs what grace periods have deferred, as far as it can: sweeps `flusher` (each of its
/// shards flushes) until the heap has not dropped for a while.
fn settle(flusher: &Limiter<u64>) {
    let (mut last, mut still) = (heap(), 0);
    while still < 16 {
        flusher.sweep();
        let now = heap();
        if now < last {
            (last, still) = (now, 0);
        } else {
            still += 1;
        }
    }
}

fn child(args: &Args, name: &'static str) -> Result<bool, Error> {
    let (_, algorithm) = crate::algorithm(name)?;
    let started = Instant::now();
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .algorithm(algorithm)
        .limit(Limit::per_second(10))
        .clock(clock.clone())
        .build()?;
    // Warm-up that inserts nothing: a cost-0 check allocates this thread's key cache and
    // registers it for grace periods. The flusher holds a key in every shard for good (an
    // hour's limit on a clock that never moves), so that its sweeps flush. The results'
    // vector is allocated now, so that its growth does not show as the limiter's.
    let _ = limiter.check_n(&u64::MAX, 0);
    let flusher = Limiter::<u64>::builder().limit(Limit::per_hour(10)).clock(ManualClock::new()).build()?;
    for key in 0..1_000u64 {
        let _ = flusher.check(&key);
    }
    settle(&flusher);
    let mut cycles = Vec::with_capacity(args.cycles as usize);
    let (start_heap, start_rss) = (heap(), rss());
    let mut refused = 0u64;
    let mut unswept = 0u64;
    for c in 0..args.cycles {
        let t0 = Instant::now();
        for k in c * args.keys..(c + 1) * args.keys {
            refused += u64::from(!limiter.check(&k).is_allowed());
        }
        let (peak_heap, peak_rss) = (heap(), rss());
        clock.advance(Duration::from_secs(3));
        let evicted = limiter.sweep() as u64;
        unswept += args.keys - evicted.min(args.keys) + limiter.len() as u64;
        let swept_heap = heap();
        settle(&flusher);
        let settled_heap = heap();
        cycles.push(Cycle { peak_heap, peak_rss, swept_heap, settled_heap, rss: rss(), took: t0.elapsed() });
    }
    Ok(report(args, name, start_heap, start_rss, &cycles, refused, unswept, started.elapsed()))
}

/// max/min of `f` over cycles 2..=N.
fn spread(cycles: &[Cycle], f: impl Fn(&Cycle) -> u64) -> (u64, u64, f64) {
    let later = cycles.iter().skip(1).map(f);
    let (lo, hi) = later.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo, hi, hi as f64 / lo.max(1) as f64)
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    name: &str,
    start_heap: u64,
    start_rss: u64,
    cycles: &[Cycle],
    refused: u64,
    unswept: u64,
    took: Duration,
) -> bool {
    let log = name == "sliding-log";
    println!(
        "\n`{name}`: {:.0} s, {:.2} s per cycle. Before cycle 1: heap {}, RSS {}.\n",
        took.as_secs_f64(),
        took.as_secs_f64() / cycles.len() as f64,
        mib(start_heap),
        mib(start_rss)
    );
    let settled = if log { " (epoch flushed)" } else { "" };
    println!(
        "| cycle | heap at peak | RSS at peak | heap after eviction{settled} | − before cycle 1 |{} RSS after eviction |",
        if log { " epoch garbage pending after the sweep |" } else { "" }
    );
    println!("|---:|---:|---:|---:|---:|{}---:|", if log { "---:|" } else { "" });
    let every = (cycles.len() / 10).max(1);
    for (i, c) in cycles.iter().enumerate() {
        let cycle = i + 1;
        if cycle == 1 || cycle % every == 0 || cycle == cycles.len() {
            let pending = if log {
                format!(" {} |", signed(c.swept_heap as i64 - c.settled_heap as i64))
            } else {
                String::new()
            };
            println!(
                "| {cycle} | {} | {} | {} | {} |{pending} {} |",
                mib(c.peak_heap),
                mib(c.peak_rss),
                mib(c.settled_heap),
                signed(c.settled_heap as i64 - start_heap as i64),
                mib(c.rss)
            );
        }
    }
    let (lo_peak, hi_peak, peak_ratio) = spread(cycles, |c| c.peak_rss);
    let (lo_after, hi_after, after_ratio) = spread(cycles, |c| c.rss);
    let first = cycles.first().map_or(0, |c| c.settled_heap);
    let grew = cycles.iter().map(|c| c.settled_heap as i64 - first as i64).max().unwrap_or(0);
    let shrank = cycles.iter().map(|c| c.settled_heap as i64 - first as i64).min().unwrap_or(0);
    let retained_max = cycles.iter().map(|c| c.settled_heap as i64 - start_heap as i64).max().unwrap_or(0);
    let retained_min = cycles.iter().map(|c| c.settled_heap as i64 - start_heap as i64).min().unwrap_or(0);
    let per_key =
        cycles.iter().map(|c| c.peak_heap - start_heap).max().unwrap_or(0) as f64 / args.keys as f64;
    let slowest = cycles.iter().map(|c| c.took).max().unwrap_or_default();
    println!();
    let mut ok = true;
    let mut verdict = |pass: bool, what: String| {
        println!("- {}: {what}", if pass { "ok" } else { "FAILED" });
        ok &= pass;
    };
    verdict(
        refused == 0 && unswept == 0,
        format!("every key admitted ({refused} refused) and swept ({unswept} left)"),
    );
    verdict(
        peak_ratio <= RSS_FLAT,
        format!(
            "RSS at peak, cycles 2..={}: {} to {} (max/min {peak_ratio:.3} ≤ {RSS_FLAT})",
            cycles.len(),
            mib(lo_peak),
            mib(hi_peak)
        ),
    );
    verdict(
        hi_after as f64 <= RSS_FLAT * lo_peak as f64,
        format!(
            "RSS after eviction, cycles 2..={}: {} to {} (max/min {after_ratio:.3}; glibc keeps \
             freed chunks, so held to a bound: max ≤ {RSS_FLAT} × the least RSS at peak, {})",
            cycles.len(),
            mib(lo_after),
            mib(hi_after),
            mib(lo_peak)
        ),
    );
    verdict(
        grew.abs() <= EPOCH_SLACK && shrank.abs() <= EPOCH_SLACK,
        format!(
            "heap after eviction{settled} flat: within {EPOCH_SLACK} B of cycle 1's in every cycle (range {} to {})",
            signed(shrank),
            signed(grew)
        ),
    );
    verdict(
        retained_max.abs() <= EPOCH_SLACK && retained_min.abs() <= EPOCH_SLACK,
        format!(
            "heap back to its level before cycle 1, within {EPOCH_SLACK} B, after every eviction{settled} (kept {} to {})",
            signed(retained_min),
            signed(retained_max)
        ),
    );
    println!("- heap per key at the peak: {per_key:.0} B; slowest cycle {:.2} s", slowest.as_secs_f64());
    ok
}
