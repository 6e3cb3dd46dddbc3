//! A call to Redis: the connection, where time comes from, and one call's entries run
//! through slidegate's module (`SLIDEGATE.RUN`) when the server has it, else through the
//! script, within the timeout.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::redis::aio::ConnectionManager;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{RedisError, RedisResult, Script};

use super::keys::{self, book_key};
use crate::ManualClock;

/// The connection: one multiplexed connection (reconnecting by itself), or a Cluster.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where time comes from.
#[derive(Clone)]
pub(super) enum Time {
    Server,
    Local,
    Manual(ManualClock),
}

impl Time {
    /// The caller's time in ms, or `None` for the server's.
    pub(super) fn now_ms(&self) -> Option<u64> {
        match self {
            Time::Server => None,
            Time::Local => Some(wall_ms()),
            Time::Manual(clock) => Some(u64::try_from(clock.now().as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

pub(super) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the script is asked to do.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    Check,
    Peek,
    Add,
    Push,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::Peek => "peek",
            Mode::Add => "add",
            Mode::Push => "push",
        }
    }
}

/// Everything a call needs, shared by clones and by the hybrid limiter.
pub(super) struct Remote {
    pub(super) conn: Conn,
    pub(super) script: Script,
    pub(super) prefix: String,
    /// The limits as script arguments, and the hash's TTL.
    pub(super) limit_args: Vec<u64>,
    /// The largest `max` of the limits: a check or peek of a larger cost is sent with
    /// `most + 1` (refused as `CostTooLarge` all the same, and within what the script
    /// computes exactly and the module parses).
    pub(super) most: u64,
    pub(super) ttl_ms: u64,
    pub(super) time: Time,
    pub(super) timeout: Duration,
    /// The server has slidegate's module (`SLIDEGATE.RUN`), and the builder allows it;
    /// cleared if the server stops knowing the command, set again when a recheck finds it.
    pub(super) native: AtomicBool,
    /// While `native` is clear and the builder allows the module: when (ms since `born`)
    /// one call next tries it; `u64::MAX` when the builder does not allow it.
    pub(super) module_recheck_at: AtomicU64,
    pub(super) module_recheck_ms: u64,
    pub(super) born: Instant,
}

impl Remote {
    /// `key`'s windows key in Redis: the prefix and a digest of the key as its hash tag
    /// (see [`keys`]).
    pub(super) fn key(&self, key: &impl fmt::Display) -> String {
        keys::windows_key(&self.prefix, key)
    }

    /// The cost sent for an entry: a check's or peek's above every `max` as `most + 1`.
    fn sent_cost(&self, e: &Entry<'_>) -> u64 {
        match e.mode {
            Mode::Check | Mode::Peek => e.cost.min(self.most.saturating_add(1)),
            Mode::Add | Mode::Push => e.cost,
        }
    }

    /// The first limit whose `max` is below `cost`: a request no path may admit.
    pub(super) fn too_large(&self, cost: u64) -> Option<usize> {
        self.limit_args.chunks(4).position(|limit| limit.first().is_some_and(|&max| cost > max))
    }

    /// Runs the script (or the module) for `key` (already a Redis key) within the timeout:
    /// its five replies. `entry` is an `add`'s client id and sequence number.
    pub(super) async fn call(
        &self,
        redis_key: &str,
        mode: Mode,
        cost: u64,
        at_ms: Option<u64>,
        entry: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        self.invoke(&[Entry { redis_key, mode, cost }], at_ms, entry).await
    }

    /// Runs `entries` in one call within the timeout: through the server's `SLIDEGATE.RUN`
    /// when it has it and the entries only check and peek, else through the script.
    async fn invoke(
        &self,
        entries: &[Entry<'_>],
        at_ms: Option<u64>,
        add: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        self.invoke_within(entries, at_ms, add, self.timeout).await
    }

    /// [`invoke`](Remote::invoke) within `limit` rather than the timeout.
    pub(super) async fn invoke_within(
        &self,
        entries: &[Entry<'_>],
        at_ms: Option<u64>,
        add: Option<(&str, u64)>,
        limit: Duration,
    ) -> RedisResult<Vec<i64>> {
        let now = at_ms.or_else(|| self.time.now_ms()).map_or(String::new(), |ms| ms.to_string());
        let limits = self.limit_args.len() / 4;
        // Relaxed: a hint about the server, corrected by the server's own answer below.
        let native = entries.iter().all(|e| matches!(e.mode, Mode::Check | Mode::Peek))
            && (self.native.load(Ordering::Relaxed) || self.module_recheck_due());
        let run = async {
            if native {
                // The module takes each entry's windows key only, the first also in front.
                let mut cmd = ::redis::cmd("SLIDEGATE.RUN");
                cmd.arg(entries.first().map(|e| e.redis_key)).arg(entries.len());
                for e in entries {
                    cmd.arg(e.redis_key);
                }
                cmd.arg(&now).arg(self.ttl_ms).arg(limits).arg(&self.limit_args[..]);
                for e in entries {
                    cmd.arg(e.mode.name()).arg(self.sent_cost(e));
                }
                let reply = match self.conn.clone() {
                    Conn::Single(mut conn) => cmd.query_async(&mut conn).await,
                    Conn::Cluster(mut conn) => cmd.query_async(&mut conn).await,
                };
                match reply {
                    // The module is gone (unloaded, or a failover to a server without it), or
                    // a recheck found it still missing: this call and the later ones go
                    // through the script until the next recheck.
                    Err(e) if e.to_string().contains("unknown command") => {
                        self.native.store(false, Ordering::Relaxed);
                        self.module_recheck_at.store(
                            self.ms_since_born().saturating_add(self.module_recheck_ms),
                            Ordering::Relaxed,
                        );
                        self.script_call(entries, &now, limits, add).await
                    }
                    Ok(reply) => {
                        // A recheck found it: back on the module (a load first, so that the
                        // calls that already use it write nothing shared).
                        if !self.native.load(Ordering::Relaxed) {
                            self.native.store(true, Ordering::Relaxed);
                        }
                        Ok(reply)
                    }
                    reply => reply,
                }
            } else {
                self.script_call(entries, &now, limits, add).await
            }
        };
        match tokio::time::timeout(limit, run).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "redis check timed out",
            ))),
        }
    }

    fn ms_since_born(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether this call should try the module although it is not in use: the recheck is
    /// due, and this call is the one that moved it on (so one call in each interval tries).
    fn module_recheck_due(&self) -> bool {
        let due = self.module_recheck_at.load(Ordering::Relaxed);
        let now = self.ms_since_born();
        now >= due
            && self
                .module_recheck_at
                .compare_exchange(
                    due,
                    now.saturating_add(self.module_recheck_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// `entries` through the script.
    pub(super) async fn script_call(
        &self,
        entries: &[Entry<'_>],
        now: &str,
        limits: usize,
        add: Option<(&str, u64)>,
    ) -> RedisResult<Vec<i64>> {
        let mut invocation = self.script.prepare_invoke();
        for e in entries {
            invocation.key(e.redis_key).key(book_key(e.redis_key));
        }
        invocation.arg(now).arg(self.ttl_ms).arg(limits).arg(&self.limit_args[..]);
        for e in entries {
            invocation.arg(e.mode.name()).arg(self.sent_cost(e));
        }
        if let Some((client, seq)) = add {
            invocation.arg(client).arg(seq);
        }
        match self.conn.clone() {
            Conn::Single(mut conn) => invocation.invoke_async(&mut conn).await,
            Conn::Cluster(mut conn) => invocation.invoke_async(&mut conn).await,
        }
    }
}

/// One check (or peek, add, push) in a call.
pub(super) struct Entry<'a> {
    pub(super) redis_key: &'a str,
    pub(super) mode: Mode,
    pub(super) cost: u64,
}
