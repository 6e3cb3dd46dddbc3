//! Loom models of a policy change racing a check (`KeyState::migrate`, protocol/moving.rs). The key
//! table moves a key's state to the policy's new version under its shard's mutex, but a
//! check that found the old node takes no lock: it may count into the old state while it
//! is being read. Either the migration reads its units, or the
//! check finds the old state retired and starts over on the new one; never both missed,
//! which would let the key exceed its limit.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;

use slidegate::model::{Algorithm, Carry, Outcome, OwnedState};
use slidegate::Limit;
use slidegate_loom_tests::{policy_with, take, Reached, MS};

const NOW: u64 = 500 * MS;

/// How the racing check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Check {
    /// Counted into the old state before the migration read it.
    Counted,
    /// Found the old state retired, started over on the new one.
    Retried,
}

/// A key at `old` with one of its two units used; one thread checks one more unit through
/// the old state while the main thread migrates the state to `new` (a new state, laid out
/// anew or copied). Afterwards the new state is filled: the key's two units may never be
/// exceeded, and with an exact carry they are reached exactly.
fn change_racing_a_check(algorithm: Algorithm, old: Limit, new: Limit, exact: bool) {
    let reached = std::sync::Arc::new(Reached::new());
    let seen = std::sync::Arc::clone(&reached);
    loom::model(move || {
        let (from, to) = (policy_with(&[old], algorithm), policy_with(&[new], algorithm));
        let state = Arc::new(OwnedState::new(&from, 0));
        assert!(take(&state, &from, NOW, 1).is_allowed());
        let racing = {
            let state = Arc::clone(&state);
            let from = std::sync::Arc::clone(&from);
            loom::thread::spawn(move || state.check(&from, NOW, 1, true))
        };
        let moved = state.migrate(&to, NOW, Carry::Conservative);
        let mut admitted = 0;
        let how = match racing.join().unwrap() {
            Outcome::Decided(d) => {
                assert!(d.is_allowed(), "the second unit fits the old limit");
                admitted += 1;
                Check::Counted
            }
            Outcome::Retired => {
                admitted += u64::from(take(&moved, &to, NOW, 1).is_allowed());
                Check::Retried
            }
            other => panic!("unexpected {other:?}"),
        };
        while take(&moved, &to, NOW, 1).is_allowed() {
            admitted += 1;
        }
        // Two units in all (the first was taken before the race): never more.
        assert!(admitted <= 1, "{how:?}: {admitted} more admitted, the key had 1 unit left");
        if exact {
            assert_eq!(admitted, 1, "{how:?}: an exact carry loses nothing");
        }
        seen.record(how, &[Check::Counted, Check::Retried]);
    });
    reached.assert_all(&[Check::Counted, Check::Retried]);
}

/// A new window (1 s to 2 s): the state is laid out anew, its units carried conservatively.
#[test]
fn window_change_sliding() {
    change_racing_a_check(
        Algorithm::SlidingWindow,
        Limit::per_second(2),
        Limit::new(2, Duration::from_secs(2)),
        false,
    );
}

#[test]
fn window_change_fixed() {
    change_racing_a_check(
        Algorithm::FixedWindow,
        Limit::per_second(2),
        Limit::new(2, Duration::from_secs(2)),
        false,
    );
}

#[test]
fn window_change_gcra() {
    change_racing_a_check(
        Algorithm::Gcra,
        Limit::per_second(2),
        Limit::new(2, Duration::from_secs(2)),
        false,
    );
}

#[test]
fn window_change_log() {
    change_racing_a_check(
        Algorithm::SlidingLog,
        Limit::per_second(2),
        Limit::new(2, Duration::from_secs(2)),
        false,
    );
}

/// The same layout, moved by copy (the key table instead points the node at the new
/// version, keeping the words; `migrate` copies when asked): the words are copied after the
/// old state is retired; a check that counted is in the copy.
#[test]
fn same_layout_copied_sliding() {
    change_racing_a_check(Algorithm::SlidingWindow, Limit::per_second(2), Limit::per_second(2), false);
}

#[test]
fn same_layout_copied_fixed() {
    change_racing_a_check(Algorithm::FixedWindow, Limit::per_second(2), Limit::per_second(2), false);
}
