//! The Redis side of a hybrid sync: the keys a sync took, pushed (or pulled: a push of 0
//! units) in calls of at most [`KEYS_PER_CALL`] keys.
//!
//! On a standalone server a call is one script call for all its keys (one round trip). On
//! a Cluster, whose keys live on different nodes (a script call may only touch one slot),
//! each key is its own call, and a call's keys are sent together. A call that fails with a
//! transient error (no connection, a timeout, a server loading or busy, or refusing writes
//! for now: out of memory under `noeviction`, a replica after a failover, too few replicas,
//! a failed save) ends the sync: its keys and the rest keep their units and wait for the
//! next one. Only an error retrying cannot change drops a key's units (counted) and
//! forgets the key: the script's entry error for a `:book` of another type (or a total
//! that would overflow), which fails that key alone, or a call that fails with such an error,
//! which is split into one call per key so that one poisoned key never holds back the keys it
//! shares a call with.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use ::redis::{RedisError, RedisResult};
use tokio::task::JoinSet;

use super::book::{Book, Heard, Pick};
use crate::redis::call::{Conn, Entry, Mode, Remote};
use crate::redis::reply;
use crate::{Denial, Limit, Limiter};

/// The most keys in one call.
pub(super) const KEYS_PER_CALL: usize = 128;

/// The least time a sync's call is given: a sync runs in the background, and a push whose
/// reply comes too late is pushed again (and may be counted twice).
const LEAST_TIMEOUT: Duration = Duration::from_millis(100);

/// What Redis answered for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The key's total after the push, and the most units any limit's window in Redis holds
    /// for it (this push's included).
    Pushed { total: u64, used: u64 },
    /// No answer: try again at the next sync.
    Retry,
    /// An error retrying cannot change.
    Refused,
}

/// Pushes and pulls `picks`, giving each back to `book` (and recording the other replicas'
/// units into `local`). Returns the calls made and the units dropped.
pub(super) async fn run<K>(
    remote: &Arc<Remote>,
    local: &Limiter<K>,
    book: &mut Book<K>,
    picks: Vec<Pick>,
) -> (usize, u64)
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    let (mut calls, mut dropped, mut stop) = (0usize, 0u64, false);
    for chunk in picks.chunks(KEYS_PER_CALL) {
        if stop {
            chunk.iter().for_each(|p| book.put_back(p.id));
            continue;
        }
        let keys: Vec<String> =
            chunk.iter().map(|p| book.key(p.id).map_or_else(String::new, |k| remote.key(k))).collect();
        let (outcomes, made) = push(remote, &keys, chunk).await;
        calls = calls.saturating_add(made);
        for (&pick, outcome) in chunk.iter().zip(outcomes) {
            match outcome {
                Outcome::Pushed { total, used } => {
                    book.synced(pick, total, |key, heard| {
                        let others = match heard {
                            Heard::Since(others) => others,
                            Heard::First { unpushed } => first_sight(local, key, used, unpushed),
                        };
                        if others > 0 {
                            let _ = local.record(key, others);
                        }
                        // A key at its limit here: its pulls do not back off (see `Book`).
                        (others, matches!(local.peek(key).denial(), Some(Denial::Limit(_))))
                    });
                }
                Outcome::Retry => {
                    stop = true;
                    book.put_back(pick.id);
                }
                Outcome::Refused => dropped = dropped.saturating_add(book.remove(pick.id)),
            }
        }
    }
    (calls, dropped)
}

/// One call's worth: `keys[i]` is `picks[i]`'s Redis key. Returns each key's outcome and
/// the calls made.
async fn push(remote: &Arc<Remote>, keys: &[String], picks: &[Pick]) -> (Vec<Outcome>, usize) {
    if matches!(remote.conn, Conn::Cluster(_)) {
        return alone(remote, keys, picks).await;
    }
    let entries: Vec<Entry<'_>> = keys
        .iter()
        .zip(picks)
        .map(|(k, p)| Entry { redis_key: k, mode: Mode::Push, cost: p.units })
        .collect();
    match call(remote, &entries).await {
        Ok(replies) if replies.len() == picks.len().saturating_mul(5) => {
            (replies.chunks(5).map(outcome).collect(), 1)
        }
        Ok(_) => (vec![Outcome::Retry; picks.len()], 1),
        Err(e) if reply::is_transient(&e) => (vec![Outcome::Retry; picks.len()], 1),
        Err(_) if picks.len() > 1 => {
            let (outcomes, calls) = alone(remote, keys, picks).await;
            (outcomes, calls.saturating_add(1))
        }
        Err(_) => (vec![Outcome::Refused], 1),
    }
}

/// Each key its own call, all sent together.
async fn alone(remote: &Arc<Remote>, keys: &[String], picks: &[Pick]) -> (Vec<Outcome>, usize) {
    let mut calls = JoinSet::new();
    for (i, (key, pick)) in keys.iter().zip(picks).enumerate() {
        let (remote, key, units) = (Arc::clone(remote), key.clone(), pick.units);
        calls.spawn(async move {
            let entry = [Entry { redis_key: &key, mode: Mode::Push, cost: units }];
            let result = call(&remote, &entry).await;
            let outcome = match result {
                Ok(replies) if replies.len() == 5 => outcome(&replies),
                Ok(_) => Outcome::Retry,
                Err(e) if reply::is_transient(&e) => Outcome::Retry,
                Err(_) => Outcome::Refused,
            };
            (i, outcome)
        });
    }
    let mut outcomes = vec![Outcome::Retry; picks.len()];
    while let Some(done) = calls.join_next().await {
        if let Some((place, outcome)) = done.ok().and_then(|(i, o)| Some((outcomes.get_mut(i)?, o))) {
            *place = outcome;
        }
    }
    (outcomes, picks.len())
}

/// What a replica's first sync of `key` records: what the key's windows in Redis hold
/// beyond what this replica's view already holds.
///
/// Redis's total (`n`) counts every unit pushed since the key's bookkeeping last expired,
/// which a key in steady use never lets happen: taken as the others' units, it refused a key
/// busy elsewhere for a whole window on a replica that saw it anew (a restart, the key idle
/// here for the TTL, or evicted at `max_keys`, which a spray of new keys causes at will),
/// however little the window held. Taking nothing would let that replica admit up to `max`
/// more than the window leaves. Pushes also count their units in the key's sliding windows
/// (the ones `RedisLimiter` keeps), and `used` is the most units any of them holds, this
/// push's included: recording `used + unpushed − held` (`held`: what the view holds in its
/// tightest limit, the replica's own units and, after an eviction, what it had heard) makes
/// the view as full as Redis's window plus this replica's units Redis has not been told of.
/// The replica then admits what the fleet's window leaves, and is refused only when it is
/// full: the documented bound holds as for any later sync. Exact with one limit; with several
/// the fullest window in Redis is set against the view's tightest limit, which can hold a
/// shorter limit full here for one of its windows (its units are older than that window).
fn first_sight<K>(local: &Limiter<K>, key: &K, used: u64, unpushed: u64) -> u64
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    let view = local.peek(key);
    let held = match view.denial() {
        // The room after one more unit, and the room of a view already full.
        None | Some(Denial::Limit(_)) => {
            let room = view.remaining().saturating_add(u64::from(view.is_allowed()));
            local.limits().get(view.tightest_limit()).map_or(0, Limit::max).saturating_sub(room)
        }
        // Not held here (swept since it was admitted): the view holds nothing.
        Some(_) => 0,
    };
    used.saturating_add(unpushed).saturating_sub(held)
}

/// The script's push reply for one key, `{n, now_ms, used, 1, 0}`: `n` is the key's total,
/// `used` the most units a limit's window holds for it. Its entry error, `{3, code, 0, 0,
/// now_ms}` (a `:book` of another type), refuses that key alone; the fourth field tells the
/// two apart. A reply of any other shape is retried.
fn outcome(reply: &[i64]) -> Outcome {
    match *reply {
        [total, _, used, 1, 0] => match (u64::try_from(total), u64::try_from(used)) {
            (Ok(total), Ok(used)) => Outcome::Pushed { total, used },
            _ => Outcome::Retry,
        },
        [3, 1..=4, 0, 0, _] => Outcome::Refused,
        _ => Outcome::Retry,
    }
}

/// Runs `entries` through the script, within the limiter's timeout or [`LEAST_TIMEOUT`], on
/// the limiter's time (the server's unless a caller clock is given, as for its checks).
async fn call(remote: &Remote, entries: &[Entry<'_>]) -> RedisResult<Vec<i64>> {
    let limits = remote.limit_args.len() / 4;
    let now = remote.time.now_ms().map_or(String::new(), |ms| ms.to_string());
    let run = remote.script_call(entries, &now, limits, None);
    match tokio::time::timeout(remote.timeout.max(LEAST_TIMEOUT), run).await {
        Ok(result) => result,
        Err(_) => {
            Err(RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "redis sync timed out")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_replies_give_totals_and_odd_ones_are_retried() {
        assert_eq!(outcome(&[42, 1_000, 7, 1, 0]), Outcome::Pushed { total: 42, used: 7 });
        assert_eq!(outcome(&[0, 0, 0, 1, 0]), Outcome::Pushed { total: 0, used: 0 });
        assert_eq!(outcome(&[3, 3, 0, 1, 0]), Outcome::Pushed { total: 3, used: 0 });
        assert_eq!(outcome(&[-1, 1_000, 0, 1, 0]), Outcome::Retry);
        assert_eq!(outcome(&[5, 1_000, -1, 1, 0]), Outcome::Retry);
        assert_eq!(outcome(&[3, 3, 0, 0, 1_000]), Outcome::Refused);
        assert_eq!(outcome(&[3, 3, 0, 0, 0]), Outcome::Refused, "an entry error on a caller clock at 0");
        assert_eq!(outcome(&[42, 1_000, 0, 0, 0]), Outcome::Retry, "the old push reply");
        assert_eq!(outcome(&[9, 2, 0, 0, 1_000]), Outcome::Retry);
        assert_eq!(outcome(&[1, 2]), Outcome::Retry);
    }
}
