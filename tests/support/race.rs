//! Threads racing on one key at a frozen clock, and the check that their admissions form
//! one exact sequence: shared by the stress tests of every algorithm.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use slidegate::{Decision, Limiter, ManualClock};

use super::rng::Rng;

/// Threads racing on one key (the machine may have only 2 cores: more threads than cores
/// makes preemption in the middle of a check likely).
pub const THREADS: usize = 6;

/// Runs `per_thread` checks of key 7 in each of `THREADS` threads started together, with
/// the cost each thread's closure picks; returns every `(cost, decision)`.
pub fn race(
    limiter: &Limiter<u64>,
    per_thread: usize,
    cost: impl Fn(usize, usize) -> u64 + Sync,
) -> Vec<(u64, Decision)> {
    let barrier = Barrier::new(THREADS);
    let all = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..THREADS {
            let (barrier, all, cost) = (&barrier, &all, &cost);
            s.spawn(move || {
                let mut mine = Vec::with_capacity(per_thread);
                barrier.wait();
                for i in 0..per_thread {
                    let c = cost(t, i);
                    mine.push((c, limiter.check_n(&7, c)));
                }
                all.lock().unwrap().extend(mine);
            });
        }
    });
    all.into_inner().unwrap()
}

/// Admitted decisions of one key at a frozen clock form one sequence: sorted by
/// `remaining` (descending) each is `max - (units admitted up to and including it)`.
/// Returns the units admitted.
pub fn assert_one_sequence(max: u64, decisions: &[(u64, Decision)], what: &str) -> u64 {
    let mut admitted: Vec<(u64, u64)> =
        decisions.iter().filter(|(_, d)| d.is_allowed()).map(|&(c, d)| (d.remaining(), c)).collect();
    admitted.sort_unstable_by(|a, b| b.cmp(a));
    let mut left = max;
    for &(remaining, cost) in &admitted {
        left = left.checked_sub(cost).unwrap_or_else(|| panic!("{what}: more than {max} admitted"));
        assert_eq!(remaining, left, "{what}: admissions {admitted:?}");
    }
    max - left
}

/// `THREADS` threads check key 7 of `limiter` while this thread moves `clock` forward in
/// random steps of 0..=20 ms (seeded by `round`) until it reaches `until`. A unit's
/// admission time is not known exactly, but it lies between the clock read just before its
/// check and the one just after: returns those brackets (ns), sorted.
pub fn admission_brackets(
    limiter: &Limiter<u64>,
    clock: &ManualClock,
    round: u64,
    until: Duration,
) -> Vec<(u64, u64)> {
    let barrier = Barrier::new(THREADS + 1);
    let done = AtomicBool::new(false);
    let brackets = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..THREADS {
            let (barrier, done, brackets) = (&barrier, &done, &brackets);
            s.spawn(move || {
                let mut mine = Vec::new();
                barrier.wait();
                // Acquire pairs with the Release store below: stop once the clock is done.
                while !done.load(Ordering::Acquire) {
                    let before = clock.now();
                    if limiter.check(&7).is_allowed() {
                        mine.push((before, clock.now()));
                    }
                }
                brackets.lock().unwrap().extend(mine);
            });
        }
        let mut rng = Rng(round + 1);
        barrier.wait();
        while clock.now() < until {
            thread::sleep(Duration::from_micros(50));
            clock.advance(Duration::from_millis(rng.below(21)));
        }
        done.store(true, Ordering::Release);
    });
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
    let mut brackets: Vec<(u64, u64)> =
        brackets.into_inner().unwrap().into_iter().map(|(a, b)| (ns(a), ns(b))).collect();
    brackets.sort_unstable();
    brackets
}
