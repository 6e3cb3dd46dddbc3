//! Loom models of the key table (`table.rs`) and the limiter's lookup path over it
//! (`Limiter::check_n`, `renew`, `insert`, `sweep`, `reset`, `update_policy` in src/limiter/):
//! the real `Limiter` on a `ManualClock`, its shards' mutexes and slots on loom's atomics
//! through the crate's shim, and the grace periods of `src/grace.rs` on them too. Each
//! model races a check against a change of the table (an eviction, a reset, a policy change that repoints the node, an insert that rebuilds the shard's array,
//! another insert of the same key) and asserts that every admission is counted exactly once
//! and that the key is held as often as it should be. Use after free would show as a loom
//! access to a dropped atomic.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::{Carry, Limit, Limiter, ManualClock, PolicyConfig};

/// `loom::model` with room for a sweep, which locks each of the table's shards (4 under loom) in turn
/// and then flushes the epoch: more branches than loom's default allows.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    model.check(f);
}

/// A limiter of `max` per second on a manual clock (no background thread).
fn limiter(max: u64) -> (Arc<Limiter<u64>>, ManualClock) {
    let clock = ManualClock::new();
    let limiter =
        Limiter::<u64>::builder().limit(Limit::per_second(max)).clock(clock.clone()).build().unwrap();
    (Arc::new(limiter), clock)
}

/// Units key `key` holds now, from a peek: `max - 1 - remaining` (a peek's `remaining` is
/// what would be left after one more unit).
fn used(limiter: &Limiter<u64>, key: u64, max: u64) -> u64 {
    let peek = limiter.peek(&key);
    if !peek.is_allowed() {
        return max;
    }
    max - 1 - peek.remaining()
}

/// A check on an expired key (its unit 2 s old) against a sweep at the same time: the sweep
/// may retire and remove the node the check found. The check is admitted and its unit is
/// counted once, in whichever node ends up holding the key.
#[test]
fn check_races_an_eviction() {
    model(|| {
        let (limiter, clock) = limiter(2);
        assert!(limiter.check(&1).is_allowed());
        clock.advance(Duration::from_secs(2));
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1).is_allowed())
        };
        limiter.sweep();
        assert!(checker.join().unwrap(), "a fresh window admits");
        assert_eq!(limiter.len(), 1, "the key the check counted is held");
        assert_eq!(used(&limiter, 1, 2), 1, "its unit, once");
    });
}

/// A check against a reset of the same key: the check's unit is either wiped by the reset
/// (the reset came after) or counted in a fresh node (before); never counted in a node that
/// is gone while the key is held.
#[test]
fn check_races_a_reset() {
    model(|| {
        let (limiter, _clock) = limiter(3);
        assert!(limiter.check(&1).is_allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1).is_allowed())
        };
        assert!(limiter.reset(&1) || limiter.len() == 1);
        assert!(checker.join().unwrap());
        match limiter.len() {
            0 => {}
            1 => assert!(used(&limiter, 1, 3) <= 1, "after a reset at most the racing unit is left"),
            n => panic!("{n} keys held"),
        }
    });
}

/// Two first checks of one key: one inserts, the other finds its node; both count in it.
#[test]
fn two_inserts_of_one_key() {
    model(|| {
        let (limiter, _clock) = limiter(5);
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&9).is_allowed())
        };
        assert!(limiter.check(&9).is_allowed());
        assert!(other.join().unwrap());
        assert_eq!(limiter.len(), 1);
        assert_eq!(used(&limiter, 9, 5), 2);
    });
}

/// A check against a policy change that keeps the layout (2/s to 3/s): the node is repointed
/// at the new version, its counters kept. With one unit used before, the check's unit makes
/// two, counted once whichever version it ran under.
#[test]
fn check_races_a_repoint() {
    model(|| {
        let (limiter, _clock) = limiter(2);
        assert!(limiter.check(&1).is_allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1).is_allowed())
        };
        limiter.update_policy("default", PolicyConfig::new([Limit::per_second(3)]), Carry::Reset).unwrap();
        assert!(checker.join().unwrap());
        assert_eq!(used(&limiter, 1, 3), 2);
    });
}

/// A check of a held key against the insert of another key of the same shard that rebuilds
/// the shard's array (the 7th key of a shard of 8 slots): the check may run on the old array
/// while the node moves to the new one; its unit is counted once and both keys are held.
#[test]
fn check_races_a_rebuild() {
    model(|| {
        let (limiter, _clock) = limiter(4);
        // Keys of key 1's shard (the hasher's seeds are fixed under loom).
        let shard = limiter.shard_of(&1);
        let mates: Vec<u64> = (2..).filter(|k| limiter.shard_of(k) == shard).take(6).collect();
        for key in [1].iter().chain(&mates[..5]) {
            assert!(limiter.check(key).is_allowed());
        }
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1).is_allowed())
        };
        assert!(limiter.check(&mates[5]).is_allowed());
        assert!(checker.join().unwrap());
        assert_eq!(limiter.len(), 7);
        assert_eq!(used(&limiter, 1, 4), 2);
        assert_eq!(used(&limiter, mates[5], 4), 1);
    });
}

/// A check whose clock read is behind the sweeper's: the check at 1.9 s counts a unit that
/// is still in the (strict, 1 s) window at 2.5 s, when the sweep finds the key's last unit
/// (at 0) expired and removes it. The sweep's retirement (a CAS on `touched`) and the check's
/// cover of its slot in `touched`, before it commits, decide together: either the sweep
/// finds the cover and keeps the key, or the check finds its node retired before committing
/// and counts in a fresh one, at the sweeper's time or later (the shard's floor). Without the
/// retirement the unit would be lost with the node.
#[test]
fn check_behind_the_sweepers_clock() {
    model(|| {
        let clock = ManualClock::new();
        let limit = Limit::per_second(2).strict();
        let limiter = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build().unwrap();
        let limiter = Arc::new(limiter);
        assert!(limiter.check(&1).is_allowed());
        clock.set(Duration::from_millis(1900));
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&1).is_allowed())
        };
        // The clock is no loom object: let the checker run up to its first loom operation
        // (it reads the clock before), so it checks at 1.9 s.
        thread::yield_now();
        clock.set(Duration::from_millis(2500));
        limiter.sweep();
        assert!(checker.join().unwrap());
        assert_eq!(limiter.len(), 1, "the unit counted at 1.9 s or 2.5 s is still in the window");
        assert_eq!(used(&limiter, 1, 2), 1);
    });
}

/// Minor (a): two first checks of one key on a table that holds one key. One inserts it
/// (its reservation of room fills the table) while holding the shard's mutex; the other,
/// finding the table full and the mutex busy, must wait for that insert and count in the
/// key, not be refused `TooManyKeys`. A truly new key is still refused at once.
#[test]
fn a_key_being_inserted_is_not_refused_as_too_many_keys() {
    model(|| {
        let clock = ManualClock::new();
        let limiter =
            Limiter::<u64>::builder().limit(Limit::per_second(5)).max_keys(1).clock(clock).build().unwrap();
        let limiter = Arc::new(limiter);
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check(&9))
        };
        let mine = limiter.check(&9);
        let other = other.join().unwrap();
        assert!(mine.is_allowed() && other.is_allowed(), "{mine:?} {other:?}");
        assert_eq!(limiter.len(), 1);
        assert_eq!(used(&limiter, 9, 5), 2);
        assert_eq!(limiter.check(&8).denial(), Some(slidegate::Denial::TooManyKeys));
    });
}
