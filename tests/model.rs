//! Property test of the limiter against an exact reference model: a log of every admitted
//! `(time, cost)` per key, from which each limit's count (sliding window, fixed window,
//! sliding log or GCRA's theoretical arrival time, per the algorithm drawn) is recomputed
//! from scratch at every step. Random limits (strict or interpolated), keys and operations
//! (clock moves, checks of any cost, peeks, resets, sweeps); every `Decision` must match the
//! model exactly, `retry_after` must be the earliest nanosecond at which the model admits the
//! same request, sweeps must evict only empty keys and change no decision, and the log of
//! admitted units must respect the accuracy bound of each limit (strict: at most `max` in
//! any interval of one window; interpolated: less than `2 × max`).
//!
//! The model and the harness that runs a case live in `support/model.rs` (shared with the
//! fuzz target `fuzz/fuzz_targets/model_ops.rs`); this file draws the cases. The
//! `proptest!` block stays here: its failure persistence is `tests/model.regressions`,
//! next to this file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use slidegate::{Algorithm, Limit};

#[allow(dead_code)]
mod support {
    pub mod model;
}
use slidegate::Carry;
use support::model::{
    densest, wrap_points, Op, Rule, ALGORITHMS, FINE_LIMITS, LIMITS, MAX_TIME, NS_PER_MS, NS_PER_S,
};

/// [`support::model::run`], its mismatch as a proptest failure.
fn run(
    algorithm: Algorithm,
    limits: &[Limit],
    tiers: bool,
    keys: usize,
    ops: &[Op],
    start: u64,
) -> Result<(), TestCaseError> {
    support::model::run(algorithm, limits, tiers, keys, ops, start).map_err(TestCaseError::fail)
}

fn advance() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0),
        2 => 1u64..=5,
        3 => 1u64..NS_PER_MS,
        6 => (1u64..=1_000).prop_map(|ms| ms * NS_PER_MS),
        3 => (1u64..=200_000).prop_map(|ms| ms * NS_PER_MS),
        1 => (1u64..=10).prop_map(|h| h * 3600 * NS_PER_S),
    ]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![12 => Just(1), 6 => 0u64..=4, 2 => 0u64..=11, 1 => Just(u64::MAX)]
}

fn op() -> impl Strategy<Value = Op> {
    let unit = prop::sample::select(vec![100, 250, 500, 1_000, 10_000, 60_000]).prop_map(|ms| ms * NS_PER_MS);
    prop_oneof![
        8 => advance().prop_map(Op::Advance),
        3 => (unit, -1i8..=1).prop_map(|(unit, offset)| Op::Align { unit, offset }),
        10 => (0usize..3, cost(), prop_oneof![3 => Just(1u8), 1 => 2u8..=12])
            .prop_map(|(key, cost, times)| Op::Check { key, cost, times }),
        3 => (0usize..3).prop_map(|key| Op::Peek { key }),
        1 => (0usize..3).prop_map(|key| Op::Reset { key }),
        2 => Just(Op::Sweep),
    ]
}

/// [`op`], and the operations on policies.
fn tier_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op(),
        2 => (0usize..4, 0usize..3).prop_map(|(key, tier)| Op::SetPolicy { key, tier }),
        1 => (0usize..4).prop_map(|key| Op::ClearPolicy { key }),
        1 => (0usize..3, 0u64..=3).prop_map(|(tier, bump)| Op::UpdateMax { tier, bump }),
    ]
}

/// Limits from their text, each made strict where picked so.
fn parsed(picked: Vec<(&'static str, bool)>) -> Vec<Limit> {
    picked
        .into_iter()
        .map(|(text, strict)| {
            let text = if strict { format!("{text} strict") } else { text.to_owned() };
            text.parse().unwrap()
        })
        .collect()
}

fn limits() -> impl Strategy<Value = Vec<Limit>> {
    prop::collection::vec((prop::sample::select(LIMITS.to_vec()), any::<bool>()), 1..=3).prop_map(parsed)
}

/// [`limits`], drawn from the fine-slotted limits too.
fn uptime_limits() -> impl Strategy<Value = Vec<Limit>> {
    let table: Vec<&str> = LIMITS.iter().chain(&FINE_LIMITS).copied().collect();
    prop::collection::vec((prop::sample::select(table), any::<bool>()), 1..=3).prop_map(parsed)
}

/// Limits for the cases of records and policy changes: `max` on either side of the 8- and
/// 16-bit ring entry widths (254/255, 65,534/65,535), windows of one slot on either side of
/// a pair word's (65,534 in one word, 65,535 in a ring), windows and precisions that change
/// under a carry. (Its order and length are part of the seeds in `model.regressions`.)
const CHANGE_LIMITS: [&str; 14] = [
    "100/10s@250ms",
    "247/10s@250ms",
    "266/10s@250ms",
    "1000/100ms",
    "1000/100ms@10ms",
    "3/s",
    "254/2s@500ms",
    "255/2s@500ms",
    "65534/s@250ms",
    "65535/s@250ms",
    "65534/s",
    "65535/s",
    "5/2s@500ms",
    "300/10s@1s",
];

/// Limits on either side of the other ring entry widths, in narrow words (slots of 1 s) and
/// wide ones (500 ms): 2 and 3 bits (2/3), 6 and 7 (62/63), 10 and 11 (1,022/1,023), 24 and
/// 32 (2²⁴−2/2²⁴−1); 17 bits (70,000); and a pair word beside them.
const WIDTH_LIMITS: [&str; 12] = [
    "2/10s@1s",
    "3/10s@1s",
    "62/10s@1s",
    "63/2s@500ms",
    "1022/10s@1s",
    "1023/10s@1s",
    "70000/10s@1s",
    "70000/2s@500ms",
    "16777214/10s@1s",
    "16777215/10s@1s",
    "16777214/2s@500ms",
    "60/s",
];

/// One to two limits from `table`, each strict or not.
fn picked_limits(table: &'static [&'static str]) -> impl Strategy<Value = Vec<Limit>> + Clone {
    prop::collection::vec((prop::sample::select(table.to_vec()), any::<bool>()), 1..=2).prop_map(parsed)
}

/// One to two limits from [`CHANGE_LIMITS`], each strict or not.
fn change_limits() -> impl Strategy<Value = Vec<Limit>> {
    picked_limits(&CHANGE_LIMITS)
}

/// Units recorded: a few, around each entry width, and far beyond every one.
fn record_cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=20,
        2 => 240u64..=300,
        1 => 65_500u64..=65_600,
        2 => Just(u64::from(u32::MAX)),
        1 => Just(u64::MAX),
    ]
}

/// Units recorded around the widths of [`WIDTH_LIMITS`] (3, 7, 63, 127, 1,023, 2,047,
/// 131,071 and 2²⁴ − 1 fill an entry), and far beyond every one.
fn width_record_cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=20,
        2 => 55u64..=135,
        2 => 1_000u64..=1_030,
        1 => 2_040u64..=2_050,
        1 => 131_060u64..=131_080,
        2 => 16_777_200u64..=16_777_220,
        2 => Just(u64::from(u32::MAX)),
        1 => Just(u64::MAX),
    ]
}

/// [`op`], records of `costs`, and `update_policy` to limits from `table` with either carry.
fn change_op_from(
    table: &'static [&'static str],
    costs: impl Strategy<Value = u64> + 'static,
) -> impl Strategy<Value = Op> {
    let carry = prop_oneof![Just(Carry::Conservative), Just(Carry::Reset)];
    prop_oneof![
        12 => op(),
        4 => (0usize..3, costs).prop_map(|(key, cost)| Op::Record { key, cost }),
        2 => (picked_limits(table), carry).prop_map(|(limits, carry)| Op::UpdatePolicy { limits, carry }),
    ]
}

/// [`op`], records, and `update_policy` to new limits with either carry.
fn change_op() -> impl Strategy<Value = Op> {
    change_op_from(&CHANGE_LIMITS, record_cost())
}

/// Where a long-uptime case starts: a little before one of the case's [`wrap_points`]
/// (picked by the index), or anywhere up to 2⁶².
#[derive(Debug, Clone)]
enum Start {
    BeforeWrap(prop::sample::Index, u64),
    Anywhere(u64),
}

impl Start {
    fn at(&self, limits: &[Limit], algorithm: Algorithm) -> u64 {
        match self {
            Start::BeforeWrap(pick, before) => {
                let points = wrap_points(limits, algorithm);
                pick.get(&points).saturating_sub(*before)
            }
            Start::Anywhere(at) => *at,
        }
    }
}

fn start() -> impl Strategy<Value = Start> {
    let before = prop_oneof![
        1 => Just(0),
        1 => 1u64..=1_000,
        3 => (1u64..=120_000).prop_map(|ms| ms * NS_PER_MS),
    ];
    prop_oneof![
        4 => (any::<prop::sample::Index>(), before).prop_map(|(pick, before)| Start::BeforeWrap(pick, before)),
        1 => (0u64..=1 << 62).prop_map(Start::Anywhere),
    ]
}

/// [`op`], and jumps of any size up to 2⁶² ns, and alignments to the next multiple of 2³²
/// slots of the precisions in the tables (the clock stops at `MAX_TIME`).
fn uptime_op() -> impl Strategy<Value = Op> {
    // Every slot (or fixed window) of the tables that wraps before the clock's end, 2⁶² ns.
    let slot = prop::sample::select(vec![1, 10, 20, 100, 250, 500, 1_000]);
    prop_oneof![
        20 => op(),
        1 => (0u64..=1 << 62).prop_map(Op::Advance),
        1 => (slot, -1i8..=1).prop_map(|(ms, offset)| Op::Align { unit: (ms * NS_PER_MS) << 32, offset }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        // 1000 cases take a few seconds in debug; PROPTEST_CASES overrides.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(1000),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn limiter_matches_the_exact_model(
        algorithm in prop::sample::select(ALGORITHMS.to_vec()),
        limits in limits(),
        keys in 1usize..=3,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(algorithm, &limits, false, keys, &ops, 0)?;
    }

    /// Three policies differing in `max`, a resolver, overrides set and cleared, and `max`
    /// changed at runtime: every count carries over exactly, so every decision still
    /// matches the model. The sliding and fixed windows only: moving a sliding log's or
    /// GCRA's key to another policy carries its units conservatively (recorded as used
    /// now), which an exact model cannot follow (tests/policies.rs bounds it instead).
    #[test]
    fn tiers_match_the_exact_model(
        algorithm in prop::sample::select(vec![Algorithm::SlidingWindow, Algorithm::FixedWindow]),
        limits in limits(),
        keys in 1usize..=4,
        ops in prop::collection::vec(tier_op(), 1..200),
    ) {
        run(algorithm, &limits, true, keys, &ops, 0)?;
    }

    /// `record` (units beyond a ring entry's width saturate its slot, which then counts as
    /// full until it leaves the window), `update_policy` (`max` across entry widths, which
    /// re-encodes each key's ring, or new windows and precisions carried with either
    /// `Carry`) and checks, together: every decision matches the model, which knows which
    /// slot each limit holds open and which it closed saturated. The sliding and fixed
    /// windows (whose carries the model follows exactly).
    #[test]
    fn records_and_policy_changes_match_the_model(
        algorithm in prop::sample::select(vec![Algorithm::SlidingWindow, Algorithm::FixedWindow]),
        limits in change_limits(),
        keys in 1usize..=3,
        ops in prop::collection::vec(change_op(), 1..150),
    ) {
        run(algorithm, &limits, false, keys, &ops, 0)?;
    }

    /// The same across the ring entry widths that [`CHANGE_LIMITS`] does not reach: every
    /// width saturates where the model says, and a policy change between two widths
    /// re-encodes each count exactly (a saturated one saturated).
    #[test]
    fn records_and_policy_changes_across_entry_widths_match_the_model(
        limits in picked_limits(&WIDTH_LIMITS),
        keys in 1usize..=3,
        ops in prop::collection::vec(change_op_from(&WIDTH_LIMITS, width_record_cost()), 1..150),
    ) {
        run(Algorithm::SlidingWindow, &limits, false, keys, &ops, 0)?;
    }

    /// Long uptimes: the same cases, starting near the points where the 32-bit slot tags
    /// wrap (2³² slots of a limit's precision: 49.7 days at 1 ms, 136 years at 1 s), at
    /// 2³² ms and 2³² s, or anywhere up to 2⁶² ns, with jumps of up to 2⁶² ns and to the next
    /// wrap (the clock stops at `MAX_TIME`).
    #[test]
    fn long_uptime_matches_the_exact_model(
        algorithm in prop::sample::select(ALGORITHMS.to_vec()),
        limits in uptime_limits(),
        keys in 1usize..=3,
        start in start(),
        ops in prop::collection::vec(uptime_op(), 1..200),
    ) {
        let start = start.at(&limits, algorithm);
        prop_assert!(start <= MAX_TIME);
        run(algorithm, &limits, false, keys, &ops, start)?;
    }
}

/// The model itself, on the seed article's worked example and on hand-computed retry times.
#[test]
fn the_model_computes_the_worked_examples() {
    let rule = Rule::of(&Limit::per_minute(500).precision(Duration::from_secs(60)), Algorithm::SlidingWindow);
    let log = [(10 * NS_PER_S, 400), (100 * NS_PER_S, 250)];
    assert_eq!(rule.scaled(&log, 105 * NS_PER_S), 350 * u128::from(rule.p));
    assert_eq!(rule.room(&log, 105 * NS_PER_S, 1), 149);

    // 10/s, 10 units at 0: one more fits once 10 × (1 − f) ≤ 9, at 1.1 s; strict at 2 s.
    let log = [(0, 10)];
    let interpolated = Rule::of(&Limit::per_second(10), Algorithm::SlidingWindow);
    assert_eq!(interpolated.earliest(&log, 0, 1), 1_100 * NS_PER_MS);
    let strict = Rule::of(&Limit::per_second(10).strict(), Algorithm::SlidingWindow);
    assert_eq!(strict.earliest(&log, 0, 1), 2 * NS_PER_S);
    // The other algorithms on the same log: the fixed window and the log free up at 1 s,
    // GCRA one interval (100 ms) after the 10-unit burst.
    let log_at = |algorithm| Rule::of(&Limit::per_second(10), algorithm).earliest(&log, 0, 1);
    assert_eq!(log_at(Algorithm::FixedWindow), NS_PER_S);
    assert_eq!(log_at(Algorithm::SlidingLog), NS_PER_S);
    assert_eq!(log_at(Algorithm::Gcra), 100 * NS_PER_MS);
    assert_eq!(densest(&[(0, 3), (NS_PER_S, 4), (NS_PER_S + 1, 5)], NS_PER_S), 9);
}

/// A long deterministic run through the same harness, so a plain `cargo test` always
/// covers one boundary-heavy sequence even with `PROPTEST_CASES=1`.
#[test]
fn a_fixed_boundary_heavy_sequence_matches_the_model() {
    let limits: Vec<Limit> =
        ["5/2s@500ms", "7/min@10s strict", "3/s"].iter().map(|t| t.parse().unwrap()).collect();
    let mut ops = Vec::new();
    for round in 0..150u64 {
        let unit = [100, 250, 500, 1_000, 10_000][(round % 5) as usize] * NS_PER_MS;
        ops.push(Op::Align { unit, offset: (round % 3) as i8 - 1 });
        ops.push(Op::Check { key: (round % 2) as usize, cost: 1 + round % 3, times: 4 });
        ops.push(Op::Peek { key: 1 });
        if round % 17 == 0 {
            ops.push(Op::Advance(61 * NS_PER_S));
            ops.push(Op::Sweep);
        }
    }
    for algorithm in ALGORITHMS {
        run(algorithm, &limits, false, 2, &ops, 0).unwrap();
    }
}

/// A deterministic long-uptime run: a boundary-heavy sequence starting a little before each
/// point where a limit's 32-bit slot tags wrap (and at 2³² ms and 2³² s), for every
/// algorithm, so a plain `cargo test` always crosses every wrap point.
#[test]
fn sequences_across_the_slot_tag_wrap_match_the_model() {
    let limits: Vec<Limit> =
        ["4/20ms@1ms", "6/250ms@10ms strict", "5/2s@500ms"].iter().map(|t| t.parse().unwrap()).collect();
    let mut ops = Vec::new();
    for round in 0..120u64 {
        let unit = [1, 10, 20, 250, 500, 2_000][(round % 6) as usize] * NS_PER_MS;
        ops.push(Op::Align { unit, offset: (round % 3) as i8 - 1 });
        ops.push(Op::Check { key: (round % 2) as usize, cost: 1 + round % 3, times: 3 });
        ops.push(Op::Peek { key: 1 });
        ops.push(Op::Advance(round * 7 * NS_PER_MS / 3));
        if round % 29 == 0 {
            ops.push(Op::Sweep);
        }
    }
    // Limits whose rings pack narrow words (16-bit tags: slots of 1 s or more; 3-, 8- and
    // 9-bit entries), beside the wide ones above.
    let narrow: Vec<Limit> =
        ["4/3s@1s", "200/min", "300/10s@1s strict"].iter().map(|t| t.parse().unwrap()).collect();
    for (limits, algorithm) in ALGORITHMS.iter().flat_map(|&a| [(&limits, a), (&narrow, a)]) {
        for point in wrap_points(limits, algorithm) {
            for before in [0, 1, 3 * NS_PER_S] {
                let start = point - before;
                run(algorithm, limits, false, 2, &ops, start)
                    .unwrap_or_else(|e| panic!("{algorithm:?} from {start} ns: {e}"));
            }
        }
    }
}

/// The cases that found a saturated slot forgotten, through the same harness: a slot
/// recorded past its 8-bit entries (2³²−1 units at 0 s, closed by 4 more at 0.25 s), then a
/// `max` that needs 9-bit entries, one limit or two; and the same state carried into a new
/// precision. The saturated slot must refuse everything until it leaves the window.
#[test]
fn a_saturated_slot_survives_a_wider_ring_and_a_carry_in_the_model() {
    let limits = |texts: &[&str]| texts.iter().map(|t| t.parse().unwrap()).collect::<Vec<Limit>>();
    for (before, after) in [
        (&["100/10s@250ms strict"][..], &["266/10s@250ms strict"][..]),
        (&["1000/100ms", "100/10s@250ms strict"][..], &["1000/100ms", "266/10s@250ms strict"][..]),
        (&["100/10s@250ms strict"][..], &["1000/100ms@10ms"][..]),
    ] {
        let narrow: Vec<String> = before.iter().map(|l| l.replace("100/10s", "247/10s")).collect();
        let narrow: Vec<&str> = narrow.iter().map(String::as_str).collect();
        let mut ops = vec![
            Op::UpdatePolicy { limits: limits(&narrow), carry: Carry::Conservative },
            Op::Record { key: 0, cost: u64::from(u32::MAX) },
            Op::Advance(250 * NS_PER_MS),
            Op::Record { key: 0, cost: 4 },
            Op::UpdatePolicy { limits: limits(after), carry: Carry::Conservative },
            Op::Check { key: 0, cost: 0, times: 1 },
            Op::Check { key: 0, cost: 1, times: 1 },
        ];
        for _ in 0..12 {
            ops.push(Op::Advance(997 * NS_PER_MS));
            ops.push(Op::Check { key: 0, cost: 1, times: 2 });
        }
        run(Algorithm::SlidingWindow, &limits(before), false, 1, &ops, 0)
            .unwrap_or_else(|e| panic!("{before:?} -> {after:?}: {e}"));
    }
}

/// A case that found the model's expectation of a sweep too strict: a key perhaps evicted
/// (its windows empty, a sweep took one of two such keys) that is looked up again under a
/// new policy version, then swept at the same time. The model forgot its last activity
/// (3,600.774 s), took it as idle since 0 s and expected the limiter to have evicted it;
/// the limiter still holds it, rightly (its `touched` is 1.2 s old, under its 2 s expiry).
#[test]
fn a_key_perhaps_evicted_is_idle_from_its_last_activity() {
    let l = |t: &str| -> Limit { t.parse().unwrap() };
    let ops = vec![
        Op::Record { key: 2, cost: 1 },
        Op::UpdatePolicy { limits: vec![l("3/s")], carry: Carry::Conservative },
        Op::Check { key: 2, cost: 1, times: 1 },
        Op::Advance(3_600 * NS_PER_S),
        Op::Check { key: 0, cost: 1, times: 1 },
        Op::Advance(774 * NS_PER_MS),
        Op::Check { key: 2, cost: 1, times: 1 },
        Op::Advance(1_226 * NS_PER_MS),
        Op::Sweep,
        Op::UpdatePolicy { limits: vec![l("100/10s@250ms")], carry: Carry::Conservative },
        Op::Peek { key: 2 },
        Op::Sweep,
        Op::Check { key: 0, cost: 1, times: 1 },
    ];
    run(Algorithm::SlidingWindow, &[l("100/10s@250ms")], false, 3, &ops, 0).unwrap();
}
