//! The accuracy lab: `cargo run --release -p slidegate-tools --bin accuracy [-- --quick] [--csv PATH] [--svg PATH]`.
//!
//! Replays the same seeded traffic patterns through every algorithm on a [`ManualClock`]
//! and prints one markdown table: for each algorithm and pattern, the most units admitted
//! in any interval of one window (as a multiple of `max`), the share of decisions that
//! differ from the exact sliding log's on the same history (false allows, false denies),
//! the throughput granted against the limit, bytes of state per key, and ns per check on a
//! hot key. `--csv` and `--svg` write the same results as CSV and as a bar chart of the
//! over-admission. `--quick` replays fewer windows and is what CI runs: the lab then exits
//! non-zero if any algorithm breaks its documented bound (strict and log at most 1.0 ×
//! `max` in any window, the log never wrong, the others below or at 2.0 ×).
//!
//! Everything but the timing column is deterministic: the same build prints the same
//! numbers on any machine.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use slidegate::{Algorithm, ConfigError, Limit, Limiter, ManualClock};
use slidegate_tools::rng::Rng;

/// The limit every pattern is replayed against: 100 units per minute.
const MAX: u64 = 100;
const WINDOW: u64 = 60 * S;
const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// One contender: a name, the algorithm and the limit as it configures it.
struct Contender {
    name: &'static str,
    algorithm: Algorithm,
    limit: Limit,
    /// The bound the lab asserts in `--quick` mode, as a multiple of `max`.
    bound: f64,
    /// `true` if no decision may differ from the exact log's.
    exact: bool,
}

impl Contender {
    fn limiter(&self, clock: &ManualClock) -> Result<Limiter<u64>, ConfigError> {
        Limiter::builder().algorithm(self.algorithm).limit(self.limit).clock(clock.clone()).build()
    }
}

fn contenders() -> Vec<Contender> {
    let minute = Limit::per_minute(MAX);
    vec![
        Contender {
            name: "sliding window, 1 s slots",
            algorithm: Algorithm::SlidingWindow,
            limit: minute,
            bound: 2.0,
            exact: false,
        },
        Contender {
            name: "sliding window, one 60 s slot (two buckets)",
            algorithm: Algorithm::SlidingWindow,
            limit: minute.precision(Duration::from_secs(60)),
            bound: 2.0,
            exact: false,
        },
        Contender {
            name: "sliding window strict, 1 s slots",
            algorithm: Algorithm::SlidingWindow,
            limit: minute.strict(),
            bound: 1.0,
            exact: false,
        },
        Contender {
            name: "fixed window",
            algorithm: Algorithm::FixedWindow,
            limit: minute,
            bound: 2.0,
            exact: false,
        },
        Contender {
            name: "sliding log",
            algorithm: Algorithm::SlidingLog,
            limit: minute,
            bound: 1.0,
            exact: true,
        },
        Contender { name: "GCRA", algorithm: Algorithm::Gcra, limit: minute, bound: 2.0, exact: false },
    ]
}

/// Exponential with the given mean (ns).
fn exponential(rng: &mut Rng, mean: f64) -> u64 {
    (-rng.unit().ln() * mean) as u64
}

/// A traffic pattern: requests `(time, key)` in time order, or clients that react to
/// decisions (the stampede).
enum Traffic {
    Fixed(Vec<(u64, u64)>),
    /// `keys` keys with `clients` clients each: every client sends, waits `think` after an
    /// admission, and after a refusal retries exactly when `retry_after` says.
    Stampede {
        keys: u64,
        clients: u64,
        think: u64,
    },
}

struct Pattern {
    name: &'static str,
    traffic: Traffic,
}

fn uniform(rate: f64, duration: u64) -> Vec<(u64, u64)> {
    let gap = (WINDOW as f64 / (rate * MAX as f64)) as u64;
    (0..).map(|i| 370 * MS + i * gap).take_while(|&t| t < duration).map(|t| (t, 0)).collect()
}

fn poisson(rate: f64, duration: u64, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = Rng(seed);
    let mean = WINDOW as f64 / (rate * MAX as f64);
    let mut t = 0;
    let mut out = Vec::new();
    loop {
        t += exponential(&mut rng, mean).max(1);
        if t >= duration {
            return out;
        }
        out.push((t, 0));
    }
}

fn patterns(windows: u64) -> Vec<Pattern> {
    let duration = windows * WINDOW;
    // `max` in the last half second before every other window boundary, `max` in the
    // half second after it.
    let mut boundary = Vec::new();
    for j in 0..windows / 2 {
        let edge = (2 * j + 1) * WINDOW;
        for i in 0..MAX {
            boundary.push((edge - 500 * MS + i * 5 * MS, 0));
        }
        for i in 0..MAX {
            boundary.push((edge + i * 5 * MS, 0));
        }
    }
    // On for 10 s at 6 × the rate (one window's worth), off for 50 s; each burst straddles
    // a window boundary.
    let mut on_off = Vec::new();
    for k in 0..windows - 1 {
        let start = k * WINDOW + 55 * S;
        for i in 0..MAX {
            on_off.push((start + i * 100 * MS, 0));
        }
    }
    vec![
        Pattern { name: "uniform 0.5×", traffic: Traffic::Fixed(uniform(0.5, duration)) },
        Pattern { name: "uniform 1×", traffic: Traffic::Fixed(uniform(1.0, duration)) },
        Pattern { name: "uniform 2×", traffic: Traffic::Fixed(uniform(2.0, duration)) },
        Pattern { name: "Poisson 1×", traffic: Traffic::Fixed(poisson(1.0, duration, 1)) },
        Pattern { name: "Poisson 2×", traffic: Traffic::Fixed(poisson(2.0, duration, 2)) },
        Pattern { name: "boundary burst", traffic: Traffic::Fixed(boundary) },
        Pattern {
            name: "stampeding elephants",
            traffic: Traffic::Stampede { keys: 20, clients: MAX, think: WINDOW / 2 },
        },
        Pattern { name: "bursty on/off", traffic: Traffic::Fixed(on_off) },
    ]
}

/// What one algorithm did on one pattern.
#[derive(Default, Clone)]
struct Outcome {
    requests: u64,
    admitted: u64,
    false_allows: u64,
    false_denies: u64,
    /// Most units admitted in any `[t, t + window)`, over all keys.
    densest: u64,
    /// Units granted per window per key, as a multiple of `max`.
    granted: f64,
}

/// Replays `pattern` through `contender` for `duration` ns.
fn replay(contender: &Contender, pattern: &Pattern, duration: u64) -> Result<Outcome, ConfigError> {
    let clock = ManualClock::new();
    let limiter = contender.limiter(&clock)?;
    let keys = match pattern.traffic {
        Traffic::Fixed(_) => 1,
        Traffic::Stampede { keys, .. } => keys,
    };
    // Per key: the admitted times inside the last window (for the exact decision) and all
    // of them (for the densest window).
    let mut recent: Vec<VecDeque<u64>> = vec![VecDeque::new(); keys as usize];
    let mut admitted: Vec<Vec<u64>> = vec![Vec::new(); keys as usize];
    let mut out = Outcome::default();
    let mut decide = |t: u64, key: u64, out: &mut Outcome| {
        clock.set(Duration::from_nanos(t));
        let decision = limiter.check(&key);
        let k = key as usize;
        while recent[k].front().is_some_and(|&at| at + WINDOW <= t) {
            recent[k].pop_front();
        }
        let exact = (recent[k].len() as u64) < MAX;
        out.requests += 1;
        match (decision.is_allowed(), exact) {
            (true, false) => out.false_allows += 1,
            (false, true) => out.false_denies += 1,
            _ => {}
        }
        if decision.is_allowed() {
            out.admitted += 1;
            recent[k].push_back(t);
            admitted[k].push(t);
        }
        decision
    };
    match &pattern.traffic {
        Traffic::Fixed(requests) => {
            for &(t, key) in requests {
                let _ = decide(t, key, &mut out);
            }
        }
        &Traffic::Stampede { keys, clients, think } => {
            let mut queue = BinaryHeap::new();
            for key in 0..keys {
                for client in 0..clients {
                    queue.push(Reverse((client * MS, key, client)));
                }
            }
            while let Some(Reverse((t, key, client))) = queue.pop() {
                if t >= duration {
                    break;
                }
                let decision = decide(t, key, &mut out);
                let next = match decision.retry_after() {
                    None => t + think,
                    Some(wait) => t + u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX).max(1),
                };
                queue.push(Reverse((next, key, client)));
            }
        }
    }
    for times in &admitted {
        let mut start = 0;
        for (end, &t) in times.iter().enumerate() {
            while times[start] + WINDOW <= t {
                start += 1;
            }
            out.densest = out.densest.max((end - start + 1) as u64);
        }
    }
    out.granted = out.admitted as f64 / (keys * MAX) as f64 / (duration as f64 / WINDOW as f64);
    Ok(out)
}

/// Bytes of state per key: the limiter's words, plus for the log its snapshot when the
/// window is full (a length word and one timestamp per unit).
fn bytes_per_key(contender: &Contender) -> Result<usize, ConfigError> {
    let limiter = contender.limiter(&ManualClock::new())?;
    let log = if contender.algorithm == Algorithm::SlidingLog { 8 * (1 + MAX as usize) } else { 0 };
    Ok(limiter.state_bytes_per_key() + log)
}

/// ns per check on one hot key offered exactly the limit (every check admitted, the clock
/// moving one period per check): the admitting path of each algorithm, log copy included.
fn ns_per_check(contender: &Contender, checks: u64) -> Result<f64, ConfigError> {
    let clock = ManualClock::new();
    let limiter = contender.limiter(&clock)?;
    let period = Duration::from_nanos(WINDOW / MAX);
    let start = Instant::now();
    for _ in 0..checks {
        clock.advance(period);
        let _ = black_box(limiter.check(black_box(&7)));
    }
    Ok(start.elapsed().as_nanos() as f64 / checks as f64)
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

fn svg(contenders: &[Contender], patterns: &[Pattern], results: &[Vec<Outcome>]) -> String {
    const COLORS: [&str; 6] = ["#4e79a7", "#a0cbe8", "#59a14f", "#e15759", "#f28e2b", "#b07aa1"];
    let (width, height, left, top, bottom) = (980.0, 420.0, 50.0, 30.0, 90.0);
    let plot_h = height - top - bottom;
    let group = (width - left - 10.0) / patterns.len() as f64;
    let bar = group * 0.8 / contenders.len() as f64;
    let y = |v: f64| top + plot_h * (1.0 - v / 2.2);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="18" font-size="13">Most units admitted in any one-minute interval, × max (limit 100/min)</text>"#
    );
    for tick in [0.0, 0.5, 1.0, 1.5, 2.0] {
        let _ = writeln!(
            s,
            r#"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="{}" stroke-width="{}"/><text x="{}" y="{}" text-anchor="end">{tick:.1}</text>"#,
            width - 10.0,
            if tick == 1.0 { "#333" } else { "#ddd" },
            if tick == 1.0 { 1.5 } else { 1.0 },
            left - 4.0,
            y(tick) + 4.0,
            y = y(tick)
        );
    }
    for (p, pattern) in patterns.iter().enumerate() {
        let x0 = left + p as f64 * group + group * 0.1;
        for (c, outcomes) in results.iter().enumerate() {
            let v = outcomes[p].densest as f64 / MAX as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {v:.2}×</title></rect>"#,
                x0 + c as f64 * bar,
                y(v),
                bar - 1.0,
                top + plot_h - y(v),
                COLORS[c % COLORS.len()],
                contenders[c].name
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x0 + group * 0.4,
            top + plot_h + 14.0,
            pattern.name
        );
    }
    for (c, contender) in contenders.iter().enumerate() {
        let (x, y) = (left + (c % 3) as f64 * 300.0, height - 50.0 + (c / 3) as f64 * 18.0);
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{y}">{}</text>"#,
            y - 10.0,
            COLORS[c % COLORS.len()],
            x + 16.0,
            contender.name
        );
    }
    s.push_str("</svg>\n");
    s
}

/// the accuracy lab: every algorithm on the same seeded traffic, against its documented bound.
#[derive(argh::FromArgs)]
struct Args {
    /// fewer windows per pattern (CI)
    #[argh(switch)]
    quick: bool,
    /// also write the results as CSV to this path
    #[argh(option)]
    csv: Option<String>,
    /// also write the over-admission as an SVG bar chart to this path
    #[argh(option)]
    svg: Option<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { quick, csv: csv_path, svg: svg_path } = argh::from_env();
    let windows = if quick { 6 } else { 60 };
    let duration = windows * WINDOW;
    let contenders = contenders();
    let patterns = patterns(windows);
    let results = contenders
        .iter()
        .map(|c| patterns.iter().map(|p| replay(c, p, duration)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()?;

    println!(
        "slidegate accuracy lab: limit {MAX}/min, {windows} windows per pattern, seeded \
         (`cargo run --release -p slidegate-tools --bin accuracy`)\n"
    );
    println!("Most units admitted in any one-minute interval, as a multiple of max (over-admission):\n");
    let mut header = String::from("| algorithm |");
    let mut rule = String::from("|---|");
    for p in &patterns {
        let _ = write!(header, " {} |", p.name);
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
    for (c, outcomes) in contenders.iter().zip(&results) {
        let cells: String =
            outcomes.iter().map(|o| format!(" {:.2} |", o.densest as f64 / MAX as f64)).collect();
        println!("| {} |{cells}", c.name);
    }
    println!("\nDecisions that differ from the exact sliding log's on the same history (false allows / false denies, % of requests):\n");
    println!("{header}\n{rule}");
    for (c, outcomes) in contenders.iter().zip(&results) {
        let cells: String = outcomes
            .iter()
            .map(|o| {
                format!(" {:.2} / {:.2} |", pct(o.false_allows, o.requests), pct(o.false_denies, o.requests))
            })
            .collect();
        println!("| {} |{cells}", c.name);
    }
    println!("\nThroughput granted, units per window per key as a multiple of max (offered: the pattern's name; the stampede offers 2×, the bursts 1×):\n");
    println!("{header}\n{rule}");
    for (c, outcomes) in contenders.iter().zip(&results) {
        let cells: String = outcomes.iter().map(|o| format!(" {:.3} |", o.granted)).collect();
        println!("| {} |{cells}", c.name);
    }
    let checks = if quick { 20_000 } else { 200_000 };
    println!("\nCost per key, and ns per check on one hot key offered exactly the limit (every check admitted; this column alone depends on the machine):\n");
    println!("| algorithm | state bytes per key | ns per check |\n|---|---:|---:|");
    for c in &contenders {
        // One warm-up run, then the median of 5.
        ns_per_check(c, checks / 10)?;
        let mut runs = (0..5).map(|_| ns_per_check(c, checks)).collect::<Result<Vec<f64>, _>>()?;
        runs.sort_by(f64::total_cmp);
        let log = if c.algorithm == Algorithm::SlidingLog { " (full window)" } else { "" };
        println!("| {} | {} B{log} | {:.1} |", c.name, bytes_per_key(c)?, runs[2]);
    }

    if let Some(path) = csv_path {
        let mut csv = String::from(
            "algorithm,pattern,requests,admitted,densest_window_x_max,false_allows,false_denies,granted_x_max\n",
        );
        for (c, outcomes) in contenders.iter().zip(&results) {
            for (p, o) in patterns.iter().zip(outcomes) {
                let _ = writeln!(
                    csv,
                    "{},{},{},{},{:.4},{},{},{:.4}",
                    c.name,
                    p.name,
                    o.requests,
                    o.admitted,
                    o.densest as f64 / MAX as f64,
                    o.false_allows,
                    o.false_denies,
                    o.granted
                );
            }
        }
        std::fs::write(&path, csv).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("\nCSV written to {path}");
    }
    if let Some(path) = svg_path {
        std::fs::write(&path, svg(&contenders, &patterns, &results))
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("SVG written to {path}");
    }

    // The documented bounds (checked in every mode; CI runs --quick).
    let mut broken = Vec::new();
    for (c, outcomes) in contenders.iter().zip(&results) {
        for (p, o) in patterns.iter().zip(outcomes) {
            let times = o.densest as f64 / MAX as f64;
            if times > c.bound {
                broken.push(format!("{} on {}: {times:.2} × max, bound {:.1}", c.name, p.name, c.bound));
            }
            if c.exact && o.false_allows + o.false_denies > 0 {
                broken.push(format!("{} on {}: a decision differs from the exact log's", c.name, p.name));
            }
            if o.admitted == 0 {
                broken.push(format!("{} on {}: nothing admitted", c.name, p.name));
            }
        }
    }
    if !broken.is_empty() {
        eprintln!("\nBOUNDS BROKEN:\n{}", broken.join("\n"));
        std::process::exit(1);
    }
    println!("\nEvery algorithm within its documented bound on every pattern.");
    Ok(())
}
