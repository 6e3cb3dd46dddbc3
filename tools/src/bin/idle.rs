//! What idle real-clock limiters cost: 50 `Limiter<u64>`s (`Limit::per_second(10)`, the real
//! clock, default tick and sweep interval) are built, some keys checked once, and then the
//! process sits idle for 5 s (2 s with `--quick`). Prints the threads the limiters added
//! (from `/proc/self/task`) and the process's CPU over the idle period as a percentage of
//! one core: utime + stime from `/proc/self/stat` (10 ms resolution), and the sum of the
//! threads' run time from `/proc/self/task/*/schedstat` (nanoseconds) where the kernel has
//! it. Exits non-zero if the limiters added more than 2 threads or cost 1 % of a core or
//! more. Linux only.
//!
//! `cargo run --release -p slidegate-tools --bin idle [-- --quick]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Limit, Limiter};

const LIMITERS: usize = 50;
const MOST_THREADS: usize = 2;
const MOST_PERCENT: f64 = 1.0;

/// what idle real-clock limiters cost: threads added and CPU while idle (Linux only).
#[derive(argh::FromArgs)]
struct Args {
    /// idle 2 s instead of 5 (CI)
    #[argh(switch)]
    quick: bool,
}

fn main() -> ExitCode {
    let Args { quick } = argh::from_env();
    let idle = if quick { Duration::from_secs(2) } else { Duration::from_secs(5) };
    let m = measure(LIMITERS, idle);
    println!(
        "idle: {LIMITERS} real-clock limiters added {} thread(s) ({} before, {} after: {:?}); \
         over {:.2} s idle the process used {:.3} % of a core by /proc/self/stat \
         (utime+stime {} ticks of 1/{} s){}",
        m.added,
        m.before,
        m.after,
        m.names,
        m.seconds,
        m.stat_percent,
        m.stat_ticks,
        CLOCK_TICKS,
        m.schedstat_percent.map_or(String::new(), |p| format!(", {p:.3} % by schedstat")),
    );
    let mut ok = true;
    if m.added > MOST_THREADS {
        println!("FAIL: more than {MOST_THREADS} threads added");
        ok = false;
    }
    let percent = m.schedstat_percent.unwrap_or(m.stat_percent).max(m.stat_percent);
    if percent >= MOST_PERCENT {
        println!("FAIL: {percent:.3} % of a core is not below {MOST_PERCENT} %");
        ok = false;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What [`measure`] found.
struct Idle {
    before: usize,
    after: usize,
    added: usize,
    /// Names of the threads that were not there before.
    names: Vec<String>,
    seconds: f64,
    stat_ticks: u64,
    stat_percent: f64,
    schedstat_percent: Option<f64>,
}

/// `USER_HZ`: the unit of utime and stime in `/proc/self/stat` (100 on every Linux port
/// that Rust targets).
const CLOCK_TICKS: u64 = 100;

/// Builds `limiters` real-clock limiters, checks a few keys on each (so the clock is read
/// and the tables are not empty), lets the first tick and sweep pass, then measures the
/// process over `idle` with nothing to do.
fn measure(limiters: usize, idle: Duration) -> Idle {
    let before = threads();
    let all: Vec<Limiter<u64>> =
        (0..limiters).map(|_| Limiter::builder().limit(Limit::per_second(10)).build().unwrap()).collect();
    for (i, limiter) in all.iter().enumerate() {
        for key in 0..10 {
            assert!(limiter.check(&(key + i as u64)).is_allowed());
        }
    }
    // Past the keys' expiry and the first sweeps (every 1 s, the window), and the ticker's
    // awake spell after the checks.
    thread::sleep(Duration::from_millis(1500));
    let after = threads();
    let names = after
        .iter()
        .filter(|(tid, _)| !before.iter().any(|(t, _)| t == tid))
        .map(|(_, n)| n.clone())
        .collect();
    let (stat0, sched0, start) = (stat_ticks(), schedstat_ns(), Instant::now());
    thread::sleep(idle);
    let (stat1, sched1, seconds) = (stat_ticks(), schedstat_ns(), start.elapsed().as_secs_f64());
    let stat = stat1 - stat0;
    let per_core = |cpu_seconds: f64| cpu_seconds / seconds * 100.0;
    let idle = Idle {
        before: before.len(),
        after: after.len(),
        added: after.len().saturating_sub(before.len()),
        names,
        seconds,
        stat_ticks: stat,
        stat_percent: per_core(stat as f64 / CLOCK_TICKS as f64),
        schedstat_percent: sched0.zip(sched1).map(|(a, b)| per_core(b.saturating_sub(a) as f64 / 1e9)),
    };
    // The limiters stay alive over the whole measurement.
    assert!(all.iter().all(|l| l.is_empty()), "keys not swept in 1.5 s + the idle period");
    drop(all);
    idle
}

/// The process's threads: id and name.
fn threads() -> Vec<(u32, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux only)") {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        all.push((tid, comm.trim_end().to_owned()));
    }
    all
}

/// utime + stime of the whole process, in `CLOCK_TICKS`.
fn stat_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // `pid (comm) state ...`: utime and stime are fields 14 and 15, the 12th and 13th after
    // the state (the comm may hold spaces, so split after the last `)`).
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The threads' total run time in ns (first field of each `schedstat`), if the kernel
/// provides it. Threads that exited meanwhile are missing from the sum, so it is only
/// compared across a period in which the set of threads is fixed.
fn schedstat_ns() -> Option<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(entry) = entry else { continue };
        let text = std::fs::read_to_string(entry.path().join("schedstat")).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}
