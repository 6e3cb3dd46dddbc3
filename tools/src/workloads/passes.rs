//! The timed loops: each runs `iters` checks on a contender and returns a [`Pass`] (the
//! time of the timed part, the checks, and how many were admitted, which the callers hold
//! against what the workload expects). criterion's `iter_custom` and `bench_report`'s
//! rounds call the same functions.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use super::contenders::Contender;
use super::keys::Visits;

/// The key of the hot-key workloads.
pub const HOT_KEY: u64 = 7;

/// What a pass did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pass {
    /// Wall time of the timed part.
    pub elapsed: Duration,
    /// Checks per thread.
    pub checks: u64,
    /// Threads that did `checks` each.
    pub threads: u64,
    /// Checks admitted, all threads together.
    pub admitted: u64,
}

impl Pass {
    fn one_thread(elapsed: Duration, checks: u64, admitted: u64) -> Pass {
        Pass { elapsed, checks, threads: 1, admitted }
    }

    /// Nanoseconds per check (per check per thread when threaded: the wall time of the
    /// run over the checks each thread did).
    pub fn ns_per_check(&self) -> f64 {
        self.elapsed.as_nanos() as f64 / self.checks.max(1) as f64
    }

    /// Every check admitted.
    pub fn all_admitted(&self) -> bool {
        self.admitted == self.checks * self.threads
    }

    /// Every check refused.
    pub fn all_refused(&self) -> bool {
        self.admitted == 0
    }
}

/// `iters` checks of `key`; returns the admissions.
#[inline]
fn hot_loop<C: Contender>(c: &C, key: u64, iters: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..iters {
        admitted += u64::from(c.check(black_box(key)));
    }
    admitted
}

/// `iters` checks of the keys `visits` draws, `between` run after each; returns the
/// admissions.
#[inline]
fn random_loop<C: Contender>(c: &C, visits: &mut Visits, iters: u64, between: impl Fn()) -> u64 {
    let mut admitted = 0;
    for _ in 0..iters {
        admitted += u64::from(c.check(visits.next_key()));
        between();
    }
    admitted
}

/// Run after each check of [`random_one_at_a_time`]: the check finishes before the next one
/// starts, so no overlap of one check's cache misses with the next one's, as between a
/// gateway's checks, which have a request's parsing and routing between them. On x86_64 an
/// `lfence`: no later instruction starts before every earlier one has completed locally
/// (its loads done; stores may still wait in the store buffer, as both contenders' writes
/// do). Elsewhere a SeqCst fence, a full memory barrier with a cost of its own that may stop
/// the overlap only in part: there the loop measures neither the latency nor the rate.
#[inline(always)]
fn one_at_a_time() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` needs SSE2, part of every x86_64 processor (the target's baseline).
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_lfence();
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Checks each of `keys` once, in that order (the insertion before a workload that
/// measures existing keys); returns the admissions.
pub fn prefill<C: Contender>(c: &C, keys: &[u64]) -> u64 {
    keys.iter().map(|&k| u64::from(c.check(k))).sum()
}

/// One thread, one key, `iters` checks.
pub fn hot<C: Contender>(c: &C, key: u64, iters: u64) -> Pass {
    let start = Instant::now();
    let admitted = hot_loop(c, key, iters);
    Pass::one_thread(start.elapsed(), iters, black_box(admitted))
}

/// One thread, `iters` checks of keys drawn from `visits`, going on where the previous
/// pass on the same cursor stopped.
pub fn random<C: Contender>(c: &C, visits: &mut Visits, iters: u64) -> Pass {
    let start = Instant::now();
    let admitted = random_loop(c, visits, iters, || {});
    Pass::one_thread(start.elapsed(), iters, black_box(admitted))
}

/// [`random`], one check at a time (`one_at_a_time` after each): the latency of a check rather
/// than the rate of checks back to back.
pub fn random_one_at_a_time<C: Contender>(c: &C, visits: &mut Visits, iters: u64) -> Pass {
    let start = Instant::now();
    let admitted = random_loop(c, visits, iters, one_at_a_time);
    Pass::one_thread(start.elapsed(), iters, black_box(admitted))
}

/// Refusals whose refused-for admission is in the current slot: `iters` checks of
/// `per_minute(1)` keys, in chunks of this many on one key...
pub const REFUSAL_CHUNK: u64 = 65_536;

/// ...each chunk on a new key (`*fresh`, then incremented) admitted once just before it,
/// untimed: the admission is a few milliseconds old at most, so with 1-second slots a
/// chunk rarely straddles a slot boundary. Only the chunks are timed. Panics if the
/// admission that starts a chunk is refused (the key was not new).
pub fn refused_now<C: Contender>(c: &C, fresh: &mut u64, iters: u64) -> Pass {
    let (mut elapsed, mut admitted, mut done) = (Duration::ZERO, 0, 0);
    while done < iters {
        let key = *fresh;
        *fresh += 1;
        assert!(c.check(key), "the admission before a refusal chunk was refused (key {key} not new)");
        let chunk = (iters - done).min(REFUSAL_CHUNK);
        let start = Instant::now();
        admitted += hot_loop(c, key, chunk);
        elapsed += start.elapsed();
        done += chunk;
    }
    Pass::one_thread(elapsed, iters, black_box(admitted))
}

/// Every check a new key: `iters` checks of keys `0..iters` on a fresh contender, built
/// and dropped outside the timing.
pub fn new_keys<C: Contender>(make: impl Fn() -> C, iters: u64) -> Pass {
    let c = make();
    let start = Instant::now();
    let mut admitted = 0;
    for key in 0..iters {
        admitted += u64::from(c.check(black_box(key)));
    }
    let elapsed = start.elapsed();
    drop(c);
    Pass::one_thread(elapsed, iters, black_box(admitted))
}

/// What one thread of [`two_threads`] checks.
#[derive(Debug, Clone)]
pub enum Keys {
    /// One key, every check.
    Hot(u64),
    /// Keys drawn from this sequence.
    Random(Visits),
}

/// Two threads, each doing `iters` checks of `keys(t)` (thread `t` = 0, 1) on the same
/// contender; the wall time from a common start to the last thread's end.
pub fn two_threads<C: Contender>(c: &Arc<C>, iters: u64, keys: impl Fn(usize) -> Keys) -> Pass {
    const THREADS: usize = 2;
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (c, barrier, keys) = (Arc::clone(c), Arc::clone(&barrier), keys(t));
            thread::spawn(move || {
                barrier.wait();
                match keys {
                    Keys::Hot(key) => hot_loop(&*c, key, iters),
                    Keys::Random(mut visits) => random_loop(&*c, &mut visits, iters, || {}),
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let admitted: u64 = workers
        .into_iter()
        .map(|w| w.join().unwrap_or_else(|_| unreachable!("benchmark thread panicked")))
        .sum();
    Pass { elapsed: start.elapsed(), checks: iters, threads: THREADS as u64, admitted }
}

/// How old the refused-for admission of the "history in older slots" workload is when its
/// refusals are timed: 2.5 s, two or three 1-second slots back.
pub const HISTORY_AGE: Duration = Duration::from_millis(2500);

/// A `per_minute(1)` key whose one admission is at least [`HISTORY_AGE`] old.
#[derive(Debug)]
pub struct AgedKey {
    next: u64,
    current: Option<(u64, Instant)>,
}

impl AgedKey {
    /// Keys from `first` on, one per [`AgedKey::renew`].
    pub fn new(first: u64) -> AgedKey {
        AgedKey { next: first, current: None }
    }

    /// Admits the next key on `c` (untimed): its history starts now. Panics if that
    /// admission is refused.
    pub fn renew<C: Contender>(&mut self, c: &C) {
        let key = self.next;
        self.next += 1;
        assert!(c.check(key), "the admission that starts an aged key's history was refused (key {key})");
        self.current = Some((key, Instant::now()));
    }

    /// The key and its admission's age now (`None` before the first renewal).
    pub fn current(&self) -> Option<(u64, Duration)> {
        self.current.map(|(key, at)| (key, at.elapsed()))
    }

    /// Sleeps until the admission is [`HISTORY_AGE`] old; returns the key and its age.
    pub fn aged(&self) -> Option<(u64, Duration)> {
        let (key, at) = self.current?;
        if let Some(left) = HISTORY_AGE.checked_sub(at.elapsed()) {
            thread::sleep(left);
        }
        Some((key, at.elapsed()))
    }
}
