//! # slidegate
//!
//! A lock-free, in-process, keyed sliding-window rate limiter for gateways, proxies and game
//! servers.
//!
//! Per key (an IP, an API key, a player id) each [`Limit`] keeps a ring of per-slot counters,
//! so the count over the last `window` slides a slot at a time (strict) or continuously by
//! interpolation (the default): no boundary bursts as with fixed windows, and a fraction of
//! the memory of a timestamp log. Several limits apply at once, requests can weigh more than
//! one unit, only admitted units are counted, and every [`Decision`] says what remains and,
//! when refused, how long to wait. Keys can be under different named policies (tiers),
//! changed while traffic flows ([`Limiter::update_policy`], [`Limiter::set_policy`]), and
//! tried in shadow mode before they are enforced.
//!
//! ```
//! use std::time::Duration;
//! use slidegate::{Limit, Limiter};
//!
//! let limiter = Limiter::<String>::builder()
//!     .limit(Limit::per_second(10))
//!     .limit("120/min".parse()?)
//!     .limit("240/h@1min".parse()?)
//!     .build()?;
//!
//! let decision = limiter.check("203.0.113.7");
//! if decision.is_allowed() {
//!     // serve it; decision.remaining() goes in a RateLimit header
//! } else if let Some(wait) = decision.retry_after() {
//!     // answer 429 with Retry-After: wait.as_secs_f64().ceil()
//! }
//! # Ok::<(), slidegate::ConfigError>(())
//! ```
//!
//! Layout of the crate: [`limit`](Limit) (limits and their string form), `limiter.rs` (the
//! keyed front end: one lookup path, the builder, several keys at once), `table.rs` (where
//! each key's counters live: lock-free lookups, one node per key), `protocol.rs` (the
//! lock-free admission, in reading order), `layout.rs` (how a key's words are laid out and
//! packed), `algorithm/` (one file per algorithm: the sliding window, fixed window, sliding
//! log and GCRA: [`Algorithm`]), `policy.rs` (named policies: tiers per key,
//! changed at runtime, [`PolicyConfig`]), `clock.rs` and `housekeeper.rs` (one clock ticker
//! and one sweeper thread per process), `decision.rs`, `error.rs`, [`metrics`] (the series a limiter reports), and
//! `sync.rs` (the shim that lets `loom` check the protocols).
//!
//! Cargo features, all off by default: `tower` (an HTTP layer answering 429 with
//! `Retry-After` and `RateLimit` fields: module `tower`), `axum` (axum's
//! `ConnectInfo` as the peer address), `metrics` (counters and gauges through the `metrics`
//! facade), `tokio` (`Limiter::until_ready`), `redis` (one budget across processes:
//! `RedisLimiter`, `HybridLimiter`), `memcached` (the two-bucket estimate on memcached),
//! `serde` (limits in configuration files).

// `unsafe` appears in two places: the key table's nodes, arrays and epoch-deferred frees
// (`table.rs`), and the sliding log's shared snapshots (`algorithm/log.rs`). Everything else
// is safe code.
#![deny(unsafe_code)]
#![warn(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// No panics by construction (`unwrap`, `expect` and `panic!` are linted in Cargo.toml): no
// indexing or arithmetic that can panic or wrap unnoticed. Counters saturate; where a bound
// holds by construction, a narrow `allow` says which. Library code only: tests, examples and
// benches are other crates (a `#[cfg(test)]` module here allows what it needs).
#![warn(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unreachable,
    clippy::todo,
    clippy::unimplemented
)]

mod algorithm;
mod clock;
mod decision;
mod divisor;
mod error;
mod housekeeper;
mod layout;
mod limit;
mod limiter;
#[cfg(feature = "memcached")]
pub mod memcached;
pub mod metrics;
mod policy;
mod protocol;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "redis", feature = "memcached"))]
mod remote;
mod sync;
mod table;
#[cfg(feature = "tower")]
pub mod tower;

pub use algorithm::{Algorithm, MAX_LOG_UNITS};
pub use clock::ManualClock;
pub use decision::{Decision, Denial};
pub use error::ConfigError;
pub use layout::MAX_LIMITS;
pub use limit::{Accuracy, Limit, MAX_SLOTS, MAX_UNITS, MAX_WINDOW};
#[cfg(feature = "tokio")]
pub use limiter::Jitter;
pub use limiter::{Identities, Limiter, LimiterBuilder};
pub use policy::{PolicyConfig, DEFAULT_POLICY};
pub use protocol::{Carry, MAX_IDENTITIES};

/// The per-key protocol, exposed for the `loom-tests` crate only (built with
/// `--cfg slidegate_loom`). Not part of the public API.
#[cfg(slidegate_loom)]
#[doc(hidden)]
pub mod model {
    pub use crate::algorithm::Algorithm;
    pub use crate::layout::Policy;
    pub use crate::protocol::{Carry, KeyState, Outcome, OwnedState};
}

// The README's gateway example needs the `tower` and `axum` features (the README's test
// command, `cargo test --all-features`, has them).
#[cfg(all(doctest, feature = "tower", feature = "axum"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync + 'static>() {}

    #[test]
    fn the_public_types_cross_threads() {
        shareable::<Limiter<String>>();
        shareable::<Limiter<(std::net::IpAddr, u16)>>();
        shareable::<Decision>();
        shareable::<Limit>();
        shareable::<ManualClock>();
        shareable::<ConfigError>();
    }
}
