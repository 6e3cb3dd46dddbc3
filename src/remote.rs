//! What the backends beyond one process share (features `redis`, `memcached`): the
//! fallback when the server cannot answer, and decisions that say who made them.

use std::ops::Deref;

use crate::Decision;

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
