//! slidegate against governor, measured against the targets the core is built against, as
//! markdown tables: `cargo run --release -p slidegate-tools --bin bench_report [-- --quick]
//! [-- --rounds N]`.
//!
//! Runs the workloads of `slidegate_tools::workloads` (the criterion bench times the same
//! loops; that module lists the rules every comparison follows) in interleaved rounds:
//! each round runs every row on both limiters, slidegate first in even rounds and governor
//! first in odd ones, and the table gives the median of the rounds' figures and of their
//! ratios, each ratio beside its target (met or missed). governor 0.10 runs in its fastest
//! keyed configuration (DashMap with ahash, `QuantaUpkeepClock`). Under the table, each
//! row's workload (keys, order, clock, policy). Then the figures that compare slidegate
//! with itself: two threads on disjoint keys against one thread, `sweep()` per key scanned,
//! check latency on one thread while another sweeps continuously, and what
//! `track_refused` adds to a refusal.
//!
//! - `--rounds N`: rounds (default 7, 3 with `--quick`).
//! - `--quick`: fewer, shorter rounds, for CI (well under a minute; the default run takes
//!   about four and a half minutes).
//!
//! The last line counts the targets met and missed. A missed target never makes the exit
//! status non-zero: timings on a shared machine are noisy, so this is a report, not a test.
//! A decision that differs from what a row's workload expects (an admission in a refusal
//! row, a refusal in an admission row), on either side, makes it exit with status 1 after
//! the tables, naming the row; so does a panic.

mod itself;
mod rows;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rows::{ours, Bench, Expect, Phase, Side};
use slidegate_tools::workloads::{Pass, Slidegate};

/// How a row's figure relates to its target, for the table's last column.
#[derive(Clone, Copy)]
enum Target {
    /// slidegate / governor time per check at most this.
    RatioAtMost(f64),
    /// Aggregate throughput at least this many times governor's (time ratio at most 1/x).
    ThroughputAtLeast(f64),
    /// No target: a figure for context.
    None,
}

struct Row {
    /// The first cell (`figures` picks the README's headline rows by it).
    name: &'static str,
    /// Keys, visit order, clock and policy, printed under the table.
    workload: &'static str,
    target: Target,
    expect: Expect,
    phase: Phase,
    /// One timed pass of `iters` checks (per thread) on one side.
    run: fn(&mut Bench, Side, u64) -> Pass,
    /// slidegate's limiter of the row, or one with the same policy, for its state per key.
    ours: fn(&Bench) -> &Slidegate,
}

/// The rows, in the table's order (they run in the order of their [`Phase`]).
const ROWS: &[Row] = &[
    Row {
        name: "one hot key, admitted",
        workload: "key 7, every check; `per_minute(4_000_000_000)` (never refuses in a run); real clock",
        target: Target::RatioAtMost(1.0),
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::hot,
        ours: ours::hot,
    },
    Row {
        name: "one hot key, refused, history in older slots",
        workload: "one `per_minute(1)` key admitted at the start of the round; its refusals timed once \
                   the admission is 2.5 s old (two or three 1-second slots back); a new key each round; \
                   real clock",
        target: Target::RatioAtMost(1.5),
        expect: Expect::Refused,
        phase: Phase::History,
        run: rows::older,
        ours: ours::refusals,
    },
    Row {
        name: "one hot key, refused, history in the current slot",
        workload: "`per_minute(1)`: a new key admitted (untimed), then 65,536 timed refusals of it, \
                   and again with the next key; real clock",
        target: Target::RatioAtMost(1.5),
        expect: Expect::Refused,
        phase: Phase::Short,
        run: rows::current,
        ours: ours::refusals,
    },
    Row {
        name: "1,000 keys, random order",
        workload: "1,000 keys inserted in a random order, visited in an independent random sequence; \
                   `per_second(1_000_000_000)` (never refuses); real clock",
        target: Target::RatioAtMost(1.0),
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::few,
        ours: ours::few,
    },
    Row {
        name: "1 M keys random, one slot (per_second)",
        workload: "1,000,000 keys inserted in a random order, visited in an independent random \
                   sequence, passes of about 1.5 s (0.25 s with `--quick`); `per_second(1_000)` (one slot; never refuses); \
                   real clock",
        target: Target::RatioAtMost(1.2),
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::per_second,
        ours: ours::per_second,
    },
    Row {
        name: "1 M keys random, one slot, one check at a time",
        workload: ONE_AT_A_TIME,
        target: Target::None,
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::one_at_a_time,
        ours: ours::per_second,
    },
    Row {
        name: "1 M keys random, 60 slots (per_minute)",
        workload: "as above with `per_minute(60_000)` (sixty 1-second slots; never refuses); real clock",
        target: Target::RatioAtMost(2.0),
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::per_minute,
        ours: ours::per_minute,
    },
    Row {
        name: "1 M keys random, 60 slots, frozen clock",
        workload: "the row above on clocks that never move: slidegate's `ManualClock`, governor's \
                   `FakeRelativeClock`; no slot ever turns",
        target: Target::None,
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::frozen,
        ours: ours::per_minute,
    },
    Row {
        name: "1 M keys random, 60 slots, a minute of traffic in",
        workload: "the `per_minute` row on clocks the benchmark moves (slidegate's `ManualClock`, \
                   governor's `FakeRelativeClock`): 63 s of traffic first (every key checked every \
                   3 s), then each pass 3 s after the last, so each check turns its key's slot and \
                   units leave its window (the steady state of a key checked every few seconds)",
        target: Target::None,
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::steady,
        ours: ours::per_minute,
    },
    Row {
        name: "GCRA, one hot key",
        workload: "slidegate with `Algorithm::Gcra` against governor (GCRA); key 7, every check; \
                   `per_minute(4_000_000_000)`; real clock",
        target: Target::RatioAtMost(1.0),
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::gcra_hot,
        ours: ours::gcra,
    },
    Row {
        name: "GCRA, 1 M keys random",
        workload: "slidegate with `Algorithm::Gcra` against governor; 1,000,000 keys as in the \
                   `per_minute` row, `per_minute(60_000)`; real clock",
        target: Target::RatioAtMost(1.0),
        expect: Expect::Admitted,
        phase: Phase::Long,
        run: rows::gcra_many,
        ours: ours::gcra,
    },
    Row {
        name: "every check a new key",
        workload: "keys 0, 1, 2, ... each checked once, on a limiter built (untimed) for the pass; \
                   `per_second(1_000)`; real clock",
        target: Target::RatioAtMost(2.0),
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::new_keys,
        ours: ours::per_second,
    },
    Row {
        name: "2 threads, one hot key",
        workload: "two threads check key 7; `per_minute(4_000_000_000)`; real clock; ns per check \
                   per thread (wall time over each thread's checks)",
        target: Target::ThroughputAtLeast(1.0),
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::two_hot,
        ours: ours::hot,
    },
    Row {
        name: "2 threads, disjoint 1,000-key sets",
        workload: "thread t visits keys t·1,000..(t + 1)·1,000 in a random sequence (each set inserted \
                   in a random order, set by set); `per_second(1_000_000_000)`; real clock",
        target: Target::None,
        expect: Expect::Admitted,
        phase: Phase::Short,
        run: rows::two_disjoint,
        ours: ours::few,
    },
    Row {
        name: "1 M keys random, 10/s + 120/min + 240/h",
        workload: "1,000,000 keys as in the one-slot row; `per_second(10)`, `per_minute(120)`, \
                   `per_hour(240)` (default precisions: 1 s, 1 s, 1 min); governor: three limiters \
                   checked in order, stopping at the first refusal; real clock; decisions mixed",
        target: Target::None,
        expect: Expect::Either,
        phase: Phase::Long,
        run: rows::three,
        ours: ours::three,
    },
];

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

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Checks per pass: enough for about `budget` of work at `ns` per check.
fn iterations(ns: f64, budget: Duration) -> u64 {
    ((budget.as_nanos() as f64 / ns.max(1.0)) as u64).clamp(1_000, 200_000_000)
}

/// slidegate beside governor on the core's target workloads, as markdown tables.
#[derive(argh::FromArgs)]
struct Args {
    /// fewer, shorter rounds (CI)
    #[argh(switch)]
    quick: bool,
    /// rounds (default 7, 3 with --quick; at least 1)
    #[argh(option)]
    rounds: Option<usize>,
}

/// Checks a pass against its row's expectation; a failure is kept for the end.
fn hold(row: &Row, side: Side, pass: &Pass, failures: &mut Vec<String>) {
    if !row.expect.holds(pass) {
        failures.push(format!(
            "{}: {} admitted {} of {} checks (expected {:?})",
            row.name,
            side.name(),
            pass.admitted,
            pass.checks * pass.threads,
            row.expect
        ));
    }
}

/// Every row's passes so far, and the checks per pass of its next round.
struct Runs {
    iters: Vec<[u64; 2]>,
    /// ns per check of each round, per row and side.
    times: Vec<[Vec<f64>; 2]>,
    /// slidegate / governor of each round, per row.
    ratios: Vec<Vec<f64>>,
    /// Checks admitted and done, per row and side, over the rounds.
    counts: Vec<[(u64, u64); 2]>,
    /// The 1 M-key passes' lengths, in seconds.
    long_passes: Vec<f64>,
    /// How long each row took last time, both sides and their set-up together.
    walls: Vec<Option<Duration>>,
    failures: Vec<String>,
}

impl Runs {
    fn new(iters: Vec<[u64; 2]>) -> Runs {
        let rows = iters.len();
        Runs {
            iters,
            times: vec![[Vec::new(), Vec::new()]; rows],
            ratios: vec![Vec::new(); rows],
            counts: vec![[(0, 0); 2]; rows],
            long_passes: Vec::new(),
            walls: vec![None; rows],
            failures: Vec::new(),
        }
    }

    /// One pass of row `i` on each side, in the order `sides`.
    fn row(&mut self, bench: &mut Bench, i: usize, sides: [Side; 2], budget: impl Fn(Phase) -> Duration) {
        let row = &ROWS[i];
        let began = Instant::now();
        let mut pair = [0.0; 2];
        for side in sides {
            let s = side.index();
            let pass = (row.run)(bench, side, self.iters[i][s]);
            hold(row, side, &pass, &mut self.failures);
            let count = &mut self.counts[i][s];
            *count = (count.0 + pass.admitted, count.1 + pass.checks * pass.threads);
            if row.phase == Phase::Long {
                self.long_passes.push(pass.elapsed.as_secs_f64());
            }
            pair[s] = pass.ns_per_check();
            self.times[i][s].push(pass.ns_per_check());
            // The next round's pass from this one's speed: passes keep to their budget as
            // the caches and the machine settle.
            self.iters[i][s] = iterations(pass.ns_per_check(), budget(row.phase));
        }
        self.ratios[i].push(pair[0] / pair[1]);
        self.walls[i] = Some(began.elapsed());
    }
}

/// The one-check-at-a-time row's workload, as this processor runs it
/// (`workloads::random_one_at_a_time`).
#[cfg(target_arch = "x86_64")]
const ONE_AT_A_TIME: &str = "the row above (the same limiters and visit sequence) with each check \
     finished before the next starts (an `lfence` after each): the latency of a check, where the \
     row above, checks back to back, lets a processor overlap one check's cache misses with the \
     next ones'";
#[cfg(not(target_arch = "x86_64"))]
const ONE_AT_A_TIME: &str = "the row above (the same limiters and visit sequence) with a SeqCst \
     fence after each check (not x86_64: a full memory barrier, which may not stop checks \
     overlapping; neither the latency nor the rate of the row above)";

fn main() -> ExitCode {
    let Args { quick, rounds } = argh::from_env();
    let rounds = rounds.filter(|&n| n > 0).unwrap_or(if quick { 3 } else { 7 });
    // The command line as given, for the report's title.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = if args.is_empty() {
        String::from("cargo run --release -p slidegate-tools --bin bench_report")
    } else {
        format!("cargo run --release -p slidegate-tools --bin bench_report -- {}", args.join(" "))
    };
    let short = Duration::from_millis(if quick { 20 } else { 150 });
    let long = Duration::from_millis(if quick { 250 } else { 1500 });
    let budget = |phase| if phase == Phase::Long { long } else { short };
    let mut tally = Tally::default();
    let mut failures = Vec::new();

    println!("## `{command}`\n");
    println!(
        "slidegate vs governor 0.10 (DashMap + ahash, QuantaUpkeepClock) beside the core's targets; \
         {rounds} interleaved rounds, medians; ns per check, per thread when threaded.\n"
    );
    // First, on a fresh heap (see `itself::scaling`); printed after the table.
    let scaling = [itself::Layout::Runs, itself::Layout::Alternate, itself::Layout::Grown]
        .map(|layout| itself::scaling(rounds, short, &mut tally, layout, &mut failures));
    let mut bench = match Bench::new() {
        Ok(bench) => bench,
        Err(e) => {
            eprintln!("bench_report: filling the limiters: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut order: Vec<usize> = (0..ROWS.len()).collect();
    order.sort_by_key(|&i| ROWS[i].phase);

    // Calibration: a short pass of each side sets its checks per pass in the first round
    // (100,000 checks at 1 M keys, where the first visits are slower). The older-slot row
    // waits for its keys to age here too: a refusal against history in the current slot is
    // many times faster, and would make the first round's passes too long.
    bench.start_round();
    let mut iters = vec![[0u64; 2]; ROWS.len()];
    for &i in &order {
        let row = &ROWS[i];
        for side in [Side::Slidegate, Side::Governor] {
            let warm = if row.phase == Phase::Long { 100_000 } else { 10_000 };
            let pass = (row.run)(&mut bench, side, warm);
            hold(row, side, &pass, &mut failures);
            iters[i][side.index()] = iterations(pass.ns_per_check(), budget(row.phase));
        }
    }
    bench.ages.clear();

    let mut runs = Runs::new(iters);
    let history = order.iter().copied().find(|&i| ROWS[i].phase == Phase::History);
    for round in 0..rounds {
        bench.start_round();
        let sides = if round % 2 == 0 {
            [Side::Slidegate, Side::Governor]
        } else {
            [Side::Governor, Side::Slidegate]
        };
        // The older-slot refusals run (waiting until their keys are 2.5 s old) before the
        // first row that would take their keys past that: by the previous round's length of
        // that row, with a margin; in the first round, before any row.
        let mut waiting = history;
        for &i in order.iter().filter(|&&i| Some(i) != history) {
            let late = match runs.walls[i] {
                _ if ROWS[i].phase == Phase::Long => true,
                Some(wall) => bench.history_due_within(wall.mul_f64(1.25)),
                None => true,
            };
            if late {
                if let Some(h) = waiting.take() {
                    runs.row(&mut bench, h, sides, budget);
                }
            }
            runs.row(&mut bench, i, sides, budget);
        }
        if let Some(h) = waiting {
            runs.row(&mut bench, h, sides, budget);
        }
    }
    let Runs { mut times, mut ratios, counts, long_passes, failures: mut failed, .. } = runs;
    failures.append(&mut failed);

    println!("| scenario | slidegate | governor | slidegate / governor | target |");
    println!("|---|---:|---:|---:|---|");
    for (i, row) in ROWS.iter().enumerate() {
        let [ours, theirs] = &mut times[i];
        let (ours, theirs, ratio) = (median(ours), median(theirs), median(&mut ratios[i]));
        let target = match row.target {
            Target::RatioAtMost(at_most) => format!("≤ {at_most:?}: {}", tally.verdict(ratio <= at_most)),
            Target::ThroughputAtLeast(x) => {
                let throughput = 1.0 / ratio;
                format!("throughput ≥ {x:?}×: {throughput:.2}× {}", tally.verdict(throughput >= x))
            }
            Target::None => String::from("—"),
        };
        println!("| {} | {ours:.1} ns | {theirs:.1} ns | {ratio:.2} | {target} |", row.name);
    }
    println!(
        "\nEach row's workload (keys are `u64`; in brackets, slidegate's state per key, \
         `Limiter::state_bytes_per_key`; memory per key for both libraries is the `memory` report's):\n"
    );
    for row in ROWS {
        println!("- {}: {} [{} B]", row.name, row.workload, (row.ours)(&bench).0.state_bytes_per_key());
    }
    let (mut ages, mut long_passes) =
        (bench.ages.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(), long_passes);
    ages.sort_by(f64::total_cmp);
    long_passes.sort_by(f64::total_cmp);
    let span = |v: &[f64]| match (v.first(), v.last()) {
        (Some(a), Some(b)) => format!("{a:.2} s to {b:.2} s"),
        _ => String::from("none"),
    };
    println!(
        "\nMeasured in this run: the older-slot refusals' admission was {} old when a pass began; the \
         1 M-key passes lasted {} (the keys' last checks are in earlier slots: a visit cursor goes on \
         from pass to pass, and other rows run for seconds between a row's passes).",
        span(&ages),
        span(&long_passes)
    );
    for (row, [ours, theirs]) in ROWS.iter().zip(&counts).filter(|(row, _)| row.expect == Expect::Either) {
        let share = |(admitted, checks): (u64, u64)| 100.0 * admitted as f64 / checks.max(1) as f64;
        println!(
            "In \"{}\", slidegate admitted {:.1} % of its checks, governor {:.1} %.",
            row.name,
            share(*ours),
            share(*theirs)
        );
    }

    println!("\n| slidegate against itself | figure | target |");
    println!("|---|---|---|");
    print!("{}", scaling.concat());
    itself::refusal_ages(rounds, short, &mut tally, &mut failures);
    itself::tracked_refusals(rounds, short, &mut failures);
    if let Err(e) = itself::sweep(quick, rounds, &mut tally) {
        failures.push(format!("sweep: {e}"));
    }

    println!(
        "\n{} targets met, {} missed (of {}; timings are noisy on a shared machine: a miss does not \
         fail the run)",
        tally.met,
        tally.missed,
        tally.met + tally.missed
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("bench_report: decisions that differ from the workloads':\n  {}", failures.join("\n  "));
        ExitCode::FAILURE
    }
}
