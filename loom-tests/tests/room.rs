//! Loom models of a full table making room (`src/table/room.rs`): the shipped `Limiter` on
//! a `ManualClock` with `max_keys(1)`, its table on loom's atomics through the crate's
//! shim. A new key's check takes the place of an idle key (`KeyState::retire`, the floor,
//! the slot's tombstone, under the idle key's shard mutex, taken with `try_lock` when it is
//! another shard) while a check of the idle key renews it (`Limiter::renew`, the same
//! mutex) and counts in it.
//!
//! Whatever the interleaving, exactly one of the two checks is admitted: the table holds
//! one key, that key's unit is in it, and the other check is refused `TooManyKeys`. Two
//! admissions would be a key over `max_keys` or a count lost with a replaced state; none
//! would be room lost (an idle key retired with nothing inserted in its place). Both
//! winners must be reached, so a model that never races fails.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test room`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::{Denial, Limit, Limiter, ManualClock, PolicyConfig};
use slidegate_loom_tests::{model_with_branches as model, Reached};

/// Key 1 took its unit at 0 and is idle from 2 s (a one-slot window of 1 s expires two
/// slots after its unit); at 2.5 s a check of key 1 (it renews the expired state) races a
/// check of `other`, a new key that needs key 1's place. `same_shard` picks `other` in key
/// 1's shard (the search runs under the mutex the insert holds) or in another (the search
/// takes key 1's shard with `try_lock`).
fn idle_key_races_a_new_key(same_shard: bool, reached: &'static Reached<bool>) {
    model(move || {
        let clock = ManualClock::new();
        let limiter = Limiter::<u64>::builder()
            .limit(Limit::per_second(1))
            .max_keys(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        let shard = limiter.shard_of(&1);
        let other = (2..).find(|k| (limiter.shard_of(k) == shard) == same_shard).unwrap();
        assert!(limiter.check(&1).is_allowed());
        clock.set(Duration::from_millis(2500));
        let limiter = Arc::new(limiter);
        let renewing = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1))
        };
        let new = limiter.check(&other);
        let old = renewing.join().unwrap();
        assert_ne!(old.is_allowed(), new.is_allowed(), "key 1: {old:?}; key {other}: {new:?}");
        let (winner, loser) = if old.is_allowed() { ((1, old), new) } else { ((other, new), old) };
        assert_eq!(loser.denial(), Some(Denial::TooManyKeys), "the loser: {loser:?}");
        assert_eq!(limiter.len(), 1);
        // The winner's unit is in the table: its next check is refused by its limit.
        assert_eq!(limiter.check(&winner.0).denial(), Some(Denial::Limit(0)), "winner {}", winner.0);
        reached.record(old.is_allowed(), &[true, false]);
    });
    reached.assert_all(&[true, false]);
}

#[test]
fn an_idle_key_renewed_while_a_new_key_in_its_shard_takes_its_place() {
    static REACHED: Reached<bool> = Reached::new();
    idle_key_races_a_new_key(true, &REACHED);
}

#[test]
fn an_idle_key_renewed_while_a_new_key_in_another_shard_takes_its_place() {
    static REACHED: Reached<bool> = Reached::new();
    idle_key_races_a_new_key(false, &REACHED);
}

/// The floor: `max_keys(2)`, a strict 1/s limit for key 1 and a policy of 1 per 100 ms for
/// key 3 (in another shard). Both took a unit at 0: key 3 is idle from 0.2 s, key 1 from
/// 2 s. Key 1's check S reads the clock at 1.9 s and is delayed; at 2.5 s a check of a new
/// key in key 1's shard takes key 1's place. If S then finds key 1 gone, it inserts it
/// again, in key 3's place (idle at S's 1.9 s too): the fresh state must be created at 2.5 s
/// or later, the time key 1 left, not at S's 1.9 s, so that S's unit, if admitted, counts
/// where a check after 2.5 s would put it: a peek at 3.5 s (a strict window of [2.5 s,
/// 3.5 s]) then refuses. Both S's refusal (on the old state, at 1.9 s) and its admission
/// must be reached.
#[test]
fn a_check_delayed_across_its_keys_removal_decides_no_earlier_than_it() {
    static REACHED: Reached<bool> = Reached::new();
    model(|| {
        let clock = ManualClock::new();
        let probe =
            Limiter::<u64>::builder().limit(Limit::per_second(1)).clock(clock.clone()).build().unwrap();
        let shard = probe.shard_of(&1);
        let other = (2..).find(|k| probe.shard_of(k) == shard).unwrap();
        let third = (2..).find(|k| probe.shard_of(k) != shard).unwrap();
        drop(probe);
        let limiter = Limiter::<u64>::builder()
            .policy("strict", PolicyConfig::new([Limit::per_second(1).strict()]))
            .policy("short", PolicyConfig::new([Limit::new(1, Duration::from_millis(100))]))
            .resolver(move |key: &u64| (*key == third).then_some("short"))
            .max_keys(2)
            .clock(clock.clone())
            .build()
            .unwrap();
        assert_eq!(limiter.shard_of(&1), shard, "one hasher for every limiter under loom");
        assert!(limiter.check(&1).is_allowed());
        assert!(limiter.check(&third).is_allowed());
        clock.set(Duration::from_millis(1900));
        let limiter = Arc::new(limiter);
        let delayed = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1))
        };
        // Lets S read its clock (it runs up to its first loom operation).
        thread::yield_now();
        clock.set(Duration::from_millis(2500));
        let _ = limiter.check(&other);
        let s = delayed.join().unwrap();
        clock.set(Duration::from_millis(3500));
        if s.is_allowed() {
            assert!(!limiter.peek(&1).is_allowed(), "S's unit was counted before key 1 left: {s:?}");
        }
        REACHED.record(s.is_allowed(), &[true, false]);
    });
    REACHED.assert_all(&[true, false]);
}
