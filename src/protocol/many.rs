//! [`KeyState::check_many`]: one request charged to several keys' states at once, by the
//! same protocol as several limits of one key (views, one CAS per limit, rollback and retry),
//! over all the states' limits in one global order.

use crate::algorithm::counter::Counter;
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::decision::Decision;
use crate::layout::MAX_LIMITS;

use super::{KeyState, Outcome, MAX_IDENTITIES, STALE_RETRIES};

impl KeyState<'_> {
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
}
