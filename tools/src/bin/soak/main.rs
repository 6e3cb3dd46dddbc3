//! The contention soak: `cargo run --release -p slidegate-tools --bin soak [-- --seconds 60] [--threads 4]
//! [--quick] [--seed N] [--round-ms 500] [--verbose] [--corrupt N]`.
//!
//! `--threads` worker threads operate, as fast as they can, on seven limiters, one per kind
//! of limit (`workload.rs`): the sliding window interpolated and strict, two strict limits
//! at once, the fixed window, the sliding log, GCRA, and GCRA with two limits. Each
//! limiter has 200 keys in its default policy (drawn from a skewed distribution: key 0
//! takes about a quarter of the traffic, the coldest a few in ten thousand) and 8 in a
//! shadow policy of the same limits. The operations, with costs 1 to 3: `check_n` (one in
//! 30 on a shadow key), `check_all` on two or three keys (one time in three with a shadow
//! key among them; 12 %), and `reset` (3 in 100,000). Racing them:
//!
//! - a sweeper thread calls `sweep()` on every limiter in a loop;
//! - a driver thread moves the shared `ManualClock` forward in random steps of up to 4 ms,
//!   one in 20 of 10–60 ms (longer than GCRA's intervals) and one in 500 a jump of 1–3 s
//!   (after which every key has expired and the sweeper races the checks that re-insert
//!   them), and logs every value it sets; every 100 steps
//!   it changes the `max` of each limiter's default policy with `update_policy` (except
//!   GCRA's: see `workload.rs`), alternating between two configurations.
//!
//! Windows of 200 ms to 1 s of simulated time slide by thousands during a run. `--quick`
//! (what CI runs) is a 10 s run; the reliability guide gives a 10-minute one
//! (`--seconds 600`) too.
//!
//! Every operation is logged per key it touched: the clock read just before and just after
//! it, the key's sequence number taken just before and just after (`fetch_add` on one
//! atomic per key), the limiter's policy counter before and after, the cost, what it did
//! to that key and a refusal's `retry_after`. The run is cut into rounds (`--round-ms`, all
//! workers pause at the end of each) so that the log of one round is checked while the
//! next runs; the run is paced by the checker (the summary says how much of it was
//! checking).
//!
//! The checker (`checker.rs`, `track.rs`, `possible.rs`, `window.rs`, `model.rs`) is
//! independent of the library: its own model of each algorithm, from the limits' numbers.
//! What it counts, and why each tolerance it has holds, is written at the top of `track.rs`,
//! `possible.rs` and `window.rs`.
//! The run exits non-zero if any of these is not zero, for any limiter: over-admissions
//! (an admission that breaks its limit's bound wherever in its clock bracket it was
//! decided), admissions with no room (given what certainly came before), refusals with
//! room (given everything that may have come before), `retry_after` earlier than the log
//! allows, or later with no race to explain it, early admissions with no race to explain
//! them, unexpected decisions; or if some kind of operation never ran.
//!
//! `--corrupt N` checks the checker: it falsifies one refusal in `N` in the log (into an
//! admission, or its `retry_after` moved by 1 ms either way) and the run must then fail.

mod checker;
mod model;
mod possible;
mod report;
#[cfg(test)]
mod tests;
mod track;
mod window;
mod workload;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Barrier, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Carry, Limiter, ManualClock};
use slidegate_tools::rng::Rng;

use checker::{Checker, Held, Stats};
use workload::{
    kinds, ns, Rec, Seq, Target, ADMITTED, ALL_KEYS, KEYS, MAX_SLOTS, MS, NO_RETRY, REFUSED, SHADOW_KEYS,
};

/// One clock step in this many is a jump of 1–3 s.
const JUMP_ONE_IN: u64 = 500;
/// One other clock step in this many is a step of 10–60 ms, the rest up to 4 ms.
const LONG_ONE_IN: u64 = 20;
/// Clock steps between two policy changes.
const UPDATE_EVERY: u64 = 100;

struct Options {
    seconds: u64,
    threads: usize,
    seed: u64,
    round: Duration,
    /// `--corrupt N`: falsify one refusal in N in the log before checking it.
    corrupt: u64,
    verbose: bool,
}

/// the contention soak: threads check, check_all and reset skewed keys on every algorithm
/// while policies change, keys are swept and the clock jumps, and an independent checker
/// replays the log; exits non-zero if a bound is broken.
#[derive(argh::FromArgs)]
struct Flags {
    /// run for this many seconds (default 60; 10 with --quick)
    #[argh(option)]
    seconds: Option<u64>,
    /// a 10-second run (CI), unless --seconds says otherwise
    #[argh(switch)]
    quick: bool,
    /// worker threads (default 4)
    #[argh(option, default = "4")]
    threads: usize,
    /// the traffic's seed (default 1)
    #[argh(option, default = "1")]
    seed: u64,
    /// the length of a round in milliseconds (default 500)
    #[argh(option, default = "500")]
    round_ms: u64,
    /// falsify one refusal in N in the log, to see the checker catch it (default 0: none)
    #[argh(option, default = "0")]
    corrupt: u64,
    /// print each round's checks and the checker's time per round
    #[argh(switch)]
    verbose: bool,
}

fn options() -> Result<Options, String> {
    let f: Flags = argh::from_env();
    let o = Options {
        seconds: f.seconds.unwrap_or(if f.quick { 10 } else { 60 }),
        threads: f.threads,
        seed: f.seed,
        round: Duration::from_millis(f.round_ms),
        corrupt: f.corrupt,
        verbose: f.verbose,
    };
    if o.threads == 0 || o.seconds == 0 || o.round.is_zero() {
        return Err("--threads, --seconds and --round-ms must be positive".into());
    }
    Ok(o)
}

/// What the workers hand over at the end of a round: per worker, per limiter.
type Round = Vec<Vec<Vec<Rec>>>;

/// What the other threads counted.
#[derive(Default)]
struct Counters {
    steps: AtomicU64,
    jumps: AtomicU64,
    updates: AtomicU64,
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let kinds = kinds();
    if kinds.iter().flat_map(|k| &k.specs).any(|s| s.slots() as usize > MAX_SLOTS) {
        eprintln!("soak: the checker models at most {MAX_SLOTS} slots per window");
        return ExitCode::from(2);
    }
    let clock = ManualClock::new();
    let mut limiters: Vec<Limiter<u32>> = Vec::new();
    for kind in &kinds {
        match kind.limiter(&clock) {
            Ok(l) => limiters.push(l),
            Err(e) => {
                eprintln!("soak: {}: {e}", kind.name);
                return ExitCode::from(2);
            }
        }
    }
    let seqs: Vec<Vec<Seq>> = kinds.iter().map(|_| (0..ALL_KEYS).map(|_| Seq::default()).collect()).collect();
    let versions: Vec<AtomicU64> = kinds.iter().map(|_| AtomicU64::new(0)).collect();
    println!(
        "soak: {} worker threads × {KEYS} keys (+ {SHADOW_KEYS} shadow) × {} limiters for {} s (seed {}, rounds \
         of {:?}): check_n, check_all and reset racing a sweeper, policy changes and a clock in random steps \
         and jumps",
        o.threads,
        kinds.len(),
        o.seconds,
        o.seed,
        o.round
    );

    let stop = AtomicBool::new(false);
    let round_over = AtomicBool::new(false);
    let start = Barrier::new(o.threads + 1);
    let end = Barrier::new(o.threads + 1);
    let handed: Mutex<Round> = Mutex::new(Vec::new());
    let held_values: Mutex<Vec<u64>> = Mutex::new(vec![0]);
    let swept: Vec<AtomicU64> = kinds.iter().map(|_| AtomicU64::new(0)).collect();
    let counters = Counters::default();
    let (to_checker, rounds) = mpsc::sync_channel::<(Round, u64, Vec<u64>)>(1);
    let began = Instant::now();

    let (checkers, rounds_run, active) = thread::scope(|s| {
        // Workers.
        for w in 0..o.threads {
            let (limiters, seqs, versions, clock) = (&limiters, &seqs, &versions, &clock);
            let (stop, round_over, start, end, handed) = (&stop, &round_over, &start, &end, &handed);
            let mut rng = Rng(o.seed.wrapping_mul(1_000_003).wrapping_add(w as u64));
            s.spawn(move || {
                let targets: Vec<Target> = limiters
                    .iter()
                    .zip(seqs)
                    .zip(versions)
                    .map(|((limiter, seqs), version)| Target { limiter, seqs, version, clock })
                    .collect();
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let mut logs: Vec<Vec<Rec>> =
                        targets.iter().map(|_| Vec::with_capacity(1 << 16)).collect();
                    while !round_over.load(Ordering::Relaxed) {
                        let l = rng.below(targets.len() as u64) as usize;
                        targets[l].step(&mut rng, &mut logs[l]);
                    }
                    handed.lock().unwrap_or_else(PoisonError::into_inner).push(logs);
                    end.wait();
                }
            });
        }
        // The sweeper.
        {
            let (limiters, swept, stop, round_over) = (&limiters, &swept, &stop, &round_over);
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    // Racing the checks; between rounds, leaving the cores to the checker.
                    if round_over.load(Ordering::Relaxed) {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    for (limiter, n) in limiters.iter().zip(swept) {
                        n.fetch_add(limiter.sweep() as u64, Ordering::Relaxed);
                    }
                }
            });
        }
        // The clock's driver, which also changes the policies.
        {
            let (clock, stop, counters, held_values) = (&clock, &stop, &counters, &held_values);
            let (kinds, limiters, versions) = (&kinds, &limiters, &versions);
            let mut rng = Rng(o.seed ^ 0xC10C);
            s.spawn(move || {
                let mut version = 0usize;
                while !stop.load(Ordering::Acquire) {
                    thread::sleep(Duration::from_micros(50));
                    if rng.below(JUMP_ONE_IN) == 0 {
                        clock.advance(Duration::from_nanos(1_000 * MS + rng.below(2_000 * MS)));
                        counters.jumps.fetch_add(1, Ordering::Relaxed);
                    } else if rng.below(LONG_ONE_IN) == 0 {
                        // Longer than GCRA's intervals: two checks on either side of it
                        // find the arrival time behind the later one's clock.
                        clock.advance(Duration::from_nanos(10 * MS + rng.below(50 * MS)));
                    } else {
                        clock.advance(Duration::from_nanos(rng.below(4 * MS + 1)));
                    }
                    // The clock's only writer: this is the value it holds until the next step.
                    held_values.lock().unwrap_or_else(PoisonError::into_inner).push(ns(clock.now()));
                    let steps = counters.steps.fetch_add(1, Ordering::Relaxed) + 1;
                    if steps % UPDATE_EVERY == 0 {
                        version += 1;
                        for ((kind, limiter), counter) in kinds.iter().zip(limiters).zip(versions) {
                            if !kind.updates {
                                continue;
                            }
                            // Odd while the change is under way, even after (see `Rec::configs`).
                            counter.fetch_add(1, Ordering::SeqCst);
                            if let Err(e) = limiter.update_policy(
                                "default",
                                kind.config(version % 2),
                                Carry::Conservative,
                            ) {
                                eprintln!("soak: {}: update_policy: {e}", kind.name);
                            }
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                        counters.updates.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // The checker.
        let kinds = &kinds;
        let (verbose, corrupt) = (o.verbose, o.corrupt);
        let mut falsify = Rng(o.seed ^ 0xBAD);
        let checker = s.spawn(move || {
            let mut checkers: Vec<Checker> = kinds.iter().map(Checker::new).collect();
            let mut held = Held::default();
            for (mut round, floor, values) in rounds {
                let t0 = Instant::now();
                if corrupt > 0 {
                    let refusals = round.iter_mut().flatten().flatten();
                    for r in refusals.filter(|r| r.what == REFUSED && r.retry != NO_RETRY) {
                        if falsify.below(corrupt) == 0 {
                            match falsify.below(3) {
                                0 => r.what = ADMITTED,
                                1 => r.retry = r.retry.saturating_sub(MS),
                                _ => r.retry += MS,
                            }
                        }
                    }
                }
                held.extend(values);
                let mut per_kind: Vec<Vec<Rec>> = kinds.iter().map(|_| Vec::new()).collect();
                for logs in round {
                    for (all, log) in per_kind.iter_mut().zip(logs) {
                        all.extend(log);
                    }
                }
                let mut times = Vec::new();
                for ((checker, kind), recs) in checkers.iter_mut().zip(kinds).zip(per_kind) {
                    let t = Instant::now();
                    checker.round(kind, recs, floor, &held);
                    times.push(format!("{:.2}", t.elapsed().as_secs_f64()));
                }
                held.prune(checkers.iter().map(Checker::oldest).min().unwrap_or(floor).min(floor));
                if verbose {
                    eprintln!(
                        "  checker: a round checked in {:.3} s ({} s per limiter)",
                        t0.elapsed().as_secs_f64(),
                        times.join(", ")
                    );
                }
            }
            for (checker, kind) in checkers.iter_mut().zip(kinds) {
                checker.finish(kind, &held);
            }
            checkers
        });

        // Rounds, until the time is up.
        let deadline = began + Duration::from_secs(o.seconds);
        let mut rounds_run = 0;
        let mut active = Duration::ZERO;
        let mut progress = began + Duration::from_secs(10);
        while Instant::now() < deadline {
            round_over.store(false, Ordering::Relaxed);
            start.wait();
            let round_began = Instant::now();
            thread::sleep(o.round.min(deadline.saturating_duration_since(Instant::now())));
            round_over.store(true, Ordering::Relaxed);
            end.wait();
            active += round_began.elapsed();
            // Every check of this round read the clock at most now, and every check of the
            // next reads it at least now.
            let floor = ns(clock.now());
            let round = std::mem::take(&mut *handed.lock().unwrap_or_else(PoisonError::into_inner));
            let values = std::mem::take(&mut *held_values.lock().unwrap_or_else(PoisonError::into_inner));
            rounds_run += 1;
            if o.verbose {
                let n: usize = round.iter().flatten().map(Vec::len).sum();
                eprintln!(
                    "  round {rounds_run}: {n} records, ended at {:.3} s",
                    began.elapsed().as_secs_f64()
                );
            }
            if to_checker.send((round, floor, values)).is_err() {
                break;
            }
            if Instant::now() >= progress {
                eprintln!(
                    "  {:>4.0} s: {rounds_run} rounds, simulated clock at {:.0} s",
                    began.elapsed().as_secs_f64(),
                    clock.now().as_secs_f64()
                );
                progress += Duration::from_secs(10);
            }
        }
        stop.store(true, Ordering::Release);
        start.wait();
        drop(to_checker);
        let checkers = checker.join().ok();
        (checkers, rounds_run, active)
    });
    let Some(mut checkers) = checkers else {
        eprintln!("soak: the checker panicked");
        return ExitCode::FAILURE;
    };
    for (checker, n) in checkers.iter_mut().zip(&swept) {
        checker.stats.swept = n.load(Ordering::Relaxed);
    }
    let stats: Vec<Stats> = checkers.into_iter().map(|c| c.stats).collect();
    let elapsed = began.elapsed();
    let simulated = clock.now();
    let (failures, table) = report::report(&kinds, &stats);
    let checks: u64 = stats.iter().map(|s| s.checks).sum();
    println!(
        "\n{} worker threads, {:.1} s, of which {:.1} s operating ({rounds_run} rounds; the rest waiting for \
         the checker), {:.2} M key-checks/s while operating; simulated {:.0} s in {} clock steps ({} jumps of \
         1–3 s), {} policy changes per limiter that has them\n",
        o.threads,
        elapsed.as_secs_f64(),
        active.as_secs_f64(),
        checks as f64 / active.as_secs_f64() / 1e6,
        simulated.as_secs_f64(),
        counters.steps.load(Ordering::Relaxed),
        counters.jumps.load(Ordering::Relaxed),
        counters.updates.load(Ordering::Relaxed),
    );
    println!("{table}");
    let windows: Vec<String> = kinds
        .iter()
        .map(|k| format!("{}: {:.0}", k.name, simulated.as_nanos() as f64 / k.span() as f64))
        .collect();
    println!("Windows (the longest of each limiter) simulated: {}.", windows.join("; "));
    let placed: u64 = stats.iter().map(|s| s.placed).sum();
    let unplaced: u64 = stats.iter().map(|s| s.unplaced).sum();
    println!(
        "Admissions placed by the over-admission scan: {placed} (not placed, their brackets holding more than \
         512 clock values: {unplaced})."
    );
    for s in &stats {
        for e in &s.examples {
            println!("  ! {e}");
        }
    }
    if failures.is_empty() {
        println!("\nsoak: OK (every must-be-zero count is zero)");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("soak: FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
