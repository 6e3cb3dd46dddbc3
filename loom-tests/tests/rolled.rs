//! Loom model of the rolled word (`Rule::rolled_at`, `carried_sum` and `rollback` in
//! `algorithm/sliding/mod.rs`): a move whose leaving slot holds units takes that slot's
//! ring entry from the carried `sum`, unless a rollback lowered the slot's count, in which
//! case a late closer may have written the higher count it read before, and the move adds
//! the ring up instead. The rollback raises the rolled word before its CAS on `cur` and
//! publishes it with that CAS (Release); a move reads it after its Acquire load of `cur`.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc as StdArc;
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::{OwnedState, Policy};
use slidegate::Limit;
use slidegate_loom_tests::{policy, spawn_take, take, Reached};

const S: u64 = 1_000_000_000;

/// A fresh state (at 0) under a strict `max` per 4 s in 1 s slots, and its policy.
fn strict_per_4_s(max: u64) -> (StdArc<Policy>, Arc<OwnedState>) {
    let limits = [Limit::new(max, Duration::from_secs(4)).precision(Duration::from_secs(1)).strict()];
    let policy = policy(&limits);
    let state = Arc::new(OwnedState::new(&policy, 0));
    (policy, state)
}

/// A strict 11 per 4 s in 1 s slots (the strict window at slot k counts slots k − 4 to k),
/// 7 units in slot 0 (at 0.5 s). R takes one of them back (a check of several limits whose
/// later limit refused it), racing C. C reads its view at 1.5 s (slot 0, 7 units) and is
/// preempted; meanwhile it checks 1 unit at 2.5 s, which closes slot 0 with 6 units if R
/// came first (the sums carry 6), then the preempted check commits: it writes 7 as slot
/// 0's entry (the larger count wins) and its CAS fails. C then checks 1 unit at 3.5 s and
/// 4.5 s, and 9 at 5.5 s. The move to slot 4 takes slot 0 out of the `sum` (it becomes the
/// oldest slot): subtracting its entry, 7, would leave the sum a unit short, which slot
/// 0's 7 as the oldest hides at 4.5 s but nothing hides at 5.5 s, when the 9 would be
/// admitted beside slots 2 to 4's 3 in a window of 11. So they are refused in every
/// interleaving. The move reads the rolled word after its Acquire load of `cur`, which
/// synchronizes with R's CAS when it reads R's count (or a later one). With the rolled
/// word's test taken out of `carried_sum`, or R's CAS Relaxed, this model fails (both
/// checked).
#[test]
fn a_late_closer_after_a_rollback_is_not_subtracted() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let (policy, state) = strict_per_4_s(11);
        assert!(take(&state, &policy, S / 2, 7).is_allowed());
        let mut r = None;
        let mut second = None;
        let late = state.stale_commit(&policy, 3 * S / 2, 1, || {
            r = Some({
                let (state, policy) = (Arc::clone(&state), policy.clone());
                thread::spawn(move || state.rollback(&policy, S / 2, 1))
            });
            // Lets R run first (loom's bounded search does not reorder R's CAS before this
            // thread's load of `cur` on its own).
            thread::yield_now();
            second = Some(take(&state, &policy, 5 * S / 2, 1));
        });
        assert!(!late, "the preempted check's CAS fails: `cur` moved on");
        let second = second.unwrap();
        // The later checks in a thread of their own, which has not yielded: loom explores
        // every store of the rolled word it may read (after a yield it would not explore
        // one the thread had seen before it). Spawning carries this thread's knowledge,
        // and so R's rollback only if this thread's Acquire load of `cur` synchronized
        // with R's CAS.
        let t = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || {
                [(7, 1), (9, 1), (11, 9)].map(|(halves, cost)| take(&state, &policy, halves * S / 2, cost))
            })
        };
        let rest = t.join().unwrap();
        r.unwrap().join().unwrap();
        assert!(second.is_allowed() && rest[..2].iter().all(|d| d.is_allowed()), "{second:?} {rest:?}");
        assert!(!rest[2].is_allowed(), "9 admitted beside 3 units in a window of 11: {rest:?}");
        // At 2.5 s: slot 0 as 6 units if R's rollback came before C closed it, 7 if after.
        REACHED.record(second.remaining() == 3, &[true, false]);
    });
    REACHED.assert_all(&[true, false]);
}

/// A strict 2 per 4 s in 1 s slots, 1 unit in slot 0 (at 0.5 s). A, a check at 2.5 s, reads
/// `cur` (slot 0, 1 unit) and is preempted. Meanwhile a rollback takes that unit back, and
/// W, a check at 2.5 s, closes slot 0 with 0 units (its `sum` for slot 2 counts none) and
/// counts 1 in slot 2; then T, a check at 5.5 s, starts on a thread of its own. A resumes:
/// it writes the 1 it read as slot 0's ring entry and raises slot 2's `sum` to 1 (the
/// larger wins in both), and its CAS on `cur` fails. T's move to slot 5 takes slot 0 out
/// of the sum: if it read A's sum and W's ring entry (0), it would keep A's unit in its sum
/// for as long as the key keeps moving, and refuse T's unit here (2 counted in a window
/// holding 1). A raises the sum with Release and a move loads it with Acquire, so a move
/// that reads A's sum reads A's entry too, sees a leaving unit, and (the rolled word newer
/// than slot 0) adds the ring up. With the `sum`'s raise or its load in `view_at` Relaxed,
/// this model fails (checked).
#[test]
fn a_late_closers_sum_comes_with_its_ring_entry() {
    loom::model(|| {
        let (policy, state) = strict_per_4_s(2);
        assert!(take(&state, &policy, S / 2, 1).is_allowed());
        let mut t = None;
        let late = state.stale_commit(&policy, 5 * S / 2, 1, || {
            state.rollback(&policy, S / 2, 1);
            assert!(take(&state, &policy, 5 * S / 2, 1).is_allowed(), "W");
            t = Some(spawn_take(&state, &policy, 11 * S / 2));
        });
        assert!(!late, "A's CAS fails: `cur` moved on");
        let t = t.unwrap().join().unwrap();
        assert!(t.is_allowed(), "1 unit in the window of 2 at 5.5 s, and T's refused: {t:?}");
    });
}
