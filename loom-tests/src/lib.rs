//! Helpers shared by the loom models in `tests/`. Everything here, like the models, builds
//! only with `--cfg slidegate_loom`; without it this crate is empty.

#[cfg(slidegate_loom)]
pub use imp::*;

#[cfg(slidegate_loom)]
mod imp {
    use std::collections::BTreeSet;
    use std::fmt::Debug;
    use std::sync::{Arc, Mutex};

    use slidegate::model::{Algorithm, Outcome, OwnedState, Policy};
    use slidegate::{Decision, Limit, MAX_LOG_UNITS};

    /// One millisecond and one second, in the nanoseconds `KeyState` takes.
    pub const MS: u64 = 1_000_000;
    pub const S: u64 = 1_000 * MS;

    /// A valid policy (the models only use valid limits).
    pub fn policy(limits: &[Limit]) -> Arc<Policy> {
        Policy::new(limits).unwrap_or_else(|e| panic!("bad policy {limits:?}: {e}"))
    }

    /// The decision of an outcome that must be one (not `Expired` nor `Retired`).
    pub fn decided(outcome: Outcome) -> Decision {
        match outcome {
            Outcome::Decided(d) => d,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Counts `cost` units at `now` (must not be expired).
    pub fn take(state: &OwnedState, policy: &Policy, now: u64, cost: u64) -> Decision {
        decided(state.check(policy, now, cost, true))
    }

    /// A thread that takes one unit from `state` at `now`.
    pub fn spawn_take(
        state: &loom::sync::Arc<OwnedState>,
        policy: &Arc<Policy>,
        now: u64,
    ) -> loom::thread::JoinHandle<Decision> {
        let (state, policy) = (loom::sync::Arc::clone(state), Arc::clone(policy));
        loom::thread::spawn(move || take(&state, &policy, now, 1))
    }

    /// Two threads against a fresh state (created at 0) under `limits`, each taking one
    /// unit at its time in `at`; the state and their decisions.
    pub fn race_at(limits: &[Limit], at: [u64; 2]) -> (loom::sync::Arc<OwnedState>, [Decision; 2]) {
        let policy = policy(limits);
        let state = loom::sync::Arc::new(OwnedState::new(&policy, 0));
        let [a, b] = at.map(|now| spawn_take(&state, &policy, now));
        (state, [a.join().unwrap(), b.join().unwrap()])
    }

    /// A cost-1 peek: writes nothing; `remaining()` is as if one more unit were admitted.
    pub fn peek(state: &OwnedState, policy: &Policy, now: u64) -> Decision {
        decided(state.check(policy, now, 1, false))
    }

    /// One thread per cost against a fresh state (created at 0) under `limits`, all
    /// counting at `now`; the state and the decisions, in cost order.
    pub fn race(limits: &[Limit], now: u64, costs: &[u64]) -> (loom::sync::Arc<OwnedState>, Vec<Decision>) {
        race_with(limits, Algorithm::SlidingWindow, now, costs)
    }

    /// The units limit `j` of `limits` holds at `now`, as a strict or interpolated estimate
    /// rounded up to whole units (exact for strict limits): what a cost-0 check sees as used.
    pub fn units(state: &OwnedState, limits: &[Limit], j: usize, now: u64) -> u64 {
        state.used(&policy(limits), now)[j]
    }

    /// A valid policy running `algorithm` on every limit.
    pub fn policy_with(limits: &[Limit], algorithm: Algorithm) -> Arc<Policy> {
        Policy::with_algorithm(limits, algorithm)
            .map(Arc::new)
            .unwrap_or_else(|e| panic!("bad {algorithm:?} policy {limits:?}: {e}"))
    }

    /// [`race`] under `algorithm`: one thread per cost against a fresh state (created at 0),
    /// all counting at `now`; the state and the decisions, in cost order.
    pub fn race_with(
        limits: &[Limit],
        algorithm: Algorithm,
        now: u64,
        costs: &[u64],
    ) -> (loom::sync::Arc<OwnedState>, Vec<Decision>) {
        let policy = policy_with(limits, algorithm);
        let state = loom::sync::Arc::new(OwnedState::new(&policy, 0));
        let handles: Vec<_> = costs
            .iter()
            .map(|&cost| {
                let (state, policy) = (loom::sync::Arc::clone(&state), policy.clone());
                loom::thread::spawn(move || take(&state, &policy, now, cost))
            })
            .collect();
        let decisions = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (state, decisions)
    }

    /// The decisions of `costs` taken one after another at `now` on a fresh state (created
    /// at 0): what a race at a frozen clock must be equivalent to.
    pub fn sequential(policy: &Arc<Policy>, now: u64, costs: &[u64]) -> Vec<Decision> {
        let state = OwnedState::new(policy, 0);
        costs.iter().map(|&cost| take(&state, policy, now, cost)).collect()
    }

    /// Asserts that `decisions` (one per cost, in the order of `costs`) are exactly those of
    /// taking the same requests one after another in *some* order on a fresh state at `now`:
    /// the race was equivalent to a sequential run (each `remaining` and `retry_after` too).
    pub fn assert_sequential(policy: &Arc<Policy>, now: u64, costs: &[u64], decisions: &[Decision]) {
        assert_eq!(costs.len(), decisions.len());
        let mut order: Vec<usize> = (0..costs.len()).collect();
        let mut orders = Vec::new();
        permutations(&mut order, 0, &mut orders);
        for order in &orders {
            let in_order: Vec<u64> = order.iter().map(|&i| costs[i]).collect();
            let want = sequential(policy, now, &in_order);
            if order.iter().zip(&want).all(|(&i, w)| decisions[i] == *w) {
                return;
            }
        }
        panic!("no sequential order of costs {costs:?} gives {decisions:?}");
    }

    fn permutations(order: &mut Vec<usize>, from: usize, out: &mut Vec<Vec<usize>>) {
        if from == order.len() {
            out.push(order.clone());
            return;
        }
        for i in from..order.len() {
            order.swap(from, i);
            permutations(order, from + 1, out);
            order.swap(from, i);
        }
    }

    /// [`units`] for any algorithm: the units limit `j` of `limits` holds at `now` under
    /// `algorithm`, read with a cost-0 peek through a probe policy with the same layout in
    /// which limit `j` is unchanged and every other limit is far looser, so limit `j` alone
    /// sets `remaining` (= `max − held`, exact when the held units are whole).
    ///
    /// * Fixed window, sliding log: the state depends on the window only (the word is a
    ///   window tag and count, or a list of timestamps), so the others keep their window
    ///   with a far larger `max` (10⁶, or [`MAX_LOG_UNITS`] for the log).
    /// * GCRA: the word is a time whose meaning depends on the interval (`window / max`), so
    ///   the others get 10⁶ units per 1000 windows: a burst so long that whatever they hold
    ///   leaves them about 10⁶ units of room.
    pub fn units_with(state: &OwnedState, algorithm: Algorithm, limits: &[Limit], j: usize, now: u64) -> u64 {
        if algorithm == Algorithm::SlidingWindow {
            return units(state, limits, j, now);
        }
        let probe: Vec<Limit> = limits
            .iter()
            .enumerate()
            .map(|(i, l)| match algorithm {
                _ if i == j => *l,
                Algorithm::SlidingLog => Limit::new(MAX_LOG_UNITS, l.window()),
                Algorithm::Gcra => Limit::new(1_000_000, l.window() * 1000),
                _ => Limit::new(1_000_000, l.window()),
            })
            .collect();
        let others_looser = probe.iter().enumerate().all(|(i, l)| i == j || l.max() >= 4 * limits[j].max());
        assert!(others_looser, "limit {j} is too large to probe");
        let probe = policy_with(&probe, algorithm);
        assert_eq!(
            probe.words_per_key(),
            policy_with(limits, algorithm).words_per_key(),
            "probe layout differs"
        );
        let room = decided(state.check(&probe, now, 0, false)).remaining();
        limits[j].max() - room
    }

    /// `loom::model` with room for models that lock several of the table's shards (a
    /// sweep, a search for room): more branches than loom's default allows.
    pub fn model_with_branches(f: impl Fn() + Sync + Send + 'static) {
        let mut model = loom::model::Builder::new();
        model.max_branches = 20_000;
        model.check(f);
    }

    /// Outcomes one `loom::model` run has reached, to assert afterwards that every legal
    /// outcome was actually explored (a model that never hits the race proves nothing).
    /// Recorded only from the model's main thread after its joins, so a std `Mutex` is fine.
    #[derive(Debug, Default)]
    pub struct Reached<T>(Mutex<BTreeSet<T>>);

    impl<T: Ord + Clone + Debug> Reached<T> {
        pub const fn new() -> Reached<T> {
            Reached(Mutex::new(BTreeSet::new()))
        }

        /// Records `outcome` after asserting it is one of `legal`.
        pub fn record(&self, outcome: T, legal: &[T]) {
            assert!(legal.contains(&outcome), "illegal outcome {outcome:?}; legal: {legal:?}");
            self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(outcome);
        }

        /// Asserts that the model reached every outcome in `expected`.
        pub fn assert_all(&self, expected: &[T]) {
            let reached = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let missing: Vec<&T> = expected.iter().filter(|o| !reached.contains(o)).collect();
            assert!(missing.is_empty(), "never explored {missing:?} (reached {reached:?})");
        }
    }

    /// What a model's thread did to a `Limiter<u64>`, for [`Linearizable`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Op {
        /// `check_n(key, cost)`.
        Check { key: u64, cost: u64 },
        /// `sweep()`.
        Sweep,
    }

    /// An operation and the clock readings that bracket it: just before it started and just
    /// after it returned (with no loom operation between the reading and the operation, so
    /// the operation read the first, and the clock did not move after it returned).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Timed {
        pub op: Op,
        pub start: std::time::Duration,
        pub end: std::time::Duration,
    }

    /// What a check answered (`is_allowed`, `remaining`); `None` for a sweep.
    pub type Answer = Option<(bool, u64)>;

    /// The outcomes a sequential run allows for operations that raced: every order of the
    /// operations that keeps `precedes` (pairs `(a, b)`: `a` returned before `b` started),
    /// each operation at the start or the end of its bracket, times never going back in the
    /// order (an operation at the end of its bracket decided at a time the clock reached
    /// while it ran), replayed one by one on a fresh limiter from `build` after `prepare`;
    /// then `probes` (a time, and a key to peek at it). An outcome is the operations'
    /// answers, in the caller's order, then the probes' peeks.
    ///
    /// A loom model must run the same loom operations in every execution of a schedule, so
    /// the replays run beforehand ([`learn`](Self::learn), in a loom execution of their own:
    /// the limiter's atomics are loom's), for every bracket a model's operations can have,
    /// and the model only looks its outcome up ([`assert`](Self::assert)).
    pub struct Linearizable {
        known: Mutex<std::collections::BTreeMap<Vec<Timed>, BTreeSet<Vec<Answer>>>>,
    }

    impl Default for Linearizable {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Linearizable {
        pub const fn new() -> Linearizable {
            Linearizable { known: Mutex::new(std::collections::BTreeMap::new()) }
        }

        /// Replays, for every choice of one bracket per operation from `brackets` (the
        /// brackets operation `i` can have, one list per operation), every sequential run
        /// (see the type's docs), and keeps their outcomes.
        pub fn learn<B, P>(
            &'static self,
            build: B,
            prepare: P,
            brackets: Vec<Vec<Timed>>,
            precedes: Vec<(usize, usize)>,
            probes: Vec<(std::time::Duration, u64)>,
        ) where
            B: Fn() -> (slidegate::Limiter<u64>, slidegate::ManualClock) + Send + Sync + 'static,
            P: Fn(&slidegate::Limiter<u64>, &slidegate::ManualClock) + Send + Sync + 'static,
        {
            let mut choices: Vec<Vec<Timed>> = vec![Vec::new()];
            for options in &brackets {
                choices = choices
                    .iter()
                    .flat_map(|chosen| {
                        options.iter().map(move |&t| chosen.iter().copied().chain([t]).collect())
                    })
                    .collect();
            }
            let mut model = loom::model::Builder::new();
            // One thread, one execution: every replay's operations are branches of it.
            model.max_branches = 10_000_000;
            model.check(move || {
                for ops in &choices {
                    let legal = Self::legal(&build, &prepare, ops, &precedes, &probes);
                    self.known.lock().unwrap_or_else(|e| e.into_inner()).insert(ops.clone(), legal);
                }
            });
        }

        /// Asserts that `answers` (one per operation of `ops`, then one per probe) is an
        /// outcome of some sequential run of operations with these brackets.
        pub fn assert(&self, ops: &[Timed], answers: &[Answer]) {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            let Some(legal) = known.get(ops) else {
                panic!("brackets {ops:?} were not learned");
            };
            assert!(
                legal.contains(answers),
                "no sequential run of {ops:?} answers {answers:?}; the legal outcomes are {legal:?}"
            );
        }

        fn legal(
            build: &dyn Fn() -> (slidegate::Limiter<u64>, slidegate::ManualClock),
            prepare: &dyn Fn(&slidegate::Limiter<u64>, &slidegate::ManualClock),
            ops: &[Timed],
            precedes: &[(usize, usize)],
            probes: &[(std::time::Duration, u64)],
        ) -> BTreeSet<Vec<Answer>> {
            let mut orders = Vec::new();
            permutations(&mut (0..ops.len()).collect(), 0, &mut orders);
            let mut legal = BTreeSet::new();
            for order in orders {
                let position = |i: usize| order.iter().position(|&o| o == i).unwrap_or(usize::MAX);
                if precedes.iter().any(|&(a, b)| position(a) > position(b)) {
                    continue;
                }
                // Each operation at the start (bit clear) or the end of its bracket.
                for ends in 0u32..(1 << ops.len()) {
                    let at = |i: usize| if ends & (1 << i) == 0 { ops[i].start } else { ops[i].end };
                    if order.windows(2).any(|w| at(w[0]) > at(w[1])) {
                        continue;
                    }
                    let (limiter, clock) = build();
                    prepare(&limiter, &clock);
                    let mut answers = vec![None; ops.len()];
                    for &i in &order {
                        clock.set(at(i));
                        answers[i] = match ops[i].op {
                            Op::Check { key, cost } => {
                                let d = limiter.check_n(&key, cost);
                                Some((d.is_allowed(), d.remaining()))
                            }
                            Op::Sweep => {
                                limiter.sweep();
                                None
                            }
                        };
                    }
                    for &(time, key) in probes {
                        clock.set(time);
                        let d = limiter.peek(&key);
                        answers.push(Some((d.is_allowed(), d.remaining())));
                    }
                    legal.insert(answers);
                }
            }
            legal
        }
    }
}
