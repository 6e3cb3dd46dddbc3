//! The `RateLimit-Policy` and `RateLimit` field values (draft-ietf-httpapi-ratelimit-headers-10)
//! as the layer writes them, and [`RateLimitFields`], the same for a server that is not a
//! tower service (pingora, a bare hyper server).

use std::time::Duration;

use super::route::field_name;
use super::LayerError;
use crate::{Decision, Limit};

/// The fields of one policy's decisions, formatted as [`RateLimitLayer`](super::RateLimitLayer)
/// formats them, for a server that answers without the layer (the `pingora_gateway`
/// example in the repository uses it): `RateLimit-Policy` once per policy, `RateLimit` and
/// `Retry-After` per decision. An item per limit, named `name`, or `name.0`, `name.1`, ...
/// when the policy has several; `w` is the window in whole seconds (left out for a window
/// that is not); `t` and `Retry-After` are whole seconds, rounded up.
///
/// ```
/// use slidegate::tower::RateLimitFields;
/// use slidegate::{Limit, Limiter, ManualClock};
///
/// let limits = [Limit::per_second(10), Limit::per_minute(100)];
/// let fields = RateLimitFields::new("api", &limits)?;
/// assert_eq!(fields.policy(), r#""api.0";q=10;w=1, "api.1";q=100;w=60"#);
///
/// let limiter = Limiter::<u64>::builder().limit(limits[0]).limit(limits[1]).clock(ManualClock::new()).build()?;
/// let admitted = limiter.check_n(&7, 10);
/// assert_eq!(fields.ratelimit(&admitted).as_deref(), Some(r#""api.0";r=0"#));
/// // Interpolated: one more fits 1.1 s on, advertised as 2 whole seconds.
/// let refused = limiter.check(&7);
/// assert_eq!(RateLimitFields::retry_after(&refused), Some(2));
/// assert_eq!(fields.ratelimit(&refused).as_deref(), Some(r#""api.0";r=0;t=2"#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitFields {
    policy: String,
    items: Vec<String>,
}

impl RateLimitFields {
    /// The fields of a policy of `limits`, advertised under `name` (printable ASCII: a
    /// structured-field string). A name that cannot be one is an error.
    ///
    /// ```
    /// use slidegate::tower::RateLimitFields;
    /// use slidegate::Limit;
    /// assert!(RateLimitFields::new("per-ip", &[Limit::per_minute(5)]).is_ok());
    /// assert!(RateLimitFields::new("", &[Limit::per_minute(5)]).is_err());
    /// ```
    pub fn new(name: &str, limits: &[Limit]) -> Result<RateLimitFields, LayerError> {
        let (policy, items) = policy_value(field_name(name)?, limits.iter());
        Ok(RateLimitFields { policy, items })
    }

    /// The `RateLimit-Policy` value.
    ///
    /// ```
    /// use slidegate::tower::RateLimitFields;
    /// use slidegate::Limit;
    /// let fields = RateLimitFields::new("login", &[Limit::per_minute(5)])?;
    /// assert_eq!(fields.policy(), r#""login";q=5;w=60"#);
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The `RateLimit` value of `decision` (about its tightest limit, or the refusing one):
    /// `"item";r=remaining`, with `;t=seconds` when it says how long to wait. `None` for a
    /// decision about no limit of the policy (a table full of keys).
    ///
    /// ```
    /// use slidegate::tower::RateLimitFields;
    /// use slidegate::{Limit, Limiter};
    /// let fields = RateLimitFields::new("login", &[Limit::per_minute(5)])?;
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_minute(5)).build()?;
    /// assert_eq!(fields.ratelimit(&limiter.check(&1)).as_deref(), Some(r#""login";r=4"#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ratelimit(&self, decision: &Decision) -> Option<String> {
        if decision.denial() == Some(crate::Denial::TooManyKeys) {
            return None;
        }
        let item = self.items.get(decision.tightest_limit())?;
        String::from_utf8(ratelimit_value(item, decision)).ok()
    }

    /// `Retry-After` of `decision` in whole seconds, rounded up; `None` when it does not
    /// say how long to wait (an admission, a cost that never fits).
    ///
    /// ```
    /// use slidegate::tower::RateLimitFields;
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_minute(1)).build()?;
    /// assert_eq!(RateLimitFields::retry_after(&limiter.check(&1)), None);
    /// assert_eq!(RateLimitFields::retry_after(&limiter.check(&1)), Some(61));
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn retry_after(decision: &Decision) -> Option<u64> {
        decision.retry_after().map(whole_seconds)
    }
}

/// The `RateLimit-Policy` value of `limits` under `base` (a structured-field string's
/// content), and its item names: `base`, or `base.0`, `base.1`, ... for several limits.
pub(super) fn policy_value<'a>(
    base: String,
    limits: impl Iterator<Item = &'a Limit>,
) -> (String, Vec<String>) {
    let limits: Vec<&Limit> = limits.collect();
    let items: Vec<String> = if limits.len() == 1 {
        vec![base]
    } else {
        (0..limits.len()).map(|i| format!("{base}.{i}")).collect()
    };
    let value = limits
        .iter()
        .zip(&items)
        .map(|(limit, item)| {
            let window = limit.window();
            if window.subsec_nanos() == 0 {
                format!("\"{item}\";q={};w={}", limit.max(), window.as_secs())
            } else {
                // `w` is whole seconds; a window that is not is advertised by its quota.
                format!("\"{item}\";q={}", limit.max())
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    (value, items)
}

/// `"item";r=remaining`, with `;t=seconds` when `decision` says how long to wait. No
/// `format!` machinery: the layer runs this on every request.
pub(super) fn ratelimit_value(item: &str, decision: &Decision) -> Vec<u8> {
    let mut value = Vec::with_capacity(item.len().saturating_add(32));
    value.push(b'"');
    value.extend_from_slice(item.as_bytes());
    value.extend_from_slice(b"\";r=");
    push_decimal(&mut value, decision.remaining());
    if let Some(wait) = decision.retry_after().map(whole_seconds) {
        value.extend_from_slice(b";t=");
        push_decimal(&mut value, wait);
    }
    value
}

/// Seconds, rounded up (at least 1 for any non-zero duration; saturating near `Duration::MAX`).
pub(super) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    reason = "a u64 has at most 20 digits, each below 10"
)]
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}
