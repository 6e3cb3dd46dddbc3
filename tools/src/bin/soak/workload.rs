//! What the soak runs: the limiters (one per kind of limit), the numbers the checker models
//! them with, and the operations the workers make and log.
//!
//! Every limiter holds two policies: `default` (keys `0..KEYS`) and `shadow` (keys
//! `KEYS..ALL_KEYS`, chosen by the resolver), which runs the same limits in shadow mode. The
//! default policy of a kind with `updates` alternates, by `update_policy` while the workers
//! check, between two configurations that differ in `max` alone (`Spec::max[0]`, then
//! `Spec::max[1]`, then back): counts carry over exactly, and each check decides by the
//! version it read. GCRA carries a change of `max` over as units rounded up (a different
//! arrival time), which this checker does not model: its kinds keep one configuration.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use slidegate::{Algorithm, ConfigError, Decision, Denial, Limit, Limiter, ManualClock, PolicyConfig};
use slidegate_tools::rng::Rng;

pub const MS: u64 = 1_000_000;
/// Keys of the default policy: `0..KEYS`.
pub const KEYS: usize = 200;
/// Keys of the shadow policy: `KEYS..ALL_KEYS`.
pub const SHADOW_KEYS: usize = 8;
pub const ALL_KEYS: usize = KEYS + SHADOW_KEYS;
/// The most slots per window the checker's window models take.
pub const MAX_SLOTS: usize = 30;

/// One limit, as the checker models it; the limiter is built from these numbers. `max[c]`
/// is its `max` under configuration `c` of the default policy (the shadow policy keeps
/// `max[0]`).
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub max: [u64; 2],
    pub window: u64,
    pub precision: u64,
    pub strict: bool,
}

impl Spec {
    const fn new(max: u64, window_ms: u64, precision_ms: u64, strict: bool) -> Spec {
        Spec { max: [max; 2], window: window_ms * MS, precision: precision_ms * MS, strict }
    }

    /// The same limit, with `max` alternating with `other`.
    const fn or(self, other: u64) -> Spec {
        Spec { max: [self.max[0], other], ..self }
    }

    fn limit(&self, config: usize) -> Limit {
        let limit = Limit::new(self.max[config], Duration::from_nanos(self.window))
            .precision(Duration::from_nanos(self.precision));
        if self.strict {
            limit.strict()
        } else {
            limit
        }
    }

    /// Slots per window.
    pub fn slots(&self) -> u64 {
        self.window / self.precision
    }

    /// The largest `max` among the configurations in `configs` (a [`Rec::configs`] mask).
    pub fn max_hi(&self, configs: u8) -> u64 {
        (0..2).filter(|c| configs & (1 << c) != 0).map(|c| self.max[c]).max().unwrap_or(self.max[0])
    }

    /// The smallest.
    pub fn max_lo(&self, configs: u8) -> u64 {
        (0..2).filter(|c| configs & (1 << c) != 0).map(|c| self.max[c]).min().unwrap_or(self.max[0])
    }

    /// GCRA: ns between two units at the sustained rate (rounded up, as the library does),
    /// and the burst. GCRA kinds keep one configuration.
    pub fn interval(&self) -> u64 {
        self.window.div_ceil(self.max[0])
    }

    pub fn burst(&self) -> u64 {
        self.max[0] * self.interval()
    }

    pub fn describe(&self) -> String {
        let max = if self.max[0] == self.max[1] {
            self.max[0].to_string()
        } else {
            format!("{}↔{}", self.max[0], self.max[1])
        };
        let ms = |ns: u64| ns / MS;
        let strict = if self.strict { " strict" } else { "" };
        format!("{max}/{}ms@{}ms{strict}", ms(self.window), ms(self.precision))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Interpolated,
    Strict,
    Fixed,
    Log,
    Gcra,
}

pub struct Kind {
    pub name: &'static str,
    pub algorithm: Algorithm,
    pub model: Model,
    pub specs: Vec<Spec>,
    /// The default policy's `max` alternates (`update_policy` racing the checks).
    pub updates: bool,
}

impl Kind {
    /// Admissions older than this before a check can no longer change its decision.
    pub fn horizon(&self) -> u64 {
        self.specs.iter().map(|s| s.window + s.precision.max(s.window)).max().unwrap_or(0)
    }

    /// The longest window.
    pub fn span(&self) -> u64 {
        self.specs.iter().map(|s| s.window).max().unwrap_or(0)
    }

    pub fn bound(&self) -> &'static str {
        match self.model {
            Model::Interpolated => "≤ max per n aligned slots, < 2 × max per window",
            Model::Strict | Model::Log => "≤ max per window",
            Model::Fixed => "≤ max per aligned window",
            Model::Gcra => "≤ max + ⌊d/T⌋ per interval d",
        }
    }

    pub fn config(&self, config: usize) -> PolicyConfig {
        PolicyConfig::new(self.specs.iter().map(|s| s.limit(config)))
    }

    pub fn limiter(&self, clock: &ManualClock) -> Result<Limiter<u32>, ConfigError> {
        Limiter::<u32>::builder()
            .algorithm(self.algorithm)
            .clock(clock.clone())
            .policy("default", self.config(0))
            .policy("shadow", self.config(0).shadow(true))
            .resolver(|key: &u32| (*key as usize >= KEYS).then_some("shadow"))
            .build()
    }
}

pub fn kinds() -> Vec<Kind> {
    use Algorithm::*;
    let kind = |name, algorithm, model, specs: Vec<Spec>| {
        let updates = specs.iter().any(|s| s.max[0] != s.max[1]);
        Kind { name, algorithm, model, specs, updates }
    };
    vec![
        kind(
            "sliding window, interpolated",
            SlidingWindow,
            Model::Interpolated,
            vec![Spec::new(24, 600, 100, false).or(30)],
        ),
        kind(
            "sliding window, strict",
            SlidingWindow,
            Model::Strict,
            vec![Spec::new(20, 500, 100, true).or(16)],
        ),
        kind(
            "two strict limits",
            SlidingWindow,
            Model::Strict,
            vec![Spec::new(8, 200, 50, true).or(10), Spec::new(24, 1_000, 100, true).or(20)],
        ),
        kind("fixed window", FixedWindow, Model::Fixed, vec![Spec::new(20, 250, 250, false).or(25)]),
        kind("sliding log", SlidingLog, Model::Log, vec![Spec::new(20, 300, 50, false).or(16)]),
        kind("GCRA", Gcra, Model::Gcra, vec![Spec::new(20, 400, 50, false)]),
        kind(
            "GCRA, two limits",
            Gcra,
            Model::Gcra,
            vec![Spec::new(8, 200, 50, false), Spec::new(30, 1_000, 100, false)],
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// The log.

/// One operation on one key: clock (ns) and the key's sequence number before and after,
/// the limiter's policy counter before and after, `retry_after` (ns) of a refusal, the
/// key, the cost, and what it did to this key.
#[derive(Debug, Clone, Copy)]
pub struct Rec {
    pub b: u64,
    pub a: u64,
    pub sb: u64,
    pub sa: u64,
    pub retry: u64,
    pub vb: u32,
    pub va: u32,
    pub key: u16,
    pub cost: u8,
    pub what: u8,
    /// Part of a `check_all` (several keys): it may commit here and roll back.
    pub multi: bool,
}

/// Admitted and counted in this key.
pub const ADMITTED: u8 = 0;
/// Refused by this key (a shadow key's refusal too: it counts nothing).
pub const REFUSED: u8 = 1;
/// A `check_all` refused by another key: nothing counted here.
pub const NOTHING: u8 = 2;
/// `reset` of the key.
pub const RESET: u8 = 3;
/// Anything else (a cost too large, a full table): never expected here.
pub const OTHER: u8 = 4;
/// `retry`, when the refusal carries none (a shadow key's).
pub const NO_RETRY: u64 = u64::MAX;

impl Rec {
    /// The configurations of the default policy that may have decided this check, as a
    /// mask (bit `c`: configuration `c`). The updater raises the limiter's counter to odd
    /// before `update_policy` and to even after (SeqCst both, as the loads around each
    /// check): a check that loaded `2k` or `2k + 1` before started after update `k` was
    /// published, so it decides by version `k` or later, and one that loaded `v` after
    /// cannot have seen a version whose update began (raised the counter) after that
    /// load. Version `k` runs configuration `k % 2`.
    pub fn configs(&self) -> u8 {
        if usize::from(self.key) >= KEYS {
            return 1;
        }
        let (from, to) = (self.vb / 2, self.va.div_ceil(2));
        if to > from {
            3
        } else {
            1 << (from % 2)
        }
    }

    pub fn admitted(&self) -> bool {
        self.what == ADMITTED
    }

    /// May have committed units into the key (admitted, or a `check_all` that may have
    /// committed here before another key refused it), or been counted here by a kind of
    /// several limits that rolls back.
    pub fn commits(&self, several_limits: bool) -> bool {
        self.what == ADMITTED || (self.multi || several_limits) && matches!(self.what, REFUSED | NOTHING)
    }
}

/// A key's sequence counter, alone on its cache lines.
#[repr(align(128))]
#[derive(Default)]
pub struct Seq(pub AtomicU64);

pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A key: `⌊n × u⁴⌋` for a uniform `u`, so key 0 gets (1/n)^¼ of the draws (27 % for 200
/// keys), the ten hottest about half, key 100 about 0.2 %, key 199 about 0.1 %.
pub fn skewed(rng: &mut Rng, n: usize) -> usize {
    ((n as f64 * rng.unit().powi(4)) as usize).min(n - 1)
}

/// What a decision did to one key: its `what`, and a refusal's `retry_after` (ns).
fn outcome(d: &Decision) -> (u8, u64) {
    let retry = d.retry_after().map_or(NO_RETRY, ns);
    if d.is_allowed() {
        return match d.shadow_denial() {
            None => (ADMITTED, 0),
            Some(Denial::Limit(_)) => (REFUSED, retry),
            Some(_) => (OTHER, 0),
        };
    }
    match d.denial() {
        Some(Denial::Limit(_)) => (REFUSED, retry),
        _ => (OTHER, 0),
    }
}

/// One limiter as the workers see it.
pub struct Target<'a> {
    pub limiter: &'a Limiter<u32>,
    pub seqs: &'a [Seq],
    /// The policy counter (see [`Rec::configs`]).
    pub version: &'a AtomicU64,
    pub clock: &'a ManualClock,
}

/// Operations per 100,000: resets and `check_all`s; the rest are `check_n`.
const RESETS: u64 = 3;
const CHECK_ALLS: u64 = 12_000;
/// Of the `check_n`s, one in this many is on a shadow key.
const SHADOW_ONE_IN: u64 = 30;

impl Target<'_> {
    /// One random operation, logged into `log`; returns how many keys it checked.
    pub fn step(&self, rng: &mut Rng, log: &mut Vec<Rec>) {
        let roll = rng.below(100_000);
        let cost = rng.below(3) + 1;
        if roll < RESETS {
            let key = skewed(rng, KEYS);
            let seq = &self.seqs[key].0;
            let sb = seq.fetch_add(1, Ordering::SeqCst);
            let b = ns(self.clock.now());
            self.limiter.reset(&(key as u32));
            let a = ns(self.clock.now());
            let sa = seq.fetch_add(1, Ordering::SeqCst);
            log.push(Rec {
                b,
                a,
                sb,
                sa,
                retry: 0,
                vb: 0,
                va: 0,
                key: key as u16,
                cost: 0,
                what: RESET,
                multi: false,
            });
        } else if roll < RESETS + CHECK_ALLS {
            self.check_all(rng, cost, log);
        } else {
            let key = if rng.below(SHADOW_ONE_IN) == 0 {
                KEYS + skewed(rng, SHADOW_KEYS)
            } else {
                skewed(rng, KEYS)
            };
            let seq = &self.seqs[key].0;
            let sb = seq.fetch_add(1, Ordering::SeqCst);
            let vb = self.version.load(Ordering::SeqCst) as u32;
            let b = ns(self.clock.now());
            let d = self.limiter.check_n(&(key as u32), cost);
            let a = ns(self.clock.now());
            let va = self.version.load(Ordering::SeqCst) as u32;
            let sa = seq.fetch_add(1, Ordering::SeqCst);
            let (what, retry) = outcome(&d);
            let key = key as u16;
            log.push(Rec { b, a, sb, sa, retry, vb, va, key, cost: cost as u8, what, multi: false });
        }
    }

    /// `check_all` on two or three distinct keys of the default policy, and one time in
    /// three a shadow key last: one record per key.
    fn check_all(&self, rng: &mut Rng, cost: u64, log: &mut Vec<Rec>) {
        let mut keys = [0usize; 4];
        let mut n = 2 + rng.below(2) as usize;
        let mut i = 0;
        while i < n {
            let key = skewed(rng, KEYS);
            if !keys[..i].contains(&key) {
                keys[i] = key;
                i += 1;
            }
        }
        let shadow = rng.below(3) == 0;
        if shadow {
            keys[n] = KEYS + skewed(rng, SHADOW_KEYS);
            n += 1;
        }
        let keys = &keys[..n];
        let mut sb = [0u64; 4];
        for (s, &key) in sb.iter_mut().zip(keys) {
            *s = self.seqs[key].0.fetch_add(1, Ordering::SeqCst);
        }
        let vb = self.version.load(Ordering::SeqCst) as u32;
        let b = ns(self.clock.now());
        let ids: Vec<u32> = keys.iter().map(|&k| k as u32).collect();
        let refs: Vec<&u32> = ids.iter().collect();
        let result = self.limiter.check_all(&refs, cost);
        let a = ns(self.clock.now());
        let va = self.version.load(Ordering::SeqCst) as u32;
        for (i, &key) in keys.iter().enumerate() {
            let sa = self.seqs[key].0.fetch_add(1, Ordering::SeqCst);
            let (what, retry) = match &result {
                Err(_) => (OTHER, 0),
                Ok(d) if !d.is_allowed() => match outcome(d) {
                    (REFUSED, retry) if d.key() == i => (REFUSED, retry),
                    (REFUSED, _) => (NOTHING, 0),
                    other => other,
                },
                // Admitted: every enforced key counted it; the shadow key (last) counted it
                // unless it is the key of the decision's shadow denial.
                Ok(d) => match outcome(d) {
                    (REFUSED, retry) if shadow && i == n - 1 && d.key() == i => (REFUSED, retry),
                    (REFUSED, _) => (ADMITTED, 0),
                    other => other,
                },
            };
            let rec = Rec {
                b,
                a,
                sb: sb[i],
                sa,
                retry,
                vb,
                va,
                key: key as u16,
                cost: cost as u8,
                what,
                multi: true,
            };
            log.push(rec);
        }
    }
}
