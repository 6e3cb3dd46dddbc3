//! slidegate against governor, measured against the performance targets the core is built against, as
//! markdown tables: `cargo run --release -p slidegate-tools --bin bench_report [-- --quick] [-- --rounds N]`.
//!
//! Runs the workloads of `tools/src/workloads.rs` (the criterion bench times the same
//! loops) in interleaved rounds: each round runs every scenario on both limiters, in
//! alternating order, and the table gives the median of the rounds' figures and of their
//! ratios, each ratio beside its target (met or missed). governor 0.10 runs in its fastest
//! keyed configuration (DashMap with ahash, `QuantaUpkeepClock`). Then the targets that
//! compare slidegate with itself: two threads on disjoint keys against one thread, `sweep()`
//! per key scanned, and check latency on one thread while another sweeps continuously.
//!
//! - `--rounds N`: rounds per scenario (default 7, 3 with `--quick`).
//! - `--quick`: fewer, shorter rounds, for CI (well under a minute; the default run takes a
//!   few minutes).
//!
//! The last line counts the targets met and missed. A missed target never makes the exit
//! status non-zero: timings on a shared machine are noisy, so this is a report, not a test.

use slidegate_tools::workloads;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use slidegate::{ConfigError, Limit, Limiter, ManualClock};
use workloads::{Governor, Policy, Slidegate, FEW_KEYS, MANY_KEYS};

/// How a scenario's figure relates to its target, for the table's last column.
#[derive(Clone, Copy)]
enum Target {
    /// slidegate / governor time per check at most this.
    RatioAtMost(f64),
    /// Aggregate throughput at least this many times governor's (time ratio at most 1/x).
    ThroughputAtLeast(f64),
    /// No target: a figure for context.
    None,
}

/// The key set a scenario runs on.
#[derive(Clone, Copy)]
enum Keys {
    /// `0..FEW_KEYS`, in order.
    Few,
    /// `0..MANY_KEYS` in a fixed random order (`workloads::shuffled`).
    Many,
}

struct Scenario {
    name: &'static str,
    policy: Policy,
    keys: Keys,
    target: Target,
    /// Runs `iters` checks on a contender; returns ns per check (per thread when threaded).
    run: fn(&Both, u64, bool) -> f64,
}

/// Both contenders for one policy, with the key set prepared (and inserted in both).
struct Both {
    slidegate: Arc<Slidegate>,
    governor: Arc<Governor>,
    keys: Vec<u64>,
    /// Where each side's next cycle through `keys` starts (slidegate, governor): both see
    /// the same sequence, and short runs over 1 M keys do not keep hitting the same prefix.
    cursors: [Cell<usize>; 2],
}

/// Targets met and missed so far.
#[derive(Default)]
struct Tally {
    met: usize,
    missed: usize,
}

impl Tally {
    fn verdict(&mut self, met: bool) -> &'static str {
        if met {
            self.met += 1;
            "met"
        } else {
            self.missed += 1;
            "missed"
        }
    }
}

fn per_check(elapsed: Duration, iters: u64) -> f64 {
    elapsed.as_nanos() as f64 / iters as f64
}

fn hot(both: &Both, iters: u64, ours: bool) -> f64 {
    if ours {
        per_check(workloads::hot_key(&*both.slidegate, iters), iters)
    } else {
        per_check(workloads::hot_key(&*both.governor, iters), iters)
    }
}

fn cycle(both: &Both, iters: u64, ours: bool) -> f64 {
    let cursor = &both.cursors[usize::from(!ours)];
    let mut at = cursor.get();
    let elapsed = if ours {
        workloads::cycle(&*both.slidegate, &both.keys, &mut at, iters)
    } else {
        workloads::cycle(&*both.governor, &both.keys, &mut at, iters)
    };
    cursor.set(at);
    per_check(elapsed, iters)
}

fn two_hot(both: &Both, iters: u64, ours: bool) -> f64 {
    if ours {
        per_check(workloads::two_threads_hot(&both.slidegate, iters), iters)
    } else {
        per_check(workloads::two_threads_hot(&both.governor, iters), iters)
    }
}

fn two_disjoint(both: &Both, iters: u64, ours: bool) -> f64 {
    if ours {
        per_check(workloads::two_threads_disjoint(&both.slidegate, iters), iters)
    } else {
        per_check(workloads::two_threads_disjoint(&both.governor, iters), iters)
    }
}

fn inserts(_: &Both, iters: u64, ours: bool) -> f64 {
    if ours {
        per_check(workloads::insert_heavy(|| Slidegate::new(Policy::Open), iters), iters)
    } else {
        per_check(workloads::insert_heavy(|| Governor::new(Policy::Open), iters), iters)
    }
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "one hot key, admitted",
        policy: Policy::Open,
        keys: Keys::Few,
        target: Target::RatioAtMost(0.8),
        run: hot,
    },
    Scenario {
        name: "one hot key, refused",
        policy: Policy::Closed,
        keys: Keys::Few,
        target: Target::RatioAtMost(1.2),
        run: hot,
    },
    Scenario {
        name: "1,000 keys round-robin",
        policy: Policy::Open,
        keys: Keys::Few,
        target: Target::RatioAtMost(0.8),
        run: cycle,
    },
    Scenario {
        name: "1 M keys random order, one slot (per second @1s)",
        policy: Policy::Open,
        keys: Keys::Many,
        target: Target::RatioAtMost(0.7),
        run: cycle,
    },
    Scenario {
        name: "1 M keys random order, 60 one-second slots (per minute @1s)",
        policy: Policy::Minute,
        keys: Keys::Many,
        target: Target::RatioAtMost(1.0),
        run: cycle,
    },
    Scenario {
        name: "1 M keys random order, 10/s + 120/min + 240/h@1min",
        policy: Policy::ThreeLimits,
        keys: Keys::Many,
        target: Target::RatioAtMost(1.5),
        run: cycle,
    },
    Scenario {
        name: "1,000 keys round-robin, 10/s + 120/min + 240/h@1min",
        policy: Policy::ThreeLimits,
        keys: Keys::Few,
        target: Target::None,
        run: cycle,
    },
    Scenario {
        name: "every check a new key",
        policy: Policy::Open,
        keys: Keys::Few,
        target: Target::RatioAtMost(1.5),
        run: inserts,
    },
    Scenario {
        name: "2 threads, one hot key",
        policy: Policy::Open,
        keys: Keys::Few,
        target: Target::ThroughputAtLeast(2.0),
        run: two_hot,
    },
    Scenario {
        name: "2 threads, disjoint 1,000-key sets",
        policy: Policy::Open,
        keys: Keys::Few,
        target: Target::None,
        run: two_disjoint,
    },
];

fn prepare(policy: Policy, keys: Keys) -> Both {
    let keys = match keys {
        Keys::Few => (0..FEW_KEYS).collect(),
        Keys::Many => workloads::shuffled(MANY_KEYS),
    };
    let both = Both {
        slidegate: Arc::new(Slidegate::new(policy)),
        governor: Arc::new(Governor::new(policy)),
        keys,
        cursors: [Cell::new(0), Cell::new(0)],
    };
    // Keys exist before timing: these scenarios measure checks, not inserts.
    workloads::prefill(&*both.slidegate, both.keys.iter().copied());
    workloads::prefill(&*both.governor, both.keys.iter().copied());
    both
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Checks per measurement: enough for ~`budget` of work at `ns` per check.
fn iterations(ns: f64, budget: Duration) -> u64 {
    ((budget.as_nanos() as f64 / ns.max(1.0)) as u64).clamp(1_000, 50_000_000)
}

/// slidegate beside governor on the core's target workloads, as markdown tables.
#[derive(argh::FromArgs)]
struct Args {
    /// fewer, shorter rounds (CI)
    #[argh(switch)]
    quick: bool,
    /// rounds per scenario (default 7, 3 with --quick; at least 1)
    #[argh(option)]
    rounds: Option<usize>,
}

fn main() -> Result<(), ConfigError> {
    let Args { quick, rounds } = argh::from_env();
    let rounds = rounds.filter(|&n| n > 0).unwrap_or(if quick { 3 } else { 7 });
    // The command line as given, for the report's title.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let budget = Duration::from_millis(if quick { 20 } else { 150 });
    let command = if args.is_empty() {
        String::from("cargo run --release -p slidegate-tools --bin bench_report")
    } else {
        format!("cargo run --release -p slidegate-tools --bin bench_report -- {}", args.join(" "))
    };
    let mut tally = Tally::default();

    println!("## `{command}`\n");
    println!(
        "slidegate vs governor 0.10 (DashMap + ahash, QuantaUpkeepClock) beside the core's targets; \
         {rounds} interleaved rounds, medians; ns per check, per thread when threaded.\n"
    );
    // First, on a fresh heap (see `scaling`); printed after the scenarios.
    let scaling_rows = [false, true].map(|interleaved| scaling(rounds, budget, &mut tally, interleaved));
    println!("| scenario | slidegate | governor | slidegate / governor | target |");
    println!("|---|---:|---:|---:|---|");
    for scenario in SCENARIOS {
        let both = prepare(scenario.policy, scenario.keys);
        // Calibrate on a short warm-up of each side.
        let warm = |ours| (scenario.run)(&both, 10_000, ours);
        let iters = [iterations(warm(true), budget), iterations(warm(false), budget)];
        let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let order = if round % 2 == 0 { [true, false] } else { [false, true] };
            let mut pair = [0.0; 2];
            for side in order {
                pair[usize::from(!side)] = (scenario.run)(&both, iters[usize::from(!side)], side);
            }
            ours.push(pair[0]);
            theirs.push(pair[1]);
            ratios.push(pair[0] / pair[1]);
        }
        let (ours, theirs, ratio) = (median(&mut ours), median(&mut theirs), median(&mut ratios));
        let target = match scenario.target {
            Target::RatioAtMost(at_most) => format!("≤ {at_most:?}: {}", tally.verdict(ratio <= at_most)),
            Target::ThroughputAtLeast(x) => {
                let throughput = 1.0 / ratio;
                format!("throughput ≥ {x}×: {throughput:.2}× {}", tally.verdict(throughput >= x))
            }
            Target::None => String::from("—"),
        };
        println!("| {} | {ours:.1} ns | {theirs:.1} ns | {ratio:.2} | {target} |", scenario.name);
    }

    println!("\n| slidegate against itself | figure | target |");
    println!("|---|---|---|");
    print!("{}", scaling_rows.concat());
    sweep(quick, rounds, &mut tally)?;

    println!(
        "\n{} targets met, {} missed (of {}; timings are noisy on a shared machine: a miss does not \
         fail the run)",
        tally.met,
        tally.missed,
        tally.met + tally.missed
    );
    Ok(())
}

/// Two threads on disjoint keys against slidegate's own single thread on 1,000 keys, in
/// alternating order, medians of the rounds. Measured first, on a fresh heap, where the
/// two sets' nodes lie in two blocks (inserted set by set). With `interleaved` (measured
/// next, on the heap the first run freed), the keys are inserted alternately from the two
/// sets, so that neighbouring nodes, which share cache lines (a node here is 40 bytes), may
/// belong to different threads and contend (false sharing; a heap fragmented by earlier
/// work places nodes much like this). That row has no target.
fn scaling(rounds: usize, budget: Duration, tally: &mut Tally, interleaved: bool) -> String {
    let both = if interleaved {
        let both = Both {
            slidegate: Arc::new(Slidegate::new(Policy::Open)),
            governor: Arc::new(Governor::new(Policy::Open)),
            keys: (0..FEW_KEYS).collect(),
            cursors: [Cell::new(0), Cell::new(0)],
        };
        workloads::prefill(&*both.slidegate, (0..FEW_KEYS).flat_map(|k| [k, k + FEW_KEYS]));
        both
    } else {
        prepare(Policy::Open, Keys::Few)
    };
    let iters = iterations(cycle(&both, 10_000, true), budget);
    let (mut one, mut two, mut gains) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (o, t) = if round % 2 == 0 {
            let o = cycle(&both, iters, true);
            (o, two_disjoint(&both, iters, true))
        } else {
            let t = two_disjoint(&both, iters, true);
            (cycle(&both, iters, true), t)
        };
        one.push(o);
        two.push(t);
        // Aggregate throughput of two threads (2 checks per `t`) over one thread's.
        gains.push(2.0 * o / t);
    }
    let (one, two, gain) = (median(&mut one), median(&mut two), median(&mut gains));
    let (name, target) = if interleaved {
        ("the same, keys of the two sets inserted alternately (neighbouring nodes may belong to different threads)", String::from("—"))
    } else {
        ("2 threads on disjoint 1,000-key sets, aggregate throughput vs one thread on 1,000 keys", {
            format!("≥ 1.5×: {}", tally.verdict(gain >= 1.5))
        })
    };
    format!("| {name} | {gain:.2}× (one thread {one:.1} ns per check, two {two:.1} ns per check per thread) | {target} |\n")
}

fn filled(keys: u64) -> Result<(Limiter<u64>, ManualClock), ConfigError> {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).clock(clock.clone()).build()?;
    for k in 0..keys {
        let _ = limiter.check(&k);
    }
    Ok((limiter, clock))
}

/// `sweep()` cost per key scanned over 1 M keys, and check latency while another thread
/// sweeps them.
fn sweep(quick: bool, rounds: usize, tally: &mut Tally) -> Result<(), ConfigError> {
    let keys = MANY_KEYS;
    let (limiter, clock) = filled(keys)?;
    // Scanning: every round sweeps the same keys, none expired (median of the rounds).
    let mut none: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let evicted = limiter.sweep();
            debug_assert_eq!(evicted, 0);
            per_check(start.elapsed(), keys)
        })
        .collect();
    let none = median(&mut none);
    println!(
        "| `sweep()` over 1 M keys, none expired: per key scanned | {none:.2} ns (median of {rounds}) | \
         ≤ 5 ns: {} |",
        tally.verdict(none <= 5.0)
    );
    clock.advance(Duration::from_secs(10));
    let start = Instant::now();
    let evicted = limiter.sweep();
    let all = per_check(start.elapsed(), keys);
    println!(
        "| `sweep()` over 1 M keys, all expired: per key | {all:.1} ns (evicted {evicted}, one run) | — |"
    );
    drop(limiter);

    // Latency of single checks on one thread (over 1,000 keys) while another thread sweeps
    // 1 M keys in a loop (none expire: the clock is frozen, so every sweep scans them all),
    // for at least `min_sweeps` whole sweeps; then, as the baseline that separates the sweep's
    // effect from the machine's, as many checks while the other thread only spins.
    let (limiter, _clock) = filled(keys)?;
    let limiter = Arc::new(limiter);
    let (min_checks, min_sweeps, most) =
        if quick { (200_000, 20, Duration::from_secs(5)) } else { (2_000_000, 200, Duration::from_secs(30)) };
    let mut checks = min_checks;
    let mut sweeping_max = None;
    for sweeping in [true, false] {
        let stop = Arc::new(AtomicBool::new(false));
        let sweeps = Arc::new(AtomicU64::new(0));
        let other = {
            let (limiter, stop, sweeps) = (Arc::clone(&limiter), Arc::clone(&stop), Arc::clone(&sweeps));
            thread::spawn(move || {
                // Relaxed: a stop flag and a progress count; nothing is published with them.
                while !stop.load(Ordering::Relaxed) {
                    if sweeping {
                        limiter.sweep();
                        sweeps.fetch_add(1, Ordering::Relaxed);
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut histogram = Histogram::<u64>::new(3).unwrap_or_else(|e| unreachable!("3 digits: {e}"));
        let begin = Instant::now();
        let mut done = 0u64;
        loop {
            let key = done % FEW_KEYS;
            let start = Instant::now();
            let _ = std::hint::black_box(limiter.check(&key));
            let _ = histogram.record(start.elapsed().as_nanos() as u64);
            done += 1;
            let enough = done >= checks && (!sweeping || sweeps.load(Ordering::Relaxed) >= min_sweeps);
            if enough || (done.is_multiple_of(1024) && begin.elapsed() > most) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = other.join();
        checks = done;
        let figures = format!(
            "p50 {} ns, p99 {} ns, p99.9 {} ns, max {:.1} µs",
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.value_at_quantile(0.999),
            histogram.max() as f64 / 1000.0
        );
        if sweeping {
            let p999 = histogram.value_at_quantile(0.999);
            sweeping_max = Some((histogram.max(), p999, figures, sweeps.load(Ordering::Relaxed)));
        } else if let Some((max, p999, during, sweeps)) = sweeping_max.take() {
            println!(
                "| check latency during {sweeps} concurrent full sweeps ({checks} checks) | {during} | \
                 max ≤ 100 µs: {} (p99.9 {} 100 µs; baseline max {:.1} µs) |",
                tally.verdict(max <= 100_000),
                if p999 <= 100_000 { "≤" } else { ">" },
                histogram.max() as f64 / 1000.0
            );
            println!("| check latency, other thread spinning: baseline ({checks} checks) | {figures} | — |");
        }
    }
    Ok(())
}
