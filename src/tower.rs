//! A [`tower`](https://docs.rs/tower) layer that rate-limits any `http::Request` service
//! (axum, hyper, tonic): feature `tower` (and `axum` for axum's `ConnectInfo`).
//!
//! Per request the layer normalises the path and picks the route's [`Limiter`] (the first
//! route whose prefix the normalised path is under, else the default: see
//! [`RateLimitLayer::route`] for what normalising does and which paths are refused), takes
//! the key from a [`KeyExtractor`] and the cost from a [`Cost`], and checks it. An admitted
//! request goes to the inner service unchanged, and its response carries the `RateLimit`
//! fields (unless turned off). Any other request is answered by the layer, through its
//! refusal handler ([`RateLimitLayer::on_refusal`], [`RateLimitLayer::problem_json`]);
//! by default:
//!
//! | [`RefusalKind`] | status | fields |
//! |---|---|---|
//! | admitted (no refusal) | the service's | `RateLimit-Policy`, `RateLimit: "name";r=remaining` |
//! | `Limited` | 429 Too Many Requests | `Retry-After` (whole seconds, rounded up), `RateLimit-Policy`, `RateLimit: "name";r=0;t=retry` |
//! | `CostTooLarge` (a cost above a limit's `max`: it can never pass) | 413 Content Too Large | `RateLimit-Policy`, `RateLimit` (no `Retry-After`) |
//! | `TableFull` (the route's limiter at `max_keys`) | 503 Service Unavailable | none |
//! | `MissingKey` (no key, no fallback key) | 500 Internal Server Error | none |
//! | `UnsafePath` (no single normal form: a dot segment, an encoded `/`) | 400 Bad Request | none |
//!
//! Every route's limiter must have [`max_keys`](crate::LimiterBuilder::max_keys): keys come
//! from clients, and a client choosing new keys (addresses, header values) must not grow
//! memory without bound. At the bound, new keys get `TableFull` until a sweep frees room;
//! keys already held are checked as usual.
//!
//! The fields follow the IETF draft `draft-ietf-httpapi-ratelimit-headers-10` (structured
//! fields). `RateLimit-Policy` lists every limit of the **policy version that decided the
//! request** (a key's tier, its override, the version after `update_policy`) as
//! `"name";q=max;w=window_seconds`: the name is the route's, then `.policy` when the limiter
//! has several named policies, then `.index` when the policy has several limits
//! (`"api.paid.0"`); a window that is not whole seconds is advertised without `w` (the
//! draft's `w` is whole seconds and optional). `RateLimit` reports the limit that decided:
//! the tightest on admission, the refusing one on refusal, with `r` the units remaining and,
//! on refusal, `t` the seconds until the request would fit. Names must be printable ASCII
//! ([`LayerError::InvalidName`]). Layers stack: an admitted response carries one
//! `RateLimit` line per layer it passed. A sliding window has no single reset instant for
//! an admitted request, so `t` is left out there (the draft makes it optional).
//!
//! ```
//! use std::net::IpAddr;
//! use slidegate::tower::{PeerIp, RateLimitLayer};
//! use slidegate::{Limit, Limiter};
//!
//! let everything = Limiter::<IpAddr>::builder().limit(Limit::per_second(100)).max_keys(1_000_000).build()?;
//! let login = Limiter::<IpAddr>::builder().limit(Limit::per_minute(5)).max_keys(1_000_000).build()?;
//! let layer = RateLimitLayer::new("default", everything, PeerIp)?.route("/login", "login", login)?;
//! // axum: Router::new().route(...).layer(layer)
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::layout::Policy as LimiterPolicy;
use crate::{Decision, Denial, Limit, Limiter};

mod client_ip;
mod path;

pub use client_ip::ForwardedFor;

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Takes the rate-limiting key from a request; `None` when it has none (see
/// [`RateLimitLayer::fallback_key`]).
///
/// ```
/// use http::Request;
/// use slidegate::tower::{HeaderKey, KeyExtractor};
///
/// let api_key = HeaderKey::new("x-api-key").unwrap();
/// let req = Request::builder().header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(api_key.extract(&req).unwrap(), "k-123");
/// assert!(api_key.extract(&Request::new(())).is_none());
/// ```
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key type of the limiters the extracted keys are checked against.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// The request's key, if it has one.
    fn extract(&self, req: &Request<B>) -> Option<Self::Key>;
}

/// The peer's IP address: from a `SocketAddr` in the request's extensions (insert one per
/// connection in a hyper server), or, with feature `axum`, from axum's
/// `ConnectInfo<SocketAddr>` (`into_make_service_with_connect_info::<SocketAddr>()`). An
/// IPv6 peer is keyed by its /64, as [`ForwardedFor`] does (`ForwardedFor::new(0)` is the
/// peer address with a prefix of your choice).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use slidegate::tower::{KeyExtractor, PeerIp};
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert("192.0.2.7:5555".parse::<SocketAddr>().unwrap());
/// assert_eq!(PeerIp.extract(&req), Some("192.0.2.7".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl PeerIp {
    fn of<B>(req: &Request<B>) -> Option<IpAddr> {
        if let Some(addr) = req.extensions().get::<SocketAddr>() {
            return Some(addr.ip());
        }
        #[cfg(feature = "axum")]
        if let Some(info) = req.extensions().get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(info.0.ip());
        }
        None
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    type Key = IpAddr;

    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        PeerIp::of(req).map(|ip| client_ip::masked(ip, 64))
    }
}

/// A request header's value (an API key, a player token), compared byte for byte.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name` (e.g. `"x-api-key"`, matched without regard to case);
    /// [`LayerError::InvalidHeaderName`] if `name` is not a valid header name.
    ///
    /// ```
    /// use slidegate::tower::HeaderKey;
    /// let key = HeaderKey::new("authorization")?;
    /// assert!(HeaderKey::new("x api key").is_err());
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn new(name: &str) -> Result<HeaderKey, LayerError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| LayerError::InvalidHeaderName { name: name.to_owned() })?;
        Ok(HeaderKey { name })
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    type Key = HeaderValue;

    fn extract(&self, req: &Request<B>) -> Option<HeaderValue> {
        req.headers().get(&self.name).cloned()
    }
}

/// The request's path: one budget per route, shared by all clients.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{KeyExtractor, PathKey};
/// let req = Request::get("/search?q=x").body(()).unwrap();
/// assert_eq!(PathKey.extract(&req).as_deref(), Some("/search"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl<B> KeyExtractor<B> for PathKey {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        Some(req.uri().path().to_owned())
    }
}

/// A closure as a [`KeyExtractor`]: see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

/// A key extractor from a closure.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{key_fn, KeyExtractor};
///
/// // The player id from the path `/players/{id}/...`.
/// let player = key_fn(|req: &Request<()>| req.uri().path().split('/').nth(2)?.parse::<u64>().ok());
/// assert_eq!(player.extract(&Request::get("/players/42/move").body(()).unwrap()), Some(42));
/// ```
pub fn key_fn<B, K, F>(f: F) -> KeyFn<F>
where
    F: Fn(&Request<B>) -> Option<K> + Clone + Send + Sync + 'static,
{
    KeyFn(f)
}

impl<B, K, F> KeyExtractor<B> for KeyFn<F>
where
    F: Fn(&Request<B>) -> Option<K> + Clone + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, req: &Request<B>) -> Option<K> {
        (self.0)(req)
    }
}

/// How many units a request weighs.
pub trait Cost<B>: Clone + Send + Sync + 'static {
    /// The request's cost (0 consumes nothing).
    fn cost(&self, req: &Request<B>) -> u64;
}

/// Every request costs one unit (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitCost;

impl<B> Cost<B> for UnitCost {
    fn cost(&self, _: &Request<B>) -> u64 {
        1
    }
}

/// A closure as a [`Cost`]: see [`RateLimitLayer::cost`].
#[derive(Clone)]
pub struct CostFn<F>(F);

impl<F> fmt::Debug for CostFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CostFn")
    }
}

impl<B, F> Cost<B> for CostFn<F>
where
    F: Fn(&Request<B>) -> u64 + Clone + Send + Sync + 'static,
{
    fn cost(&self, req: &Request<B>) -> u64 {
        (self.0)(req)
    }
}

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
    /// A header name that is not one ([`HeaderKey::new`]).
    InvalidHeaderName {
        /// The name.
        name: String,
    },
    /// A trusted network that is neither a CIDR nor an address ([`ForwardedFor::trusting`]).
    InvalidNetwork {
        /// The entry.
        network: String,
    },
    /// A route prefix without a single normal form (see [`RateLimitLayer::route`]).
    InvalidRoute {
        /// The prefix.
        prefix: String,
        /// Why.
        reason: &'static str,
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
        }
    }
}

impl std::error::Error for LayerError {}

/// The `RateLimit-Policy` value and item names of one version of one policy of a route.
struct Advert {
    version: u64,
    policy: Option<HeaderValue>,
    items: Vec<String>,
}

/// A cached [`Advert`], loaded without touching its reference count.
type AdvertGuard = arc_swap::Guard<Option<Arc<Advert>>>;

/// One route: its name, the normalised prefix it applies below (empty for the default),
/// its limiter, and the headers of the policy versions it has seen, one per named policy.
#[derive(Clone)]
struct Route<K> {
    name: String,
    prefix: String,
    limiter: Arc<Limiter<K>>,
    adverts: Arc<[ArcSwapOption<Advert>]>,
}

/// A name as a structured-field string's content, if it can be one.
fn field_name(name: &str) -> Result<String, LayerError> {
    let printable = |c: char| c == ' ' || c.is_ascii_graphic();
    if name.is_empty() || !name.chars().all(printable) {
        return Err(LayerError::InvalidName { name: name.to_owned() });
    }
    Ok(name.replace('\\', "\\\\").replace('"', "\\\""))
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Route<K> {
    fn new(name: &str, prefix: String, limiter: Arc<Limiter<K>>) -> Result<Route<K>, LayerError> {
        field_name(name)?;
        for policy in limiter.policy_names() {
            field_name(policy)?;
        }
        if limiter.max_keys().is_none() {
            return Err(LayerError::UnboundedKeys { name: name.to_owned() });
        }
        let adverts = (0..limiter.tier_count()).map(|_| ArcSwapOption::empty()).collect();
        Ok(Route { name: name.to_owned(), prefix, limiter, adverts })
    }

    /// The headers of `policy`, the version that decided a request: cached per named
    /// policy, rebuilt when a newer version decides.
    fn advert(&self, policy: &LimiterPolicy) -> Option<AdvertGuard> {
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
        let limits: Vec<&Limit> = policy.limits().collect();
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
        Advert { version: policy.version(), policy: HeaderValue::from_str(&value).ok(), items }
    }
}

/// Seconds, rounded up (at least 1 for any non-zero duration; saturating near `Duration::MAX`).
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// What to do with a request the extractor finds no key in.
#[derive(Clone)]
enum Missing<K> {
    Refuse,
    Fallback(K),
}

#[derive(Clone)]
struct Config<K, X, C, R> {
    default: Route<K>,
    routes: Vec<Route<K>>,
    extractor: X,
    cost: C,
    missing: Missing<K>,
    headers_on_success: bool,
    ignore_case: bool,
    refuse: R,
}

impl<K, X, C, R> Config<K, X, C, R> {
    /// The route of a request's path: the first whose prefix the normalised path is under,
    /// else the default; an error for a path without a single normal form.
    fn route(&self, path: &str) -> Result<&Route<K>, path::Unsafe> {
        let path = path::normalize(path, self.ignore_case)?;
        Ok(self.routes.iter().find(|r| path::under(&path, &r.prefix)).unwrap_or(&self.default))
    }
}

/// The layer: see the [module docs](self).
pub struct RateLimitLayer<K, X, C = UnitCost, R = DefaultRefusals> {
    config: Arc<Config<K, X, C, R>>,
}

impl<K, X, C, R> Clone for RateLimitLayer<K, X, C, R> {
    fn clone(&self) -> Self {
        RateLimitLayer { config: Arc::clone(&self.config) }
    }
}

impl<K, X, C, R> fmt::Debug for RateLimitLayer<K, X, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: Vec<_> = self.config.routes.iter().map(|r| (&r.prefix, &r.name)).collect();
        f.debug_struct("RateLimitLayer")
            .field("default", &self.config.default.name)
            .field("routes", &routes)
            .field("headers_on_success", &self.config.headers_on_success)
            .field("ignore_case", &self.config.ignore_case)
            .finish()
    }
}

impl<K, X> RateLimitLayer<K, X, UnitCost, DefaultRefusals>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A layer checking every request against `limiter` (named `name` in the headers),
    /// keyed by `extractor`, one unit per request. The limiter must have
    /// [`max_keys`](crate::LimiterBuilder::max_keys) (keys come from clients), and `name`
    /// and its policies' names must be printable ASCII: else [`LayerError`].
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<http::HeaderValue>::builder()
    ///     .limit(Limit::per_second(100))
    ///     .max_keys(1_000_000)
    ///     .build()?;
    /// let layer = RateLimitLayer::new("api", limiter, HeaderKey::new("x-api-key")?)?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(name: &str, limiter: impl Into<Arc<Limiter<K>>>, extractor: X) -> Result<Self, LayerError> {
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                default: Route::new(name, String::new(), limiter.into())?,
                routes: Vec::new(),
                extractor,
                cost: UnitCost,
                missing: Missing::Refuse,
                headers_on_success: true,
                ignore_case: false,
                refuse: DefaultRefusals,
            }),
        })
    }
}

impl<K, X, C, R> RateLimitLayer<K, X, C, R>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Clone,
    C: Clone,
    R: Clone,
{
    /// The configuration to edit: this layer's own, or a copy if services share it.
    fn edit(self, f: impl FnOnce(&mut Config<K, X, C, R>)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        f(&mut config);
        RateLimitLayer { config: Arc::new(config) }
    }

    /// The same layer with another cost or refusal handler.
    fn with<C2, R2>(
        self,
        cost: impl FnOnce(C) -> C2,
        refuse: impl FnOnce(R) -> R2,
    ) -> RateLimitLayer<K, X, C2, R2> {
        let c = Arc::unwrap_or_clone(self.config);
        RateLimitLayer {
            config: Arc::new(Config {
                default: c.default,
                routes: c.routes,
                extractor: c.extractor,
                cost: cost(c.cost),
                missing: c.missing,
                headers_on_success: c.headers_on_success,
                ignore_case: c.ignore_case,
                refuse: refuse(c.refuse),
            }),
        }
    }

    /// Requests whose path is `prefix` or below it (`/login` matches `/login` and
    /// `/login/x`, not `/loginx`) are checked against `limiter` instead of the default.
    /// Routes are tried in the order added; the first match wins.
    ///
    /// **Paths are matched as an upstream that normalises would route them**, so that no
    /// other spelling of a limited path escapes its limit: percent-escapes decoded
    /// (`/%6Cogin` is `/login`), repeated slashes merged (`//login`), path parameters
    /// dropped (`/login;x=1`), and, with [`ignore_case`](Self::ignore_case), ASCII case
    /// folded. A path that has no single normal form is refused with 400 Bad Request
    /// ([`RefusalKind::UnsafePath`]) whatever its route, as servers disagree on what it
    /// means: an encoded `/`, `\`, `%` or control byte (`/%2Flogin`), a malformed escape,
    /// a raw `\`, and a dot segment (`.` or `..`, encoded or not, with or without
    /// parameters: `/users/..`, `/users/%2e%2e;x=1`). An upstream that resolves dot
    /// segments routes `/users/..` to `/`, while axum routes it to `/users/{id}`; clients
    /// resolve them before sending, so refusing them costs no real request, and it
    /// guarantees that normalising never takes a path out from under a prefix its raw form
    /// is under. `prefix` itself is normalised the same way ([`LayerError::InvalidRoute`]
    /// if it cannot be). The request is passed on unchanged.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let all = Limiter::<IpAddr>::builder().limit(Limit::per_second(100)).max_keys(100_000).build()?;
    /// let login = Limiter::<IpAddr>::builder().limit(Limit::per_minute(5)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("default", all, PeerIp)?.route("/login", "login", login)?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn route(
        self,
        prefix: &str,
        name: &str,
        limiter: impl Into<Arc<Limiter<K>>>,
    ) -> Result<Self, LayerError> {
        let normal = path::normalize(prefix, self.config.ignore_case)
            .map_err(|e| LayerError::InvalidRoute { prefix: prefix.to_owned(), reason: e.reason() })?;
        let route = Route::new(name, normal.into_owned(), limiter.into())?;
        Ok(self.edit(|c| c.routes.push(route)))
    }

    /// Match routes without regard to ASCII case (`/LOGIN` is under `/login`), for
    /// upstreams that route that way; off by default (axum, hyper and most routers are
    /// case-sensitive). Set it before adding routes.
    ///
    /// ```
    /// use slidegate::tower::{PathKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(10)).max_keys(10_000).build()?;
    /// let layer = RateLimitLayer::new("paths", limiter, PathKey)?.ignore_case(true);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ignore_case(self, on: bool) -> Self {
        self.edit(|c| {
            c.ignore_case = on;
            for route in &mut c.routes {
                if on {
                    route.prefix.make_ascii_lowercase();
                }
            }
        })
    }

    /// Requests the extractor finds no key in share `key`'s budget, instead of being
    /// refused ([`RefusalKind::MissingKey`]).
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let anonymous = http::HeaderValue::from_static("anonymous");
    /// let layer = RateLimitLayer::new("api", limiter, HeaderKey::new("x-api-key")?)?.fallback_key(anonymous);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fallback_key(self, key: K) -> Self {
        self.edit(|c| c.missing = Missing::Fallback(key))
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (default: yes).
    ///
    /// ```
    /// use slidegate::tower::{PathKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(10)).max_keys(10_000).build()?;
    /// let layer = RateLimitLayer::new("paths", limiter, PathKey)?.headers_on_success(false);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn headers_on_success(self, on: bool) -> Self {
        self.edit(|c| c.headers_on_success = on)
    }

    /// Weighs each request with `cost` (e.g. by method, or by a declared size).
    ///
    /// ```
    /// use http::{Method, Request};
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("writes", limiter, PeerIp)?
    ///     .cost(|req: &Request<()>| if req.method() == Method::GET { 1 } else { 5 });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost<B, F>(self, cost: F) -> RateLimitLayer<K, X, CostFn<F>, R>
    where
        F: Fn(&Request<B>) -> u64 + Clone + Send + Sync + 'static,
    {
        self.with(|_| CostFn(cost), |r| r)
    }

    /// Answers refusals with `respond`'s response instead of the defaults (see
    /// [`Refusal`]): for a custom body, other statuses, or logging.
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use slidegate::tower::{PeerIp, RateLimitLayer, Refusal, RefusalKind};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.on_refusal(|refusal: &Refusal| {
    ///     let mut response = refusal.response(format!("slow down ({})", refusal.detail()));
    ///     if refusal.kind() == RefusalKind::MissingKey {
    ///         *response.status_mut() = StatusCode::BAD_REQUEST;
    ///     }
    ///     response
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_refusal<B, F>(self, respond: F) -> RateLimitLayer<K, X, C, RefuseFn<F>>
    where
        F: Fn(&Refusal) -> Response<B> + Clone + Send + Sync + 'static,
    {
        self.with(|c| c, |_| RefuseFn(respond))
    }

    /// Answers refusals with an `application/problem+json` body (RFC 9457:
    /// [`Refusal::problem_details`]) beside the default status and headers.
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.problem_json();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn problem_json(self) -> RateLimitLayer<K, X, C, ProblemJson> {
        self.with(|c| c, |_| ProblemJson)
    }
}

/// Why the layer answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// A limit has no room now: 429 Too Many Requests, with `Retry-After`.
    Limited,
    /// The cost is above a limit's `max`, so the request can never pass: 413 Content Too
    /// Large, without `Retry-After`.
    CostTooLarge,
    /// The key is new and the route's limiter is at `max_keys`: 503 Service Unavailable
    /// (room comes back as idle keys are swept).
    TableFull,
    /// The extractor found no key and there is no fallback key: 500 Internal Server Error
    /// (the layer is configured for requests it cannot key).
    MissingKey,
    /// The path has no single normal form (a dot segment, an encoded `/`: see
    /// [`RateLimitLayer::route`]): 400 Bad Request.
    UnsafePath,
}

/// A request the layer answers itself, given to the refusal handler
/// ([`RateLimitLayer::on_refusal`]): what happened, the default status, and the
/// `Retry-After`, `RateLimit-Policy` and `RateLimit` fields that go with it.
///
/// ```
/// use http::StatusCode;
/// use slidegate::tower::{Refusal, RefusalKind};
/// # fn handler(refusal: &Refusal) -> http::Response<String> {
/// match refusal.kind() {
///     RefusalKind::Limited => assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS),
///     _ => {}
/// }
/// refusal.response(refusal.problem_details())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Refusal {
    kind: RefusalKind,
    route: String,
    decision: Option<Decision>,
    headers: HeaderMap,
    detail: &'static str,
}

impl Refusal {
    /// What happened.
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// let kind = refusal.kind();
    /// # let _ = kind; }
    /// ```
    pub fn kind(&self) -> RefusalKind {
        self.kind
    }

    /// The route's name (that of the default route for a missing key or an unsafe path).
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// println!("refused on {}", refusal.route());
    /// # }
    /// ```
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The limiter's decision, for refusals that come from one (`Limited`, `CostTooLarge`,
    /// `TableFull`).
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// let wait = refusal.decision().and_then(|d| d.retry_after());
    /// # let _ = wait; }
    /// ```
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    /// The default status: 429, 413, 503, 500 or 400 (see [`RefusalKind`]).
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// assert!(refusal.status().is_client_error() || refusal.status().is_server_error());
    /// # }
    /// ```
    pub fn status(&self) -> StatusCode {
        match self.kind {
            RefusalKind::Limited => StatusCode::TOO_MANY_REQUESTS,
            RefusalKind::CostTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            RefusalKind::TableFull => StatusCode::SERVICE_UNAVAILABLE,
            RefusalKind::MissingKey => StatusCode::INTERNAL_SERVER_ERROR,
            RefusalKind::UnsafePath => StatusCode::BAD_REQUEST,
        }
    }

    /// The fields the default response carries: `Retry-After` (whole seconds, rounded up)
    /// when waiting helps, and `RateLimit-Policy` and `RateLimit` for `Limited` and
    /// `CostTooLarge`.
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// let retry = refusal.headers().get(http::header::RETRY_AFTER);
    /// # let _ = retry; }
    /// ```
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// One sentence saying what happened, for a body or a log.
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// assert!(!refusal.detail().is_empty());
    /// # }
    /// ```
    pub fn detail(&self) -> &str {
        self.detail
    }

    /// An RFC 9457 problem details object: `type` (`about:blank`), `title` (the status's
    /// reason), `status`, `detail`, and `retry_after` (seconds) when waiting helps.
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// assert!(refusal.problem_details().starts_with("{\"type\":\"about:blank\""));
    /// # }
    /// ```
    pub fn problem_details(&self) -> String {
        let status = self.status();
        let mut json = format!(
            "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":\"{}\"",
            status.canonical_reason().unwrap_or_default(),
            status.as_u16(),
            // A JSON string: the details are ASCII sentences, some quoting a backslash.
            self.detail.replace('\\', "\\\\").replace('"', "\\\"")
        );
        if let Some(wait) = self.decision.and_then(|d| d.retry_after()) {
            json.push_str(&format!(",\"retry_after\":{}", whole_seconds(wait)));
        }
        json.push('}');
        json
    }

    /// The default response with `body`: [`status`](Self::status) and
    /// [`headers`](Self::headers).
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) -> http::Response<String> {
    /// refusal.response(String::from("try again later"))
    /// # }
    /// ```
    pub fn response<B>(&self, body: B) -> Response<B> {
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// Turns a [`Refusal`] into the response sent back.
pub trait Refuse<B>: Clone + Send + Sync + 'static {
    /// The response for `refusal`.
    ///
    /// ```
    /// use slidegate::tower::{DefaultRefusals, Refusal, Refuse};
    /// # fn f(refusal: &Refusal) {
    /// let response: http::Response<String> = DefaultRefusals.respond(refusal);
    /// # let _ = response; }
    /// ```
    fn respond(&self, refusal: &Refusal) -> http::Response<B>;
}

/// The default refusals: [`Refusal::status`] and [`Refusal::headers`], empty body.
///
/// ```
/// use slidegate::tower::DefaultRefusals;
/// let _ = DefaultRefusals;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRefusals;

impl<B: Default> Refuse<B> for DefaultRefusals {
    fn respond(&self, refusal: &Refusal) -> Response<B> {
        refusal.response(B::default())
    }
}

/// Refusals with an `application/problem+json` body: see [`RateLimitLayer::problem_json`].
///
/// ```
/// use slidegate::tower::ProblemJson;
/// let _ = ProblemJson;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl<B: From<String>> Refuse<B> for ProblemJson {
    fn respond(&self, refusal: &Refusal) -> Response<B> {
        let mut response = refusal.response(B::from(refusal.problem_details()));
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        response
    }
}

/// A closure as a [`Refuse`]: see [`RateLimitLayer::on_refusal`].
#[derive(Clone)]
pub struct RefuseFn<F>(F);

impl<F> fmt::Debug for RefuseFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RefuseFn")
    }
}

impl<B, F> Refuse<B> for RefuseFn<F>
where
    F: Fn(&Refusal) -> Response<B> + Clone + Send + Sync + 'static,
{
    fn respond(&self, refusal: &Refusal) -> Response<B> {
        (self.0)(refusal)
    }
}

impl<S, K, X, C, R> Layer<S> for RateLimitLayer<K, X, C, R> {
    type Service = RateLimit<S, K, X, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, config: Arc::clone(&self.config) }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
pub struct RateLimit<S, K, X, C = UnitCost, R = DefaultRefusals> {
    inner: S,
    config: Arc<Config<K, X, C, R>>,
}

impl<S: Clone, K, X, C, R> Clone for RateLimit<S, K, X, C, R> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), config: Arc::clone(&self.config) }
    }
}

impl<S: fmt::Debug, K, X, C, R> fmt::Debug for RateLimit<S, K, X, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, K, X, C, R, B, ResBody> Service<Request<B>> for RateLimit<S, K, X, C, R>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: Default,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyExtractor<B, Key = K>,
    C: Cost<B>,
    R: Refuse<ResBody>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let config = &*self.config;
        let refuse = |kind, route: &Route<K>| {
            let refusal = Refusal::without_decision(kind, route);
            ResponseFuture::answer(config.refuse.respond(&refusal))
        };
        let route = match config.route(req.uri().path()) {
            Ok(route) => route,
            Err(_) => return refuse(RefusalKind::UnsafePath, &config.default),
        };
        let key = match (config.extractor.extract(&req), &config.missing) {
            (Some(key), _) => key,
            (None, Missing::Fallback(key)) => key.clone(),
            (None, Missing::Refuse) => return refuse(RefusalKind::MissingKey, route),
        };
        let cost = config.cost.cost(&req);
        let advert = Cell::new(None);
        let decision = route.limiter.check_n_seen(&key, cost, |policy| advert.set(route.advert(policy)));
        let advert = advert.into_inner();
        let advert = advert.as_ref().and_then(|a| a.as_deref());
        if decision.is_allowed() {
            let headers = advert.filter(|_| config.headers_on_success).and_then(|a| fields(a, &decision));
            return ResponseFuture::forward(self.inner.call(req), headers);
        }
        let refusal = Refusal::of(route, decision, advert);
        ResponseFuture::answer(config.refuse.respond(&refusal))
    }
}

impl Refusal {
    fn without_decision<K>(kind: RefusalKind, route: &Route<K>) -> Refusal {
        let detail = match kind {
            RefusalKind::MissingKey => "the request carries no rate-limiting key",
            _ => "the request path has no single normal form (a '.' or '..' segment, an encoded '/', '\\' or '%', a malformed escape, or a '\\')",
        };
        Refusal { kind, route: route.name.clone(), decision: None, headers: HeaderMap::new(), detail }
    }

    fn of<K>(route: &Route<K>, decision: Decision, advert: Option<&Advert>) -> Refusal {
        let (kind, detail) = match decision.denial() {
            Some(Denial::TooManyKeys) => {
                (RefusalKind::TableFull, "the rate limiter holds as many keys as it may")
            }
            Some(Denial::CostTooLarge(_)) => {
                (RefusalKind::CostTooLarge, "the request costs more than a limit allows at once")
            }
            _ => (RefusalKind::Limited, "the rate limit is exhausted; retry later"),
        };
        let mut headers = HeaderMap::new();
        if kind != RefusalKind::TableFull {
            if let Some(wait) = decision.retry_after() {
                headers.insert(RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
            }
            if let Some((policy, value)) = advert.and_then(|a| fields(a, &decision)) {
                headers.insert(RATELIMIT_POLICY, policy);
                headers.insert(RATELIMIT, value);
            }
        }
        Refusal { kind, route: route.name.clone(), decision: Some(decision), headers, detail }
    }
}

/// `(RateLimit-Policy, RateLimit)` for a decision under the policy version `advert` is of.
fn fields(advert: &Advert, decision: &Decision) -> Option<(HeaderValue, HeaderValue)> {
    let item = advert.items.get(decision.tightest_limit())?;
    // No `format!` machinery: this runs on every request.
    let mut value = Vec::with_capacity(item.len().saturating_add(32));
    value.push(b'"');
    value.extend_from_slice(item.as_bytes());
    value.extend_from_slice(b"\";r=");
    push_decimal(&mut value, decision.remaining());
    if let Some(wait) = decision.retry_after() {
        value.extend_from_slice(b";t=");
        push_decimal(&mut value, whole_seconds(wait));
    }
    Some((advert.policy.clone()?, HeaderValue::from_bytes(&value).ok()?))
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

fn status<ResBody: Default>(code: StatusCode) -> Response<ResBody> {
    let mut response = Response::new(ResBody::default());
    *response.status_mut() = code;
    response
}

pin_project_lite::pin_project! {
    /// The future of [`RateLimit`]: the inner service's response with the `RateLimit`
    /// headers added, or the refusal.
    pub struct ResponseFuture<F, ResBody> {
        #[pin]
        inner: Option<F>,
        headers: Option<(HeaderValue, HeaderValue)>,
        answer: Option<Response<ResBody>>,
    }
}

impl<F, ResBody> ResponseFuture<F, ResBody> {
    fn forward(inner: F, headers: Option<(HeaderValue, HeaderValue)>) -> Self {
        ResponseFuture { inner: Some(inner), headers, answer: None }
    }

    fn answer(response: Response<ResBody>) -> Self {
        ResponseFuture { inner: None, headers: None, answer: Some(response) }
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F, ResBody>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(inner) => {
                let mut response = match inner.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    other => return other,
                };
                if let Some((policy, value)) = this.headers.take() {
                    // Appended: an inner layer's (or the service's own) policies stay, and the
                    // field lines together form one list, as the draft allows.
                    response.headers_mut().append(RATELIMIT_POLICY, policy);
                    response.headers_mut().append(RATELIMIT, value);
                }
                Poll::Ready(Ok(response))
            }
            // Polled again after completion: an empty 500 rather than a panic.
            None => Poll::Ready(Ok(this
                .answer
                .take()
                .unwrap_or_else(|| status(StatusCode::INTERNAL_SERVER_ERROR)))),
        }
    }
}
