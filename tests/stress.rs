//! Concurrency: threads racing on one key at a frozen clock must admit exactly the limit
//! (single and several limits, unit and mixed costs, the admissions forming one exact
//! sequence); expired keys raced by checks and a sweeper must still admit exactly the limit;
//! the accuracy bounds must hold while the clock moves under the threads; threads on many
//! keys while another thread sweeps and the clock moves must lose no count to eviction; and
//! `len()` must stay exact through racing inserts, resets and sweeps. Every scenario runs
//! many rounds on fresh limiters to catch races.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use slidegate::{Denial, Limit, Limiter, ManualClock};

#[allow(dead_code)]
mod support {
    pub mod race;
    pub mod rng;
}
use support::race::{admission_brackets, assert_one_sequence, race, THREADS};
use support::rng::Rng;

const ROUNDS: usize = 50;

fn limiter(limits: &[Limit], clock: &ManualClock) -> Limiter<u64> {
    let mut builder = Limiter::<u64>::builder().clock(clock.clone());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    builder.build().unwrap()
}

fn parse(text: &str) -> Limit {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn threads_on_one_key_at_a_frozen_clock_admit_exactly_the_limit() {
    for text in ["200/s", "200/min strict", "200/2s@500ms", "200/s@100ms strict"] {
        let limit = parse(text);
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(Duration::from_millis(1_500 + round as u64));
            let limiter = limiter(&[limit], &clock);
            // The key is new: the threads also race to insert it.
            let decisions = race(&limiter, 100, |_, _| 1);
            let what = format!("{text}, round {round}");
            let admitted = decisions.iter().filter(|(_, d)| d.is_allowed()).count();
            assert_eq!(admitted, 200, "{what}");
            assert_eq!(assert_one_sequence(200, &decisions, &what), 200);
            for (_, d) in decisions.iter().filter(|(_, d)| !d.is_allowed()) {
                assert_eq!((d.denial(), d.remaining()), (Some(Denial::Limit(0)), 0), "{what}");
                assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{what}");
            }
            assert_eq!(limiter.len(), 1);
            assert!(!limiter.peek(&7).is_allowed(), "{what}");
        }
    }
}

#[test]
fn mixed_costs_at_a_frozen_clock_fill_the_limit_exactly() {
    const MAX: u64 = 300;
    for text in ["300/s", "300/min strict", "300/2s@500ms"] {
        let limit = parse(text);
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(Duration::from_millis(700 + round as u64));
            let limiter = limiter(&[limit], &clock);
            let what = format!("{text}, round {round}");
            // Phase 1: costs 1..=3 mixed, more than the limit in total.
            let decisions = race(&limiter, 40, |t, i| ((t + i) % 3 + 1) as u64);
            let taken = assert_one_sequence(MAX, &decisions, &what);
            let free = MAX - taken;
            // A refused request saw at most `taken` counted (counts only rise at a frozen
            // clock) and did not fit: its cost exceeds what is free, and it reported room
            // between what is free now and its cost.
            let mut refused = 0;
            for &(cost, d) in decisions.iter().filter(|(_, d)| !d.is_allowed()) {
                refused += 1;
                assert_eq!(d.denial(), Some(Denial::Limit(0)), "{what}");
                assert!(cost > free, "{what}: cost {cost} refused with {free} free");
                assert!((free..cost).contains(&d.remaining()), "{what}: {d:?}, {free} free");
            }
            assert!(refused > 0, "{what}: 6 × 40 × 2 units must overflow {MAX}");
            assert_eq!(limiter.check_n(&7, 0).remaining(), free, "{what}");
            // Phase 2: unit costs take exactly what is left.
            let decisions = race(&limiter, 10, |_, _| 1);
            let more = decisions.iter().filter(|(_, d)| d.is_allowed()).count() as u64;
            assert_eq!(more, free, "{what}");
            assert_eq!(assert_one_sequence(free, &decisions, &what), free);
            assert_eq!(limiter.check_n(&7, 0).remaining(), 0, "{what}");
        }
    }
}

#[test]
fn several_limits_at_a_frozen_clock_admit_exactly_the_tightest() {
    let gateway = [parse("10/s"), parse("120/min"), parse("240/h@1min")];
    // Tightest last: a check commits the hour and the minute, then may lose the second to
    // a racing check and roll the first two back.
    let reversed = [parse("240/h@1min"), parse("120/min"), parse("10/s")];
    let equal = [parse("10/s"), parse("10/min strict")];
    // (limits, tightest limit of an admission, limit that refuses: the one freeing up last)
    for (limits, tightest, refusing) in [(&gateway[..], 0, 0), (&reversed[..], 2, 2), (&equal[..], 0, 1)] {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(Duration::from_millis(250 + 10 * round as u64));
            let limiter = limiter(limits, &clock);
            let what = format!("{limits:?}, round {round}");
            let decisions = race(&limiter, 20, |_, _| 1);
            assert_eq!(decisions.iter().filter(|(_, d)| d.is_allowed()).count(), 10, "{what}");
            if limits == &equal[..] {
                // Two equally tight limits: each limit's count is exact at its own commit,
                // but a check that commits the first limit, then the second after a racing
                // check did both, reports the room of both at different moments. Remaining
                // is then conservative: the k-th largest is at most 10 - k, and the last is 0.
                let mut rooms: Vec<u64> =
                    decisions.iter().filter(|(_, d)| d.is_allowed()).map(|(_, d)| d.remaining()).collect();
                rooms.sort_unstable_by(|a, b| b.cmp(a));
                for (k, &room) in rooms.iter().enumerate() {
                    assert!(room < 10 - k as u64, "{what}: remaining {rooms:?}");
                }
                assert_eq!(rooms.last(), Some(&0), "{what}");
            } else {
                assert_eq!(assert_one_sequence(10, &decisions, &what), 10);
            }
            let racy = limits == &equal[..];
            for (_, d) in &decisions {
                // With equally tight limits a check may see one limit full while a racing
                // check's commit has not reached the other yet: either may be named.
                let named = d.tightest_limit();
                match d.denial() {
                    None => assert!(named == tightest || racy && named < 2, "{what}: {d:?}"),
                    Some(denial) => {
                        assert!(named == refusing || racy && named < 2, "{what}: {d:?}");
                        assert_eq!(denial, Denial::Limit(named), "{what}: {d:?}");
                    }
                }
            }
            // Once the race is over, a refusal names the limit that frees up last.
            assert_eq!(limiter.check(&7).denial(), Some(Denial::Limit(refusing)), "{what}");
            // Every limit counted exactly the 10 admitted units (a rolled-back commit left
            // nothing behind): every 2 s the 1 s window is empty again, and the minute then
            // takes exactly 11 more bursts of 10.
            if limits.len() == 3 {
                let mut bursts = 0;
                for _ in 0..13 {
                    clock.advance(Duration::from_secs(2));
                    bursts += usize::from(limiter.check_n(&7, 10).is_allowed());
                }
                assert_eq!(bursts, 11, "{what}");
                let d = limiter.check_n(&7, 10);
                assert_eq!(d.denial(), Some(Denial::Limit(1)), "{what}: {d:?}");
            } else {
                clock.advance(Duration::from_secs(2));
                let d = limiter.check_n(&7, 0);
                assert_eq!((d.remaining(), d.tightest_limit()), (0, 1), "{what}: {d:?}");
            }
        }
    }
}

/// Threads hammer one key while the main thread moves the clock in small steps. A unit's
/// admission time is not known exactly, but it lies between the clock read just before the
/// check and the one just after (a check that adopts a later slot adopts one that another
/// thread already read the clock for). Units whose whole bracket lies inside one closed
/// interval of length `window` were certainly admitted in it: at most `max` of them for a
/// strict limit, fewer than `2 × max` for an interpolated one.
#[test]
fn accuracy_bounds_hold_while_the_clock_moves() {
    for (text, bound) in [("20/s@100ms strict", 20), ("20/s strict", 20), ("20/s", 39), ("20/2s@250ms", 39)] {
        let limit = parse(text);
        let window = u64::try_from(limit.window().as_nanos()).unwrap();
        for round in 0..10u64 {
            let clock = ManualClock::new();
            let limiter = limiter(&[limit], &clock);
            let brackets = admission_brackets(&limiter, &clock, round, limit.window() * 3);
            assert!(brackets.len() >= 20, "{text}, round {round}: only {} admitted", brackets.len());
            for &(start, _) in &brackets {
                let inside = brackets
                    .iter()
                    .filter(|&&(before, after)| before >= start && after <= start + window)
                    .count();
                assert!(
                    inside <= bound,
                    "{text}, round {round}: {inside} units surely in [{start}, +{window}] ns"
                );
            }
        }
    }
}

/// Keys 0..HOT are used in every round, HOT..KEYS in even rounds only.
const KEYS: u64 = 256;
const HOT: u64 = 128;
const WORKERS: usize = 4;
const EPOCHS: u64 = 30;

/// Workers check many keys while a sweeper thread sweeps in a loop and the main thread moves
/// the clock. Each round runs from `start` to `start + 1 s` (one window of the 1 s limit);
/// rounds are 10 s apart, so at a round's start every key of the previous round is expired
/// and the sweeper races the workers, who touch those keys again (reset in place, or insert
/// anew after an eviction). At the end of a round, with the workers stopped and the clock at
/// a slot boundary, each key's count must be exactly the units the workers were told were
/// admitted in that round: a count lost to an eviction (or a reset racing an admission)
/// would show as more room.
#[test]
fn sweeping_while_checking_loses_no_count() {
    // Limit 0 binds: within a round its strict window covers every unit of the round, and
    // limit 1's window holds no more units, so limit 1 never refuses (no rollbacks: the
    // counts are exact). The expiry is 2.25 s (limit 1's window plus a slot).
    const MAX: u64 = 20;
    let limits = [parse("20/s@100ms strict"), parse("30/2s@250ms")];
    let clock = ManualClock::new();
    let limiter = limiter(&limits, &clock);
    let start = Barrier::new(WORKERS + 2);
    let end = Barrier::new(WORKERS + 2);
    let stepping_done = AtomicBool::new(false);
    let evicted_this_round = AtomicUsize::new(0);
    let admitted: Vec<Mutex<Vec<u64>>> = (0..WORKERS).map(|_| Mutex::new(vec![0; KEYS as usize])).collect();
    let mut failures = Vec::new();

    thread::scope(|s| {
        for (w, tally) in admitted.iter().enumerate() {
            let (limiter, start, end, done) = (&limiter, &start, &end, &stepping_done);
            s.spawn(move || {
                let mut rng = Rng(w as u64 + 1);
                for epoch in 0..EPOCHS {
                    let keys = if epoch % 2 == 0 { KEYS } else { HOT };
                    start.wait();
                    let mut tally = tally.lock().unwrap();
                    tally.fill(0);
                    let mut checks = 0;
                    while checks < 300 || !done.load(Ordering::Acquire) {
                        let key = rng.below(keys);
                        if rng.below(8) == 0 {
                            let _ = limiter.peek(&key);
                        }
                        let cost = rng.below(3) + 1;
                        if limiter.check_n(&key, cost).is_allowed() {
                            tally[key as usize] += cost;
                        }
                        checks += 1;
                    }
                    drop(tally);
                    end.wait();
                }
            });
        }
        {
            let (limiter, start, end, done, evicted) =
                (&limiter, &start, &end, &stepping_done, &evicted_this_round);
            s.spawn(move || {
                for _ in 0..EPOCHS {
                    start.wait();
                    // At least one whole sweep per round, at a time >= the round's start.
                    loop {
                        evicted.fetch_add(limiter.sweep(), Ordering::Relaxed);
                        if done.load(Ordering::Acquire) {
                            break;
                        }
                    }
                    end.wait();
                }
            });
        }

        // The main thread must keep meeting the barriers whatever it finds (a panic here
        // would leave the other threads waiting), so failures are collected and reported
        // after the scope.
        let mut fail = |message: String| failures.push(message);
        let mut held_cold = 0;
        for epoch in 0..EPOCHS {
            let round_start = Duration::from_secs(10 * epoch);
            clock.set(round_start);
            let keys_before = limiter.len();
            stepping_done.store(false, Ordering::Release);
            evicted_this_round.store(0, Ordering::Relaxed);
            start.wait();
            // 40 steps of 25 ms up to the round's end, while workers and sweeper run.
            for _ in 0..40 {
                thread::sleep(Duration::from_micros(100));
                clock.advance(Duration::from_millis(25));
            }
            stepping_done.store(true, Ordering::Release);
            end.wait();
            if clock.now() != round_start + Duration::from_secs(1) {
                fail(format!("round {epoch}: clock at {:?}", clock.now()));
            }

            let mut units = vec![0; KEYS as usize];
            for tally in &admitted {
                for (sum, n) in units.iter_mut().zip(tally.lock().unwrap().iter()) {
                    *sum += n;
                }
            }
            let mut held = 0;
            for key in 0..KEYS {
                let want = units[key as usize];
                let got = limiter.check_n(&key, 0).remaining();
                if want > MAX || got != MAX - want {
                    fail(format!("round {epoch} key {key}: {want} units admitted, room {got} of {MAX}"));
                }
                held += usize::from(want > 0);
            }
            let evicted = evicted_this_round.load(Ordering::Relaxed);
            if evicted > keys_before {
                fail(format!("round {epoch}: evicted {evicted} of {keys_before} keys"));
            }
            // The cold keys held after the last (even) round were untouched since and expired
            // when this round began: the sweeper's sweeps must have evicted them.
            if evicted < held_cold {
                fail(format!("round {epoch}: evicted {evicted} < {held_cold} idle cold keys"));
            }
            if epoch % 2 == 1 {
                for key in HOT..KEYS {
                    if limiter.reset(&key) {
                        fail(format!("round {epoch}: idle cold key {key} not evicted"));
                    }
                }
            }
            held_cold = (HOT..KEYS).filter(|&k| units[k as usize] > 0).count();
            let len = limiter.len();
            if !(held..=KEYS as usize).contains(&len) {
                fail(format!("round {epoch}: len {len}, but {held} keys hold units"));
            }
        }
    });
    assert!(
        failures.is_empty(),
        "{} failures, the first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );

    // Everything expires: the last sweep takes exactly the keys still held.
    clock.advance(Duration::from_secs(3600));
    let len = limiter.len();
    assert_eq!(limiter.sweep(), len);
    assert_eq!(limiter.len(), 0);
    assert!(limiter.is_empty());
}

/// Keys whose state is expired (but still held) are raced by checks, which reset the state
/// in place under the shard's write lock, and by a sweeper, which removes it: whichever comes
/// first, no admission may be lost to the other. At a frozen clock each key must therefore
/// admit exactly its limit, however the reset, the removal and the re-insertion interleave.
#[test]
fn an_expired_key_raced_by_checks_and_a_sweeper_admits_exactly_the_limit() {
    const MAX: u64 = 30;
    const RACED: u64 = 4;
    for round in 0..200 {
        let clock = ManualClock::new();
        let limiter = limiter(&[parse("30/s"), parse("100/min strict")], &clock);
        for key in 0..RACED {
            assert_eq!(limiter.check_n(&key, 25).remaining(), 5);
        }
        // Expired (the longest window plus a slot is 61 s), not yet swept.
        clock.set(Duration::from_secs(61 + round % 3));
        let barrier = Barrier::new(THREADS + 1);
        let finished = AtomicUsize::new(0);
        let admitted: Vec<AtomicUsize> = (0..RACED).map(|_| AtomicUsize::new(0)).collect();
        let evicted = thread::scope(|s| {
            for t in 0..THREADS {
                let (limiter, barrier, finished, admitted) = (&limiter, &barrier, &finished, &admitted);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..4 * MAX as usize {
                        let key = ((t + i) % RACED as usize) as u64;
                        if limiter.check(&key).is_allowed() {
                            admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    finished.fetch_add(1, Ordering::Release);
                });
            }
            let (limiter, barrier, finished) = (&limiter, &barrier, &finished);
            s.spawn(move || {
                barrier.wait();
                let mut evicted = 0;
                while finished.load(Ordering::Acquire) < THREADS {
                    evicted += limiter.sweep();
                }
                evicted
            })
            .join()
            .unwrap()
        });
        for key in 0..RACED {
            let n = admitted[key as usize].load(Ordering::Relaxed) as u64;
            assert_eq!(n, MAX, "round {round} key {key}: admitted {n} at a frozen clock (evicted {evicted})");
            assert_eq!(limiter.check_n(&key, 0).remaining(), 0, "round {round} key {key}");
        }
        assert!(evicted <= RACED as usize, "round {round}: {evicted} evictions of {RACED} keys");
        assert_eq!(limiter.len(), RACED as usize, "round {round}");
    }
}

/// `len()` is kept by inserts, resets and sweeps racing on a few keys; afterwards it must
/// equal the number of keys actually held (counted by `reset`, which says whether the key
/// was there).
#[test]
fn len_stays_exact_under_racing_inserts_resets_and_sweeps() {
    const FEW: u64 = 8;
    for round in 0..ROUNDS {
        let clock = ManualClock::new();
        let limiter = limiter(&[parse("5/s"), parse("8/3s@500ms")], &clock);
        let barrier = Barrier::new(THREADS + 1);
        let finished = AtomicUsize::new(0);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (limiter, barrier, clock, finished) = (&limiter, &barrier, &clock, &finished);
                s.spawn(move || {
                    let mut rng = Rng((round * THREADS + t) as u64);
                    barrier.wait();
                    for _ in 0..300 {
                        let key = rng.below(FEW);
                        match rng.below(10) {
                            0 => {
                                let _ = limiter.reset(&key);
                            }
                            1 => {
                                let _ = limiter.sweep();
                            }
                            2 => clock.advance(Duration::from_millis(rng.below(1_500))),
                            _ => {
                                let _ = limiter.check_n(&key, rng.below(3));
                            }
                        }
                    }
                    finished.fetch_add(1, Ordering::Release);
                });
            }
            let (limiter, barrier, finished) = (&limiter, &barrier, &finished);
            s.spawn(move || {
                barrier.wait();
                while finished.load(Ordering::Acquire) < THREADS {
                    let _ = limiter.sweep();
                }
            });
        });
        let len = limiter.len();
        let held = (0..FEW).filter(|k| limiter.reset(k)).count();
        assert_eq!(len, held, "round {round}: len() {len} but {held} keys held");
        assert_eq!(limiter.len(), 0, "round {round}");
    }
}
