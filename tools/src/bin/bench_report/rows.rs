//! The rows of the table against governor: the contenders each row runs on (built and
//! filled once, before the rounds) and, per row, the pass it times on either side.

use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use slidegate::Algorithm;
use slidegate_tools::workloads::{
    self, three_limits, AgedKey, Contender, Governor, GovernorThree, Keys, Pass, Policy, Slidegate, Visits,
    FEW_KEYS, HISTORY_AGE, HOT_KEY, MANY_KEYS, VISIT_SEED,
};

/// Which contender a pass runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Slidegate,
    Governor,
}

impl Side {
    pub fn index(self) -> usize {
        match self {
            Side::Slidegate => 0,
            Side::Governor => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Side::Slidegate => "slidegate",
            Side::Governor => "governor",
        }
    }
}

/// What every check of a row's pass must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Admitted,
    Refused,
    /// A mix that depends on timing (the three-limit policy).
    Either,
}

impl Expect {
    pub fn holds(self, pass: &Pass) -> bool {
        match self {
            Expect::Admitted => pass.all_admitted(),
            Expect::Refused => pass.all_refused(),
            Expect::Either => true,
        }
    }
}

/// When a row runs within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// First: the rows with short passes, while the round's aged keys age.
    Short,
    /// The refusals against history in older slots: before the first row that would take
    /// their admissions past [`workloads::HISTORY_AGE`], waiting for that age.
    History,
    /// Last: the 1 M-key rows, whose passes are long.
    Long,
}

/// One scenario: slidegate's contender `S` and governor's `G`, and the visit cursor of
/// each side (both start from the same seed: both see the same keys in the same order).
struct Both<S, G> {
    ours: S,
    theirs: G,
    visits: [Visits; 2],
}

impl<S: Contender, G: Contender> Both<S, G> {
    /// The two contenders, with `keys` inserted into both in the order `workloads::shuffled`
    /// gives (`0` keys: nothing inserted); visits draw from the same `0..keys`.
    fn new(ours: S, theirs: G, keys: u64) -> Result<Both<S, G>, String> {
        let order = workloads::shuffled(0, keys);
        for (side, admitted) in [
            (Side::Slidegate, workloads::prefill(&ours, &order)),
            (Side::Governor, workloads::prefill(&theirs, &order)),
        ] {
            if admitted != keys {
                return Err(format!(
                    "{} admitted {admitted} of the {keys} first checks of new keys",
                    side.name()
                ));
            }
        }
        let visits = Visits::new(VISIT_SEED, 0, keys.max(1));
        Ok(Both { ours, theirs, visits: [visits.clone(), visits] })
    }

    fn hot(&self, side: Side, key: u64, iters: u64) -> Pass {
        match side {
            Side::Slidegate => workloads::hot(&self.ours, key, iters),
            Side::Governor => workloads::hot(&self.theirs, key, iters),
        }
    }

    fn random(&mut self, side: Side, iters: u64) -> Pass {
        let visits = &mut self.visits[side.index()];
        match side {
            Side::Slidegate => workloads::random(&self.ours, visits, iters),
            Side::Governor => workloads::random(&self.theirs, visits, iters),
        }
    }

    /// [`Both::random`], one check at a time (`workloads::random_one_at_a_time`).
    fn one_at_a_time(&mut self, side: Side, iters: u64) -> Pass {
        let visits = &mut self.visits[side.index()];
        match side {
            Side::Slidegate => workloads::random_one_at_a_time(&self.ours, visits, iters),
            Side::Governor => workloads::random_one_at_a_time(&self.theirs, visits, iters),
        }
    }
}

impl<S: Contender, G: Contender> Both<Arc<S>, Arc<G>> {
    fn two_threads(&self, side: Side, iters: u64, keys: impl Fn(usize) -> Keys) -> Pass {
        match side {
            Side::Slidegate => workloads::two_threads(&self.ours, iters, keys),
            Side::Governor => workloads::two_threads(&self.theirs, iters, keys),
        }
    }
}

/// Every contender of the table, filled and ready.
pub struct Bench {
    hot: Both<Slidegate, Governor>,
    /// `per_minute(1)`: refusals against history in older slots.
    older: Both<Slidegate, Governor>,
    /// Per side, the key admitted at the start of the round.
    aged: [AgedKey; 2],
    /// `per_minute(1)`: refusals against an admission just made.
    current: Both<Slidegate, Governor>,
    /// Per side, the next key never checked.
    fresh: [u64; 2],
    few: Both<Slidegate, Governor>,
    per_second: Both<Slidegate, Governor>,
    per_minute: Both<Slidegate, Governor>,
    frozen: Both<Slidegate, Governor<FakeRelativeClock>>,
    steady: Steady,
    gcra_hot: Both<Slidegate, Governor>,
    gcra_many: Both<Slidegate, Governor>,
    three: Both<Slidegate, GovernorThree>,
    two_hot: Both<Arc<Slidegate>, Arc<Governor>>,
    two_disjoint: Both<Arc<Slidegate>, Arc<Governor>>,
    /// The age of the refused-for admission at the start of each timed older-slot pass.
    pub ages: Vec<Duration>,
}

/// How far the steady row's clocks move before each pass: every key checked about every 3 s
/// has units in a slot leaving its 60-slot window at each check.
pub const STEADY_STEP: Duration = Duration::from_secs(3);
/// Steps of [`STEADY_STEP`] with every key checked, before the steady row's first pass: 63 s,
/// past the window.
pub const STEADY_WARM_STEPS: u32 = 21;

/// `per_minute(60_000)` on clocks the benchmark moves: slidegate's `ManualClock`, governor's
/// `FakeRelativeClock`, each moved by [`STEADY_STEP`] before its side's pass.
struct Steady {
    both: Both<Slidegate, Governor<FakeRelativeClock>>,
    clocks: (slidegate::ManualClock, FakeRelativeClock),
}

impl Steady {
    /// The keys inserted, then a minute of traffic: [`STEADY_WARM_STEPS`] times, the clocks
    /// moved on and every key checked once, in insertion order.
    fn new() -> Result<Steady, String> {
        let clocks = (slidegate::ManualClock::new(), FakeRelativeClock::default());
        let limit = [Policy::PerMinute.limit()];
        let both = Both::new(
            Slidegate::manual(&limit, Algorithm::SlidingWindow, clocks.0.clone()),
            Governor::manual(Policy::PerMinute, clocks.1.clone()),
            MANY_KEYS,
        )?;
        let order = workloads::shuffled(0, MANY_KEYS);
        for _ in 0..STEADY_WARM_STEPS {
            clocks.0.advance(STEADY_STEP);
            clocks.1.advance(STEADY_STEP);
            if workloads::prefill(&both.ours, &order) + workloads::prefill(&both.theirs, &order)
                != 2 * MANY_KEYS
            {
                return Err("a check in the steady row's minute of traffic was refused".into());
            }
        }
        Ok(Steady { both, clocks })
    }

    fn random(&mut self, side: Side, iters: u64) -> Pass {
        match side {
            Side::Slidegate => self.clocks.0.advance(STEADY_STEP),
            Side::Governor => self.clocks.1.advance(STEADY_STEP),
        }
        self.both.random(side, iters)
    }
}

fn sliding(policy: Policy) -> Slidegate {
    Slidegate::sliding(policy)
}

fn gcra(policy: Policy) -> Slidegate {
    Slidegate::new(&[policy.limit()], Algorithm::Gcra)
}

/// Keys of thread `t`'s set in the disjoint-keys rows: `t·FEW_KEYS..(t + 1)·FEW_KEYS`.
pub fn disjoint_set(t: usize) -> u64 {
    t as u64 * FEW_KEYS
}

/// Thread `t`'s visits of its own set.
pub fn disjoint_visits(t: usize) -> Keys {
    Keys::Random(Visits::new(VISIT_SEED + t as u64, disjoint_set(t), FEW_KEYS))
}

impl Bench {
    pub fn new() -> Result<Bench, String> {
        let arc = |both: Both<Slidegate, Governor>| Both {
            ours: Arc::new(both.ours),
            theirs: Arc::new(both.theirs),
            visits: both.visits,
        };
        let two_disjoint = {
            let (ours, theirs) = (sliding(Policy::HotSecond), Governor::new(Policy::HotSecond));
            // Set by set, each set in its own random order.
            for t in 0..2 {
                let order = workloads::shuffled(disjoint_set(t), FEW_KEYS);
                if workloads::prefill(&ours, &order) + workloads::prefill(&theirs, &order) != 2 * FEW_KEYS {
                    return Err("a first check of a new key was refused".into());
                }
            }
            Both { ours: Arc::new(ours), theirs: Arc::new(theirs), visits: unvisited() }
        };
        let one = |policy| Both::new(sliding(policy), Governor::new(policy), 0);
        Ok(Bench {
            hot: one(Policy::HotMinute)?,
            older: one(Policy::OnePerMinute)?,
            aged: [AgedKey::new(1 << 40), AgedKey::new(1 << 40)],
            current: one(Policy::OnePerMinute)?,
            fresh: [1 << 41, 1 << 41],
            few: Both::new(sliding(Policy::HotSecond), Governor::new(Policy::HotSecond), FEW_KEYS)?,
            per_second: Both::new(sliding(Policy::PerSecond), Governor::new(Policy::PerSecond), MANY_KEYS)?,
            per_minute: Both::new(sliding(Policy::PerMinute), Governor::new(Policy::PerMinute), MANY_KEYS)?,
            frozen: Both::new(
                Slidegate::frozen(&[Policy::PerMinute.limit()], Algorithm::SlidingWindow),
                Governor::frozen(Policy::PerMinute),
                MANY_KEYS,
            )?,
            steady: Steady::new()?,
            gcra_hot: Both::new(gcra(Policy::HotMinute), Governor::new(Policy::HotMinute), 0)?,
            gcra_many: Both::new(gcra(Policy::PerMinute), Governor::new(Policy::PerMinute), MANY_KEYS)?,
            three: Both::new(
                Slidegate::new(&three_limits(), Algorithm::SlidingWindow),
                GovernorThree::new(),
                MANY_KEYS,
            )?,
            two_hot: arc(one(Policy::HotMinute)?),
            two_disjoint,
            ages: Vec::new(),
        })
    }

    /// At the start of a round: a new `per_minute(1)` key admitted on each side, whose
    /// refusals the older-slot row times once it is `HISTORY_AGE` old.
    pub fn start_round(&mut self) {
        self.aged[0].renew(&self.older.ours);
        self.aged[1].renew(&self.older.theirs);
    }

    /// One side's aged key will be `HISTORY_AGE` old within `within`.
    pub fn history_due_within(&self, within: Duration) -> bool {
        self.aged.iter().any(|a| a.current().is_none_or(|(_, age)| age + within >= HISTORY_AGE))
    }
}

/// Visit cursors for a scenario that draws its keys elsewhere.
fn unvisited() -> [Visits; 2] {
    let none = Visits::new(VISIT_SEED, 0, 1);
    [none.clone(), none]
}

/// slidegate's contender of each row, for its state per key (`Limiter::state_bytes_per_key`).
pub mod ours {
    use super::{Bench, Slidegate};

    pub fn hot(b: &Bench) -> &Slidegate {
        &b.hot.ours
    }
    pub fn refusals(b: &Bench) -> &Slidegate {
        &b.current.ours
    }
    pub fn few(b: &Bench) -> &Slidegate {
        &b.few.ours
    }
    pub fn per_second(b: &Bench) -> &Slidegate {
        &b.per_second.ours
    }
    pub fn per_minute(b: &Bench) -> &Slidegate {
        &b.per_minute.ours
    }
    pub fn gcra(b: &Bench) -> &Slidegate {
        &b.gcra_many.ours
    }
    pub fn three(b: &Bench) -> &Slidegate {
        &b.three.ours
    }
}

pub fn hot(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.hot.hot(side, HOT_KEY, iters)
}

pub fn older(b: &mut Bench, side: Side, iters: u64) -> Pass {
    let aged = &b.aged[side.index()];
    let (key, age) = aged.aged().unwrap_or_else(|| unreachable!("start_round admits the aged keys"));
    b.ages.push(age);
    b.older.hot(side, key, iters)
}

pub fn current(b: &mut Bench, side: Side, iters: u64) -> Pass {
    let fresh = &mut b.fresh[side.index()];
    match side {
        Side::Slidegate => workloads::refused_now(&b.current.ours, fresh, iters),
        Side::Governor => workloads::refused_now(&b.current.theirs, fresh, iters),
    }
}

pub fn few(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.few.random(side, iters)
}

pub fn per_second(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.per_second.random(side, iters)
}

pub fn one_at_a_time(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.per_second.one_at_a_time(side, iters)
}

pub fn per_minute(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.per_minute.random(side, iters)
}

pub fn frozen(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.frozen.random(side, iters)
}

pub fn steady(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.steady.random(side, iters)
}

pub fn gcra_hot(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.gcra_hot.hot(side, HOT_KEY, iters)
}

pub fn gcra_many(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.gcra_many.random(side, iters)
}

pub fn three(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.three.random(side, iters)
}

pub fn new_keys(_: &mut Bench, side: Side, iters: u64) -> Pass {
    match side {
        Side::Slidegate => workloads::new_keys(|| sliding(Policy::PerSecond), iters),
        Side::Governor => workloads::new_keys(|| Governor::new(Policy::PerSecond), iters),
    }
}

pub fn two_hot(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.two_hot.two_threads(side, iters, |_| Keys::Hot(HOT_KEY))
}

pub fn two_disjoint(b: &mut Bench, side: Side, iters: u64) -> Pass {
    b.two_disjoint.two_threads(side, iters, disjoint_visits)
}
