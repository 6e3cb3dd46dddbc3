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
//! What you use:
//!
//! - [`Limiter`] and its [`LimiterBuilder`]: the keyed limiter; [`Limiter::check`],
//!   [`check_n`](Limiter::check_n), [`peek`](Limiter::peek), [`record`](Limiter::record),
//!   [`check_all`](Limiter::check_all) for several identities at once;
//! - [`Limit`] (`"120/min"`, `"240/h@1min strict"`), [`Algorithm`] (sliding window by
//!   default, fixed window, sliding log, GCRA), [`PolicyConfig`] for named policies;
//! - [`Decision`] and [`Denial`]: admitted or not, what remains, when to retry;
//! - [`ManualClock`] for tests and simulations; [`ConfigError`] for what a configuration
//!   got wrong;
//! - `tower::RateLimitLayer` (feature `tower`) in front of an HTTP service;
//!   `redis::RedisLimiter` and `redis::HybridLimiter` (feature `redis`) and
//!   `memcached::MemcachedLimiter` (feature `memcached`) for one budget across processes;
//!   [`metrics`] for the series a limiter reports.
//!
//! The [`guide`] modules hold the rest: semantics and accuracy, gateway integration,
//! policies, scaling out, performance and memory, reliability, design, testing.
//!
//! Cargo features, all off by default: `tower` (an HTTP layer answering 429 with
//! `Retry-After` and `RateLimit` fields: module `tower`), `axum` (axum's
//! `ConnectInfo` as the peer address), `metrics` (counters and gauges through the `metrics`
//! facade), `tokio` (`Limiter::until_ready`), `redis` (one budget across processes:
//! `RedisLimiter`, `HybridLimiter`), `memcached` (the two-bucket estimate on memcached),
//! `serde` (limits in configuration files, and `Limiter::save` / `Limiter::load`: counts that
//! survive a restart).

// `unsafe` appears in two places: the key table's nodes, arrays and epoch-deferred frees
// (`table/`), and the sliding log's shared snapshots (`algorithm/log.rs`). Everything else
// is safe code.
#![cfg_attr(docsrs, feature(doc_cfg))]
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
mod grace;
mod housekeeper;
mod layout;
mod limit;
mod limiter;
#[cfg(feature = "memcached")]
#[cfg_attr(docsrs, doc(cfg(feature = "memcached")))]
pub mod memcached;
pub mod metrics;
mod offenders;
mod policy;
mod protocol;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "redis", feature = "memcached"))]
mod remote;
#[cfg(feature = "serde")]
mod snapshot;
mod sync;
mod table;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

/// The guides: everything past the first screen of the README, with examples that compile
/// as doc tests. The same text is in `docs/` in the repository.
#[cfg(any(
    all(doc, not(doctest)),
    all(
        feature = "tower",
        feature = "axum",
        feature = "redis",
        feature = "memcached",
        feature = "serde",
        feature = "metrics",
        feature = "tokio"
    )
))]
pub mod guide {
    // The guide with its chart embedded (`build.rs`): rustdoc copies no image.
    #[doc = include_str!(concat!(env!("OUT_DIR"), "/semantics.md"))]
    pub mod semantics {}
    #[doc = include_str!("../docs/gateway.md")]
    pub mod gateway {}
    #[doc = include_str!("../docs/policies.md")]
    pub mod policies {}
    #[doc = include_str!("../docs/scaling-out.md")]
    pub mod scaling_out {}
    #[doc = include_str!("../docs/performance.md")]
    pub mod performance {}
    #[doc = include_str!("../docs/reliability.md")]
    pub mod reliability {}
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}
}

pub use algorithm::{Algorithm, MAX_LOG_UNITS};
pub use clock::ManualClock;
pub use decision::{Decision, Denial};
pub use error::{ConfigError, IdentitiesError};
pub use layout::{Carry, MAX_LIMITS};
pub use limit::{Accuracy, Limit, MAX_SLOTS, MAX_UNITS, MAX_WINDOW};
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use limiter::Jitter;
pub use limiter::{Identities, Limiter, LimiterBuilder};
pub use policy::{PolicyConfig, DEFAULT_POLICY};
pub use protocol::MAX_IDENTITIES;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use snapshot::{SnapshotError, SnapshotStats, SNAPSHOT_VERSION};
pub use table::WhenFull;

/// The per-key protocol, exposed for the `loom-tests` crate only (built with
/// `--cfg slidegate_loom`). Not part of the public API.
#[cfg(slidegate_loom)]
#[doc(hidden)]
pub mod model {
    pub use crate::algorithm::Algorithm;
    pub use crate::grace::{pin, Guard};
    pub use crate::layout::{Carry, Policy};
    pub use crate::protocol::{KeyState, Outcome, OwnedState};
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
