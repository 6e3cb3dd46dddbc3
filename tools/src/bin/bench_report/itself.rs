//! The figures that compare slidegate with itself: two threads on disjoint keys against one
//! thread, `sweep()` per key, check latency while another thread sweeps, and what
//! `track_refused` adds to a refusal.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use slidegate::{ConfigError, Limit, Limiter, ManualClock};
use slidegate_tools::workloads::{self, Policy, Slidegate, Visits, FEW_KEYS, MANY_KEYS, VISIT_SEED};

use crate::rows::{disjoint_set, disjoint_visits};
use crate::{iterations, median, Tally};

/// How the two sets' nodes are laid out in the heap for [`scaling`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The sets inserted one after the other, each in a random order, into a fresh
    /// limiter. The shards' arrays grow meanwhile, and the memory of the arrays they
    /// replace goes to the nodes allocated after, so the second set's nodes fill gaps
    /// between the first set's: some lines hold nodes of both.
    Runs,
    /// The sets' keys inserted alternately: neighbouring nodes, which share cache lines (a
    /// node here is 48 bytes), may belong to different threads and contend (false sharing;
    /// a heap fragmented by earlier work places nodes much like this).
    Alternate,
    /// As `Runs`, after 8,000 other keys (never checked again) have grown the shards'
    /// arrays to hold all the keys: no array is replaced while the sets go in, so each
    /// set's nodes lie together.
    Grown,
}

/// Keys inserted before the sets in [`Layout::Grown`]: the arrays then hold the sets too.
const GROWN_FIRST: u64 = 8_000;

/// Two threads on disjoint 1,000-key sets against one thread on one set
/// (`per_second(1_000_000_000)`, random visit order), in alternating order, medians of
/// the rounds, with the sets' nodes laid out as `layout` says. Only the `Runs` row has a
/// target.
///
/// A refusal (the policy never refuses) is pushed onto `failures`.
pub fn scaling(
    rounds: usize,
    budget: Duration,
    tally: &mut Tally,
    layout: Layout,
    failures: &mut Vec<String>,
) -> String {
    let limiter = Arc::new(Slidegate::sliding(Policy::HotSecond));
    let [zero, one] = [0, 1].map(|t| workloads::shuffled(disjoint_set(t), FEW_KEYS));
    let order: Vec<u64> = if layout == Layout::Alternate {
        zero.iter().zip(&one).flat_map(|(&a, &b)| [a, b]).collect()
    } else {
        zero.iter().chain(&one).copied().collect()
    };
    if layout == Layout::Grown {
        let first = workloads::shuffled(disjoint_set(2), GROWN_FIRST);
        if workloads::prefill(&*limiter, &first) != GROWN_FIRST {
            failures.push(String::from("scaling: a key inserted to grow the table was refused"));
        }
    }
    let inserted = workloads::prefill(&*limiter, &order);
    let mut visits = Visits::new(VISIT_SEED, disjoint_set(0), FEW_KEYS);
    let iters = iterations(workloads::random(&*limiter, &mut visits, 10_000).ns_per_check(), budget);
    let mut admitted = inserted == 2 * FEW_KEYS;
    let (mut single, mut double, mut gains) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut alone = || workloads::random(&*limiter, &mut visits, iters);
        let both = || workloads::two_threads(&limiter, iters, disjoint_visits);
        let (a, b) = if round % 2 == 0 {
            let a = alone();
            (a, both())
        } else {
            let b = both();
            (alone(), b)
        };
        admitted &= a.all_admitted() && b.all_admitted();
        let (a, b) = (a.ns_per_check(), b.ns_per_check());
        single.push(a);
        double.push(b);
        // Aggregate throughput of two threads (2 checks per `b`) over one thread's.
        gains.push(2.0 * a / b);
    }
    let (a, b, gain) = (median(&mut single), median(&mut double), median(&mut gains));
    let (name, target) = match layout {
        Layout::Runs => (
            "2 threads on disjoint 1,000-key sets, aggregate throughput vs one thread on 1,000 keys",
            format!("≥ 1.5×: {}", tally.verdict(gain >= 1.5)),
        ),
        Layout::Alternate => (
            "the same, keys of the two sets inserted alternately (neighbouring nodes may belong to different threads)",
            String::from("—"),
        ),
        Layout::Grown => (
            "the same, sets inserted one after the other into a table already grown to hold them (each set's nodes together)",
            String::from("—"),
        ),
    };
    if !admitted {
        failures.push(format!("{name}: slidegate refused a check (expected all admitted)"));
    }
    format!("| {name} | {gain:.2}× (one thread {a:.1} ns per check, two {b:.1} ns per check per thread) | {target} |\n")
}

/// `keys` keys under `per_second(10)` on a `ManualClock`, inserted in a random order.
fn filled(keys: u64) -> Result<(Limiter<u64>, ManualClock), ConfigError> {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).clock(clock.clone()).build()?;
    for k in workloads::shuffled(0, keys) {
        let _ = limiter.check(&k);
    }
    Ok((limiter, clock))
}

fn per_key(elapsed: Duration, keys: u64) -> f64 {
    elapsed.as_nanos() as f64 / keys as f64
}

/// `sweep()` cost per key scanned over 1 M keys, and check latency while another thread
/// sweeps them.
pub fn sweep(quick: bool, rounds: usize, tally: &mut Tally) -> Result<(), ConfigError> {
    let keys = MANY_KEYS;
    let (limiter, clock) = filled(keys)?;
    // Scanning: every round sweeps the same keys, none expired (median of the rounds).
    let mut none: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let evicted = limiter.sweep();
            debug_assert_eq!(evicted, 0);
            per_key(start.elapsed(), keys)
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
    let all = per_key(start.elapsed(), keys);
    println!(
        "| `sweep()` over 1 M keys, all expired: per key | {all:.1} ns (evicted {evicted}, one run) | — |"
    );
    drop(limiter);

    // Latency of single checks on one thread (1,000 of the keys, in a random sequence) while
    // another thread sweeps the 1 M keys in a loop (none expire: the clock is frozen, so every
    // sweep scans them all), for at least `min_sweeps` whole sweeps; then, as the baseline
    // that separates the sweep's effect from the machine's, as many checks while the other
    // thread only spins.
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
        let mut visits = Visits::new(VISIT_SEED, 0, FEW_KEYS);
        let begin = Instant::now();
        let mut done = 0u64;
        loop {
            let key = visits.next_key();
            let start = Instant::now();
            let _ = black_box(limiter.check(&key));
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

/// What a refusal costs as its history ages and as its ring grows, on a `ManualClock` (the
/// clock frozen during each measurement). A key admitted once under `per_minute(1)` (sixty
/// 1-second slots), then refused again and again once the admission is 0.5 s old (the
/// current slot), 2.5 s, 30.5 s and 58.5 s old; under `per_hour(1)` at 1 s precision (3,600
/// slots), 1,800.5 s old; and, as the case the walk cannot jump, `per_minute(2)` with its
/// two admissions 28 s apart and an empty run between them (refused 0.5 s after the second,
/// the crossing point is behind 30 empty slots). Each case on its own limiter, the cases
/// rotated round by round, medians. The target is the issue's, a refusal's cost independent
/// of the history's age and of the ring's length: the slowest of the older-slot bursts
/// (60 and 3,600 slots) within 1.5 × the fastest. A check admitted that should be refused
/// is pushed onto `failures`.
pub fn refusal_ages(rounds: usize, budget: Duration, tally: &mut Tally, failures: &mut Vec<String>) {
    let hour = Limit::per_hour(1).precision(Duration::from_secs(1));
    // (name, limit, admissions: ms after the previous event, then the refusals' delay in ms)
    let plan: [(&str, Limit, &[u64], u64); 6] = [
        ("60 slots, 0.5 s old (current slot)", Limit::per_minute(1), &[250], 500),
        ("60 slots, 2.5 s old", Limit::per_minute(1), &[250], 2_500),
        ("60 slots, 30.5 s old", Limit::per_minute(1), &[250], 30_500),
        ("60 slots, 58.5 s old", Limit::per_minute(1), &[250], 58_500),
        ("3,600 slots, 1,800.5 s old", hour, &[250], 1_800_500),
        ("two admissions 28 s apart", Limit::per_minute(2), &[30_250, 28_000], 500),
    ];
    let mut cases = Vec::new();
    for (name, limit, admissions, delay) in plan {
        let clock = ManualClock::new();
        let Ok(limiter) = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build() else {
            return failures.push(format!("refusal ages, {name}: the limit does not build"));
        };
        for &ms in admissions {
            clock.advance(Duration::from_millis(ms));
            let _ = limiter.check(&1);
        }
        clock.advance(Duration::from_millis(delay));
        cases.push((name, limiter, clock));
    }
    let time = |limiter: &Limiter<u64>, iters: u64| {
        let start = Instant::now();
        let mut admitted = 0u64;
        for _ in 0..iters {
            admitted += u64::from(black_box(limiter.check(black_box(&1))).is_allowed());
        }
        (start.elapsed().as_nanos() as f64 / iters as f64, admitted)
    };
    let iters = iterations(time(&cases[1].1, 10_000).0, budget);
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for k in 0..cases.len() {
            let c = (k + round) % cases.len();
            let (figure, admitted) = time(&cases[c].1, iters);
            if admitted > 0 {
                failures.push(format!("refusal ages, {}: {admitted} checks admitted", cases[c].0));
            }
            ns[c].push(figure);
        }
    }
    let medians: Vec<f64> = ns.iter_mut().map(|v| median(v)).collect();
    let older = &medians[1..5];
    let (fastest, slowest) = older.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let figures: Vec<String> =
        cases.iter().zip(&medians).map(|((name, _, _), v)| format!("{name}: {v:.1} ns")).collect();
    println!(
        "| a refusal as its history ages and its ring grows (frozen clock): slowest older-slot burst / fastest | \
         {:.2}× ({}) | ≤ 1.5×: {} |",
        slowest / fastest,
        figures.join("; "),
        tally.verdict(slowest <= 1.5 * fastest)
    );
}

/// The key a workload checks `i`-th, from its visit order.
type KeyOf = fn(&[u64], u64) -> u64;

/// What `LimiterBuilder::track_refused(128)` adds to a refusal (for `top_refused`): the
/// same refusals on a limiter without it and one with it, on a frozen clock, rotated round
/// by round, medians. Three workloads: one hot key refused again and again
/// (`per_minute(1)`, admitted once); 1,000 keys refused in a random order (more keys than
/// the summary holds); and a new key on every check, refused because its cost is over the
/// limit's `max` (the spray a summary must not clone every key of). No target: the guide
/// quotes the difference beside the refusal itself. A check admitted (none should be) is
/// pushed onto `failures`.
pub fn tracked_refusals(rounds: usize, budget: Duration, failures: &mut Vec<String>) {
    let build = |tracked: bool| {
        let builder = Limiter::<u64>::builder().limit(Limit::per_minute(1)).clock(ManualClock::new());
        if tracked { builder.track_refused(128) } else { builder }.build()
    };
    let (Ok(plain), Ok(tracked)) = (build(false), build(true)) else {
        return failures.push("tracked refusals: the limit does not build".to_owned());
    };
    // Keys 1,000 to 1,999 inserted in one random order (each admitted once), visited in
    // another (a permutation of the same keys, unrelated to the insertion order).
    let few = workloads::shuffled(FEW_KEYS, FEW_KEYS);
    for limiter in [&plain, &tracked] {
        let _ = limiter.check(&7);
        for key in &few {
            let _ = limiter.check(key);
        }
    }
    let visits: Vec<u64> = workloads::shuffled(0, FEW_KEYS).iter().map(|&i| few[i as usize]).collect();
    // (name, cost, the key of check i)
    let plan: [(&str, u64, KeyOf); 3] = [
        ("one hot key", 1, |_, _| 7),
        ("1,000 keys, random order", 1, |keys, i| keys[(i % keys.len() as u64) as usize]),
        ("a new key each (cost over max)", 2, |_, i| (1 << 40) + i),
    ];
    let mut spray_next = 0u64;
    let mut time = |limiter: &Limiter<u64>, case: usize, iters: u64| {
        let (_, cost, key) = plan[case];
        let start = Instant::now();
        let mut admitted = 0u64;
        for i in 0..iters {
            let k = key(&visits, i + spray_next);
            admitted += u64::from(black_box(limiter.check_n(black_box(&k), cost)).is_allowed());
        }
        spray_next += iters;
        (start.elapsed().as_nanos() as f64 / iters as f64, admitted)
    };
    let iters = iterations(time(&plain, 0, 10_000).0, budget);
    let mut ns = vec![[Vec::new(), Vec::new()]; plan.len()];
    for round in 0..rounds {
        for case in 0..plan.len() {
            let sides = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in sides {
                let limiter = if side == 0 { &plain } else { &tracked };
                let (figure, admitted) = time(limiter, case, iters);
                if admitted > 0 {
                    failures.push(format!("tracked refusals, {}: {admitted} checks admitted", plan[case].0));
                }
                ns[case][side].push(figure);
            }
        }
    }
    let figures: Vec<String> = plan
        .iter()
        .zip(ns.iter_mut())
        .map(|((name, _, _), [plain, tracked])| {
            let (p, t) = (median(plain), median(tracked));
            format!("{name}: {p:.1} → {t:.1} ns (+{:.1})", t - p)
        })
        .collect();
    println!("| a refusal without / with `track_refused(128)` (frozen clock) | {} | — |", figures.join("; "));
}
