//! A check whose clock reading is stale moves its key to a new policy version (`renew` ->
//! `move_state` -> `KeyState::migrate_at`). The move must be timed no earlier than the
//! commits it carries: with `Carry::Conservative` the carried units are recorded "as used at
//! the move", so a move timed at the stale check's own reading would record them in a slot
//! long before the one they were counted in, and they would leave the new window early.
//!
//! Key 1 under 2 per 10 s strict (1 s slots). A check C reads the clock at 0 s and is
//! delayed. The main thread checks D, 2 units at 16.5 s (admitted: a unit C may have taken
//! at 0 s has left the window), changes the policy to 2 per 20 s strict (a new window: the
//! state is laid out anew with Conservative carry), joins C and checks E, 1 unit at 21.5 s.
//! D and E are 5 s apart: three units inside one 10 s interval, over both the old limit and
//! the new one, so no correct run admits both. A move timed at C's 0 s would record D's
//! units in slot 0 of the new state, with `touched` = 0: by 21.5 s they would have left the
//! new window (the new state even expired), and E would be admitted. The limiter times the
//! move by its clock, read after the old state's words, so the units land at 16.5 s.
//!
//! Run: `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2
//! CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test stale_move`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::{Algorithm, Carry, Limit, Limiter, ManualClock, PolicyConfig};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(f);
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn run(algorithm: Algorithm, old: Limit, new: Limit) {
    model(move || {
        let clock = ManualClock::new();
        let limiter =
            Limiter::<u64>::builder().algorithm(algorithm).limit(old).clock(clock.clone()).build().unwrap();
        let limiter = Arc::new(limiter);
        let c = {
            let (limiter, clock) = (Arc::clone(&limiter), clock.clone());
            thread::spawn(move || {
                let start = clock.now();
                let d = limiter.check(&1);
                (start, d)
            })
        };
        // Lets C read its clock (0 s) before the main thread moves it on.
        thread::yield_now();
        clock.set(ms(16_500));
        let d = limiter.check_n(&1, 2);
        limiter.update_policy("default", PolicyConfig::new([new]), Carry::Conservative).unwrap();
        let (c_start, c) = c.join().unwrap();
        clock.set(ms(21_500));
        let e = limiter.check(&1);
        assert!(
            !(d.is_allowed() && e.is_allowed()),
            "over-admission: D (2 units at 16.5 s) and E (1 unit at 21.5 s) both admitted under \
             {old} then {new}; C read the clock at {c_start:?} and answered {c:?}"
        );
    });
}

#[test]
fn stale_check_moves_the_key_at_its_old_time_sliding_strict() {
    run(
        Algorithm::SlidingWindow,
        Limit::new(2, Duration::from_secs(10)).strict(),
        Limit::new(2, Duration::from_secs(20)).strict(),
    );
}

#[test]
fn stale_check_moves_the_key_at_its_old_time_log() {
    run(
        Algorithm::SlidingLog,
        Limit::new(2, Duration::from_secs(10)),
        Limit::new(2, Duration::from_secs(20)),
    );
}
