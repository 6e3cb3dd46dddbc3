//! Loom models of expiry, retirement and eviction (`KeyState::retire`, and the retire
//! protocol of `Limiter::decide`, `renew` and `Shared::sweep` in limiter.rs over the key
//! table of table.rs): a check runs with no lock on a node it found, which the table may
//! take out meanwhile (the epoch keeps it allocated; here an `Arc` does); an expired key is
//! replaced, and an idle key removed, only under the shard's lock and only if `retire` (a
//! CAS on `touched`) succeeds; a check that finds its state retired, before or after its
//! commit, starts over on the table. One shard holding one key is modelled as
//! `RwLock<Option<Arc<OwnedState>>>` (the table itself, with its epoch, is not modelled by
//! loom yet), and the limiter's steps are followed one for one.
//! The property: a unit a check admitted is never dropped while it is still inside its
//! window as of the sweeper's clock, and a replacement never throws away another check's
//! unit.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::sync::{Arc, RwLock};
use loom::thread;
use slidegate::model::{Outcome, OwnedState, Policy};
use slidegate::{Decision, Limit};
use slidegate_loom_tests::{decided, policy, take, units, Reached, MS, S};

/// One map shard holding (or not) the one key of the model.
type Shard = RwLock<Option<Arc<OwnedState>>>;

/// `Limiter::check_n` (cost within every max) followed by `Limiter::insert`, on one shard.
/// `cached`: the clone of the key's state this thread's cache holds, if any.
fn check_n(
    shard: &Shard,
    policy: &std::sync::Arc<Policy>,
    now: u64,
    cost: u64,
    cached: Option<&OwnedState>,
) -> Decision {
    // `cache::with_cached`: no lock at all.
    if let Some(state) = cached {
        if let Outcome::Decided(decision) = state.check(policy, now, cost, true) {
            return decision;
        }
    }
    loop {
        // `map.get`: the read guard.
        let guard = shard.read().unwrap();
        let Some(state) = guard.as_ref() else { break };
        if let Outcome::Decided(decision) = state.check(policy, now, cost, true) {
            return decision;
        }
        drop(guard);
        // Expired: `map.get_mut`, retire, replace, and check again.
        if let Some(state) = shard.write().unwrap().as_mut() {
            if state.retire(policy, now) || state.is_retired() {
                *state = Arc::new(OwnedState::new(policy, now));
            }
        }
    }
    // `insert`: `map.entry` holds the write lock throughout.
    let mut guard = shard.write().unwrap();
    match guard.as_mut() {
        Some(state) => {
            if state.retire(policy, now) {
                *state = Arc::new(OwnedState::new(policy, now));
            }
            // The limiter answers `Expired`/`Retired` here with an uncounted admission;
            // under the write lock, right after the retirement, it must be unreachable.
            decided(state.check(policy, now, cost, true))
        }
        None => {
            let state = OwnedState::new(policy, now);
            let decision = decided(state.check(policy, now, cost, true));
            *guard = Some(Arc::new(state));
            decision
        }
    }
}

/// `Shared::sweep` for the one key: under the write lock (`map.remove_if`), evict the key if
/// `retire` succeeds. (The limiter first passes over keys whose in-map copy of `touched` is
/// recent, under the read lock; that copy is never newer than the state's, so the filter
/// only ever sends keys on to `retire`, which decides. The model sends every key.) `true`
/// if it evicted the key.
fn sweep(shard: &Shard, policy: &std::sync::Arc<Policy>, now: u64) -> bool {
    let mut guard = shard.write().unwrap();
    if guard.as_ref().is_some_and(|s| s.retire(policy, now)) {
        *guard = None;
        return true;
    }
    false
}

/// A shard holding a key created at 0 with `prior` units taken at the given times.
fn prepared(policy: &std::sync::Arc<Policy>, prior: &[u64]) -> Arc<Shard> {
    let state = OwnedState::new(policy, 0);
    for &at in prior {
        assert!(take(&state, policy, at, 1).is_allowed());
    }
    Arc::new(RwLock::new(Some(Arc::new(state))))
}

/// Runs a check at `check_at` against a sweep at `sweep_at`; returns the check's decision
/// and whether the sweep evicted the key.
fn check_vs_sweep(
    shard: &Arc<Shard>,
    policy: &std::sync::Arc<Policy>,
    check_at: u64,
    sweep_at: u64,
) -> (Decision, bool) {
    let checker = {
        let (shard, policy) = (Arc::clone(shard), policy.clone());
        thread::spawn(move || check_n(&shard, &policy, check_at, 1, None))
    };
    let sweeper = {
        let (shard, policy) = (Arc::clone(shard), policy.clone());
        thread::spawn(move || sweep(&shard, &policy, sweep_at))
    };
    (checker.join().unwrap(), sweeper.join().unwrap())
}

/// Units the key holds at `now` for the single limit `limit`; panics if the key is gone.
fn held(shard: &Shard, limit: Limit, now: u64) -> u64 {
    let guard = shard.read().unwrap();
    let state = guard.as_ref().expect("the key was evicted although a check counted a unit in it");
    units(state, &[limit], 0, now)
}

/// 2/s (1 s slots, expiry 2 s), full at 0. At 2 s the key is expired: the check must reset
/// it (or re-insert it, if the sweep removed it first) and count its unit exactly once.
#[test]
fn eviction_races_a_check() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(2);
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[0, 0]);
        let (d, evicted) = check_vs_sweep(&shard, &policy, 2 * S, 2 * S);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1, "the units of 0 s must not count at 2 s");
        // Present, holding exactly the new unit (a lost count reads 0, a double one 2).
        assert_eq!(held(&shard, limit, 2 * S), 1);
        REACHED.record(evicted, &[false, true]);
    });
    REACHED.assert_all(&[false, true]);
}

/// As above, but the sweeper's clock says 1.5 s: the key is not expired then (its units
/// are in the window until 2 s), so it must never be evicted, whatever the check does.
#[test]
fn sweep_before_expiry_keeps_the_key() {
    loom::model(|| {
        let limit = Limit::per_second(2);
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[0, 0]);
        let (d, evicted) = check_vs_sweep(&shard, &policy, 2 * S, 1500 * MS);
        assert!(!evicted, "evicted a key that still held units at the sweeper's time");
        assert!(d.is_allowed());
        assert_eq!(held(&shard, limit, 2 * S), 1);
    });
}

/// 2/s strict (expiry 2 s), one unit at 0.9 s in slot [0 s, 1 s), which leaves `touched` at
/// the slot's start, 0. The check at 1.9 s is not expired and counts in [1 s, 2 s) (strict:
/// the 0.9 s unit still counts, 0 left). The sweeper's clock is later, 2.5 s: the key is
/// expired as of then (the 0.9 s unit has left every window), so evicting it *before* the
/// check is legal and the check then starts a fresh key (1 left). But once the check has
/// counted, its unit is inside the window as of 2.5 s and must survive the sweep: the
/// check raised `touched` to 1.9 s before releasing its read lock.
#[test]
fn check_races_a_sweep_with_a_later_clock() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(2).strict();
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[900 * MS]);
        let (d, evicted) = check_vs_sweep(&shard, &policy, 1900 * MS, 2500 * MS);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), u64::from(evicted), "{d:?} evicted: {evicted}");
        // The check's unit, and nothing else, is in the window as of the sweeper's clock.
        assert_eq!(held(&shard, limit, 2500 * MS), 1);
        // As of the check's clock the old unit is still there unless it was evicted.
        assert_eq!(held(&shard, limit, 1900 * MS), 2 - u64::from(evicted));
        REACHED.record(evicted, &[false, true]);
    });
    REACHED.assert_all(&[false, true]);
}

/// Two checks at 2 s on the expired key: both get `Outcome::Expired`, both take the write
/// lock; the second must see the first's replacement (not expired) and not replace it
/// again, or it would wipe a unit the first may already have counted. 3/s so that a lost unit
/// (1), a double count (3) and the right answer (2) all read differently.
#[test]
fn two_checks_reset_an_expired_key() {
    loom::model(|| {
        let limit = Limit::per_second(3);
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[0, 0, 0]);
        let spawn = || {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, 2 * S, 1, None))
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a.is_allowed() && b.is_allowed());
        let mut left = [a.remaining(), b.remaining()];
        left.sort_unstable();
        assert_eq!(left, [1, 2]);
        assert_eq!(held(&shard, limit, 2 * S), 2);
    });
}

/// The expiry test in `check` reads `touched` without the lock, so it is only a hint: X at
/// 1.9 s counts a unit (raising `touched` to 1.9 s) while Y at 2.5 s, on a key last touched
/// at 0, may still read `touched` = 0 and report `Expired`. Y must then re-check under the
/// write lock and, finding X's unit, not replace the state: both units count as of 2.5 s.
/// (If Y replaces it first, X starts over on the new state, which also keeps both.)
#[test]
fn stale_expiry_hint_is_rechecked() {
    loom::model(|| {
        let limit = Limit::per_second(3).strict();
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[900 * MS]);
        let spawn = |now| {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, now, 1, None))
        };
        let (x, y) = (spawn(1900 * MS), spawn(2500 * MS));
        let (x, y) = (x.join().unwrap(), y.join().unwrap());
        assert!(x.is_allowed() && y.is_allowed());
        assert_eq!(held(&shard, limit, 2500 * MS), 2, "X {x:?} Y {y:?}");
    });
}

/// Two checks on an absent key (never seen, or evicted): both miss under the read lock and
/// go to `insert`; the second to take the write lock finds the first's fresh key occupied
/// and must count into it, not replace it (it is not expired).
#[test]
fn two_checks_insert_the_same_key() {
    loom::model(|| {
        let limit = Limit::per_second(3);
        let policy = policy(&[limit]);
        let shard: Arc<Shard> = Arc::new(RwLock::new(None));
        let spawn = || {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, S, 1, None))
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let mut left = [a.remaining(), b.remaining()];
        left.sort_unstable();
        assert_eq!(left, [1, 2], "A {a:?} B {b:?}");
        assert_eq!(held(&shard, limit, S), 2);
    });
}

/// The sweeper's race with a check that found the key's node before the sweep (no lock
/// at all): as `check_races_a_sweep_with_a_later_clock`, but only `retire`'s CAS and
/// the check's SeqCst re-read of `touched` stand between them. Either the retirement comes
/// first and the check, finding its state retired (before or after its commit), starts
/// over and re-inserts the key; or the check's raised `touched` makes the retirement fail.
#[test]
fn cached_check_races_eviction() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(2).strict();
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[900 * MS]);
        let cached = shard.read().unwrap().clone().unwrap();
        let checker = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, 1900 * MS, 1, Some(&cached)))
        };
        let sweeper = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || sweep(&shard, &policy, 2500 * MS))
        };
        let (d, evicted) = (checker.join().unwrap(), sweeper.join().unwrap());
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), u64::from(evicted), "{d:?} evicted: {evicted}");
        assert_eq!(held(&shard, limit, 2500 * MS), 1, "the check's unit was lost");
        assert_eq!(held(&shard, limit, 1900 * MS), 2 - u64::from(evicted));
        REACHED.record(evicted, &[false, true]);
    });
    REACHED.assert_all(&[false, true]);
}

/// A check through the cache and a check through the map, both at 2 s on an expired key
/// (3/s, full at 0). The cached one must not count into the state the other retires and
/// replaces: both units end up in the live state, exactly once each.
#[test]
fn cached_check_races_a_replacement() {
    loom::model(|| {
        let limit = Limit::per_second(3);
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[0, 0, 0]);
        let cached = shard.read().unwrap().clone().unwrap();
        let through_cache = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, 2 * S, 1, Some(&cached)))
        };
        let through_map = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, 2 * S, 1, None))
        };
        let (a, b) = (through_cache.join().unwrap(), through_map.join().unwrap());
        let mut left = [a.remaining(), b.remaining()];
        left.sort_unstable();
        assert_eq!(left, [1, 2], "A {a:?} B {b:?}");
        assert_eq!(held(&shard, limit, 2 * S), 2);
    });
}

/// An explicit `reset` (remove, then `retire_now`) racing a cached check at a frozen time
/// (3/s, one unit at 0): either the reset takes effect after the check, and the check's
/// unit is forgotten with the old state (the key is absent), or the check finds its state
/// retired, before or after its commit, and counts into a fresh key it inserts (which then
/// holds exactly its unit).
#[test]
fn cached_check_races_a_reset() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(3);
        let policy = policy(&[limit]);
        let shard = prepared(&policy, &[0]);
        let cached = shard.read().unwrap().clone().unwrap();
        let checker = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || check_n(&shard, &policy, 0, 1, Some(&cached)))
        };
        let resetter = {
            let (shard, policy) = (Arc::clone(&shard), policy.clone());
            thread::spawn(move || {
                let removed = shard.write().unwrap().take();
                if let Some(state) = removed {
                    state.retire_now(&policy);
                }
            })
        };
        let d = checker.join().unwrap();
        resetter.join().unwrap();
        assert!(d.is_allowed());
        let present = shard.read().unwrap().is_some();
        if present {
            // The check came back after the reset and started a fresh key.
            assert_eq!(d.remaining(), 2);
            assert_eq!(held(&shard, limit, 0), 1);
        } else {
            // The check counted into the old state, which the reset then forgot.
            assert_eq!(d.remaining(), 1);
        }
        REACHED.record(present, &[false, true]);
    });
    REACHED.assert_all(&[false, true]);
}
