//! Loom models of slot rotation (`commit`, `raise`, `view_at` in algorithm/sliding/mod.rs): the thread
//! that moves a limit's `cur` word to a later slot first writes the closing slot's count
//! (and, on a jump, the skipped slots as empty) into the ring, then CASes `cur`. A thread
//! still counting in the old slot races it. No unit may be lost or counted twice, and a unit
//! may land only in its own slot or in a later slot it adopted because another thread had
//! already moved time on.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use slidegate::model::OwnedState;
use slidegate::{Decision, Limit};
use slidegate_loom_tests::{peek, policy, spawn_take, take, units, Reached, MS};

/// A (stale) at `a`, B at the later `b`, on a state created at `prior` that already holds
/// one unit taken then. Returns the state and both decisions.
fn race(limit: Limit, prior: u64, a: u64, b: u64) -> (Arc<OwnedState>, Decision, Decision) {
    let policy = policy(&[limit]);
    let state = Arc::new(OwnedState::new(&policy, prior));
    assert!(take(&state, &policy, prior, 1).is_allowed());
    let spawn = |now| spawn_take(&state, &policy, now);
    let (ta, tb) = (spawn(a), spawn(b));
    let (da, db) = (ta.join().unwrap(), tb.join().unwrap());
    (state, da, db)
}

/// 10 per 2 s in 1 s slots, strict (whole slots, so counts are exact integers). The prior
/// unit and A (0.5 s) are in slot [0 s, 1 s); B (1.5 s) moves `cur` to [1 s, 2 s) and must
/// close [0 s, 1 s) with its final count.
#[test]
fn slot_rotation_races_an_increment() {
    static REACHED: Reached<(u64, u64)> = Reached::new();
    loom::model(|| {
        let limit = Limit::new(10, Duration::from_secs(2)).precision(Duration::from_secs(1)).strict();
        let (state, da, db) = race(limit, 200 * MS, 500 * MS, 1500 * MS);
        assert!(da.is_allowed() && db.is_allowed());
        // Whichever went second saw the other's unit: 10 - (1 prior + 1) - 1 = 7, the first 8.
        let mut left = [da.remaining(), db.remaining()];
        left.sort_unstable();
        assert_eq!(left, [7, 8], "A {da:?} B {db:?}");
        // At 1.5 s the window still covers both slots: all 3 units, once each. The cost-1
        // peek reports remaining as if it were admitted: 10 - 3 - 1.
        assert_eq!(peek(&state, &policy(&[limit]), 1500 * MS).remaining(), 6);
        assert_eq!(units(&state, &[limit], 0, 1500 * MS), 3);
        // At 3.5 s slot [0 s, 1 s) has left: only B and, if A's unit was adopted into B's
        // slot, A. A that went second (7 left) always is; A that went first (8 left) is
        // too when it met B's `sum` for [1 s, 2 s), written before B's CAS, and adopted
        // that slot (its CAS then closed [0 s, 1 s) itself, and B counted after it).
        let late = units(&state, &[limit], 0, 3500 * MS);
        REACHED.record((da.remaining(), late), &[(8, 1), (8, 2), (7, 2)]);
    });
    REACHED.assert_all(&[(8, 1), (8, 2), (7, 2)]);
}

/// Two closers and an increment: B1 and B2 (1.5 s) both move `cur` from [0 s, 1 s) to
/// [1 s, 2 s) while A (0.5 s) counts in [0 s, 1 s). A closer that loaded `cur` before A's
/// unit writes a stale, smaller count into the ring; its `raise` must not overwrite the
/// winner's larger one, whichever order the ring writes land in.
#[test]
fn two_closers_race_an_increment() {
    static REACHED: Reached<u64> = Reached::new();
    loom::model(|| {
        let limit = Limit::new(10, Duration::from_secs(2)).precision(Duration::from_secs(1)).strict();
        let policy = policy(&[limit]);
        let state = Arc::new(OwnedState::new(&policy, 200 * MS));
        assert!(take(&state, &policy, 200 * MS, 1).is_allowed());
        let spawn = |now| spawn_take(&state, &policy, now);
        let handles = [spawn(500 * MS), spawn(1500 * MS), spawn(1500 * MS)];
        let d: Vec<Decision> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // Every window at 0.5 s or 1.5 s covers both slots, so the three saw 1, 2 and 3 units.
        let mut left: Vec<u64> = d.iter().map(Decision::remaining).collect();
        left.sort_unstable();
        assert_eq!(left, [6, 7, 8], "{d:?}");
        assert_eq!(units(&state, &[limit], 0, 1500 * MS), 4);
        // At 3.5 s only [1 s, 2 s) counts: B1, B2, and A if it was adopted into their slot,
        // which it must be if it came after a B (less than 8 left), and may be if it met a
        // B's `sum` for that slot before the B's CAS.
        let late = units(&state, &[limit], 0, 3500 * MS);
        assert!(late == 3 || d[0].remaining() == 8, "{d:?}");
        REACHED.record(late, &[2, 3]);
    });
    REACHED.assert_all(&[2, 3]);
}

/// 10 per 1 s in 0.5 s slots (2 slots, a ring of 3), strict. The prior unit (0.4 s) and A
/// (0.45 s) are in slot 0 = [0, 0.5 s); B (1.6 s) jumps from slot 0 to slot 3 = [1.5 s, 2 s),
/// writing slot 0's count and slots 1 and 2 as empty: all three ring positions, including
/// the two A reads for its own window, race A. (The key was touched at 0.4 s, so at 1.6 s
/// it is not expired: the expiry is window + one slot = 1.5 s.)
///
/// Where A's unit may legally land (read off `view`/`view_at`):
/// * slot 0, if A's CAS on `cur` comes before B's (B then closes slot 0 with it);
/// * slot 2, if A met B's "slot 1, empty" in the ring alone: `Hist::Newer(1)` would adopt
///   slot 2 (A's CAS must still beat B's, as A closes slot 0 itself). Legal, but no longer
///   reached: the ring of 3 entries is one word, which B writes (slots 0 to 2) in one CAS;
/// * slot 3, if A meets B's "slot 2" in the ring (adopts 3) or B's CAS (`cur` is at 3).
///
/// Never slot 1, and always exactly once. Counts in strict windows of 2 slots + current:
///
/// | A in            | at 1.6 s (slots 1-3) | at 2.2 s (2-4) | at 2.7 s (3-5) | A left | B left |
/// |-----------------|----------------------|----------------|----------------|--------|--------|
/// | 0, before B     | 1                    | 1              | 1              | 8      | 9      |
/// | 2, before B     | 2                    | 2              | 1              | 8      | 8      |
/// | 3, before B     | 2                    | 2              | 2              | 9      | 8      |
/// | 3, after B      | 2                    | 2              | 2              | 8      | 9      |
///
/// "Left" is each decision's `remaining()`, 10 minus the units its window held minus 1: A's
/// window holds the prior unit unless A adopted slot 3, where it holds B's unit only if B
/// went first; B's window (slots 1-3) holds A's unit only if A went first into slot 2 or 3.
#[test]
fn slot_jump_races_an_increment() {
    // (count at 1.6 s, at 2.2 s, at 2.7 s, A's remaining, B's remaining)
    const LEGAL: [(u64, u64, u64, u64, u64); 4] = [
        (1, 1, 1, 8, 9), // A in slot 0, before B
        (2, 2, 1, 8, 8), // A adopted slot 2 from the ring, before B
        (2, 2, 2, 9, 8), // A adopted slot 3 from the ring, before B
        (2, 2, 2, 8, 9), // A in slot 3 after B
    ];
    static REACHED: Reached<(u64, u64, u64, u64, u64)> = Reached::new();
    loom::model(|| {
        let limit = Limit::new(10, Duration::from_secs(1)).precision(Duration::from_millis(500)).strict();
        let (state, da, db) = race(limit, 400 * MS, 450 * MS, 1600 * MS);
        assert!(da.is_allowed() && db.is_allowed());
        let at = |ms| units(&state, &[limit], 0, ms * MS);
        let outcome = (at(1600), at(2200), at(2700), da.remaining(), db.remaining());
        REACHED.record(outcome, &LEGAL);
        // Once slot 3 has left (window slots 4-6, key not yet expired) nothing is left:
        // no unit was written into a slot beyond B's.
        assert_eq!(at(3000), 0);
    });
    REACHED.assert_all(&[LEGAL[0], LEGAL[2], LEGAL[3]]);
}

/// At the limit, with adoption: 1 per 1 s in 0.5 s slots, strict, full with the prior unit
/// (0.4 s, slot 0). Alone, A (0.45 s) would be refused; B (1.6 s, slot 3) fits. A may adopt
/// slot 3 from B's ring writes and win the CAS, and then B is refused: exactly one of them
/// is admitted, into slot 3 either way. The key must stay alive as long as that unit is in
/// a window, even when the only check that counted it (A) has a clock 1 s behind its slot:
/// `touched` must cover the adopted slot, not just A's clock (at 2.7 s a key touched at
/// 0.45 s would be expired, 1.5 s being the expiry, and the unit in slot 3 lost).
#[test]
fn adopted_slot_keeps_the_key_alive() {
    static REACHED: Reached<bool> = Reached::new();
    loom::model(|| {
        let limit = Limit::new(1, Duration::from_secs(1)).precision(Duration::from_millis(500)).strict();
        let (state, da, db) = race(limit, 400 * MS, 450 * MS, 1600 * MS);
        assert!(da.is_allowed() != db.is_allowed(), "A {da:?} B {db:?}");
        let policy = policy(&[limit]);
        // Slot 3 = [1.5 s, 2 s) is in the windows of 2.4 s (slots 2-4) and 2.7 s (3-5).
        for ms in [1600, 2400, 2700] {
            assert!(!state.is_expired(&policy, ms * MS), "expired at {ms} ms: A {da:?} B {db:?}");
            assert_eq!(units(&state, &[limit], 0, ms * MS), 1, "at {ms} ms: A {da:?} B {db:?}");
        }
        assert_eq!(units(&state, &[limit], 0, 3000 * MS), 0);
        REACHED.record(da.is_allowed(), &[false, true]);
    });
    REACHED.assert_all(&[false, true]);
}

/// A jump longer than the ring, kept alive by a second, long limit: 10 per 1 s in 0.5 s
/// slots (ring of 3) and 10 per 4 s in one slot (so the key does not expire). The prior
/// unit (0.4 s) and A (0.45 s) are in short slot 0; B (2.2 s) jumps to short slot 4: slot 0
/// is no longer in any window, so B does not close it and writes slots 1-3 as empty, over
/// every ring position. A's short-limit unit may stay in slot 0 or be adopted into slot 4
/// (B's ring word, `sum` or `cur`). The ring's 3 entries share one word, which B writes in
/// one CAS, so A meets slot 3 as the word's newest slot: slots 2 (`Newer(1)` alone) and 3
/// stay legal but unreached:
///
/// | A in | at 2.2 s (slots 2-4) | at 2.7 s (3-5) | at 3.2 s (4-6) |
/// |------|----------------------|----------------|----------------|
/// | 0    | 1                    | 1              | 1              |
/// | 2    | 2                    | 1              | 1              |
/// | 3    | 2                    | 2              | 1              |
/// | 4    | 2                    | 2              | 2              |
///
/// The long limit has a single slot covering all of it: it must hold exactly 3.
#[test]
fn slot_jump_longer_than_the_ring() {
    const LEGAL: [(u64, u64, u64); 4] = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2)];
    static REACHED: Reached<(u64, u64, u64)> = Reached::new();
    loom::model(|| {
        let limits = [
            Limit::new(10, Duration::from_secs(1)).precision(Duration::from_millis(500)).strict(),
            Limit::new(10, Duration::from_secs(4)).precision(Duration::from_secs(4)).strict(),
        ];
        let policy = policy(&limits);
        let state = Arc::new(OwnedState::new(&policy, 400 * MS));
        assert!(take(&state, &policy, 400 * MS, 1).is_allowed());
        let spawn = |now| spawn_take(&state, &policy, now);
        let (a, b) = (spawn(450 * MS), spawn(2200 * MS));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a.is_allowed() && b.is_allowed());
        let short = |ms| units(&state, &limits, 0, ms * MS);
        REACHED.record((short(2200), short(2700), short(3200)), &LEGAL);
        assert_eq!(short(3700), 0);
        assert_eq!(units(&state, &limits, 1, 2200 * MS), 3);
        assert_eq!(units(&state, &limits, 1, 3900 * MS), 3);
    });
    REACHED.assert_all(&[(1, 1, 1), (2, 2, 2)]);
}

/// A closer so stale that the ring position it writes has since been reused: 4 per 1 s in
/// 1 s slots, strict (a ring of 2, so slots 0 and 2 share a position). T (1.5 s) loaded
/// `cur` in slot 0 and goes to close it; meanwhile M checks at 2.5 s (moving to slot 2) and
/// again at 3.5 s (closing slot 2 into the position slot 0 used). T's late `raise` of slot 0
/// must lose to the newer slot 2, or slot 2's unit would read as 0. (The key is created at
/// 0.9 s and M's first check raises `touched` to 2.5 s, so nothing expires.)
///
/// At 3.5 s the window is slots 2 and 3: M's two units, and T's unless T's CAS came first
/// and left it in slot 1 (T lands later only by adopting M's slot 2 or 3). Each decision's
/// `remaining()` says what its window held:
///
/// | T in | T left | M at 2.5 s left | M at 3.5 s left | units at 3.5 s |
/// |------|--------|-----------------|-----------------|----------------|
/// | 1    | 2      | 2 (saw T's)     | 2               | 2              |
/// | 2    | 2      | 3               | 1 (saw T's)     | 3              |
/// | 3    | 1      | 3               | 2               | 3              |
#[test]
fn stale_closer_races_a_reused_ring_position() {
    const LEGAL: [(u64, u64, u64, u64); 3] = [(2, 2, 2, 2), (2, 3, 1, 3), (1, 3, 2, 3)];
    static REACHED: Reached<(u64, u64, u64, u64)> = Reached::new();
    loom::model(|| {
        let limit = Limit::per_second(4).strict();
        let policy = policy(&[limit]);
        let state = Arc::new(OwnedState::new(&policy, 900 * MS));
        assert!(take(&state, &policy, 900 * MS, 1).is_allowed());
        let t = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || take(&state, &policy, 1500 * MS, 1))
        };
        let m = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || [take(&state, &policy, 2500 * MS, 1), take(&state, &policy, 3500 * MS, 1)])
        };
        let (t, [ma, mb]) = (t.join().unwrap(), m.join().unwrap());
        assert!(t.is_allowed() && ma.is_allowed() && mb.is_allowed());
        let held = units(&state, &[limit], 0, 3500 * MS);
        // T stayed in slot 1 exactly when M's first check saw its unit.
        assert_eq!(held, 2 + u64::from(ma.remaining() == 3), "T {t:?} M {ma:?} {mb:?}");
        REACHED.record((t.remaining(), ma.remaining(), mb.remaining(), held), &LEGAL);
    });
    REACHED.assert_all(&LEGAL);
}

/// A delayed writer in a shared ring word. Ring entries are as narrow as `max` allows and
/// share 64-bit words under one tag, the newest slot written into the word: in slots of
/// 1 s or more a narrow word (a 16-bit tag over 48 bits of counts: twelve 4-bit ones for a
/// `max` of 10, four 10-bit ones for 1,000), in shorter slots a wide one (a 32-bit tag
/// over 32 bits: eight 4-bit or three 10-bit counts). A window of 3 slots of `slot` ms, strict, with a unit in slot 0: D
/// (1.2 slots) loads `cur` in slot 0 and goes to close it, while M checks at 1.5 slots
/// (closing slot 0; its unit in slot 1), 2.5 (closing slot 1 into the word slot 0 shares)
/// and 4.5 (slot 1 is now the oldest, read from the ring). D's write may land after all of
/// M's: it must leave M's newer entry and the word's newer tag alone, or slot 1 would read
/// as an older, empty slot and its unit be forgotten.
///
/// D's unit lands in slot 1, or in a later slot of M's that it adopted. At 4.5 slots the
/// strict window covers slots 1 to 4: every unit but the first.
fn delayed_writer_in_a_shared_word(max: u64, slot: u64) {
    loom::model(move || {
        let at = move |tenths: u64| tenths * slot * MS / 10;
        let limit =
            Limit::new(max, Duration::from_millis(3 * slot)).precision(Duration::from_millis(slot)).strict();
        let policy = policy(&[limit]);
        let state = Arc::new(OwnedState::new(&policy, 0));
        assert!(take(&state, &policy, at(5), 1).is_allowed());
        let d = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || take(&state, &policy, at(12), 1))
        };
        let m = {
            let (state, policy) = (Arc::clone(&state), policy.clone());
            thread::spawn(move || [15, 25, 45].map(|tenths| take(&state, &policy, at(tenths), 1)))
        };
        let (d, m) = (d.join().unwrap(), m.join().unwrap());
        assert!(d.is_allowed() && m.iter().all(Decision::is_allowed));
        assert_eq!(units(&state, &[limit], 0, at(45)), 4, "D {d:?} M {m:?}");
    });
}

#[test]
fn delayed_writer_in_a_narrow_word_of_4_bit_counts() {
    delayed_writer_in_a_shared_word(10, 1000);
}

#[test]
fn delayed_writer_in_a_narrow_word_of_10_bit_counts() {
    delayed_writer_in_a_shared_word(1000, 1000);
}

#[test]
fn delayed_writer_in_a_wide_word_of_4_bit_counts() {
    delayed_writer_in_a_shared_word(10, 500);
}

#[test]
fn delayed_writer_in_a_wide_word_of_10_bit_counts() {
    delayed_writer_in_a_shared_word(1000, 500);
}
