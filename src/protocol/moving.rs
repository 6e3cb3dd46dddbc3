//! A key's counters on their own ([`OwnedState`]: a new key's, or a moved key's before the
//! key table takes them in), and the move of a key's counts to another policy
//! ([`KeyState::migrate_at`]).

use std::sync::Arc;

use crate::algorithm::counter::{set, Counter};
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::layout::{initial_words, Carry, Policy, TOUCHED};
use crate::sync::{AtomicU64, Ordering};

#[cfg(any(test, slidegate_loom))]
use super::Outcome;
use super::{KeyState, LAST_TIME, MOVED};

/// A key's counters on their own: what a policy change or a new key lays out before the
/// key table takes it in (`table/` copies the words into the key's node), and what the
/// loom models share between their threads.
#[derive(Debug)]
pub struct OwnedState {
    words: Box<[AtomicU64]>,
    policy: Arc<Policy>,
}

impl OwnedState {
    /// Fresh state: every window empty, as of `now` (ns).
    pub fn new(policy: &Arc<Policy>, now: u64) -> OwnedState {
        let mut words = initial_words(policy, now);
        set(&mut words, TOUCHED, now.min(LAST_TIME));
        OwnedState::from_words(policy, &words)
    }

    /// A state holding `words` (laid out for `policy`).
    pub(crate) fn from_words(policy: &Arc<Policy>, words: &[u64]) -> OwnedState {
        // Every atomic is created with its initial value (no stores after creation: there
        // is nothing to order, and loom's RMW bookkeeping mishandles an RMW that reads an
        // initial plain store, https://github.com/tokio-rs/loom/issues/254).
        OwnedState { words: words.iter().map(|&w| AtomicU64::new(w)).collect(), policy: Arc::clone(policy) }
    }

    /// The counters, to check against.
    #[inline]
    pub fn state(&self) -> KeyState<'_> {
        KeyState::from_parts(&self.words, &self.policy)
    }

    /// [`KeyState::check`] on these counters (for the loom models and unit tests, which own
    /// their states).
    #[cfg(any(test, slidegate_loom))]
    pub fn check(&self, policy: &Policy, now: u64, cost: u64, commit: bool) -> Outcome {
        self.state().check(policy, now, cost, commit)
    }

    /// [`KeyState::check_many`] on owned states.
    #[cfg(slidegate_loom)]
    pub fn check_many(states: &[&OwnedState], now: u64, cost: u64) -> (Outcome, usize) {
        let views: Vec<KeyState<'_>> = states.iter().map(|s| s.state()).collect();
        KeyState::check_many(&views, now, cost)
    }

    /// [`KeyState::retire`].
    #[cfg(any(test, slidegate_loom))]
    pub fn retire(&self, policy: &Policy, now: u64) -> bool {
        self.state().retire(policy, now)
    }

    /// [`KeyState::retire_now`].
    #[cfg(any(test, slidegate_loom))]
    pub fn retire_now(&self, policy: &Policy) {
        self.state().retire_now(policy);
    }

    /// [`KeyState::is_retired`].
    #[cfg(any(test, slidegate_loom))]
    pub fn is_retired(&self) -> bool {
        self.state().is_retired()
    }

    /// [`KeyState::is_expired`].
    #[cfg(any(test, slidegate_loom))]
    pub fn is_expired(&self, policy: &Policy, now: u64) -> bool {
        self.state().is_expired(policy, now)
    }

    /// Units each limit of `policy` (the state's own, or one laid out the same) counts at
    /// `now`, rounded up to whole units: what a cost-0 check sees as used.
    #[cfg(slidegate_loom)]
    pub fn used(&self, policy: &Policy, now: u64) -> Vec<u64> {
        let state = KeyState::from_parts(&self.words, policy);
        match policy.algorithm {
            Algorithm::SlidingWindow => state.used::<Sliding>(now, false),
            Algorithm::FixedWindow => state.used::<Fixed>(now, false),
            Algorithm::SlidingLog => state.used::<Log>(now, false),
            Algorithm::Gcra => state.used::<Gcra>(now, false),
        }
    }

    /// Takes `cost` units back from each sliding window limit of `policy` in its slot at
    /// `now`, as a check of several limits or keys does when a later commit fails
    /// (`Counter::rollback`'s code, for a commit made at `now`).
    #[cfg(slidegate_loom)]
    pub fn rollback(&self, policy: &Policy, now: u64, cost: u64) {
        let state = KeyState::from_parts(&self.words, policy);
        for rule in policy.rules.iter() {
            Sliding::rollback_in(&state, rule, rule.slot_of(now).0, cost);
        }
    }

    /// A check preempted between its views and its commits: reads every limit's view at
    /// `at`, runs `meanwhile`, then commits `cost` units from those views (`Counter::view`
    /// and `Counter::commit`, the shipped code); `true` if every commit succeeded.
    #[cfg(slidegate_loom)]
    pub fn stale_commit(&self, policy: &Policy, at: u64, cost: u64, meanwhile: impl FnOnce()) -> bool {
        let state = KeyState::from_parts(&self.words, policy);
        let views: Vec<_> = policy.rules.iter().map(|rule| Sliding::view(&state, rule, at, false)).collect();
        meanwhile();
        policy.rules.iter().zip(&views).all(|(rule, view)| Sliding::commit(&state, rule, view, cost))
    }

    /// [`KeyState::history`] (feature `serde`): what each limit counts at `now`, by when.
    #[cfg(all(slidegate_loom, feature = "serde"))]
    pub fn history(&self, now: u64) -> Option<Vec<Vec<(u64, u64)>>> {
        self.state().history(now)
    }

    /// [`KeyState::migrate_at`], timed at `now`.
    #[cfg(slidegate_loom)]
    pub fn migrate(&self, newer: &Arc<Policy>, now: u64, carry: Carry) -> OwnedState {
        self.state().migrate_at(newer, || now, carry).0
    }

    /// The policy and the words' values, for a state no other thread has seen.
    pub(crate) fn into_parts(self) -> (Arc<Policy>, Vec<u64>) {
        // Relaxed: unshared (the caller owns it).
        let words = self.words.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        (self.policy, words)
    }
}

impl KeyState<'_> {
    /// The state that replaces this one when its key moves to `newer` (another version of
    /// the same policy, or another policy for the key) and the layout differs, called under
    /// the key table's shard lock with this state still in the table. (When only the limits'
    /// `max` differ, [`Policy::same_layout`], the table points the key's node at `newer` and
    /// keeps the words: every count carries over exactly.)
    ///
    /// This state is marked [`MOVED`], so no check can count into it any more, and the new
    /// one is a copy of its words (same layout, not a sliding log, whose words point to
    /// entries), fresh, or starts with the units this one counted, per `carry`.
    ///
    /// Exactness: a check that counted into this state either finds it moved after its
    /// commit and starts over on the table (its units are then in the new state once, or
    /// twice if they were read here too: conservative, the one case where a racing check
    /// may count twice), or its units are read here; never neither. The check reads
    /// `touched` after its commit (`moved`); the swap of `touched` comes before the
    /// read-modify-write of every word below. If the check's commit comes later than our
    /// RMW of its word in that word's modification order, our RMW (its Release half)
    /// synchronizes with the commit's CAS (Acquire; every later change of the word is an
    /// RMW, so the release sequence reaches it), so the swap happens-before the check's
    /// load of `touched`, which by coherence reads `MOVED` (nothing changes `touched` after
    /// it but `fetch_max`es of smaller times). If the commit comes earlier, our RMW reads
    /// its value (an RMW reads the latest value), and its Acquire half pairs with the
    /// commit's Release (sliding window, log) so that the history the commit published is
    /// read too. (A check that covers `touched` after the swap reads `MOVED` and commits
    /// nothing.) These are happens-before and coherence arguments, which hold on every
    /// memory model Rust supports (x86, ARM, loom).
    ///
    /// The move happens at the time `clock` returns, read after this state's words
    /// (returned with the new state: the time the old state left). The limiter passes its
    /// clock, read there, never the moving check's own earlier reading: a check delayed
    /// between its reading and the move would otherwise record the carried units at its old
    /// time, in a slot long before the one they were counted in, and they would leave the
    /// new window early (an over-admission; `loom-tests/tests/stale_move.rs`). Read after
    /// the words' RMWs, the clock is at least the time of every commit those RMWs carry:
    /// such a commit's check read the clock before its CAS (Release), which our RMW
    /// (Acquire half) reads or follows in its release sequence, so that reading
    /// happens-before ours, which by coherence returns as much (the clock only rises, and
    /// returns only values stored in it: [`crate::clock`]). A commit our RMW does not read
    /// finds `MOVED` after it and starts over on the new state, at its own time.
    pub(crate) fn migrate_at(
        &self,
        newer: &Arc<Policy>,
        clock: impl FnOnce() -> u64,
        carry: Carry,
    ) -> (OwnedState, u64) {
        let same_layout = self.policy.same_layout(newer);
        // Relaxed: sequenced before the RMWs below, whose Release half orders it for a
        // commit that reads them (see the doc comment).
        let touched = self.word(TOUCHED).swap(MOVED, Ordering::Relaxed);
        let copied = same_layout && self.policy.algorithm != Algorithm::SlidingLog;
        let reencoded = !same_layout && self.policy.same_windows(newer);
        let max_only = self.policy.algorithm == Algorithm::Gcra && {
            let (a, b) = (&self.policy.rules, &newer.rules);
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(a, b)| a.window == b.window && a.precision == b.precision)
        };
        let carried = touched < MOVED && (copied || reencoded || carry == Carry::Conservative || max_only);
        // AcqRel: see the doc comment (pairs with the commits' CAS).
        let words: Vec<u64> = if carried {
            self.words.all().iter().map(|w| w.fetch_add(0, Ordering::AcqRel)).collect()
        } else {
            Vec::new()
        };
        let now = clock();
        if touched < MOVED && (copied || reencoded) {
            let mut words = words;
            if reencoded {
                // The same windows, ring entries of another width: slot by slot, exactly.
                let mut fresh = vec![0u64; newer.words_per_key()];
                for (a, b) in self.policy.rules.iter().zip(newer.rules.iter()) {
                    Sliding::reencode(a, b, &words, &mut fresh, now);
                }
                words = fresh;
            }
            set(&mut words, TOUCHED, touched);
            return (OwnedState::from_words(newer, &words), now);
        }
        // A move is not a use: the new state is idle since the old one was (its carried
        // units, below, cover their own slot), so a key moved by a peek, or with nothing
        // to carry, is evicted when it would have been.
        let since = if touched < MOVED { touched.min(now) } else { now };
        let mut words = initial_words(newer, now);
        set(&mut words, TOUCHED, since.min(LAST_TIME));
        let owned = OwnedState::from_words(newer, &words);
        let fresh = owned.state();
        if carried {
            let expired = now.saturating_sub(touched) >= self.policy.expiry;
            let used = match self.policy.algorithm {
                Algorithm::SlidingWindow => self.used::<Sliding>(now, expired),
                Algorithm::FixedWindow => self.used::<Fixed>(now, expired),
                Algorithm::SlidingLog => self.used::<Log>(now, expired),
                Algorithm::Gcra => self.used::<Gcra>(now, expired),
            };
            let windows = self.policy.rules.iter().map(|r| r.window).zip(used);
            let carried: Vec<u64> = newer
                .rules
                .iter()
                .map(|rule| {
                    let covering = windows.clone().filter(|&(w, _)| w >= rule.window).map(|(_, u)| u).min();
                    // Not capped at the new `max`: a later rise of `max` must still see them.
                    // (Each is at most an old `max`, so a sliding log stays within its bound.)
                    covering.or_else(|| windows.clone().map(|(_, u)| u).max()).unwrap_or(0)
                })
                .collect();
            match newer.algorithm {
                Algorithm::SlidingWindow => fresh.carry_in::<Sliding>(&carried, now),
                Algorithm::FixedWindow => fresh.carry_in::<Fixed>(&carried, now),
                Algorithm::SlidingLog => fresh.carry_in::<Log>(&carried, now),
                Algorithm::Gcra => fresh.carry_in::<Gcra>(&carried, now),
            }
        }
        self.release(self.policy);
        (owned, now)
    }

    /// Units each limit counts at `now` (what a cost-0 check would see as used).
    fn used<A: Counter>(&self, now: u64, expired: bool) -> Vec<u64> {
        let _pin = A::pin();
        let rules = self.policy.rules.iter();
        rules.map(|rule| A::used(rule, &A::view(self, rule, now, expired))).collect()
    }

    /// Records `units[j]` in limit `j` of a state no other thread can see yet.
    fn carry_in<A: Counter>(&self, units: &[u64], now: u64) {
        let _pin = A::pin();
        for (rule, &cost) in self.policy.rules.iter().zip(units) {
            let cost = cost.min(A::MOST);
            let view = A::view(self, rule, now, false);
            // Unshared: nothing can fail, but a failure would only lose carried units.
            let mut touched = self.touched();
            if cost > 0 && self.cover::<A>(&mut touched, now, rule, &view, cost) {
                let _ = A::commit(self, rule, &view, cost);
            }
        }
    }
}
