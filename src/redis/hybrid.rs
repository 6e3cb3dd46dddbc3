//! [`HybridLimiter`]: local-first admission, synced with Redis in the background.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use super::{Mode, Remote};
use crate::{Decision, Limiter};

/// Local-first limiting across replicas (feature `redis`; built with
/// [`RedisLimiterBuilder::build_hybrid`](super::RedisLimiterBuilder::build_hybrid)).
///
/// Each replica admits from its own in-process [`Limiter`] (the same lock-free check, no
/// network on the request path) and remembers what it admitted in a lock-free queue. Every
/// `sync_interval` (default 50 ms), or as soon as `batch` units are pending, a background
/// task adds the replica's admitted units to the key's total in Redis and reads back what
/// the other replicas added since the last sync, which it [`record`](Limiter::record)s into
/// the local limiter: each replica's windows then hold every replica's units, up to one
/// sync interval late.
///
/// **The bound.** Between two syncs a replica does not see the others' admissions, so
/// across `R` replicas a key can get, in any window, `max` plus what the other replicas
/// admitted in the sync interval they had not yet heard of: at most `(R − 1) × r × sync`
/// extra units when each replica admits at a rate `r`, and at most `(R − 1) × max` when the
/// key is new everywhere and bursts on all replicas at once (nobody has heard of anybody).
/// Units arrive at the other replicas at sync time rather than at their admission time, so
/// they also leave those windows up to one interval late (conservative). A push whose reply
/// is lost (a timeout) is pushed again with the next sync, so Redis may count it twice
/// (conservative too).
pub struct HybridLimiter<K> {
    shared: Arc<Shared<K>>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared<K> {
    local: Limiter<K>,
    remote: Arc<Remote>,
    queue: SegQueue<(K, u64)>,
    pending: AtomicU64,
    /// Per key this replica has seen: the Redis total after its last sync, and when it last
    /// admitted the key.
    known: tokio::sync::Mutex<HashMap<K, (u64, Instant)>>,
    /// Keys idle locally for this long are no longer synced.
    forget_after: Duration,
}

impl<K> fmt::Debug for HybridLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridLimiter")
            .field("pending", &self.shared.pending.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K> Drop for HybridLimiter<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> HybridLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    pub(super) fn start(local: Limiter<K>, remote: Arc<Remote>, interval: Duration, batch: u64) -> Self {
        let forget_after = Duration::from_millis(remote.ttl_ms);
        let shared = Arc::new(Shared {
            local,
            remote,
            queue: SegQueue::new(),
            pending: AtomicU64::new(0),
            known: tokio::sync::Mutex::new(HashMap::new()),
            forget_after,
        });
        let syncing = Arc::clone(&shared);
        let tick = interval.min(Duration::from_millis(5)).max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                // Relaxed: a hint for when to sync; the queue carries the units.
                if last.elapsed() >= interval || syncing.pending.load(Ordering::Relaxed) >= batch {
                    syncing.sync().await;
                    last = Instant::now();
                }
            }
        });
        HybridLimiter { shared, task }
    }

    /// Checks a request of cost 1, locally.
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Checks a request weighing `cost` units against the local limiter (lock-free, no
    /// network); an admission is queued for the next sync.
    pub fn check_n(&self, key: &K, cost: u64) -> Decision {
        let decision = self.shared.local.check_n(key, cost);
        if decision.is_allowed() && cost > 0 {
            self.shared.queue.push((key.clone(), cost));
            // Relaxed: a counter that only triggers early syncs.
            self.shared.pending.fetch_add(cost, Ordering::Relaxed);
        }
        decision
    }

    /// Syncs now (the background task also does, every `sync_interval`).
    pub async fn sync_now(&self) {
        self.shared.sync().await;
    }

    /// The local limiter (its windows hold this replica's units and the others' as of the
    /// last sync).
    pub fn local(&self) -> &Limiter<K> {
        &self.shared.local
    }
}

impl<K> Shared<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    async fn sync(&self) {
        let mut known = self.known.lock().await;
        let mut own: HashMap<K, u64> = HashMap::new();
        while let Some((key, cost)) = self.queue.pop() {
            self.pending.fetch_sub(cost, Ordering::Relaxed);
            let units = own.entry(key).or_default();
            *units = units.saturating_add(cost);
        }
        let now = Instant::now();
        known.retain(|key, (_, active)| {
            own.contains_key(key) || now.duration_since(*active) < self.forget_after
        });
        let keys: Vec<K> =
            known.keys().cloned().chain(own.keys().filter(|k| !known.contains_key(*k)).cloned()).collect();
        for key in keys {
            let mine = own.get(&key).copied().unwrap_or(0);
            let reply = self.remote.call(&self.remote.key(&key), Mode::Push, mine, None, None).await;
            let Some(total) = reply.ok().and_then(|r| r.first().copied()).and_then(|t| u64::try_from(t).ok())
            else {
                // Redis did not take them: they go out with the next sync.
                if mine > 0 {
                    self.queue.push((key, mine));
                    self.pending.fetch_add(mine, Ordering::Relaxed);
                }
                continue;
            };
            let others = match known.get(&key) {
                Some(&(before, _)) => total.saturating_sub(before.saturating_add(mine)),
                // First sync of this key here: whatever Redis had came from elsewhere.
                None => total.saturating_sub(mine),
            };
            if others > 0 {
                let _ = self.local.record(&key, others);
            }
            let active = if mine > 0 { now } else { known.get(&key).map_or(now, |&(_, a)| a) };
            known.insert(key, (total, active));
        }
    }
}
