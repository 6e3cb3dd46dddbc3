//! The checker's pass over one key's records, in sequence order: every admission replayed
//! against what certainly came before it, every refusal's decision and `retry_after`
//! recomputed, and every refusal held against the admissions that follow it.
//!
//! # What a record tells
//! A record's sequence bracket `[sb, sa]` comes from `fetch_add`s (SeqCst) on one atomic
//! per key, taken before and after the operation: when `x.sa < r.sb`, `x` returned before
//! `r` began. Its clock bracket `[b, a]` holds the reading the limiter decided at (the
//! limiter reads the same `ManualClock` once per check, between the soak's two reads).
//! A check `r` counts an earlier check `x` for certain when `x.sa < r.sb` (and no reset
//! may lie between them); it may count `x` when `x.sb < r.sa`. A unit `r` counts carries a
//! time no later than `r.a`: `x` read its clock before committing, and `r` viewed that
//! commit before its own second read. It may carry a time later than `r`'s own reading,
//! when `r` stalled between reading the clock and viewing the key. So:
//!
//! - **certain** units (admitted, `x.sa < r.sb`) are placed at their bracket's start, the
//!   earliest they can be: the earliest time the request can fit (`lower`) follows;
//! - **possible** units (`x.sb < r.sa`) are placed at their bracket's end, capped at the
//!   check's own end, the latest they can be: the latest time the request certainly fits
//!   (`upper`) follows. A sliding log stamps a unit with the latest time its log holds
//!   when a racing check's clock is ahead; that time was read by a check whose commit
//!   this one saw, so it is no later than this bracket's end either, and the cap holds.
//!   Under GCRA the arrival time depends on the order commits land in, which a sequence
//!   bracket orders only in part: the upper bound counts after each admission every unit
//!   whose bracket does not end before it.
//!
//! # What must be zero, and each tolerance
//! - **admitted with no room**: an admission whose `lower` is past its bracket's end. No
//!   tolerance: every unit in `lower` was certainly counted by it.
//! - **short** `retry_after`: a refusal that named a time before its `lower`. No tolerance.
//! - **refused with room**: a refusal that fits, with every possible unit placed as late as
//!   possible, at every time it may have decided at: each clock value its bracket held
//!   (`Held`: the driver's values) and, in a sliding window, each slot start inside it (a
//!   view that meets a later slot of a racing check adopts it, from its start). No
//!   tolerance beyond the possible units below.
//! - **long** `retry_after`: named after its `upper` (when not refused with room).
//!   Tolerated (counted apart) only in a sliding window, when a check that may commit
//!   overlapped the refusal, by at most the longest window: the refusal's wait walked a
//!   ring position that the racing check had just reused (`admissible_at`, the design
//!   guide); the library starts over from fresh views twice and then settles for that
//!   later time, which is at most a window late. The decision itself is from a consistent
//!   view (`refused with room` stays zero), so no over-admission or lost unit hides here.
//! - **early admission**: an admission of at least a refusal's cost, certainly after it
//!   and certainly before the time it named. Explained (counted apart) when a check that
//!   rolls back and may have committed overlapped the refusal (its view may have held
//!   units that check took back, a wait the log does not owe), in a sliding window when a
//!   check that may have committed overlapped it (the late wait above), or when a
//!   configuration with a larger `max` may have decided the admission than may have
//!   decided the refusal. An early admission explained so is no over-admission: those are
//!   counted from the admissions alone.
//!
//! What a check may have counted beyond the admissions (units a check that rolls back
//! may have shown or left behind) is `possible.rs`'s.
//!
//! Resets: a record that overlaps a `reset` of its key may have run on either side of it.
//! Its admission counts as possible only; its refusal is not analysed (`skipped`). At the
//! reset (in sequence order) everything certainly before it is dropped: the records that
//! follow are certainly after it or overlap it.

use crate::checker::Stats;
use crate::model::{earliest, gcra_fits_from, gcra_lower, gcra_upper, Unit};
use crate::possible::{unit, Adm};
use crate::window::{Hist, AMBIGUOUS};
use crate::workload::{Kind, Model, Rec, ADMITTED, NOTHING, NO_RETRY, REFUSED, RESET};
use slidegate::Algorithm;

#[derive(Debug, Clone, Copy)]
struct Pending {
    sb: u64,
    sa: u64,
    cost: u64,
    /// The earliest time the refusal can have named: `before + retry_after`.
    named: u64,
    configs: u8,
    /// Its view may have held units taken back later, or its wait may be late (see the
    /// module's essay): as far as the checks of its round already read tell.
    explained: bool,
    /// Made in the round being read: checks still to come may overlap it.
    fresh: bool,
}

/// A check that may have committed into the key (admitted, or refused after a commit it
/// rolled back), in the round being read.
#[derive(Debug, Clone, Copy)]
struct Mover {
    sb: u64,
    sa: u64,
    rolls: bool,
}

impl Mover {
    /// Whether it overlaps a refusal, and may explain an early admission after it: it rolls
    /// back (its units may have been in the refusal's view and gone later), or it moved a
    /// sliding window's ring while the refusal's wait walked it.
    fn explains(&self, kind: &Kind, p: &Pending) -> bool {
        self.sb < p.sa && p.sb < self.sa && (self.rolls || kind.algorithm == Algorithm::SlidingWindow)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CacheKey {
    upper: bool,
    version: u64,
    /// Units in the set: certain ones for `lower`, transient ones for `upper` (each set
    /// only grows, or only shrinks, as records go by in sequence order).
    n: usize,
    at: u64,
    cost: u64,
    configs: u8,
    /// `upper`: the first and last sequence numbers of the checks ahead, and the units the
    /// check may have left itself (per limit, packed).
    ahead: (u64, u64),
    own: u64,
}

/// What the checker keeps per key of one limiter between records and rounds.
pub struct Track {
    /// Records that may have committed units and may still matter, in sequence order.
    recent: Vec<Adm>,
    /// Bumped whenever `recent` or `tat0` changes (the cache's key).
    version: u64,
    /// GCRA, per limit: bounds (earliest, latest) on the theoretical arrival time left by
    /// the records folded out of `recent` (each certainly before everything after it).
    tat0: Vec<(u64, u64)>,
    /// Refusals that a later admission may contradict.
    pending: Vec<Pending>,
    cache: Vec<(CacheKey, u64)>,
    /// Resets of the key in the rounds checked so far.
    resets: u32,
}

/// Per record of a round, from the records around it.
#[derive(Default, Clone, Copy)]
struct Around {
    /// Overlapping checks that may have committed.
    committing: u32,
    /// Overlaps a reset.
    reset: bool,
}

impl Track {
    pub fn new(kind: &Kind) -> Track {
        Track {
            recent: Vec::new(),
            version: 0,
            tat0: vec![(0, 0); kind.specs.len()],
            pending: Vec::new(),
            cache: Vec::new(),
            resets: 0,
        }
    }

    fn rolls(kind: &Kind, r: &Rec) -> bool {
        r.multi || kind.specs.len() > 1
    }

    fn commits(kind: &Kind, r: &Rec) -> bool {
        r.commits(kind.specs.len() > 1)
    }

    /// One round's records of this key, sorted by sequence number; `floor`: no check of a
    /// later round read the clock before it; `held`: the clock's values, sorted.
    #[allow(clippy::too_many_arguments)]
    pub fn pass(
        &mut self,
        kind: &Kind,
        key: usize,
        recs: &[Rec],
        floor: u64,
        held: &[u64],
        stats: &mut Stats,
        hist: &mut Vec<Hist>,
    ) {
        let mut around = vec![Around::default(); recs.len()];
        for i in 0..recs.len() {
            for j in i + 1..recs.len() {
                if recs[j].sb > recs[i].sa {
                    break;
                }
                for (x, y) in [(i, j), (j, i)] {
                    around[x].committing += u32::from(Track::commits(kind, &recs[y]));
                    around[x].reset |= recs[y].what == RESET;
                }
            }
        }
        let mut reset_sa: Vec<u64> = recs.iter().filter(|r| r.what == RESET).map(|r| r.sa).collect();
        reset_sa.sort_unstable();
        let mut min_b = vec![floor; recs.len() + 1];
        for i in (0..recs.len()).rev() {
            min_b[i] = min_b[i + 1].min(recs[i].b);
        }
        let mut movers: Vec<Mover> = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            let next = recs.get(i + 1).map_or(u64::MAX, |x| x.sb);
            if r.what == RESET {
                stats.resets += 1;
                self.reset(r);
                continue;
            }
            stats.checks += 1;
            stats.multi += u64::from(r.multi);
            stats.shadow += u64::from(usize::from(r.key) >= crate::workload::KEYS);
            let ambiguous = around[i].reset;
            let epoch = self.resets + reset_sa.partition_point(|&sa| sa < r.sb) as u32;
            let cost = u64::from(r.cost);
            // Whether a check that rolls back and was refused (here or by another key) may
            // have committed here first: only if some view of it had room, which needs room
            // with the units certainly counted by then (each of its views saw them all).
            let mut had_room = true;
            match r.what {
                ADMITTED => {
                    stats.admitted_units += cost;
                    if ambiguous {
                        stats.skipped += 1;
                    } else {
                        self.admission(kind, key, r, min_b[i], &movers, stats);
                    }
                    let epoch = if ambiguous { AMBIGUOUS } else { epoch };
                    hist.push(Hist { b: r.b, a: r.a, cost, epoch, configs: r.configs(), multi: r.multi });
                }
                REFUSED => {
                    stats.refusals += 1;
                    if ambiguous {
                        stats.skipped += 1;
                    } else {
                        had_room = self.refusal(kind, key, recs, i, &around, &movers, held, stats) <= r.a;
                    }
                }
                NOTHING => {
                    stats.nothing += 1;
                    had_room = ambiguous || self.lower(kind, r) <= r.a;
                }
                _ => {
                    stats.other += 1;
                    stats.example(|| format!("{}: key {key}: unexpected decision {r:?}", kind.name));
                }
            }
            if Track::commits(kind, r) && had_room {
                let rolls = Track::rolls(kind, r);
                movers.push(Mover { sb: r.sb, sa: r.sa, rolls });
                let x = Adm::of(r, r.admitted() && !ambiguous, rolls, around[i].committing);
                if x.matters(kind, next) {
                    self.recent.push(x);
                    self.version += 1;
                }
                self.forget(kind, min_b[i + 1], next);
            }
        }
        self.resets += reset_sa.len() as u32;
        for p in self.pending.iter_mut().filter(|p| p.fresh) {
            p.explained |= movers.iter().any(|m| m.explains(kind, p));
            p.fresh = false;
        }
        self.pending.retain(|p| p.named > floor);
        self.forget(kind, floor, u64::MAX);
    }

    /// A reset `r`, reached in sequence order: what follows is certainly after it or
    /// overlaps it (and is then not analysed), so nothing certainly before it counts.
    fn reset(&mut self, r: &Rec) {
        self.recent.retain(|x| x.sa > r.sb);
        for x in &mut self.recent {
            x.sure = false;
        }
        self.tat0.iter_mut().for_each(|t| *t = (0, 0));
        self.pending.clear();
        self.version += 1;
    }

    fn admission(
        &mut self,
        kind: &Kind,
        key: usize,
        r: &Rec,
        min_b: u64,
        movers: &[Mover],
        stats: &mut Stats,
    ) {
        let cost = u64::from(r.cost);
        stats.replayed += 1;
        let lo = self.lower(kind, r);
        if lo > r.a {
            stats.no_room += 1;
            stats.example(|| {
                format!(
                    "{}: key {key}: admission of {cost} at [{}, {}] (seq {}..{}) with no room before {lo}; \
                 recent {:?}",
                    kind.name, r.b, r.a, r.sb, r.sa, self.recent
                )
            });
        }
        // Refusals this admission contradicts; and those no later admission can (every
        // later check read the clock at or after `min_b`).
        let mut early = Vec::new();
        self.pending.retain(|p| {
            if p.sa < r.sb && cost >= p.cost && r.a < p.named {
                early.push(*p);
                return false;
            }
            p.named > min_b
        });
        let configs = r.configs();
        for p in early {
            let larger = kind.specs.iter().any(|s| s.max_hi(configs) > s.max_lo(p.configs));
            let raced = p.fresh && movers.iter().any(|m| m.explains(kind, &p));
            if p.explained || raced || larger {
                stats.early_explained += 1;
                stats.early_larger += u64::from(!p.explained && !raced);
                continue;
            }
            stats.early += 1;
            stats.example(|| {
                format!(
                "{}: key {key}: admission of {cost} at [{}, {}] (seq {}) before the time a refusal of {} \
                 named ({}, seq ..{})",
                kind.name, r.b, r.a, r.sb, p.cost, p.named, p.sa
            )
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn refusal(
        &mut self,
        kind: &Kind,
        key: usize,
        recs: &[Rec],
        i: usize,
        around: &[Around],
        movers: &[Mover],
        held: &[u64],
        stats: &mut Stats,
    ) -> u64 {
        let r = &recs[i];
        // Checks after this one in sequence order that may still have come before it.
        let ahead: Vec<Adm> = recs[i + 1..]
            .iter()
            .zip(&around[i + 1..])
            .take_while(|(x, _)| x.sb < r.sa)
            .filter(|(x, _)| Track::commits(kind, x))
            .map(|(x, near)| Adm::of(x, false, Track::rolls(kind, x), near.committing))
            .collect();
        let lo = self.lower(kind, r);
        // Its own earlier attempts (it rolls back, and may have started over after a
        // rollback that left its units counted) may be in its last view too.
        let own = Adm::of(r, false, Track::rolls(kind, r), around[i].committing);
        let hi = self.upper(kind, r, &ahead, &own, r.a);
        let room = hi <= r.a && {
            // Every time the decision may have been taken at: each clock value the bracket
            // held (the check read one of them), and each slot start inside it (a sliding
            // window's view adopts the later slot of a racing check, at its start). A
            // bracket that held very many is left undecided.
            let from = held.partition_point(|&t| t <= r.b);
            let mut times: Vec<u64> = held[from..].iter().take_while(|&&t| t < r.a).copied().collect();
            if matches!(kind.model, Model::Strict | Model::Interpolated) {
                for spec in &kind.specs {
                    let p = spec.precision;
                    times.extend((r.b / p + 1..=r.a / p).take(256).map(|k| k * p));
                }
            }
            times.len() < 256
                && std::iter::once(r.b).chain(times).all(|t| self.upper(kind, r, &ahead, &own, t) <= t)
        };
        // A racing check that may have moved the key on: one read already, or one ahead that
        // may commit.
        let stale = kind.algorithm == Algorithm::SlidingWindow
            && (movers.iter().any(|m| m.sa > r.sb) || !ahead.is_empty());
        let describe = |what: &str, named: u64| {
            // Every check of the key that overlapped it, as logged.
            let near: Vec<String> = recs
                .iter()
                .filter(|x| x.sb < r.sa && r.sb < x.sa)
                .map(|x| {
                    format!("{}{} {} [{}, {}] seq {}..{}", kinds_of(x), x.cost, x.what, x.b, x.a, x.sb, x.sa)
                })
                .collect();
            format!(
                "{}: key {key}: refusal of {} at [{}, {}] (seq {}..{}) named {named}: {what} (fits from {lo} at \
                 the earliest, {hi} at the latest); recent {:?}, GCRA's arrival times before them {:?}; \
                 overlapping (cost, what: 0 admitted, 1 refused, 2 refused by another key, 3 reset): {}",
                kind.name,
                r.cost,
                r.b,
                r.a,
                r.sb,
                r.sa,
                self.recent,
                self.tat0,
                near.join("; ")
            )
        };
        if room {
            stats.room += 1;
            stats.example(|| describe("refused with room", r.b.saturating_add(r.retry)));
        }
        // A shadow key's refusal carries no `retry_after`.
        if r.retry == NO_RETRY {
            return lo;
        }
        let (named_lo, named_hi) = (r.b + r.retry, r.a + r.retry);
        stats.analysed += 1;
        stats.exact += u64::from(r.b == r.a && lo == hi);
        if lo > named_hi {
            stats.short += 1;
            stats.short_max = stats.short_max.max(lo - named_hi);
            stats.example(|| describe("earlier than the log allows", named_lo));
        }
        if !room && named_lo > hi {
            if stale && named_lo - hi <= kind.span() {
                stats.long_explained += 1;
            } else {
                stats.long += 1;
                stats.long_max = stats.long_max.max(named_lo - hi);
                stats.example(|| describe("later than the log allows", named_lo));
            }
        }
        self.pending.push(Pending {
            sb: r.sb,
            sa: r.sa,
            cost: u64::from(r.cost),
            named: named_lo,
            configs: r.configs(),
            explained: stale,
            fresh: true,
        });
        lo
    }

    fn cached(&mut self, key: CacheKey, compute: impl FnOnce(&Track) -> u64) -> u64 {
        if let Some(&(_, found)) = self.cache.iter().find(|(k, _)| *k == key) {
            return found;
        }
        let found = compute(self);
        if self.cache.len() >= 4 {
            self.cache.remove(0);
        }
        self.cache.push((key, found));
        found
    }

    /// The earliest time `r`'s request can have fitted: units certainly counted, placed as
    /// early as they can be, and the largest `max` that may have decided it.
    fn lower(&mut self, kind: &Kind, r: &Rec) -> u64 {
        let certain = |x: &&Adm| x.sure && x.admitted > 0 && x.sa < r.sb;
        let n = self.recent.iter().filter(certain).count();
        let (cost, configs) = (u64::from(r.cost), r.configs());
        let key = CacheKey {
            upper: false,
            version: self.version,
            n,
            at: r.b,
            cost,
            configs,
            ahead: (0, 0),
            own: 0,
        };
        self.cached(key, |t| {
            let sure = t.recent.iter().filter(certain);
            kind.specs
                .iter()
                .enumerate()
                .map(|(l, spec)| {
                    let max = spec.max_hi(configs);
                    if kind.model == Model::Gcra {
                        let units: Vec<Unit> = sure.clone().map(|x| unit(x, x.admitted)).collect();
                        let tat = gcra_lower(spec.interval(), t.tat0[l].0, &units);
                        gcra_fits_from(spec, tat, r.b, cost)
                    } else {
                        let units: Vec<(u64, u64)> = sure.clone().map(|x| (x.b, x.admitted)).collect();
                        earliest(kind.model, spec, max, &units, r.b, cost)
                    }
                })
                .max()
                .unwrap_or(r.b)
        })
    }

    /// The latest time at or after `at` from which `r`'s request certainly fits, for a
    /// decision at `at`: every unit possibly counted, placed as late as it can be, and the
    /// smallest `max` that may have decided it. `at` itself when it fits at `at`.
    ///
    /// A window model places each unit at most at `at`: a unit stamped later than the
    /// check's clock lies in a slot (or window) the check's view adopts, and the check
    /// then decides at that slot's start, which `refusal` tries as `at` too. GCRA adopts
    /// nothing: a check whose clock reading is older than units it sees computes the lag
    /// from its own reading, so they are placed at most at the bracket's end whatever `at`.
    fn upper(&mut self, kind: &Kind, r: &Rec, ahead: &[Adm], own: &Adm, at: u64) -> u64 {
        let (cost, configs) = (u64::from(r.cost), r.configs());
        let n = self.recent.iter().filter(|x| x.rolls && x.sa > r.sb).count();
        let compute = |t: &Track| {
            let maybe = t.recent.iter().chain(ahead);
            kind.specs
                .iter()
                .enumerate()
                .map(|(l, spec)| {
                    let max = spec.max_lo(configs);
                    let left = (own, own.left_behind(kind, l));
                    let units = maybe
                        .clone()
                        .map(|x| (x, x.maybe(kind, l, r.sb)))
                        .chain(std::iter::once(left))
                        .filter(|&(_, u)| u > 0);
                    if kind.model == Model::Gcra {
                        let units: Vec<Unit> = units.map(|(x, u)| unit(x, u)).collect();
                        let tat = gcra_upper(spec.interval(), t.tat0[l].1, &units, r.a);
                        gcra_fits_from(spec, tat, at, cost)
                    } else {
                        let units: Vec<(u64, u64)> = units.map(|(x, u)| (x.a.min(at), u)).collect();
                        earliest(kind.model, spec, max, &units, at, cost)
                    }
                })
                .max()
                .unwrap_or(at)
        };
        // `ahead` is every check that may commit with a sequence number between its first
        // and its last: those two name it.
        let ahead_is = ahead.first().zip(ahead.last()).map_or((0, 0), |(f, l)| (f.sb, l.sb));
        let own = (0..2).map(|l| if l < kind.specs.len() { own.left_behind(kind, l) } else { 0 });
        let own = own.fold(0, |sum, units| (sum << 32) | units);
        let key = CacheKey { upper: true, version: self.version, n, at, cost, configs, ahead: ahead_is, own };
        self.cached(key, compute)
    }

    /// Forgets what can no longer matter: records older than the horizon before `floor`
    /// (no later check reads the clock before `floor`), and for GCRA, folds the oldest
    /// into `tat0` once they are certainly before everything after them (`next`: the next
    /// record's sequence number).
    fn forget(&mut self, kind: &Kind, floor: u64, next: u64) {
        if kind.model == Model::Gcra {
            // The longest prefix whose every record is certainly before everything after
            // it (the records are in `sb` order, so "after it" starts at the first one
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
            for (l, (spec, tat0)) in kind.specs.iter().zip(self.tat0.iter_mut()).enumerate() {
                let sure: Vec<Unit> =
                    folded.iter().filter(|x| x.sure && x.admitted > 0).map(|x| unit(x, x.admitted)).collect();
                // Certainly before every later record: no transient units any more.
                let maybe: Vec<Unit> = folded
                    .iter()
                    .map(|x| unit(x, x.maybe(kind, l, u64::MAX)))
                    .filter(|u| u.units > 0)
                    .collect();
                *tat0 = (
                    gcra_lower(spec.interval(), tat0.0, &sure),
                    gcra_upper(spec.interval(), tat0.1, &maybe, u64::MAX),
                );
            }
            self.version += 1;
        } else if self.recent.len() > 8 {
            let cut = floor.saturating_sub(kind.horizon());
            let before = self.recent.len();
            self.recent.retain(|x| x.a >= cut && x.matters(kind, next));
            if self.recent.len() != before {
                self.version += 1;
            }
        }
    }
}

/// `check_all` records are marked `*`.
fn kinds_of(r: &Rec) -> &'static str {
    if r.multi {
        "*"
    } else {
        ""
    }
}
