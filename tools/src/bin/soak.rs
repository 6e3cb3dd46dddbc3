//! The contention soak: `cargo run --release -p slidegate-tools --bin soak [-- --seconds 60] [--threads 4]
//! [--quick] [--seed N] [--round-ms 500] [--verbose] [--corrupt N]`.
//!
//! `--threads` worker threads check, as fast as they can, 200 keys (drawn from a skewed
//! distribution: key 0 takes about a quarter of the traffic, the coldest a few in ten
//! thousand) of six limiters, one per kind of limit: the sliding window interpolated and
//! strict, two strict limits at once, the fixed window, the sliding log and GCRA, with costs
//! 1 to 3. A sweeper thread calls `sweep()` on every limiter in a loop, racing the checks,
//! and a driver thread moves the shared `ManualClock` forward in random steps of up to 4 ms
//! (now and then a jump of 1–3 s, after which every key has expired and the sweeper races
//! the checks that re-insert them), so windows of 200 ms to 1 s of simulated time slide by
//! thousands during a run. `--quick` (what CI runs) is a 10 s run.
//!
//! Every check is logged: key, the clock read just before and just after it (the admission
//! happened somewhere in between), a per-key sequence number taken just before and just after
//! (`fetch_add` on one atomic per key: a check whose "after" number is below another's
//! "before" number certainly came first), cost, decision and `retry_after`. The run is cut
//! into rounds (`--round-ms`, all workers pause at the end of each) so that the log of one
//! round is checked while the next runs. The checker below is independent of the library:
//! its own model of each algorithm, from the limits' numbers. Per key and limit it reports:
//!
//! - **over-admissions**, counted only when certain: a set of admissions whose brackets all
//!   lie in one interval, holding more units than the algorithm's bound for that interval.
//!   Strict windows: at most `max` in any closed interval of one window; the sliding log: in
//!   any half-open one; the fixed window: in one aligned window `[k·w, (k+1)·w)`; GCRA: at
//!   most `max + ⌊d / T⌋` in any interval of length `d` (`T` = window / max rounded up to
//!   the ns: the burst, plus one unit per `T` of refill; at most `2 × max` in a window); the
//!   interpolated window: at most `max` in any aligned run of its `n` slots (the semantics guide's
//!   promise), and the largest count in any window must stay below `2 × max`.
//! - **retry_after errors**: for each refusal, the earliest time at which the same request
//!   would fit, recomputed from the logged admissions of the key with the semantics guide's formula
//!   for the algorithm. Admissions certainly before the refusal, placed at their brackets'
//!   starts, give the earliest possible answer; admissions possibly before it, placed at
//!   their brackets' ends, the latest. An error is the distance from the library's answer
//!   (`before + retry_after` … `after + retry_after`) to that range: "short" if the library
//!   named a time before anything the log allows ("never early" broken), "long" if after.
//!   Also counted: **early admissions**, an admission of the key with at least the refused
//!   cost, certainly after the refusal, and certainly before the time the refusal named.
//!   Both "long" errors and early admissions are possible with several limits (a racing
//!   check's commit that is then rolled back can refuse a request, and if a racing check
//!   closed its slot meanwhile the rolled-back units stay counted there: design guide,
//!   Concurrency), with a sliding window when a racing check moved the key on while the
//!   wait was being worked out and stayed preempted in the middle of its move (the wait is
//!   then recomputed from fresh views at most twice before it settles for a later time), and
//!   under GCRA, whose arrival time follows the order racing checks commit in rather than
//!   the order of their clock readings, and in the sliding log, which records an admission
//!   racing a check whose clock is ahead at that later time, but only within a window (plus a slot) after checks
//!   of the same key raced (overlapped in sequence numbers); otherwise they must not happen
//!   at all.
//!
//! The columns "retry_after compared (exact)" say how many refusals were compared and in
//! what share of them the clock brackets had zero width and no admission's order was in
//! doubt, so that the recomputed time is one number, to be matched to the nanosecond.
//! The run is paced by the checker: when it falls behind, the workers wait for it at the
//! end of a round (the table's header line says how much of the run was checking).
//!
//! It prints one table per run, and exits non-zero if any count that must be zero is not.
//! `--corrupt N` checks the checker: it falsifies one refusal in `N` in the log (into an
//! admission, or its `retry_after` moved by 1 ms either way) and the run must then fail.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Barrier, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Decision, Denial, Limit, Limiter, ManualClock};
use slidegate_tools::rng::Rng;

const MS: u64 = 1_000_000;
/// The most slots per window the checker's window models take.
const MAX_SLOTS: usize = 30;
/// Keys per limiter.
const KEYS: usize = 200;

// ---------------------------------------------------------------------------------------
// What is run: six limiters, and the numbers the checker models them with.

/// One limit, as the checker models it; the limiter is built from these numbers.
#[derive(Debug, Clone, Copy)]
struct Spec {
    max: u64,
    window: u64,
    precision: u64,
    strict: bool,
}

impl Spec {
    const fn new(max: u64, window_ms: u64, precision_ms: u64, strict: bool) -> Spec {
        Spec { max, window: window_ms * MS, precision: precision_ms * MS, strict }
    }

    fn limit(&self) -> Limit {
        let limit = Limit::new(self.max, Duration::from_nanos(self.window))
            .precision(Duration::from_nanos(self.precision));
        if self.strict {
            limit.strict()
        } else {
            limit
        }
    }

    /// Slots per window.
    fn slots(&self) -> u64 {
        self.window / self.precision
    }

    /// GCRA: ns between two units at the sustained rate, rounded up, and the burst.
    fn interval(&self) -> u64 {
        self.window.div_ceil(self.max)
    }

    fn burst(&self) -> u64 {
        self.max * self.interval()
    }

    fn describe(&self) -> String {
        let ms = |ns: u64| ns / MS;
        format!(
            "{}/{}ms@{}ms{}",
            self.max,
            ms(self.window),
            ms(self.precision),
            if self.strict { " strict" } else { "" }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Interpolated,
    Strict,
    Fixed,
    Log,
    Gcra,
}

struct Kind {
    name: &'static str,
    algorithm: Algorithm,
    model: Model,
    specs: Vec<Spec>,
}

impl Kind {
    /// Admissions older than this before a check can no longer change its decision.
    fn horizon(&self) -> u64 {
        self.specs.iter().map(|s| s.window + s.precision.max(s.window)).max().unwrap_or(0)
    }

    /// Longest interval an over-admission anchor looks at.
    fn span(&self) -> u64 {
        self.specs.iter().map(|s| s.window).max().unwrap_or(0)
    }

    fn bound(&self) -> &'static str {
        match self.model {
            Model::Interpolated => "≤ max per n aligned slots, < 2 × max per window",
            Model::Strict => "≤ max per window",
            Model::Fixed => "≤ max per aligned window",
            Model::Log => "≤ max per window",
            Model::Gcra => "≤ max + ⌊d/T⌋ per interval d",
        }
    }

    fn limiter(&self, clock: &ManualClock) -> Result<Limiter<u32>, slidegate::ConfigError> {
        let mut builder = Limiter::<u32>::builder().algorithm(self.algorithm).clock(clock.clone());
        for spec in &self.specs {
            builder = builder.limit(spec.limit());
        }
        builder.build()
    }
}

fn kinds() -> Vec<Kind> {
    use Algorithm::*;
    vec![
        Kind {
            name: "sliding window, interpolated",
            algorithm: SlidingWindow,
            model: Model::Interpolated,
            specs: vec![Spec::new(24, 600, 100, false)],
        },
        Kind {
            name: "sliding window, strict",
            algorithm: SlidingWindow,
            model: Model::Strict,
            specs: vec![Spec::new(20, 500, 100, true)],
        },
        Kind {
            name: "two strict limits",
            algorithm: SlidingWindow,
            model: Model::Strict,
            specs: vec![Spec::new(8, 200, 50, true), Spec::new(24, 1_000, 100, true)],
        },
        Kind {
            name: "fixed window",
            algorithm: FixedWindow,
            model: Model::Fixed,
            specs: vec![Spec::new(20, 250, 250, false)],
        },
        Kind {
            name: "sliding log",
            algorithm: SlidingLog,
            model: Model::Log,
            specs: vec![Spec::new(20, 300, 50, false)],
        },
        Kind {
            name: "GCRA",
            algorithm: Gcra,
            model: Model::Gcra,
            specs: vec![Spec::new(20, 400, 50, false)],
        },
    ]
}

// ---------------------------------------------------------------------------------------
// The log.

/// One check: clock (ns) and the key's sequence number before and after, `retry_after`
/// (ns) of a refusal, key, cost, and what was decided.
#[derive(Debug, Clone, Copy)]
struct Rec {
    b: u64,
    a: u64,
    sb: u64,
    sa: u64,
    retry: u64,
    key: u16,
    cost: u8,
    outcome: u8,
}

const ADMITTED: u8 = 0;
const REFUSED: u8 = 1;
/// Anything else (a cost too large, a full table): never expected here.
const OTHER: u8 = 2;

impl Rec {
    fn new(key: usize, cost: u64, (b, a): (u64, u64), (sb, sa): (u64, u64), d: &Decision) -> Rec {
        let outcome = match (d.is_allowed(), d.denial()) {
            (true, _) => ADMITTED,
            (false, Some(Denial::Limit(_))) => REFUSED,
            _ => OTHER,
        };
        let retry = d.retry_after().map_or(0, |r| u64::try_from(r.as_nanos()).unwrap_or(u64::MAX));
        Rec { b, a, sb, sa, retry, key: key as u16, cost: cost as u8, outcome }
    }
}

/// A key's sequence counter, alone on its cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Seq(AtomicU64);

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A key: `⌊KEYS × u⁴⌋` for a uniform `u`, so key 0 gets (1/200)^¼ ≈ 27 % of the checks, the
/// ten hottest about half, key 100 about 0.2 %, key 199 about 0.1 %.
fn skewed_key(rng: &mut Rng) -> usize {
    ((KEYS as f64 * rng.unit().powi(4)) as usize).min(KEYS - 1)
}

// ---------------------------------------------------------------------------------------
// The independent checker: models.

/// An admission as the checker keeps it.
#[derive(Debug, Clone, Copy)]
struct Adm {
    b: u64,
    a: u64,
    sb: u64,
    sa: u64,
    cost: u64,
}

/// The earliest time `>= l` at which `cost` more units fit `spec` under a window model,
/// given the units already counted, placed at the given times (all `<= l`).
fn earliest(model: Model, spec: &Spec, units: &[(u64, u64)], l: u64, cost: u64) -> u64 {
    let max = spec.max;
    match model {
        Model::Strict | Model::Interpolated => {
            // Units per slot, for the slots that can still count at any T >= l: `base` …
            // `k0` (every unit is placed at or before l).
            let (p, n) = (spec.precision, spec.slots());
            let k0 = l / p;
            let base = k0.saturating_sub(n + 1);
            let mut per_slot = [0u64; MAX_SLOTS + 2];
            for &(t, c) in units {
                let s = t / p;
                if s >= base {
                    per_slot[(s - base) as usize] += c;
                }
            }
            // Units in slots `from ..= k0`, `from` >= base.
            let from_slot = |from: u64| -> u64 { per_slot[(from.max(base) - base) as usize..].iter().sum() };
            let in_slot = |s: u64| if s >= base { per_slot[(s - base) as usize] } else { 0 };
            for k in k0..=k0 + n + 1 {
                let from = if k == k0 { l - k0 * p } else { 0 };
                if model == Model::Strict {
                    // At time T in slot k, slots k − n … k count whole.
                    if from_slot(k.saturating_sub(n)) + cost <= max {
                        return k * p + from;
                    }
                    continue;
                }
                // Interpolated: at T, e ns into slot k, slots k − n + 1 … k count whole and
                // slot k − n weighted by (p − e) / p; `cost` fits if whole + cost ≤ max and
                // oldest × (p − e) ≤ (max − whole − cost) × p.
                let whole = from_slot((k + 1).saturating_sub(n));
                let oldest = if k >= n { in_slot(k - n) } else { 0 };
                if whole + cost > max {
                    continue;
                }
                if oldest == 0 || whole + cost + oldest <= max {
                    return k * p + from;
                }
                let excess = whole + cost + oldest - max;
                if excess >= oldest {
                    continue;
                }
                let need = (u128::from(excess) * u128::from(p)).div_ceil(u128::from(oldest));
                let e = (need as u64).max(from);
                if e < p {
                    return k * p + e;
                }
            }
            (k0 + n + 2) * p
        }
        Model::Fixed => {
            let w = spec.window;
            let m = l / w;
            let used: u64 = units.iter().filter(|&&(t, _)| t / w == m).map(|&(_, c)| c).sum();
            if used + cost <= max {
                l
            } else {
                (m + 1) * w
            }
        }
        Model::Log => {
            // A unit at t counts while T < t + w.
            let w = spec.window;
            let mut inside: Vec<u64> = Vec::new();
            for &(t, c) in units {
                if t + w > l {
                    inside.extend(std::iter::repeat_n(t, c as usize));
                }
            }
            let excess = (inside.len() as u64 + cost).saturating_sub(max);
            if excess == 0 {
                return l;
            }
            inside.sort_unstable();
            inside[excess as usize - 1] + w
        }
        Model::Gcra => l, // handled with the order of admissions, in `Track::gcra`
    }
}

/// What the checker keeps per key of one limiter between records and rounds.
#[derive(Default)]
struct Track {
    /// Admissions in sequence order that may still matter to a later refusal.
    recent: Vec<Adm>,
    version: u64,
    /// GCRA, per limit: bounds (earliest, latest) on the theoretical arrival time left by
    /// the admissions folded out of `recent` (each certainly before everything after it).
    tat0: Vec<(u64, u64)>,
    /// Refusals that a later admission may contradict.
    pending: Vec<Pending>,
    /// Admissions sorted by `b` for the over-admission scan; the first `done` were anchors.
    history: Vec<Adm>,
    done: usize,
    cache: Vec<(CacheKey, (u64, u64))>,
    /// The latest clock reading of a check of this key that overlapped another check of it
    /// (in sequence numbers). A commit rolled back after a racing check closed its slot
    /// stays counted in that slot (the design guide), so a refusal up to a window and a
    /// slot after such a race, even one that raced nothing itself, may name a later time.
    raced_at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheKey {
    version: u64,
    definite: usize,
    ahead: usize,
    b: u64,
    a: u64,
    cost: u64,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    sa: u64,
    cost: u64,
    /// The earliest time the refusal can have named: `before + retry_after`.
    named: u64,
    /// Checks of the key raced (overlapped in sequence numbers) at most a window before
    /// it: a racing commit, rolled back, may have refused it (see `Track::raced_at`).
    raced: bool,
}

/// Per limiter: what happened and what the checker found.
#[derive(Debug, Default, Clone)]
struct Stats {
    checks: u64,
    admitted_units: u64,
    refusals: u64,
    other: u64,
    swept: u64,
    /// Per limit: certain over-admissions, most units certainly in one window, and (the
    /// interpolated window) in one aligned run of n slots.
    over: Vec<u64>,
    most: Vec<u64>,
    most_aligned: Vec<u64>,
    /// Refusals whose `retry_after` was compared, and those where the comparison was exact
    /// (clock brackets of zero width and no admission of uncertain order).
    analysed: u64,
    exact: u64,
    short: u64,
    short_max: u64,
    long: u64,
    long_max: u64,
    early: u64,
    /// "Long" errors and early admissions of refusals with no race between checks of the key
    /// within a window before: not the rollback race, so never expected.
    unraced: u64,
    /// The first few failures in full, for the report.
    examples: Vec<String>,
}

impl Stats {
    fn example(&mut self, text: String) {
        if self.examples.len() < 5 {
            self.examples.push(text);
        }
    }
}

impl Track {
    fn new(kind: &Kind) -> Track {
        Track { tat0: vec![(0, 0); kind.specs.len()], ..Track::default() }
    }

    /// Bounds on the earliest admissible time of refusal `r` (with `ahead`: admissions later
    /// in sequence order whose order against `r` is unknown).
    fn bounds(&mut self, kind: &Kind, r: &Rec, ahead: &[Adm]) -> (u64, u64) {
        let definite = self.recent.iter().filter(|x| x.sa < r.sb).count();
        let key = CacheKey {
            version: self.version,
            definite,
            ahead: ahead.len(),
            b: r.b,
            a: r.a,
            cost: u64::from(r.cost),
        };
        if let Some(&(_, found)) = self.cache.iter().find(|(k, _)| *k == key) {
            return found;
        }
        let cost = u64::from(r.cost);
        let found = if kind.model == Model::Gcra {
            self.gcra(kind, r, ahead)
        } else {
            // Certainly counted, placed as early as they may be; possibly counted, as late.
            let early: Vec<(u64, u64)> =
                self.recent.iter().filter(|x| x.sa < r.sb).map(|x| (x.b, x.cost)).collect();
            let late: Vec<(u64, u64)> =
                self.recent.iter().chain(ahead).map(|x| (x.a.min(r.a), x.cost)).collect();
            kind.specs.iter().fold((0, 0), |(lo, hi), spec| {
                (
                    lo.max(earliest(kind.model, spec, &early, r.b, cost)),
                    hi.max(earliest(kind.model, spec, &late, r.a, cost)),
                )
            })
        };
        if self.cache.len() >= 4 {
            self.cache.remove(0);
        }
        self.cache.push((key, found));
        found
    }

    /// GCRA: the arrival time after admissions at `t_j` of `c_j` units in commit order is
    /// `max(TAT₀ + T·Σc, max_j (t_j + T·(units committed at or after j)))`. The commit order
    /// is known only partly, so the earliest bound counts after `j` only the units certainly
    /// after it, and the latest all units possibly after it.
    fn gcra(&self, kind: &Kind, r: &Rec, ahead: &[Adm]) -> (u64, u64) {
        let cost = u64::from(r.cost);
        let sure: Vec<&Adm> = self.recent.iter().filter(|x| x.sa < r.sb).collect();
        let maybe: Vec<&Adm> = self.recent.iter().chain(ahead).collect();
        let mut bounds = (0, 0);
        for (spec, &(tat0_lo, tat0_hi)) in kind.specs.iter().zip(&self.tat0) {
            let t = spec.interval();
            let units = |set: &[&Adm]| set.iter().map(|x| x.cost).sum::<u64>();
            let mut lo = tat0_lo + t * units(&sure);
            for j in &sure {
                let after: u64 = sure.iter().filter(|i| i.sb > j.sa).map(|i| i.cost).sum();
                lo = lo.max(j.b + t * (j.cost + after));
            }
            let mut hi = tat0_hi + t * units(&maybe);
            for (jx, j) in maybe.iter().enumerate() {
                let after: u64 = maybe
                    .iter()
                    .enumerate()
                    .filter(|&(ix, i)| ix != jx && i.sa > j.sb)
                    .map(|(_, i)| i.cost)
                    .sum();
                hi = hi.max(j.a.min(r.a) + t * (j.cost + after));
            }
            let at = |tat: u64, l: u64| (tat + cost * t).saturating_sub(spec.burst()).max(l);
            bounds = (bounds.0.max(at(lo, r.b)), bounds.1.max(at(hi, r.a)));
        }
        bounds
    }

    /// Forgets what can no longer matter: admissions older than the horizon before `floor`
    /// (no later check reads the clock before `floor`), and for GCRA, folds the oldest
    /// admissions into `tat0` once they are certainly before everything after them (`next`:
    /// the next record's sequence number).
    fn forget(&mut self, kind: &Kind, floor: u64, next: u64) {
        if kind.model == Model::Gcra {
            // The longest prefix whose every admission is certainly before everything after
            // it (the admissions are in `sb` order, so "after it" starts at the first one
            // left, or at the next record).
            let mut last_sa = 0;
            let mut cut = 0;
            for (i, x) in self.recent.iter().enumerate() {
                last_sa = last_sa.max(x.sa);
                let rest = self.recent.get(i + 1).map_or(next, |y| y.sb.min(next));
                if last_sa < rest {
                    cut = i + 1;
                }
            }
            if cut == 0 {
                return;
            }
            let folded: Vec<Adm> = self.recent.drain(..cut).collect();
            for (spec, tat0) in kind.specs.iter().zip(self.tat0.iter_mut()) {
                let t = spec.interval();
                let units: u64 = folded.iter().map(|x| x.cost).sum();
                let (mut lo, mut hi) = (tat0.0 + t * units, tat0.1 + t * units);
                for (jx, j) in folded.iter().enumerate() {
                    let sure: u64 = folded.iter().filter(|i| i.sb > j.sa).map(|i| i.cost).sum();
                    let maybe: u64 = folded
                        .iter()
                        .enumerate()
                        .filter(|&(ix, i)| ix != jx && i.sa > j.sb)
                        .map(|(_, i)| i.cost)
                        .sum();
                    lo = lo.max(j.b + t * (j.cost + sure));
                    hi = hi.max(j.a + t * (j.cost + maybe));
                }
                *tat0 = (lo, hi);
            }
            self.version += 1;
        } else if self.recent.len() > 8 {
            let cut = floor.saturating_sub(kind.horizon());
            let before = self.recent.len();
            self.recent.retain(|x| x.a >= cut);
            if self.recent.len() != before {
                self.version += 1;
            }
        }
    }

    /// One round's records of this key, sorted by sequence number; `floor`: no check of a
    /// later round read the clock before it.
    fn retry_pass(&mut self, kind: &Kind, key: usize, recs: &[Rec], floor: u64, stats: &mut Stats) {
        let mut min_b = vec![floor; recs.len() + 1];
        for i in (0..recs.len()).rev() {
            min_b[i] = min_b[i + 1].min(recs[i].b);
        }
        // The latest "after" sequence number of the records so far: an earlier record still
        // in progress when a later one started.
        let mut latest_sa = 0;
        let lasting = kind.specs.iter().map(|s| s.window + s.precision).max().unwrap_or(0);
        for (i, r) in recs.iter().enumerate() {
            if latest_sa > r.sb || recs.get(i + 1).is_some_and(|x| x.sb < r.sa) {
                self.raced_at = Some(self.raced_at.map_or(r.a, |at| at.max(r.a)));
            }
            latest_sa = latest_sa.max(r.sa);
            let raced = self.raced_at.is_some_and(|at| at + lasting >= r.b);
            stats.checks += 1;
            let next = recs.get(i + 1).map_or(u64::MAX, |x| x.sb);
            match r.outcome {
                ADMITTED => {
                    let cost = u64::from(r.cost);
                    stats.admitted_units += cost;
                    // Refusals this admission contradicts; and those no later admission can
                    // (every later check read the clock at or after `min_b[i]`).
                    let mut early = Vec::new();
                    self.pending.retain(|p| {
                        if p.sa < r.sb && cost >= p.cost && r.a < p.named {
                            early.push(*p);
                            return false;
                        }
                        p.named > min_b[i]
                    });
                    for p in early {
                        stats.early += 1;
                        stats.unraced += u64::from(!p.raced);
                        stats.example(format!(
                            "{}: key {key}: admission of {cost} at [{}, {}] (seq {}) before the time a \
                             refusal of {} named ({}, seq ..{})",
                            kind.name, r.b, r.a, r.sb, p.cost, p.named, p.sa
                        ));
                    }
                    self.recent.push(Adm { b: r.b, a: r.a, sb: r.sb, sa: r.sa, cost });
                    self.history.push(Adm { b: r.b, a: r.a, sb: r.sb, sa: r.sa, cost });
                    self.version += 1;
                    self.forget(kind, min_b[i + 1], next);
                }
                REFUSED => {
                    stats.refusals += 1;
                    // Admissions after this one in sequence order that may still have come
                    // before it.
                    let ahead: Vec<Adm> = recs[i + 1..]
                        .iter()
                        .take_while(|x| x.sb < r.sa)
                        .filter(|x| x.outcome == ADMITTED)
                        .map(|x| Adm { b: x.b, a: x.a, sb: x.sb, sa: x.sa, cost: u64::from(x.cost) })
                        .collect();
                    let (lo, hi) = self.bounds(kind, r, &ahead);
                    let (named_lo, named_hi) = (r.b + r.retry, r.a + r.retry);
                    stats.analysed += 1;
                    let exact = r.b == r.a && lo == hi;
                    stats.exact += u64::from(exact);
                    if lo > named_hi {
                        stats.short += 1;
                        stats.short_max = stats.short_max.max(lo - named_hi);
                        stats.example(format!(
                            "{}: key {key}: refusal of {} at [{}, {}] (seq {}..{}) named {}+, but \
                             nothing fits before {lo} (latest {hi}); recent {:?}, ahead {:?}",
                            kind.name, r.cost, r.b, r.a, r.sb, r.sa, named_lo, self.recent, ahead
                        ));
                    }
                    if named_lo > hi {
                        stats.long += 1;
                        stats.unraced += u64::from(!raced);
                        stats.long_max = stats.long_max.max(named_lo - hi);
                        if !raced {
                            stats.example(format!(
                                "{}: key {key}: refusal of {} at [{}, {}] (seq {}..{}) named {}, but it \
                                 fits from {hi} at the latest (earliest {lo}); recent {:?}, ahead {:?}",
                                kind.name, r.cost, r.b, r.a, r.sb, r.sa, named_lo, self.recent, ahead
                            ));
                        }
                    }
                    self.pending.push(Pending { sa: r.sa, cost: u64::from(r.cost), named: named_lo, raced });
                }
                _ => {
                    stats.other += 1;
                    stats.example(format!("{}: key {key}: unexpected decision {r:?}", kind.name));
                }
            }
        }
        self.pending.retain(|p| p.named > floor);
        let next = u64::MAX;
        self.forget(kind, floor, next);
    }

    /// The over-admission scan over the admissions whose windows have closed before
    /// `floor`: each admission in turn anchors the intervals that start at its bracket's
    /// start (and, for the aligned bounds, at its slot's or window's start).
    fn over_pass(&mut self, kind: &Kind, key: usize, floor: u64, stats: &mut Stats) {
        let fresh = self.history.len();
        // New admissions all read the clock after every anchor already scanned.
        let start = self.done;
        self.history[start..fresh].sort_unstable_by_key(|x| (x.b, x.a));
        let span = kind.span();
        while self.done < self.history.len() && self.history[self.done].b.saturating_add(span) < floor {
            let anchor = self.history[self.done];
            for (l, spec) in kind.specs.iter().enumerate() {
                self.anchor(kind, key, l, spec, anchor.b, stats);
            }
            self.done += 1;
        }
        // Keep what the next anchors can still reach back to.
        if let Some(next) = self.history.get(self.done) {
            let cut = next.b.saturating_sub(span);
            let gone = self.history[..self.done].partition_point(|x| x.b < cut);
            self.history.drain(..gone);
            self.done -= gone;
        } else {
            self.history.clear();
            self.done = 0;
        }
    }

    /// Units certainly in `[from, to]`: admissions whose bracket lies inside it.
    fn within(&self, from: u64, to: u64) -> u64 {
        let first = self.history.partition_point(|x| x.b < from);
        self.history[first..].iter().take_while(|x| x.b <= to).filter(|x| x.a <= to).map(|x| x.cost).sum()
    }

    fn anchor(&self, kind: &Kind, key: usize, l: usize, spec: &Spec, s: u64, stats: &mut Stats) {
        let max = spec.max;
        let w = spec.window;
        let mut violation = None;
        let (most, bound) = match kind.model {
            // Closed intervals of one window.
            Model::Strict | Model::Interpolated | Model::Fixed => (self.within(s, s + w), max),
            // Half-open: a unit at t no longer counts at t + w.
            Model::Log => (self.within(s, s + w - 1), max),
            Model::Gcra => {
                let first = self.history.partition_point(|x| x.b < s);
                let mut ends: Vec<(u64, u64)> = self.history[first..]
                    .iter()
                    .take_while(|x| x.b <= s + w)
                    .filter(|x| x.a <= s + w)
                    .map(|x| (x.a, x.cost))
                    .collect();
                ends.sort_unstable();
                let mut units = 0;
                for &(end, cost) in &ends {
                    units += cost;
                    let allowed = max + (end - s) / spec.interval();
                    if units > allowed && violation.is_none() {
                        violation = Some(format!("{units} units within [{s}, {end}] ns, bound {allowed}"));
                    }
                }
                (units, 2 * max)
            }
        };
        stats.most[l] = stats.most[l].max(most);
        match kind.model {
            Model::Strict | Model::Log if most > bound => {
                violation = Some(format!("{most} units within one window from {s} ns"));
            }
            Model::Interpolated => {
                // Any aligned run of n slots holds at most max; any window below 2 × max.
                let p = spec.precision;
                let run = s / p * p;
                let aligned = self.within(run, run + spec.slots() * p - 1);
                stats.most_aligned[l] = stats.most_aligned[l].max(aligned);
                if aligned > max {
                    violation =
                        Some(format!("{aligned} units within the {} slots from {run} ns", spec.slots()));
                } else if most >= 2 * max {
                    violation = Some(format!("{most} units within one window from {s} ns"));
                }
            }
            Model::Fixed => {
                let from = s / w * w;
                let aligned = self.within(from, from + w - 1);
                stats.most_aligned[l] = stats.most_aligned[l].max(aligned);
                if aligned > max {
                    violation = Some(format!("{aligned} units within the window from {from} ns"));
                }
            }
            _ => {}
        }
        if let Some(what) = violation {
            stats.over[l] += 1;
            stats.example(format!("{}: key {key}, limit {}: {what}", kind.name, spec.describe()));
        }
    }
}

/// The checker's state for one limiter.
struct Checker {
    tracks: Vec<Track>,
    stats: Stats,
}

impl Checker {
    fn new(kind: &Kind) -> Checker {
        let n = kind.specs.len();
        Checker {
            tracks: (0..KEYS).map(|_| Track::new(kind)).collect(),
            stats: Stats { over: vec![0; n], most: vec![0; n], most_aligned: vec![0; n], ..Stats::default() },
        }
    }

    /// One round's records of this limiter; `floor`: the clock when the round ended.
    fn round(&mut self, kind: &Kind, mut recs: Vec<Rec>, floor: u64) {
        recs.sort_unstable_by_key(|r| (r.key, r.sb));
        let mut rest = &recs[..];
        while let Some(first) = rest.first() {
            let key = usize::from(first.key);
            let n = rest.partition_point(|r| usize::from(r.key) == key);
            let track = &mut self.tracks[key];
            track.retry_pass(kind, key, &rest[..n], floor, &mut self.stats);
            track.over_pass(kind, key, floor, &mut self.stats);
            rest = &rest[n..];
        }
    }

    /// After the last round: every anchor is final.
    fn finish(&mut self, kind: &Kind) {
        for (key, track) in self.tracks.iter_mut().enumerate() {
            track.over_pass(kind, key, u64::MAX, &mut self.stats);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The run.

struct Options {
    seconds: u64,
    threads: usize,
    seed: u64,
    round: Duration,
    /// `--corrupt N`: falsify one refusal in N in the log before checking it (turned into an
    /// admission, or its `retry_after` moved by 1 ms either way), to see the checker catch
    /// it: the run must then fail.
    corrupt: u64,
    verbose: bool,
}

/// the contention soak: threads check skewed keys on every algorithm, and an independent
/// checker replays the log; exits non-zero if a bound is broken.
#[derive(argh::FromArgs)]
struct Flags {
    /// run for this many seconds (default 60; 10 with --quick)
    #[argh(option)]
    seconds: Option<u64>,
    /// a 10-second run (CI), unless --seconds says otherwise
    #[argh(switch)]
    quick: bool,
    /// worker threads (default 4)
    #[argh(option, default = "4")]
    threads: usize,
    /// the traffic's seed (default 1)
    #[argh(option, default = "1")]
    seed: u64,
    /// the length of a round in milliseconds (default 500)
    #[argh(option, default = "500")]
    round_ms: u64,
    /// falsify one refusal in N in the log, to see the checker catch it (default 0: none)
    #[argh(option, default = "0")]
    corrupt: u64,
    /// print each round's checks and the checker's time per round
    #[argh(switch)]
    verbose: bool,
}

fn options() -> Result<Options, String> {
    let f: Flags = argh::from_env();
    let o = Options {
        seconds: f.seconds.unwrap_or(if f.quick { 10 } else { 60 }),
        threads: f.threads,
        seed: f.seed,
        round: Duration::from_millis(f.round_ms),
        corrupt: f.corrupt,
        verbose: f.verbose,
    };
    if o.threads == 0 || o.seconds == 0 || o.round.is_zero() {
        return Err("--threads, --seconds and --round-ms must be positive".into());
    }
    Ok(o)
}

/// What the workers hand over at the end of a round: per worker, per limiter.
type Round = Vec<Vec<Vec<Rec>>>;

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let kinds = kinds();
    if kinds.iter().flat_map(|k| &k.specs).any(|s| s.slots() as usize > MAX_SLOTS) {
        eprintln!("soak: the checker models at most {MAX_SLOTS} slots per window");
        return ExitCode::from(2);
    }
    let clock = ManualClock::new();
    let mut limiters = Vec::new();
    for kind in &kinds {
        match kind.limiter(&clock) {
            Ok(l) => limiters.push(l),
            Err(e) => {
                eprintln!("soak: {}: {e}", kind.name);
                return ExitCode::from(2);
            }
        }
    }
    let seqs: Vec<Vec<Seq>> = kinds.iter().map(|_| (0..KEYS).map(|_| Seq::default()).collect()).collect();
    println!(
        "soak: {} worker threads × {KEYS} keys × {} limiters for {} s (seed {}, rounds of {:?}), \
         a sweeper racing, the clock in random steps",
        o.threads,
        kinds.len(),
        o.seconds,
        o.seed,
        o.round
    );

    let stop = AtomicBool::new(false);
    let round_over = AtomicBool::new(false);
    let start = Barrier::new(o.threads + 1);
    let end = Barrier::new(o.threads + 1);
    let handed: Mutex<Round> = Mutex::new(Vec::new());
    let swept: Vec<AtomicU64> = kinds.iter().map(|_| AtomicU64::new(0)).collect();
    let (steps, jumps) = (AtomicU64::new(0), AtomicU64::new(0));
    let (to_checker, rounds) = mpsc::sync_channel::<(Round, u64)>(1);
    let began = Instant::now();

    let (checkers, rounds_run, active) = thread::scope(|s| {
        // Workers.
        for w in 0..o.threads {
            let (limiters, seqs, clock, stop, round_over, start, end, handed) =
                (&limiters, &seqs, &clock, &stop, &round_over, &start, &end, &handed);
            let mut rng = Rng(o.seed.wrapping_mul(1_000_003).wrapping_add(w as u64));
            s.spawn(move || loop {
                start.wait();
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let mut logs: Vec<Vec<Rec>> = limiters.iter().map(|_| Vec::with_capacity(1 << 16)).collect();
                while !round_over.load(Ordering::Relaxed) {
                    let l = rng.below(limiters.len() as u64) as usize;
                    let key = skewed_key(&mut rng);
                    let cost = rng.below(3) + 1;
                    let seq = &seqs[l][key].0;
                    let sb = seq.fetch_add(1, Ordering::SeqCst);
                    let b = ns(clock.now());
                    let d = limiters[l].check_n(&(key as u32), cost);
                    let a = ns(clock.now());
                    let sa = seq.fetch_add(1, Ordering::SeqCst);
                    logs[l].push(Rec::new(key, cost, (b, a), (sb, sa), &d));
                }
                handed.lock().unwrap_or_else(PoisonError::into_inner).push(logs);
                end.wait();
            });
        }
        // The sweeper.
        {
            let (limiters, swept, stop, round_over) = (&limiters, &swept, &stop, &round_over);
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    // Racing the checks; between rounds, leaving the cores to the checker.
                    if round_over.load(Ordering::Relaxed) {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    for (limiter, n) in limiters.iter().zip(swept) {
                        n.fetch_add(limiter.sweep() as u64, Ordering::Relaxed);
                    }
                }
            });
        }
        // The clock's driver.
        {
            let (clock, stop, steps, jumps) = (&clock, &stop, &steps, &jumps);
            let mut rng = Rng(o.seed ^ 0xC10C);
            s.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    thread::sleep(Duration::from_micros(50));
                    if rng.below(5_000) == 0 {
                        clock.advance(Duration::from_nanos(1_000 * MS + rng.below(2_000 * MS)));
                        jumps.fetch_add(1, Ordering::Relaxed);
                    } else {
                        clock.advance(Duration::from_nanos(rng.below(4 * MS + 1)));
                    }
                    steps.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // The checker.
        let kinds = &kinds;
        let (verbose, corrupt) = (o.verbose, o.corrupt);
        let mut falsify = Rng(o.seed ^ 0xBAD);
        let checker = s.spawn(move || {
            let mut checkers: Vec<Checker> = kinds.iter().map(Checker::new).collect();
            for (mut round, floor) in rounds {
                let t0 = Instant::now();
                if corrupt > 0 {
                    for r in round.iter_mut().flatten().flatten().filter(|r| r.outcome == REFUSED) {
                        if falsify.below(corrupt) == 0 {
                            match falsify.below(3) {
                                0 => r.outcome = ADMITTED,
                                1 => r.retry = r.retry.saturating_sub(MS),
                                _ => r.retry += MS,
                            }
                        }
                    }
                }
                let mut per_kind: Vec<Vec<Rec>> = kinds.iter().map(|_| Vec::new()).collect();
                for logs in round {
                    for (all, log) in per_kind.iter_mut().zip(logs) {
                        all.extend(log);
                    }
                }
                for ((checker, kind), recs) in checkers.iter_mut().zip(kinds).zip(per_kind) {
                    checker.round(kind, recs, floor);
                }
                if verbose {
                    eprintln!("  checker: a round checked in {:.3} s", t0.elapsed().as_secs_f64());
                }
            }
            for (checker, kind) in checkers.iter_mut().zip(kinds) {
                checker.finish(kind);
            }
            checkers
        });

        // Rounds, until the time is up.
        let deadline = began + Duration::from_secs(o.seconds);
        let mut rounds_run = 0;
        let mut active = Duration::ZERO;
        let mut progress = began + Duration::from_secs(10);
        while Instant::now() < deadline {
            round_over.store(false, Ordering::Relaxed);
            start.wait();
            let round_began = Instant::now();
            thread::sleep(o.round.min(deadline.saturating_duration_since(Instant::now())));
            round_over.store(true, Ordering::Relaxed);
            end.wait();
            active += round_began.elapsed();
            // Every check of this round read the clock at most now, and every check of the
            // next reads it at least now.
            let floor = ns(clock.now());
            let round = std::mem::take(&mut *handed.lock().unwrap_or_else(PoisonError::into_inner));
            rounds_run += 1;
            if o.verbose {
                let n: usize = round.iter().flatten().map(Vec::len).sum();
                eprintln!(
                    "  round {rounds_run}: {n} checks, ended at {:.3} s",
                    began.elapsed().as_secs_f64()
                );
            }
            if to_checker.send((round, floor)).is_err() {
                break;
            }
            if Instant::now() >= progress {
                eprintln!(
                    "  {:>4.0} s: {rounds_run} rounds, simulated clock at {:.0} s",
                    began.elapsed().as_secs_f64(),
                    clock.now().as_secs_f64()
                );
                progress += Duration::from_secs(10);
            }
        }
        stop.store(true, Ordering::Release);
        start.wait();
        drop(to_checker);
        let checkers = checker.join().ok();
        (checkers, rounds_run, active)
    });
    let Some(mut checkers) = checkers else {
        eprintln!("soak: the checker panicked");
        return ExitCode::FAILURE;
    };
    for (checker, n) in checkers.iter_mut().zip(&swept) {
        checker.stats.swept = n.load(Ordering::Relaxed);
    }
    let stats: Vec<Stats> = checkers.into_iter().map(|c| c.stats).collect();
    let elapsed = began.elapsed();
    let simulated = clock.now();
    let (failures, table) = report(&kinds, &stats);
    let checks: u64 = stats.iter().map(|s| s.checks).sum();
    println!(
        "\n{} worker threads, {:.1} s, of which {:.1} s checking ({rounds_run} rounds; the rest waiting for \
         the checker), {:.2} M checks/s while checking; simulated {:.0} s in {} clock steps ({} jumps of \
         1–3 s)\n",
        o.threads,
        elapsed.as_secs_f64(),
        active.as_secs_f64(),
        checks as f64 / active.as_secs_f64() / 1e6,
        simulated.as_secs_f64(),
        steps.load(Ordering::Relaxed),
        jumps.load(Ordering::Relaxed)
    );
    println!("{table}");
    for kind in &kinds {
        let windows = simulated.as_nanos() as f64 / kind.span() as f64;
        print!("{}: {:.0} windows; ", kind.name, windows);
    }
    println!();
    for s in &stats {
        for e in &s.examples {
            println!("  ! {e}");
        }
    }
    if failures.is_empty() {
        println!("\nsoak: OK (every must-be-zero count is zero)");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("soak: FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}

/// The table, and what failed.
fn report(kinds: &[Kind], stats: &[Stats]) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| limiter | limits | checks | admitted units | refusals | keys swept | over-admissions (bound) \
         | most units in a window / max | retry_after compared (exact) | error beyond slack: short / long \
         (max ns) | early admissions | long or early, no race within a window |"
    );
    let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---|---|---:|---|---:|---:|");
    for (kind, s) in kinds.iter().zip(stats) {
        let limits: Vec<String> = kind.specs.iter().map(Spec::describe).collect();
        let over: u64 = s.over.iter().sum();
        let ratios: Vec<String> = kind
            .specs
            .iter()
            .enumerate()
            .map(|(l, spec)| {
                let mut text = format!("{:.2}", s.most[l] as f64 / spec.max as f64);
                match kind.model {
                    Model::Interpolated => {
                        let _ =
                            write!(text, " ({:.2} per n slots)", s.most_aligned[l] as f64 / spec.max as f64);
                    }
                    Model::Fixed => {
                        let _ = write!(text, " ({:.2} aligned)", s.most_aligned[l] as f64 / spec.max as f64);
                    }
                    _ => {}
                }
                text
            })
            .collect();
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {over} ({}) | {} | {} ({:.1} %) | {} / {} ({} / {}) | {} | {} |",
            kind.name,
            limits.join(" + "),
            s.checks,
            s.admitted_units,
            s.refusals,
            s.swept,
            kind.bound(),
            ratios.join(", "),
            s.analysed,
            100.0 * s.exact as f64 / s.analysed.max(1) as f64,
            s.short,
            s.long,
            s.short_max,
            s.long_max,
            s.early,
            s.unraced
        );
        // A wait may be later than exact after a race: with several limits (a rolled-back
        // commit), in a sliding window when a racing check moved the key on while the wait
        // was worked out and stayed preempted mid-move (the design guide), under GCRA,
        // whose arrival time follows the order in which racing checks commit, which can
        // differ from the order of their clock readings (`max(tat, now) + T` is not the same
        // for two commits taken in either order), and in the sliding log, which records an
        // admission racing a check whose clock is ahead at that later time (entries stay
        // sorted), where the checker has it at its own clock reading. All need a race of
        // the key within a window before (`unraced` counts the others).
        let may_race_long = kind.specs.len() > 1
            || matches!(kind.algorithm, Algorithm::SlidingWindow | Algorithm::Gcra | Algorithm::SlidingLog);
        if over > 0 {
            failures.push(format!("{}: {over} over-admissions", kind.name));
        }
        if s.short > 0 {
            failures.push(format!("{}: {} retry_after earlier than the log allows", kind.name, s.short));
        }
        if s.other > 0 {
            failures.push(format!("{}: {} unexpected decisions", kind.name, s.other));
        }
        if !may_race_long && s.long > 0 {
            failures
                .push(format!("{}: {} retry_after later than the log allows (one limit)", kind.name, s.long));
        }
        if !may_race_long && s.early > 0 {
            failures.push(format!("{}: {} early admissions (one limit)", kind.name, s.early));
        }
        if s.unraced > 0 {
            failures.push(format!(
                "{}: {} retry_after too long or early admissions with no race within a window before",
                kind.name, s.unraced
            ));
        }
        if s.checks == 0 || s.refusals == 0 || s.admitted_units == 0 {
            failures.push(format!(
                "{}: no traffic at the limit (checks {}, refusals {})",
                kind.name, s.checks, s.refusals
            ));
        }
    }
    (failures, t)
}
