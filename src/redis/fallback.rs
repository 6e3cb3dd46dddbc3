//! What [`RedisLimiter`] does when Redis does not decide: the [`Fallback`] when Redis cannot
//! answer, a refusal when it answers an error that retrying cannot change, and the
//! repayment of what `Fallback::Local` admitted meanwhile.

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::Ordering;

use super::call::{wall_ms, Mode};
use super::owed::{Owed, Take};
use super::reply::{self, Answer};
use super::{Checked, DecidedBy, Fallback, RedisLimiter};
use crate::Decision;

/// Besides its own debt, the most other keys' debts one check repays (one call each), so
/// that the debts of a long outage drain without holding any check up for long.
const OTHERS_PER_CHECK: usize = 4;

/// How one repayment went.
enum Paid {
    /// Redis holds the units.
    Yes,
    /// Redis refused them with an error that retrying cannot change: dropped, counted.
    Dropped,
    /// Redis did not answer: owed again.
    No,
}

impl<K> RedisLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// A check whose key the server refused with an error that retrying cannot change
    /// (`CROSSSLOT`, `WRONGTYPE`, `NOPERM`, an entry error of the module or the script):
    /// refused under every fallback, as `Fallback::Closed` refuses, and counted. The
    /// fallbacks stand in for a server that cannot answer; this one answered, and a key
    /// that can make it fail must not get through on the fallback's terms.
    pub(super) fn refuse_on_server_error(&self) -> Checked {
        // Relaxed: a statistic.
        self.server_errors.fetch_add(1, Ordering::Relaxed);
        let retry = u64::try_from(self.closed_retry.as_nanos()).unwrap_or(u64::MAX);
        Checked::new(Decision::limited(0, 0, retry), DecidedBy::FailClosed)
    }

    /// The fallback's decision: the local limiter's, or [`Fallback::decide`] (the same for
    /// memcached).
    pub(super) fn fall_back(&self, key: &K, redis_key: &str, mode: Mode, cost: u64) -> Checked {
        let too_large = matches!(mode, Mode::Check).then(|| self.remote.too_large(cost)).flatten();
        match (self.fallback, &self.local) {
            (Fallback::Local, Some(local)) => {
                if matches!(mode, Mode::Peek) {
                    return Checked::new(local.peek(key), DecidedBy::Local);
                }
                if cost == 0 || too_large.is_some() {
                    return Checked::new(local.check_n(key, cost), DecidedBy::Local);
                }
                let Ok(mut owed) = self.owed.lock() else {
                    return Checked::new(Decision::too_many_keys(), DecidedBy::Local);
                };
                // A key that would be the ledger's `max_keys + 1`-th is refused rather than
                // admitted without a record (Redis would never learn of it).
                if !owed.has_room_for(redis_key) {
                    return Checked::new(Decision::too_many_keys(), DecidedBy::Local);
                }
                let decision = local.check_n(key, cost);
                if decision.is_allowed() {
                    let at = self.remote.time.now_ms().unwrap_or_else(wall_ms);
                    // Relaxed: a unique number, nothing is published with it.
                    let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
                    owed.owe(redis_key, Owed { cost, at, seq });
                    // Release: a check that sees the flag (Acquire) then finds the debt
                    // under the lock (the lock orders it anyway; the flag only skips it).
                    self.owing.store(true, Ordering::Release);
                }
                Checked::new(decision, DecidedBy::Local)
            }
            (fallback, _) => fallback.decide(too_large, self.closed_retry),
        }
    }

    /// Adds what the local fallback admitted to Redis, once Redis answers: `redis_key`'s
    /// debt first (Redis must hold it before it decides that key), then a few other keys'.
    /// `false` if `redis_key`'s debt could not be added yet (or another call is adding
    /// it), or Redis did not answer.
    pub(super) async fn repay(&self, redis_key: &str) -> bool {
        // Acquire pairs with the Release store after a debt is recorded: a debt recorded
        // before this check began is seen. (One recorded concurrently is repaid later.)
        if !self.owing.load(Ordering::Acquire) {
            return true;
        }
        let (mine, others) = match self.owed.lock() {
            Ok(mut owed) => {
                let mine = owed.take(redis_key);
                let others = owed.take_others(OTHERS_PER_CHECK, redis_key);
                (mine, others)
            }
            Err(_) => return true,
        };
        let mut answered = match mine {
            Take::Nothing => true,
            Take::Busy => false,
            Take::Pay(debt) => self.pay(redis_key, debt).await,
        };
        for (key, debt) in others {
            if answered {
                answered = self.pay(&key, debt).await;
            } else {
                // Once Redis fails to answer, the rest are owed again without a call each.
                self.settle(&key, debt, Paid::No);
            }
        }
        answered
    }

    /// Sends one debt: `true` if Redis answered (it holds the units, or refused them for
    /// good and they are dropped).
    async fn pay(&self, redis_key: &str, debt: Owed) -> bool {
        let reply = self
            .remote
            .call(redis_key, Mode::Add, debt.cost, Some(debt.at), Some((&self.client, debt.seq)))
            .await;
        let paid = match reply::answer(Some(&reply)) {
            Answer::Decided(_) => Paid::Yes,
            Answer::Refused => Paid::Dropped,
            Answer::Unavailable => Paid::No,
        };
        let answered = !matches!(paid, Paid::No);
        self.settle(redis_key, debt, paid);
        answered
    }

    fn settle(&self, redis_key: &str, debt: Owed, paid: Paid) {
        let Ok(mut owed) = self.owed.lock() else { return };
        match paid {
            Paid::Yes => owed.settle(redis_key, debt),
            Paid::Dropped => {
                // Relaxed: a statistic.
                self.dropped_owed.fetch_add(debt.cost, Ordering::Relaxed);
                owed.settle(redis_key, debt);
            }
            Paid::No => owed.restore(redis_key, debt),
        }
        if !owed.is_empty() {
            // Release: pairs with the Acquire load in `repay`, as after a new debt.
            self.owing.store(true, Ordering::Release);
        } else {
            // Relaxed: under the lock; a stale `true` only costs a lock.
            self.owing.store(false, Ordering::Relaxed);
        }
    }

    /// Units the local fallback admitted that Redis has not been told about yet.
    ///
    /// ```no_run
    /// # async fn f(limiter: slidegate::redis::RedisLimiter<u64>) {
    /// assert_eq!(limiter.owed_units(), 0); // Redis has every admission
    /// # }
    /// ```
    pub fn owed_units(&self) -> u64 {
        self.owed.lock().map_or(0, |owed| owed.units())
    }

    /// Keys whose fallback admissions Redis has not been told about yet: at most
    /// [`max_keys`](super::RedisLimiterBuilder::max_keys); while that many owe, the local
    /// fallback refuses other keys (`Denial::TooManyKeys`) rather than admit what it could
    /// not record.
    ///
    /// ```no_run
    /// # async fn f(limiter: slidegate::redis::RedisLimiter<u64>) {
    /// println!("{} keys owe {} units to Redis", limiter.owed_keys(), limiter.owed_units());
    /// # }
    /// ```
    pub fn owed_keys(&self) -> usize {
        self.owed.lock().map_or(0, |owed| owed.keys())
    }

    /// Units the local fallback admitted that Redis refused to add with an error that
    /// retrying cannot change (the key's data in Redis holds another type, or an ACL
    /// refuses it): dropped rather than owed for ever.
    ///
    /// ```no_run
    /// # async fn f(limiter: slidegate::redis::RedisLimiter<u64>) {
    /// assert_eq!(limiter.dropped_owed_units(), 0);
    /// # }
    /// ```
    pub fn dropped_owed_units(&self) -> u64 {
        // Relaxed: a statistic.
        self.dropped_owed.load(Ordering::Relaxed)
    }

    /// Checks refused because Redis answered an error that retrying cannot change, under
    /// every [`Fallback`]: with the key naming of this crate no client key can cause one,
    /// so a count above zero means the data or the server's configuration (an ACL, the
    /// type of a key under the prefix) needs an operator.
    ///
    /// ```no_run
    /// # async fn f(limiter: slidegate::redis::RedisLimiter<u64>) {
    /// if limiter.server_errors() > 0 { eprintln!("Redis refuses some keys: see its log and ACLs"); }
    /// # }
    /// ```
    pub fn server_errors(&self) -> u64 {
        // Relaxed: a statistic.
        self.server_errors.load(Ordering::Relaxed)
    }
}
