//! A key's counts as a snapshot records them and a load lays them back out: what each
//! limit counts, by when it was counted ([`KeyState::history`]), a fresh state that counts
//! the same ([`KeyState::replay`]), and the merge of loaded counts into a held key
//! ([`KeyState::merge_at`]). `limiter/persist.rs` runs them over the table; `snapshot.rs`
//! (feature `serde`) writes and reads the file.

use std::sync::Arc;

use crate::algorithm::counter::{set, Counter};
use crate::algorithm::{Algorithm, Fixed, Gcra, Log, Sliding};
use crate::layout::{fill_initial, Policy, TOUCHED};
use crate::sync::{AtomicU64, Ordering};

use super::{KeyState, OwnedState, LAST_TIME, MOVED};

/// Per limit of a policy (in its order), `(time, units)` pairs, oldest first.
pub(crate) type History = Vec<Vec<(u64, u64)>>;

/// How many times [`KeyState::history`] reads again when checks move the key on while it
/// reads; after that it records what each limit counts at its time, timed then
/// (conservative: the units then leave the window no earlier than they would have).
const HISTORY_RETRIES: u32 = 8;

impl KeyState<'_> {
    /// What each limit counts at `now`, by when (`Counter::history`), or `None` if the state
    /// was retired or moved (its key is elsewhere in the table, or gone). An empty history
    /// for an expired key.
    ///
    /// Each limit is read as of one moment: its commit word with Acquire (as a check's view
    /// reads it), then what that word's last move wrote before it; a read that meets a ring
    /// word already a lap further (a check moved the limit on meanwhile) starts over. A check
    /// that commits while the key is read may be seen in some of its limits and not others,
    /// as a peek at that moment may see it: a save runs while checks go on.
    pub(crate) fn history(&self, now: u64) -> Option<History> {
        match self.policy.algorithm {
            Algorithm::SlidingWindow => self.history_with::<Sliding>(now),
            Algorithm::FixedWindow => self.history_with::<Fixed>(now),
            Algorithm::SlidingLog => self.history_with::<Log>(now),
            Algorithm::Gcra => self.history_with::<Gcra>(now),
        }
    }

    fn history_with<A: Counter>(&self, now: u64) -> Option<History> {
        let _pin = A::pin();
        let rules = &self.policy.rules[..];
        for _ in 0..HISTORY_RETRIES {
            // Relaxed: a marker or a time, read as a check's `begin` reads it.
            let touched = self.touched();
            if touched >= MOVED {
                return None;
            }
            if now.saturating_sub(touched) >= self.policy.expiry {
                return Some(vec![Vec::new(); rules.len()]);
            }
            let mut history: History = vec![Vec::new(); rules.len()];
            if rules.iter().zip(history.iter_mut()).all(|(rule, out)| A::history(self, rule, now, out)) {
                return Some(history);
            }
        }
        // Checks keep moving the key on: each limit's units at `now`, as a check counts them.
        let used = rules.iter().map(|rule| A::used(rule, &A::view(self, rule, now, false)));
        Some(used.map(|units| if units > 0 { vec![(now, units)] } else { Vec::new() }).collect())
    }

    /// Counts `history` (per limit of this state's policy, oldest first, each time at
    /// least the state's creation) into this state, as checks at those times would have
    /// without checking: a state no other thread can see yet (an `OwnedState`).
    pub(crate) fn replay(&self, history: &[Vec<(u64, u64)>]) {
        match self.policy.algorithm {
            Algorithm::SlidingWindow => self.replay_with::<Sliding>(history),
            Algorithm::FixedWindow => self.replay_with::<Fixed>(history),
            Algorithm::SlidingLog => self.replay_with::<Log>(history),
            Algorithm::Gcra => self.replay_with::<Gcra>(history),
        }
    }

    fn replay_with<A: Counter>(&self, history: &[Vec<(u64, u64)>]) {
        let _pin = A::pin();
        let mut touched = self.touched();
        if self.policy.algorithm == Algorithm::SlidingLog {
            // One snapshot per limit: a commit per entry would copy the log each time (a
            // stream of many entries of many units would allocate quadratically).
            for (rule, entries) in self.policy.rules.iter().zip(history) {
                if let Some(newest) = Log::lay_out(self, rule, entries) {
                    let view = Log::view(self, rule, newest, false);
                    let _ = self.cover::<Log>(&mut touched, newest, rule, &view, 1);
                }
            }
            return;
        }
        for (rule, entries) in self.policy.rules.iter().zip(history) {
            for &(at, units) in entries {
                let cost = units.min(A::MOST);
                if cost == 0 {
                    continue;
                }
                let view = A::view(self, rule, at, false);
                // Unshared: nothing can fail; a failure would only drop loaded units.
                if self.cover::<A>(&mut touched, at, rule, &view, cost) {
                    let _ = A::commit(self, rule, &view, cost);
                }
            }
        }
    }

    /// The state that replaces this one when loaded counts (`loaded`, per limit of this
    /// state's policy, times on this limiter's clock) are merged into its key, called under
    /// the key table's shard lock with this state in the table and laid out for `policy`
    /// (its own version): this state's counts, read as [`migrate_at`](Self::migrate_at)
    /// reads them (marked [`MOVED`] first, so that a check whose commit the reads miss
    /// starts over on the new state: the same exactness argument, which this shares
    /// word for word), plus the loaded ones, each in its own slot. Returned with the time
    /// `clock` reads after the reads, as a move is.
    ///
    /// `_pinned`: the caller holds a grace-period pin across the call, from before the state
    /// was found: a sliding log's words read here point to entries that a racing commit may
    /// replace and defer for freeing, and only a pin held since before that read keeps them
    /// alive while the history reads them (its own pin comes after the read).
    pub(crate) fn merge_at(
        &self,
        policy: &Arc<Policy>,
        loaded: &[Vec<(u64, u64)>],
        clock: impl FnOnce() -> u64,
        _pinned: &crate::grace::Guard,
    ) -> (OwnedState, u64) {
        // Relaxed, then AcqRel: as in `migrate_at` (see there).
        let touched = self.word(TOUCHED).swap(MOVED, Ordering::Relaxed);
        let words: Vec<u64> = if touched < MOVED {
            self.words.all().iter().map(|w| w.fetch_add(0, Ordering::AcqRel)).collect()
        } else {
            Vec::new()
        };
        let now = clock();
        let mut merged: History = vec![Vec::new(); policy.rules.len()];
        if touched < MOVED {
            // A copy no other thread sees, at the time it was last used (a sliding log's
            // copy shares this state's entries: alive under the caller's pin, released
            // below once read).
            let mut copy = words;
            set(&mut copy, TOUCHED, touched);
            let copy = OwnedState::from_words(policy, &copy);
            merged = copy.state().history(now).unwrap_or(merged);
        }
        for (into, from) in merged.iter_mut().zip(loaded) {
            into.extend_from_slice(from);
            // The open slot's units are timed at its end: counted again at `now`, in the same slot.
            for entry in into.iter_mut() {
                entry.0 = entry.0.min(now);
            }
            into.sort_by_key(|&(at, _)| at);
        }
        let fresh = replayed(policy, &merged, touched.min(now));
        self.release(self.policy);
        (fresh, now)
    }
}

/// A fresh state of `policy` counting `history` (per limit, oldest first), idle since
/// `since` at the latest (a key's last use, kept across a merge: a merge is not a use).
pub(crate) fn replayed(policy: &Arc<Policy>, history: &[Vec<(u64, u64)>], since: u64) -> OwnedState {
    let owned = OwnedState::new(policy, start(history, since));
    owned.state().replay(history);
    owned
}

/// [`replayed`]'s words written into `out` (`words_per_key` long): a loaded key's state,
/// laid out before the key table takes it in. On the stack for layouts of up to 32 words.
pub(crate) fn replay_into(policy: &Policy, history: &[Vec<(u64, u64)>], since: u64, out: &mut [u64]) {
    fill_initial(policy, start(history, since), out);
    // Every atomic created with its value (see `OwnedState::from_words`).
    let stack: [AtomicU64; 32];
    let heap: Vec<AtomicU64>;
    let words: &[AtomicU64] = if out.len() <= 32 {
        stack = std::array::from_fn(|i| AtomicU64::new(out.get(i).copied().unwrap_or(0)));
        stack.get(..out.len()).unwrap_or_default()
    } else {
        heap = out.iter().map(|&w| AtomicU64::new(w)).collect();
        &heap
    };
    KeyState::from_parts(words, policy).replay(history);
    for (into, word) in out.iter_mut().zip(words) {
        // Relaxed: unshared.
        *into = word.load(Ordering::Relaxed);
    }
}

/// The time a replayed state starts at: its first entry, or `since` if that is earlier.
fn start(history: &[Vec<(u64, u64)>], since: u64) -> u64 {
    let first = history.iter().filter_map(|entries| entries.first()).map(|&(at, _)| at).min();
    first.unwrap_or(since).min(since).min(LAST_TIME)
}
