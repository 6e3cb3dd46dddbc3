//! What Redis answered for one entry: a decision, a refusal that retrying cannot change, or
//! no answer (for the fallback).
//!
//! The script and the module answer five integers per entry, `{kind, limit, remaining,
//! retry_ms, now_ms}`: kind 0 admitted, 1 refused by `limit`, 2 the cost above `limit`'s
//! `max`, 3 an entry error (`{3, code, 0, 0, now}`: 1 a mode the path does not run, 2 a cost
//! that is not an unsigned integer, 3 the key holds another type, 4 the key cannot be
//! opened), which fails that entry alone.

use ::redis::{RedisError, RedisResult};

use crate::Decision;

/// One entry's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// The server decided.
    Decided(Decision),
    /// The server refused this entry, and would again: an entry error, or an error reply
    /// that is not one of a server passing through a transient state (`CROSSSLOT`,
    /// `WRONGTYPE`, `NOPERM`, `ERR ...`).
    Refused,
    /// No answer: a connection error, a timeout, a transient server state (`LOADING`,
    /// `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `OOM`, ...), or a
    /// reply of the wrong shape.
    Unavailable,
}

/// Error codes of a server that will answer once a transient state passes.
const TRANSIENT: [&str; 12] = [
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "READONLY",
    "OOM",
    "NOSCRIPT",
    "MOVED",
    "ASK",
    "NOREPLICAS",
    "MISCONF",
];

/// Whether `error` may go away by itself: anything but an error reply, or an error reply
/// of a transient state (a full server's `ERR max number of clients reached` included).
pub(super) fn is_transient(error: &RedisError) -> bool {
    match error.code() {
        None => true,
        Some("ERR") => error.detail().is_some_and(|d| d.contains("max number of clients")),
        Some(code) => TRANSIENT.contains(&code),
    }
}

/// What `reply` (one entry's five integers, or the call's error; `None`: no reply in time)
/// says.
pub(super) fn answer(reply: Option<&RedisResult<Vec<i64>>>) -> Answer {
    match reply {
        None => Answer::Unavailable,
        Some(Err(error)) if is_transient(error) => Answer::Unavailable,
        Some(Err(_)) => Answer::Refused,
        Some(Ok(reply)) => match reply.first() {
            Some(3) => Answer::Refused,
            _ => decision_of(reply).map_or(Answer::Unavailable, Answer::Decided),
        },
    }
}

/// The decision in one entry's replies (kinds 0 to 2).
fn decision_of(reply: &[i64]) -> Option<Decision> {
    let [kind, limit, remaining, retry_ms, ..] = *reply else { return None };
    let (limit, remaining) = (usize::try_from(limit).ok()?, u64::try_from(remaining).ok()?);
    match kind {
        0 => Some(Decision::allowed(remaining, limit)),
        1 => {
            Some(Decision::limited(limit, remaining, u64::try_from(retry_ms).ok()?.saturating_mul(1_000_000)))
        }
        2 => Some(Decision::cost_too_large(limit, remaining)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::{ErrorKind, ServerErrorKind};

    #[test]
    fn entry_errors_and_permanent_replies_refuse_transient_ones_fall_back() {
        assert_eq!(answer(Some(&Ok(vec![3, 3, 0, 0, 1000]))), Answer::Refused);
        assert!(matches!(answer(Some(&Ok(vec![2, 0, 4, 0, 1000]))), Answer::Decided(_)));
        assert_eq!(answer(Some(&Ok(vec![9, 0, 0, 0, 0]))), Answer::Unavailable);
        assert_eq!(answer(Some(&Ok(vec![0, 0]))), Answer::Unavailable);
        assert_eq!(answer(None), Answer::Unavailable);
        let io = RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"));
        assert_eq!(answer(Some(&Err(io))), Answer::Unavailable);
        let crossslot =
            RedisError::from((ErrorKind::Server(ServerErrorKind::CrossSlot), "keys in two slots"));
        assert_eq!(answer(Some(&Err(crossslot))), Answer::Refused);
        let loading = RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(answer(Some(&Err(loading))), Answer::Unavailable);
    }
}
