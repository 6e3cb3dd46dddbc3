//! Shutdown: the process's two named threads that real-clock limiters share
//! (`slidegate-clock`, the ticker, and `slidegate-sweeper`) are one each however many
//! limiters there are, start with the first real-clock limiter (a `ManualClock` one starts
//! nothing), serve every limiter's own sweep interval, and stop and are joined when the last
//! real-clock limiter (or its last clone) drops, whoever drops it and whatever the other
//! threads are doing (a checker thread, a sweep in progress); and the ticker survives the
//! process being suspended (`SIGSTOP` for a few seconds, then `SIGCONT`) without stale or
//! bursty decisions.
//!
//! Threads are counted from `/proc/self/task` (Linux), which is process-wide, and the test
//! harness runs each test on a thread of its own that it may start at any moment, so this
//! binary holds ONE test, which runs the scenarios one after the other. Keep it that way: a
//! second test here would start (or end) a harness thread while the counts are taken.
//!
//! What "back to where it was" means: after the drop, no `slidegate-*` thread is left, and
//! every thread of the process existed already before the limiter was built (its id was in
//! the baseline). `JoinHandle::join` returns once the thread has cleared its id (the kernel
//! wakes the joiner from the thread's exit path), slightly before the kernel removes the
//! task from `/proc/self/task`, so the count is polled for a bounded time (5 s); the test
//! prints how often the joined threads were already gone at the first look.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Limit, Limiter};

/// `comm` of the ticker and of the sweeper: the kernel keeps 15 bytes of a thread's name,
/// so `slidegate-sweeper` reads back as `slidegate-sweep`.
const CLOCK_COMM: &str = "slidegate-clock";
const SWEEPER_COMM: &str = "slidegate-sweep";

/// How long a joined thread may take to leave `/proc/self/task`, or a new thread to set its
/// name. Only ever a bound on a wait: the test does not measure speed.
const SETTLE: Duration = Duration::from_secs(5);

/// The process's threads: id and `comm` (threads that exit during the walk are skipped).
fn threads() -> Vec<(u32, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux only)") {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        all.push((tid, comm.trim_end().to_owned()));
    }
    all.sort();
    all
}

/// `(ticker threads, sweeper threads)` alive now.
fn named() -> (usize, usize) {
    let all = threads();
    let count = |name: &str| all.iter().filter(|(_, comm)| comm == name).count();
    (count(CLOCK_COMM), count(SWEEPER_COMM))
}

/// The thread ids alive now: what a drop must come back to.
fn baseline() -> BTreeSet<u32> {
    let all = threads();
    assert_eq!(
        all.iter().filter(|(_, comm)| comm.starts_with("slidegate")).count(),
        0,
        "slidegate threads alive before the scenario: {all:?}"
    );
    all.into_iter().map(|(tid, _)| tid).collect()
}

/// Polls until `ok` holds, at most `SETTLE`; returns how many looks it took (1: at once).
fn settle(what: &str, mut ok: impl FnMut() -> bool) -> usize {
    let deadline = Instant::now() + SETTLE;
    let mut looks = 1;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {SETTLE:?}; threads now: {:?}", threads());
        thread::sleep(Duration::from_millis(1));
        looks += 1;
    }
    looks
}

/// Waits until the shared ticker and sweeper are up and named (once any real-clock limiter
/// lives: one of each, however many limiters).
fn wait_for_named(what: &str) {
    settle(&format!("{what}: the ticker and the sweeper named"), || named() == (1, 1));
}

/// Waits until every thread started since `base` is gone and no slidegate thread is left;
/// returns the number of looks it took.
fn wait_back_to(base: &BTreeSet<u32>, what: &str) -> usize {
    settle(&format!("{what}: threads back to the baseline {base:?}"), || {
        let now = threads();
        now.iter().all(|(tid, comm)| base.contains(tid) && !comm.starts_with("slidegate"))
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `f` on a watchdog: if it has not returned within 60 s (a drop waiting for a thread
/// that never stops), the test fails instead of hanging.
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(value) => {
            worker.join().unwrap();
            value
        }
        Err(_) => panic!("{what}: did not finish within 60 s (a drop that never returns?)"),
    }
}

/// The one test of this binary (see the module's docs). Run with `CHILD_ENV` set (by the
/// suspension scenario), it plays the suspended child instead.
#[test]
fn threads_stop_on_drop_and_the_clock_survives_a_suspension() {
    if std::env::var_os(CHILD_ENV).is_some() {
        suspended_child();
        return;
    }
    build_drop_cycles();
    many_limiters_share_two_threads();
    each_limiter_is_swept_on_its_own_schedule();
    clones_keep_the_threads_until_the_last_drops_on_a_checker_thread();
    dropped_while_sweeps_run();
    the_ticker_survives_a_suspended_process();
}

/// 50 real-clock limiters built and dropped one after the other (each algorithm, with and
/// without custom tick and sweep interval, some after checks, some idle): each starts
/// the ticker and the sweeper again, and after each drop the process's threads are back to
/// the baseline.
fn build_drop_cycles() {
    use slidegate::Algorithm;
    let base = baseline();
    let algorithms =
        [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];
    let mut at_once = 0;
    let mut most_looks = 0;
    const CYCLES: usize = 50;
    for cycle in 0..CYCLES {
        let mut builder = Limiter::<u64>::builder()
            .algorithm(algorithms[cycle % 4])
            .limit(Limit::per_second(5))
            .limit("100/min strict".parse().unwrap());
        if cycle % 3 == 1 {
            builder = builder.clock_tick(Duration::from_micros(200)).sweep_interval(ms(2));
        }
        let limiter = builder.build().unwrap();
        wait_for_named(&format!("cycle {cycle}"));
        if cycle % 2 == 0 {
            for key in 0..100 {
                assert!(limiter.check(&key).is_allowed(), "cycle {cycle}");
            }
            assert_eq!(limiter.len(), 100, "cycle {cycle}");
        }
        drop(limiter);
        let looks = wait_back_to(&base, &format!("cycle {cycle}"));
        at_once += usize::from(looks == 1);
        most_looks = most_looks.max(looks);
    }
    println!(
        "build/drop: {CYCLES} cycles, threads gone at the first look after the drop in {at_once}, \
         at most {most_looks} looks (1 ms apart)"
    );
}

/// 40 limiters alive at once: 30 on the real clock (each algorithm, ticks of 200 µs, 1 ms
/// and 5 ms, sweep intervals of 2 ms, 50 ms and the default) and 10 on `ManualClock`s.
/// Manual ones alone start nothing; with real-clock ones there is never more than one
/// ticker and one sweeper. They are dropped in a scrambled order, some on other threads:
/// the two threads stay while any real-clock limiter lives (and keep working: the clock
/// moves, keys are swept) and are gone after the last.
fn many_limiters_share_two_threads() {
    use slidegate::{Algorithm, ManualClock};
    let base = baseline();
    let clock = ManualClock::new();
    let manual: Vec<Limiter<u64>> = (0..10)
        .map(|_| Limiter::builder().limit(Limit::per_second(5)).clock(clock.clone()).build().unwrap())
        .collect();
    thread::sleep(ms(50));
    assert_eq!(named(), (0, 0), "ManualClock limiters started threads");
    assert!(
        threads().iter().all(|(tid, _)| base.contains(tid)),
        "ManualClock limiters started threads: {:?}",
        threads()
    );

    let algorithms =
        [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];
    const REAL: usize = 30;
    let mut real = Vec::new();
    for i in 0..REAL {
        let mut builder = Limiter::<u64>::builder().algorithm(algorithms[i % 4]).limit(Limit::new(2, ms(30)));
        builder = match i % 3 {
            0 => builder.clock_tick(Duration::from_micros(200)).sweep_interval(ms(2)),
            1 => builder.clock_tick(ms(5)).sweep_interval(ms(50)),
            _ => builder,
        };
        real.push(Arc::new(builder.build().unwrap()));
        let (tickers, sweepers) = named();
        assert!(tickers <= 1 && sweepers <= 1, "{} limiters: {tickers} tickers, {sweepers} sweepers", i + 1);
    }
    wait_for_named("30 limiters");
    let extra: Vec<u32> =
        threads().iter().filter(|(tid, _)| !base.contains(tid)).map(|(tid, _)| *tid).collect();
    assert_eq!(extra.len(), 2, "30 real-clock limiters added {} threads: {:?}", extra.len(), threads());
    for (i, limiter) in real.iter().enumerate() {
        assert!(limiter.check(&(i as u64)).is_allowed());
    }

    // A scrambled order: 7 is coprime to 30. Every third drop happens on a thread of its
    // own. Before each drop, the survivors' clock moves and their keys get swept.
    let order: Vec<usize> = (0..REAL).map(|i| (i * 7) % REAL).collect();
    let mut slots: Vec<Option<Arc<Limiter<u64>>>> = real.into_iter().map(Some).collect();
    for (n, &i) in order.iter().enumerate() {
        let limiter = slots[i].take().unwrap();
        if n % 10 == 0 {
            // Exhaust a key and see it admitted again (the clock moves), then see it swept.
            let key = 1_000 + n as u64;
            while limiter.check(&key).is_allowed() {}
            settle(&format!("drop {n}: key readmitted"), || limiter.check(&key).is_allowed());
            settle(&format!("drop {n}: keys swept"), || limiter.is_empty());
        }
        if n % 3 == 0 {
            thread::spawn(move || drop(limiter)).join().unwrap();
        } else {
            drop(limiter);
        }
        if n + 1 < REAL {
            assert_eq!(named(), (1, 1), "after {} of {REAL} drops", n + 1);
        }
    }
    let looks = wait_back_to(&base, "after the last of 30 real-clock limiters");
    drop(manual);
    assert!(threads().iter().all(|(tid, _)| base.contains(tid)));
    println!(
        "30 real-clock limiters + 10 manual: 2 threads added; both stayed until the last real-clock \
         drop and were gone {looks} look(s) after it"
    );
}

/// Two limiters with different sweep intervals, 3 s and 10 ms, and keys that expire within
/// 30 ms of their last admission: the slow one is swept on its own schedule (not before its
/// first interval, less the sweeper's slack of 1/32 of it, at most 20 ms: keys it holds must
/// still be there just before), the fast one on its own (many times before the slow one's
/// first sweep), on the one sweeper thread.
fn each_limiter_is_swept_on_its_own_schedule() {
    const SLOW: Duration = Duration::from_secs(3);
    const KEYS: usize = 100;
    let base = baseline();
    let limit = Limit::new(1, ms(20)).precision(ms(10));
    let built = Instant::now();
    let slow = Limiter::<u64>::builder().limit(limit).sweep_interval(SLOW).build().unwrap();
    let fast = Limiter::<u64>::builder().limit(limit).sweep_interval(ms(10)).build().unwrap();
    wait_for_named("two limiters");
    for key in 0..KEYS as u64 {
        assert!(slow.check(&key).is_allowed());
    }
    // The slow one's first sweep cannot come before this (its registration was after
    // `built`): until then it holds every key; the fast one is emptied round after round.
    let earliest = built + SLOW - ms(20);
    let mut rounds = 0;
    let mut slowest_round = Duration::ZERO;
    while built.elapsed() < SLOW - ms(300) {
        let round = Instant::now();
        for key in 0..50 {
            let _ = fast.check(&key);
        }
        assert!(!fast.is_empty());
        let deadline = round + Duration::from_secs(2);
        loop {
            let (held, fast_empty) = (slow.len(), fast.is_empty());
            let at = Instant::now();
            if at < earliest {
                assert_eq!(held, KEYS, "the slow limiter swept {:?} after its build", at - built);
            }
            if fast_empty {
                break;
            }
            assert!(at < deadline, "the fast limiter (every 10 ms) not swept within 2 s, round {rounds}");
            thread::sleep(ms(1));
        }
        slowest_round = slowest_round.max(round.elapsed());
        rounds += 1;
    }
    assert!(rounds >= 2, "the fast limiter was swept only {rounds} times before the slow one's first sweep");
    let held = slow.len();
    if Instant::now() < earliest {
        assert_eq!(held, KEYS, "slow limiter swept before {:?}", built.elapsed());
    }
    let swept = settle("the slow limiter swept after its interval", || slow.is_empty());
    let slow_at = built.elapsed();
    assert!(slow_at >= SLOW - ms(20), "slow limiter swept after {slow_at:?}");
    println!(
        "own schedules: fast limiter (10 ms) emptied {rounds} times (each within {slowest_round:?}) \
         before the slow one's first sweep; slow limiter (3 s) held its expired keys until its \
         sweep, {slow_at:?} after its build ({swept} looks)"
    );
    drop((slow, fast));
    wait_back_to(&base, "after the two limiters");
}

/// The owner shares the limiter with three checker threads through `Arc` and drops its own
/// handle while they check. The limiter lives on: the ticker keeps the clock moving (each
/// checker exhausts a key and sees it admitted again, twice) and the sweeper keeps evicting
/// (keys inserted after the owner's drop disappear without anyone calling `sweep`). Then
/// the checkers stop one by one; the last clone is dropped on a checker thread, whose drop
/// joins both background threads there.
fn clones_keep_the_threads_until_the_last_drops_on_a_checker_thread() {
    const CHECKERS: usize = 3;
    let base = baseline();
    // 3 units per 50 ms (strict, 1 ms slots): a key is free again 51 ms after its burst,
    // and a key idle for 51 ms is evicted.
    let limit = Limit::new(3, ms(50)).strict();
    let limiter = Arc::new(Limiter::<u64>::builder().limit(limit).sweep_interval(ms(5)).build().unwrap());
    wait_for_named("shared limiter");

    let owner_dropped = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let others_done = Arc::new(AtomicUsize::new(0));
    let readmitted = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
    let started = Arc::new(Barrier::new(CHECKERS + 1));
    let main_thread = thread::current().id();
    let mut checkers = Vec::new();
    for c in 0..CHECKERS {
        let limiter = Arc::clone(&limiter);
        let (owner_dropped, stop, others_done, readmitted, started) = (
            Arc::clone(&owner_dropped),
            Arc::clone(&stop),
            Arc::clone(&others_done),
            Arc::clone(&readmitted),
            Arc::clone(&started),
        );
        checkers.push(
            thread::Builder::new()
                .name(format!("checker-{c}"))
                .spawn(move || {
                    let key = c as u64;
                    started.wait();
                    let deadline = Instant::now() + Duration::from_secs(30);
                    // Exhaust the key, then check until it is admitted again: only a moving
                    // clock frees it. Counted once the owner's handle is gone.
                    while !stop.load(Ordering::Acquire) {
                        assert!(Instant::now() < deadline, "checker {c}: stuck (is the clock moving?)");
                        while limiter.check(&key).is_allowed() {}
                        let counts = owner_dropped.load(Ordering::Acquire);
                        while !limiter.check(&key).is_allowed() {
                            assert!(Instant::now() < deadline, "checker {c}: key {key} never readmitted");
                            thread::sleep(Duration::from_micros(200));
                        }
                        if counts {
                            readmitted[c].fetch_add(1, Ordering::Release);
                        }
                    }
                    if c == 0 {
                        // Wait for the others to let go, then drop the last handle here.
                        settle("the other checkers' clones dropped", || {
                            others_done.load(Ordering::Acquire) == CHECKERS - 1
                        });
                        assert_ne!(thread::current().id(), main_thread);
                        let last = Arc::into_inner(limiter).expect("checker 0 holds the last clone");
                        assert_eq!(named(), (1, 1), "threads still up before the last drop");
                        drop(last);
                        // The drop joined both threads on this thread.
                        settle("threads gone after the last clone's drop", || named() == (0, 0));
                    } else {
                        drop(limiter);
                        others_done.fetch_add(1, Ordering::Release);
                    }
                })
                .unwrap(),
        );
    }
    started.wait();
    // The owner lets go while the checkers are checking.
    thread::sleep(ms(20));
    drop(limiter);
    owner_dropped.store(true, Ordering::Release);
    // The background threads are still there (only a handle went away)...
    assert_eq!(named(), (1, 1), "ticker and sweeper after the owner's drop");
    // ...the clock still moves: every checker sees its exhausted key readmitted twice...
    settle("every checker's key readmitted twice after the owner's drop", || {
        readmitted.iter().all(|n| n.load(Ordering::Acquire) >= 2)
    });
    assert_eq!(named(), (1, 1), "ticker and sweeper while the clones are alive");
    stop.store(true, Ordering::Release);
    for checker in checkers {
        checker.join().unwrap();
    }
    wait_back_to(&base, "after the last clone's drop on checker 0");

    // The sweeper also keeps running for clones: a second limiter, shared the same way,
    // evicts keys inserted after its owner's drop without anyone calling `sweep`.
    let base = baseline();
    let limiter = Arc::new(Limiter::<u64>::builder().limit(limit).sweep_interval(ms(5)).build().unwrap());
    wait_for_named("second shared limiter");
    let clone = Arc::clone(&limiter);
    drop(limiter);
    let inserter = thread::spawn(move || {
        for key in 0..500 {
            assert!(clone.check(&key).is_allowed());
        }
        assert!(!clone.is_empty());
        // Idle keys expire 51 ms after their last admission; the sweeper runs every 5 ms.
        settle("keys swept by the background sweeper after the owner's drop", || clone.is_empty());
        // Last handle, dropped on this thread.
    });
    inserter.join().unwrap();
    wait_back_to(&base, "after the inserter's drop");
    println!(
        "Arc clones: the background threads outlived the owner's handle and stopped with the last clone"
    );
}

/// Limiters dropped while sweeps are running: (1) a thread calling `sweep()` in a loop through
/// its own clone while the owner drops its handle (the limiter outlives the sweep; the
/// sweeping thread's drop is the last); (2) the last handle dropped while the background
/// sweeper is in the middle of evicting a large table. A drop must wait for the sweep and
/// then stop both threads; a hang fails the test after a minute.
fn dropped_while_sweeps_run() {
    // (1) Public `sweep` on another thread.
    let base = baseline();
    let limiter = Arc::new(
        Limiter::<u64>::builder().limit(Limit::new(1, ms(10))).sweep_interval(ms(1)).build().unwrap(),
    );
    wait_for_named("sweep-loop limiter");
    let clone = Arc::clone(&limiter);
    let swept_after_drop = Arc::new(AtomicUsize::new(0));
    let owner_dropped = Arc::new(AtomicBool::new(false));
    let sweeper = {
        let (swept, owner_dropped) = (Arc::clone(&swept_after_drop), Arc::clone(&owner_dropped));
        thread::spawn(move || {
            let mut next = 0u64;
            let mut sweeps_after = 0;
            // Keep inserting keys that expire, so that sweeps have work, until two whole
            // sweeps have run after the owner's drop.
            while sweeps_after < 2 {
                for key in next..next + 2_000 {
                    let _ = clone.check(&key);
                }
                next += 2_000;
                let dropped = owner_dropped.load(Ordering::Acquire);
                let evicted = clone.sweep();
                if dropped {
                    sweeps_after += 1;
                    swept.fetch_add(evicted, Ordering::Relaxed);
                }
            }
            // The last handle.
            drop(clone);
        })
    };
    thread::sleep(ms(30));
    drop(limiter);
    owner_dropped.store(true, Ordering::Release);
    within_a_minute("sweep loop's thread", move || sweeper.join().unwrap());
    wait_back_to(&base, "after the sweeping thread's drop");

    // (2) The background sweeper in the middle of a large sweep when the last handle drops.
    // A sweep removes the expired keys shard by shard and updates `len()` only at the end.
    // The keys all expire 1 s after they were inserted; a probe then takes one of them away
    // every 100 µs with `reset` (true: it was still held, and `len()` drops by one). The
    // first probe that finds its key gone while `len()` still counts it has caught the
    // sweeper between its first and its last removal: drop then.
    const KEYS: u64 = 50_000;
    const ATTEMPTS: usize = 4;
    let mut caught = 0;
    let mut longest = Duration::ZERO;
    for attempt in 0..ATTEMPTS {
        let base = baseline();
        let limiter = Limiter::<u64>::builder()
            .limit(Limit::new(1, ms(500)).precision(ms(500)))
            .sweep_interval(ms(1))
            .build()
            .unwrap();
        wait_for_named(&format!("attempt {attempt}"));
        for key in 0..KEYS {
            let _ = limiter.check(&key);
        }
        let mut held = limiter.len();
        let mut mid_sweep = false;
        // A slow fill (a loaded machine) may have let a sweep through already: no probe then.
        if held == KEYS as usize {
            let deadline = Instant::now() + Duration::from_secs(10);
            for probe in 0..KEYS {
                if Instant::now() > deadline {
                    break;
                }
                if limiter.reset(&probe) {
                    held -= 1;
                    thread::sleep(Duration::from_micros(100));
                    continue;
                }
                mid_sweep = limiter.len() == held;
                break;
            }
        }
        caught += usize::from(mid_sweep);
        let started = Instant::now();
        within_a_minute("drop during a background sweep", move || drop(limiter));
        longest = longest.max(started.elapsed());
        wait_back_to(&base, &format!("attempt {attempt}, after a drop during a sweep"));
    }
    println!(
        "drop during sweeps: a sweeping thread's clone outlived the owner's drop ({} keys swept \
         after it); background sweeper caught mid-sweep at the drop in {caught} of {ATTEMPTS} \
         attempts (drop took at most {longest:?})",
        swept_after_drop.load(Ordering::Relaxed)
    );
}

// ---------------------------------------------------------------------------------------
// The suspended process.

/// Set in the child's environment: the suspension test then plays the child.
const CHILD_ENV: &str = "SLIDEGATE_SHUTDOWN_SUSPEND_CHILD";
const THE_TEST: &str = "threads_stop_on_drop_and_the_clock_survives_a_suspension";

/// The child's limit: 5 per second, strict, one 1 s slot: a burst of 5, then (the oldest
/// slot counting whole until it has left the window) nothing until the second slot
/// boundary after it, so a client hammering it gets 5 per 1–2 s.
const MAX: usize = 5;
const WINDOW: Duration = Duration::from_secs(1);
/// `window + precision`: the longest `retry_after` this limit can give.
const LONGEST_WAIT: Duration = Duration::from_secs(2);
/// How long the parent keeps the child stopped.
const SUSPENSION: Duration = Duration::from_millis(2_500);
/// A gap in the child's own timeline this long can only be the suspension.
const GAP: Duration = Duration::from_millis(1_500);
/// Admissions the child waits for after the resume before it stops: three bursts.
const AFTER_RESUME: usize = 2 * MAX + 1;

/// The one timing allowance of this file. The child measures time with `Instant` (its
/// monotonic clock), the limiter with its ticker's copy of `quanta`'s, refreshed every 1 ms
/// by a thread that, after `SIGCONT`, must itself be scheduled again before it stores the
/// new time; the child sleeps 1 ms between checks. On a loaded 2-core CI machine either can
/// be late by far more than a millisecond. The test is about the clock catching up (a ticker
/// that died or stayed behind would leave the key refused for seconds, or for ever), not
/// about speed, so every comparison between the child's time and the limiter's allows
/// 300 ms: the first admission after the resume within 300 ms of the first check after
/// it, a `retry_after` honoured within 300 ms either way, and a burst counted only among
/// admissions that lie within `window − 300 ms` of each other.
const ALLOWANCE: Duration = Duration::from_millis(300);

/// The process is stopped for 2.5 s while it checks, then continued; it reports its
/// decisions, and this checks them (`analyse`).
fn the_ticker_survives_a_suspended_process() {
    let mut child = Guard(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", THE_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id().to_string();
    let stdout = child.0.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut checks = Vec::new();
    expect_line(&lines, "SUSPEND-READY", Duration::from_secs(60), &mut checks);
    signal("-STOP", &pid);
    let stopped_at = Instant::now();
    // Stopped indeed (`T`), and still stopped when continued: the signals are delivered
    // by the time `kill` returns, so the first look normally sees it.
    assert_eq!(settle_state(&pid, 'T'), Some('T'), "child not stopped");
    thread::sleep(SUSPENSION.saturating_sub(stopped_at.elapsed()));
    assert_eq!(state(&pid), Some('T'), "child continued before SIGCONT");
    signal("-CONT", &pid);
    expect_line(&lines, "SUSPEND-DONE", Duration::from_secs(90), &mut checks);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "child exited with {status}");
    reader.join().unwrap();
    analyse(&checks);
}

/// Kills the child if the test fails before it exits (a stopped child too: SIGKILL needs
/// no SIGCONT).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The child's scheduler state (`/proc/<pid>/stat`, third field: `T` when stopped).
fn state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: the state follows the last `)`.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
}

fn settle_state(pid: &str, want: char) -> Option<char> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = state(pid);
        if now == Some(want) || Instant::now() > deadline {
            return now;
        }
        thread::sleep(ms(1));
    }
}

fn signal(which: &str, pid: &str) {
    let status = Command::new("kill").args([which, pid]).status().unwrap();
    assert!(status.success(), "kill {which} {pid}: {status}");
}

/// One check of the child: its own time before and after (ns since it started), the
/// decision, and `retry_after` (ns) for a refusal.
#[derive(Debug, Clone, Copy)]
struct Check {
    before: u64,
    after: u64,
    admitted: bool,
    retry: Option<u64>,
}

/// Collects `CHECK` lines until `marker`; fails after `limit` or if the child says
/// `SUSPEND-FAILED`.
fn expect_line(lines: &Receiver<String>, marker: &str, limit: Duration, checks: &mut Vec<Check>) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no {marker} from the child within {limit:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the child's output ended before {marker}"),
        };
        // The harness may print `test ... ` ahead of the child's first line.
        if line.ends_with(marker) {
            return;
        }
        if let Some((_, why)) = line.split_once("SUSPEND-FAILED ") {
            panic!("child: {why}");
        }
        // The start of the child's timeline: an observation of its clock without a check
        // (neither admitted nor refused with a `retry_after`, so only the gap search sees it).
        if let Some(at) = line.strip_prefix("READY-AT ") {
            let at = at.parse().unwrap();
            checks.push(Check { before: at, after: at, admitted: false, retry: None });
            continue;
        }
        let Some(fields) = line.strip_prefix("CHECK ") else { continue };
        let f: Vec<&str> = fields.split(' ').collect();
        assert_eq!(f.len(), 4, "{line}");
        checks.push(Check {
            before: f[0].parse().unwrap(),
            after: f[1].parse().unwrap(),
            admitted: f[2] == "1",
            retry: (f[3] != "-").then(|| f[3].parse().unwrap()),
        });
    }
}

/// The child: a real-clock limiter, a key exhausted, then one check every millisecond,
/// each printed, until it has seen `AFTER_RESUME` admissions after a gap of at least `GAP`
/// in its own timeline (the suspension). Gives up after 60 s.
fn suspended_child() {
    let limiter = Limiter::<u64>::builder().limit("5/s strict".parse().unwrap()).build().unwrap();
    let start = Instant::now();
    let ns = |at: Instant| u64::try_from(at.duration_since(start).as_nanos()).unwrap();
    let mut burst = 0;
    while limiter.check(&1).is_allowed() {
        burst += 1;
    }
    if burst != MAX {
        println!("SUSPEND-FAILED a fresh key admitted {burst}, not {MAX}");
        return;
    }
    // The timeline starts here, before the parent hears of it: a STOP landing before the
    // first check still shows as a gap.
    let mut last = ns(Instant::now());
    println!("\nREADY-AT {last}\nSUSPEND-READY");
    let mut resumed = false;
    let mut admitted_after = 0;
    let (mut largest_gap, mut admitted, mut checks) = (0, 0, 0);
    while admitted_after < AFTER_RESUME {
        let before = ns(Instant::now());
        let decision = limiter.check(&1);
        let after = ns(Instant::now());
        let retry = decision.retry_after().map_or("-".to_owned(), |r| r.as_nanos().to_string());
        println!("CHECK {before} {after} {} {retry}", u8::from(decision.is_allowed()));
        if after - last >= GAP.as_nanos() as u64 {
            resumed = true;
        }
        largest_gap = largest_gap.max(after - last);
        last = after;
        checks += 1;
        admitted += usize::from(decision.is_allowed());
        if resumed && decision.is_allowed() {
            admitted_after += 1;
        }
        if after > 60_000_000_000 {
            println!(
                "SUSPEND-FAILED {admitted_after} admissions after the resume within 60 s (resumed: \
                 {resumed}, largest gap {largest_gap} ns, {checks} checks, {admitted} admitted, last \
                 {decision:?})"
            );
            return;
        }
        thread::sleep(ms(1));
    }
    println!("SUSPEND-DONE");
}

/// What the parent checks in the child's report.
fn analyse(checks: &[Check]) {
    let ns = |d: Duration| d.as_nanos() as u64;
    let show = |c: &Check| format!("{:.3} ms", c.before as f64 / 1e6);
    // Where the suspension is: the largest gap in the child's timeline, between two checks
    // or inside one (the STOP landing during a check: that check's decision may be from
    // either side, so it is left out).
    let (mut gap, mut at, mut inside) = (0, 0, false);
    for (i, c) in checks.iter().enumerate() {
        if i > 0 && c.before - checks[i - 1].after > gap {
            (gap, at, inside) = (c.before - checks[i - 1].after, i, false);
        }
        if c.after - c.before > gap {
            (gap, at, inside) = (c.after - c.before, i, true);
        }
    }
    assert!(
        gap >= ns(SUSPENSION) - ns(Duration::from_millis(500)),
        "the child's largest gap is {gap} ns: was it ever stopped?"
    );
    let resume = if inside { checks[at].after } else { checks[at].before };
    let after: &[Check] = &checks[at + usize::from(inside)..];

    // 1. The clock catches up: the key (exhausted, and idle for the whole suspension,
    // longer than window + precision) is admitted again soon after the resume.
    let first = after.iter().position(|c| c.admitted).expect("no admission after the resume");
    let stale = &after[..first];
    let caught_up = after[first].after - resume;
    assert!(
        caught_up <= ns(ALLOWANCE),
        "first admission {caught_up} ns after the first check after the resume ({} refused \
         before it, retry_after {:?}): the limiter's clock did not catch up",
        stale.len(),
        stale.iter().map(|c| c.retry).collect::<Vec<_>>()
    );

    // 2. No burst: in no interval shorter than the window (less the allowance) were more
    // than `MAX` admitted, before or after the resume.
    let admitted: Vec<&Check> = checks.iter().filter(|c| c.admitted).collect();
    for (i, anchor) in admitted.iter().enumerate() {
        let within =
            admitted[i..].iter().filter(|c| c.after < anchor.before + ns(WINDOW) - ns(ALLOWANCE)).count();
        assert!(within <= MAX, "{within} admitted within a window from {}", show(anchor));
    }

    // 3. `retry_after` after the catch-up is consistent with the new time: at most window +
    // precision, and the key (hammered every millisecond) is admitted again when it says,
    // give or take the allowance.
    let mut refusals = 0;
    let mut worst = 0i64;
    for (i, c) in after.iter().enumerate().skip(first + 1) {
        let Some(retry) = c.retry else { continue };
        refusals += 1;
        assert!(!c.admitted);
        assert!(retry > 0 && retry <= ns(LONGEST_WAIT), "retry_after {retry} ns at {}", show(c));
        let Some(next) = after[i..].iter().find(|n| n.admitted) else { continue };
        let (earliest, latest) = (c.before + retry, c.after + retry);
        assert!(
            next.after + ns(ALLOWANCE) >= earliest && next.before <= latest + ns(ALLOWANCE),
            "refused at {} with retry_after {retry} ns, next admitted at {}",
            show(c),
            show(next)
        );
        let off = if next.after < earliest {
            -((earliest - next.after) as i64)
        } else {
            next.before.saturating_sub(latest) as i64
        };
        worst = if off.abs() > worst.abs() { off } else { worst };
    }
    let admitted_after = after.iter().filter(|c| c.admitted).count();
    assert!(
        admitted_after >= 2 * MAX && refusals > 0,
        "{admitted_after} admitted, {refusals} refused after the resume"
    );
    println!(
        "suspension: child stopped for {:.3} s; first admission {:.3} ms after the resume \
         ({} stale refusal(s) before it); {admitted_after} admitted and {refusals} refused \
         after the catch-up, next admission at most {:.3} ms from its retry_after",
        gap as f64 / 1e9,
        caught_up as f64 / 1e6,
        stale.len(),
        worst as f64 / 1e6
    );
}
