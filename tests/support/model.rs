//! The exact reference model of the limiter, and the harness that runs a sequence of
//! operations through a `Limiter` and the model side by side. Shared by the property tests
//! (`tests/model.rs`, which draws the cases with proptest) and the fuzz target
//! `fuzz/fuzz_targets/model_ops.rs` (which decodes them from libFuzzer's bytes): plain Rust,
//! no proptest, and a mismatch is an `Err` that says what differed.
//!
//! The model keeps a log of every admitted `(time, cost)` per key, and recomputes each
//! limit's count (sliding window, fixed window, sliding log or GCRA's theoretical arrival
//! time) from it at every step.
//!
//! **Time.** Times are `u64` nanoseconds from the clock's origin; a run may start at any
//! offset (long uptimes: slot tags wrapping at 2³² slots). [`run`] stops the clock at
//! [`MAX_TIME`] = 2⁶² ns (about 146 years), where the limiter's own clock stands still: an
//! advance beyond it stops there, an alignment beyond it is skipped, for the limiter and the
//! model alike. The model adds at most two windows, two slots and a GCRA burst to a time (in
//! `Rule::earliest`), so for windows below 2⁶¹ ns none of its arithmetic can overflow.
// Included by test targets and by the fuzz crate: unwrap and panic are fine in a model.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Accuracy, Algorithm, Carry, Decision, Denial, Limit, Limiter, ManualClock, PolicyConfig};

/// `ensure!(condition, "format", args...)`: returns the message as an `Err` when false.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// `ensure_eq!(left, right[, "format", args...])`: returns both values and the message as
/// an `Err` when they differ.
macro_rules! ensure_eq {
    ($left:expr, $right:expr $(,)?) => {
        ensure_eq!($left, $right, "{} == {}", stringify!($left), stringify!($right))
    };
    ($left:expr, $right:expr, $($fmt:tt)+) => {
        match (&$left, &$right) {
            (left, right) => {
                if left != right {
                    return Err(format!("{}: {:?} != {:?}", format_args!($($fmt)+), left, right));
                }
            }
        }
    };
}

pub const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

pub const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_S: u64 = 1_000_000_000;

/// The small limits the cases draw from (each also in a strict variant).
pub const LIMITS: [&str; 5] = ["3/s", "5/2s@500ms", "10/s@100ms", "7/min@10s", "4/3s@1s"];

/// Limits with fine slots, for the long-uptime cases: 2³² slots of 1 ms are 49.7 days.
pub const FINE_LIMITS: [&str; 2] = ["4/20ms@1ms", "6/250ms@10ms"];

/// Interesting clock offsets for a run of `limits` under `algorithm`: 2³² ms, 2³² s, and
/// every point where a limit's slot index (`now / precision`, or `now / window` for the
/// fixed window) reaches a multiple of 2³² — where the 32-bit slot tags wrap — for the
/// first three multiples that are at most [`MAX_TIME`] (none for slots above 2³⁰ ns, about
/// 1.07 s); also multiples of 2³² windows.
/// Sorted, without duplicates.
pub fn wrap_points(limits: &[Limit], algorithm: Algorithm) -> Vec<u64> {
    let mut points = vec![NS_PER_MS << 32, NS_PER_S << 32];
    for limit in limits {
        let rule = Rule::of(limit, algorithm);
        // The slot (the window, for the fixed window), and the window too: for GCRA and the
        // sliding log, which have no slots, the limit's own scales are still good offsets.
        for slot in [rule.p, rule.window] {
            for multiple in 1..=3u64 {
                match (multiple << 32).checked_mul(slot) {
                    Some(point) if point <= MAX_TIME => points.push(point),
                    _ => {}
                }
            }
        }
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// One limit in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub max: u64,
    pub window: u64,
    /// Slot length (precision).
    pub p: u64,
    /// Slots per window.
    pub n: u64,
    pub strict: bool,
    pub algorithm: Algorithm,
    /// GCRA: ns per unit (`window / max` rounded up) and the tolerance `max × interval`.
    pub interval: u64,
    pub burst: u64,
}

impl Rule {
    pub fn of(limit: &Limit, algorithm: Algorithm) -> Rule {
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
    pub fn expiry(&self) -> u64 {
        let held = if self.algorithm == Algorithm::Gcra { self.burst } else { self.window };
        held + self.p
    }

    /// The scale of [`scaled`](Self::scaled): `p` for the interpolated window, else 1.
    pub fn scale(&self) -> u128 {
        if self.algorithm == Algorithm::SlidingWindow {
            u128::from(self.p)
        } else {
            1
        }
    }

    /// GCRA's theoretical arrival time after the log, and after `cost` more at `t`.
    pub fn tat(&self, log: &[(u64, u64)], t: u64, cost: u64) -> u64 {
        let tat = log.iter().fold(0, |tat: u64, &(at, c)| tat.max(at) + c * self.interval);
        tat.max(t) + cost * self.interval
    }

    /// What the limit counts at `t`, times [`scale`](Self::scale) (GCRA: ns of backlog).
    pub fn scaled(&self, log: &[(u64, u64)], t: u64) -> u128 {
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
    pub fn sliding(&self, log: &[(u64, u64)], t: u64) -> u128 {
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

    pub fn admits(&self, log: &[(u64, u64)], t: u64, cost: u64) -> bool {
        if self.algorithm == Algorithm::Gcra {
            return self.tat(log, t, cost) - t <= self.burst;
        }
        let p = self.scale();
        self.scaled(log, t) + u128::from(cost) * p <= u128::from(self.max) * p
    }

    /// Whole units still free at `t` after `cost` more, rounded down.
    pub fn room(&self, log: &[(u64, u64)], t: u64, cost: u64) -> u64 {
        if self.algorithm == Algorithm::Gcra {
            return self.burst.saturating_sub(self.tat(log, t, cost) - t) / self.interval;
        }
        let p = self.scale();
        let free = (u128::from(self.max) * p).saturating_sub(self.scaled(log, t) + u128::from(cost) * p);
        u64::try_from(free / p).unwrap()
    }

    /// The earliest time >= `now` at which `cost` fits, if no other traffic comes: found by
    /// bisection (the count never rises without traffic), not by a formula.
    pub fn earliest(&self, log: &[(u64, u64)], now: u64, cost: u64) -> u64 {
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
pub enum Held {
    No,
    Yes,
    /// A sweep may or may not have evicted it (its windows were empty).
    Maybe,
}

#[derive(Debug)]
pub struct KeyModel {
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
pub struct Expected {
    denial: Option<Denial>,
    remaining: u64,
    tightest: usize,
    retry_after: Option<Duration>,
}

impl Expected {
    pub fn of(d: &Decision) -> Expected {
        Expected {
            denial: d.denial(),
            remaining: d.remaining(),
            tightest: d.tightest_limit(),
            retry_after: d.retry_after(),
        }
    }
}

pub struct Model {
    /// Each policy's rules (one policy unless the case draws tiers).
    tiers: Vec<Vec<Rule>>,
    now: u64,
    /// Idle for longer than this, a key's windows are all empty.
    expiry: u64,
    keys: Vec<KeyModel>,
}

impl Model {
    /// A model of `keys` keys (key `i` on tier `i % tiers`), with its clock at `now`.
    pub fn new(tiers: Vec<Vec<Rule>>, keys: usize, now: u64) -> Model {
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
        Model { tiers, now, expiry, keys }
    }

    pub fn rules(&self, key: usize) -> &[Rule] {
        &self.tiers[self.keys[key].tier]
    }

    pub fn admits_all(&self, key: usize, t: u64, cost: u64) -> bool {
        self.rules(key).iter().all(|r| r.admits(&self.keys[key].log, t, cost))
    }

    /// Minimum room over the limits, and the first limit with it.
    pub fn tightest(&self, key: usize, cost: u64) -> (usize, u64) {
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
    pub fn decide(&mut self, key: usize, cost: u64, commit: bool) -> Expected {
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

    pub fn empty(&self, key: usize) -> bool {
        self.rules(key).iter().all(|r| r.scaled(&self.keys[key].log, self.now) == 0)
    }

    pub fn idle(&self, key: usize) -> Option<u64> {
        self.keys[key].log.last().map(|&(at, _)| self.now - at)
    }
}

#[derive(Debug, Clone)]
pub enum Op {
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

/// Compares one decision with the model's, including the `retry_after` property.
pub fn compare(
    model: &Model,
    key: usize,
    cost: u64,
    got: &Decision,
    want: &Expected,
    what: &str,
) -> Result<(), String> {
    let now = model.now;
    ensure_eq!(&Expected::of(got), want, "{} key {} cost {} at {} ns", what, key, cost, now);
    ensure_eq!(got.is_allowed(), want.denial.is_none());
    if let Some(wait) = got.retry_after() {
        // The earliest moment the model admits the same request, to the nanosecond.
        let wait = u64::try_from(wait.as_nanos()).unwrap();
        ensure!(wait > 0, "{} key {} cost {} at {}: refused with retry_after 0", what, key, cost, now);
        ensure!(
            model.admits_all(key, now + wait, cost),
            "{} at {}: not admitted after {} ns",
            what,
            now,
            wait
        );
        ensure!(
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
pub fn with_max(limit: &Limit, max: u64) -> Limit {
    let same = Limit::new(max, limit.window()).precision(limit.get_precision());
    if limit.accuracy() == Accuracy::Strict {
        same.strict()
    } else {
        same
    }
}

pub const TIERS: [&str; 3] = ["t0", "t1", "t2"];

/// The latest time [`run`] moves the clock to: 2⁶² ns (about 146 years), where the
/// limiter's clock stands still (its end of time), and far enough below 2⁶⁴ that the
/// model's arithmetic (a time plus at most two windows, two slots and a GCRA burst) cannot
/// overflow. It is beyond 2³² slots of every precision up to 1 s (2³² s is 136 years), so
/// long-uptime runs cross the slot tags' wrap-around for those.
pub const MAX_TIME: u64 = 1 << 62;

/// Runs `ops` through a limiter on a [`ManualClock`] and through the model side by side,
/// both starting at `start` ns (at most [`MAX_TIME`]), and checks every answer: one policy
/// of `limits` (through `.limit()`), or with `tiers`, three policies that differ from
/// `limits` in `max` only, chosen per key by a resolver (key modulo 3). Advances of any
/// size are applied up to `MAX_TIME` (the rest is dropped, for the limiter and the model
/// alike). The first mismatch is returned as an `Err` saying what differed.
pub fn run(
    algorithm: Algorithm,
    limits: &[Limit],
    tiers: bool,
    keys: usize,
    ops: &[Op],
    start: u64,
) -> Result<(), String> {
    ensure!(start <= MAX_TIME, "start {} is beyond MAX_TIME {}", start, MAX_TIME);
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(start));
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
    let limiter = builder.build().map_err(|e| format!("build: {e}"))?;
    ensure_eq!(&limiter.limits(), &limits, "the limiter's limits");
    let rules = |limits: &[Limit]| limits.iter().map(|l| Rule::of(l, algorithm)).collect::<Vec<_>>();
    let mut model = Model::new(tier_limits.iter().map(|l| rules(l)).collect(), keys, start);

    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(by) => {
                let by = by.min(MAX_TIME - model.now);
                clock.advance(Duration::from_nanos(by));
                model.now += by;
            }
            Op::Align { unit, offset } => {
                // The next multiple of `unit` (skipped if it is beyond MAX_TIME).
                let next = (model.now / unit.max(1) + 1).checked_mul(unit);
                let target = next.map_or(u64::MAX, |next| next.saturating_add_signed(i64::from(offset)));
                if target > model.now && target <= MAX_TIME {
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
                    Held::Yes => ensure!(held, "step {}: reset of a held key {} said false", step, key),
                    Held::No => {
                        ensure!(!held, "step {}: reset of an absent key {} said true", step, key)
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
                    ensure!(!long_idle || empty, "model: idle key {} not empty", key);
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
                ensure!(
                    (must.len()..=may.len()).contains(&evicted),
                    "step {} at {}: sweep evicted {}, must {:?}, may {:?}",
                    step,
                    model.now,
                    evicted,
                    must,
                    may
                );
                ensure_eq!(limiter.len(), before - evicted);
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
                let tier = tier % TIERS.len();
                limiter.set_policy(&(key as u64), TIERS[tier]).map_err(|e| format!("set_policy: {e}"))?;
                (model.keys[key].tier, model.keys[key].overridden) = (tier, true);
                ensure_eq!(limiter.policy_of(&(key as u64)), TIERS[tier]);
            }
            Op::ClearPolicy { key } => {
                let key = key % keys;
                let had = limiter.clear_policy(&(key as u64));
                ensure_eq!(had, model.keys[key].overridden);
                (model.keys[key].tier, model.keys[key].overridden) = (key % TIERS.len(), false);
                ensure_eq!(limiter.policy_of(&(key as u64)), TIERS[key % TIERS.len()]);
            }
            Op::UpdateMax { tier, bump } => {
                let tier = tier % TIERS.len();
                let limits = &mut tier_limits[tier];
                for limit in limits.iter_mut() {
                    let max = if bump == 0 { (limit.max() - 1).max(1) } else { limit.max() + bump };
                    *limit = with_max(limit, max);
                }
                // Only `max` changes: the counts carry over exactly, whatever `Carry` says.
                let config = PolicyConfig::new(limits.iter().copied());
                limiter
                    .update_policy(TIERS[tier], config, Carry::Reset)
                    .map_err(|e| format!("step {step}: update_policy: {e}"))?;
                model.tiers[tier] = rules(limits);
            }
        }
        let sure = model.keys.iter().filter(|k| k.held == Held::Yes).count();
        let maybe = model.keys.iter().filter(|k| k.held == Held::Maybe).count();
        let len = limiter.len();
        ensure!((sure..=sure + maybe).contains(&len), "step {}: len {}, held {}+{}?", step, len, sure, maybe);
        ensure_eq!(limiter.is_empty(), len == 0);
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
                    ensure!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else if !sliding {
                    // Fixed window and GCRA: a full window's worth on each side of a boundary
                    // (or a full bucket, then its refill).
                    ensure!(densest <= 2 * rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else if rule.strict {
                    ensure!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else {
                    ensure!(densest < 2 * rule.max, "key {} limit {}: {} in one window", key, i, densest);
                }
            }
        }
    }
    Ok(())
}

/// The most units logged in any interval `[t, t + window)` (the log is in time order).
pub fn densest(log: &[(u64, u64)], window: u64) -> u64 {
    // Two pointers: `inside` holds the units of `log[i..end]`, those before `start + window`.
    let (mut best, mut inside, mut end) = (0, 0, 0);
    for (i, &(start, cost)) in log.iter().enumerate() {
        debug_assert!(i == 0 || log[i - 1].0 <= start, "the log is in time order");
        while end < log.len() && log[end].0 < start + window {
            inside += log[end].1;
            end += 1;
        }
        best = best.max(inside);
        inside -= cost;
    }
    best
}
