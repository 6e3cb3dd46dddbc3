//! slidegate against governor, one markdown table: `cargo run --release --example bench_report`.
//!
//! Runs the workloads of `benches/limiter/workloads.rs` (the criterion bench times the same
//! loops) in interleaved rounds: each round runs every scenario on both limiters, in
//! alternating order, and the table gives the median of the rounds' figures and of their
//! ratios. Then the sweep: `sweep()` over 1 M keys, and check latency percentiles on one
//! thread while another sweeps continuously. `--rounds N` (default 7) and `--quick` (fewer,
//! shorter rounds, for CI) tune the run; it takes about two minutes by default.

#[allow(dead_code)]
#[path = "../benches/limiter/workloads.rs"]
mod workloads;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use slidegate::{ConfigError, Limit, Limiter, ManualClock};
use workloads::{Governor, Policy, Slidegate, FEW_KEYS, MANY_KEYS};

/// How a scenario's figure relates to the target, for the table's last column.
#[derive(Clone, Copy)]
enum Target {
    /// slidegate / governor time per check at most this.
    RatioAtMost(f64),
    /// Aggregate throughput at least this many times governor's (time ratio at most 1/x).
    ThroughputAtLeast(f64),
    None,
}

struct Scenario {
    name: &'static str,
    policy: Policy,
    threads: usize,
    target: Target,
    /// Runs `iters` checks on a contender; returns ns per check (per thread when threaded).
    run: fn(&Both, u64, bool) -> f64,
}

/// Both contenders for one policy, with the key sets prepared.
struct Both {
    slidegate: Arc<Slidegate>,
    governor: Arc<Governor>,
    keys: Vec<u64>,
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
    if ours {
        per_check(workloads::cycle(&*both.slidegate, &both.keys, iters), iters)
    } else {
        per_check(workloads::cycle(&*both.governor, &both.keys, iters), iters)
    }
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
        threads: 1,
        target: Target::RatioAtMost(0.8),
        run: hot,
    },
    Scenario {
        name: "one hot key, refused",
        policy: Policy::Closed,
        threads: 1,
        target: Target::None,
        run: hot,
    },
    Scenario {
        name: "1,000 keys round-robin",
        policy: Policy::Open,
        threads: 1,
        target: Target::None,
        run: cycle,
    },
    Scenario {
        name: "1 M keys, random order",
        policy: Policy::Open,
        threads: 1,
        target: Target::RatioAtMost(0.7),
        run: cycle,
    },
    Scenario {
        name: "10/s + 120/min + 240/h@1min, 1,000 keys",
        policy: Policy::ThreeLimits,
        threads: 1,
        target: Target::None,
        run: cycle,
    },
    Scenario {
        name: "every check a new key",
        policy: Policy::Open,
        threads: 1,
        target: Target::None,
        run: inserts,
    },
    Scenario {
        name: "2 threads, one hot key",
        policy: Policy::Open,
        threads: 2,
        target: Target::ThroughputAtLeast(2.0),
        run: two_hot,
    },
    Scenario {
        name: "2 threads, disjoint 1,000-key sets",
        policy: Policy::Open,
        threads: 2,
        target: Target::None,
        run: two_disjoint,
    },
];

fn prepare(scenario: &Scenario) -> Both {
    let keys = match scenario.name {
        "1 M keys, random order" => workloads::shuffled(MANY_KEYS),
        _ => (0..FEW_KEYS).collect(),
    };
    let both = Both {
        slidegate: Arc::new(Slidegate::new(scenario.policy)),
        governor: Arc::new(Governor::new(scenario.policy)),
        keys,
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

fn main() -> Result<(), ConfigError> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = args
        .windows(2)
        .find(|w| w[0] == "--rounds")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(if quick { 3 } else { 7 });
    let budget = Duration::from_millis(if quick { 20 } else { 150 });

    println!(
        "slidegate {} vs governor 0.10, {rounds} interleaved rounds, medians",
        env!("CARGO_PKG_VERSION")
    );
    println!("(`cargo run --release --example bench_report`; ns per check, per thread when threaded)\n");
    println!("| scenario | slidegate | governor | slidegate / governor | target |");
    println!("|---|---:|---:|---:|---|");
    for scenario in SCENARIOS {
        let both = prepare(scenario);
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
            Target::RatioAtMost(at_most) => {
                format!("≤ {at_most}: {}", if ratio <= at_most { "met" } else { "missed" })
            }
            Target::ThroughputAtLeast(x) => {
                let throughput = 1.0 / ratio;
                format!(
                    "throughput ≥ {x}×: {throughput:.2}× {}",
                    if throughput >= x { "met" } else { "missed" }
                )
            }
            Target::None => String::from("—"),
        };
        let threads =
            if scenario.threads > 1 { format!(" ({} threads)", scenario.threads) } else { String::new() };
        println!("| {}{threads} | {ours:.1} ns | {theirs:.1} ns | {ratio:.2} | {target} |", scenario.name);
    }
    scaling(rounds, budget);
    sweep(quick, rounds)?;
    Ok(())
}

/// Two threads on disjoint keys against slidegate's own single thread on the same keys.
fn scaling(rounds: usize, budget: Duration) {
    let Some(round_robin) = SCENARIOS.iter().find(|s| s.name == "1,000 keys round-robin") else { return };
    let both = prepare(round_robin);
    let iters = iterations(cycle(&both, 10_000, true), budget);
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        one.push(cycle(&both, iters, true));
        two.push(two_disjoint(&both, iters, true));
    }
    let (one, two) = (median(&mut one), median(&mut two));
    let gain = 2.0 * one / two;
    println!(
        "\nTwo threads on disjoint keys, aggregate vs slidegate's one thread on 1,000 keys: {gain:.2}× \
         (target ≥ 1.7×: {})",
        if gain >= 1.7 { "met" } else { "missed" }
    );
}

fn filled(keys: u64) -> Result<(Limiter<u64>, ManualClock), ConfigError> {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).clock(clock.clone()).build()?;
    for k in 0..keys {
        let _ = limiter.check(&k);
    }
    Ok((limiter, clock))
}

/// `sweep()` cost per key, and check latency while another thread sweeps.
fn sweep(quick: bool, rounds: usize) -> Result<(), ConfigError> {
    let keys = if quick { MANY_KEYS / 10 } else { MANY_KEYS };
    let (limiter, clock) = filled(keys)?;
    // Scanning: every round sweeps the same keys, none expired (median of the rounds).
    let mut none: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let kept = limiter.sweep();
            debug_assert_eq!(kept, 0);
            per_check(start.elapsed(), keys)
        })
        .collect();
    let none = median(&mut none);
    clock.advance(Duration::from_secs(10));
    let start = Instant::now();
    let evicted = limiter.sweep();
    let all = per_check(start.elapsed(), keys);
    println!(
        "\n`sweep()` over {keys} keys: none expired {none:.1} ns/key (median of {rounds}), all expired \
         {all:.1} ns/key (evicted {evicted}, one run); target < 5 ns/key scanned: {}",
        if none < 5.0 { "met" } else { "missed" }
    );

    // Latency of single checks on one thread (over 1,000 keys) while another thread sweeps
    // 1 M keys in a loop (none expire: the clock is frozen, so every sweep scans them all);
    // and, as the baseline that separates the sweep's effect from the machine's, while the
    // other thread only spins.
    let (limiter, _clock) = filled(keys)?;
    let limiter = Arc::new(limiter);
    for sweeping in [false, true] {
        let stop = Arc::new(AtomicBool::new(false));
        let other = {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            thread::spawn(move || {
                let mut sweeps = 0u64;
                // Relaxed: a stop flag; nothing else is published with it.
                while !stop.load(Ordering::Relaxed) {
                    if sweeping {
                        limiter.sweep();
                        sweeps += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
                sweeps
            })
        };
        let mut histogram = Histogram::<u64>::new(3).unwrap_or_else(|e| unreachable!("3 digits: {e}"));
        let checks = if quick { 200_000 } else { 2_000_000 };
        for i in 0..checks {
            let key = i % FEW_KEYS;
            let start = Instant::now();
            let _ = std::hint::black_box(limiter.check(&key));
            let _ = histogram.record(start.elapsed().as_nanos() as u64);
        }
        stop.store(true, Ordering::Relaxed);
        let sweeps = other.join().unwrap_or(0);
        let during = if sweeping {
            format!("during {sweeps} concurrent full sweeps")
        } else {
            String::from("with the other thread spinning (baseline)")
        };
        println!(
            "Check latency {during} ({checks} checks): p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns{}",
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.value_at_quantile(0.999),
            histogram.max(),
            if sweeping { "; target: max < 100 µs" } else { "" }
        );
    }
    Ok(())
}
