//! What the layer answers itself: [`RefusalKind`], the [`Refusal`] given to a refusal
//! handler, and the handlers ([`Refuse`]: the defaults, problem details, a closure).

use std::fmt;

use http::header::{HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use super::fields::whole_seconds;
use super::problem::ProblemJson;
use super::route::{fields, Advert, Route};
use super::KeyError;
use crate::{Decision, Denial};

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
    /// (the layer is configured for requests it cannot key: no peer address, a header that
    /// every request should carry).
    MissingKey,
    /// The key's source is there but does not parse ([`KeyError::Malformed`]: a client-IP
    /// header that is not an address, an `Authorization` without a scheme): 400 Bad
    /// Request, the client's error.
    MalformedKey,
    /// The key is longer than the extractor allows ([`KeyError::TooLong`]): 431 Request
    /// Header Fields Too Large (a [`PathKey`](super::PathKey) too, whose key is the path;
    /// an [`on_refusal`](super::RateLimitLayer::on_refusal) handler can answer 414 there).
    KeyTooLong,
    /// The header the key is read from appears more than once ([`KeyError::Repeated`]):
    /// 400 Bad Request. The layer would key one line and a backend may read another.
    RepeatedKey,
    /// The path has no single normal form (a dot segment, an encoded `/`: see
    /// [`RateLimitLayer::route`](super::RateLimitLayer::route)): 400 Bad Request.
    UnsafePath,
}

impl RefusalKind {
    /// The refusal for a request whose key could not be extracted.
    pub(super) fn of(error: KeyError) -> RefusalKind {
        match error {
            KeyError::Missing => RefusalKind::MissingKey,
            KeyError::Malformed => RefusalKind::MalformedKey,
            KeyError::TooLong => RefusalKind::KeyTooLong,
            KeyError::Repeated => RefusalKind::RepeatedKey,
        }
    }
}

/// A request the layer answers itself, given to the refusal handler
/// ([`RateLimitLayer::on_refusal`](super::RateLimitLayer::on_refusal)): what happened, the
/// default status, and the `Retry-After`, `RateLimit-Policy` and `RateLimit` fields that go
/// with it.
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

    /// The route's name (that of the default route for an unsafe path, which has none).
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

    /// The default status: 429, 413, 503, 500, 431 or 400 (see [`RefusalKind`]).
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
            RefusalKind::MalformedKey | RefusalKind::RepeatedKey | RefusalKind::UnsafePath => {
                StatusCode::BAD_REQUEST
            }
            RefusalKind::KeyTooLong => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
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
    /// reason), `status`, `detail`, and `retry_after` (seconds) when waiting helps. A `type`
    /// URI of your own and extension members: [`ProblemJson`].
    ///
    /// ```
    /// # fn f(refusal: &slidegate::tower::Refusal) {
    /// assert!(refusal.problem_details().starts_with("{\"type\":\"about:blank\""));
    /// # }
    /// ```
    pub fn problem_details(&self) -> String {
        ProblemJson::new().details(self)
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

/// A closure as a [`Refuse`]: see
/// [`RateLimitLayer::on_refusal`](super::RateLimitLayer::on_refusal).
#[derive(Clone)]
pub struct RefuseFn<F>(pub(super) F);

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

impl Refusal {
    pub(super) fn without_decision<K>(kind: RefusalKind, route: &Route<K>) -> Refusal {
        let detail = match kind {
            RefusalKind::MissingKey => "the request carries no rate-limiting key",
            RefusalKind::MalformedKey => "the request's rate-limiting key (a client address, credentials) does not parse",
            RefusalKind::KeyTooLong => "the request's rate-limiting key is longer than the server accepts",
            RefusalKind::RepeatedKey => "the header the rate-limiting key is read from appears more than once",
            _ => "the request path has no single normal form (a '.' or '..' segment, an encoded '/', '\\' or '%', a malformed escape, or a '\\')",
        };
        Refusal { kind, route: route.name.clone(), decision: None, headers: HeaderMap::new(), detail }
    }

    pub(super) fn of<K>(
        route: &Route<K>,
        decision: Decision,
        advert: Option<&Advert>,
        legacy: bool,
    ) -> Refusal {
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
            if let Some(fields) = advert.and_then(|a| fields(a, &decision, legacy)) {
                fields.append_to(&mut headers);
            }
        }
        Refusal { kind, route: route.name.clone(), decision: Some(decision), headers, detail }
    }
}
