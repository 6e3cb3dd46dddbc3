//! Helpers shared by the loom models in `tests/`. Everything here, like the models, builds
//! only with `--cfg slidegate_loom`; without it this crate is empty.

#[cfg(slidegate_loom)]
pub use imp::*;

#[cfg(slidegate_loom)]
mod imp {
    use std::collections::BTreeSet;
    use std::fmt::Debug;
    use std::sync::Mutex;

    use slidegate::model::{KeyState, Outcome, Policy};
    use slidegate::{Accuracy, Decision, Limit};

    /// One millisecond and one second, in the nanoseconds `KeyState` takes.
    pub const MS: u64 = 1_000_000;
    pub const S: u64 = 1_000 * MS;

    /// A valid policy (the models only use valid limits).
    pub fn policy(limits: &[Limit]) -> Policy {
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
    pub fn take(state: &KeyState, policy: &Policy, now: u64, cost: u64) -> Decision {
        decided(state.check(policy, now, cost, true))
    }

    /// A cost-1 peek: writes nothing; `remaining()` is as if one more unit were admitted.
    pub fn peek(state: &KeyState, policy: &Policy, now: u64) -> Decision {
        decided(state.check(policy, now, 1, false))
    }

    /// One thread per cost against a fresh state (created at 0) under `limits`, all
    /// counting at `now`; the state and the decisions, in cost order.
    pub fn race(limits: &[Limit], now: u64, costs: &[u64]) -> (loom::sync::Arc<KeyState>, Vec<Decision>) {
        let policy = policy(limits);
        let state = loom::sync::Arc::new(KeyState::new(&policy, 0));
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

    /// The units limit `j` of `limits` holds at `now`, as a strict or interpolated estimate
    /// rounded down to whole units (exact for strict limits).
    ///
    /// A cost-0 peek reports the room of the *tightest* limit, so it is taken through a probe
    /// policy with the same layout (same windows, precisions and accuracies, hence the same
    /// words) in which limit `j` is the tightest by far: `j` gets max 1000, the others 10⁶.
    pub fn units(state: &KeyState, limits: &[Limit], j: usize, now: u64) -> u64 {
        const PROBE: u64 = 1000;
        let probe: Vec<Limit> = limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let max = if i == j { PROBE } else { 1000 * PROBE };
                let same = Limit::new(max, l.window()).precision(l.get_precision());
                if l.accuracy() == Accuracy::Strict {
                    same.strict()
                } else {
                    same
                }
            })
            .collect();
        let probe = policy(&probe);
        assert_eq!(probe.words_per_key(), policy(limits).words_per_key(), "probe layout differs");
        let room = decided(state.check(&probe, now, 0, false)).remaining();
        PROBE - room
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
}
