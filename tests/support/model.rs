//! The exact reference model of the limiter, and (in `model_harness.rs`, included below)
//! the harness that runs a sequence of operations through a `Limiter` and the model side by
//! side. Shared by the property tests
//! (`tests/model.rs`, which draws the cases with proptest) and the fuzz target
//! `fuzz/fuzz_targets/model_ops.rs` (which decodes them from libFuzzer's bytes): plain Rust,
//! no proptest, and a mismatch is an `Err` that says what differed.
//!
//! The model keeps a log of every admitted `(time, cost)` per key and limit, and recomputes
//! each limit's count (sliding window, fixed window, sliding log or GCRA's theoretical
//! arrival time) from it at every step.
//!
//! **Saturation** (sliding window). A ring entry holds a slot's count only up to its width
//! (2⁸−1, 2¹⁶−1 or 2³²−1 units, the narrowest above every `max` the limit position has
//! had). A check never puts more than `max` into a slot; `record` and carries can. A slot
//! whose count reaches its entry's width when it is closed (when a later slot's first
//! commit moves the key on, or, until then, whenever it is read from a later slot) is
//! saturated: it counts as full until it leaves the window, and stays saturated when its
//! ring is widened. The slot being counted in holds its exact count up to 2³²−1, except in
//! a pair word (a window of one slot with entries of at most 16 bits, [`Rule::pair`]),
//! where both slots' counts saturate at 2¹⁶−1, the open one too, for good. The model
//! follows which slot the limiter holds open and which it closed saturated ([`Ring`]).
//!
//! **Policy changes.** A held key laid out for an older version of its policy moves to the
//! current one at its next look-up (`update_policy`), or at once (`set_policy`,
//! `clear_policy`): exactly when every limit keeps its window, precision and accuracy (only
//! `max` changed, whatever the ring's width), else per the version's `Carry`: each new limit
//! starts with the units the old limits counted over a window at least as long as its own
//! (the fewest), or else the most any counted, all recorded as used at the move (a
//! saturated slot in a window stands for every unit there is, 2³²−1), or empty
//! (`Carry::Reset`). Modelled for the sliding and fixed windows (a move of a sliding log's
//! or GCRA's key is exact in these tests, or not drawn).
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

use slidegate::{
    Accuracy, Algorithm, Carry, Decision, Denial, Limit, Limiter, ManualClock, PolicyConfig, DEFAULT_POLICY,
};

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

/// The most units one commit counts in a window (the sliding and fixed windows'
/// `Counter::MOST`): `record` and carries are clamped to it, and a slot's count saturates at
/// it.
pub const MOST: u64 = u32::MAX as u64;

/// The ring entries' width in bits for a limit of `max`, as `layout.rs` lays it out: the
/// fewest bits (at least 2) whose largest count is above `max`, up to 24; else 32.
pub fn entry_bits(max: u64) -> u32 {
    let mut bits = 2;
    while (1u64 << bits) - 1 <= max {
        bits += 1;
    }
    if bits > 24 {
        32
    } else {
        bits
    }
}

/// The largest count a ring entry of `bits` holds: `2^bits − 1`.
pub fn entry_most(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

/// The most a pair word's field holds (`Rule::pair`): a count of this many is saturated.
pub const PAIR_MOST: u64 = 0xFFFF;

/// What a sliding window's count at a saturated slot is taken as (times `p`): more than any
/// `max × p`, and far from overflowing when a cost is added.
const FULL: u128 = u128::MAX >> 2;

/// The small limits the cases draw from (each also in a strict variant).
pub const LIMITS: [&str; 5] = ["3/s", "5/2s@500ms", "10/s@100ms", "7/min@10s", "4/3s@1s"];

/// Limits with fine slots, for the long-uptime cases: 2³² slots of 1 ms are 49.7 days.
pub const FINE_LIMITS: [&str; 2] = ["4/20ms@1ms", "6/250ms@10ms"];

/// Interesting clock offsets for a run of `limits` under `algorithm`: 2³² ms, 2³² s, and
/// every point where a limit's slot index (`now / precision`, or `now / window` for the
/// fixed window) reaches a multiple of 2³² — where the 32-bit slot tags wrap — for the
/// first three multiples that are at most [`MAX_TIME`] (none for slots above 2³⁰ ns, about
/// 1.07 s); also multiples of 2³² windows, and where the slot index of a limit with slots
/// of 1 s or more reaches the first three multiples of 2¹⁶: a narrow ring word's 16-bit
/// tags wrap there.
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
        // Where the 16-bit tags of a narrow ring word wrap (slots of 1 s or more): a slot's
        // index is `now / precision + n + 1`.
        if rule.p >= NS_PER_S {
            points.extend((1..=3u64).map(|multiple| ((multiple << 16) - rule.n - 1) * rule.p));
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
    /// The width of the limit's ring entries (sliding window): the narrowest above `max`,
    /// unless the model widened it (see [`Model::update`]).
    pub entry_most: u64,
}

/// What a sliding-window limit's ring knows beyond the log: the slots closed saturated, and
/// the slot its `cur` word holds open (exact until a commit in a later slot closes it).
/// Without one ([`Ring::NONE`]), no slot ever saturates: the plain exact model.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    pub saturated: Vec<u64>,
    pub open: Option<u64>,
}

impl Ring {
    pub const NONE: Ring = Ring { saturated: Vec::new(), open: None };
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
            entry_most: entry_most(entry_bits(limit.max())),
        }
    }

    /// Is the limit a pair word (`algorithm/sliding/pair.rs`): a sliding window of one slot
    /// whose entries are at most 16 bits? Both its counts, the open slot's too, then
    /// saturate at [`PAIR_MOST`].
    pub fn pair(&self) -> bool {
        self.algorithm == Algorithm::SlidingWindow && self.n == 1 && self.entry_most <= PAIR_MOST
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

    /// [`scaled`](Self::scaled), with the saturated slots of `ring`: a sliding window with
    /// one in it at `t` is full.
    pub fn scaled_in(&self, log: &[(u64, u64)], ring: &Ring, t: u64) -> u128 {
        if self.full_at(log, ring, t) {
            return FULL;
        }
        self.scaled(log, t)
    }

    /// Units logged in slot `slot` (of the precision).
    pub fn in_slot(&self, log: &[(u64, u64)], slot: u64) -> u128 {
        log.iter().filter(|&&(at, _)| at / self.p == slot).map(|&(_, c)| u128::from(c)).sum()
    }

    /// Does slot `slot` read as saturated at `t`? A slot `ring` closed saturated does; the
    /// open one does once it holds its entry's width and `t` is in a later slot (it is then
    /// read as closed), or 2³²−1 units while it is `t`'s own. Sliding window only.
    pub fn saturated(&self, log: &[(u64, u64)], ring: &Ring, slot: u64, t: u64) -> bool {
        if self.algorithm != Algorithm::SlidingWindow {
            return false;
        }
        if ring.saturated.contains(&slot) {
            return true;
        }
        if ring.open != Some(slot) {
            return false;
        }
        // (An entry no wider than `max`, 2³²−1 for a `max` of 2³²−1, reads as that count.)
        let width = match (self.pair(), slot < t / self.p) {
            (true, _) => PAIR_MOST,
            (false, true) => self.entry_most,
            (false, false) => MOST,
        };
        width > self.max && self.in_slot(log, slot) >= u128::from(width)
    }

    /// Is a saturated slot in the window at `t` (the oldest, partly covered one included)?
    pub fn full_at(&self, log: &[(u64, u64)], ring: &Ring, t: u64) -> bool {
        let k = t / self.p;
        let first = k.saturating_sub(self.n);
        let candidates = ring.saturated.iter().chain(ring.open.iter());
        candidates.filter(|&&s| (first..=k).contains(&s)).any(|&s| self.saturated(log, ring, s, t))
    }

    /// The units the limit counts at `t`, rounded up to whole units, not capped at `max`:
    /// what a policy change carries over (`KeyState::migrate`). A saturated slot in a
    /// sliding window stands for every unit there is (`u64::MAX`, clamped to [`MOST`] by the
    /// carry); a fixed window's count saturates at [`MOST`].
    pub fn used_in(&self, log: &[(u64, u64)], ring: &Ring, t: u64) -> u64 {
        match self.algorithm {
            Algorithm::SlidingWindow if self.full_at(log, ring, t) => u64::MAX,
            Algorithm::SlidingWindow => {
                u64::try_from(self.sliding(log, t).div_ceil(u128::from(self.p))).unwrap_or(u64::MAX)
            }
            Algorithm::FixedWindow => u64::try_from(self.scaled(log, t)).unwrap_or(u64::MAX).min(MOST),
            other => panic!("the model carries units over for the sliding and fixed windows, not {other:?}"),
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
        self.admits_in(log, &Ring::NONE, t, cost)
    }

    pub fn admits_in(&self, log: &[(u64, u64)], ring: &Ring, t: u64, cost: u64) -> bool {
        if self.algorithm == Algorithm::Gcra {
            return self.tat(log, t, cost) - t <= self.burst;
        }
        let p = self.scale();
        self.scaled_in(log, ring, t) + u128::from(cost) * p <= u128::from(self.max) * p
    }

    /// Whole units still free at `t` after `cost` more, rounded down.
    pub fn room(&self, log: &[(u64, u64)], t: u64, cost: u64) -> u64 {
        self.room_in(log, &Ring::NONE, t, cost)
    }

    pub fn room_in(&self, log: &[(u64, u64)], ring: &Ring, t: u64, cost: u64) -> u64 {
        if self.algorithm == Algorithm::Gcra {
            return self.burst.saturating_sub(self.tat(log, t, cost) - t) / self.interval;
        }
        let p = self.scale();
        let free =
            (u128::from(self.max) * p).saturating_sub(self.scaled_in(log, ring, t) + u128::from(cost) * p);
        u64::try_from(free / p).unwrap()
    }

    /// The earliest time >= `now` at which `cost` fits, if no other traffic comes: found by
    /// bisection (the count never rises without traffic), not by a formula.
    pub fn earliest(&self, log: &[(u64, u64)], now: u64, cost: u64) -> u64 {
        self.earliest_in(log, &Ring::NONE, now, cost)
    }

    pub fn earliest_in(&self, log: &[(u64, u64)], ring: &Ring, now: u64, cost: u64) -> u64 {
        if self.admits_in(log, ring, now, cost) {
            return now;
        }
        // Every logged unit is at most `now`, so two windows and two slots (and a GCRA
        // burst) later none counts, and every slot has left the window.
        let (mut refused, mut admitted) = (now, now + 2 * self.window + 2 * self.p + self.burst);
        assert!(self.admits_in(log, ring, admitted, cost));
        while admitted - refused > 1 {
            let mid = refused + (admitted - refused) / 2;
            if self.admits_in(log, ring, mid, cost) {
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
    /// The policy and version its state is laid out for, and that version's rules.
    laid: (usize, usize),
    rules: Vec<Rule>,
    /// Per limit of `rules`: what was counted there since the key's state was last laid out
    /// anew (a reset, a carry), as admitted `(time, cost)`, and its ring.
    logs: Vec<Vec<(u64, u64)>>,
    rings: Vec<Ring>,
    /// The first limit's logs of earlier lives of the key (before a `reset`, an eviction
    /// or a carry).
    earlier: Vec<Vec<(u64, u64)>>,
    held: Held,
    /// When a carry last laid the key's state out anew (its `touched` from then on), or the
    /// last activity of an earlier life the limiter may still hold (`look_up`).
    laid_at: Option<u64>,
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
    /// Each policy's rules (one policy unless the case draws tiers), its version (one per
    /// change) and the `Carry` its keys move to that version with.
    tiers: Vec<Vec<Rule>>,
    versions: Vec<usize>,
    carries: Vec<Carry>,
    /// Per limit position, the ring entries' width in bits of every policy: wide enough for
    /// every `max` any policy has had there (only ever widens, as `policy.rs`).
    widest: Vec<u32>,
    now: u64,
    /// Idle for longer than this, a key's windows are all empty (the longest expiry of any
    /// version).
    expiry: u64,
    keys: Vec<KeyModel>,
}

impl Model {
    /// A model of `keys` keys (key `i` on tier `i % tiers`), with its clock at `now`.
    pub fn new(tiers: Vec<Vec<Rule>>, keys: usize, now: u64) -> Model {
        let expiry = tiers.iter().flatten().map(Rule::expiry).max().unwrap();
        let versions = vec![0; tiers.len()];
        let carries = vec![Carry::Conservative; tiers.len()];
        let mut model = Model { tiers, versions, carries, widest: Vec::new(), now, expiry, keys: Vec::new() };
        model.widen();
        model.keys = (0..keys)
            .map(|key| {
                let tier = key % model.tiers.len();
                let rules = model.tiers[tier].clone();
                KeyModel {
                    tier,
                    overridden: false,
                    laid: (tier, 0),
                    logs: vec![Vec::new(); rules.len()],
                    rings: vec![Ring::default(); rules.len()],
                    rules,
                    earlier: Vec::new(),
                    held: Held::No,
                    laid_at: None,
                }
            })
            .collect();
        model
    }

    /// Widens `widest` to every tier's `max` and gives every tier's rules those widths.
    fn widen(&mut self) {
        for rules in &self.tiers {
            for (j, rule) in rules.iter().enumerate() {
                let bits = entry_bits(rule.max);
                match self.widest.get_mut(j) {
                    Some(w) => *w = (*w).max(bits),
                    None => self.widest.push(bits),
                }
            }
        }
        for rules in &mut self.tiers {
            for (rule, &w) in rules.iter_mut().zip(&self.widest) {
                rule.entry_most = entry_most(w);
            }
        }
    }

    /// A new version of policy `tier` (`update_policy`): its keys move to it at their next
    /// look-up, with `carry`. The sliding window's ring entries widen for a larger `max`.
    pub fn update(&mut self, tier: usize, rules: Vec<Rule>, carry: Carry) {
        self.expiry = self.expiry.max(rules.iter().map(Rule::expiry).max().unwrap());
        let sliding = rules.iter().all(|r| r.algorithm == Algorithm::SlidingWindow);
        self.tiers[tier] = rules;
        if sliding {
            self.widen();
        } else {
            // Only the sliding window has rings (the field is unused otherwise).
            let widest = self.widest.clone();
            for (rule, &w) in self.tiers[tier].iter_mut().zip(&widest) {
                rule.entry_most = entry_most(w);
            }
        }
        self.versions[tier] += 1;
        self.carries[tier] = carry;
    }

    pub fn rules(&self, key: usize) -> &[Rule] {
        &self.keys[key].rules
    }

    /// `reset(key)`: the key's state is gone; a later count lays it out afresh.
    pub fn forget(&mut self, key: usize) {
        let k = &mut self.keys[key];
        if let Some(first) = k.logs.first().filter(|log| !log.is_empty()) {
            k.earlier.push(first.clone());
        }
        k.logs.iter_mut().for_each(Vec::clear);
        k.rings.iter_mut().for_each(|ring| *ring = Ring::default());
    }

    /// `set_policy` or `clear_policy` gave `key` policy `tier`: a held key moves to it at
    /// once, with `Carry::Conservative`; another gets it when it next counts.
    pub fn set_tier(&mut self, key: usize, tier: usize) {
        if self.keys[key].held == Held::Yes {
            self.move_key(key, tier, Carry::Conservative);
        } else {
            self.keys[key].tier = tier;
        }
    }

    /// What the limiter does with `key` at its look-up, before it answers: a held key laid
    /// out for another version (or policy) than its policy's current one moves to it; a key
    /// not held (or perhaps evicted, its windows empty) gets a fresh state under it when it
    /// next counts.
    pub fn look_up(&mut self, key: usize) {
        let tier = self.keys[key].tier;
        if self.keys[key].laid == (tier, self.versions[tier]) {
            return;
        }
        match self.keys[key].held {
            Held::Yes => self.move_key(key, tier, self.carries[tier]),
            Held::No => self.lay_fresh(key, None),
            Held::Maybe => {
                // The limiter may still hold the old state (a sweep that could evict it did
                // not have to), whose `touched` is that life's last activity: a sweep may
                // take the key as idle only from then, not from before that life.
                let last = self.idle(key).map(|idle| self.now - idle);
                self.lay_fresh(key, None);
                self.keys[key].laid_at = last;
            }
        }
    }

    /// Lays `key` out anew under its policy's current version, holding `carried[j]` units
    /// in limit `j`, recorded now (none: empty).
    fn lay_fresh(&mut self, key: usize, carried: Option<Vec<u64>>) {
        let now = self.now;
        let tier = self.keys[key].tier;
        let rules = self.tiers[tier].clone();
        let carried = carried.unwrap_or_else(|| vec![0; rules.len()]);
        let k = &mut self.keys[key];
        if let Some(first) = k.logs.first().filter(|log| !log.is_empty()) {
            k.earlier.push(first.clone());
        }
        k.logs = carried.iter().map(|&c| if c > 0 { vec![(now, c)] } else { Vec::new() }).collect();
        k.rings = carried
            .iter()
            .zip(&rules)
            .map(|(&c, r)| Ring { saturated: Vec::new(), open: (c > 0).then_some(now / r.p) })
            .collect();
        k.rules = rules;
        k.laid = (tier, self.versions[tier]);
    }

    /// Moves held `key` to policy `tier`'s current version now (`KeyState::migrate`): exact
    /// when every limit keeps its window, precision and accuracy, else per `carry`.
    pub fn move_key(&mut self, key: usize, tier: usize, carry: Carry) {
        let now = self.now;
        let new = &self.tiers[tier];
        let k = &mut self.keys[key];
        let exact = k.rules.len() == new.len()
            && k.rules
                .iter()
                .zip(new)
                .all(|(a, b)| a.window == b.window && a.p == b.p && a.strict == b.strict);
        k.tier = tier;
        if exact {
            (k.rules, k.laid) = (new.clone(), (tier, self.versions[tier]));
            return;
        }
        let used: Vec<(u64, u64)> = (k.rules.iter().zip(&k.logs).zip(&k.rings))
            .map(|((rule, log), ring)| (rule.window, rule.used_in(log, ring, now)))
            .collect();
        let carried = new
            .iter()
            .map(|rule| match carry {
                Carry::Reset => 0,
                _ => {
                    let covering = used.iter().filter(|&&(w, _)| w >= rule.window).map(|&(_, u)| u).min();
                    covering.or_else(|| used.iter().map(|&(_, u)| u).max()).unwrap_or(0).min(MOST)
                }
            })
            .collect();
        self.keys[key].laid_at = Some(now);
        self.lay_fresh(key, Some(carried));
    }

    /// Counts `cost` units for `key` now in every limit (an admission, or `record`).
    fn count(&mut self, key: usize, cost: u64) {
        let now = self.now;
        let k = &mut self.keys[key];
        for ((rule, log), ring) in k.rules.iter().zip(&mut k.logs).zip(&mut k.rings) {
            // The first commit in a later slot closes the open one: saturated if it holds
            // its entry's width now.
            let slot = now / rule.p;
            if let Some(open) = ring.open.filter(|&open| open < slot) {
                if rule.saturated(log, ring, open, now) {
                    ring.saturated.push(open);
                }
            }
            ring.open = Some(slot);
            log.push((now, cost));
            // A pair's open count saturates too, and stays saturated if the limit is later
            // laid out as a ring (its count is then unknown: `ring.rs`, `reencode_pair`).
            if rule.pair()
                && rule.in_slot(log, slot) >= u128::from(PAIR_MOST)
                && !ring.saturated.contains(&slot)
            {
                ring.saturated.push(slot);
            }
        }
        k.held = Held::Yes;
    }

    /// `record(key, cost)`: counts `cost` (clamped to [`MOST`]) without a check, then the
    /// decision is a cost-0 look at the state.
    pub fn record(&mut self, key: usize, cost: u64) -> Expected {
        if cost > 0 {
            self.count(key, cost.min(MOST));
        }
        self.decide(key, 0, false)
    }

    pub fn admits_all(&self, key: usize, t: u64, cost: u64) -> bool {
        let k = &self.keys[key];
        (k.rules.iter().zip(&k.logs).zip(&k.rings)).all(|((r, log), ring)| r.admits_in(log, ring, t, cost))
    }

    /// Minimum room over the limits, and the first limit with it.
    pub fn tightest(&self, key: usize, cost: u64) -> (usize, u64) {
        let k = &self.keys[key];
        let rooms = (k.rules.iter().zip(&k.logs).zip(&k.rings))
            .map(|((r, log), ring)| r.room_in(log, ring, self.now, cost));
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
                self.count(key, cost);
            }
            return Expected { denial: None, remaining, tightest, retry_after: None };
        }
        let k = &self.keys[key];
        let mut refusing = None::<(usize, u64)>;
        for (j, ((rule, log), ring)) in k.rules.iter().zip(&k.logs).zip(&k.rings).enumerate() {
            if !rule.admits_in(log, ring, self.now, cost) {
                let at = rule.earliest_in(log, ring, self.now, cost);
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
        let k = &self.keys[key];
        (k.rules.iter().zip(&k.logs).zip(&k.rings))
            .all(|((r, log), ring)| r.scaled_in(log, ring, self.now) == 0)
    }

    /// How long since the key last counted anything (or was laid out anew by a carry).
    pub fn idle(&self, key: usize) -> Option<u64> {
        let k = &self.keys[key];
        let last = k.logs.iter().filter_map(|log| log.last()).map(|&(at, _)| at).chain(k.laid_at).max();
        last.map(|at| self.now - at)
    }
}

/// The latest time [`run`] moves the clock to: 2⁶² ns (about 146 years), where the
/// limiter's clock stands still (its end of time), and far enough below 2⁶⁴ that the
/// model's arithmetic (a time plus at most two windows, two slots and a GCRA burst) cannot
/// overflow. It is beyond 2³² slots of every precision up to 1 s (2³² s is 136 years), so
/// long-uptime runs cross the slot tags' wrap-around for those.
pub const MAX_TIME: u64 = 1 << 62;

// The harness that runs operations through a limiter and the model side by side: a file of
// its own (`#[path]`: found next to this one however this file is included).
#[path = "model_harness.rs"]
mod harness;
// (Unused in the test binaries that take only the model's `Rule`.)
#[allow(unused_imports)]
pub use harness::*;
