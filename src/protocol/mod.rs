//! The admission protocol, in reading order: a check reads a view of every limit of a key
//! (loads only: a refused request writes nothing), decides, and commits an admission with
//! one compare-and-swap per limit; [`KeyState::check_many`] does the same across several
//! keys (`many.rs`). Also the retire protocol that makes eviction and replacement exact, and
//! the move of a key's counts to another policy (`moving.rs`). What a view is and how a
//! commit writes it is each algorithm's ([`Counter`]: `algorithm/`); how the words are laid
//! out is `layout.rs`.
//!
//! # Several limits
//! A request must fit every limit and is then counted in every limit. The check first
//! reads a view of every limit (loads only: a refused request writes nothing). If all
//! admit, it commits limit by limit with a CAS each; if a CAS loses a race and the limit no
//! longer admits, the limits already committed are rolled back and the check starts over.
//! A rollback that finds its slot already closed leaves the units counted there: the error
//! is conservative (never over-admission) and needs a slot boundary to pass within the
//! nanoseconds between a commit and its rollback.

use crate::algorithm::counter::{Counter, Rule, Words};
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::decision::Decision;
use crate::layout::{Policy, MAX_LIMITS, RETIRED, TOUCHED};
use crate::sync::{AtomicU64, Ordering};

mod many;
mod moving;
#[cfg(feature = "serde")]
mod snapshot;

pub use moving::OwnedState;
#[cfg(feature = "serde")]
pub(crate) use snapshot::{replay_into, History};

/// `touched` of a state moved to another policy ([`KeyState::migrate_at`]), the other marker
/// beside [`RETIRED`] (eviction, replacement of an expired key, reset): a check that
/// committed into a moved state starts over, one that committed into a retired one stands
/// (see [`KeyState::retire`]). Both are above every time `touched` holds ([`LAST_TIME`]).
pub(crate) const MOVED: u64 = RETIRED - 1;

/// The latest time `touched` holds: a clock saturated at the end of `u64` must not read as
/// a marker.
const LAST_TIME: u64 = MOVED - 1;

/// The most keys one [`Limiter::check_all`](crate::Limiter::check_all) charges together.
pub const MAX_IDENTITIES: usize = 4;

/// How many times a refused check starts over when a racing check moved the key on while
/// its wait was being worked out (`admissible_at`); after that the wait it reports may be
/// later than exact, never earlier.
const STALE_RETRIES: u32 = 2;

/// What a check concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The decision, already applied to the state if it admitted and was not a peek.
    Decided(Decision),
    /// The key is expired and the check wants to count: replace it with a fresh state
    /// under the shard's mutex ([`KeyState::retire`]) and check again.
    Expired,
    /// The state was retired (evicted, reset or replaced) before the check counted in it,
    /// or moved to another policy before or after (see [`KeyState::migrate_at`]): look the
    /// key up again. A commit into a retired state stands ([`KeyState::retire`]).
    Retired,
}

/// One key's counters for every limit of a [`Policy`], borrowed from where they live (a
/// node of the key table, see `table/`, or an [`OwnedState`]). Copies share the counters.
#[derive(Debug, Clone, Copy)]
pub struct KeyState<'a> {
    words: Words<'a>,
    /// The version of the key's policy the words are laid out for.
    policy: &'a Policy,
}

/// The words, as the algorithms read and write them (`Counter`, `algorithm/counter.rs`).
impl<'a> std::ops::Deref for KeyState<'a> {
    type Target = Words<'a>;

    #[inline(always)]
    fn deref(&self) -> &Words<'a> {
        &self.words
    }
}

impl<'a> KeyState<'a> {
    /// Counters laid out for `policy`, wherever they live.
    #[inline(always)]
    pub(crate) fn from_parts(words: &'a [AtomicU64], policy: &'a Policy) -> KeyState<'a> {
        KeyState { words: Words::new(words), policy }
    }

    /// The version of the policy this state is laid out for.
    #[inline(always)]
    pub fn policy(&self) -> &'a Policy {
        self.policy
    }

    #[cfg(any(test, slidegate_loom))]
    /// `true` when no window of the key holds any count at `now`: the state equals a fresh
    /// one, so dropping it changes no decision.
    pub fn is_expired(&self, policy: &Policy, now: u64) -> bool {
        // Relaxed: a hint; `retire` decides with a CAS. A retired state is never expired.
        now.saturating_sub(self.word(TOUCHED).load(Ordering::Relaxed)) >= policy.expiry
    }

    /// Retires the state if it is expired at `now`, so that it can be dropped from the table
    /// (or replaced) while checks may still hold it: `true` if it is retired now.
    ///
    /// No unit that counts at `now` is in a retired state, and a check's commit into it
    /// stands. A check makes `touched` cover the slot it commits in *before* its commit
    /// (`cover`: a `fetch_max`, unless the `touched` it read covers the slot already), and
    /// commits nothing if that finds a marker. Every change of `touched` before a marker
    /// is a `fetch_max`, so its values only grow, and this CAS succeeds only on the value
    /// just before it in the word's modification order, `t`, with `now - t ≥ expiry`:
    ///
    /// * a cover ordered before this CAS raised `touched` to at least the start `s` of its
    ///   slot, so `s ≤ t`, and a unit counted in a slot that starts at `s` has left every
    ///   window by `s + expiry ≤ now`; a check whose `touched` covered its slot already read
    ///   a value at most `t`: the same;
    /// * a cover ordered after this CAS reads `RETIRED` and the check commits nothing: it
    ///   starts over on the table.
    ///
    /// So a commit into the state, before or after this CAS, either counts units that are
    /// out of every window at `now` (it stands: the check was decided on this state, every
    /// check that saw its units was decided on it too, and no check at `now` or later
    /// needs them), or is never made. A check whose clock is behind `now` that then finds
    /// the key absent or replaced decides at `now` or later (the shard's floor, `table/mod.rs`),
    /// where this state's units no longer count. Relaxed: the argument rests on the
    /// modification order of `touched` alone (coherence), which every memory model gives
    /// every atomic (x86, ARM, loom).
    pub fn retire(&self, policy: &Policy, now: u64) -> bool {
        let touched = self.word(TOUCHED).load(Ordering::Relaxed);
        let retired = now.saturating_sub(touched) >= policy.expiry
            && self
                .word(TOUCHED)
                .compare_exchange(touched, RETIRED, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if retired {
            self.release(policy);
        }
        retired
    }

    /// Retires the state whatever it holds (an explicit reset of the key): checks that find
    /// it retired, before they cover `touched`, start over on the table; a commit made
    /// without seeing it stands, decided before the reset, which forgets it with the rest.
    /// Relaxed: as in [`retire`](Self::retire), only `touched`'s modification order matters.
    pub fn retire_now(&self, policy: &Policy) {
        self.word(TOUCHED).store(RETIRED, Ordering::Relaxed);
        self.release(policy);
    }

    /// After retirement: frees what the state owns beyond its words (a sliding log's
    /// entries). Checks that still hold the state see it retired and start over.
    fn release(&self, policy: &Policy) {
        if policy.algorithm == Algorithm::SlidingLog {
            for rule in policy.rules.iter() {
                Log::release(self, rule);
            }
        }
    }

    /// The start of the latest slot a commit counted in, at least (a marker, [`RETIRED`] or
    /// [`MOVED`], once retired or moved).
    #[inline]
    pub fn touched(&self) -> u64 {
        // Relaxed: a hint for the sweeper's first filter; `retire` decides with its CAS.
        self.word(TOUCHED).load(Ordering::Relaxed)
    }

    /// `true` once the state has been retired or moved.
    pub fn is_retired(&self) -> bool {
        // Relaxed: read under the shard's mutex, which orders it, or as a hint before an
        // answer that writes nothing (a retired state then answers as of just before).
        self.word(TOUCHED).load(Ordering::Relaxed) >= MOVED
    }

    /// After a commit: did the state move to another policy meanwhile? Then the move may
    /// not have read the commit, and the check starts over (see [`migrate_at`](Self::migrate_at)).
    /// A retirement ([`RETIRED`]) lets the commit stand (see [`retire`](Self::retire)).
    /// Relaxed: coherence after the happens-before that `migrate_at` describes.
    #[inline(always)]
    fn moved(&self) -> bool {
        self.word(TOUCHED).load(Ordering::Relaxed) == MOVED
    }

    /// Checks a request of `cost` units at `now` (ns). With `commit`, an admitted request is
    /// counted in every limit; without, nothing is written (a peek). `cost` must not exceed
    /// any limit's `max` (see [`Policy::oversized`]).
    #[inline(always)]
    pub fn check(&self, policy: &Policy, now: u64, cost: u64, commit: bool) -> Outcome {
        match policy.algorithm {
            Algorithm::SlidingWindow => self.check_with::<Sliding>(policy, now, cost, commit),
            Algorithm::FixedWindow => self.check_with::<Fixed>(policy, now, cost, commit),
            Algorithm::SlidingLog => self.check_with::<Log>(policy, now, cost, commit),
            Algorithm::Gcra => self.check_with::<Gcra>(policy, now, cost, commit),
        }
    }

    /// A counting check (`FORCE == false`), or [`add`](Self::add).
    #[inline(always)]
    pub(crate) fn run<const FORCE: bool>(&self, policy: &Policy, now: u64, cost: u64) -> Outcome {
        if FORCE {
            self.add(policy, now, cost)
        } else {
            self.check(policy, now, cost, true)
        }
    }

    /// Whether two handles share one key's counters.
    pub(crate) fn same(&self, other: &KeyState) -> bool {
        std::ptr::eq(self.words.all().as_ptr(), other.words.all().as_ptr())
    }

    /// Counts `cost` in every limit without checking (units admitted elsewhere); the
    /// decision is the state afterwards.
    pub fn add(&self, policy: &Policy, now: u64, cost: u64) -> Outcome {
        match policy.algorithm {
            Algorithm::SlidingWindow => self.add_with::<Sliding>(policy, now, cost),
            Algorithm::FixedWindow => self.add_with::<Fixed>(policy, now, cost),
            Algorithm::SlidingLog => self.add_with::<Log>(policy, now, cost),
            Algorithm::Gcra => self.add_with::<Gcra>(policy, now, cost),
        }
    }

    fn add_with<A: Counter>(&self, policy: &Policy, now: u64, cost: u64) -> Outcome {
        let _pin = A::pin();
        let cost = cost.min(A::MOST);
        let rules = &policy.rules[..];
        let mut views = [A::View::default(); MAX_LIMITS];
        let (mut touched, expired) = match self.begin(policy, now, cost, true) {
            Ok(begun) => begun,
            Err(outcome) => return outcome,
        };
        if cost > 0 {
            for (rule, view) in rules.iter().zip(views.iter_mut()) {
                *view = A::view(self, rule, now, expired);
                if A::retired(view) || !self.cover::<A>(&mut touched, now, rule, view, cost) {
                    return Outcome::Retired;
                }
            }
            for (rule, view) in rules.iter().zip(views.iter_mut()) {
                while !A::commit(self, rule, view, cost) {
                    *view = A::view(self, rule, now, false);
                    // Retired between two limits' commits (after a lost CAS): the units are
                    // added again on the table; those counted here are out of every window
                    // by then, or forgotten by a reset (see `retire`), or carried by a move.
                    if A::retired(view) || !self.cover::<A>(&mut touched, now, rule, view, cost) {
                        return Outcome::Retired;
                    }
                }
            }
            if self.moved() {
                return Outcome::Retired;
            }
        }
        // The state afterwards, as a peek of cost 0 sees it; as the commits saw it if the
        // state was retired since (the units stand: adding them again would count twice).
        match self.check(policy, now, 0, false) {
            Outcome::Decided(decision) => Outcome::Decided(decision),
            Outcome::Expired | Outcome::Retired => Outcome::Decided(KeyState::admitted::<A>(
                policy,
                views.get(..rules.len()).unwrap_or_default(),
                cost,
            )),
        }
    }

    #[inline(always)]
    fn check_with<A: Counter>(&self, policy: &Policy, now: u64, cost: u64, commit: bool) -> Outcome {
        // Whatever a view points to stays valid until the check ends.
        let _pin = A::pin();
        match &policy.rules[..] {
            [rule] => self.check_one::<A>(policy, rule, now, cost, commit),
            _ => self.check_all::<A>(policy, now, cost, commit),
        }
    }

    /// The first step of every check: `touched`, and whether the key is expired at `now`;
    /// or the outcome when this state cannot answer (retired, or expired for a commit).
    #[inline(always)]
    fn begin(&self, policy: &Policy, now: u64, cost: u64, commit: bool) -> Result<(u64, bool), Outcome> {
        // Relaxed: see `retire`; a marker read late is found by `cover`.
        let touched = self.word(TOUCHED).load(Ordering::Relaxed);
        if touched >= MOVED {
            return Err(Outcome::Retired);
        }
        let expired = now.saturating_sub(touched) >= policy.expiry;
        if expired && commit && cost > 0 {
            return Err(Outcome::Expired);
        }
        Ok((touched, expired))
    }

    /// [`check`](Self::check) for a policy of one limit: the same steps as
    /// [`check_all`](Self::check_all) with one view on the stack and nothing to roll back.
    #[inline(always)]
    fn check_one<A: Counter>(
        &self,
        policy: &Policy,
        rule: &Rule,
        now: u64,
        cost: u64,
        commit: bool,
    ) -> Outcome {
        let mut retries = STALE_RETRIES;
        loop {
            let (mut touched, expired) = match self.begin(policy, now, cost, commit) {
                Ok(begun) => begun,
                Err(outcome) => return outcome,
            };
            let view = A::view(self, rule, now, expired);
            if A::retired(&view) {
                return Outcome::Retired;
            }
            if !A::admits(rule, &view, cost) {
                // `decide` for one limit, without its loops: the path of a key under attack.
                let at = match A::admissible_at(self, rule, &view, cost) {
                    Ok(at) => at,
                    Err(_) if retries > 0 => {
                        retries = retries.saturating_sub(1);
                        continue;
                    }
                    Err(later) => later,
                };
                let remaining = A::room(rule, &view, 0);
                return Outcome::Decided(Decision::limited(0, remaining, at.saturating_sub(now)));
            }
            if !commit || cost == 0 {
                return Outcome::Decided(Decision::allowed(A::room(rule, &view, cost), 0));
            }
            if !self.cover::<A>(&mut touched, now, rule, &view, cost) {
                return Outcome::Retired;
            }
            if A::commit(self, rule, &view, cost) {
                // The commit stands, even if the state was retired since (see `retire`),
                // unless it moved to another policy (see `migrate_at`).
                if self.moved() {
                    return Outcome::Retired;
                }
                return Outcome::Decided(Decision::allowed(A::room(rule, &view, cost), 0));
            }
        }
    }

    /// Before a commit from `view` into limit `rule`: makes `touched` cover the slot the
    /// commit counts in (at least the slot's start: that is what makes eviction and
    /// replacement exact, see [`retire`](Self::retire)). `touched` is the check's last
    /// knowledge of it (from `begin`, then from its covers); a slot that starts at or before
    /// it needs nothing, so this changes `touched` once per slot boundary, not per check. A
    /// view may have adopted a slot later than `now`: it is covered too. `false` if the
    /// state was retired or moved first: nothing may be committed into it.
    #[inline(always)]
    fn cover<A: Counter>(&self, touched: &mut u64, now: u64, rule: &Rule, view: &A::View, cost: u64) -> bool {
        let (slot, elapsed) = A::at(rule, view, cost);
        if rule.time_of(slot, 0) <= *touched {
            return true;
        }
        let used = rule.time_of(slot, elapsed).max(now).min(LAST_TIME);
        // Relaxed: `retire` argues from `touched`'s modification order alone; a marker
        // found here is all the check needs to know.
        let before = self.word(TOUCHED).fetch_max(used, Ordering::Relaxed);
        if before >= MOVED {
            return false;
        }
        *touched = before.max(used);
        true
    }

    /// [`check`](Self::check) for several limits: read a view of each, and if all admit,
    /// commit limit by limit, rolling back and starting over if a later limit lost its room
    /// to a racing check meanwhile.
    fn check_all<A: Counter>(&self, policy: &Policy, now: u64, cost: u64, commit: bool) -> Outcome {
        let rules = &policy.rules[..];
        let mut views = [A::View::default(); MAX_LIMITS];
        let mut retries = STALE_RETRIES;
        'attempt: loop {
            let (mut touched, expired) = match self.begin(policy, now, cost, commit) {
                Ok(begun) => begun,
                Err(outcome) => return outcome,
            };
            let mut admits = true;
            for (rule, view) in rules.iter().zip(views.iter_mut()) {
                *view = A::view(self, rule, now, expired);
                if A::retired(view) {
                    return Outcome::Retired;
                }
                admits &= A::admits(rule, view, cost);
            }
            if !admits || !commit || cost == 0 {
                match self.decide::<A>(policy, &views, now, cost, admits, &mut retries) {
                    Some(decision) => return Outcome::Decided(decision),
                    None => continue 'attempt,
                }
            }
            // Every limit's slot covered before the first commit: a retirement found here
            // leaves nothing counted (one found after a lost CAS, below, rolls back).
            for (rule, view) in rules.iter().zip(views.iter()) {
                if !self.cover::<A>(&mut touched, now, rule, view, cost) {
                    return Outcome::Retired;
                }
            }
            for (j, rule) in rules.iter().enumerate() {
                loop {
                    #[allow(
                        clippy::indexing_slicing,
                        reason = "j < rules.len() ≤ MAX_LIMITS, checked at build"
                    )]
                    let view = &mut views[j];
                    if !self.cover::<A>(&mut touched, now, rule, view, cost) {
                        for (done, v) in rules.iter().zip(views.iter()).take(j) {
                            A::rollback(self, done, v, cost);
                        }
                        return Outcome::Retired;
                    }
                    if A::commit(self, rule, view, cost) {
                        break;
                    }
                    *view = A::view(self, rule, now, false);
                    if A::retired(view) || !A::admits(rule, view, cost) {
                        for (done, v) in rules.iter().zip(views.iter()).take(j) {
                            A::rollback(self, done, v, cost);
                        }
                        continue 'attempt;
                    }
                }
            }
            // The commits stand, even if the state was retired since (see `retire`), unless
            // it moved to another policy (see `migrate_at`).
            if self.moved() {
                return Outcome::Retired;
            }
            return Outcome::Decided(KeyState::admitted::<A>(policy, &views, cost));
        }
    }

    /// The decision from the views: admitted (`allowed`), or refused by the limit that frees
    /// up last. `None` if a refusal's wait cannot be answered exactly from these views (see
    /// [`Counter::admissible_at`]) and `retries` are left: the check starts over.
    fn decide<A: Counter>(
        &self,
        policy: &Policy,
        views: &[A::View],
        now: u64,
        cost: u64,
        allowed: bool,
        retries: &mut u32,
    ) -> Option<Decision> {
        if allowed {
            return Some(KeyState::admitted::<A>(policy, views, cost));
        }
        let rules = policy.rules.iter().zip(views.iter());
        let remaining = rules.clone().map(|(rule, view)| A::room(rule, view, 0)).min().unwrap_or(0);
        // The limit that frees up last; the first such on a tie.
        let mut refusing: Option<(usize, u64)> = None;
        for (j, (rule, view)) in rules.enumerate() {
            if !A::admits(rule, view, cost) {
                let at = match A::admissible_at(self, rule, view, cost) {
                    Ok(at) => at,
                    Err(_) if *retries > 0 => {
                        *retries = retries.saturating_sub(1);
                        return None;
                    }
                    Err(later) => later,
                };
                if refusing.map_or(true, |(_, latest)| at > latest) {
                    refusing = Some((j, at));
                }
            }
        }
        let (limit, at) = refusing.unwrap_or((0, now));
        Some(Decision::limited(limit, remaining, at.saturating_sub(now)))
    }

    /// The decision for an admission: the room left in the tightest limit.
    fn admitted<A: Counter>(policy: &Policy, views: &[A::View], cost: u64) -> Decision {
        let (tightest, remaining) = policy
            .rules
            .iter()
            .zip(views.iter())
            .map(|(rule, view)| A::room(rule, view, cost))
            .enumerate()
            .min_by_key(|&(_, room)| room)
            .unwrap_or((0, 0));
        Decision::allowed(remaining, tightest)
    }

    /// Room left for a cost-0 look at `now` (used for refusals that never consult windows).
    pub(crate) fn room(&self, policy: &Policy, now: u64) -> u64 {
        match self.check(policy, now, 0, false) {
            Outcome::Decided(d) => d.remaining(),
            Outcome::Expired | Outcome::Retired => policy.fresh(0).remaining(),
        }
    }
}

#[cfg(test)]
mod tests;
