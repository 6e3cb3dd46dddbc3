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
//! | `MissingKey` (no key, no fallback key: a configuration problem) | 500 Internal Server Error | none |
//! | `MalformedKey` (the key's source does not parse: a client-IP header, an `Authorization`) | 400 Bad Request | none |
//! | `KeyTooLong` (longer than the extractor's `max_len`) | 431 Request Header Fields Too Large | none |
//! | `RepeatedKey` (the key's header appears more than once) | 400 Bad Request | none |
//! | `UnsafePath` (no single normal form: a dot segment, an encoded `/`) | 400 Bad Request | none |
//!
//! Every route's limiter must have [`max_keys`](crate::LimiterBuilder::max_keys): keys come
//! from clients, and a client choosing new keys (addresses, header values) must not grow
//! memory without bound. At the bound, new keys get `TableFull` until a sweep frees room;
//! keys already held are checked as usual. The extractors that key by a request's bytes
//! cap their length ([`KeyError::TooLong`]), and a held key owns its bytes (none shares a
//! request's buffers), so the memory keys take is bounded by `max_keys` times the longest
//! key and the limiter's entry.
//!
//! Keys: [`PeerIp`] (the peer's address), [`ForwardedFor`] (the client behind trusted
//! proxies), [`HeaderKey`] (a header's value, byte for byte), [`AuthorizationKey`]
//! (credentials, the scheme's case and the whitespace after it canonicalised), [`PathKey`]
//! (the normalised path), or a closure ([`key_fn`]). A header read for a key must appear
//! once ([`KeyError::Repeated`]).
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
//! `RateLimit` line per layer it passed. A policy in shadow mode (the limiter's
//! [`shadow`](crate::LimiterBuilder::shadow), or a policy's) adds no field: its quota binds
//! no one, and a client that obeyed it would slow itself down for nothing. So a shadow
//! layer stacked inside an enforced one leaves the enforced layer's fields alone. A sliding window has no single reset instant for
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

use std::borrow::{Borrow, Cow};
use std::cell::Cell;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::HeaderName;
use http::{Method, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::Limiter;
use exempt::Exemptions;
use route::{fields, Route};

mod client_ip;
mod cost;
mod error;
mod exempt;
mod extract;
mod fields;
mod future;
mod header;
mod path;
mod problem;
mod real_ip;
mod refusal;
mod route;

pub use client_ip::{ForwardedFor, OnMalformed};
pub use cost::{Cost, CostFn, UnitCost};
pub use error::LayerError;
pub use extract::{key_fn, IntoKey, KeyError, KeyExtractor, KeyFn, PathKey, PeerIp};
pub use fields::RateLimitFields;
pub use future::ResponseFuture;
pub use header::{AuthorizationKey, HeaderKey};
pub use problem::ProblemJson;
pub use real_ip::ClientIpHeader;
pub use refusal::{DefaultRefusals, Refusal, RefusalKind, Refuse, RefuseFn};

/// The `RateLimit-Policy` field name.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field name.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

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
    legacy_headers: bool,
    ignore_case: bool,
    exempt: Exemptions<K>,
    on_shadow_denial: Option<ShadowHook<K>>,
    refuse: R,
}

/// What [`RateLimitLayer::on_shadow_denial`] calls: the route's name, the key, the decision.
type ShadowHook<K> = Arc<dyn Fn(&str, &K, &crate::Decision) + Send + Sync>;

impl<K, X, C, R> Config<K, X, C, R> {
    /// The route of a request's method and normalised path: the first that serves the
    /// method and whose prefix the path is under, else the default.
    fn route(&self, method: &Method, path: &str) -> &Route<K> {
        let found = self.routes.iter().find(|r| r.serves(method) && path::under(path, &r.prefix));
        found.unwrap_or(&self.default)
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
    /// let limiter = Limiter::<Vec<u8>>::builder()
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
                legacy_headers: false,
                ignore_case: false,
                exempt: Exemptions::default(),
                on_shadow_denial: None,
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
                legacy_headers: c.legacy_headers,
                ignore_case: c.ignore_case,
                exempt: c.exempt,
                on_shadow_denial: c.on_shadow_denial,
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

    /// [`route`](Self::route) for requests whose method is one of `methods` only; requests
    /// under `prefix` with another method go on to the next routes (and the default). A
    /// route for `GET` serves `HEAD` too, as servers answer `HEAD` with the `GET` handler
    /// (axum and hyper-based routers, nginx): a `HEAD` request must not escape a limit on
    /// the `GET` it runs.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use http::Method;
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let all = Limiter::<IpAddr>::builder().limit(Limit::per_second(100)).max_keys(100_000).build()?;
    /// let login = Limiter::<IpAddr>::builder().limit(Limit::per_minute(5)).max_keys(100_000).build()?;
    /// // Sign-in attempts only: GET /login (the form) counts on the default route.
    /// let layer = RateLimitLayer::new("default", all, PeerIp)?.route_for(&[Method::POST], "/login", "login", login)?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn route_for(
        self,
        methods: &[Method],
        prefix: &str,
        name: &str,
        limiter: impl Into<Arc<Limiter<K>>>,
    ) -> Result<Self, LayerError> {
        let mut methods = methods.to_vec();
        if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
            methods.push(Method::HEAD);
        }
        Ok(self.route(prefix, name, limiter)?.edit(|c| {
            if let Some(route) = c.routes.last_mut() {
                route.methods = methods;
            }
        }))
    }

    /// Match routes without regard to ASCII case (`/LOGIN` is under `/login`), for
    /// upstreams that route that way (Express and ASP.NET Core do by default); off by
    /// default, as axum, hyper, actix-web and nginx locations are case-sensitive. Set it
    /// before adding routes.
    ///
    /// ```
    /// use slidegate::tower::{PathKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<String>::builder().limit(Limit::per_second(10)).max_keys(10_000).build()?;
    /// let layer = RateLimitLayer::new("paths", limiter, PathKey::new().ignore_case(true))?.ignore_case(true);
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

    /// Requests the extractor finds no key in ([`KeyError::Missing`]) share `key`'s budget,
    /// instead of being refused ([`RefusalKind::MissingKey`]). A key that is there but
    /// malformed, too long or repeated is refused all the same: it is the client's error.
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let anonymous = b"anonymous".to_vec();
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
    /// let layer = RateLimitLayer::new("paths", limiter, PathKey::new())?.headers_on_success(false);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn headers_on_success(self, on: bool) -> Self {
        self.edit(|c| c.headers_on_success = on)
    }

    /// Whether responses also carry the legacy fields many client libraries still read:
    /// `X-RateLimit-Limit` (the deciding limit's `max`), `X-RateLimit-Remaining` and, on a
    /// refusal, `X-RateLimit-Reset` (seconds until the request would fit, as `Retry-After`;
    /// a sliding window has no reset instant for an admission). Default: no. They follow
    /// [`headers_on_success`](Self::headers_on_success) like the `RateLimit` fields.
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.legacy_headers(true);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn legacy_headers(self, on: bool) -> Self {
        self.edit(|c| c.legacy_headers = on)
    }

    /// Calls `hook` with the route's name, the key and the decision for each request a
    /// shadow policy would have refused (and let through): a log line or a counter per
    /// key during a trial, beside the metrics' per-policy counts. Not called for requests
    /// an enforced policy decides.
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let trial = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(5)).shadow(true).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("trial", trial, PeerIp)?.on_shadow_denial(|route, ip, decision| {
    ///     eprintln!("{route}: {ip} would be refused (limit {:?})", decision.shadow_denial());
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_shadow_denial(self, hook: impl Fn(&str, &K, &crate::Decision) + Send + Sync + 'static) -> Self {
        let hook: ShadowHook<K> = Arc::new(hook);
        self.edit(|c| c.on_shadow_denial = Some(hook))
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
    /// [`Refusal`]): for a custom body, other statuses, or logging. The response's body
    /// is the wrapped service's body type: `axum::body::Body` under axum.
    ///
    /// ```
    /// use axum::body::Body;
    /// use axum::routing::get;
    /// use axum::Router;
    /// use http::{Response, StatusCode};
    /// use slidegate::tower::{PeerIp, RateLimitLayer, Refusal, RefusalKind};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.on_refusal(|refusal: &Refusal| {
    ///     let mut response = refusal.response(Body::from(format!("slow down ({})", refusal.detail())));
    ///     if refusal.kind() == RefusalKind::MissingKey {
    ///         *response.status_mut() = StatusCode::BAD_REQUEST;
    ///     }
    ///     response
    /// });
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// # let _ = app;
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
        self.problem_json_with(ProblemJson::new())
    }

    /// [`problem_json`](Self::problem_json) with a `type` URI and extension members of your
    /// own ([`ProblemJson`]).
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, ProblemJson, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let problem = ProblemJson::new()
    ///     .type_uri("https://api.example.com/problems/rate-limited")
    ///     .member("support", "https://api.example.com/limits")?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.problem_json_with(problem);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn problem_json_with(self, problem: ProblemJson) -> RateLimitLayer<K, X, C, ProblemJson> {
        self.with(|c| c, |_| problem)
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
    K: Borrow<X::Lookup> + Hash + Eq + Clone + Send + Sync + 'static,
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
        let route = match path::normalize(req.uri().path(), config.ignore_case) {
            Ok(path) if config.exempt.path(&path) => {
                return ResponseFuture::forward(self.inner.call(req), None)
            }
            Ok(path) => config.route(req.method(), &path),
            Err(_) => return refuse(RefusalKind::UnsafePath, &config.default),
        };
        if config.exempt.peer(|| PeerIp::of(&req)) {
            return ResponseFuture::forward(self.inner.call(req), None);
        }
        let cost = config.cost.cost(&req);
        let advert = Cell::new(None);
        // The key is looked up as it lies in the request; the limiter copies it to an owned
        // key only to insert it.
        let decision = {
            let key: Cow<'_, X::Lookup> = match (config.extractor.extract(&req), &config.missing) {
                (Ok(key), _) => key,
                (Err(KeyError::Missing), Missing::Fallback(key)) => {
                    Cow::Borrowed(Borrow::<X::Lookup>::borrow(key))
                }
                (Err(error), _) => return refuse(RefusalKind::of(error), route),
            };
            if config.exempt.key(&*key) {
                drop(key);
                return ResponseFuture::forward(self.inner.call(req), None);
            }
            let decision = route.limiter.check_n_seen(&*key, cost, |policy| advert.set(route.advert(policy)));
            if let Some(hook) =
                config.on_shadow_denial.as_ref().filter(|_| decision.shadow_denial().is_some())
            {
                hook(&route.name, &(*key).to_owned(), &decision);
            }
            decision
        };
        let advert = advert.into_inner();
        let advert = advert.as_ref().and_then(|a| a.as_deref());
        if decision.is_allowed() {
            let headers = advert
                .filter(|_| config.headers_on_success)
                .and_then(|a| fields(a, &decision, config.legacy_headers));
            return ResponseFuture::forward(self.inner.call(req), headers);
        }
        let refusal = Refusal::of(route, decision, advert, config.legacy_headers);
        ResponseFuture::answer(config.refuse.respond(&refusal))
    }
}
