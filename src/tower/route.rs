//! A route (its prefix, its limiter) and the `RateLimit-Policy` and `RateLimit` fields it
//! advertises, cached per policy version.

use std::hash::Hash;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use http::Method;

use super::fields::{policy_value, ratelimit_value, whole_seconds};
use super::{LayerError, RATELIMIT, RATELIMIT_POLICY};
use crate::layout::Policy as LimiterPolicy;
use crate::{Decision, Limit, Limiter};

/// The `RateLimit-Policy` value and item names of one version of one policy of a route.
pub(super) struct Advert {
    version: u64,
    policy: Option<HeaderValue>,
    items: Vec<String>,
    /// Each limit's `max`, for the legacy `X-RateLimit-Limit` field.
    maxes: Vec<u64>,
}

/// A cached [`Advert`], loaded without touching its reference count.
pub(super) type AdvertGuard = arc_swap::Guard<Option<Arc<Advert>>>;

/// One route: its name, the normalised prefix it applies below (empty for the default),
/// its limiter, and the headers of the policy versions it has seen, one per named policy.
#[derive(Clone)]
pub(super) struct Route<K> {
    pub(super) name: String,
    pub(super) prefix: String,
    /// The methods it applies to; empty for every method.
    pub(super) methods: Vec<Method>,
    pub(super) limiter: Arc<Limiter<K>>,
    adverts: Arc<[ArcSwapOption<Advert>]>,
}

/// A name as a structured-field string's content, if it can be one.
pub(super) fn field_name(name: &str) -> Result<String, LayerError> {
    let printable = |c: char| c == ' ' || c.is_ascii_graphic();
    if name.is_empty() || !name.chars().all(printable) {
        return Err(LayerError::InvalidName { name: name.to_owned() });
    }
    Ok(name.replace('\\', "\\\\").replace('"', "\\\""))
}

impl<K> Route<K> {
    /// Whether the route applies to requests with `method`.
    pub(super) fn serves(&self, method: &Method) -> bool {
        self.methods.is_empty() || self.methods.contains(method)
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Route<K> {
    pub(super) fn new(name: &str, prefix: String, limiter: Arc<Limiter<K>>) -> Result<Route<K>, LayerError> {
        field_name(name)?;
        for policy in limiter.policy_names() {
            field_name(policy)?;
        }
        if limiter.max_keys().is_none() {
            return Err(LayerError::UnboundedKeys { name: name.to_owned() });
        }
        let adverts = (0..limiter.tier_count()).map(|_| ArcSwapOption::empty()).collect();
        Ok(Route { name: name.to_owned(), prefix, methods: Vec::new(), limiter, adverts })
    }

    /// The headers of `policy`, the version that decided a request: cached per named
    /// policy, rebuilt when a newer version decides.
    pub(super) fn advert(&self, policy: &LimiterPolicy) -> Option<AdvertGuard> {
        let slot = self.adverts.get(policy.tier())?;
        let cached = slot.load();
        if cached.as_ref().is_some_and(|a| a.version == policy.version()) {
            return Some(cached);
        }
        drop(cached);
        slot.store(Some(Arc::new(self.advert_of(policy))));
        // A racing request may have stored another version meanwhile: its fields describe
        // that version, for this one request, while a policy is being replaced.
        Some(slot.load())
    }

    /// `"name";q=max;w=seconds` per limit: the name is the route's, then the policy's when
    /// the limiter has several, then the limit's index when the policy has several.
    fn advert_of(&self, policy: &LimiterPolicy) -> Advert {
        // Both names were validated when the route was built.
        let mut base = field_name(&self.name).unwrap_or_default();
        if self.adverts.len() > 1 {
            base.push('.');
            base.push_str(&field_name(self.limiter.tier_name(policy.tier())).unwrap_or_default());
        }
        let (value, items) = policy_value(base, policy.limits());
        let maxes = policy.limits().map(Limit::max).collect();
        Advert { version: policy.version(), policy: HeaderValue::from_str(&value).ok(), items, maxes }
    }
}

/// The fields of a decision: `RateLimit-Policy` and `RateLimit`, and with
/// [`legacy_headers`](super::RateLimitLayer::legacy_headers) `X-RateLimit-Limit`,
/// `X-RateLimit-Remaining` and, on a refusal, `X-RateLimit-Reset`.
pub(super) struct Fields {
    policy: HeaderValue,
    value: HeaderValue,
    legacy: Option<[Option<HeaderValue>; 3]>,
}

impl Fields {
    /// Appends the fields to `headers` (an inner layer's lines stay: one list, as the
    /// draft allows).
    pub(super) fn append_to(self, headers: &mut HeaderMap) {
        headers.append(RATELIMIT_POLICY, self.policy);
        headers.append(RATELIMIT, self.value);
        for (name, value) in LEGACY.into_iter().zip(self.legacy.into_iter().flatten()) {
            if let Some(value) = value {
                headers.append(name, value);
            }
        }
    }
}

/// The legacy fields' names, in the order [`Fields`] holds them.
const LEGACY: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];

/// The fields for a decision under the policy version `advert` is of.
pub(super) fn fields(advert: &Advert, decision: &Decision, legacy: bool) -> Option<Fields> {
    let item = advert.items.get(decision.tightest_limit())?;
    let wait = decision.retry_after().map(whole_seconds);
    let value = ratelimit_value(item, decision);
    let legacy = legacy.then(|| {
        let max = advert.maxes.get(decision.tightest_limit()).copied();
        [
            max.map(HeaderValue::from),
            Some(HeaderValue::from(decision.remaining())),
            wait.map(HeaderValue::from),
        ]
    });
    Some(Fields { policy: advert.policy.clone()?, value: HeaderValue::from_bytes(&value).ok()?, legacy })
}
