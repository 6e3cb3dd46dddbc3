//! Loom models of eviction, replacement and moves on the real eviction path: the shipped
//! `Limiter` on a `ManualClock` (`Limiter::check_n`, `check_all`, `sweep`, `update_policy`
//! in src/limiter/), its key table (table/: shard mutexes, slots, the shard floor) on
//! loom's atomics through the crate's shim, the grace periods of `src/grace.rs` on them,
//! and the retire protocol of protocol/ (`cover`, `retire`, `migrate`).
//! (Resets racing checks are in `table.rs` and `algorithms.rs`.)
//!
//! A thread reads the clock when it first runs (the clock is no loom object, but loom runs
//! one thread at a time): a model spawns a check, yields so that it reads the clock (up to
//! its pin, whose loom-only RMW on a word every pin shares, `grace.rs`, is a point where
//! loom may switch threads), then moves the clock on the main thread and lets loom explore
//! the rest. Each operation's
//! clock bracket (the clock just before it started and just after it returned) is
//! recorded, and [`Linearizable`] asserts that the answers, and what peeks see afterwards,
//! are those of some sequential run: an order that keeps real-time precedence, each
//! operation at a time in its bracket. Each model also records which outcomes it reached,
//! so that a model that never hits its race fails.
//!
//! Run (from the workspace root; about 20 s in all):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test eviction`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::{Algorithm, Carry, Limit, Limiter, ManualClock, PolicyConfig};
use slidegate_loom_tests::{Answer, Linearizable, Op, Reached, Timed};

/// `loom::model` with room for a sweep, which locks each of the table's shards (4 under loom) in turn
/// and then flushes the epoch: more branches than loom's default allows.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(f);
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A limiter of one limit under `algorithm` on a manual clock (no background thread).
fn limiter(algorithm: Algorithm, limit: Limit) -> (Limiter<u64>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().algorithm(algorithm).limit(limit).clock(clock.clone());
    (limiter.build().unwrap(), clock)
}

/// `check_n(key, cost)` with its clock bracket. No loom operation runs between a reading
/// of the clock and the operation next to it: the check reads the first, and the clock
/// has not moved since it returned when the second is read.
fn check(limiter: &Limiter<u64>, clock: &ManualClock, key: u64, cost: u64) -> (Timed, Answer) {
    let start = clock.now();
    let d = limiter.check_n(&key, cost);
    let end = clock.now();
    (Timed { op: Op::Check { key, cost }, start, end }, Some((d.is_allowed(), d.remaining())))
}

/// Every bracket `op` can have, its start and end among `times` (in order).
fn brackets(op: Op, times: &[u64]) -> Vec<Timed> {
    let mut all = Vec::new();
    for (i, &start) in times.iter().enumerate() {
        for &end in &times[i..] {
            all.push(Timed { op, start: ms(start), end: ms(end) });
        }
    }
    all
}

/// What a peek of `key` at the clock's time answers.
fn peek(limiter: &Limiter<u64>, key: u64) -> Answer {
    let d = limiter.peek(&key);
    Some((d.is_allowed(), d.remaining()))
}

/// Race 1. A strict limit of 1 per second; key 1 took its unit at 0 (its `touched`, so it
/// expires at 2 s). A check reads the clock at 1.9 s and is delayed; the sweeper, at 2.5 s,
/// retires and removes the key. At 1.9 s the strict window still holds the unit of 0 s, so
/// the check may only be refused (decided on the old state, at 1.9 s), or admitted at
/// 2.5 s or later, once that unit has left every window; the peek at 3.5 s tells the two
/// admissions apart (one at 2.5 s still counts there, in the oldest slot, which a strict
/// limit counts whole). An admission at 1.9 s, on a fresh state inserted at the check's
/// own, older time, would put two units in one strict window.
#[test]
fn a_check_behind_the_sweepers_clock_decides_no_earlier_than_the_sweep() {
    static LEGAL: Linearizable = Linearizable::new();
    // (the check read 1.9 s, admitted)
    static REACHED: Reached<(bool, bool)> = Reached::new();
    let build = || limiter(Algorithm::SlidingWindow, Limit::per_second(1).strict());
    let prepare = |limiter: &Limiter<u64>, clock: &ManualClock| {
        assert!(limiter.check(&1).is_allowed());
        clock.set(ms(1900));
    };
    let sweep = Timed { op: Op::Sweep, start: ms(2500), end: ms(2500) };
    let x = brackets(Op::Check { key: 1, cost: 1 }, &[1900, 2500]);
    LEGAL.learn(build, prepare, vec![x, vec![sweep]], vec![], vec![(ms(3500), 1)]);
    model(move || {
        let (limiter, clock) = build();
        prepare(&limiter, &clock);
        let limiter = Arc::new(limiter);
        let checker = {
            let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
            thread::spawn(move || check(&limiter, &clock, 1, 1))
        };
        // Lets the checker read its clock (it runs up to its first loom operation).
        thread::yield_now();
        clock.set(ms(2500));
        limiter.sweep();
        let (x, answer) = checker.join().unwrap();
        clock.set(ms(3500));
        let probe = peek(&limiter, 1);
        LEGAL.assert(&[x, sweep], &[answer, None, probe]);
        let admitted = answer.is_some_and(|(allowed, _)| allowed);
        REACHED.record((x.start == ms(1900), admitted), &[(true, false), (true, true), (false, true)]);
    });
    REACHED.assert_all(&[(true, false), (true, true)]);
}

/// Race 1 without the sweeper, where the state holds no time of its own. A limit of 1 per
/// second; key 1 took its unit at `first`. A check S reads the clock at `stale`, when that
/// unit still counts, and is delayed; the main thread then sets the clock to `later`, when
/// the key has expired, and checks L, which replaces the key with a fresh state (under the
/// shard's mutex) and counts in it. S may find the fresh state without taking the mutex,
/// before or after L's unit is in it. A sliding or fixed window's fresh words carry the
/// slot of `later`, which S adopts; a GCRA bucket or an empty log does not, and S needs the
/// shard's floor to decide no earlier than `later` (else both are admitted).
fn stale_check_meets_a_replacement(
    algorithm: Algorithm,
    limit: Limit,
    first: u64,
    stale: u64,
    later: u64,
    legal: &'static Linearizable,
    reached: &'static Reached<(bool, bool)>,
) {
    let build = move || limiter(algorithm, limit);
    let prepare = move |limiter: &Limiter<u64>, clock: &ManualClock| {
        clock.set(ms(first));
        assert!(limiter.check(&1).is_allowed());
        clock.set(ms(stale));
    };
    let one = Op::Check { key: 1, cost: 1 };
    legal.learn(
        build,
        prepare,
        vec![brackets(one, &[stale, later]), brackets(one, &[later])],
        vec![],
        vec![],
    );
    model(move || {
        let (limiter, clock) = build();
        prepare(&limiter, &clock);
        let limiter = Arc::new(limiter);
        let s = {
            let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
            thread::spawn(move || check(&limiter, &clock, 1, 1))
        };
        // Lets S read its clock (it runs up to its first loom operation).
        thread::yield_now();
        clock.set(ms(later));
        let (l, l_answer) = check(&limiter, &clock, 1, 1);
        let (s, s_answer) = s.join().unwrap();
        legal.assert(&[s, l], &[s_answer, l_answer]);
        let admitted = s_answer.is_some_and(|(allowed, _)| allowed);
        reached.record(
            (s.start == ms(stale), admitted),
            &[(true, false), (true, true), (false, false), (false, true)],
        );
    });
    // S at its stale time on the old state (refused), and after the replacement (admitted).
    reached.assert_all(&[(true, false), (true, true)]);
}

#[test]
fn stale_check_meets_a_replacement_sliding() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool)> = Reached::new();
    let strict = Limit::per_second(1).strict();
    stale_check_meets_a_replacement(Algorithm::SlidingWindow, strict, 0, 1900, 2500, &LEGAL, &REACHED);
}

#[test]
fn stale_check_meets_a_replacement_fixed() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool)> = Reached::new();
    // Windows [1 s, 2 s) and [3 s, 4 s); the key expires 2 s after 1.5 s.
    let limit = Limit::per_second(1);
    stale_check_meets_a_replacement(Algorithm::FixedWindow, limit, 1500, 1900, 3500, &LEGAL, &REACHED);
}

#[test]
fn stale_check_meets_a_replacement_gcra() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool)> = Reached::new();
    // The bucket of 0.95 s refills at 1.95 s; the key expires at 2.95 s.
    stale_check_meets_a_replacement(Algorithm::Gcra, Limit::per_second(1), 950, 1900, 3000, &LEGAL, &REACHED);
}

#[test]
fn stale_check_meets_a_replacement_log() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool)> = Reached::new();
    // The unit of 0.95 s counts until 1.95 s; the key expires at 2.95 s.
    let limit = Limit::per_second(1);
    stale_check_meets_a_replacement(Algorithm::SlidingLog, limit, 950, 1900, 3000, &LEGAL, &REACHED);
}

/// Race 3. A limit of 2 (per second, or per fixed window); key 1 took one unit at `first`.
/// A check X reads the clock at `now`, when one more unit fits, and is delayed; the main
/// thread then checks Z at `now`, sets the clock to `later` (the key has expired) and
/// checks Y of cost 2, which replaces the key. X may commit, then be delayed while Z is
/// refused for X's unit and Y replaces the key: X's commit must stand (or Y's retirement
/// fail), never be dropped with X then refused on Y's state, which leaves Z refused for a
/// unit admitted to nobody (no sequential run with Z before Y refuses both X and Z).
fn a_commit_that_loses_to_retirement_stands(
    algorithm: Algorithm,
    (first, now, later): (u64, u64, u64),
    legal: &'static Linearizable,
    reached: &'static Reached<(bool, bool, bool)>,
) {
    let build = move || {
        let two = Limit::per_second(2);
        limiter(algorithm, if algorithm == Algorithm::SlidingWindow { two.strict() } else { two })
    };
    let prepare = move |limiter: &Limiter<u64>, clock: &ManualClock| {
        clock.set(ms(first));
        assert!(limiter.check(&1).is_allowed());
        clock.set(ms(now));
    };
    let (one, two) = (Op::Check { key: 1, cost: 1 }, Op::Check { key: 1, cost: 2 });
    let ops = vec![brackets(one, &[now, later]), brackets(one, &[now]), brackets(two, &[later])];
    // Z returned before Y started.
    legal.learn(build, prepare, ops, vec![(1, 2)], vec![]);
    model(move || {
        let (limiter, clock) = build();
        prepare(&limiter, &clock);
        let limiter = Arc::new(limiter);
        let x = {
            let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
            thread::spawn(move || check(&limiter, &clock, 1, 1))
        };
        // Lets X read its clock (it runs up to its first loom operation).
        thread::yield_now();
        let (z, z_answer) = check(&limiter, &clock, 1, 1);
        clock.set(ms(later));
        let (y, y_answer) = check(&limiter, &clock, 1, 2);
        let (x, x_answer) = x.join().unwrap();
        legal.assert(&[x, z, y], &[x_answer, z_answer, y_answer]);
        let allowed = |a: Answer| a.is_some_and(|(allowed, _)| allowed);
        reached.record(
            (x.start == ms(now), allowed(x_answer), allowed(z_answer)),
            &[
                (true, true, false),
                (true, false, true),
                (true, true, true),
                (false, true, true),
                (false, false, true),
            ],
        );
    });
    // X counted first (Z refused for it), and Z first (X refused).
    reached.assert_all(&[(true, true, false), (true, false, true)]);
}

/// The sliding window, strict 2/s, with the first unit at 0: X's slot starts after
/// `touched`, so X covers it before committing, and Y's retirement then fails.
#[test]
fn a_commit_that_loses_to_retirement_stands_sliding_covered() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool, bool)> = Reached::new();
    a_commit_that_loses_to_retirement_stands(Algorithm::SlidingWindow, (0, 1900, 2500), &LEGAL, &REACHED);
}

/// The first unit at 1.5 s, in X's own slot: `touched` covers it already, so X commits
/// without writing `touched`, and Y (at 3.5 s) may retire the key under X's commit, which
/// stands (its unit has left every window by 3.5 s).
#[test]
fn a_commit_that_loses_to_retirement_stands_sliding() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool, bool)> = Reached::new();
    a_commit_that_loses_to_retirement_stands(Algorithm::SlidingWindow, (1500, 1900, 3500), &LEGAL, &REACHED);
}

#[test]
fn a_commit_that_loses_to_retirement_stands_fixed() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool, bool)> = Reached::new();
    a_commit_that_loses_to_retirement_stands(Algorithm::FixedWindow, (1500, 1900, 3500), &LEGAL, &REACHED);
}

#[test]
fn a_commit_that_loses_to_retirement_stands_gcra() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool, bool)> = Reached::new();
    a_commit_that_loses_to_retirement_stands(Algorithm::Gcra, (1500, 1900, 3500), &LEGAL, &REACHED);
}

#[test]
fn a_commit_that_loses_to_retirement_stands_log() {
    static LEGAL: Linearizable = Linearizable::new();
    static REACHED: Reached<(bool, bool, bool)> = Reached::new();
    a_commit_that_loses_to_retirement_stands(Algorithm::SlidingLog, (1500, 1900, 3500), &LEGAL, &REACHED);
}

/// A move between policy versions: 10/s to 10 per 2 s (a new window, so the key's state is
/// laid out anew and its units carried conservatively, `KeyState::migrate`). Key 1 holds
/// one unit; a check X counts one more on the old state while the main thread changes the
/// policy and checks the key, which moves it. X's unit is carried, or X starts over on the
/// new state: counted once, or twice when the move read X's commit and X then found the
/// state moved (the one conservative case a move allows), never lost.
#[test]
fn a_check_races_a_move_between_policy_versions() {
    static REACHED: Reached<u64> = Reached::new();
    model(|| {
        let (limiter, _clock) = limiter(Algorithm::SlidingWindow, Limit::per_second(10));
        let limiter = Arc::new(limiter);
        assert!(limiter.check(&1).is_allowed());
        let x = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1))
        };
        // Lets X start before the change (a change is no loom operation).
        thread::yield_now();
        let per_2s = PolicyConfig::new([Limit::new(10, Duration::from_secs(2))]);
        limiter.update_policy("default", per_2s, Carry::Conservative).unwrap();
        assert!(limiter.check(&1).is_allowed());
        assert!(x.join().unwrap().is_allowed());
        // A peek's `remaining` is what is left after one more unit.
        let used = 10 - 1 - limiter.peek(&1).remaining();
        REACHED.record(used, &[3, 4]);
    });
    REACHED.assert_all(&[3]);
}

/// Minor (b): a shadow policy's key that comes back retired under `check_all` is counted
/// where the key now lives. Key 2 is under the shadow policy "trial" (2/s strict) with one
/// unit used, key 1 under the enforced default (5/s). `check_all([1, 2])` races a change of
/// "trial" to 2 per 2 s (a new window: key 2's state moves, `migrate`), which the main
/// thread applies to key 2 at once with a peek. The shadow check counts the request for key
/// 2 on the old state (the move carries it) or on the new one, so key 2 ends full: never
/// answered from a fresh state without counting. (It may count twice, if the move read its
/// commit and it then found the state moved: its own answer is then a shadow denial.)
#[test]
fn a_shadow_key_retired_under_check_all_is_counted() {
    static REACHED: Reached<bool> = Reached::new();
    model(|| {
        let clock = ManualClock::new();
        let limiter = Limiter::<u64>::builder()
            .limit(Limit::per_second(5))
            .policy("trial", PolicyConfig::new([Limit::per_second(2).strict()]).shadow(true))
            .resolver(|key: &u64| (*key == 2).then_some("trial"))
            .clock(clock)
            .build()
            .unwrap();
        let limiter = Arc::new(limiter);
        assert!(limiter.check(&2).is_allowed());
        let x = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_all(&[&1, &2], 1).unwrap())
        };
        // Lets the check start before the change (a change is no loom operation).
        thread::yield_now();
        let per_2s = PolicyConfig::new([Limit::new(2, Duration::from_secs(2)).strict()]).shadow(true);
        limiter.update_policy("trial", per_2s, Carry::Conservative).unwrap();
        let _ = limiter.peek(&2);
        let d = x.join().unwrap();
        assert!(d.is_allowed(), "the enforced key admits");
        let left = limiter.peek(&2);
        assert!(left.shadow_denial().is_some(), "key 2 holds both units: {d:?}, then {left:?}");
        REACHED.record(d.shadow_denial().is_some(), &[false, true]);
    });
    REACHED.assert_all(&[false]);
}
