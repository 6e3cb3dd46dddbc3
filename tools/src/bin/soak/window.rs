//! The over-admission scan: for each admission `X` of a key, could it have been decided at
//! any time without breaking its limit's bound?
//!
//! `X` was decided at one of the clock values its bracket held (`Held`: the driver is the
//! clock's only writer and logs every value it sets; the limiter reads the clock once per
//! check, between the soak's two reads). For each such value `t`, the scan takes every
//! interval the bound speaks of that contains `t`, and counts in it the units of the other
//! admissions that certainly lie in it: those whose whole bracket does. If for every `t`
//! some interval holds more than the bound with `X`'s units, `X` is an over-admission
//! wherever it was decided, and so is counted: a check that stalled across a clock jump
//! (decided before it, counted after) is held to the window it may have been decided in
//! and to the one it may have been counted in.
//!
//! Admissions that might lie in an interval but need not are left out of its count: the
//! bound is then checked against a subset of what it holds, which can miss an excess but
//! never invent one. Each admission is tested as `X` in turn, so an excess among
//! admissions of narrow brackets is found whichever of them is `X`.
//!
//! The bounds, each the interval's, with `max` the largest that any configuration that
//! may have decided an admission in it allows: of all the admissions decided in an
//! interval of one window, the last to commit saw all the others (a view that missed one
//! fails its CAS and looks again) and kept within its own version's `max`, and that last
//! one may be any admission whose bracket meets the interval, certain or not:
//! - strict windows: at most `max` in any closed interval of one window (a check at `T`
//!   counts every unit since `T − window`);
//! - the sliding log: in any half-open one, `[s, s + window)`;
//! - the interpolated window: at most `max` in any aligned run of its `n` slots (the
//!   semantics guide's promise), and fewer than `2 × max` in any closed window;
//! - the fixed window: in one aligned window `[k·w, (k+1)·w)`;
//! - GCRA: at most `max + ⌊d / T⌋` in any closed interval of length `d` (`T` = window /
//!   max rounded up to the ns). The arrival time rises by `T` per unit admitted, in
//!   whatever order commits land, and the last admission of the interval kept it within
//!   `max × T` of its own clock: units × T ≤ max × T + d.
//!
//! A `reset` starts the key afresh: only admissions certainly after the same resets count
//! together (`epoch`), and one that overlaps a reset is left out entirely.

use crate::checker::Stats;
use crate::workload::{Kind, Model, Spec};

/// An admission as the scan keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Hist {
    pub b: u64,
    pub a: u64,
    pub cost: u64,
    /// Resets of the key certainly before it, or [`AMBIGUOUS`].
    pub epoch: u32,
    /// The configurations that may have decided it ([`crate::workload::Rec::configs`]).
    pub configs: u8,
    /// Part of a `check_all`.
    pub multi: bool,
}

/// The admission overlaps a reset of its key.
pub const AMBIGUOUS: u32 = u32::MAX;

/// A bracket holding more clock values than this is not placed (counted apart).
const MOST_TIMES: usize = 512;

/// The scan's state for one key.
#[derive(Default)]
pub struct Scan {
    /// Admissions sorted by `b`; the first `done` have been tested.
    history: Vec<Hist>,
    done: usize,
}

impl Scan {
    /// Takes in a round's admissions (`fresh`, in any order; each read the clock after every
    /// admission already held) and tests those whose every interval is complete before
    /// `floor`, the clock when the round ended.
    pub fn round(
        &mut self,
        kind: &Kind,
        key: usize,
        fresh: &mut Vec<Hist>,
        floor: u64,
        held: &[u64],
        s: &mut Stats,
    ) {
        fresh.sort_unstable_by_key(|x| (x.b, x.a));
        self.history.append(fresh);
        let span = kind.span();
        while let Some(&x) = self.history.get(self.done) {
            if x.a.saturating_add(span) >= floor {
                break;
            }
            self.test(kind, key, self.done, held, s);
            self.done += 1;
        }
        // Keep what the next ones can still reach back to.
        let cut = self.history.get(self.done).map_or(u64::MAX, |x| x.b.saturating_sub(span));
        let gone = self.history[..self.done].iter().take_while(|x| x.a < cut).count();
        self.history.drain(..gone);
        self.done -= gone;
    }

    /// The earliest bracket start still to be tested.
    pub fn oldest(&self) -> u64 {
        self.history.get(self.done).map_or(u64::MAX, |x| x.b)
    }

    fn test(&self, kind: &Kind, key: usize, at: usize, held: &[u64], stats: &mut Stats) {
        let x = self.history[at];
        if x.epoch == AMBIGUOUS {
            return;
        }
        let span = kind.span();
        let from = self.history.partition_point(|y| y.b < x.b.saturating_sub(span));
        let mates: Vec<Hist> = self.history[from..]
            .iter()
            .enumerate()
            .take_while(|(_, y)| y.b <= x.a.saturating_add(span))
            .filter(|&(j, y)| from + j != at && (y.epoch == x.epoch || y.epoch == AMBIGUOUS))
            .map(|(_, y)| *y)
            .collect();
        let first = held.partition_point(|&t| t <= x.b);
        let inner = held[first..].iter().take_while(|&&t| t < x.a);
        let times: Vec<u64> =
            std::iter::once(x.b).chain(inner.copied()).chain((x.a > x.b).then_some(x.a)).collect();
        if times.len() > MOST_TIMES {
            stats.unplaced += 1;
            return;
        }
        stats.placed += 1;
        for (l, spec) in kind.specs.iter().enumerate() {
            // The least, over the times X may have been decided at, of the worst excess
            // (units over the bound) and of the most units in one interval.
            let (mut excess, mut most, mut aligned) = (i64::MAX, u64::MAX, u64::MAX);
            let mut worst = String::new();
            for &t in &times {
                let found = match kind.model {
                    Model::Strict => interval(spec, &x, &mates, t, spec.window, false),
                    Model::Log => interval(spec, &x, &mates, t, spec.window - 1, false),
                    Model::Interpolated => {
                        let runs = runs(spec, &x, &mates, t, spec.slots());
                        let window = interval(spec, &x, &mates, t, spec.window, true);
                        aligned = aligned.min(runs.1);
                        Found { excess: runs.0.max(window.excess), most: window.most, at: window.at }
                    }
                    Model::Fixed => {
                        let fixed = runs(spec, &x, &mates, t, 1);
                        aligned = aligned.min(fixed.1);
                        interval(spec, &x, &mates, t, spec.window, false).with_excess(fixed.0)
                    }
                    Model::Gcra => gcra(spec, &x, &mates, t),
                };
                if found.excess < excess {
                    excess = found.excess;
                    worst = format!("at {t} ns: {} units from {} ns", found.most, found.at);
                }
                most = most.min(found.most);
            }
            stats.most[l] = stats.most[l].max(most);
            if aligned != u64::MAX {
                stats.most_aligned[l] = stats.most_aligned[l].max(aligned);
            }
            if excess > 0 {
                stats.over[l] += 1;
                stats.example(|| {
                    format!(
                        "{}: key {key}, limit {}: admission{} of {} at [{}, {}] over the bound by {excess} \
                     wherever decided (least: {worst}; {} brackets around it)",
                        kind.name,
                        spec.describe(),
                        if x.multi { " by check_all" } else { "" },
                        x.cost,
                        x.b,
                        x.a,
                        mates.len()
                    )
                });
            }
        }
    }
}

/// The worst interval around one time: units over the bound, the most units, and where.
struct Found {
    excess: i64,
    most: u64,
    at: u64,
}

impl Found {
    fn with_excess(self, excess: i64) -> Found {
        Found { excess, ..self }
    }
}

/// The bound for units admitted under `configs` (a mask of configurations).
fn bound(spec: &Spec, configs: u8) -> u64 {
    spec.max_hi(configs)
}

/// Closed intervals `[s, s + w]` that contain `t`: `s` in `[t − w, t]`. Another admission
/// `Y` lies certainly in one when `s ≤ Y.b` and `Y.a ≤ s + w`, i.e. for `s` in
/// `[Y.a − w, Y.b]`, and possibly when `s ≤ Y.a` and `Y.b ≤ s + w`: a sweep over `s` gives
/// each interval's units (certain, of X's epoch) and the configurations that may have
/// decided an admission in it (possible, of X's epoch or overlapping a reset).
/// `twice`: the bound is `2 × max − 1` (the interpolated window's).
fn interval(spec: &Spec, x: &Hist, mates: &[Hist], t: u64, w: u64, twice: bool) -> Found {
    let lo = t.saturating_sub(w);
    // (position, −1 leaves / +1 enters, units, configurations)
    let mut events: Vec<(u64, i8, u64, u8)> = Vec::new();
    let mut add = |from: u64, to: u64, units: u64, configs: u8| {
        let (from, to) = (from.max(lo), to.min(t));
        if from <= to {
            events.push((from, 1, units, configs));
            events.push((to + 1, -1, units, configs));
        }
    };
    for y in mates {
        if y.epoch == x.epoch && y.a - y.b <= w {
            add(y.a.saturating_sub(w), y.b, y.cost, 0);
        }
        add(y.b.saturating_sub(w), y.a, 0, y.configs);
    }
    events.sort_unstable_by_key(|e| (e.0, e.1));
    let (mut units, mut counted) = (0u64, [0u32; 2]);
    let mut best = Found { excess: i64::MIN, most: 0, at: lo };
    let apply = |e: &(u64, i8, u64, u8), units: &mut u64, counted: &mut [u32; 2]| {
        for (c, n) in counted.iter_mut().enumerate() {
            if e.3 & (1 << c) != 0 {
                *n = if e.1 > 0 { *n + 1 } else { *n - 1 };
            }
        }
        *units = if e.1 > 0 { *units + e.2 } else { *units - e.2 };
    };
    let mut evaluate = |s: u64, units: u64, counted: &[u32; 2]| {
        let configs = x.configs | u8::from(counted[0] > 0) | (u8::from(counted[1] > 0) << 1);
        let limit = if twice { 2 * bound(spec, configs) - 1 } else { bound(spec, configs) };
        let all = units + x.cost;
        let excess = all as i64 - limit as i64;
        if excess > best.excess || (excess == best.excess && all > best.most) {
            best = Found { excess, most: all, at: s };
        }
    };
    let mut k = 0;
    while k < events.len() && events[k].0 <= lo {
        apply(&events[k], &mut units, &mut counted);
        k += 1;
    }
    evaluate(lo, units, &counted);
    while k < events.len() && events[k].0 <= t {
        let at = events[k].0;
        while k < events.len() && events[k].0 == at {
            apply(&events[k], &mut units, &mut counted);
            k += 1;
        }
        evaluate(at, units, &counted);
    }
    best
}

/// Aligned runs of `n` slots (`n = 1`: the fixed window, whose one slot is the window)
/// that contain `t`: the worst excess over the bound, and the most units in one (units
/// and configurations as in `interval`).
fn runs(spec: &Spec, x: &Hist, mates: &[Hist], t: u64, n: u64) -> (i64, u64) {
    let p = spec.precision;
    let k = t / p;
    let (mut excess, mut most) = (i64::MIN, 0);
    for j in (k + 1).saturating_sub(n)..=k {
        let (start, end) = (j * p, (j + n) * p - 1);
        let inside = mates.iter().filter(|y| y.epoch == x.epoch && y.b >= start && y.a <= end);
        let units = x.cost + inside.map(|y| y.cost).sum::<u64>();
        let possible = mates.iter().filter(|y| y.b <= end && y.a >= start);
        let configs = possible.fold(x.configs, |c, y| c | y.configs);
        excess = excess.max(units as i64 - bound(spec, configs) as i64);
        most = most.max(units);
    }
    (excess, most)
}

/// GCRA: closed intervals `[s, e]` around `t` of at most one window on either side, `s`
/// at `t` or at another admission's bracket start, `e` at `t` or at a bracket end.
fn gcra(spec: &Spec, x: &Hist, mates: &[Hist], t: u64) -> Found {
    let (w, step, max) = (spec.window, spec.interval(), spec.max[0]);
    let near: Vec<&Hist> = mates
        .iter()
        .filter(|y| y.epoch == x.epoch && y.b.saturating_add(w) >= t && y.a <= t.saturating_add(w))
        .collect();
    let mut starts: Vec<u64> = near.iter().map(|y| y.b).filter(|&b| b <= t).chain([t]).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut by_end = near.clone();
    by_end.sort_unstable_by_key(|y| y.a);
    let (mut best, mut most) = (Found { excess: i64::MIN, most: 0, at: t }, 0);
    for &s in &starts {
        let mut units = x.cost;
        let mut evaluate = |e: u64, units: u64| {
            let excess = units as i64 - (max + (e - s) / step) as i64;
            if excess > best.excess {
                best = Found { excess, most: units, at: s };
            }
            if e - s <= w {
                most = most.max(units);
            }
        };
        let mut pending = true;
        for y in by_end.iter().filter(|y| y.b >= s) {
            if y.a > t && pending {
                evaluate(t, units);
                pending = false;
            }
            units += y.cost;
            if y.a >= t {
                evaluate(y.a, units);
            }
        }
        if pending {
            evaluate(t, units);
        }
    }
    // The most units in one window, for the table; the excess over any interval.
    best.most = most;
    best
}
