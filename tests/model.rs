//! Property test of the limiter against an exact reference model: a log of every admitted
//! `(time, cost)` per key, from which each limit's count (sliding window, fixed window,
//! sliding log or GCRA's theoretical arrival time, per the algorithm drawn) is recomputed
//! from scratch at every step. Random limits (strict or interpolated), keys and operations
//! (clock moves, checks of any cost, peeks, resets, sweeps); every `Decision` must match the
//! model exactly, `retry_after` must be the earliest nanosecond at which the model admits the
//! same request, sweeps must evict only empty keys and change no decision, and the log of
//! admitted units must respect the accuracy bound of each limit (strict: at most `max` in
//! any interval of one window; interpolated: less than `2 × max`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use slidegate::{Accuracy, Algorithm, Carry, Decision, Denial, Limit, Limiter, ManualClock, PolicyConfig};

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000_000_000;

/// The small limits the cases draw from (each also in a strict variant).
const LIMITS: [&str; 5] = ["3/s", "5/2s@500ms", "10/s@100ms", "7/min@10s", "4/3s@1s"];

/// One limit in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Rule {
    max: u64,
    window: u64,
    /// Slot length (precision).
    p: u64,
    /// Slots per window.
    n: u64,
    strict: bool,
    algorithm: Algorithm,
    /// GCRA: ns per unit (`window / max` rounded up) and the tolerance `max × interval`.
    interval: u64,
    burst: u64,
}

impl Rule {
    fn of(limit: &Limit, algorithm: Algorithm) -> Rule {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
        let window = ns(limit.window());
        let interval = window.div_ceil(limit.max());
        let p = if algorithm == Algorithm::FixedWindow { window } else { ns(limit.get_precision()) };
        Rule {
            max: limit.max(),
            window,
            p,
            n: limit.slots(),
            strict: limit.accuracy() == Accuracy::Strict,
            algorithm,
            interval,
            burst: interval * limit.max(),
        }
    }

    /// How long after the start of its slot a unit may still count (the limiter's expiry).
    fn expiry(&self) -> u64 {
        let held = if self.algorithm == Algorithm::Gcra { self.burst } else { self.window };
        held + self.p
    }

    /// The scale of [`scaled`](Self::scaled): `p` for the interpolated window, else 1.
    fn scale(&self) -> u128 {
        if self.algorithm == Algorithm::SlidingWindow {
            u128::from(self.p)
        } else {
            1
        }
    }

    /// GCRA's theoretical arrival time after the log, and after `cost` more at `t`.
    fn tat(&self, log: &[(u64, u64)], t: u64, cost: u64) -> u64 {
        let tat = log.iter().fold(0, |tat: u64, &(at, c)| tat.max(at) + c * self.interval);
        tat.max(t) + cost * self.interval
    }

    /// What the limit counts at `t`, times [`scale`](Self::scale) (GCRA: ns of backlog).
    fn scaled(&self, log: &[(u64, u64)], t: u64) -> u128 {
        match self.algorithm {
            Algorithm::SlidingWindow => self.sliding(log, t),
            Algorithm::FixedWindow => log
                .iter()
                .filter(|&&(at, _)| at / self.window == t / self.window)
                .map(|&(_, c)| u128::from(c))
                .sum(),
            Algorithm::SlidingLog => {
                log.iter().filter(|&&(at, _)| at + self.window > t).map(|&(_, c)| u128::from(c)).sum()
            }
            Algorithm::Gcra => u128::from(self.tat(log, t, 0) - t),
        }
    }

    /// The sliding window's count at `t`, times `p`: slots `k-n+1 ..= k` whole, slot `k-n`
    /// whole (strict) or weighted by `(p - e) / p` (interpolated), where `k = t / p`,
    /// `e = t % p`.
    fn sliding(&self, log: &[(u64, u64)], t: u64) -> u128 {
        let (k, e) = (t / self.p, t % self.p);
        let (mut whole, mut oldest) = (0u128, 0u128);
        for &(at, cost) in log {
            let slot = at / self.p;
            assert!(at <= t, "the model looks at the past only");
            if slot + self.n > k {
                whole += u128::from(cost);
            } else if slot + self.n == k {
                oldest += u128::from(cost);
            }
        }
        let weight = if self.strict { self.p } else { self.p - e };
        whole * u128::from(self.p) + oldest * u128::from(weight)
    }

    fn admits(&self, log: &[(u64, u64)], t: u64, cost: u64) -> bool {
        if self.algorithm == Algorithm::Gcra {
            return self.tat(log, t, cost) - t <= self.burst;
        }
        let p = self.scale();
        self.scaled(log, t) + u128::from(cost) * p <= u128::from(self.max) * p
    }

    /// Whole units still free at `t` after `cost` more, rounded down.
    fn room(&self, log: &[(u64, u64)], t: u64, cost: u64) -> u64 {
        if self.algorithm == Algorithm::Gcra {
            return self.burst.saturating_sub(self.tat(log, t, cost) - t) / self.interval;
        }
        let p = self.scale();
        let free = (u128::from(self.max) * p).saturating_sub(self.scaled(log, t) + u128::from(cost) * p);
        u64::try_from(free / p).unwrap()
    }

    /// The earliest time >= `now` at which `cost` fits, if no other traffic comes: found by
    /// bisection (the count never rises without traffic), not by a formula.
    fn earliest(&self, log: &[(u64, u64)], now: u64, cost: u64) -> u64 {
        if self.admits(log, now, cost) {
            return now;
        }
        // Every logged unit is at most `now`, so two windows and two slots (and a GCRA
        // burst) later none counts.
        let (mut refused, mut admitted) = (now, now + 2 * self.window + 2 * self.p + self.burst);
        assert!(self.admits(log, admitted, cost));
        while admitted - refused > 1 {
            let mid = refused + (admitted - refused) / 2;
            if self.admits(log, mid, cost) {
                admitted = mid;
            } else {
                refused = mid;
            }
        }
        admitted
    }
}

/// What the model knows about whether the limiter holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    No,
    Yes,
    /// A sweep may or may not have evicted it (its windows were empty).
    Maybe,
}

#[derive(Debug)]
struct KeyModel {
    /// The key's policy: its override, else the resolver's (key index modulo the tiers).
    tier: usize,
    overridden: bool,
    /// Admitted `(time, cost)` since the key was last reset.
    log: Vec<(u64, u64)>,
    /// The logs of earlier lives of the key, before a `reset`.
    earlier: Vec<Vec<(u64, u64)>>,
    held: Held,
}

/// What the model expects a decision to be.
#[derive(Debug, PartialEq, Eq)]
struct Expected {
    denial: Option<Denial>,
    remaining: u64,
    tightest: usize,
    retry_after: Option<Duration>,
}

impl Expected {
    fn of(d: &Decision) -> Expected {
        Expected {
            denial: d.denial(),
            remaining: d.remaining(),
            tightest: d.tightest_limit(),
            retry_after: d.retry_after(),
        }
    }
}

struct Model {
    /// Each policy's rules (one policy unless the case draws tiers).
    tiers: Vec<Vec<Rule>>,
    now: u64,
    /// Idle for longer than this, a key's windows are all empty.
    expiry: u64,
    keys: Vec<KeyModel>,
}

impl Model {
    fn new(tiers: Vec<Vec<Rule>>, keys: usize) -> Model {
        let expiry = tiers.iter().flatten().map(Rule::expiry).max().unwrap();
        let keys = (0..keys)
            .map(|key| KeyModel {
                tier: key % tiers.len(),
                overridden: false,
                log: Vec::new(),
                earlier: Vec::new(),
                held: Held::No,
            })
            .collect();
        Model { tiers, now: 0, expiry, keys }
    }

    fn rules(&self, key: usize) -> &[Rule] {
        &self.tiers[self.keys[key].tier]
    }

    fn admits_all(&self, key: usize, t: u64, cost: u64) -> bool {
        self.rules(key).iter().all(|r| r.admits(&self.keys[key].log, t, cost))
    }

    /// Minimum room over the limits, and the first limit with it.
    fn tightest(&self, key: usize, cost: u64) -> (usize, u64) {
        let log = &self.keys[key].log;
        let rooms = self.rules(key).iter().map(|r| r.room(log, self.now, cost));
        let mut best = (0, u64::MAX);
        for (i, room) in rooms.enumerate() {
            if room < best.1 {
                best = (i, room);
            }
        }
        best
    }

    /// The decision for a request of `cost` on `key` now; with `commit`, an admitted request
    /// is logged.
    fn decide(&mut self, key: usize, cost: u64, commit: bool) -> Expected {
        if let Some(i) = self.rules(key).iter().position(|r| cost > r.max) {
            let (_, remaining) = self.tightest(key, 0);
            return Expected {
                denial: Some(Denial::CostTooLarge(i)),
                remaining,
                tightest: i,
                retry_after: None,
            };
        }
        if self.admits_all(key, self.now, cost) {
            let (tightest, remaining) = self.tightest(key, cost);
            if commit && cost > 0 {
                self.keys[key].log.push((self.now, cost));
                self.keys[key].held = Held::Yes;
            }
            return Expected { denial: None, remaining, tightest, retry_after: None };
        }
        let log = &self.keys[key].log;
        let mut refusing = None::<(usize, u64)>;
        for (j, rule) in self.rules(key).iter().enumerate() {
            if !rule.admits(log, self.now, cost) {
                let at = rule.earliest(log, self.now, cost);
                if refusing.map_or(true, |(_, latest)| at > latest) {
                    refusing = Some((j, at));
                }
            }
        }
        let (j, at) = refusing.unwrap();
        let (_, remaining) = self.tightest(key, 0);
        Expected {
            denial: Some(Denial::Limit(j)),
            remaining,
            tightest: j,
            retry_after: Some(Duration::from_nanos(at - self.now)),
        }
    }

    fn empty(&self, key: usize) -> bool {
        self.rules(key).iter().all(|r| r.scaled(&self.keys[key].log, self.now) == 0)
    }

    fn idle(&self, key: usize) -> Option<u64> {
        self.keys[key].log.last().map(|&(at, _)| self.now - at)
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Move the clock forward by this many ns.
    Advance(u64),
    /// Move the clock to the next multiple of `unit` ns, plus `offset` ns.
    Align {
        unit: u64,
        offset: i8,
    },
    /// `check_n(key, cost)`, `times` times in a row.
    Check {
        key: usize,
        cost: u64,
        times: u8,
    },
    Peek {
        key: usize,
    },
    Reset {
        key: usize,
    },
    Sweep,
    /// `set_policy(key, tier)`, `clear_policy(key)`, and a new `max` for every limit of a
    /// tier (`+ bump`, or `- 1` for a bump of 0), through `update_policy`.
    SetPolicy {
        key: usize,
        tier: usize,
    },
    ClearPolicy {
        key: usize,
    },
    UpdateMax {
        tier: usize,
        bump: u64,
    },
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

fn limits() -> impl Strategy<Value = Vec<Limit>> {
    prop::collection::vec((prop::sample::select(LIMITS.to_vec()), any::<bool>()), 1..=3).prop_map(|picked| {
        picked
            .into_iter()
            .map(|(text, strict)| {
                let text = if strict { format!("{text} strict") } else { text.to_owned() };
                text.parse().unwrap()
            })
            .collect()
    })
}

/// Compares one decision with the model's, including the `retry_after` property.
fn compare(
    model: &Model,
    key: usize,
    cost: u64,
    got: &Decision,
    want: &Expected,
    what: &str,
) -> Result<(), TestCaseError> {
    let now = model.now;
    prop_assert_eq!(&Expected::of(got), want, "{} key {} cost {} at {} ns", what, key, cost, now);
    prop_assert_eq!(got.is_allowed(), want.denial.is_none());
    if let Some(wait) = got.retry_after() {
        // The earliest moment the model admits the same request, to the nanosecond.
        let wait = u64::try_from(wait.as_nanos()).unwrap();
        prop_assert!(wait > 0, "{} key {} cost {} at {}: refused with retry_after 0", what, key, cost, now);
        prop_assert!(
            model.admits_all(key, now + wait, cost),
            "{} at {}: not admitted after {} ns",
            what,
            now,
            wait
        );
        prop_assert!(
            !model.admits_all(key, now + wait - 1, cost),
            "{} at {}: already admitted after {} - 1 ns",
            what,
            now,
            wait
        );
    }
    Ok(())
}

/// `limit` with another `max` (same window, precision and accuracy).
fn with_max(limit: &Limit, max: u64) -> Limit {
    let same = Limit::new(max, limit.window()).precision(limit.get_precision());
    if limit.accuracy() == Accuracy::Strict {
        same.strict()
    } else {
        same
    }
}

const TIERS: [&str; 3] = ["t0", "t1", "t2"];

/// One policy of `limits` (through `.limit()`), or with `tiers`, three policies that differ
/// from `limits` in `max` only, chosen per key by a resolver (key modulo 3).
fn run(
    algorithm: Algorithm,
    limits: &[Limit],
    tiers: bool,
    keys: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let mut builder = Limiter::<u64>::builder().clock(clock.clone()).algorithm(algorithm);
    let mut tier_limits = vec![limits.to_vec()];
    if tiers {
        tier_limits.push(limits.iter().map(|l| with_max(l, l.max() + 3)).collect());
        tier_limits.push(limits.iter().map(|l| with_max(l, (l.max() - 1).max(1))).collect());
        for (name, limits) in TIERS.iter().zip(&tier_limits) {
            builder = builder.policy(name, PolicyConfig::new(limits.iter().copied()));
        }
        builder = builder.resolver(|key: &u64| Some(TIERS[*key as usize % TIERS.len()]));
    } else {
        for limit in limits {
            builder = builder.limit(*limit);
        }
    }
    let limiter = builder.build().unwrap();
    prop_assert_eq!(&limiter.limits(), &limits);
    let rules = |limits: &[Limit]| limits.iter().map(|l| Rule::of(l, algorithm)).collect::<Vec<_>>();
    let mut model = Model::new(tier_limits.iter().map(|l| rules(l)).collect(), keys);

    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(by) => {
                clock.advance(Duration::from_nanos(by));
                model.now += by;
            }
            Op::Align { unit, offset } => {
                let target = (model.now / unit + 1) * unit;
                let target = target.saturating_add_signed(i64::from(offset));
                if target > model.now {
                    clock.set(Duration::from_nanos(target));
                    model.now = target;
                }
            }
            Op::Check { key, cost, times } => {
                let key = key % keys;
                for _ in 0..times {
                    let got = limiter.check_n(&(key as u64), cost);
                    let want = model.decide(key, cost, true);
                    compare(&model, key, cost, &got, &want, &format!("step {step} check"))?;
                }
            }
            Op::Peek { key } => {
                let key = key % keys;
                let got = limiter.peek(&(key as u64));
                let want = model.decide(key, 1, false);
                compare(&model, key, 1, &got, &want, &format!("step {step} peek"))?;
            }
            Op::Reset { key } => {
                let key = key % keys;
                let held = limiter.reset(&(key as u64));
                let k = &mut model.keys[key];
                match k.held {
                    Held::Yes => prop_assert!(held, "step {}: reset of a held key {} said false", step, key),
                    Held::No => {
                        prop_assert!(!held, "step {}: reset of an absent key {} said true", step, key)
                    }
                    Held::Maybe => {}
                }
                let log = std::mem::take(&mut k.log);
                if !log.is_empty() {
                    k.earlier.push(log);
                }
                k.held = Held::No;
            }
            Op::Sweep => {
                let before = limiter.len();
                // `must`: held for sure and idle for longer than the longest window plus one
                // of its slots (README), so the windows are empty and the key is evicted.
                // `may`: possibly held and every window empty. Nothing else may go.
                let (mut must, mut may, mut idle) = (Vec::new(), Vec::new(), Vec::new());
                for key in 0..keys {
                    let held = model.keys[key].held;
                    if held == Held::No {
                        continue;
                    }
                    let empty = model.empty(key);
                    let long_idle = model.idle(key).is_some_and(|idle| idle > model.expiry);
                    prop_assert!(!long_idle || empty, "model: idle key {} not empty", key);
                    if long_idle {
                        idle.push(key);
                        if held == Held::Yes {
                            must.push(key);
                        }
                    }
                    if empty {
                        may.push(key);
                    }
                }
                let evicted = limiter.sweep();
                prop_assert!(
                    (must.len()..=may.len()).contains(&evicted),
                    "step {} at {}: sweep evicted {}, must {:?}, may {:?}",
                    step,
                    model.now,
                    evicted,
                    must,
                    may
                );
                prop_assert_eq!(limiter.len(), before - evicted);
                for &key in &may {
                    let held = &mut model.keys[key].held;
                    if idle.contains(&key) || evicted == may.len() {
                        *held = Held::No;
                    } else if evicted > must.len() && *held == Held::Yes {
                        // Some key beyond `must` went; which one is not observable.
                        *held = Held::Maybe;
                    }
                }
            }
            Op::SetPolicy { .. } | Op::ClearPolicy { .. } | Op::UpdateMax { .. } if !tiers => {}
            Op::SetPolicy { key, tier } => {
                let key = key % keys;
                limiter.set_policy(&(key as u64), TIERS[tier]).unwrap();
                (model.keys[key].tier, model.keys[key].overridden) = (tier, true);
                prop_assert_eq!(limiter.policy_of(&(key as u64)), TIERS[tier]);
            }
            Op::ClearPolicy { key } => {
                let key = key % keys;
                let had = limiter.clear_policy(&(key as u64));
                prop_assert_eq!(had, model.keys[key].overridden);
                (model.keys[key].tier, model.keys[key].overridden) = (key % TIERS.len(), false);
                prop_assert_eq!(limiter.policy_of(&(key as u64)), TIERS[key % TIERS.len()]);
            }
            Op::UpdateMax { tier, bump } => {
                let limits = &mut tier_limits[tier];
                for limit in limits.iter_mut() {
                    let max = if bump == 0 { (limit.max() - 1).max(1) } else { limit.max() + bump };
                    *limit = with_max(limit, max);
                }
                // Only `max` changes: the counts carry over exactly, whatever `Carry` says.
                let config = PolicyConfig::new(limits.iter().copied());
                limiter.update_policy(TIERS[tier], config, Carry::Reset).unwrap();
                model.tiers[tier] = rules(limits);
            }
        }
        let sure = model.keys.iter().filter(|k| k.held == Held::Yes).count();
        let maybe = model.keys.iter().filter(|k| k.held == Held::Maybe).count();
        let len = limiter.len();
        prop_assert!(
            (sure..=sure + maybe).contains(&len),
            "step {}: len {}, held {}+{}?",
            step,
            len,
            sure,
            maybe
        );
        prop_assert_eq!(limiter.is_empty(), len == 0);
    }

    // The accuracy bound, on the log of what the limiter admitted (per life of each key).
    // (With tiers, a key's limits change over its life: the model's decisions were checked.)
    for (key, k) in model.keys.iter().enumerate().filter(|_| !tiers) {
        for log in k.earlier.iter().chain(std::iter::once(&k.log)) {
            for (i, rule) in model.tiers[0].iter().enumerate() {
                let densest = densest(log, rule.window);
                let exact = rule.algorithm == Algorithm::SlidingLog;
                let sliding = rule.algorithm == Algorithm::SlidingWindow;
                if exact || sliding && rule.strict {
                    prop_assert!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else if !sliding {
                    // Fixed window and GCRA: a full window's worth on each side of a boundary
                    // (or a full bucket, then its refill).
                    prop_assert!(
                        densest <= 2 * rule.max,
                        "key {} limit {}: {} in one window",
                        key,
                        i,
                        densest
                    );
                } else if rule.strict {
                    prop_assert!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else {
                    prop_assert!(
                        densest < 2 * rule.max,
                        "key {} limit {}: {} in one window",
                        key,
                        i,
                        densest
                    );
                }
            }
        }
    }
    Ok(())
}

/// The most units logged in any interval `[t, t + window)`.
fn densest(log: &[(u64, u64)], window: u64) -> u64 {
    let mut best = 0;
    for (i, &(start, _)) in log.iter().enumerate() {
        let inside = log[i..].iter().take_while(|&&(at, _)| at < start + window).map(|&(_, c)| c).sum();
        best = best.max(inside);
    }
    best
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
        run(algorithm, &limits, false, keys, &ops)?;
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
        run(algorithm, &limits, true, keys, &ops)?;
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
        run(algorithm, &limits, false, 2, &ops).unwrap();
    }
}
