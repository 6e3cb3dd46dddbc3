//! The admission protocol, in reading order: a check reads a view of every limit of a key
//! (loads only: a refused request writes nothing), decides, and commits an admission with
//! one compare-and-swap per limit; [`KeyState::check_many`] does the same across several
//! keys. Also the retire protocol that makes eviction and replacement exact, and the move of
//! a key's counts to another policy. What a view is and how a commit writes it is each
//! algorithm's ([`Counter`]: `algorithm/`); how the words are laid out is `layout.rs`.
//!
//! # Several limits
//! A request must fit every limit and is then counted in every limit. The check first
//! reads a view of every limit (loads only: a refused request writes nothing). If all
//! admit, it commits limit by limit with a CAS each; if a CAS loses a race and the limit no
//! longer admits, the limits already committed are rolled back and the check starts over.
//! A rollback that finds its slot already closed leaves the units counted there: the error
//! is conservative (never over-admission) and needs a slot boundary to pass within the
//! nanoseconds between a commit and its rollback.

use std::sync::Arc;

use crate::algorithm::counter::{set, Counter, Rule, Words};
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::decision::Decision;
use crate::layout::{initial_words, Policy, MAX_LIMITS, RETIRED, TOUCHED};

/// `touched` of a state moved to another policy ([`KeyState::migrate_at`]), the other marker
/// beside [`RETIRED`] (eviction, replacement of an expired key, reset): a check that
/// committed into a moved state starts over, one that committed into a retired one stands
/// (see [`KeyState::retire`]). Both are above every time `touched` holds ([`LAST_TIME`]).
pub(crate) const MOVED: u64 = RETIRED - 1;

/// The latest time `touched` holds: a clock saturated at the end of `u64` must not read as
/// a marker.
const LAST_TIME: u64 = MOVED - 1;
use crate::sync::{AtomicU64, Ordering};

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
/// node of the key table, see `table.rs`, or an [`OwnedState`]). Copies share the counters.
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

/// A key's counters on their own: what a policy change or a new key lays out before the
/// key table takes it in (`table.rs` copies the words into the key's node), and what the
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

/// What a policy change does to the counts of a key whose state must be laid out anew
/// (a window, a precision or the number of limits changed). A change of `max` alone always
/// carries the counts over exactly, whatever this says. See [`Limiter::update_policy`](crate::Limiter::update_policy).
///
/// ```
/// use slidegate::{Carry, Limit, Limiter, PolicyConfig};
/// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(10)).build()?;
/// let _ = limiter.check_n(&1, 6);
/// let per_minute = PolicyConfig::new([Limit::per_minute(100)]);
/// limiter.update_policy("default", per_minute, Carry::Conservative)?;
/// assert_eq!(limiter.peek(&1).remaining(), 93); // the 6 used carried over
/// limiter.update_policy("default", PolicyConfig::new([Limit::per_hour(100)]), Carry::Reset)?;
/// assert_eq!(limiter.peek(&1).remaining(), 99); // a new window, started empty
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carry {
    /// Each new limit starts with the units the old limits counted over a window at least
    /// as long as its own (the fewest such, as the tightest known bound), or, when every
    /// old window is shorter, the most any old limit counted: everything the key is known
    /// to have used, recorded as used now. It can refuse more than an exact count would
    /// (the units age out over the new window from now), never admit more than what was
    /// recorded allows. Units older than every old window were never kept and cannot count.
    #[default]
    Conservative,
    /// Every window starts empty.
    Reset,
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
    /// the key absent or replaced decides at `now` or later (the shard's floor, `table.rs`),
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
    #[inline]
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

    /// Checks `cost` against several keys' states at once (distinct states, at most
    /// [`MAX_IDENTITIES`]): admitted only if every limit of every state has room, and then
    /// counted in all of them; a refusal counts in none. The same protocol as several limits
    /// of one key (views, one CAS per limit, rollback and retry when a racing check took the
    /// room), over all the states' limits in order; no lock is taken, so no order of keys
    /// can deadlock. Returns, with the outcome, the index of the state the decision's
    /// `remaining` / denial is about. `Retired` if any state was retired under the check
    /// (whatever it counted elsewhere has been taken back): look the keys up again.
    pub fn check_many(states: &[KeyState], now: u64, cost: u64) -> (Outcome, usize) {
        let states = states.get(..MAX_IDENTITIES).unwrap_or(states);
        let Some(first) = states.first() else { return (Outcome::Retired, 0) };
        // Every check commits the states in one global order (by address), as a single key
        // commits its limits in one order: two requests charging the same keys in opposite
        // orders then contend for the same first key, and the loser takes nothing, instead
        // of each holding one key and refusing for want of the other.
        let mut order = [(0usize, first); MAX_IDENTITIES];
        for (slot, (i, state)) in order.iter_mut().zip(states.iter().enumerate()) {
            *slot = (i, state);
        }
        let order = order.get_mut(..states.len()).unwrap_or_default();
        order.sort_unstable_by_key(|&(_, state)| state.words.all().as_ptr() as usize);
        let (mut sorted, mut rank) = ([first; MAX_IDENTITIES], [0usize; MAX_IDENTITIES]);
        for ((slot, r), &(i, state)) in sorted.iter_mut().zip(rank.iter_mut()).zip(order.iter()) {
            (*slot, *r) = (state, i);
        }
        let sorted = sorted.get(..order.len()).unwrap_or_default();
        let rank = rank.get(..order.len()).unwrap_or_default();
        // One algorithm per limiter: every state's policy runs the first one's.
        let (outcome, s) = match first.policy.algorithm {
            Algorithm::SlidingWindow => KeyState::check_many_with::<Sliding>(sorted, rank, now, cost),
            Algorithm::FixedWindow => KeyState::check_many_with::<Fixed>(sorted, rank, now, cost),
            Algorithm::SlidingLog => KeyState::check_many_with::<Log>(sorted, rank, now, cost),
            Algorithm::Gcra => KeyState::check_many_with::<Gcra>(sorted, rank, now, cost),
        };
        (outcome, rank.get(s).or(rank.last()).copied().unwrap_or(0))
    }

    /// `rank[s]`: state `s`'s position in the caller's order, which breaks ties. State `s`'s
    /// views are the `s`-th chunk of `MAX_LIMITS` views (each state has its own policy).
    fn check_many_with<A: Counter>(
        states: &[&KeyState],
        rank: &[usize],
        now: u64,
        cost: u64,
    ) -> (Outcome, usize) {
        let _pin = A::pin();
        let states = states.get(..MAX_IDENTITIES).unwrap_or(states);
        let mut views = [A::View::default(); MAX_IDENTITIES * MAX_LIMITS];
        let mut touched = [0u64; MAX_IDENTITIES];
        let mut retries = STALE_RETRIES;
        'attempt: loop {
            let mut admits = true;
            let each = states.iter().zip(views.chunks_exact_mut(MAX_LIMITS)).zip(touched.iter_mut());
            for (s, ((state, views), touched)) in each.enumerate() {
                let (at, expired) = match state.begin(state.policy, now, cost, true) {
                    Ok(begun) => begun,
                    Err(outcome) => return (outcome, s),
                };
                *touched = at;
                for (rule, view) in state.policy.rules.iter().zip(views.iter_mut()) {
                    *view = A::view(state, rule, now, expired);
                    if A::retired(view) {
                        return (Outcome::Retired, s);
                    }
                    admits &= A::admits(rule, view, cost);
                }
            }
            if !admits || cost == 0 {
                match KeyState::decide_many::<A>(states, rank, &views, now, cost, admits, &mut retries) {
                    Some(decided) => return decided,
                    None => continue 'attempt,
                }
            }
            // The limit (state, index) that lost its room to a racing check, if any, and
            // whether its state was retired (then the keys are looked up again).
            let mut lost = None;
            // Every slot covered before the first commit, as in `check_all`.
            let each = states.iter().zip(views.chunks_exact(MAX_LIMITS)).zip(touched.iter_mut());
            for (s, ((state, views), touched)) in each.enumerate() {
                for (rule, view) in state.policy.rules.iter().zip(views) {
                    if !state.cover::<A>(touched, now, rule, view, cost) {
                        return (Outcome::Retired, s);
                    }
                }
            }
            let each = states.iter().zip(views.chunks_exact_mut(MAX_LIMITS)).zip(touched.iter_mut());
            'commit: for (s, ((state, views), touched)) in each.enumerate() {
                for (j, (rule, view)) in state.policy.rules.iter().zip(views.iter_mut()).enumerate() {
                    loop {
                        if !state.cover::<A>(touched, now, rule, view, cost) {
                            lost = Some(((s, j), true));
                            break 'commit;
                        }
                        if A::commit(state, rule, view, cost) {
                            break;
                        }
                        *view = A::view(state, rule, now, false);
                        if A::retired(view) || !A::admits(rule, view, cost) {
                            lost = Some(((s, j), A::retired(view)));
                            break 'commit;
                        }
                    }
                }
            }
            if let Some((until, retired)) = lost {
                KeyState::roll_back::<A>(states, &views, until, cost, None);
                if retired {
                    return (Outcome::Retired, until.0);
                }
                continue 'attempt;
            }
            if let Some(moved) = states.iter().position(|state| state.moved()) {
                // The moved state's units went with it, or start over; the others' must not
                // stay counted.
                KeyState::roll_back::<A>(states, &views, (states.len(), 0), cost, Some(moved));
                return (Outcome::Retired, moved);
            }
            // Admitted: no wait to compute, so always `Some`. (The units are counted: starting
            // over would count them twice, so the unreachable fallback admits with no room.)
            return KeyState::decide_many::<A>(states, rank, &views, now, cost, true, &mut 0)
                .unwrap_or((Outcome::Decided(Decision::allowed(0, 0)), 0));
        }
    }

    /// Takes back the commits made before limit `until.1` of state `until.0` (in
    /// state-major order), except in state `skip`.
    fn roll_back<A: Counter>(
        states: &[&KeyState],
        views: &[A::View],
        until: (usize, usize),
        cost: u64,
        skip: Option<usize>,
    ) {
        let each = states.iter().zip(views.chunks_exact(MAX_LIMITS)).enumerate();
        for (s, (state, views)) in each.take_while(|&(s, _)| s <= until.0) {
            let rules = &state.policy.rules;
            let done = if s == until.0 { until.1 } else { rules.len() };
            for (rule, view) in rules.iter().zip(views).take(done) {
                if Some(s) != skip {
                    A::rollback(state, rule, view, cost);
                }
            }
        }
    }

    /// The decision over several states: the tightest state's when admitted, the state
    /// that frees up last when refused.
    fn decide_many<A: Counter>(
        states: &[&KeyState],
        rank: &[usize],
        views: &[A::View],
        now: u64,
        cost: u64,
        allowed: bool,
        retries: &mut u32,
    ) -> Option<(Outcome, usize)> {
        let mut decision = |state: &KeyState, views: &[A::View]| {
            let policy = &state.policy;
            let admits = policy.rules.iter().zip(views).all(|(r, v)| A::admits(r, v, cost));
            let d = state.decide::<A>(policy, views, now, cost, allowed || admits, retries)?;
            // A refusal reports the room before any cost, as for several limits of one key.
            let room = if allowed || !admits {
                d.remaining()
            } else {
                KeyState::admitted::<A>(policy, views, 0).remaining()
            };
            Some((d, room))
        };
        // The chosen state, its rank and its decision.
        let mut best: Option<(usize, usize, Decision)> = None;
        let mut least = u64::MAX;
        let each = states.iter().zip(views.chunks_exact(MAX_LIMITS)).zip(rank);
        for (s, ((state, views), &r)) in each.enumerate() {
            let (d, room) = decision(state, views)?;
            least = least.min(room);
            let better = match best {
                None => allowed || !d.is_allowed(),
                // Admitted: the state with the least room. Refused: the refusing state that
                // frees up last. Ties go to the first in the caller's order.
                Some((_, t, b)) if allowed => (d.remaining(), r) < (b.remaining(), t),
                Some((_, t, b)) => {
                    let later =
                        (d.retry_after(), std::cmp::Reverse(r)) > (b.retry_after(), std::cmp::Reverse(t));
                    !d.is_allowed() && (b.is_allowed() || later)
                }
            };
            if better {
                best = Some((s, r, d));
            }
        }
        Some(match best {
            Some((s, _, d)) if allowed => (Outcome::Decided(d), s),
            // A refusal reports the least room of any state, as several limits do.
            Some((s, _, d)) => (Outcome::Decided(d.with_remaining(least)), s),
            None => (
                states.first().map_or(Outcome::Retired, |state| Outcome::Decided(state.policy.fresh(cost))),
                0,
            ),
        })
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
            let admits = A::admits(rule, &view, cost);
            if !admits || !commit || cost == 0 {
                // `from_ref`, not `&[view]`: a copy of the view just written stalls on its stores.
                match self.decide::<A>(policy, std::slice::from_ref(&view), now, cost, admits, &mut retries) {
                    Some(decision) => return Outcome::Decided(decision),
                    None => continue,
                }
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
