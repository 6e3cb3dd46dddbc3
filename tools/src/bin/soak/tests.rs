//! The checker on logs written by hand: what it must catch, and what it must let pass.

use crate::checker::{Checker, Held, Stats};
use crate::workload::{kinds, Kind, Model, Rec, ADMITTED, MS, REFUSED};

const S: u64 = 1_000 * MS;

fn kind(model: Model, max: u64) -> Kind {
    let mut kind = kinds().into_iter().find(|k| k.model == model && k.specs.len() == 1).expect("a kind");
    assert_eq!(kind.specs[0].max[0], max);
    kind.specs[0].max[1] = max;
    kind.updates = false;
    kind
}

/// One operation on key 5: admitted (`retry` None) or refused.
fn rec(b: u64, a: u64, sb: u64, sa: u64, retry: Option<u64>) -> Rec {
    let what = if retry.is_some() { REFUSED } else { ADMITTED };
    let retry = retry.unwrap_or(0);
    Rec { b, a, sb, sa, retry, vb: 0, va: 0, key: 5, cost: 1, what, multi: false }
}

/// `n` admissions one after the other at `t`, from sequence number `seq` on.
fn admissions(n: u64, t: u64, seq: u64) -> Vec<Rec> {
    (0..n).map(|i| rec(t, t, seq + 2 * i, seq + 2 * i + 1, None)).collect()
}

fn check(kind: &Kind, recs: Vec<Rec>, held: &[u64]) -> Stats {
    let mut checker = Checker::new(kind);
    let mut clock = Held::default();
    clock.extend(held.to_vec());
    checker.round(kind, recs, 10 * S, &clock);
    checker.finish(kind, &clock);
    checker.stats
}

/// 20 admissions at 1 s fill a strict 20/500ms window; a check that read the clock at 1 s
/// and stalled across a jump to 3 s is admitted; 20 more are admitted at 3 s.
fn stalled(held: &[u64]) -> Stats {
    let kind = kind(Model::Strict, 20);
    let mut recs = admissions(20, S, 0);
    recs.push(rec(S, 3 * S, 40, 81, None));
    recs.extend(admissions(20, 3 * S, 41));
    check(&kind, recs, held)
}

#[test]
fn a_check_stalled_across_a_jump_is_held_to_the_window_on_either_side() {
    let stats = stalled(&[S, 3 * S]);
    assert_eq!(stats.over, [1], "{:?}", stats.examples);
    assert_eq!(stats.no_room, 0);
}

#[test]
fn a_check_that_may_have_read_an_empty_window_in_between_is_not() {
    let stats = stalled(&[S, 2 * S, 3 * S]);
    assert_eq!(stats.over, [0], "{:?}", stats.examples);
}

#[test]
fn a_refusal_with_room_fails_and_an_exact_wait_passes() {
    let kind = kind(Model::Strict, 20);
    // 5 units of 20: room.
    let mut recs = admissions(5, S, 0);
    recs.push(rec(S, S, 10, 11, Some(600 * MS)));
    let stats = check(&kind, recs, &[S]);
    assert_eq!((stats.room, stats.analysed), (1, 1), "{:?}", stats.examples);
    // 20 units in slot 10 (1.0 s to 1.1 s) leave a 500 ms window of 100 ms slots at 1.6 s.
    let mut recs = admissions(20, S, 0);
    recs.push(rec(S, S, 40, 41, Some(600 * MS)));
    let stats = check(&kind, recs, &[S]);
    assert_eq!((stats.room, stats.short, stats.long, stats.exact), (0, 0, 0, 1), "{:?}", stats.examples);
    // One nanosecond early.
    let mut recs = admissions(20, S, 0);
    recs.push(rec(S, S, 40, 41, Some(600 * MS - 1)));
    assert_eq!(check(&kind, recs, &[S]).short, 1);
}

#[test]
fn gcra_refuses_from_a_stale_reading_with_units_stamped_after_it() {
    // The refusal read 1.0 s and stalled; 20 units were admitted at 1.2 s meanwhile,
    // which its view then saw: arrival time 1.2 s + 20 × 20 ms = 1.6 s, so one more unit
    // fits from 1.6 + 0.02 − 0.4 = 1.22 s, 220 ms after the refusal's reading.
    let kind = kind(Model::Gcra, 20);
    let mut recs = vec![rec(S, 1_200 * MS, 0, 41, Some(220 * MS))];
    recs.extend(admissions(20, 1_200 * MS, 1));
    let stats = check(&kind, recs, &[S, 1_200 * MS]);
    assert_eq!((stats.room, stats.short, stats.long, stats.no_room), (0, 0, 0, 0), "{:?}", stats.examples);
}

#[test]
fn gcra_admitting_more_than_the_burst_at_one_time_is_caught() {
    let kind = kind(Model::Gcra, 20);
    let stats = check(&kind, admissions(21, S, 0), &[S]);
    assert_eq!(stats.no_room, 1, "{:?}", stats.examples);
    assert!(stats.over[0] > 0);
}

#[test]
fn gcra_check_all_refused_by_its_own_units_left_behind_is_no_refusal_with_room() {
    // 16 units at 1 s: arrival time 1.32 s. A `check_all` commits 3 here (1.38 s), another
    // check commits 1 (1.40 s), so the first one's rollback finds the word moved on and
    // leaves its 3; it starts over and is refused: 1.40 + 0.06 − 0.4 = 1.06 s.
    let kind = kind(Model::Gcra, 20);
    let mut recs = admissions(16, S, 0);
    recs.push(Rec { multi: true, cost: 3, ..rec(S, S, 32, 35, Some(60 * MS)) });
    recs.push(rec(S, S, 33, 34, None));
    let stats = check(&kind, recs, &[S]);
    assert_eq!((stats.room, stats.short, stats.long), (0, 0, 0), "{:?}", stats.examples);
}
