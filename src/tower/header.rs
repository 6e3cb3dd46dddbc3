//! Keys read from one request header: [`HeaderKey`] (the value byte for byte) and
//! [`AuthorizationKey`] (credentials, with the scheme's case and the whitespace after it
//! canonicalised).
//!
//! Both read a header that must appear once: a request carrying it twice has two readings
//! (the layer would key one line while a backend may read the other), and is refused as
//! [`KeyError::Repeated`]. Both cap the key's length, and look a key up where it lies in
//! the request: the limiter copies it (into a `Vec<u8>` of its own, sharing nothing with the
//! request's buffers) only to insert it.

use std::borrow::Cow;

use http::header::{HeaderName, AUTHORIZATION};
use http::{HeaderValue, Request};

use super::{KeyError, KeyExtractor, LayerError};

/// The one value of header `name`: `Missing` without one, `Repeated` with several.
pub(super) fn single<'r, B>(req: &'r Request<B>, name: &HeaderName) -> Result<&'r HeaderValue, KeyError> {
    let mut lines = req.headers().get_all(name).iter();
    let value = lines.next().ok_or(KeyError::Missing)?;
    if lines.next().is_some() {
        return Err(KeyError::Repeated);
    }
    Ok(value)
}

pub(super) fn header_name(name: &str) -> Result<HeaderName, LayerError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| LayerError::InvalidHeaderName { name: name.to_owned() })
}

/// A request header's value (an API key, a player token), compared byte for byte, as a
/// `Vec<u8>` key (`Limiter<Vec<u8>>`). A request without the header has no key
/// ([`KeyError::Missing`]); one carrying it more than once is refused
/// ([`KeyError::Repeated`]); a value longer than [`max_len`](Self::max_len) (default
/// [`HeaderKey::DEFAULT_MAX_LEN`]) is refused ([`KeyError::TooLong`]). For credentials
/// in `Authorization`, whose scheme is case-insensitive, use [`AuthorizationKey`].
///
/// ```
/// use http::Request;
/// use slidegate::tower::{HeaderKey, KeyError, KeyExtractor};
///
/// let key = HeaderKey::new("x-api-key")?;
/// let req = Request::builder().header("x-api-key", "k-1").body(()).unwrap();
/// assert_eq!(key.extract(&req).as_deref(), Ok(&b"k-1"[..]));
/// let twice = Request::builder().header("x-api-key", "k-1").header("x-api-key", "k-2").body(()).unwrap();
/// assert_eq!(key.extract(&twice), Err(KeyError::Repeated));
/// # Ok::<(), slidegate::tower::LayerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// The longest value keyed by default, in bytes. API keys, tenant ids and session
    /// tokens are well under it (a UUID is 36 bytes, a 256-bit key in base64 44), and a
    /// limiter full at 1,000,000 keys holds at most 256 MB of them. Raise it with
    /// [`max_len`](Self::max_len) for longer keys.
    pub const DEFAULT_MAX_LEN: usize = 256;

    /// Keys by the header `name` (e.g. `"x-api-key"`, matched without regard to case);
    /// [`LayerError::InvalidHeaderName`] if `name` is not a valid header name.
    ///
    /// ```
    /// use slidegate::tower::HeaderKey;
    /// let key = HeaderKey::new("x-api-key")?;
    /// assert!(HeaderKey::new("x api key").is_err());
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn new(name: &str) -> Result<HeaderKey, LayerError> {
        Ok(HeaderKey { name: header_name(name)?, max_len: Self::DEFAULT_MAX_LEN })
    }

    /// The longest value keyed, in bytes; a longer one is [`KeyError::TooLong`].
    ///
    /// ```
    /// use http::Request;
    /// use slidegate::tower::{HeaderKey, KeyError, KeyExtractor};
    /// let key = HeaderKey::new("x-api-key")?.max_len(8);
    /// let req = Request::builder().header("x-api-key", "123456789").body(()).unwrap();
    /// assert_eq!(key.extract(&req), Err(KeyError::TooLong));
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    #[must_use]
    pub fn max_len(mut self, bytes: usize) -> HeaderKey {
        self.max_len = bytes;
        self
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    type Key = Vec<u8>;
    type Lookup = [u8];

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, [u8]>, KeyError> {
        let value = single(req, &self.name)?.as_bytes();
        if value.len() > self.max_len {
            return Err(KeyError::TooLong);
        }
        Ok(Cow::Borrowed(value))
    }
}

/// The credentials in `Authorization` (or another header of the same form), keyed as one
/// whatever the spelling of their scheme: `auth-scheme [ 1*SP credentials ]` (RFC 9110
/// §11.4), with the scheme compared without regard to case, as RFC 9110 has it, and the
/// whitespace between the scheme and the credentials counted as one space. `Bearer T0KEN`,
/// `bearer T0KEN`, `BEARER T0KEN` and `Bearer  T0KEN` are one key; the credentials
/// themselves are compared byte for byte (`Bearer t0ken` is another key). The key is
/// `Scheme credentials`, the scheme's first letter capitalised and the others not
/// (`Bearer`, `Basic`): the usual spellings are looked up in place, others copied into
/// that form. The credentials' own encoding is not canonicalised: where the backend
/// accepts several spellings of one credential (a lenient base64 decoder, a malleable JWT
/// signature), key by the authenticated principal with [`key_fn`](super::key_fn) instead.
///
/// A request without the header has no key ([`KeyError::Missing`]); one carrying it more
/// than once is refused ([`KeyError::Repeated`]); a value without a scheme (empty, or not
/// starting with a token followed by whitespace or its end) is [`KeyError::Malformed`]; a
/// canonical form longer than [`max_len`](Self::max_len) (default
/// [`AuthorizationKey::DEFAULT_MAX_LEN`]) is [`KeyError::TooLong`].
///
/// ```
/// use http::Request;
/// use slidegate::tower::{AuthorizationKey, KeyExtractor};
///
/// let key = AuthorizationKey::new();
/// let with = |value: &str| Request::builder().header("authorization", value).body(()).unwrap();
/// assert_eq!(key.extract(&with("bEaReR  T0KEN")).as_deref(), Ok(&b"Bearer T0KEN"[..]));
/// assert_eq!(key.extract(&with("Bearer T0KEN")).as_deref(), Ok(&b"Bearer T0KEN"[..]));
/// ```
#[derive(Debug, Clone)]
pub struct AuthorizationKey {
    name: HeaderName,
    max_len: usize,
}

impl AuthorizationKey {
    /// The longest canonical value keyed by default, in bytes. Bearer tokens are often
    /// JWTs, which run to one or two KB with a few claims: 4 KiB keeps them, and bounds a
    /// limiter full at 100,000 keys to about 400 MB of keys (size `max_keys` with it).
    pub const DEFAULT_MAX_LEN: usize = 4096;

    /// Keys by the credentials in `Authorization`.
    ///
    /// ```
    /// let key = slidegate::tower::AuthorizationKey::new();
    /// # let _ = key;
    /// ```
    pub fn new() -> AuthorizationKey {
        AuthorizationKey { name: AUTHORIZATION, max_len: Self::DEFAULT_MAX_LEN }
    }

    /// Keys by the credentials in header `name` instead (`proxy-authorization`, or a
    /// header of your own in the same form); [`LayerError::InvalidHeaderName`] if `name` is
    /// not a valid header name.
    ///
    /// ```
    /// let key = slidegate::tower::AuthorizationKey::named("proxy-authorization")?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn named(name: &str) -> Result<AuthorizationKey, LayerError> {
        Ok(AuthorizationKey { name: header_name(name)?, max_len: Self::DEFAULT_MAX_LEN })
    }

    /// The longest canonical value keyed, in bytes; a longer one is [`KeyError::TooLong`].
    ///
    /// ```
    /// let key = slidegate::tower::AuthorizationKey::new().max_len(8192);
    /// # let _ = key;
    /// ```
    #[must_use]
    pub fn max_len(mut self, bytes: usize) -> AuthorizationKey {
        self.max_len = bytes;
        self
    }
}

impl Default for AuthorizationKey {
    fn default() -> AuthorizationKey {
        AuthorizationKey::new()
    }
}

impl<B> KeyExtractor<B> for AuthorizationKey {
    type Key = Vec<u8>;
    type Lookup = [u8];

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, [u8]>, KeyError> {
        let key = canonical(single(req, &self.name)?.as_bytes())?;
        if key.len() > self.max_len {
            return Err(KeyError::TooLong);
        }
        Ok(key)
    }
}

/// RFC 9110's `tchar`: the bytes of a token, such as an auth-scheme.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = bytes {
        if !is_ows(*first) {
            break;
        }
        bytes = rest;
    }
    while let [rest @ .., last] = bytes {
        if !is_ows(*last) {
            break;
        }
        bytes = rest;
    }
    bytes
}

/// `value` as `Scheme credentials`: the scheme title-cased, one space, the credentials as
/// they are; borrowed when `value` is in that form already.
fn canonical(value: &[u8]) -> Result<Cow<'_, [u8]>, KeyError> {
    let value = trim_ows(value);
    let scheme_len = value.iter().position(|&b| !is_tchar(b)).unwrap_or(value.len());
    let (scheme, rest) = value.split_at(scheme_len);
    if scheme.is_empty() || rest.first().is_some_and(|&b| !is_ows(b)) {
        return Err(KeyError::Malformed);
    }
    // `value` is trimmed: after whitespace, credentials follow.
    let credentials = trim_ows(rest);
    let title_cased =
        |(i, b): (usize, &u8)| if i == 0 { !b.is_ascii_lowercase() } else { !b.is_ascii_uppercase() };
    let one_space =
        rest.is_empty() || rest.len() == credentials.len().saturating_add(1) && rest.first() == Some(&b' ');
    if one_space && scheme.iter().enumerate().all(title_cased) {
        return Ok(Cow::Borrowed(value));
    }
    let mut key = Vec::with_capacity(scheme.len().saturating_add(1).saturating_add(credentials.len()));
    key.extend(scheme.iter().enumerate().map(|(i, b)| {
        if i == 0 {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        }
    }));
    if !credentials.is_empty() {
        key.push(b' ');
        key.extend_from_slice(credentials);
    }
    Ok(Cow::Owned(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(value: &str) -> Result<String, KeyError> {
        canonical(value.as_bytes()).map(|k| String::from_utf8_lossy(&k).into_owned())
    }

    #[test]
    fn every_spelling_of_a_scheme_is_one_key() {
        for spelling in [
            "Bearer T0KEN",
            "bearer T0KEN",
            "BEARER T0KEN",
            "Bearer  T0KEN",
            "bEaReR\t \tT0KEN ",
            " Bearer T0KEN",
        ] {
            assert_eq!(canon(spelling), Ok("Bearer T0KEN".to_owned()), "{spelling:?}");
        }
        assert_eq!(canon("Bearer t0ken"), Ok("Bearer t0ken".to_owned()));
        assert_eq!(
            canon("digest realm=\"x\",  nonce=\"y\""),
            Ok("Digest realm=\"x\",  nonce=\"y\"".to_owned())
        );
        assert_eq!(canon("NEGOTIATE"), Ok("Negotiate".to_owned()));
        assert_eq!(canon("aws4-hmac-sha256 Credential=A"), Ok("Aws4-hmac-sha256 Credential=A".to_owned()));
    }

    #[test]
    fn the_usual_spelling_is_borrowed() {
        assert!(matches!(canonical(b"Bearer T0KEN"), Ok(Cow::Borrowed(_))));
        assert!(matches!(canonical(b"Basic dXNlcjpwYXNz"), Ok(Cow::Borrowed(_))));
        assert!(matches!(canonical(b"Negotiate"), Ok(Cow::Borrowed(_))));
        assert!(matches!(canonical(b"bearer T0KEN"), Ok(Cow::Owned(_))));
        assert!(matches!(canonical(b"Bearer\tT0KEN"), Ok(Cow::Owned(_))));
    }

    #[test]
    fn a_value_without_a_scheme_is_malformed() {
        for value in ["", "   ", "=abc", "Bearer=abc", "Bea\"rer x", "(Bearer) x"] {
            assert_eq!(canon(value), Err(KeyError::Malformed), "{value:?}");
        }
    }

    proptest::proptest! {
        /// A canonical form is its own canonical form, and is borrowed.
        #[test]
        fn canonical_forms_are_fixed_points(value in "[ \tbBeErR!=~a-z0-9]{0,16}") {
            if let Ok(key) = canonical(value.as_bytes()) {
                let again = canonical(&key);
                proptest::prop_assert!(matches!(again, Ok(Cow::Borrowed(k)) if k == &key[..]));
            }
        }
    }
}
