//! What the backends beyond one process share (features `redis`, `memcached`): the
//! fallback when the server cannot answer, and decisions that say who made them.

use std::ops::Deref;
use std::time::Duration;

use crate::{Decision, Limit};

/// What decides when the server cannot (an error, or no answer within the timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Admit (remaining reported as 0): availability first.
    Open,
    /// Refuse, with `retry_after` the smallest precision of the limits: protection first.
    Closed,
    /// Decide with a local in-process limiter with the same limits (the default). Redis:
    /// what it admits is added to Redis when Redis answers again, so no admission is lost.
    #[default]
    Local,
}

impl Fallback {
    /// How long a [`Closed`](Fallback::Closed) refusal asks the client to wait: the smallest
    /// precision among `limits` (one slot of the finest limit, after which the server may
    /// answer again), 1 s without limits. The same for every backend.
    pub(crate) fn closed_wait(limits: &[Limit]) -> Duration {
        limits.iter().map(Limit::get_precision).min().unwrap_or(Duration::from_secs(1))
    }

    /// The decision of [`Open`](Fallback::Open) or [`Closed`](Fallback::Closed) (the
    /// local fallback decides through its limiter), shared by every backend: a cost above
    /// limit `too_large`'s `max` is `CostTooLarge` whichever decides, since no path may
    /// admit what no window can hold and "retry later" would never help; otherwise `Open`
    /// admits with nothing remaining and `Closed` refuses for `closed_wait`.
    pub(crate) fn decide(self, too_large: Option<usize>, closed_wait: Duration) -> Checked {
        let by = if self == Fallback::Closed { DecidedBy::FailClosed } else { DecidedBy::FailOpen };
        let decision = match (too_large, by) {
            (Some(limit), _) => Decision::cost_too_large(limit, 0),
            (None, DecidedBy::FailClosed) => {
                Decision::limited(0, 0, u64::try_from(closed_wait.as_nanos()).unwrap_or(u64::MAX))
            }
            (None, _) => Decision::allowed(0, 0),
        };
        Checked::new(decision, by)
    }
}

/// Which path decided a [`Checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The server (the Redis script, or memcached).
    Server,
    /// [`Fallback::Open`], because Redis failed or timed out.
    FailOpen,
    /// [`Fallback::Closed`], because Redis failed or timed out.
    FailClosed,
    /// [`Fallback::Local`], because Redis failed or timed out.
    Local,
}

/// A [`Decision`] and the path that made it (it derefs to the decision).
///
/// ```
/// use slidegate::redis::{Checked, DecidedBy};
/// fn log(checked: &Checked) {
///     if checked.decided_by() != DecidedBy::Server {
///         eprintln!("redis unavailable, decided locally: {:?}", checked.decision());
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    decision: Decision,
    decided_by: DecidedBy,
}

impl Checked {
    pub(crate) fn new(decision: Decision, decided_by: DecidedBy) -> Checked {
        Checked { decision, decided_by }
    }

    /// The decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Which path decided.
    pub fn decided_by(&self) -> DecidedBy {
        self.decided_by
    }
}

impl Deref for Checked {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.decision
    }
}
