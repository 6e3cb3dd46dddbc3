//! The four algorithms (the sliding window, interpolated and strict, the fixed window, the
//! sliding log and GCRA) under the promises every algorithm shares, and each one's own
//! semantics. Concurrency at a frozen clock: threads racing on one key admit exactly `max`
//! (unit and mixed costs, the admissions forming one exact sequence), and checks that commit
//! some limits and then lose a later one roll back without leaving anything counted. While
//! the clock moves under the threads, each algorithm keeps its accuracy bound. Then one
//! deterministic test per promise, with the exact numbers worked out in comments: the fixed
//! window's boundary and `retry_after`, the sliding log's exact expiry and refusals that
//! store nothing, GCRA's burst, interval and remaining tokens, `CostTooLarge`, `peek`,
//! `reset`, `max_keys`, when `sweep` may evict, and the two algorithm-specific
//! `ConfigError`s. Last, the sliding log's memory: a limiter dropped with many keys held,
//! and a key raced by checks, resets and sweeps.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use slidegate::{Algorithm, ConfigError, Denial, Limit, Limiter, ManualClock, MAX_LOG_UNITS};

#[allow(dead_code)]
mod support {
    pub mod race;
    pub mod rng;
    pub mod variant;
}
use support::race::{admission_brackets, assert_one_sequence, race};
use support::variant::{Variant, VARIANTS};

const ROUNDS: u64 = 30;

const NS: Duration = Duration::from_nanos(1);

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

/// An algorithm, with the sliding window in both its accuracies.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn parse(text: &str) -> Limit {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// A limiter running `algorithm` on `clock`.
fn new_limiter(algorithm: Algorithm, limits: &[Limit], clock: &ManualClock) -> Limiter<u64> {
    let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(clock.clone());
    for limit in limits {
        builder = builder.limit(*limit);
    }
    let limiter = builder.build().unwrap_or_else(|e| panic!("{algorithm:?} {limits:?}: {e}"));
    assert_eq!(limiter.algorithm(), algorithm);
    limiter
}

/// A limiter running `variant` (every limit made strict for [`Variant::Strict`]).
fn variant_limiter(variant: Variant, limits: &[Limit], clock: &ManualClock) -> Limiter<u64> {
    let limits: Vec<Limit> = limits.iter().map(|&l| variant.limit(l)).collect();
    new_limiter(variant.algorithm(), &limits, clock)
}

/// Moves the clock to `t`, which must not be earlier than now (a test's times in order).
fn set(clock: &ManualClock, t: Duration) {
    clock.set(t);
    assert_eq!(clock.now(), t, "the test sets times out of order");
}

/// Sends `n` requests of `cost` for `key` now and returns how many were admitted.
fn hammer(limiter: &Limiter<u64>, key: u64, n: usize, cost: u64) -> usize {
    (0..n).filter(|_| limiter.check_n(&key, cost).is_allowed()).count()
}

// ---------------------------------------------------------------------------------------
// 1. Threads on one key at a frozen clock.
// ---------------------------------------------------------------------------------------

#[test]
fn threads_on_one_key_at_a_frozen_clock_admit_exactly_max_with_every_algorithm() {
    const MAX: u64 = 200;
    for variant in VARIANTS {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(ms(1_500 + round));
            let limiter = variant_limiter(variant, &[Limit::per_second(MAX)], &clock);
            let what = format!("{variant:?}, round {round}");
            // The key is new: the threads also race to insert it. 600 requests for 200 units.
            let decisions = race(&limiter, 100, |_, _| 1);
            let admitted = decisions.iter().filter(|(_, d)| d.is_allowed()).count();
            assert_eq!(admitted, MAX as usize, "{what}");
            assert_eq!(assert_one_sequence(MAX, &decisions, &what), MAX, "{what}");
            for (_, d) in decisions.iter().filter(|(_, d)| !d.is_allowed()) {
                assert_eq!((d.denial(), d.remaining()), (Some(Denial::Limit(0)), 0), "{what}: {d:?}");
                assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{what}: {d:?}");
            }
            assert_eq!(limiter.len(), 1, "{what}");
            assert_eq!(limiter.check_n(&7, 0).remaining(), 0, "{what}");
            assert_eq!(limiter.peek(&7).denial(), Some(Denial::Limit(0)), "{what}");
        }
    }
}

#[test]
fn mixed_costs_at_a_frozen_clock_fill_max_exactly_with_every_algorithm() {
    const MAX: u64 = 300;
    for variant in VARIANTS {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(ms(700 + round));
            let limiter = variant_limiter(variant, &[Limit::per_second(MAX)], &clock);
            let what = format!("{variant:?}, round {round}");
            // Phase 1: costs 1..=3 mixed, 6 × 40 × 2 = 480 units asked for 300.
            let decisions = race(&limiter, 40, |t, i| ((t + i) % 3 + 1) as u64);
            let taken = assert_one_sequence(MAX, &decisions, &what);
            let free = MAX - taken;
            // A refused request saw at most `taken` counted (counts only rise at a frozen
            // clock with one limit) and did not fit: its cost exceeds what is free, and it
            // reported room between what is free now and its cost.
            let mut refused = 0;
            for &(cost, d) in decisions.iter().filter(|(_, d)| !d.is_allowed()) {
                refused += 1;
                assert_eq!(d.denial(), Some(Denial::Limit(0)), "{what}: {d:?}");
                assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{what}: {d:?}");
                assert!(cost > free, "{what}: cost {cost} refused with {free} free");
                assert!((free..cost).contains(&d.remaining()), "{what}: {d:?}, {free} free");
            }
            assert!(refused > 0, "{what}: 480 units must overflow {MAX}");
            assert_eq!(limiter.check_n(&7, 0).remaining(), free, "{what}");
            // Phase 2: unit costs take exactly what is left.
            let decisions = race(&limiter, 10, |_, _| 1);
            let more = decisions.iter().filter(|(_, d)| d.is_allowed()).count() as u64;
            assert_eq!(more, free, "{what}");
            assert_eq!(assert_one_sequence(free, &decisions, &what), free, "{what}");
            assert_eq!(limiter.check_n(&7, 0).remaining(), 0, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. Several limits: rollbacks at a frozen clock.
// ---------------------------------------------------------------------------------------

/// Loosest first, tightest last: a check commits the hour and the minute, then may lose the
/// second to a racing check and roll the first two back. Exactly 10 are admitted; what the
/// hour and the minute take afterwards shows that every rollback of a window algorithm left
/// nothing counted, and that what GCRA's rollbacks left is counted as admitted units are.
#[test]
fn rollbacks_across_several_limits_leave_nothing_counted_with_every_algorithm() {
    let limits = [Limit::per_hour(25), Limit::per_minute(15), Limit::per_second(10)];
    for variant in VARIANTS {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            // T0 in [10 s, 10.29 s]: T0 + 2 s and T0 + 64 s stay in the fixed window's hour
            // [0, 3600 s); T0 + 2 s stays in its minute [0, 60 s), T0 + 64 s is in the next
            // one [60 s, 120 s).
            let t0 = ms(10_000 + 10 * round);
            set(&clock, t0);
            let limiter = variant_limiter(variant, &limits, &clock);
            let what = format!("{variant:?}, round {round}");
            let decisions = race(&limiter, 20, |_, _| 1);
            assert_eq!(decisions.iter().filter(|(_, d)| d.is_allowed()).count(), 10, "{what}");
            // The second (last, never rolled back) counts exactly the admitted units. The
            // minute may also hold commits of up to 5 other threads still mid-check (rolled
            // back later, or not yet through the second), but every finished check it counts
            // had also counted in the second before this check did, so the minute's room is
            // never below the second's: `remaining` is the second's, one exact sequence.
            assert_eq!(assert_one_sequence(10, &decisions, &what), 10, "{what}");
            for (_, d) in &decisions {
                let named = d.tightest_limit();
                match d.denial() {
                    // The minute is named only when its room equals the second's (it comes
                    // first among equals).
                    None => assert!(named == 2 || named == 1, "{what}: {d:?}"),
                    Some(denial) => {
                        // The second refuses once it holds 10; the minute only if 10 are
                        // admitted and 5 racing commits are not yet rolled back (15).
                        assert!(named == 2 || named == 1, "{what}: {d:?}");
                        assert_eq!(denial, Denial::Limit(named), "{what}: {d:?}");
                        assert_eq!(d.remaining(), 0, "{what}: {d:?}");
                        assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{what}: {d:?}");
                    }
                }
            }
            // Once the race is over only the second is full.
            assert_eq!(limiter.check(&7).denial(), Some(Denial::Limit(2)), "{what}");

            // T0 + 2 s: the second is empty again for every algorithm (sliding window: the
            // slot of T0 is two 1 s slots back; fixed: a later 1 s window; log: the units
            // of T0 count while now < T0 + 1 s; GCRA: its TAT T0 + 10 × 100 ms is past).
            // The minute holds 10 of 15 and the hour 10 of 25 (sliding window: their slots
            // are still wholly in the window; fixed: same minute and hour; log: T0 + 60 s
            // and T0 + 3600 s are ahead; GCRA: 15/min refills one unit per 4 s, so its TAT
            // T0 + 10 × 4 s is 38 s ahead, and 38 + 5 × 4 ≤ 60 < 38 + 6 × 4: 5 units; the
            // hour's TAT T0 + 10 × 144 s is 1438 s ahead, 1438 + 15 × 144 ≤ 3600).
            // So exactly 5 more, then the minute refuses.
            set(&clock, t0 + secs(2));
            if variant == Variant::Gcra {
                gcra_residues_count_as_units(&limiter, &clock, t0, &what);
                continue;
            }
            assert_eq!(hammer(&limiter, 7, 12, 1), 5, "{what}: at T0 + 2 s");
            assert_eq!(limiter.check(&7).denial(), Some(Denial::Limit(1)), "{what}");

            // T0 + 64 s: the second and the minute are empty again (sliding window: slots 10
            // and 12 s are more than 61 s back; fixed: the minute [60 s, 120 s); log: the
            // units of T0 + 2 s count while now < T0 + 62 s; GCRA: the minute's TAT reached
            // T0 + 60 s). The hour holds 15 of 25 (GCRA: TAT T0 + 15 × 144 s is 2096 s
            // ahead, 2096 + 10 × 144 = 3536 ≤ 3600 < 3680): exactly 10 more, as the second
            // allows, then both the second and the hour refuse and the hour frees up last.
            set(&clock, t0 + secs(64));
            assert_eq!(hammer(&limiter, 7, 15, 1), 10, "{what}: at T0 + 64 s");
            assert_eq!(limiter.check(&7).denial(), Some(Denial::Limit(0)), "{what}");
        }
    }
}

/// GCRA's half of the test above, from T0 + 2 s. A rollback restores the arrival time it
/// saw only while the word still holds its own commit's; when another check committed on
/// the same limit between its commit and its rollback (check X commits the hour, check Y
/// commits the hour, X finds the second full and rolls back: the hour holds Y's TAT, not
/// X's), X's unit stays counted (`src/algorithm/gcra.rs`, "Rollback"; documented in the
/// semantics guide). Every such residue is one whole unit (the clock stood still, so every
/// TAT is T0 plus a multiple of the interval): the minute and the hour may hold `r_m` and
/// `r_h` of them, any number the scheduling produced (1 in about 40 runs of this test on a
/// 2-core machine leaves some). What must hold anyway: the room the limiter reports is
/// exactly what it then admits, never more than exact rollbacks would leave (5, then 10),
/// and the hour never admits more than 25 in all.
fn gcra_residues_count_as_units(limiter: &Limiter<u64>, clock: &ManualClock, t0: Duration, what: &str) {
    // T0 + 2 s: the second is empty, the minute has 5 − r_m left, the hour 15 − r_h.
    let room = limiter.check_n(&7, 0).remaining();
    assert!(room <= 5, "{what}: {room} left in the minute at T0 + 2 s");
    let second = hammer(limiter, 7, 12, 1) as u64;
    assert_eq!(second, room, "{what}: at T0 + 2 s");
    let denial = limiter.check(&7).denial();
    assert!(matches!(denial, Some(Denial::Limit(0 | 1))), "{what}: {denial:?}");
    // T0 + 64 s: the second and the minute are empty again; the hour has 15 − r_h − second.
    set(clock, t0 + secs(64));
    let room = limiter.check_n(&7, 0).remaining();
    assert!(room <= 10, "{what}: {room} left at T0 + 64 s");
    let third = hammer(limiter, 7, 15, 1) as u64;
    assert_eq!(third, room, "{what}: at T0 + 64 s");
    assert!(10 + second + third <= 25, "{what}: the hour admitted {}", 10 + second + third);
    let denial = limiter.check(&7).denial();
    assert!(matches!(denial, Some(Denial::Limit(0 | 2))), "{what}: {denial:?}");
}

// ---------------------------------------------------------------------------------------
// 3. Accuracy while the clock moves.
// ---------------------------------------------------------------------------------------

/// Threads hammer one key while the main thread moves the clock in small steps. A unit's
/// admission time is not known exactly, but it lies between the clock read just before the
/// check and the one just after (a check that adopts a later window, slot or log stamp
/// adopts one that another thread already read the clock for). Units whose whole bracket
/// lies inside one interval of length `window` were certainly admitted in it.
///
/// Bounds: strict sliding window, at most `max` in any closed interval; sliding log, at
/// most `max` in any half-open one (a unit admitted at `t` counts while `now < t + window`,
/// so `max` more may come at exactly `t + window`); interpolated, below `2 × max`; fixed
/// window, at most `2 × max` (a closed interval meets two windows); GCRA, at most
/// `2 × max` (each admission moves the TAT by an interval, the first in the interval to at
/// least `start + interval` and the last to at most `start + window + burst`, so at most
/// `(window + burst) / interval = 2 × max` units).
#[test]
fn accuracy_bounds_hold_for_every_algorithm_while_the_clock_moves() {
    // (variant, limit, most units surely admitted in one interval, interval half-open)
    let cases = [
        (Variant::Interpolated, "20/s", 39, false),
        (Variant::Strict, "20/s@100ms", 20, false),
        (Variant::Fixed, "20/s", 40, false),
        (Variant::Log, "20/s@100ms", 20, true),
        (Variant::Gcra, "20/s", 40, false),
    ];
    for (variant, text, bound, half_open) in cases {
        let limit = variant.limit(parse(text));
        let window = nanos(limit.window());
        for round in 0..8u64 {
            let clock = ManualClock::new();
            let limiter = new_limiter(variant.algorithm(), &[limit], &clock);
            let brackets = admission_brackets(&limiter, &clock, round, limit.window() * 3);
            let what = format!("{variant:?} {limit}, round {round}");
            assert!(brackets.len() >= 20, "{what}: only {} admitted", brackets.len());
            for &(start, _) in &brackets {
                let end = if half_open { start + window - 1 } else { start + window };
                let inside =
                    brackets.iter().filter(|&&(before, after)| before >= start && after <= end).count();
                assert!(inside <= bound, "{what}: {inside} units surely in [{start}, +{window}] ns");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. Each algorithm's semantics, deterministically.
// ---------------------------------------------------------------------------------------

#[test]
fn fixed_window_resets_exactly_at_the_boundary_and_admits_twice_max_across_it() {
    let clock = ManualClock::new();
    // 10 per minute; the limit's precision (1 s) is ignored: one counter per minute, the
    // windows are [0, 60 s), [60 s, 120 s), ...
    let limiter = new_limiter(Algorithm::FixedWindow, &[Limit::per_minute(10)], &clock);
    // 1 ns before the boundary: the window [0, 60 s) takes its 10.
    set(&clock, secs(60) - NS);
    for left in (0..10).rev() {
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), left);
    }
    let d = limiter.check(&1);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Some(NS), "the next window starts in 1 ns");
    // At the boundary the count starts from zero: 10 more, 20 within 1 ns.
    clock.advance(NS);
    for left in (0..10).rev() {
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), left);
    }
    let d = limiter.check(&1);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.retry_after(), Some(secs(60)), "a whole window to wait at its start");
    // The interpolated sliding window refuses the second burst: the first one still weighs
    // 10 × (1 − 0) units at 60 s.
    let clock = ManualClock::new();
    let sliding = new_limiter(Algorithm::SlidingWindow, &[Limit::per_minute(10).precision(secs(60))], &clock);
    set(&clock, secs(60) - NS);
    assert_eq!(hammer(&sliding, 1, 20, 1), 10);
    clock.advance(NS);
    assert_eq!(hammer(&sliding, 1, 20, 1), 0);
}

#[test]
fn fixed_window_retry_after_is_the_time_to_the_next_boundary() {
    let clock = ManualClock::new();
    let limiter = new_limiter(Algorithm::FixedWindow, &[Limit::per_second(10)], &clock);
    // 2.3 s, in the window [2 s, 3 s).
    set(&clock, ms(2_300));
    assert_eq!(limiter.check_n(&1, 7).remaining(), 3);
    let d = limiter.check_n(&1, 4);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.remaining(), 3, "a refusal takes nothing");
    assert_eq!(d.retry_after(), Some(ms(700)), "3 s - 2.3 s");
    assert_eq!(limiter.check_n(&1, 3).remaining(), 0);
    set(&clock, ms(2_999));
    assert_eq!(limiter.check(&1).retry_after(), Some(ms(1)));
    set(&clock, secs(3) - NS);
    let d = limiter.check(&1);
    assert_eq!((d.denial(), d.retry_after()), (Some(Denial::Limit(0)), Some(NS)));
    clock.advance(NS);
    let d = limiter.check_n(&1, 10);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    // A window of a minute: at 75 s the next window starts at 120 s.
    let clock = ManualClock::new();
    let minute = new_limiter(Algorithm::FixedWindow, &[Limit::per_minute(5)], &clock);
    set(&clock, secs(75));
    assert_eq!(hammer(&minute, 1, 5, 1), 5);
    assert_eq!(minute.check(&1).retry_after(), Some(secs(45)));
    set(&clock, secs(120) - NS);
    assert_eq!(minute.check(&1).retry_after(), Some(NS));
    clock.advance(NS);
    assert_eq!(minute.check(&1).remaining(), 4);
}

#[test]
fn sliding_log_admits_again_exactly_one_window_after_the_oldest_unit() {
    let clock = ManualClock::new();
    let limiter = new_limiter(Algorithm::SlidingLog, &[Limit::per_second(3)], &clock);
    for (at, left) in [(100, 2), (400, 1), (700, 0)] {
        set(&clock, ms(at));
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{at} ms: {d:?}");
        assert_eq!(d.remaining(), left, "{at} ms");
    }
    // At 0.9 s the log holds 100, 400 and 700 ms: one unit fits once the 100 ms unit leaves,
    // at 1.1 s.
    set(&clock, ms(900));
    let d = limiter.check(&1);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Some(ms(200)));
    set(&clock, ms(1_100) - NS);
    let d = limiter.check(&1);
    assert_eq!((d.denial(), d.retry_after()), (Some(Denial::Limit(0)), Some(NS)));
    clock.advance(NS);
    let d = limiter.check(&1);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0, "400, 700 and 1100 ms are in the window");
    // 2 units need the 2 oldest gone: 700 ms + 1 s.
    let d = limiter.check_n(&1, 2);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.retry_after(), Some(ms(600)));
    set(&clock, ms(1_700) - NS);
    assert_eq!(limiter.check_n(&1, 2).retry_after(), Some(NS));
    clock.advance(NS);
    let d = limiter.check_n(&1, 2);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0, "1100, 1700 and 1700 ms are in the window");
    // Exact to the nanosecond whatever the times: the 1.1 s unit leaves at 2.1 s.
    set(&clock, ms(2_100) - NS);
    assert_eq!(limiter.check(&1).retry_after(), Some(NS));
    clock.advance(NS);
    assert_eq!(limiter.check(&1).remaining(), 0);
}

#[test]
fn sliding_log_stores_only_admitted_units() {
    let clock = ManualClock::new();
    let limiter = new_limiter(Algorithm::SlidingLog, &[Limit::per_second(5)], &clock);
    set(&clock, ms(50));
    assert_eq!(hammer(&limiter, 1, 5, 1), 5);
    // 200 refusals of costs 1..=3 spread over the next 999.8 ms: each says to wait until
    // 1.05 s, when the 5 units of 50 ms leave; a log that recorded refusals would move
    // that time on.
    let until = ms(1_050);
    for i in 0..200u64 {
        clock.advance(Duration::from_micros(4_999));
        let d = limiter.check_n(&1, i % 3 + 1);
        assert_eq!(d.denial(), Some(Denial::Limit(0)), "at {:?}", clock.now());
        assert_eq!(d.remaining(), 0);
        assert_eq!(clock.now() + d.retry_after().unwrap(), until, "at {:?}", clock.now());
    }
    set(&clock, until);
    // All 5 units left together: the whole window is free again.
    for left in (0..5).rev() {
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), left);
    }
    assert_eq!(limiter.check(&1).retry_after(), Some(secs(1)));
}

#[test]
fn gcra_bursts_max_then_admits_one_unit_per_interval() {
    let clock = ManualClock::new();
    // 4 per second: interval 250 ms, burst (tolerance) 4 × 250 ms = 1 s.
    let limiter = new_limiter(Algorithm::Gcra, &[Limit::per_second(4)], &clock);
    let t = secs(10);
    set(&clock, t);
    // A full bucket: 4 at once; remaining counts the tokens left.
    for left in (0..4).rev() {
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.remaining(), left);
    }
    // TAT = t + 1 s; one more needs TAT + 250 ms − now ≤ 1 s: at t + 250 ms.
    let d = limiter.check(&1);
    assert_eq!(d.denial(), Some(Denial::Limit(0)));
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Some(ms(250)));
    clock.advance(ms(250) - NS);
    assert_eq!(limiter.check(&1).retry_after(), Some(NS));
    clock.advance(NS);
    assert_eq!(limiter.check(&1).remaining(), 0);
    // The sustained rate: one unit per interval, not one more.
    for step in 0..8 {
        clock.advance(ms(250));
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "step {step}: {d:?}");
        assert_eq!(d.remaining(), 0, "step {step}");
        let d = limiter.check(&1);
        assert_eq!(d.retry_after(), Some(ms(250)), "step {step}: {d:?}");
    }
    // now = t + 2.25 s, TAT = t + 3.25 s. 600 ms later the lag is 400 ms: 2.4 tokens,
    // 2 whole. After one, the lag is 650 ms: (1 s − 650 ms) / 250 ms = 1 token left.
    clock.advance(ms(600));
    assert_eq!(limiter.peek(&1).remaining(), 1);
    assert_eq!(limiter.check(&1).remaining(), 1);
    assert_eq!(limiter.check(&1).remaining(), 0);
    // Lag 900 ms: one more needs 900 + 250 − 1000 = 150 ms; two need 400 ms.
    let d = limiter.check(&1);
    assert_eq!((d.denial(), d.remaining(), d.retry_after()), (Some(Denial::Limit(0)), 0, Some(ms(150))));
    assert_eq!(limiter.check_n(&1, 2).retry_after(), Some(ms(400)));
    // 900 ms later the bucket is full again: 4 at once, not 5.
    clock.advance(ms(900) - NS);
    assert_eq!(limiter.check_n(&1, 4).retry_after(), Some(NS));
    clock.advance(NS);
    let d = limiter.check_n(&1, 4);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    assert_eq!(limiter.check(&1).retry_after(), Some(ms(250)));
}

/// Units recorded beyond a full bucket (`record`: admitted elsewhere) hold the key until
/// its arrival time has come within a burst of the clock: neither a check nor a sweep may
/// treat it as empty earlier. 30 units of 10/s (100 ms each, burst 1 s) at 5 s put the
/// arrival time at 8 s: one more unit fits at 7.1 s.
#[test]
fn gcra_units_recorded_beyond_the_burst_keep_counting_until_they_pass() {
    let clock = ManualClock::new();
    let limiter = new_limiter(Algorithm::Gcra, &[Limit::per_second(10)], &clock);
    set(&clock, secs(5));
    let _ = limiter.record(&1, 30);
    let d = limiter.check(&1);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(2100)), "{d:?}");
    set(&clock, Duration::from_millis(7099));
    assert_eq!(limiter.sweep(), 0, "a key 900 ms from a free unit is not empty");
    assert_eq!(limiter.check(&1).retry_after(), Some(Duration::from_millis(1)));
    set(&clock, Duration::from_millis(7100));
    assert!(limiter.check(&1).is_allowed());
}

#[test]
fn gcra_interval_is_rounded_up_to_the_nanosecond() {
    let clock = ManualClock::new();
    // 3 per second: interval ⌈10⁹ / 3⌉ = 333 333 334 ns, burst 1 000 000 002 ns.
    let limiter = new_limiter(Algorithm::Gcra, &[Limit::per_second(3)], &clock);
    let interval = Duration::from_nanos(333_333_334);
    set(&clock, secs(5));
    assert_eq!(hammer(&limiter, 1, 3, 1), 3);
    let d = limiter.check(&1);
    assert_eq!(d.retry_after(), Some(interval), "{d:?}");
    clock.advance(interval - NS);
    assert_eq!(limiter.check(&1).retry_after(), Some(NS));
    clock.advance(NS);
    let d = limiter.check(&1);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    // TAT = now + burst: the bucket is full again after 1 000 000 002 ns, not 1 s.
    clock.advance(Duration::from_nanos(1_000_000_001));
    assert_eq!(limiter.check_n(&1, 3).retry_after(), Some(NS));
    assert_eq!(limiter.check_n(&1, 1).remaining(), 1, "1 ns short of a full bucket: 1 token left, not 2");
    // The fastest rate allowed: one unit per nanosecond.
    let clock = ManualClock::new();
    let fastest = new_limiter(Algorithm::Gcra, &[Limit::per_second(1_000_000_000)], &clock);
    set(&clock, secs(1));
    let d = fastest.check_n(&1, 1_000_000_000);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    assert_eq!(fastest.check(&1).retry_after(), Some(NS));
    clock.advance(NS);
    assert!(fastest.check(&1).is_allowed());
}

#[test]
fn a_cost_above_max_is_cost_too_large_with_every_algorithm() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        set(&clock, secs(5));
        let limiter = new_limiter(algorithm, &[Limit::per_second(10), Limit::per_minute(5)], &clock);
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{algorithm:?}: {d:?}");
        assert_eq!((d.remaining(), d.tightest_limit()), (4, 1), "{algorithm:?}");
        // The first limit whose max is below the cost is named.
        for (cost, index) in [(6, 1), (10, 1), (11, 0), (u64::MAX, 0)] {
            for key in [1, 2] {
                let d = limiter.check_n(&key, cost);
                let what = format!("{algorithm:?}, cost {cost}, key {key}");
                assert!(!d.is_allowed(), "{what}");
                assert_eq!(d.denial(), Some(Denial::CostTooLarge(index)), "{what}");
                assert_eq!(d.retry_after(), None, "{what}: waiting cannot help");
                // The room the key has, unchanged by the refusal.
                assert_eq!(d.remaining(), if key == 1 { 4 } else { 5 }, "{what}");
            }
        }
        assert_eq!(limiter.len(), 1, "{algorithm:?}: no key inserted by a refusal");
        assert_eq!(limiter.check_n(&1, 4).remaining(), 0, "{algorithm:?}: nothing consumed");
        let d = limiter.check_n(&2, 5);
        assert!(d.is_allowed(), "{algorithm:?}: a cost of exactly max fits: {d:?}");
    }
}

#[test]
fn peek_consumes_nothing_and_inserts_no_key_with_every_algorithm() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        set(&clock, secs(5));
        let limiter = new_limiter(algorithm, &[Limit::per_second(10), Limit::per_minute(4)], &clock);
        let d = limiter.peek(&1);
        assert!(d.is_allowed(), "{algorithm:?}");
        assert_eq!((d.remaining(), d.tightest_limit()), (3, 1), "{algorithm:?}: as if admitted");
        assert_eq!(limiter.check_n(&1, 0).remaining(), 4, "{algorithm:?}");
        assert_eq!(limiter.len(), 0, "{algorithm:?}: neither peek nor cost 0 inserts");
        assert_eq!(limiter.check_n(&1, 2).remaining(), 2, "{algorithm:?}");
        for _ in 0..5 {
            assert_eq!(limiter.peek(&1).remaining(), 1, "{algorithm:?}");
            assert_eq!(limiter.check_n(&1, 0).remaining(), 2, "{algorithm:?}");
        }
        // Peek's "as if admitted" is exactly what the check then says.
        let peek = limiter.peek(&1);
        assert_eq!(peek, limiter.check(&1), "{algorithm:?}");
        assert_eq!(limiter.check(&1).remaining(), 0, "{algorithm:?}");
        // A refused peek and a refused check agree, and the refusals took nothing.
        let peek = limiter.peek(&1);
        assert_eq!(peek.denial(), Some(Denial::Limit(1)), "{algorithm:?}");
        assert!(peek.retry_after().is_some_and(|r| r > Duration::ZERO), "{algorithm:?}");
        assert_eq!(peek, limiter.check(&1), "{algorithm:?}");
        assert_eq!(peek, limiter.peek(&1), "{algorithm:?}");
        assert_eq!(limiter.peek(&2).remaining(), 3, "{algorithm:?}: another key is free");
        assert_eq!(limiter.len(), 1, "{algorithm:?}");
    }
}

#[test]
fn reset_forgets_the_key_with_every_algorithm() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        set(&clock, secs(5));
        let limiter = new_limiter(algorithm, &[Limit::per_second(2)], &clock);
        assert!(!limiter.reset(&1), "{algorithm:?}");
        for key in [1, 2] {
            assert_eq!(hammer(&limiter, key, 5, 1), 2, "{algorithm:?}");
        }
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
        assert!(limiter.reset(&1), "{algorithm:?}");
        assert!(!limiter.reset(&1), "{algorithm:?}");
        assert_eq!(limiter.len(), 1, "{algorithm:?}");
        assert_eq!(limiter.peek(&1).remaining(), 1, "{algorithm:?}: key 1 starts empty");
        assert_eq!(limiter.check(&1).remaining(), 1, "{algorithm:?}");
        assert_eq!(limiter.check(&1).remaining(), 0, "{algorithm:?}");
        assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0)), "{algorithm:?}");
        assert_eq!(limiter.check(&2).denial(), Some(Denial::Limit(0)), "{algorithm:?}: key 2 untouched");
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
    }
}

#[test]
fn max_keys_refuses_a_new_key_with_every_algorithm() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        let limiter = Limiter::<u64>::builder()
            .algorithm(algorithm)
            .limit(Limit::per_second(1))
            .max_keys(2)
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(limiter.check(&1).is_allowed(), "{algorithm:?}");
        assert!(limiter.check(&2).is_allowed(), "{algorithm:?}");
        let d = limiter.check(&3);
        assert!(!d.is_allowed(), "{algorithm:?}");
        assert_eq!(d.denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!((d.retry_after(), d.remaining()), (None, 0), "{algorithm:?}");
        assert_eq!(limiter.peek(&3).denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
        // Held keys are checked as usual.
        assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0)), "{algorithm:?}");
        assert!(limiter.reset(&1), "{algorithm:?}");
        assert!(limiter.check(&3).is_allowed(), "{algorithm:?}: room after a reset");
        assert_eq!(limiter.check(&1).denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
    }
}

/// A key is evicted once it has been idle (since `touched`, the last admission that moved
/// to a new slot) for the expiry: `window + precision` (GCRA: `burst + precision`; the
/// fixed window's precision is its window). By then its state is empty, so eviction
/// changes no decision.
#[test]
fn sweep_evicts_an_idle_key_only_once_its_state_is_empty() {
    // 10 per second in slots of 250 ms. Key 1: a unit at T + 100 ms (inserting the key:
    // touched = T + 100 ms), one at T + 600 ms (a new 250 ms slot: touched = T + 600 ms).
    let limit = Limit::new(10, secs(1)).precision(ms(250));
    let t = secs(10);
    // (variant, last instant the state holds a unit, peek's remaining then, first empty
    // instant, eviction instant), after T.
    let cases = [
        // The unit of slot [T + 500, T + 750 ms) is in the window until the slot leaves it at
        // T + 1.75 s (interpolated: with weight 1 ns / 250 ms, rounded up to a unit). Expiry
        // 1 s + 250 ms after T + 600 ms.
        (Variant::Interpolated, ms(1_750) - NS, 8, ms(1_750), ms(1_850)),
        (Variant::Strict, ms(1_750) - NS, 8, ms(1_750), ms(1_850)),
        // Both units in the window [T, T + 1 s): 10 − 2 − 1. The 1 s "slot" of T + 600 ms
        // starts at T, before touched: touched stays T + 100 ms; expiry 1 s + 1 s.
        (Variant::Fixed, ms(1_000) - NS, 7, ms(1_000), ms(2_100)),
        // The unit of T + 600 ms counts while now < T + 1.6 s.
        (Variant::Log, ms(1_600) - NS, 8, ms(1_600), ms(1_850)),
        // Interval 100 ms: TAT T + 200 ms, then T + 700 ms. 1 ns before it the lag is 1 ns:
        // (1 s − 1 ns − 100 ms) / 100 ms rounds down to 8. Expiry 1 s (burst) + 250 ms.
        (Variant::Gcra, ms(700) - NS, 8, ms(700), ms(1_850)),
    ];
    for (variant, busy, busy_room, empty, evict) in cases {
        let clock = ManualClock::new();
        let limiter = variant_limiter(variant, &[limit], &clock);
        set(&clock, t + ms(100));
        assert!(limiter.check(&1).is_allowed(), "{variant:?}");
        set(&clock, t + ms(600));
        assert!(limiter.check(&1).is_allowed(), "{variant:?}");
        assert_eq!(limiter.sweep(), 0, "{variant:?}");
        set(&clock, t + busy);
        assert_eq!(limiter.peek(&1).remaining(), busy_room, "{variant:?}: still holds a unit");
        assert_eq!(limiter.sweep(), 0, "{variant:?}: a key holding a unit is not evicted");
        set(&clock, t + empty);
        assert_eq!(limiter.peek(&1).remaining(), 9, "{variant:?}: empty");
        assert_eq!(limiter.sweep(), 0, "{variant:?}: not idle for the expiry yet");
        set(&clock, t + evict - NS);
        assert_eq!(limiter.sweep(), 0, "{variant:?}: 1 ns short of the expiry");
        // Key 2 is new, so not idle at the eviction instant.
        assert!(limiter.check(&2).is_allowed(), "{variant:?}");
        assert_eq!(limiter.len(), 2, "{variant:?}");
        clock.advance(NS);
        let before = limiter.peek(&1);
        assert_eq!(limiter.sweep(), 1, "{variant:?}: key 1 only");
        assert_eq!(limiter.len(), 1, "{variant:?}");
        assert!(!limiter.reset(&1), "{variant:?}: key 1 was evicted");
        assert_eq!(limiter.peek(&1), before, "{variant:?}: eviction changed a decision");
        assert_eq!(limiter.check(&1).remaining(), 9, "{variant:?}");
        assert_eq!(limiter.len(), 2, "{variant:?}");
    }
}

#[test]
fn log_too_long_and_rate_too_high_are_config_errors_that_say_what_is_wrong() {
    fn build(algorithm: Algorithm, limits: &[Limit]) -> Result<Limiter<u64>, ConfigError> {
        let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(ManualClock::new());
        for limit in limits {
            builder = builder.limit(*limit);
        }
        builder.build()
    }
    fn says(err: &ConfigError, words: &[&str]) {
        let text = err.to_string();
        for w in words {
            assert!(text.contains(w), "{err:?} displays as {text:?}, without {w:?}");
        }
    }

    // SlidingLog: at most MAX_LOG_UNITS per window, in any limit of the limiter.
    assert_eq!(MAX_LOG_UNITS, 4096);
    let second = Limit::per_second(10);
    assert!(build(Algorithm::SlidingLog, &[second, Limit::per_minute(MAX_LOG_UNITS)]).is_ok());
    let too_long = Limit::per_minute(MAX_LOG_UNITS + 1);
    let err = build(Algorithm::SlidingLog, &[second, too_long]).unwrap_err();
    assert_eq!(err, ConfigError::LogTooLong { limit: too_long, most: MAX_LOG_UNITS });
    says(&err, &["4097/min", "log", "4097 units", "4096"]);
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::Gcra] {
        assert!(build(algorithm, &[second, too_long]).is_ok(), "{algorithm:?} has no such bound");
    }

    // Gcra: at most one unit per nanosecond.
    let too_fast = Limit::per_second(2_000_000_000);
    let err = build(Algorithm::Gcra, &[too_fast]).unwrap_err();
    assert_eq!(err, ConfigError::RateTooHigh { limit: too_fast });
    says(&err, &["2000000000/s", "GCRA", "1 ns", "2000000000 per 1s"]);
    assert!(build(Algorithm::Gcra, &[Limit::per_second(1_000_000_000)]).is_ok(), "1 per ns");
    let one_ms = |max| Limit::new(max, ms(1));
    assert!(build(Algorithm::Gcra, &[one_ms(1_000_000)]).is_ok(), "1 per ns");
    let err = build(Algorithm::Gcra, &[second, one_ms(1_000_001)]).unwrap_err();
    assert_eq!(err, ConfigError::RateTooHigh { limit: one_ms(1_000_001) });
    says(&err, &["1000001", "GCRA"]);
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        assert!(build(algorithm, &[too_fast]).is_ok(), "{algorithm:?} has no such bound");
    }
    // The sliding log refuses it too, for its own reason.
    let err = build(Algorithm::SlidingLog, &[too_fast]).unwrap_err();
    assert!(matches!(err, ConfigError::LogTooLong { most: MAX_LOG_UNITS, .. }), "{err:?}");
}

// ---------------------------------------------------------------------------------------
// 5. The sliding log's memory under drops, resets and sweeps.
// ---------------------------------------------------------------------------------------

/// Each key's log is a heap snapshot freed after a grace period; dropping the limiter
/// frees the logs still held (also those reached through the threads' caches). Half the
/// rounds drop the limiter in the main thread after the workers, half in whichever worker
/// finishes last. Sweeps afterwards run the deferred frees here, so a double free would
/// crash this test.
#[test]
fn a_sliding_log_limiter_dropped_with_many_keys_held_does_not_crash() {
    const KEYS: u64 = 1_500;
    const WORKERS: u64 = 4;
    const HOT: u64 = u64::MAX;
    for round in 0..4 {
        let clock = ManualClock::new();
        set(&clock, secs(5));
        let limits = [Limit::per_second(64), Limit::per_minute(MAX_LOG_UNITS)];
        let limiter = Arc::new(new_limiter(Algorithm::SlidingLog, &limits, &clock));
        let barrier = Arc::new(Barrier::new(WORKERS as usize + 1));
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    let mut held = 0;
                    for key in w * KEYS..(w + 1) * KEYS {
                        // Checked again and again: the key's state enters this thread's cache.
                        for cost in [3, 2, 1] {
                            assert!(limiter.check_n(&key, cost).is_allowed(), "key {key}");
                        }
                        if key % 5 == 0 {
                            assert!(limiter.reset(&key), "key {key}");
                        } else {
                            held += 1;
                        }
                        let _ = limiter.check(&HOT);
                    }
                    held
                })
            })
            .collect();
        barrier.wait();
        if round % 2 == 0 {
            let held: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
            assert_eq!(limiter.len(), held + 1, "round {round}");
            assert_eq!(limiter.check_n(&HOT, 0).remaining(), 0, "round {round}: the hot key is full");
            drop(limiter);
        } else {
            drop(limiter);
            for w in workers {
                w.join().unwrap();
            }
        }
        // Run the deferred frees here: a sweep seals what waits, advances the epoch and
        // frees what is two epochs old, once per shard it walks (a thousand keys fill all).
        let flusher = new_limiter(Algorithm::SlidingWindow, &[Limit::per_second(1)], &clock);
        for key in 0..1_000u64 {
            assert!(flusher.check(&key).is_allowed());
        }
        for _ in 0..4 {
            assert_eq!(flusher.sweep(), 0, "round {round}: nothing expired");
        }
    }
}

/// A key whose `Drop` checks fresh keys of the same limiter: memory freed after a grace
/// period runs user code (the key's `Drop`), which must never run under a lock of the
/// table, or it waits for itself. Sweeps evict 20,000 such keys of a sliding log (whose
/// retirement defers the log's snapshot under the shard's mutex, besides the nodes), and
/// each dropped key inserts two more; a watchdog fails the test if it hangs.
#[test]
fn a_key_whose_drop_checks_the_limiter_again_does_not_deadlock_a_sweep() {
    static LIMITER: std::sync::OnceLock<Limiter<Reentrant>> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    thread_local! {
        static DROPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    #[derive(Clone, PartialEq, Eq, Hash)]
    struct Reentrant(u64);
    impl Drop for Reentrant {
        fn drop(&mut self) {
            // Not from a drop this drop causes (the keys it inserts are dropped too).
            if DROPPING.with(|d| d.replace(true)) {
                return;
            }
            if let Some(limiter) = LIMITER.get() {
                for _ in 0..2 {
                    let _ = limiter.check(&Reentrant(NEXT.fetch_add(1, Ordering::Relaxed)));
                }
            }
            DROPPING.with(|d| d.set(false));
        }
    }
    let clock = ManualClock::new();
    let limiter = Limiter::<Reentrant>::builder()
        .algorithm(Algorithm::SlidingLog)
        .limit(Limit::per_second(4))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(LIMITER.set(limiter).is_ok());
    let limiter = LIMITER.get().unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let worker = thread::spawn(move || {
        for round in 0..3u64 {
            for key in 0..20_000 {
                assert!(limiter.check(&Reentrant(round << 32 | key)).is_allowed());
            }
            clock.advance(secs(10));
            let _ = limiter.sweep();
        }
        done.send(()).unwrap();
    });
    let ended = finished.recv_timeout(Duration::from_secs(120));
    assert!(ended.is_ok(), "the sweeps did not finish in 120 s: a deadlock");
    worker.join().unwrap();
}

/// Checkers race on one sliding-log key at a frozen clock while another thread resets it
/// (and sweeps) again and again. A reset starts a new life of the key with an empty log;
/// a generation counter that only the resetting thread bumps (odd while a reset runs)
/// tells which life a check surely fell in: one that read the same even generation before
/// and after. No life may admit more than `max`, the whole round no more than `max` per
/// life, and the last life's room must match what was admitted in it.
#[test]
fn a_sliding_log_key_raced_by_resets_and_sweeps_never_admits_more_than_max_per_life() {
    const MAX: u64 = 20;
    const CHECKERS: usize = 4;
    const RESETS: usize = 60;
    /// The k-th reset waits for `k × CHECKS_PER_LIFE` checks in all; the checkers wait
    /// while they are `SLACK` checks ahead of that (so they cannot starve the resetting
    /// thread on a 2-core machine). Each life thus holds at least
    /// `CHECKS_PER_LIFE − SLACK − CHECKERS` = 26 checks wholly, enough to fill it.
    const CHECKS_PER_LIFE: usize = 40;
    const SLACK: usize = 10;
    let clock = ManualClock::new();
    let limiter = new_limiter(Algorithm::SlidingLog, &[Limit::per_second(MAX).precision(ms(100))], &clock);
    for round in 0..60u64 {
        // The previous round's state (if any) is expired now: the first check or the sweep
        // replaces or evicts it.
        set(&clock, secs(10 * round));
        let generation = AtomicU64::new(0);
        let checks = AtomicUsize::new(0);
        let resets_done = AtomicUsize::new(0);
        let done = AtomicBool::new(false);
        let barrier = Barrier::new(CHECKERS + 1);
        // (generation before, generation after, cost, decision, len() after)
        let seen = Mutex::new(Vec::new());
        let (resets, swept) = thread::scope(|s| {
            for t in 0..CHECKERS {
                let (limiter, generation, checks, resets_done, done, barrier, seen) =
                    (&limiter, &generation, &checks, &resets_done, &done, &barrier, &seen);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    barrier.wait();
                    let mut i = 0;
                    while !done.load(Ordering::Acquire) {
                        let ahead = (resets_done.load(Ordering::Acquire) + 1) * CHECKS_PER_LIFE + SLACK;
                        if checks.load(Ordering::Acquire) >= ahead {
                            thread::yield_now();
                            continue;
                        }
                        let cost = ((t + i) % 2 + 1) as u64;
                        let before = generation.load(Ordering::SeqCst);
                        let d = limiter.check_n(&7, cost);
                        let after = generation.load(Ordering::SeqCst);
                        mine.push((before, after, cost, d, limiter.len()));
                        checks.fetch_add(1, Ordering::Release);
                        i += 1;
                    }
                    seen.lock().unwrap().extend(mine);
                });
            }
            // The resetting thread must not panic: the checkers stop only when it is done.
            let (limiter, generation, checks, resets_done, done, barrier) =
                (&limiter, &generation, &checks, &resets_done, &done, &barrier);
            s.spawn(move || {
                barrier.wait();
                // Races the first checks for the previous round's expired state.
                let (mut resets, mut swept) = (0, limiter.sweep());
                for life in 1..=RESETS {
                    while checks.load(Ordering::Acquire) < life * CHECKS_PER_LIFE {
                        thread::yield_now();
                    }
                    generation.fetch_add(1, Ordering::SeqCst);
                    resets += usize::from(limiter.reset(&7));
                    generation.fetch_add(1, Ordering::SeqCst);
                    swept += limiter.sweep();
                    resets_done.store(life, Ordering::Release);
                }
                // The last life gets its checks too.
                while checks.load(Ordering::Acquire) < (RESETS + 1) * CHECKS_PER_LIFE {
                    thread::yield_now();
                }
                done.store(true, Ordering::Release);
                (resets, swept)
            })
            .join()
            .unwrap()
        });
        let seen = seen.into_inner().unwrap();
        let what = format!("round {round}");
        let last = 2 * RESETS as u64;
        assert_eq!(generation.load(Ordering::SeqCst), last);
        // At a frozen clock no state held now is ever idle: only the previous round's one.
        assert!(swept <= 1, "{what}: {swept} keys swept");
        let mut per_life = vec![0u64; RESETS + 1];
        let (mut total, mut maybe_last) = (0, 0);
        for &(before, after, cost, d, len) in &seen {
            // An insert counts the key before a reset racing it has uncounted the old one.
            assert!(len <= 2, "{what}: len {len} with one key");
            if !d.is_allowed() {
                assert_eq!(d.denial(), Some(Denial::Limit(0)), "{what}: {d:?}");
                assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{what}: {d:?}");
                continue;
            }
            total += cost;
            if before == after && before % 2 == 0 {
                per_life[(before / 2) as usize] += cost;
            } else if after + 1 >= last {
                // Ended after the last reset removed the key (`last - 1`: while the resetting
                // thread had not yet bumped the generation): maybe in the last life.
                maybe_last += cost;
            }
        }
        for (life, &units) in per_life.iter().enumerate() {
            assert!(units <= MAX, "{what}: life {life} admitted {units} > {MAX}");
        }
        assert!(total <= MAX * (1 + resets as u64), "{what}: {total} units in {} lives", 1 + resets);
        assert!(total > 10 * MAX, "{what}: only {total} units admitted: the resets did not interleave");
        // The last life holds its surely admitted units, and at most those of the checks
        // that ended after the last reset began.
        let room = limiter.check_n(&7, 0).remaining();
        let last_life = per_life[RESETS];
        assert!(
            (MAX.saturating_sub(last_life + maybe_last)..=MAX - last_life).contains(&room),
            "{what}: room {room}, {last_life} units surely in the last life, {maybe_last} maybe"
        );
        // A unit surely admitted in the last life inserted the key after the last reset, and
        // nothing removes it at a frozen clock.
        assert!(limiter.len() <= 1, "{what}: len {}", limiter.len());
        if last_life > 0 {
            assert_eq!(limiter.len(), 1, "{what}");
        }
        if round % 2 == 1 {
            assert_eq!(limiter.len(), usize::from(limiter.reset(&7)), "{what}");
            assert_eq!(limiter.len(), 0, "{what}");
        }
        // Otherwise the key stays: the next round starts on its expired state.
    }
}
