//! [`LayerError`]: what is wrong with a layer's configuration.

use std::fmt;

/// What is wrong with a layer's configuration, found when the layer is built.
///
/// ```
/// use std::net::IpAddr;
/// use slidegate::tower::{LayerError, PeerIp, RateLimitLayer};
/// use slidegate::{Limit, Limiter};
///
/// let unbounded = Limiter::<IpAddr>::builder().limit(Limit::per_second(10)).build()?;
/// let err = RateLimitLayer::new("api", unbounded, PeerIp).unwrap_err();
/// assert!(matches!(err, LayerError::UnboundedKeys { .. }));
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerError {
    /// The route's limiter was built without [`max_keys`](crate::LimiterBuilder::max_keys):
    /// keys chosen by clients (an address, a header) would grow its memory without bound.
    UnboundedKeys {
        /// The route's name.
        name: String,
    },
    /// A route's or a policy's name that cannot appear in the `RateLimit` fields: empty, or
    /// not printable ASCII.
    InvalidName {
        /// The name.
        name: String,
    },
    /// A header name that is not one ([`HeaderKey::new`](super::HeaderKey::new)).
    InvalidHeaderName {
        /// The name.
        name: String,
    },
    /// A trusted network that is neither a CIDR nor an address ([`ForwardedFor::trusting`](super::ForwardedFor::trusting)).
    InvalidNetwork {
        /// The entry.
        network: String,
    },
    /// A route prefix without a single normal form (see [`RateLimitLayer::route`](super::RateLimitLayer::route)).
    InvalidRoute {
        /// The prefix.
        prefix: String,
        /// Why.
        reason: &'static str,
    },
    /// A problem-details extension member ([`ProblemJson::member`](super::ProblemJson::member)) named as a member the
    /// problem object defines itself, or named twice.
    ReservedProblemMember {
        /// The name.
        name: String,
    },
}

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerError::UnboundedKeys { name } => write!(
                f,
                "route {name:?}: its limiter holds any number of keys; build it with .max_keys(n) \
                 so that keys chosen by clients cannot grow memory without bound"
            ),
            LayerError::InvalidName { name } => {
                write!(f, "name {name:?} cannot appear in RateLimit fields: use printable ASCII")
            }
            LayerError::InvalidHeaderName { name } => write!(f, "{name:?} is not a valid header name"),
            LayerError::InvalidNetwork { network } => {
                write!(f, "{network:?} is neither a network (10.0.0.0/8) nor an address")
            }
            LayerError::InvalidRoute { prefix, reason } => write!(f, "route prefix {prefix:?}: {reason}"),
            LayerError::ReservedProblemMember { name } => {
                write!(f, "problem member {name:?}: the problem object defines it, or it is given twice")
            }
        }
    }
}

impl std::error::Error for LayerError {}
