//! Checks and peeks in flight at once share calls (a standalone server): a bounded queue, and
//! a task that sends what waits in it as batches.
//!
//! While [`SCRIPT_BATCHES_IN_FLIGHT`] script calls ([`MODULE_BATCHES_IN_FLIGHT`] module
//! calls) are out, new checks queue, and the next call takes every queued one (at most
//! [`MOST_PER_BATCH`]), which the server runs one after the other in arrival order, each
//! decided exactly as if alone.
//!
//! What a stall of Redis (connections open, nothing answered) may cost is bounded:
//!
//! * the queue holds at most [`QUEUE_BOUND`] checks; a check that finds it full is decided
//!   by the fallback at once (it could only wait behind checks that will time out);
//! * a check that gave up waiting (its timeout passed, and the fallback decided it) is
//!   dropped when a batch reaches it, never sent: Redis does not count what the fallback
//!   already decided (and, under `Fallback::Local`, owes Redis);
//! * a call keeps its place until its reply comes ([`LONGEST_CALL`] at most, or the timeout
//!   if longer), even after its checks gave up: while Redis stalls no more batches are sent
//!   into it, so at most one round of calls (128 checks through the script, 256 through the
//!   module) per `LONGEST_CALL` of the stall reaches it late and is counted there besides
//!   the fallback's decision.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ::redis::{RedisError, RedisResult};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::call::{Entry, Mode, Remote};

/// The most checks sent in one call.
pub(super) const MOST_PER_BATCH: usize = 64;
/// The most batches in flight at once, through the script and through the module: while
/// all are out, checks queue and form the next batch, so a burst of concurrent checks shares
/// calls while a lone check goes at once. (Measured with `redis_report`: the script, whose
/// calls take the server longer, runs best with fewer and larger batches.)
const SCRIPT_BATCHES_IN_FLIGHT: usize = 2;
const MODULE_BATCHES_IN_FLIGHT: usize = 4;
/// The most checks waiting for a call: 64 calls' worth, about 1 MB of waiting checks. A
/// server that keeps up takes them long before; beyond that, a check would time out in the
/// queue.
pub(super) const QUEUE_BOUND: usize = 64 * MOST_PER_BATCH;
/// How long a call keeps its batch slot while its reply is late (when the limiter's
/// timeout is shorter).
pub(super) const LONGEST_CALL: Duration = Duration::from_secs(1);

/// A check waiting for its batch.
struct Pending {
    redis_key: String,
    mode: Mode,
    cost: u64,
    reply: oneshot::Sender<RedisResult<Vec<i64>>>,
}

/// The limiter's end of the queue.
pub(super) struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the task that sends the queued checks to `remote` (on the current tokio
    /// runtime; it ends when the batcher is dropped).
    pub(super) fn start(remote: Arc<Remote>) -> Batcher {
        let (queue, pending) = mpsc::channel(QUEUE_BOUND);
        tokio::spawn(batches(remote, pending));
        Batcher { queue }
    }

    /// Queues a check or a peek and waits for its replies within the limiter's timeout;
    /// `None` when none came in time, or when the queue is full (for the fallback, at once).
    pub(super) async fn run(
        &self,
        timeout: Duration,
        redis_key: String,
        mode: Mode,
        cost: u64,
    ) -> Option<RedisResult<Vec<i64>>> {
        let (reply, answer) = oneshot::channel();
        self.queue.try_send(Pending { redis_key, mode, cost, reply }).ok()?;
        tokio::time::timeout(timeout, answer).await.ok()?.ok()
    }
}

/// Sends the checks queued on `queue` to Redis, batched: takes a batch slot, then every live
/// check queued by then (at most [`MOST_PER_BATCH`]) in one call. Ends when the limiter (the
/// queue's sender) is dropped.
async fn batches(remote: Arc<Remote>, mut queue: mpsc::Receiver<Pending>) {
    // Relaxed: a hint about the server, read once.
    let module = remote.native.load(Ordering::Relaxed);
    let in_flight = if module { MODULE_BATCHES_IN_FLIGHT } else { SCRIPT_BATCHES_IN_FLIGHT };
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        // A check whose receiver is gone gave up waiting, and the fallback decided it.
        let mut batch: Vec<Pending> = Vec::with_capacity(MOST_PER_BATCH);
        if !first.reply.is_closed() {
            batch.push(first);
        }
        while batch.len() < MOST_PER_BATCH {
            match queue.try_recv() {
                Ok(p) if p.reply.is_closed() => {}
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        let remote = Arc::clone(&remote);
        tokio::spawn(async move {
            call_batch(&remote, batch).await;
            drop(slot);
        });
    }
}

/// Runs the live checks of `batch` in one call, in order, and hands each its replies. The
/// call may outlast its checks' timeout (see the [module docs](self)).
async fn call_batch(remote: &Remote, mut batch: Vec<Pending>) {
    batch.retain(|p| !p.reply.is_closed());
    if batch.is_empty() {
        return;
    }
    let entries: Vec<Entry<'_>> =
        batch.iter().map(|p| Entry { redis_key: &p.redis_key, mode: p.mode, cost: p.cost }).collect();
    let replies = remote.invoke_within(&entries, None, None, remote.timeout.max(LONGEST_CALL)).await;
    drop(entries);
    match replies {
        Ok(replies) if replies.len() == batch.len().saturating_mul(5) => {
            for (p, reply) in batch.into_iter().zip(replies.chunks(5)) {
                // A check that gave up waiting meanwhile has dropped its receiver.
                let _ = p.reply.send(Ok(reply.to_vec()));
            }
        }
        Ok(_) => {
            for p in batch {
                let _ = p.reply.send(Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "short script reply",
                ))));
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}
