//! Keys read from a request header: [`HeaderKey`] (the value byte for byte). It caps the
//! key's length, and looks a key up where it lies in the request: the limiter copies it
//! (into a `Vec<u8>` of its own, sharing nothing with the request's buffers) only to insert
//! it.

use std::borrow::Cow;

use http::header::HeaderName;
use http::Request;

use super::{KeyError, KeyExtractor, LayerError};

fn header_name(name: &str) -> Result<HeaderName, LayerError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| LayerError::InvalidHeaderName { name: name.to_owned() })
}

/// A request header's value (an API key, a player token), compared byte for byte, as a
/// `Vec<u8>` key (`Limiter<Vec<u8>>`). A request without the header has no key
/// ([`KeyError::Missing`]); a value longer than [`max_len`](Self::max_len) (default
/// [`HeaderKey::DEFAULT_MAX_LEN`]) is refused ([`KeyError::TooLong`]).
///
/// ```
/// use http::Request;
/// use slidegate::tower::{HeaderKey, KeyError, KeyExtractor};
///
/// let key = HeaderKey::new("x-api-key")?;
/// let req = Request::builder().header("x-api-key", "k-1").body(()).unwrap();
/// assert_eq!(key.extract(&req).as_deref(), Ok(&b"k-1"[..]));
/// assert_eq!(key.extract(&Request::new(())), Err(KeyError::Missing));
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
        let value = req.headers().get(&self.name).ok_or(KeyError::Missing)?.as_bytes();
        if value.len() > self.max_len {
            return Err(KeyError::TooLong);
        }
        Ok(Cow::Borrowed(value))
    }
}
