//! Loom models of a snapshot racing checks (feature `serde`, `Limiter::save` and `load`).
//!
//! * A load merging into a held key while a check counts into it (`KeyState::merge_at`,
//!   protocol/snapshot.rs): the merge marks the old state moved before it reads it, so the
//!   check's unit is either read by the merge or counted again on the new state (it finds
//!   the state moved and starts over). Never neither, which would let the key past its
//!   limit. Without the mark (the merge reading the words without `swap(MOVED)`), the
//!   model finds a run where the check's unit is lost and a fourth unit of 3/min is
//!   admitted.
//! * A save while a check moves the key's window on to a new slot (`KeyState::history`):
//!   the record holds what the key counted before the check, or after it, never less. The
//!   third model races the same on the key's counters alone. Both fail if the read skips
//!   the ring (only `cur` read: the closed slot's unit is lost once the check has moved
//!   on). They do not fail with the Acquire load of `cur` in `history` made Relaxed: loom
//!   0.7 did not produce the stale ring read that would allow; the ordering is argued in
//!   prose (`algorithm/sliding/history.rs`, the same argument as a check's view).
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test snapshot`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::{Limit, Limiter, ManualClock};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.max_branches = 50_000;
    model.check(f);
}

fn limiter(limit: Limit, clock: &ManualClock) -> Limiter<u64> {
    Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build().unwrap()
}

/// Key 1 under 3/min holds one unit; a snapshot holding one more is loaded while a check
/// takes a third. Every run must count all three: a fourth is refused.
#[test]
fn a_load_merging_into_a_held_key_loses_no_racing_check() {
    model(|| {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(100));
        let old = limiter(Limit::per_minute(3), &clock);
        assert!(old.check(&1).is_allowed());
        let mut file = Vec::new();
        old.save(&mut file).unwrap();
        let new = Arc::new(limiter(Limit::per_minute(3), &clock));
        assert!(new.check(&1).is_allowed());
        let racing = {
            let new = Arc::clone(&new);
            thread::spawn(move || new.check(&1).is_allowed())
        };
        // Lets the check start first (loom then explores every interleaving from there).
        thread::yield_now();
        let stats = new.load(&file[..]).unwrap();
        assert_eq!(stats.added, 1);
        // Admitted, or (a commit the merge read, then found moved: counted again on the new
        // state, where it no longer fits) refused with its unit counted twice: conservative,
        // as for a policy change (`migrate_at`).
        let _admitted = racing.join().unwrap();
        assert!(!new.check(&1).is_allowed(), "a fourth unit of 3/min admitted: the racing check's was lost");
    });
}

/// Key 1 under 4 per 2 s at 1 s slots holds 2 units from slot 0 and 1 from slot 1; at
/// 2.5 s a check takes one more (moving the window on to slot 2, closing slot 1 into the
/// ring) while the main thread saves. Loaded into a limiter on the same clock, the key
/// must have what the original had just before the check or just after it.
#[test]
fn a_save_racing_a_slot_move_records_the_key_before_or_after_the_check() {
    model(|| {
        let clock = ManualClock::new();
        let limit = Limit::new(4, Duration::from_secs(2)).precision(Duration::from_secs(1));
        let old = Arc::new(limiter(limit, &clock));
        clock.set(Duration::from_millis(500));
        assert!(old.check_n(&1, 2).is_allowed());
        clock.set(Duration::from_millis(1_500));
        assert!(old.check(&1).is_allowed());
        clock.set(Duration::from_millis(2_500));
        let before = old.peek(&1).remaining();
        let racing = {
            let old = Arc::clone(&old);
            thread::spawn(move || old.check(&1).is_allowed())
        };
        thread::yield_now();
        let mut file = Vec::new();
        old.save(&mut file).unwrap();
        let admitted = racing.join().unwrap();
        let after = old.peek(&1).remaining();
        assert_eq!(after, before - u64::from(admitted));
        let new = limiter(limit, &clock);
        new.load(&file[..]).unwrap();
        let loaded = new.peek(&1).remaining();
        assert!(loaded == before || loaded == after, "loaded {loaded}: before {before}, after {after}");
    });
}

/// The same race on the key's counters alone (no table, no grace periods): a check at 2.5 s
/// closes slot 1 (its final count written into the ring before the CAS that moves `cur`)
/// while `history` reads the state. The read must see slot 1's unit whichever `cur` it
/// loads: in `cur` if it loads the old one, in the ring if the new one.
#[test]
fn a_history_read_racing_a_slot_move_misses_no_unit() {
    use slidegate::model::{Algorithm, OwnedState, Policy};
    const S: u64 = 1_000_000_000;
    model(|| {
        let limit = Limit::new(4, Duration::from_secs(2)).precision(Duration::from_secs(1));
        let policy = std::sync::Arc::new(Policy::with_algorithm(&[limit], Algorithm::SlidingWindow).unwrap());
        let state = Arc::new(OwnedState::new(&policy, S / 2));
        assert!(state.check(&policy, S + S / 2, 1, true) != slidegate::model::Outcome::Retired);
        let racing = {
            let (state, policy) = (Arc::clone(&state), std::sync::Arc::clone(&policy));
            thread::spawn(move || state.check(&policy, 2 * S + S / 2, 1, true))
        };
        // Lets the check start before the read (loom explores from there).
        thread::yield_now();
        let history = state.history(2 * S + S / 2).unwrap();
        racing.join().unwrap();
        let units: u64 = history[0].iter().map(|&(_, u)| u).sum();
        assert!(units == 1 || units == 2, "{history:?}");
        assert!(history[0].iter().any(|&(at, u)| u >= 1 && at < 2 * S), "slot 1's unit lost: {history:?}");
    });
}

/// A save reading a sliding log while a policy change (or a load) moves its key: the move
/// marks the state moved, then detaches the log. The read must give the unit, or report
/// the state moved (the save then looks the key up again): never an empty log, which would
/// leave the key out of the save. (Found by a review: `Log::history` returned an empty
/// history for a detached log.)
#[test]
fn a_history_read_racing_a_log_move_drops_no_unit() {
    use slidegate::model::{Algorithm, Carry, OwnedState, Policy};
    const S: u64 = 1_000_000_000;
    model(|| {
        let policy = std::sync::Arc::new(
            Policy::with_algorithm(&[Limit::per_minute(3)], Algorithm::SlidingLog).unwrap(),
        );
        let newer = std::sync::Arc::new(
            Policy::with_algorithm(&[Limit::per_minute(4)], Algorithm::SlidingLog).unwrap(),
        );
        let state = Arc::new(OwnedState::new(&policy, S));
        assert!(state.check(&policy, 2 * S, 1, true) != slidegate::model::Outcome::Retired);
        let mover = {
            let (state, newer) = (Arc::clone(&state), std::sync::Arc::clone(&newer));
            thread::spawn(move || {
                let _moved = state.migrate(&newer, 3 * S, Carry::Conservative);
            })
        };
        thread::yield_now();
        let history = state.history(3 * S);
        mover.join().unwrap();
        if let Some(history) = history {
            let units: u64 = history[0].iter().map(|&(_, u)| u).sum();
            assert_eq!(units, 1, "the key read as holding nothing: left out of the save ({history:?})");
        }
    });
}
