//! Threads racing on one key at a frozen clock, and the check that their admissions form
//! one exact sequence: shared by the stress tests of every algorithm.

use std::sync::{Barrier, Mutex};
use std::thread;

use slidegate::{Decision, Limiter};

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
