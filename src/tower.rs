//! A [`tower`](https://docs.rs/tower) layer that rate-limits any `http::Request` service
//! (axum, hyper, tonic): feature `tower` (and `axum` for axum's `ConnectInfo`).
//!
//! Per request the layer picks the route's [`Limiter`] (the first route whose path prefix
//! matches, else the default), takes the key from a [`KeyExtractor`] and the cost from a
//! [`Cost`], and checks it. An admitted request goes to the inner service, and its response
//! carries the `RateLimit` header (unless turned off). A refused one is answered here:
//!
//! | decision | status | headers |
//! |---|---|---|
//! | admitted | the service's | `RateLimit-Policy`, `RateLimit: "name";r=remaining` |
//! | refused by a limit | 429 Too Many Requests | `Retry-After` (whole seconds, rounded up), `RateLimit-Policy`, `RateLimit: "name";r=0;t=retry` |
//! | cost above a limit's `max` | 429 | `RateLimit-Policy`, `RateLimit` (no `Retry-After`: it can never pass) |
//! | key table full (`max_keys`) | 503 Service Unavailable | none |
//! | no key and no fallback key | 500 Internal Server Error | none |
//!
//! The header fields follow the IETF draft `draft-ietf-httpapi-ratelimit-headers-10`
//! (structured fields): `RateLimit-Policy` lists every limit of the route's limiter as
//! `"name";q=max;w=window_seconds` (the limit's index follows the name when there are
//! several: `"api.0"`, `"api.1"`), and `RateLimit` reports the limit that decided: the
//! tightest on admission, the refusing one on refusal, with `r` the units remaining and,
//! on refusal, `t` the seconds until the request would fit. Layers stack: an admitted
//! response carries one `RateLimit` line per layer it passed. A sliding window has no single
//! reset instant for an admitted request, so `t` is left out there (the draft makes it
//! optional).
//!
//! ```
//! use std::net::IpAddr;
//! use slidegate::tower::{PeerIp, RateLimitLayer};
//! use slidegate::{Limit, Limiter};
//!
//! let everything = Limiter::<IpAddr>::builder().limit(Limit::per_second(100)).build()?;
//! let login = Limiter::<IpAddr>::builder().limit(Limit::per_minute(5)).build()?;
//! let layer = RateLimitLayer::new("default", everything, PeerIp).route("/login", "login", login);
//! // axum: Router::new().route(...).layer(layer)
//! # let _ = layer;
//! # Ok::<(), slidegate::ConfigError>(())
//! ```

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Decision, Denial, Limit, Limiter};

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
/// let api_key = HeaderKey::new("x-api-key");
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
/// `ConnectInfo<SocketAddr>` (`into_make_service_with_connect_info::<SocketAddr>()`).
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
        PeerIp::of(req)
    }
}

/// The client's IP address behind `trusted` reverse proxies: each proxy appends the
/// address it received the request from to `X-Forwarded-For`, so the client is the
/// `trusted`-th entry from the right; entries further left were written by the client and
/// are ignored, so spoofing them does not change the key. With fewer entries than
/// `trusted` (or none, or `trusted == 0`), the request did not come through the proxies and
/// the peer address ([`PeerIp`]) is the key. Only sound if clients cannot reach the server
/// except through those proxies.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{ForwardedFor, KeyExtractor};
///
/// // client -> proxy -> us: the proxy appended the client's address.
/// let req = Request::builder().header("x-forwarded-for", "6.6.6.6, 203.0.113.9").body(()).unwrap();
/// assert_eq!(ForwardedFor::new(1).extract(&req), Some("203.0.113.9".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ForwardedFor {
    trusted: usize,
}

impl ForwardedFor {
    /// Keys by the address `trusted` hops back in `X-Forwarded-For`.
    pub fn new(trusted: usize) -> ForwardedFor {
        ForwardedFor { trusted }
    }
}

impl<B> KeyExtractor<B> for ForwardedFor {
    type Key = IpAddr;

    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        if self.trusted > 0 {
            // Several header lines form one list, in order.
            let hops = req
                .headers()
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .collect::<Vec<_>>();
            if let Some(hop) = hops.len().checked_sub(self.trusted).and_then(|i| hops.get(i)) {
                // A malformed hop appended by a trusted proxy is no key at all.
                return hop.parse().ok();
            }
        }
        PeerIp::of(req)
    }
}

/// A request header's value (an API key, a player token), compared byte for byte.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name` (e.g. `"x-api-key"`). A name that is not a valid header
    /// name matches no request.
    ///
    /// ```
    /// let key = slidegate::tower::HeaderKey::new("authorization");
    /// # let _ = key;
    /// ```
    pub fn new(name: &str) -> HeaderKey {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or(HeaderName::from_static("x-invalid-header-name"));
        HeaderKey { name }
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

/// One named limiter and its precomputed `RateLimit-Policy` value.
#[derive(Clone)]
struct Policy<K> {
    name: String,
    limiter: Arc<Limiter<K>>,
    /// `RateLimit-Policy` for this limiter, and each limit's item name.
    header: Option<HeaderValue>,
    items: Vec<String>,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Policy<K> {
    fn new(name: &str, limiter: Arc<Limiter<K>>) -> Policy<K> {
        let limits: Vec<Limit> = limiter.limits();
        // Structured-field strings: printable ASCII, with `"` and `\` escaped.
        let clean: String = name.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').collect();
        let clean = clean.replace('\\', "\\\\").replace('"', "\\\"");
        let items: Vec<String> = if limits.len() == 1 {
            vec![clean.clone()]
        } else {
            (0..limits.len()).map(|i| format!("{clean}.{i}")).collect()
        };
        let policy = limits
            .iter()
            .zip(&items)
            .map(|(l, item)| format!("\"{item}\";q={};w={}", l.max(), whole_seconds(l.window())))
            .collect::<Vec<_>>()
            .join(", ");
        let header = HeaderValue::from_str(&policy).ok();
        Policy { name: name.to_owned(), limiter, header, items }
    }
}

/// Seconds, rounded up (at least 1 for any non-zero duration; saturating near `Duration::MAX`).
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[derive(Clone)]
struct Route<K> {
    prefix: String,
    policy: Policy<K>,
}

/// What to do with a request the extractor finds no key in.
#[derive(Clone)]
enum Missing<K> {
    Reject,
    Fallback(K),
}

#[derive(Clone)]
struct Config<K, X, C> {
    default: Policy<K>,
    routes: Vec<Route<K>>,
    extractor: X,
    cost: C,
    missing: Missing<K>,
    headers_on_success: bool,
}

impl<K, X, C> Config<K, X, C> {
    fn policy(&self, path: &str) -> &Policy<K> {
        self.routes
            .iter()
            .find(|r| {
                path.strip_prefix(r.prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || r.prefix.ends_with('/'))
            })
            .map_or(&self.default, |r| &r.policy)
    }
}

/// The layer: see the [module docs](self).
pub struct RateLimitLayer<K, X, C = UnitCost> {
    config: Arc<Config<K, X, C>>,
}

impl<K, X, C> Clone for RateLimitLayer<K, X, C> {
    fn clone(&self) -> Self {
        RateLimitLayer { config: Arc::clone(&self.config) }
    }
}

impl<K, X, C> fmt::Debug for RateLimitLayer<K, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: Vec<_> = self.config.routes.iter().map(|r| (&r.prefix, &r.policy.name)).collect();
        f.debug_struct("RateLimitLayer")
            .field("default", &self.config.default.name)
            .field("routes", &routes)
            .field("headers_on_success", &self.config.headers_on_success)
            .finish()
    }
}

impl<K, X> RateLimitLayer<K, X, UnitCost>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A layer checking every request against `limiter` (named `name` in the headers),
    /// keyed by `extractor`, one unit per request.
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<http::HeaderValue>::builder().limit(Limit::per_second(100)).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, HeaderKey::new("x-api-key"));
    /// # let _ = layer;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn new(name: &str, limiter: impl Into<Arc<Limiter<K>>>, extractor: X) -> Self {
        RateLimitLayer {
            config: Arc::new(Config {
                default: Policy::new(name, limiter.into()),
                routes: Vec::new(),
                extractor,
                cost: UnitCost,
                missing: Missing::Reject,
                headers_on_success: true,
            }),
        }
    }
}

impl<K, X, C> RateLimitLayer<K, X, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Clone,
    C: Clone,
{
    /// The configuration to edit: this layer's own, or a copy if services share it.
    fn edit(self, f: impl FnOnce(&mut Config<K, X, C>)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        f(&mut config);
        RateLimitLayer { config: Arc::new(config) }
    }

    /// Requests whose path is `prefix` or below it (`/login` matches `/login` and
    /// `/login/x`, not `/loginx`) are checked against `limiter` instead of the default.
    /// Routes are tried in the order added; the first match wins.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let all = Limiter::<IpAddr>::builder().limit(Limit::per_second(100)).build()?;
    /// let login = Limiter::<IpAddr>::builder().limit(Limit::per_minute(5)).build()?;
    /// let layer = RateLimitLayer::new("default", all, PeerIp).route("/login", "login", login);
    /// # let _ = layer;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn route(self, prefix: &str, name: &str, limiter: impl Into<Arc<Limiter<K>>>) -> Self {
        let route = Route { prefix: prefix.to_owned(), policy: Policy::new(name, limiter.into()) };
        self.edit(|c| c.routes.push(route))
    }

    /// Requests the extractor finds no key in share `key`'s budget, instead of being
    /// answered 500.
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::builder().limit(Limit::per_second(10)).build()?;
    /// let anonymous = http::HeaderValue::from_static("anonymous");
    /// let layer = RateLimitLayer::new("api", limiter, HeaderKey::new("x-api-key")).fallback_key(anonymous);
    /// # let _ = layer;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn fallback_key(self, key: K) -> Self {
        self.edit(|c| c.missing = Missing::Fallback(key))
    }

    /// Whether admitted responses carry `RateLimit-Policy` and `RateLimit` (default: yes).
    ///
    /// ```
    /// use slidegate::tower::{PathKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(10)).build()?;
    /// let layer = RateLimitLayer::new("paths", limiter, PathKey).headers_on_success(false);
    /// # let _ = layer;
    /// # Ok::<(), slidegate::ConfigError>(())
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
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).build()?;
    /// let layer = RateLimitLayer::new("writes", limiter, PeerIp)
    ///     .cost(|req: &Request<()>| if req.method() == Method::GET { 1 } else { 5 });
    /// # let _ = layer;
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    pub fn cost<B, F>(self, cost: F) -> RateLimitLayer<K, X, CostFn<F>>
    where
        F: Fn(&Request<B>) -> u64 + Clone + Send + Sync + 'static,
    {
        let config = Arc::unwrap_or_clone(self.config);
        RateLimitLayer {
            config: Arc::new(Config {
                default: config.default,
                routes: config.routes,
                extractor: config.extractor,
                cost: CostFn(cost),
                missing: config.missing,
                headers_on_success: config.headers_on_success,
            }),
        }
    }
}

impl<S, K, X, C> Layer<S> for RateLimitLayer<K, X, C> {
    type Service = RateLimit<S, K, X, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, config: Arc::clone(&self.config) }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
pub struct RateLimit<S, K, X, C = UnitCost> {
    inner: S,
    config: Arc<Config<K, X, C>>,
}

impl<S: Clone, K, X, C> Clone for RateLimit<S, K, X, C> {
    fn clone(&self) -> Self {
        RateLimit { inner: self.inner.clone(), config: Arc::clone(&self.config) }
    }
}

impl<S: fmt::Debug, K, X, C> fmt::Debug for RateLimit<S, K, X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl<S, K, X, C, B, ResBody> Service<Request<B>> for RateLimit<S, K, X, C>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: Default,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyExtractor<B, Key = K>,
    C: Cost<B>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let config = &*self.config;
        let policy = config.policy(req.uri().path());
        let key = match (config.extractor.extract(&req), &config.missing) {
            (Some(key), _) => key,
            (None, Missing::Fallback(key)) => key.clone(),
            (None, Missing::Reject) => {
                return ResponseFuture::answer(status(StatusCode::INTERNAL_SERVER_ERROR))
            }
        };
        let cost = config.cost.cost(&req);
        let decision = policy.limiter.check_n(&key, cost);
        if decision.is_allowed() {
            let headers = config.headers_on_success.then(|| headers(policy, &decision)).flatten();
            return ResponseFuture::forward(self.inner.call(req), headers);
        }
        ResponseFuture::answer(refusal(policy, &decision))
    }
}

/// `(RateLimit-Policy, RateLimit)` for a decision.
fn headers<K>(policy: &Policy<K>, decision: &Decision) -> Option<(HeaderValue, HeaderValue)> {
    let item = policy.items.get(decision.tightest_limit())?;
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
    Some((policy.header.clone()?, HeaderValue::from_bytes(&value).ok()?))
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

fn refusal<K, ResBody: Default>(policy: &Policy<K>, decision: &Decision) -> Response<ResBody> {
    if decision.denial() == Some(Denial::TooManyKeys) {
        return status(StatusCode::SERVICE_UNAVAILABLE);
    }
    let mut response = status(StatusCode::TOO_MANY_REQUESTS);
    let fields = response.headers_mut();
    if let Some(wait) = decision.retry_after() {
        fields.insert(RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
    }
    if let Some((policy_value, value)) = headers(policy, decision) {
        fields.insert(RATELIMIT_POLICY, policy_value);
        fields.insert(RATELIMIT, value);
    }
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
