//! Long uptime: clock values past 2³² ms and 2³² s, slot indices crossing multiples of 2³²
//! (where the 32-bit slot tags wrap), a simulated year of traffic in steps of every size,
//! jumps of months, of ten years and to the end of the clock, keys kept alive for more than
//! 2³² slots, and the end of the clock's range: 2⁶² ns (about 146 years), where every clock
//! stands still ([`END_OF_TIME`]), with windows up to `MAX_WINDOW` (100 years).
//!
//! Two oracles, used together:
//! * **An exact model** of every algorithm, written from the semantics guide with none of
//!   the library's machinery: absolute times and 64-bit slot indices (no tags, no ring, no
//!   `sum` word, no expiry shortcut), and `retry_after` found by binary search over the
//!   nanoseconds rather than solved. Every decision is compared with it field by field
//!   (admitted, denial, remaining, tightest limit, retry_after), and so are `sweep`'s count,
//!   `reset`'s answer and `len()`.
//! * **Translation invariance**: slots are aligned to the clock's origin, so a limiter whose
//!   clock starts at an offset that is a multiple of every window and precision must decide
//!   exactly as a twin starting at 0, fed the same requests at the same relative times.
//!
//! Nothing here asserts on elapsed time. `SLIDEGATE_UPTIME_FULL=1` also runs the slow
//! variant of one test (a single 1 ms-precision key kept alive for 2³² slots, one check per
//! window: about 1.2 M checks that each rewrite a 3601-slot ring; run it in release).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::Barrier;
use std::time::Duration;

use slidegate::{ConfigError, Decision, Denial, Limit, Limiter, ManualClock, MAX_WINDOW};

#[allow(dead_code)]
mod support {
    pub mod rng;
    pub mod variant;
}
use support::rng::Rng;
use support::variant::{Variant, VARIANTS};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const MIN: u64 = 60 * S;
const H: u64 = 60 * MIN;
const DAY: u64 = 24 * H;
/// 2³²: slot tags are the low 32 bits of the slot index.
const TAG: u64 = 1 << 32;
/// The end of the clock: every limiter clock stands still 2⁶² ns (about 146 years) after its
/// origin (`END_OF_TIME` in src/clock.rs). No traffic here goes past it; slot-tag wraps
/// beyond it are unreachable.
const END_OF_TIME: u64 = 1 << 62;

/// An algorithm, with the sliding window in both its accuracies.
impl Variant {
    fn limits(self, texts: &[&str]) -> Vec<Limit> {
        texts
            .iter()
            .map(|text| {
                let limit: Limit = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
                self.limit(limit)
            })
            .collect()
    }

    /// A limiter running `texts` on `clock`.
    fn limiter(self, texts: &[&str], clock: &ManualClock) -> Limiter<u64> {
        let mut builder = Limiter::<u64>::builder().algorithm(self.algorithm()).clock(clock.clone());
        for limit in self.limits(texts) {
            builder = builder.limit(limit);
        }
        builder.build().unwrap_or_else(|e| panic!("{self:?} {texts:?}: {e}"))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

fn at(clock: &ManualClock, t: u64) {
    assert!(t <= END_OF_TIME, "{t} ns is past the end of the clock, where it stands still");
    clock.set(Duration::from_nanos(t));
    assert_eq!(nanos(clock.now()), t, "the clock only moves forward");
}

/// A decision's every observable field, comparable.
type Parts = (bool, Option<Denial>, u64, Option<Duration>, usize);

fn parts(d: &Decision) -> Parts {
    (d.is_allowed(), d.denial(), d.remaining(), d.retry_after(), d.tightest_limit())
}

// ---------------------------------------------------------------------------------------
// The model.

/// One limit as the model counts it (ns), as `Policy` lays it out: a fixed window is one
/// slot as long as the window; GCRA's interval is rounded up.
#[derive(Debug, Clone, Copy)]
struct Rule {
    max: u64,
    window: u64,
    precision: u64,
    slots: u64,
    strict: bool,
    interval: u64,
    burst: u64,
}

impl Rule {
    fn new(variant: Variant, limit: &Limit) -> Rule {
        let window = nanos(limit.window());
        let (precision, slots) = match variant {
            Variant::Fixed => (window, 1),
            _ => (nanos(limit.get_precision()), limit.slots()),
        };
        let interval = window.div_ceil(limit.max());
        Rule {
            max: limit.max(),
            window,
            precision,
            slots,
            strict: variant == Variant::Strict,
            interval,
            burst: interval * limit.max(),
        }
    }

    /// The times at which this limit's slot index (`now / precision + ring`, whose low 32
    /// bits are the tag) is a multiple of 2³², up to the end of the clock (2⁶² ns: later
    /// wraps are unreachable).
    fn wraps(&self) -> impl Iterator<Item = u64> + '_ {
        (1u64..)
            .map(|m| (m * TAG - (self.slots + 1)).saturating_mul(self.precision))
            .take_while(|&w| w <= END_OF_TIME)
    }
}

/// One key in the model: whether the limiter holds it (and the state's `touched` time),
/// and what each limit counts.
#[derive(Debug, Default, Clone)]
struct KeyModel {
    touched: Option<u64>,
    /// Sliding and fixed windows: units per slot index.
    slots: Vec<BTreeMap<u64, u64>>,
    /// Sliding log: admitted `(time, cost)`.
    log: Vec<VecDeque<(u64, u64)>>,
    /// GCRA: the theoretical arrival time.
    tat: Vec<u64>,
}

struct Model {
    variant: Variant,
    rules: Vec<Rule>,
    /// A key untouched for this long holds nothing (as `Policy` computes it).
    expiry: u64,
    keys: BTreeMap<u64, KeyModel>,
}

impl Model {
    fn new(variant: Variant, limits: &[Limit]) -> Model {
        let rules: Vec<Rule> = limits.iter().map(|l| Rule::new(variant, l)).collect();
        let held = |r: &Rule| if variant == Variant::Gcra { r.burst } else { r.window };
        let expiry = rules.iter().map(|r| held(r) + r.precision).max().unwrap();
        Model { variant, rules, expiry, keys: BTreeMap::new() }
    }

    fn empty(&self) -> KeyModel {
        let n = self.rules.len();
        KeyModel {
            touched: None,
            slots: vec![BTreeMap::new(); n],
            log: vec![VecDeque::new(); n],
            tat: vec![0; n],
        }
    }

    /// Units limit `j` of `key` counts at `t` and whether `cost` more fit, as
    /// `(admits, room after cost)`.
    fn limit_at(&self, key: u64, j: usize, t: u64, cost: u64) -> (bool, u64) {
        let r = &self.rules[j];
        let Some(k) = self.keys.get(&key) else {
            return (cost <= r.max, r.max.saturating_sub(cost));
        };
        match self.variant {
            Variant::Interpolated | Variant::Strict => {
                let counts = &k.slots[j];
                let (slot, elapsed) = (t / r.precision, t % r.precision);
                let current = counts.get(&slot).copied().unwrap_or(0);
                let full: u64 = counts.range((slot + 1).saturating_sub(r.slots)..slot).map(|(_, c)| c).sum();
                let oldest = slot.checked_sub(r.slots).and_then(|i| counts.get(&i)).copied().unwrap_or(0);
                let weight = if r.strict { r.precision } else { r.precision - elapsed };
                let used = current + full + cost;
                let p = u128::from(r.precision);
                let faded = u128::from(oldest) * u128::from(weight);
                let admits = used <= r.max && faded <= u128::from(r.max - used) * p;
                let share = u64::try_from(faded.div_ceil(p)).unwrap();
                (admits, r.max.saturating_sub(used).saturating_sub(share))
            }
            Variant::Fixed => {
                let used = k.slots[j].get(&(t / r.window)).copied().unwrap_or(0) + cost;
                (used <= r.max, r.max.saturating_sub(used))
            }
            Variant::Log => {
                let inside: u64 =
                    k.log[j].iter().filter(|&&(at, _)| t - at < r.window).map(|&(_, c)| c).sum();
                let used = inside + cost;
                (used <= r.max, r.max.saturating_sub(used))
            }
            Variant::Gcra => {
                let used = k.tat[j].saturating_sub(t) + cost * r.interval;
                (used <= r.burst, r.burst.saturating_sub(used) / r.interval)
            }
        }
    }

    /// The first time after `t` at which limit `j` admits `cost` with no other traffic: a
    /// binary search, as the count never rises while nothing is admitted.
    fn admissible_at(&self, key: u64, j: usize, t: u64, cost: u64) -> u64 {
        let r = &self.rules[j];
        // Two windows of a century (a fixed window's slot is one) pass 2⁶⁴: saturate.
        let (mut lo, mut hi) = (t, t.saturating_add((r.window + r.precision + r.burst).saturating_mul(2)));
        assert!(self.limit_at(key, j, hi, cost).0, "the model frees up within two windows");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.limit_at(key, j, mid, cost).0 {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// What the limiter must answer to `check_n(key, cost)` (or, with `cost` 1 and nothing
    /// committed, to `peek(key)`) at `t`.
    fn expect(&self, key: u64, t: u64, cost: u64) -> Parts {
        let rules = 0..self.rules.len();
        let room = |cost: u64| rules.clone().map(move |j| (j, self.limit_at(key, j, t, cost).1));
        // `min_by_key` keeps the first of equal minima: the lowest index, as the limiter does.
        let least = |cost: u64| room(cost).min_by_key(|&(_, room)| room).unwrap();
        if let Some(j) = rules.clone().find(|&j| cost > self.rules[j].max) {
            return (false, Some(Denial::CostTooLarge(j)), least(0).1, None, j);
        }
        let refusing: Vec<usize> = rules.clone().filter(|&j| !self.limit_at(key, j, t, cost).0).collect();
        if refusing.is_empty() {
            let (j, remaining) = least(cost);
            return (true, None, remaining, None, j);
        }
        // The refusing limit that frees up last; the lowest index among equals.
        let (j, when) = refusing
            .iter()
            .map(|&j| (j, self.admissible_at(key, j, t, cost)))
            .fold(None, |best: Option<(usize, u64)>, (j, when)| match best {
                Some((_, b)) if b >= when => best,
                _ => Some((j, when)),
            })
            .unwrap();
        (false, Some(Denial::Limit(j)), least(0).1, Some(Duration::from_nanos(when - t)), j)
    }

    /// Counts an admission of `cost` (> 0) at `t`, with the state bookkeeping of the
    /// limiter: a key absent or expired gets a fresh state (`touched = t`), and `touched`
    /// moves to `t` when the admission falls in a slot of some limit that starts after it.
    fn commit(&mut self, key: u64, t: u64, cost: u64) {
        let expiry = self.expiry;
        let fresh = self.empty();
        let rules = self.rules.clone();
        let variant = self.variant;
        let k = self.keys.entry(key).or_insert(fresh);
        let mut touched = match k.touched {
            Some(touched) if t.saturating_sub(touched) < expiry => touched,
            _ => t,
        };
        if rules.iter().any(|r| t / r.precision * r.precision > touched) {
            touched = t;
        }
        k.touched = Some(touched);
        for (j, r) in rules.iter().enumerate() {
            match variant {
                Variant::Interpolated | Variant::Strict | Variant::Fixed => {
                    let slot = t / r.precision;
                    *k.slots[j].entry(slot).or_insert(0) += cost;
                    // Nothing older than the window's oldest slot can count again.
                    let keep = k.slots[j].split_off(&slot.saturating_sub(r.slots));
                    k.slots[j] = keep;
                }
                Variant::Log => {
                    let log = &mut k.log[j];
                    while log.front().is_some_and(|&(at, _)| t - at >= r.window) {
                        log.pop_front();
                    }
                    log.push_back((t, cost));
                }
                Variant::Gcra => k.tat[j] = k.tat[j].max(t) + cost * r.interval,
            }
        }
    }

    /// `sweep()` at `t`: every held key untouched for `expiry` goes.
    fn sweep(&mut self, t: u64) -> usize {
        let expiry = self.expiry;
        let gone: Vec<u64> = self
            .keys
            .iter()
            .filter(|(_, k)| k.touched.is_some_and(|touched| t.saturating_sub(touched) >= expiry))
            .map(|(&key, _)| key)
            .collect();
        for key in &gone {
            self.keys.remove(key);
        }
        gone.len()
    }

    fn reset(&mut self, key: u64) -> bool {
        self.keys.remove(&key).is_some_and(|k| k.touched.is_some())
    }

    fn len(&self) -> usize {
        self.keys.values().filter(|k| k.touched.is_some()).count()
    }

    fn held(&self, key: u64) -> bool {
        self.keys.get(&key).is_some_and(|k| k.touched.is_some())
    }
}

/// The most units in any interval of length `window` of a log of admissions (sorted by
/// time): closed intervals `[t, t + window]`, or half-open `[t, t + window)`.
fn densest(log: &[(u64, u64)], window: u64, closed: bool) -> u64 {
    let (mut best, mut sum, mut first) = (0, 0, 0);
    for &(t, cost) in log {
        sum += cost;
        while first < log.len() && {
            let age = t - log[first].0;
            if closed {
                age > window
            } else {
                age >= window
            }
        } {
            sum -= log[first].1;
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

// ---------------------------------------------------------------------------------------
// A limiter under test, its model, and optionally its translation twin.

struct Sim {
    label: String,
    texts: Vec<String>,
    variant: Variant,
    model: Model,
    clock: ManualClock,
    limiter: Limiter<u64>,
    /// The limiter's clock reads `offset + rel`; the twin's reads `rel`.
    offset: u64,
    rel: u64,
    twin: Option<(ManualClock, Limiter<u64>)>,
    /// Every admission per key since its last `reset`: (time on the limiter's clock, cost).
    admitted: BTreeMap<u64, Vec<Vec<(u64, u64)>>>,
    ops: u64,
    refusals: u64,
    /// When each check was made (relative), and how many keys sweeps evicted.
    checked_at: Vec<u64>,
    evicted: usize,
}

impl Sim {
    fn new(label: &str, variant: Variant, texts: &[&str], offset: u64, twin: bool) -> Sim {
        let clock = ManualClock::new();
        at(&clock, offset);
        let limiter = variant.limiter(texts, &clock);
        let twin = twin.then(|| {
            let clock = ManualClock::new();
            let limiter = variant.limiter(texts, &clock);
            (clock, limiter)
        });
        Sim {
            label: format!("{label} {variant:?} {texts:?} offset {offset}"),
            texts: texts.iter().map(|t| t.to_string()).collect(),
            variant,
            model: Model::new(variant, &variant.limits(texts)),
            clock,
            limiter,
            offset,
            rel: 0,
            twin,
            admitted: BTreeMap::new(),
            ops: 0,
            refusals: 0,
            checked_at: Vec::new(),
            evicted: 0,
        }
    }

    fn now(&self) -> u64 {
        self.offset + self.rel
    }

    fn advance(&mut self, by: u64) {
        self.rel += by;
        let now = self.offset + self.rel;
        assert!(now <= END_OF_TIME, "{}: past the end of the clock", self.label);
        at(&self.clock, now);
        if let Some((clock, _)) = &self.twin {
            at(clock, self.rel);
        }
    }

    fn context(&self, op: &str, key: u64) -> String {
        format!("{}: op #{} {op} on key {key} at {} (+{} ns)", self.label, self.ops, self.now(), self.rel)
    }

    /// `check_n(key, cost)` on the limiter (and its twin), compared with the model.
    fn check(&mut self, key: u64, cost: u64) -> Decision {
        self.ops += 1;
        self.checked_at.push(self.rel);
        let t = self.now();
        let want = self.model.expect(key, t, cost);
        let got = self.limiter.check_n(&key, cost);
        assert_eq!(parts(&got), want, "{}", self.context(&format!("check_n({cost})"), key));
        if let Some((_, twin)) = &self.twin {
            let mirrored = twin.check_n(&key, cost);
            assert_eq!(parts(&mirrored), parts(&got), "{}: the twin at 0", self.context("check_n", key));
        }
        if got.is_allowed() && cost > 0 {
            self.model.commit(key, t, cost);
            let epochs = self.admitted.entry(key).or_insert_with(|| vec![Vec::new()]);
            epochs.last_mut().unwrap().push((t, cost));
        }
        if got.denial().is_some() {
            self.refusals += 1;
        }
        got
    }

    fn peek(&mut self, key: u64) -> Decision {
        self.ops += 1;
        let want = self.model.expect(key, self.now(), 1);
        let got = self.limiter.peek(&key);
        assert_eq!(parts(&got), want, "{}", self.context("peek", key));
        if let Some((_, twin)) = &self.twin {
            assert_eq!(parts(&twin.peek(&key)), want, "{}: the twin at 0", self.context("peek", key));
        }
        got
    }

    fn sweep(&mut self) -> usize {
        self.ops += 1;
        let want = self.model.sweep(self.now());
        let got = self.limiter.sweep();
        assert_eq!(got, want, "{}", self.context("sweep", 0));
        self.evicted += got;
        if let Some((_, twin)) = &self.twin {
            assert_eq!(twin.sweep(), want, "{}: the twin at 0", self.context("sweep", 0));
        }
        self.assert_len();
        got
    }

    fn reset(&mut self, key: u64) {
        self.ops += 1;
        let want = self.model.reset(key);
        // A reset forgets the key's counts: the bounds hold between resets.
        if let Some(epochs) = self.admitted.get_mut(&key) {
            epochs.push(Vec::new());
        }
        assert_eq!(self.limiter.reset(&key), want, "{}", self.context("reset", key));
        if let Some((_, twin)) = &self.twin {
            assert_eq!(twin.reset(&key), want, "{}: the twin at 0", self.context("reset", key));
        }
    }

    fn assert_len(&self) {
        let want = self.model.len();
        assert_eq!(self.limiter.len(), want, "{}", self.context("len", 0));
        if let Some((_, twin)) = &self.twin {
            assert_eq!(twin.len(), want, "{}: the twin at 0", self.context("len", 0));
        }
    }

    /// One random operation on one of `keys` keys: mostly checks of small costs, some
    /// peeks, costs of 0 and above every `max`, a few resets and sweeps. For a check, its
    /// key, cost and decision.
    fn random_op(&mut self, rng: &mut Rng, keys: u64) -> Option<(u64, u64, Decision)> {
        let key = rng.below(keys);
        let smallest = self.model.rules.iter().map(|r| r.max).min().unwrap();
        let cost = match rng.below(100) {
            0..=59 => 1,
            60..=84 => 2 + rng.below(3),
            85..=88 => smallest,
            89..=95 => {
                let _ = self.peek(key);
                return None;
            }
            96 => 0,
            97 => smallest + 1 + rng.below(1000),
            98 => {
                self.reset(key);
                let _ = self.peek(key);
                return None;
            }
            _ => {
                self.sweep();
                let _ = self.peek(key);
                return None;
            }
        };
        Some((key, cost, self.check(key, cost)))
    }

    /// After a refusal by a limit: wait `retry_after − 1 ns` (still refused), then 1 ns more
    /// (admitted), the same request on the same key, no other traffic in between.
    fn wait_and_retry(&mut self, key: u64, cost: u64, refused: Decision) {
        let wait =
            nanos(refused.retry_after().unwrap_or_else(|| panic!("{}", self.context("retry_after", key))));
        assert!(wait > 0, "{}: a refusal with retry_after 0", self.context("check", key));
        self.advance(wait - 1);
        let early = self.check(key, cost);
        assert!(!early.is_allowed(), "{}: admitted 1 ns before retry_after", self.context("check", key));
        self.advance(1);
        let retried = self.check(key, cost);
        assert!(retried.is_allowed(), "{}: refused after waiting retry_after", self.context("check", key));
    }

    /// The accuracy bound of each limit over every admission so far, per key.
    fn assert_bounds(&self) {
        for (key, log) in
            self.admitted.iter().flat_map(|(key, epochs)| epochs.iter().map(move |log| (key, log)))
        {
            for (j, r) in self.model.rules.iter().enumerate() {
                let (most, bound) = match self.variant {
                    // No interval of length `window` (closed) holds more than max.
                    Variant::Strict => (densest(log, r.window, true), r.max),
                    // A unit counts while it is less than `window` old.
                    Variant::Log => (densest(log, r.window, false), r.max),
                    // "Always below max + units in one slot ≤ 2 × max".
                    Variant::Interpolated => (densest(log, r.window, false), 2 * r.max - 1),
                    Variant::Fixed | Variant::Gcra => (densest(log, r.window, false), 2 * r.max),
                };
                assert!(
                    most <= bound,
                    "{}: key {key} limit {} admitted {most} units in one window (bound {bound})",
                    self.label,
                    self.texts[j]
                );
            }
        }
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// The least common multiple of every window and precision: an offset that is a multiple
/// of it moves every slot boundary onto a slot boundary.
fn period(model: &Model) -> u64 {
    model.rules.iter().fold(1, |p, r| lcm(lcm(p, r.window), r.precision))
}

// ---------------------------------------------------------------------------------------
// Translation invariance across 2³² ms, 2³² s and every tag wrap.

/// A step of traffic for a run that must be dense around the points in `focus` (relative
/// times) and may be sparse elsewhere: the further from every focus, the longer the steps,
/// never long enough to jump over the dense part.
fn focused_step(rng: &mut Rng, rel: u64, focus: &[u64]) -> u64 {
    let distance = focus.iter().map(|&f| f.abs_diff(rel)).min().unwrap_or(u64::MAX);
    let most = match distance {
        d if d < 250 * MS => 3 * MS,
        d if d < 10 * S => 200 * MS,
        d if d < 10 * MIN => 10 * S,
        _ => 3 * MIN,
    };
    match rng.below(10) {
        0 | 1 => 0,
        2 => 1,
        // To the next boundary of a 1 ms / 1 s / 1 min slot, or 1 ns before it.
        3 => {
            let unit = [MS, S, MIN][rng.below(3) as usize].min(most);
            let next = (rel / unit + 1) * unit - rel;
            next - rng.below(2).min(next - 1)
        }
        _ => 1 + rng.below(most),
    }
}

fn translation_run(variant: Variant, texts: &[&str], label: &str, target: u64, seed: u64) -> (u64, u64) {
    let model = Model::new(variant, &variant.limits(texts));
    let period = period(&model);
    // A little before the target, on a multiple of the period; if the run would come near
    // the end of the clock, the last such offset that leaves room for it.
    let span = 90 * MIN;
    let room = 4 * H;
    let offset = target.saturating_sub(span).min(END_OF_TIME - room) / period * period;
    let length = target.min(END_OF_TIME - room) - offset + 60 * MIN;
    let mut focus: Vec<u64> = model
        .rules
        .iter()
        .flat_map(|r| {
            r.wraps().skip_while(|&w| w < offset).take_while(|&w| w <= offset + length).collect::<Vec<_>>()
        })
        .map(|w| w - offset)
        .collect();
    focus.push(target.min(END_OF_TIME - room) - offset);
    let mut sim = Sim::new(label, variant, texts, offset, true);
    let mut rng = Rng(seed);
    while sim.rel < length {
        let step = focused_step(&mut rng, sim.rel, &focus);
        if let Some(&f) = focus.iter().filter(|&&f| sim.rel < f && f <= sim.rel + step).min() {
            // A step onto or over a wrap: a check in its last nanosecond before, one at it.
            sim.advance(f - 1 - sim.rel);
            let _ = sim.check(rng.below(3), 1 + rng.below(2));
            sim.advance(1);
        } else {
            sim.advance(step);
        }
        for _ in 0..1 + rng.below(2) {
            sim.random_op(&mut rng, 3);
        }
        if rng.below(64) == 0 {
            sim.sweep();
        }
    }
    // The traffic straddles every wrap: checks in the last 3 ms before it and the first 3 ms
    // from it (the slots whose tags are 2³² − 1 and 0).
    for f in focus {
        let before = sim.checked_at.iter().any(|&t| t < f && f - t <= 3 * MS);
        let after = sim.checked_at.iter().any(|&t| t >= f && t - f < 3 * MS);
        assert!(before && after, "{}: no checks around +{f} ns", sim.label);
    }
    sim.assert_bounds();
    sim.assert_len();
    (sim.ops, sim.refusals)
}

/// The interesting points on a long-running clock for a policy: 2³² ms, 2³² s, and where
/// each limit's slot index first crosses a multiple of 2³², a later crossing, and the last
/// one before the end of the clock (2⁶² ns; crossings beyond it are unreachable, see
/// `Rule::wraps`); then the end of the clock itself.
fn targets(variant: Variant, texts: &[&str]) -> Vec<(String, u64)> {
    let model = Model::new(variant, &variant.limits(texts));
    let mut targets = vec![("2^32 ms".to_string(), TAG * MS), ("2^32 s".to_string(), TAG * S)];
    let mut seen = Vec::new();
    for (r, text) in model.rules.iter().zip(texts) {
        if seen.contains(&(r.precision, r.slots)) {
            continue;
        }
        seen.push((r.precision, r.slots));
        let wraps: Vec<u64> = r.wraps().collect();
        let picks = match wraps.len() {
            0 => vec![],
            1 | 2 => wraps.clone(),
            n => vec![wraps[0], wraps[1], wraps[n - 1]],
        };
        for w in picks {
            targets.push((format!("{text}: slot index {}·2^32", (w / r.precision + r.slots + 1) >> 32), w));
        }
    }
    targets.push(("the end of the clock".to_string(), END_OF_TIME));
    targets
}

const POLICY: [&str; 4] = ["10/s", "120/min", "240/h@1min", "100/50ms@1ms"];

#[test]
fn the_same_traffic_far_from_zero_decides_as_near_zero_for_every_algorithm() {
    let mut seed = 0x5EED_0001;
    for variant in VARIANTS {
        let (mut ops, mut refusals) = (0, 0);
        for (name, target) in targets(variant, &POLICY) {
            seed += 1;
            let (o, r) = translation_run(variant, &POLICY, &name, target, seed);
            ops += o;
            refusals += r;
        }
        // The traffic reaches the limits: refusals are a good part of the decisions.
        assert!(refusals * 10 > ops, "{variant:?}: {refusals} refusals in {ops} operations");
    }
}

#[test]
fn every_tag_wrap_is_crossed_where_expected() {
    // The test above relies on these being the points where tags wrap: check the arithmetic
    // against the documented layout (slot index = now / precision + slots + 1).
    let model = Model::new(Variant::Interpolated, &Variant::Interpolated.limits(&POLICY));
    let ms_rule = model.rules[3];
    assert_eq!((ms_rule.precision, ms_rule.slots), (MS, 50));
    let first = ms_rule.wraps().next().unwrap();
    assert_eq!(first, (TAG - 51) * MS);
    assert_eq!((first / MS + 51) % TAG, 0);
    // One-second slots wrap once before the end of the clock (2⁶² ns ≈ 1.07 · 2³² s; the
    // three later wraps of the whole u64 range are unreachable); one-minute slots never.
    assert_eq!(model.rules[0].wraps().collect::<Vec<_>>(), [(TAG - 2) * S]);
    assert_eq!(model.rules[1].wraps().collect::<Vec<_>>(), [(TAG - 61) * S]);
    assert_eq!(model.rules[2].wraps().count(), 0);
    // 1 ms slots wrap every 2³² ms, about 49.7 days: 1073 times in the clock's range, the
    // last about 36.9 days before its end.
    assert_eq!(ms_rule.wraps().count(), 1073);
    let last = ms_rule.wraps().last().unwrap();
    assert_eq!(last, (1073 * TAG - 51) * MS);
    assert!(last <= END_OF_TIME && (1074 * TAG - 51) * MS > END_OF_TIME);
    // 2³² ms, 2³² s, for the 1 s slots their one wrap, for the 1 ms slots the first, second
    // and last, and the end of the clock.
    let targets = targets(Variant::Interpolated, &POLICY);
    assert_eq!(targets.len(), 8, "{targets:?}");
    assert!(targets.iter().any(|&(_, t)| t == last));
    assert!(targets.iter().all(|&(_, t)| t <= END_OF_TIME));
}

// ---------------------------------------------------------------------------------------
// A simulated year.

/// Steps of every size: 1 ns, µs, ms, exactly a slot, to a slot boundary, exactly a window,
/// hours, days, weeks and months, in episodes of a few steps of one kind.
fn year_step(rng: &mut Rng, rules: &[Rule], rel: u64) -> (u64, u64) {
    let rule = rules[rng.below(rules.len() as u64) as usize];
    let (step, episode) = match rng.below(100) {
        0..=9 => (1, 1 + rng.below(40)),
        10..=24 => (1 + rng.below(1000 * US), 1 + rng.below(60)),
        25..=44 => (1 + rng.below(1000 * MS), 1 + rng.below(60)),
        45..=59 => (rule.precision, 1 + rng.below(10)),
        60..=69 => {
            let next = (rel / rule.precision + 1) * rule.precision - rel;
            (next - rng.below(2).min(next - 1), 1 + rng.below(5))
        }
        70..=79 => (rule.window + rng.below(3) - 1, 1 + rng.below(3)),
        80..=91 => (1 + rng.below(24 * H), 1 + rng.below(2)),
        92..=96 => (1 + rng.below(7 * DAY), 1),
        97..=98 => (7 * DAY * (1 + rng.below(4)), 1),
        _ => (28 * DAY + rng.below(4 * DAY), 1),
    };
    (step, episode)
}

fn simulate_year(variant: Variant, seed: u64) -> Sim {
    const YEAR_POLICY: [&str; 5] = ["100/50ms@1ms", "10/s", "120/min", "240/h@1min", "1000/d"];
    let model = Model::new(variant, &variant.limits(&YEAR_POLICY));
    // The twin runs the year from 0; the limiter from 180 days before 2³² s, so that its
    // year crosses where one-second slot indices reach 2³² (and 1 ms ones, every 49.7 days,
    // in both).
    let period = period(&model);
    let offset = (TAG * S - 180 * DAY) / period * period;
    let mut sim = Sim::new("a year", variant, &YEAR_POLICY, offset, true);
    let rules = sim.model.rules.clone();
    let mut rng = Rng(seed);
    let mut retried = 0;
    while sim.rel < 365 * DAY {
        let (step, episode) = year_step(&mut rng, &rules, sim.rel);
        for _ in 0..episode {
            sim.advance(step);
            for _ in 0..1 + rng.below(3) {
                let checked = sim.random_op(&mut rng, 6);
                assert!(sim.limiter.len() <= 6, "{}: len {}", sim.label, sim.limiter.len());
                if let Some((key, cost, d)) = checked {
                    if matches!(d.denial(), Some(Denial::Limit(_))) && rng.below(4) == 0 {
                        sim.wait_and_retry(key, cost, d);
                        retried += 1;
                    }
                }
            }
        }
        if rng.below(16) == 0 {
            sim.sweep();
        }
    }
    sim.sweep();
    sim.assert_bounds();
    assert!(retried > 20, "{}: only {retried} waits for retry_after", sim.label);
    assert!(sim.evicted > 20, "{}: sweeps evicted only {} keys", sim.label, sim.evicted);
    sim
}

#[test]
fn a_simulated_year_in_steps_of_every_size() {
    for (i, variant) in VARIANTS.into_iter().enumerate() {
        let sim = simulate_year(variant, 0xEA5E_0000 + i as u64);
        assert!(sim.ops > 3_000, "{}: {} operations", sim.label, sim.ops);
        assert!(sim.refusals * 20 > sim.ops, "{}: {} refusals in {} ops", sim.label, sim.refusals, sim.ops);
    }
}

// ---------------------------------------------------------------------------------------
// Tag aliasing.

/// Jumps, in slots of a limit's precision (windows, for the fixed window), that bring the
/// tag of the slot a key counted in back to itself or next to it: 2³² slots, 2³² ± 1,
/// 2³² ± a window (and one slot more), several times 2³², and 2³¹ (where a signed distance
/// between 32-bit tags changes sign).
fn alias_jumps(slots: u64) -> Vec<u64> {
    let mut jumps = vec![TAG, TAG - 1, TAG + 1, TAG - slots, TAG + slots, TAG - slots - 1, TAG + slots + 1];
    jumps.extend([2 * TAG, 3 * TAG, 4 * TAG - 1, 1 << 31, (1 << 31) - 1, (1 << 31) + 1, 1 << 30]);
    jumps
}

#[test]
fn a_jump_of_2_32_slots_finds_the_key_fresh_not_its_old_counts() {
    let mut cases = 0;
    for variant in VARIANTS {
        for text in ["5/50ms@1ms", "10/s", "12/min", "4/250ms@50ms"] {
            let rule = Rule::new(variant, &variant.limits(&[text])[0]);
            // A third of the way into slot 7.
            let start = 7 * rule.precision + rule.precision / 3;
            for (i, jump) in alias_jumps(rule.slots).into_iter().enumerate() {
                // Jumps that would take the traffic past the end of the clock (2⁶² ns ≈
                // 1.07 · 2³² s) are unreachable: for 1 s slots, those of 2 · 2³² slots and more
                // (27 of the 266 cases); the fixed window's 1 min windows never could.
                let jump = jump.saturating_mul(rule.precision);
                if start.saturating_add(jump).saturating_add(4 * rule.window) > END_OF_TIME {
                    continue;
                }
                let mut sim = Sim::new(&format!("a jump of {jump} ns"), variant, &[text], start, false);
                // Fill the key in one slot.
                for n in 0..rule.max + 2 {
                    assert_eq!(sim.check(7, 1).is_allowed(), n < rule.max, "{}", sim.label);
                }
                assert!(!sim.peek(7).is_allowed());
                sim.advance(jump);
                if i % 2 == 1 {
                    // Idle for far longer than any window: swept.
                    assert_eq!(sim.sweep(), 1, "{}", sim.label);
                }
                // The old counts are gone: a fresh key (the model says so; so do the counts).
                let fresh = sim.peek(7);
                assert!(fresh.is_allowed() && fresh.remaining() == rule.max - 1, "{}: {fresh:?}", sim.label);
                let admitted = (0..rule.max + 2).filter(|_| sim.check(7, 1).is_allowed()).count();
                assert_eq!(admitted as u64, rule.max, "{}", sim.label);
                // And the window moves on from there as it would for any key.
                for step in [1, rule.precision, rule.window, rule.window + rule.precision] {
                    sim.advance(step);
                    let _ = sim.check(7, 2);
                    let _ = sim.peek(7);
                }
                assert_eq!(sim.limiter.len(), 1);
                cases += 1;
            }
        }
    }
    assert!(cases > 200, "{cases} cases");
}

#[test]
fn a_jump_of_2_32_slots_while_two_threads_hold_the_state_in_their_caches() {
    for variant in VARIANTS {
        for text in ["5/50ms@1ms", "10/s", "4/250ms@50ms"] {
            let rule = Rule::new(variant, &variant.limits(&[text])[0]);
            let start = 3 * rule.precision + rule.precision / 2;
            for slots in [TAG, TAG - 1, TAG + 1, TAG + rule.slots, 2 * TAG] {
                let jump = slots * rule.precision;
                if start + jump > END_OF_TIME {
                    // Unreachable: 2 · 2³² one-second slots lie past the end of the clock
                    // (2⁶² ns ≈ 1.07 · 2³² s), where it would stand still at 2⁶² ns.
                    continue;
                }
                let clock = ManualClock::new();
                at(&clock, start);
                let limiter = variant.limiter(&[text], &clock);
                let barrier = Barrier::new(2);
                let hammer = || (0..rule.max + 3).filter(|_| limiter.check(&7).is_allowed()).count() as u64;
                let (mine, theirs) = std::thread::scope(|scope| {
                    let other = scope.spawn(|| {
                        barrier.wait();
                        // The key is full: refused, and from the third check on, the state
                        // comes from this thread's cache.
                        for _ in 0..5 {
                            assert!(!limiter.check(&7).is_allowed(), "{variant:?} {text}");
                        }
                        barrier.wait();
                        barrier.wait();
                        hammer()
                    });
                    assert_eq!(hammer(), rule.max, "{variant:?} {text}: filling");
                    barrier.wait();
                    barrier.wait();
                    clock.advance(Duration::from_nanos(jump));
                    barrier.wait();
                    let mine = hammer();
                    (mine, other.join().unwrap())
                });
                // Exactly max between the two threads at the frozen clock: a fresh window, not
                // the old slot's counts (fewer) nor two fresh states (more).
                assert_eq!(
                    mine + theirs,
                    rule.max,
                    "{variant:?} {text} jump {slots} slots: {mine} + {theirs}"
                );
                let now = start + jump;
                assert_eq!(nanos(clock.now()), now, "{variant:?} {text}: the jump");
                let mut model = Model::new(variant, &variant.limits(&[text]));
                model.commit(7, now, rule.max);
                assert_eq!(
                    parts(&limiter.peek(&7)),
                    model.expect(7, now, 1),
                    "{variant:?} {text} jump {slots}"
                );
                assert_eq!(limiter.len(), 1);
            }
        }
    }
}

/// A 1 ms-precision limit and one whose window outlasts 2²⁹ ms, so a key checked every 2²⁹
/// ms never expires: its 1 ms slot index passes a multiple of 2³² every 8 strides, landing
/// exactly on the tag it had 8 strides earlier (and the fixed window's 50 ms windows after
/// 400 strides).
const ALIVE: [&str; 2] = ["5/50ms@1ms", "4000/7d"];

#[test]
fn a_key_kept_alive_for_more_than_2_32_slots_counts_only_its_windows() {
    let stride = (1 << 29) * MS;
    for variant in VARIANTS {
        let mut sim = Sim::new("kept alive", variant, &ALIVE, 0, false);
        assert!(stride + 51 * MS < sim.model.expiry, "the strides keep the key alive");
        let mut rng = Rng(0xA11CE + variant as u64);
        for i in 0..=400u64 {
            if i > 0 {
                assert_eq!(sim.sweep(), 0, "{}: stride {i}: the key was active", sim.label);
                assert!(sim.model.held(7));
            }
            // Burst: 5 admitted, then refusals; then the 1 ms window slides on.
            let admitted = (0..7).filter(|_| sim.check(7, 1).is_allowed()).count();
            assert_eq!(admitted, 5, "{}: stride {i}", sim.label);
            let _ = sim.peek(7);
            let mut spent = 0;
            for _ in 0..4 {
                let step = 1 + rng.below(30 * MS);
                sim.advance(step);
                spent += step;
                let _ = sim.check(7, 1 + rng.below(2));
            }
            sim.advance(stride - spent);
        }
        assert_eq!(sim.limiter.len(), 1);
        sim.assert_bounds();
    }
}

/// One check per window on a single limit of 3600 one-millisecond slots: each check moves
/// the window by a whole ring. The key never expires (a window < window + precision).
fn window_strides(variant: Variant, start: u64, strides: u64, twin: bool) -> Sim {
    let mut sim = Sim::new("window strides", variant, &["1000/3600ms@1ms"], start, twin);
    let window = 3600 * MS;
    let mut rng = Rng(0x5781DE + variant as u64);
    for i in 0..strides {
        let _ = sim.check(7, 1);
        if i % 16 == 0 {
            // Now and then a burst to the limit, and a refusal.
            let _ = sim.check(7, 1000 - 2);
            let _ = sim.check(7, 3);
            let _ = sim.peek(7);
        }
        // Exactly a window, or a hair less.
        sim.advance(window - [0, 0, 1, MS / 2, MS][rng.below(5) as usize]);
        if i % 64 == 0 {
            assert_eq!(sim.sweep(), 0, "{}: the key checks every window", sim.label);
        }
    }
    sim
}

#[test]
fn one_check_per_window_keeps_a_1_ms_key_alive_across_its_tag_wrap() {
    // The 1 ms slot index (now / 1 ms + 3601) reaches 2³² at (2³² − 3601) ms: start 60
    // windows before, on a multiple of the window (the twin runs the same from 0).
    let window = 3600 * MS;
    let wrap = (TAG - 3601) * MS;
    for variant in VARIANTS {
        let sim = window_strides(variant, (wrap - 60 * window) / window * window, 140, true);
        assert!(sim.now() > wrap + 60 * window);
        assert_eq!(sim.limiter.len(), 1);
        sim.assert_bounds();
    }
}

/// The same key, one check per window from 0 until past the first tag wrap of its 1 ms
/// slots: 2³² ms / 3.6 s ≈ 1.19 M checks, each rewriting the 3601-slot ring. Slow (run it in
/// release): only with `SLIDEGATE_UPTIME_FULL=1`; otherwise the last 2,000 strides before
/// and after the wrap. Every check is the steady state's decision (one unit in the oldest
/// slot, one now).
#[test]
fn one_check_per_window_for_2_32_slots_from_zero() {
    let full = std::env::var_os("SLIDEGATE_UPTIME_FULL").is_some_and(|v| v != "0");
    let window = 3600 * MS;
    let wrap = (TAG - 3601) * MS;
    let (start, strides) = if full { (0, wrap / window + 1000) } else { (wrap / window - 1000, 2000) };
    for variant in [Variant::Interpolated, Variant::Strict, Variant::Fixed] {
        let clock = ManualClock::new();
        at(&clock, start * window);
        let limiter = variant.limiter(&["1000/3600ms@1ms"], &clock);
        let mut steady = None;
        for i in 0..strides {
            let d = parts(&limiter.check(&7));
            match steady {
                None if i == 2 => steady = Some(d),
                Some(s) => assert_eq!(d, s, "{variant:?}: stride {i} at {}", nanos(clock.now())),
                None => {}
            }
            clock.advance(Duration::from_nanos(window));
        }
        assert!(nanos(clock.now()) > wrap);
        // One unit in the oldest slot (a window ago) and this one: 998 left; the fixed
        // window forgets the previous window: 999.
        let want = if variant == Variant::Fixed { 999 } else { 998 };
        assert_eq!(steady.map(|s| s.2), Some(want), "{variant:?}");
        assert_eq!(limiter.sweep(), 0);
    }
}

// ---------------------------------------------------------------------------------------
// Jumps of days, months, years.

#[test]
fn jumps_of_a_day_a_month_ten_years_and_to_the_end_of_the_clock_find_every_window_fresh() {
    // The last jump is to the end of the clock: 2⁶² ns less the day, month and ten years
    // jumped before it (a jump of 2⁶² ns itself would go past the end).
    let jumps = [DAY, 30 * DAY, 3653 * DAY, END_OF_TIME];
    for variant in VARIANTS {
        for texts in [&POLICY[..], &["1000/3600ms@1ms"][..], &ALIVE[..]] {
            let mut sim = Sim::new("jumps", variant, texts, 0, false);
            let smallest = sim.model.rules.iter().map(|r| r.max).min().unwrap();
            for jump in jumps {
                let jump = jump.min(END_OF_TIME - sim.now());
                // Keys 1 (full, and from its third check on, checked through this thread's
                // cache) and 2 (holding a few units).
                for cost in [smallest, 1, 1] {
                    let _ = sim.check(1, cost);
                }
                let _ = sim.check(2, smallest.min(3));
                sim.advance(jump);
                assert!(sim.peek(1).is_allowed(), "{}: after a jump of {jump} ns", sim.label);
                let costs = [1, 1, smallest - 2, 1, 1];
                let admitted: u64 = costs.into_iter().filter(|&cost| sim.check(1, cost).is_allowed()).sum();
                assert_eq!(admitted, smallest, "{}: after a jump of {jump} ns", sim.label);
                // Key 2 was idle all that time: swept if that outlasts every window (key 1
                // is active again).
                let idle = usize::from(jump >= sim.model.expiry);
                assert_eq!(sim.sweep(), idle, "{}: after a jump of {jump} ns", sim.label);
                assert_eq!(sim.limiter.len(), 2 - idle);
            }
            assert_eq!(sim.now(), END_OF_TIME);
            // The clock stands still there: key 1, full since the last jump, stays full.
            sim.clock.advance(Duration::from_nanos(DAY));
            assert_eq!(nanos(sim.clock.now()), END_OF_TIME);
            assert!(!sim.check(1, 1).is_allowed(), "{}: at the end of the clock", sim.label);
        }
    }
}

#[test]
fn a_key_with_a_window_of_a_year_keeps_its_counts_across_jumps_of_a_month() {
    // A year's window in 60 slots of 6.08 days: a jump of a month moves 5 slots, and every
    // count within the year still counts.
    const YEARLY: [&str; 2] = ["100/365d", "10/h@1min"];
    for variant in VARIANTS {
        let mut sim = Sim::new("a year's window", variant, &YEARLY, 0, false);
        let mut rng = Rng(0x4EA2 + variant as u64);
        let mut refused_by_the_year = 0;
        for month in 0..40 {
            for _ in 0..14 {
                if let Some(Denial::Limit(0)) = sim.check(7, 1 + rng.below(2)).denial() {
                    refused_by_the_year += 1;
                }
                sim.advance(rng.below(10 * MIN));
            }
            let _ = sim.peek(7);
            if month % 5 == 0 {
                assert_eq!(sim.sweep(), 0, "{}: month {month}", sim.label);
            }
            sim.advance(28 * DAY + rng.below(4 * DAY));
        }
        assert!(refused_by_the_year > 10, "{}: the yearly limit refused {refused_by_the_year}", sim.label);
        sim.assert_bounds();
    }
}

// ---------------------------------------------------------------------------------------
// The end of the clock: 2⁶² ns, about 146 years, where every clock stands still.

#[test]
fn the_end_of_the_clock_panics_nowhere_and_nothing_wraps() {
    for variant in VARIANTS {
        let model = Model::new(variant, &variant.limits(&POLICY));
        let longest =
            model.rules.iter().map(|r| (r.window + r.precision).max(r.burst + r.interval)).max().unwrap();
        let largest = model.rules.iter().map(|r| r.max).max().unwrap();
        for back in [2 * H, H + 30 * S, S, 50 * MS, MS + 1, 1, 0] {
            let clock = ManualClock::new();
            at(&clock, END_OF_TIME - back);
            let limiter = variant.limiter(&POLICY, &clock);
            let mut rng = Rng(back ^ ((variant as u64) << 40));
            // The last step runs the clock into its end (`advance` saturates there).
            let steps = [1, 1000, MS, 10 * MS, S, MIN, H, u64::MAX];
            for _ in 0..300 {
                let key = rng.below(3);
                let d = match rng.below(9) {
                    0..=3 => limiter.check_n(&key, 1 + rng.below(3)),
                    4 => limiter.peek(&key),
                    5 => limiter.check_n(&key, 0),
                    6 => limiter.check_n(&key, u64::MAX),
                    7 => limiter.check_n(&key, largest + 1),
                    _ => limiter.record(&key, 1 + rng.below(3)),
                };
                let context =
                    format!("{variant:?} from {back} ns before the end, at {:?}: {d:?}", clock.now());
                assert!(nanos(clock.now()) <= END_OF_TIME, "{context}");
                assert!(d.remaining() <= largest, "{context}");
                match d.denial() {
                    // Not a wrapped-around, absurd or zero wait.
                    Some(Denial::Limit(_)) => {
                        let wait = d.retry_after().unwrap();
                        assert!(!wait.is_zero() && wait <= 2 * Duration::from_nanos(longest), "{context}")
                    }
                    _ => assert_eq!(d.retry_after(), None, "{context}"),
                }
                if rng.below(10) == 0 {
                    let before = limiter.len();
                    let evicted = limiter.sweep();
                    assert_eq!(limiter.len(), before - evicted, "{context}");
                }
                if rng.below(30) == 0 {
                    let _ = limiter.reset(&key);
                }
                assert!(limiter.len() <= 3, "{context}");
                if rng.below(6) == 0 {
                    clock.advance(Duration::from_nanos(steps[rng.below(steps.len() as u64) as usize]));
                }
            }
            clock.advance(Duration::MAX);
            assert_eq!(nanos(clock.now()), END_OF_TIME, "advance stops at the end");
            clock.set(Duration::ZERO);
            assert_eq!(nanos(clock.now()), END_OF_TIME, "and never runs back");
            let _ = limiter.check(&9);
            assert!(limiter.len() <= 4);
            // Nothing admitted after 2⁶² − longest is evictable at 2⁶²; older keys are.
            let _ = limiter.sweep();
            assert!(limiter.reset(&9));
        }
    }
}

/// At a frozen clock `back` ns before the end, a fresh key hammered with single units:
/// its decisions, and those of a twin clock at the same phase of every slot: a period after
/// 0 (far from the end) or, for a window so long that the clock's range holds less than two
/// of them, wherever else the clock reaches that phase (for a window of a century, at times
/// nowhere else: then the twin is the limiter's double and only the model judges it).
fn frozen_at_the_end(variant: Variant, texts: &[&str], back: u64) -> (Vec<Parts>, Vec<Parts>) {
    let model = Model::new(variant, &variant.limits(texts));
    let period = period(&model);
    let end = END_OF_TIME - back;
    let phase = end % period;
    let twin_at = [phase + period, phase, phase + 2 * period]
        .into_iter()
        .find(|&t| t != end && t <= END_OF_TIME)
        .unwrap_or(end);
    let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
    at(&clock, end);
    at(&twin_clock, twin_at);
    let limiter = variant.limiter(texts, &clock);
    let twin = variant.limiter(texts, &twin_clock);
    (0..30).map(|_| (parts(&limiter.check(&1)), parts(&twin.check(&1)))).unzip()
}

/// How far before the end of the clock the frozen tests stand: at it, 1 ns, 1 ms, a 50 ms
/// window, 500 ms, a 1 s window, a minute, half an hour, an hour's window, a window and
/// one of its slots, two hours.
const FROZEN_BACK: [u64; 11] = [0, 1, MS, 50 * MS, 500 * MS, S, MIN, 30 * MIN, H, H + MIN, 2 * H];

#[test]
fn near_the_end_of_the_clock_the_windows_admit_exactly_max() {
    for variant in [Variant::Interpolated, Variant::Strict, Variant::Fixed] {
        for back in FROZEN_BACK {
            let (got, twin) = frozen_at_the_end(variant, &POLICY, back);
            // Admissions, remaining, denial and limit as far from the end; retry_after aside
            // (see the last test below).
            let strip = |p: &Parts| (p.0, p.1, p.2, p.4);
            assert_eq!(got.iter().map(strip).collect::<Vec<_>>(), twin.iter().map(strip).collect::<Vec<_>>());
            assert_eq!(got.iter().filter(|p| p.0).count(), 10, "{variant:?} {back} ns before the end");
        }
    }
}

/// Formerly a bug at the end of a u64 clock (`u64::MAX` ns): GCRA's arrival time saturated
/// and the sliding log read every entry as expired at `u64::MAX`, so both admitted without
/// limit. The clock now stands still at 2⁶² ns, and every time computed from it (a TAT, an
/// entry's expiry) stays below 2⁶⁴.
#[test]
fn near_the_end_of_the_clock_the_log_and_gcra_admit_exactly_max() {
    let mut failures = Vec::new();
    for variant in [Variant::Log, Variant::Gcra] {
        for back in FROZEN_BACK {
            let (got, twin) = frozen_at_the_end(variant, &POLICY, back);
            // As for the windows above: everything but retry_after (see the next test).
            let strip = |p: &Parts| (p.0, p.1, p.2, p.4);
            let admitted = got.iter().filter(|p| p.0).count();
            if got.iter().map(strip).ne(twin.iter().map(strip)) || admitted != 10 {
                failures.push(format!(
                    "{variant:?} {back} ns before the end: {admitted} of 30 admitted at a frozen clock \
                     (10 expected), the 30th {:?}, far from the end {:?}",
                    got[29], twin[29]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Formerly a bug at the end of a u64 clock: `retry_after` was cut to the time left before
/// `u64::MAX` (0 at `u64::MAX`: "retry now", refused again). The clock now stands still at
/// 2⁶² ns, where a retry time (at most a window and a slot, or a burst, later) still fits in
/// 64 bits: the wait is the true one, the twin's, even where the clock cannot reach it.
#[test]
fn near_the_end_of_the_clock_retry_after_is_the_true_wait() {
    let mut failures = Vec::new();
    for variant in VARIANTS {
        for back in FROZEN_BACK {
            let (got, twin) = frozen_at_the_end(variant, &POLICY, back);
            for (i, (g, t)) in got.iter().zip(&twin).enumerate() {
                if g.3 != t.3 || g.3 == Some(Duration::ZERO) {
                    failures.push(format!(
                        "{variant:?} {back} ns before the end, check {i}: retry_after {:?}, far from the end {:?}",
                        g.3, t.3
                    ));
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The longest window a limit may have, `MAX_WINDOW` (100 years of 365 days).
const LONGEST: &str = "10/36500d";

#[test]
fn the_clock_stands_still_at_the_end_and_the_longest_window_works_there() {
    // `advance` and `set` stop at 2⁶² ns, from anywhere, however far they are told to go.
    let end = Duration::from_nanos(END_OF_TIME);
    let clock = ManualClock::new();
    clock.advance(Duration::MAX);
    assert_eq!(clock.now(), end, "advance(Duration::MAX) from 0");
    clock.advance(Duration::from_nanos(1));
    assert_eq!(clock.now(), end, "advance(1 ns) at the end");
    clock.set(Duration::MAX);
    assert_eq!(clock.now(), end, "set(Duration::MAX) at the end");
    clock.set(Duration::ZERO);
    assert_eq!(clock.now(), end, "set(0) at the end: never backwards");
    let clock = ManualClock::new();
    clock.set(Duration::MAX);
    assert_eq!(clock.now(), end, "set(Duration::MAX) from 0");
    let shared = clock.clone();
    shared.advance(Duration::from_secs(1));
    assert_eq!(clock.now(), end, "a clone's advance at the end");
    for (name, beyond) in [
        ("advance(2 ns)", Box::new(|c: &ManualClock| c.advance(Duration::from_nanos(2))) as Box<dyn Fn(&_)>),
        ("advance(Duration::MAX)", Box::new(|c: &ManualClock| c.advance(Duration::MAX))),
        ("set(2^62 + 1 ns)", Box::new(|c: &ManualClock| c.set(Duration::from_nanos(END_OF_TIME + 1)))),
        ("set(Duration::MAX)", Box::new(|c: &ManualClock| c.set(Duration::MAX))),
    ] {
        let clock = ManualClock::new();
        at(&clock, END_OF_TIME - 1);
        beyond(&clock);
        assert_eq!(clock.now(), end, "{name} 1 ns before the end");
    }

    // A window of `MAX_WINDOW` is valid; a second longer is not.
    let longest: Limit = LONGEST.parse().unwrap();
    assert_eq!(longest.window(), MAX_WINDOW);
    assert!(longest.validate().is_ok());
    let longer = Limit::new(10, MAX_WINDOW + Duration::from_secs(1));
    assert!(
        matches!(longer.validate(), Err(ConfigError::WindowTooLong { limit, most: MAX_WINDOW }) if limit == longer),
        "{:?}",
        longer.validate()
    );
    assert!(matches!("10/36501d".parse::<Limit>(), Err(ConfigError::WindowTooLong { .. })));
    for variant in VARIANTS {
        let built = Limiter::<u64>::builder()
            .algorithm(variant.algorithm())
            .clock(ManualClock::new())
            .limit(Limit::per_second(10))
            .limit(longer)
            .build();
        assert!(
            matches!(built, Err(ConfigError::WindowTooLong { limit, most: MAX_WINDOW }) if limit == longer),
            "{variant:?}: {:?}",
            built.err()
        );
    }

    // A limit of `MAX_WINDOW`, frozen at or near the end of the clock (down to a whole window
    // before it): exactly max admitted, and every decision, retry_after included (a wait of
    // up to a century, past the clock's end), that of a twin at the same phase and the model's.
    for variant in VARIANTS {
        let rule = Rule::new(variant, &longest);
        for back in [0, 1, MS, S, DAY, rule.precision, nanos(MAX_WINDOW) / 2, nanos(MAX_WINDOW)] {
            let (got, twin) = frozen_at_the_end(variant, &[LONGEST], back);
            assert_eq!(got, twin, "{variant:?} {LONGEST} {back} ns before the end");
            assert_eq!(got.iter().filter(|p| p.0).count(), 10, "{variant:?} {back} ns before the end");
            assert!(
                got.iter().filter(|p| !p.0).all(|p| p.3.is_some_and(|w| !w.is_zero())),
                "{variant:?} {back} ns before the end: {:?}",
                got[29]
            );
            // The same against the model, then on to the end of the clock (if not there):
            // the admissions before still count (or have left the window: the model says).
            let mut sim = Sim::new("the longest window", variant, &[LONGEST], END_OF_TIME - back, false);
            for _ in 0..12 {
                let _ = sim.check(1, 1);
            }
            let _ = sim.check(2, 4);
            let _ = sim.peek(1);
            sim.advance(back / 2);
            let _ = sim.check(1, 1);
            let _ = sim.check(2, 3);
            sim.advance(back - back / 2);
            assert_eq!(sim.now(), END_OF_TIME);
            for _ in 0..12 {
                let _ = sim.check(1, 1);
                let _ = sim.check(2, 2);
            }
            let _ = sim.peek(3);
            assert_eq!(sim.sweep(), 0, "{}: nothing outlives a century's window here", sim.label);
            sim.reset(2);
            let _ = sim.check(2, 10);
            sim.assert_bounds();
            sim.assert_len();
        }
    }
}
