//! [`HybridLimiter`]: local-first admission, synced with Redis in the background.

mod book;
mod exchange;

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use super::call::Remote;
use super::RedisLimiterBuilder;
use crate::{Decision, Limiter};
use book::Book;

/// The default of [`RedisLimiterBuilder::sync_keys`]: the most keys a hybrid replica
/// pushes or pulls per `sync_interval`.
///
/// ```
/// assert_eq!(slidegate::redis::DEFAULT_SYNC_KEYS, 1024);
/// ```
pub const DEFAULT_SYNC_KEYS: usize = 1024;

/// Local-first limiting across replicas (feature `redis`; built with
/// [`RedisLimiterBuilder::build_hybrid`](super::RedisLimiterBuilder::build_hybrid)).
///
/// Each replica admits from its own in-process [`Limiter`] (the same lock-free check, no
/// network on the request path) and remembers what it admitted in a lock-free queue. Every
/// `sync_interval` (default 50 ms), or as soon as `batch` units are pending, a background
/// task adds the replica's admitted units to the key's total in Redis (and to the key's
/// sliding windows there, the ones [`RedisLimiter`](super::RedisLimiter) keeps) and reads
/// back what the other replicas added since the last sync, which it
/// [`record`](Limiter::record)s into the local limiter: each replica's windows then hold
/// every replica's units, up to one sync interval late. A replica's first sync of a key (a
/// key new to it, idle for the TTL, or evicted at `max_keys`, or a restart) records what
/// the key's windows in Redis hold beyond what its own view holds, not Redis's running
/// total: it admits what the fleet's window leaves, and is refused only once that is full
/// (exact with one limit; with several, Redis's fullest window is set against the view's
/// tightest limit, which can hold a shorter limit full for one of its windows).
///
/// **The bound.** Between two syncs a replica does not see the others' admissions, so
/// across `R` replicas a key can get, in any window, `max` plus what the other replicas
/// admitted in the sync interval they had not yet heard of: at most `(R − 1) × r × sync`
/// extra units when each replica admits at a rate `r`, and at most `(R − 1) × max` when the
/// key is new everywhere and bursts on all replicas at once (nobody has heard of anybody),
/// or bursts on a replica before that replica's first sync of it.
/// Units arrive at the other replicas at sync time rather than at their admission time, so
/// they also leave those windows up to one interval late (conservative). A push whose reply
/// is lost (a timeout) is pushed again with the next sync, so Redis may count it twice
/// (conservative too).
///
/// **What a sync does.** A sync touches only keys with something to do: the keys this
/// replica admitted since their last push, and the keys it admitted within the longest
/// `window + precision` that are due for a pull. A key is pulled every sync while its pulls
/// find the other replicas' units, or while this replica's window for it is full; else
/// its period doubles, up to every 8th sync, so a key that nobody else uses costs one pull
/// every 8 syncs, not one per sync. For the first admissions after such a quiet spell, the
/// bound above holds with up to `8 × sync` in place of `sync`.
/// At most [`sync_keys`](RedisLimiterBuilder::sync_keys) keys (default
/// [`DEFAULT_SYNC_KEYS`]) per `sync_interval`, early syncs included, in calls of at most
/// 128 keys (one script call each on a standalone server; on a Cluster, one call per key,
/// sent together). When more keys wait, a sync takes the half that owe most units, then a
/// quarter of the due pulls, then the keys owing longest, then more pulls; the others wait
/// for the next interval. So a spray of new keys delays their own pushes (each owes one
/// unit), not those of busy keys, and every owed unit is pushed within `owing keys ÷
/// (sync_keys ÷ 4)` intervals. A key that more replicas use, and that waits, widens the
/// bound above by the units admitted while it waits.
///
/// **Memory.** The local limiter holds at most
/// [`max_keys`](RedisLimiterBuilder::max_keys) keys (a new key beyond it is refused with
/// [`Denial::TooManyKeys`](crate::Denial::TooManyKeys)); the keys the replica syncs are at
/// most `max_keys` too (a new one evicts the least recently admitted key that owes
/// nothing, among the 64 least recent, else the least recently admitted, whose unpushed
/// units are then dropped). At most `max_keys` units (so at most `max_keys` admissions)
/// wait in the queue for the next sync; while it is full (the syncs are behind), admissions
/// are summed per key in a side table of at most `max_keys` keys, behind a mutex, and an
/// admission of a key beyond that still counts locally but is never pushed. A sync takes
/// from the queue what waited when it began (at most `max_keys` entries), so producers
/// that refill it as fast as it empties never keep a sync from reaching Redis. Units that
/// no other replica will hear of are counted in [`SyncStats::dropped_units`].
pub struct HybridLimiter<K> {
    shared: Arc<Shared<K>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a [`HybridLimiter`]'s syncs are doing ([`HybridLimiter::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncStats {
    /// Keys the replica syncs (at most `max_keys`), as of the last sync.
    pub keys: usize,
    /// Of those, the keys with units not yet pushed, and those units, as of the last sync.
    pub owing_keys: usize,
    /// Units admitted here and not yet pushed, as of the last sync.
    pub owed_units: u64,
    /// Units admitted here and waiting for the next sync, in the queue (at most `max_keys`)
    /// or, while it is full, in the side table.
    pub pending_units: u64,
    /// Units admitted here that no other replica will hear of: admitted while the queue
    /// and its side table were full, owed by a key evicted at `max_keys`, or refused by
    /// Redis with an error that retrying cannot change.
    pub dropped_units: u64,
    /// Keys the last sync pushed or pulled (at most `sync_keys`).
    pub last_sync_keys: usize,
    /// Redis calls the last sync made.
    pub last_sync_calls: usize,
}

/// What `build_hybrid` hands [`HybridLimiter::start`].
pub(super) struct Settings {
    pub(super) interval: Duration,
    pub(super) batch: u64,
    pub(super) max_keys: usize,
    pub(super) sync_keys: usize,
}

struct Shared<K> {
    local: Limiter<K>,
    remote: Arc<Remote>,
    queue: SegQueue<(K, u64)>,
    /// The units waiting, in `queue` and `spill`: the queue takes an admission only while
    /// they stay within `max_keys` (so it holds at most that many entries), and their
    /// number triggers early syncs.
    pending: AtomicU64,
    /// While the queue is full: the units admitted per key (at most `max_keys` keys), and
    /// whether it holds any (so that a sync skips its lock otherwise).
    spill: Mutex<HashMap<K, u64>>,
    spilled: AtomicBool,
    /// See [`SyncStats::dropped_units`].
    dropped: AtomicU64,
    book: tokio::sync::Mutex<Book<K>>,
    /// Keys not admitted here for this long are no longer synced.
    forget_after: Duration,
    max_keys: usize,
    /// `max_keys`, as a count of units.
    max_units: u64,
    sync_keys: usize,
    /// The last sync's figures for [`SyncStats`] (each on its own: Relaxed).
    known: AtomicUsize,
    owing_keys: AtomicUsize,
    owed_units: AtomicU64,
    last_keys: AtomicUsize,
    last_calls: AtomicUsize,
}

impl<K> fmt::Debug for HybridLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridLimiter")
            .field("pending", &self.shared.pending.load(Ordering::Relaxed))
            .field("sync_keys", &self.shared.sync_keys)
            .field("max_keys", &self.shared.max_keys)
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
    pub(super) fn start(local: Limiter<K>, remote: Arc<Remote>, settings: Settings) -> Self {
        let Settings { interval, batch, max_keys, sync_keys } = settings;
        let forget_after = Duration::from_millis(remote.ttl_ms);
        let shared = Arc::new(Shared {
            local,
            remote,
            queue: SegQueue::new(),
            pending: AtomicU64::new(0),
            spill: Mutex::new(HashMap::new()),
            spilled: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            book: tokio::sync::Mutex::new(Book::new(max_keys)),
            forget_after,
            max_keys: max_keys.max(1),
            max_units: u64::try_from(max_keys.max(1)).unwrap_or(u64::MAX),
            sync_keys: sync_keys.max(1),
            known: AtomicUsize::new(0),
            owing_keys: AtomicUsize::new(0),
            owed_units: AtomicU64::new(0),
            last_keys: AtomicUsize::new(0),
            last_calls: AtomicUsize::new(0),
        });
        let syncing = Arc::clone(&shared);
        let tick = interval.min(Duration::from_millis(5)).max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            // Each interval's budget of keys, shared by its early syncs.
            let mut began = Instant::now();
            let mut left = syncing.sync_keys;
            loop {
                tokio::time::sleep(tick).await;
                if began.elapsed() >= interval {
                    began = Instant::now();
                    left = syncing.sync_keys.saturating_sub(syncing.sync(syncing.sync_keys, true).await);
                // Relaxed: a hint for when to sync; the queue carries the units.
                } else if left > 0 && syncing.pending.load(Ordering::Relaxed) >= batch {
                    left = left.saturating_sub(syncing.sync(left, false).await);
                }
            }
        });
        HybridLimiter { shared, task }
    }

    /// Checks a request of cost 1, locally.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let hybrid = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build_hybrid().await?;
    /// assert!(hybrid.check(&7).is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Checks a request weighing `cost` units against the local limiter (lock-free, no
    /// network); an admission is queued for the next sync. A new key while the local
    /// limiter holds `max_keys` is refused with
    /// [`Denial::TooManyKeys`](crate::Denial::TooManyKeys).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let hybrid = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build_hybrid().await?;
    /// assert!(hybrid.check_n(&7, 4).is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn check_n(&self, key: &K, cost: u64) -> Decision {
        let decision = self.shared.local.check_n(key, cost);
        if decision.is_allowed() && cost > 0 {
            self.shared.enqueue(key, cost);
        }
        decision
    }

    /// Syncs now, as the background task does at the start of each `sync_interval`: at most
    /// `sync_keys` keys.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let hybrid = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build_hybrid().await?;
    /// let _ = hybrid.check(&7);
    /// hybrid.sync_now().await; // Redis holds the unit
    /// # Ok(())
    /// # }
    /// ```
    pub async fn sync_now(&self) {
        self.shared.sync(self.shared.sync_keys, true).await;
    }

    /// The local limiter (its windows hold this replica's units and the others' as of the
    /// last sync).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let hybrid = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build_hybrid().await?;
    /// let _ = hybrid.check(&7);
    /// assert_eq!(hybrid.local().peek(&7).remaining(), 8); // after one more
    /// # Ok(())
    /// # }
    /// ```
    pub fn local(&self) -> &Limiter<K> {
        &self.shared.local
    }

    /// What the syncs are doing: the keys synced and owing, the queue, the units dropped,
    /// and the last sync's keys and calls.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), slidegate::redis::SetupError> {
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let hybrid = RedisLimiter::<u64>::builder().url("redis://127.0.0.1:6379").limit(Limit::per_second(10)).build_hybrid().await?;
    /// let _ = hybrid.check(&7);
    /// hybrid.sync_now().await;
    /// let stats = hybrid.stats();
    /// assert_eq!((stats.keys, stats.owed_units, stats.dropped_units), (1, 0, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> SyncStats {
        let s = &self.shared;
        // Relaxed: independent gauges, each read on its own.
        SyncStats {
            keys: s.known.load(Ordering::Relaxed),
            owing_keys: s.owing_keys.load(Ordering::Relaxed),
            owed_units: s.owed_units.load(Ordering::Relaxed),
            pending_units: s.pending.load(Ordering::Relaxed),
            dropped_units: s.dropped.load(Ordering::Relaxed),
            last_sync_keys: s.last_keys.load(Ordering::Relaxed),
            last_sync_calls: s.last_calls.load(Ordering::Relaxed),
        }
    }
}

impl<K> Shared<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// Queues an admission for the next sync; when that would put more than `max_keys`
    /// units in waiting, adds it to its key's sum in the side table, or counts it as dropped
    /// when that holds `max_keys` other keys.
    fn enqueue(&self, key: &K, cost: u64) {
        // Relaxed: the count only bounds the queue and triggers early syncs. It is raised
        // before the push (or the spill), and the sync lowers it after its pop (or its take),
        // which the queue (or the lock) orders after: it never goes below zero.
        let waiting = self.pending.fetch_add(cost, Ordering::Relaxed).saturating_add(cost);
        if waiting <= self.max_units {
            self.queue.push((key.clone(), cost));
            return;
        }
        let mut spill = self.spill.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(units) = spill.get_mut(key) {
            *units = units.saturating_add(cost);
        } else if spill.len() < self.max_keys {
            spill.insert(key.clone(), cost);
        } else {
            self.pending.fetch_sub(cost, Ordering::Relaxed);
            self.dropped.fetch_add(cost, Ordering::Relaxed);
            return;
        }
        // Relaxed: under the lock, which orders it with the sync's take (the flag only
        // spares the sync the lock when nothing spilled).
        self.spilled.store(true, Ordering::Relaxed);
    }

    /// What waits for the sync, into `book`: the queue, then the side table. Returns the
    /// owed units of keys evicted to make room.
    ///
    /// At most `max_keys` entries from the queue: every one that waited when the drain began
    /// (the queue never holds more, and pops are in order), not those that producers add
    /// meanwhile, each pop making room for one more. Producers that keep up with the drain
    /// would otherwise keep a sync here for ever; what they add waits for the next sync.
    fn drain(&self, book: &mut Book<K>, now: Instant) -> u64 {
        let mut dropped = 0u64;
        for _ in 0..self.max_keys {
            let Some((key, cost)) = self.queue.pop() else { break };
            // Relaxed: see `enqueue`.
            self.pending.fetch_sub(cost, Ordering::Relaxed);
            dropped = dropped.saturating_add(book.admit(&key, cost, now));
        }
        // Relaxed: see `enqueue`; a spill that this load misses is taken by the next sync.
        if self.spilled.load(Ordering::Relaxed) {
            let spill = {
                let mut spill = self.spill.lock().unwrap_or_else(PoisonError::into_inner);
                self.spilled.store(false, Ordering::Relaxed);
                std::mem::take(&mut *spill)
            };
            for (key, cost) in spill {
                self.pending.fetch_sub(cost, Ordering::Relaxed);
                dropped = dropped.saturating_add(book.admit(&key, cost, now));
            }
        }
        dropped
    }

    /// One sync of at most `budget` keys (`new_interval`: pulls due at the next sync are
    /// due now); returns the keys it touched.
    async fn sync(&self, budget: usize, new_interval: bool) -> usize {
        let mut book = self.book.lock().await;
        if new_interval {
            book.new_sync();
        }
        let now = Instant::now();
        let mut dropped = self.drain(&mut book, now);
        book.forget_idle(now, self.forget_after, budget.saturating_mul(4).max(256));
        let picks = book.take(budget);
        let touched = picks.len();
        let (calls, refused) = exchange::run(&self.remote, &self.local, &mut book, picks).await;
        dropped = dropped.saturating_add(refused);
        let (owing_keys, owed_units) = book.owing();
        // Relaxed: gauges and a counter, read on their own (see `stats`).
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        self.known.store(book.len(), Ordering::Relaxed);
        self.owing_keys.store(owing_keys, Ordering::Relaxed);
        self.owed_units.store(owed_units, Ordering::Relaxed);
        self.last_keys.store(touched, Ordering::Relaxed);
        self.last_calls.store(calls, Ordering::Relaxed);
        touched
    }
}

impl<K> RedisLimiterBuilder<K>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
{
    /// [`HybridLimiter`]: the most keys a replica pushes or pulls per `sync_interval`, early
    /// syncs included (default [`DEFAULT_SYNC_KEYS`]; `0` is taken as 1). Keys beyond it
    /// wait for the next interval (see [`HybridLimiter`], *What a sync does*):
    /// set it above the number of keys a replica admits per interval, or pushes fall behind.
    ///
    /// ```
    /// use slidegate::redis::RedisLimiter;
    /// use slidegate::Limit;
    /// let builder = RedisLimiter::<u64>::builder().limit(Limit::per_second(10)).sync_keys(4096);
    /// # let _ = builder;
    /// ```
    pub fn sync_keys(mut self, keys: usize) -> Self {
        self.sync_keys = keys.max(1);
        self
    }
}
