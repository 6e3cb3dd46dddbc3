//! A refusal's `retry_after` while another thread moves the key on. The check's view is
//! read, then a racing check moves the key on by a few slots (overwriting ring positions)
//! before `admissible_at` re-reads the ring. An overwritten position (newer tag) counts as 0
//! units leaving the window, so the window does not drain and the answer falls through to
//! up to a whole window later. Found by `tools/src/bin/soak.rs`. A check that meets a reused
//! position now starts over from fresh views, which adopt the later slot; but at most
//! twice (`STALE_RETRIES`), since the racing check may be preempted in the middle of its
//! move and a check must never wait for another. So the model asserts what always holds:
//! admitted, or refused with a wait never earlier than the exact one of some linearization
//! and at most a window later.
//!
//! 3 per 3 s in 1 s slots, interpolated. Before the race: 2 units at 0.5 s (slot 0), 1 at
//! 1.2 s (slot 1). A checks 1 unit at 1.5 s: 1 + 2 + 1 > 3, refused. B admits 1 at 3.6 s
//! (closes slot 1, skips 2) and 1 at 5.5 s (closes 3, skips 4, whose ring position is slot
//! 0's). Every linearization gives A: refused with retry 2.0 s (before B), refused with
//! 2.5 s (after B's first), or admitted (after both). Loom found A refused with 3.5 s.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::{Outcome, OwnedState, Policy};
use slidegate::{Decision, Limit};

const MS: u64 = 1_000_000;

fn take(state: &OwnedState, policy: &Policy, now: u64, cost: u64) -> Decision {
    match state.check(policy, now, cost, true) {
        Outcome::Decided(d) => d,
        other => panic!("{other:?}"),
    }
}

#[test]
fn interpolated_retry_after_with_a_ring_overwritten_mid_check() {
    let limit = Limit::new(3, Duration::from_secs(3)).precision(Duration::from_secs(1));
    // The three linearizations, one after another (one thread: one execution).
    loom::model(move || {
        let policy = Policy::new(&[limit]).unwrap();
        let sequential = |b_first: usize| {
            let s = OwnedState::new(&policy, 0);
            assert!(take(&s, &policy, 500 * MS, 2).is_allowed());
            assert!(take(&s, &policy, 1200 * MS, 1).is_allowed());
            for (i, at) in [3600, 5500].into_iter().enumerate().take(b_first) {
                assert!(take(&s, &policy, at * MS, 1).is_allowed(), "B's check {i}");
            }
            take(&s, &policy, 1500 * MS, 1)
        };
        assert_eq!(sequential(0).retry_after(), Some(Duration::from_millis(2000)));
        assert_eq!(sequential(1).retry_after(), Some(Duration::from_millis(2500)));
        assert!(sequential(2).is_allowed());
    });
    loom::model(move || {
        let policy = Policy::new(&[limit]).unwrap();
        let state = Arc::new(OwnedState::new(&policy, 0));
        assert!(take(&state, &policy, 500 * MS, 2).is_allowed());
        assert!(take(&state, &policy, 1200 * MS, 1).is_allowed());
        let b = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || {
                assert!(take(&state, &policy, 3600 * MS, 1).is_allowed());
                assert!(take(&state, &policy, 5500 * MS, 1).is_allowed());
            })
        };
        let a = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || take(&state, &policy, 1500 * MS, 1))
        };
        let a = a.join().unwrap();
        b.join().unwrap();
        let wait = a.retry_after().unwrap_or_default();
        let bounded =
            a.is_allowed() || (Duration::from_millis(2000)..=Duration::from_millis(3500)).contains(&wait);
        assert!(bounded, "A (1 unit at 1.5 s) decided {a:?}: earlier than any linearization, or too late");
    });
}
