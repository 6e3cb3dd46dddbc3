//! Where a request's rate-limiting key comes from: the [`KeyExtractor`] trait and its
//! [`KeyError`]s, and the extractors that read no header (the peer's address, the path, a
//! closure). Header keys are in `header.rs`, proxy headers in `client_ip.rs`.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};

use http::Request;

use super::{client_ip, path};

/// Takes the rate-limiting key from a request.
///
/// A key is given as a [`Cow`] of its [`Lookup`](Self::Lookup) form: borrowed from the
/// request where its bytes are there already (a header value, a path), so that the limiter
/// looks up a key it holds without copying it, and copies it (to an owned
/// [`Key`](Self::Key), sharing nothing with the request) only when it inserts a new key.
/// Extractors that compute their key (an address) give it owned, with `Lookup = Key`.
///
/// An extractor that reads bytes a client chooses caps their length ([`KeyError::TooLong`]):
/// a limiter holds up to `max_keys` keys, so the longest key bounds its memory.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{HeaderKey, KeyError, KeyExtractor};
///
/// let api_key = HeaderKey::new("x-api-key")?;
/// let req = Request::builder().header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(api_key.extract(&req).as_deref(), Ok(&b"k-123"[..]));
/// assert_eq!(api_key.extract(&Request::new(())), Err(KeyError::Missing));
/// # Ok::<(), slidegate::tower::LayerError>(())
/// ```
///
/// An extractor of one's own that computes its key:
///
/// ```
/// use std::borrow::Cow;
/// use http::Request;
/// use slidegate::tower::{KeyError, KeyExtractor};
///
/// /// The tenant id from `x-tenant`, a number.
/// #[derive(Clone)]
/// struct Tenant;
///
/// impl<B> KeyExtractor<B> for Tenant {
///     type Key = u64;
///     type Lookup = u64;
///
///     fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, u64>, KeyError> {
///         let value = req.headers().get("x-tenant").ok_or(KeyError::Missing)?;
///         let id = value.to_str().ok().and_then(|v| v.parse().ok()).ok_or(KeyError::Malformed)?;
///         Ok(Cow::Owned(id))
///     }
/// }
///
/// let req = Request::builder().header("x-tenant", "42").body(()).unwrap();
/// assert_eq!(Tenant.extract(&req).as_deref(), Ok(&42));
/// ```
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key type of the limiters the extracted keys are checked against: what a limiter
    /// holds.
    type Key: Borrow<Self::Lookup> + Hash + Eq + Clone + Send + Sync + 'static;

    /// The form a key is looked up by: `[u8]` for `Vec<u8>` keys, `str` for `String` keys,
    /// the key type itself for keys that are computed.
    type Lookup: Hash + Eq + ToOwned<Owned = Self::Key> + ?Sized + 'static;

    /// The request's key, borrowed from the request where it can be; a [`KeyError`] when
    /// the request has none, or one the layer must refuse.
    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, Self::Lookup>, KeyError>;
}

/// Why a request has no key the layer can check: each is answered with its own
/// [`RefusalKind`](super::RefusalKind).
///
/// ```
/// use slidegate::tower::KeyError;
/// assert_eq!(KeyError::TooLong.to_string(), "the rate-limiting key is longer than allowed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request carries no key (no such header, no peer address): the layer's
    /// [`fallback_key`](super::RateLimitLayer::fallback_key) is used, else the request is
    /// refused with [`MissingKey`](super::RefusalKind::MissingKey) (500: the layer is
    /// configured for requests it cannot key).
    Missing,
    /// The key's source is there but does not parse (a client-IP header that is not an
    /// address, an `Authorization` without a scheme, an unsafe path):
    /// [`MalformedKey`](super::RefusalKind::MalformedKey), 400.
    Malformed,
    /// The key is longer than the extractor's maximum:
    /// [`KeyTooLong`](super::RefusalKind::KeyTooLong), 431.
    TooLong,
    /// The header the key is read from appears more than once, so the request has two
    /// readings (a backend may read the other line):
    /// [`RepeatedKey`](super::RefusalKind::RepeatedKey), 400.
    Repeated,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::Missing => "the request carries no rate-limiting key",
            KeyError::Malformed => "the request's rate-limiting key does not parse",
            KeyError::TooLong => "the rate-limiting key is longer than allowed",
            KeyError::Repeated => "the header the rate-limiting key is read from appears more than once",
        })
    }
}

impl std::error::Error for KeyError {}

/// The peer's IP address: from a `SocketAddr` in the request's extensions (insert one per
/// connection in a hyper server), or, with feature `axum`, from axum's
/// `ConnectInfo<SocketAddr>` (`into_make_service_with_connect_info::<SocketAddr>()`). An
/// IPv6 peer is keyed by its /64, as [`ForwardedFor`](super::ForwardedFor) does
/// (`ForwardedFor::new(0)` is the peer address with a prefix of your choice). A request
/// without a peer address has no key ([`KeyError::Missing`]).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use slidegate::tower::{KeyExtractor, PeerIp};
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert("192.0.2.7:5555".parse::<SocketAddr>().unwrap());
/// assert_eq!(PeerIp.extract(&req).as_deref(), Ok(&"192.0.2.7".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl PeerIp {
    pub(super) fn of<B>(req: &Request<B>) -> Option<IpAddr> {
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
    type Lookup = IpAddr;

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, IpAddr>, KeyError> {
        let ip = PeerIp::of(req).ok_or(KeyError::Missing)?;
        Ok(Cow::Owned(client_ip::masked(ip, 64)))
    }
}

/// The request's path in its normal form, the one routes match
/// ([`RateLimitLayer::route`](super::RateLimitLayer::route)): one budget per path, shared by
/// all clients, whatever its spelling (`//search`, `/%73earch` and `/search;x=1` are
/// `/search`). The query is not part of it. A path without a single normal form (a dot
/// segment, an encoded `/`) is [`KeyError::Malformed`]; a normal form longer than
/// [`max_len`](Self::max_len) (default [`PathKey::DEFAULT_MAX_LEN`]) is
/// [`KeyError::TooLong`]. A path already in normal form is looked up where it is.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{KeyError, KeyExtractor, PathKey};
/// let key = |path: &str| PathKey::new().extract(&Request::get(path).body(()).unwrap()).map(|k| k.into_owned());
/// assert_eq!(key("/search?q=x"), Ok("/search".to_owned()));
/// assert_eq!(key("//%73earch;x=1"), Ok("/search".to_owned()));
/// assert_eq!(key("/./search"), Err(KeyError::Malformed));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PathKey {
    max_len: usize,
    ignore_case: bool,
}

impl PathKey {
    /// The longest normal form keyed by default, in bytes. Paths are longer than header
    /// keys (several ids in a REST path), and a layer keyed by path holds one key per path
    /// its clients name: 1 KiB keeps real paths and bounds a full table of 100,000 paths
    /// to about 100 MB of keys.
    pub const DEFAULT_MAX_LEN: usize = 1024;

    /// Keys by the normal form of the path, case-sensitively, up to
    /// [`DEFAULT_MAX_LEN`](Self::DEFAULT_MAX_LEN) bytes.
    ///
    /// ```
    /// let key = slidegate::tower::PathKey::new();
    /// # let _ = key;
    /// ```
    pub fn new() -> PathKey {
        PathKey { max_len: Self::DEFAULT_MAX_LEN, ignore_case: false }
    }

    /// The longest normal form keyed, in bytes; a longer one is [`KeyError::TooLong`].
    ///
    /// ```
    /// use http::Request;
    /// use slidegate::tower::{KeyError, KeyExtractor, PathKey};
    /// let req = Request::get("/a/long/path").body(()).unwrap();
    /// assert_eq!(PathKey::new().max_len(4).extract(&req), Err(KeyError::TooLong));
    /// ```
    #[must_use]
    pub fn max_len(mut self, bytes: usize) -> PathKey {
        self.max_len = bytes;
        self
    }

    /// Folds ASCII case (`/Search` is `/search`), for upstreams that route without regard
    /// to it (as [`RateLimitLayer::ignore_case`](super::RateLimitLayer::ignore_case) does
    /// for routes); off by default.
    ///
    /// ```
    /// use http::Request;
    /// use slidegate::tower::{KeyExtractor, PathKey};
    /// let req = Request::get("/Search").body(()).unwrap();
    /// assert_eq!(PathKey::new().ignore_case(true).extract(&req).as_deref(), Ok("/search"));
    /// ```
    #[must_use]
    pub fn ignore_case(mut self, on: bool) -> PathKey {
        self.ignore_case = on;
        self
    }
}

impl Default for PathKey {
    fn default() -> PathKey {
        PathKey::new()
    }
}

impl<B> KeyExtractor<B> for PathKey {
    type Key = String;
    type Lookup = str;

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, str>, KeyError> {
        let normal = path::normalize(req.uri().path(), self.ignore_case).map_err(|_| KeyError::Malformed)?;
        if normal.len() > self.max_len {
            return Err(KeyError::TooLong);
        }
        Ok(normal)
    }
}

/// What a [`key_fn`] closure returns: an `Option` (`None` is [`KeyError::Missing`]) or a
/// `Result<K, KeyError>`.
///
/// ```
/// use slidegate::tower::{IntoKey, KeyError};
/// assert_eq!(Some(7u64).into_key(), Ok(7));
/// assert_eq!(None::<u64>.into_key(), Err(KeyError::Missing));
/// ```
pub trait IntoKey {
    /// The key.
    type Key;

    /// The key, or why there is none.
    ///
    /// ```
    /// use slidegate::tower::{IntoKey, KeyError};
    /// assert_eq!(Err::<u64, _>(KeyError::Malformed).into_key(), Err(KeyError::Malformed));
    /// ```
    fn into_key(self) -> Result<Self::Key, KeyError>;
}

impl<K> IntoKey for Option<K> {
    type Key = K;

    fn into_key(self) -> Result<K, KeyError> {
        self.ok_or(KeyError::Missing)
    }
}

impl<K> IntoKey for Result<K, KeyError> {
    type Key = K;

    fn into_key(self) -> Result<K, KeyError> {
        self
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

/// A key extractor from a closure returning an `Option` (no key: `None`) or a
/// `Result<K, KeyError>` (to refuse a malformed or overlong key as the client's error).
/// The key is owned: a closure that keeps bytes of the request copies them (as `to_owned`
/// does), and caps their length.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{key_fn, KeyError, KeyExtractor};
///
/// // The player id from the path `/players/{id}/...`.
/// let player = key_fn(|req: &Request<()>| req.uri().path().split('/').nth(2)?.parse::<u64>().ok());
/// let req = Request::get("/players/42/move").body(()).unwrap();
/// assert_eq!(player.extract(&req).as_deref(), Ok(&42));
///
/// // A malformed id is the client's error (400), not a missing key.
/// let strict = key_fn(|req: &Request<()>| {
///     let id = req.uri().path().split('/').nth(2).ok_or(KeyError::Missing)?;
///     id.parse::<u64>().map_err(|_| KeyError::Malformed)
/// });
/// let req = Request::get("/players/x/move").body(()).unwrap();
/// assert_eq!(strict.extract(&req), Err(KeyError::Malformed));
/// ```
pub fn key_fn<B, R, F>(f: F) -> KeyFn<F>
where
    F: Fn(&Request<B>) -> R + Clone + Send + Sync + 'static,
    R: IntoKey,
{
    KeyFn(f)
}

impl<B, R, F> KeyExtractor<B> for KeyFn<F>
where
    F: Fn(&Request<B>) -> R + Clone + Send + Sync + 'static,
    R: IntoKey,
    R::Key: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = R::Key;
    type Lookup = R::Key;

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, R::Key>, KeyError> {
        (self.0)(req).into_key().map(Cow::Owned)
    }
}
