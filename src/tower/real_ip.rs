//! The client's address from a one-address header that a trusted proxy or CDN sets:
//! [`ClientIpHeader`].

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::HeaderName;
use http::Request;
use ipnet::IpNet;

use super::client_ip::{masked, networks_of, node};
use super::header::{header_name, single};
use super::{KeyError, KeyExtractor, LayerError, PeerIp};

/// The client's address from a header that a proxy or CDN in front of the server sets to
/// one address: `X-Real-IP` (nginx), `CF-Connecting-IP` (Cloudflare), `True-Client-IP`
/// (Akamai, Cloudflare), `Fly-Client-IP` (Fly.io), or any other by name. The header is
/// believed only from a peer in the trusted networks (the proxy's addresses, the CDN's
/// published ranges), which every constructor requires: a request from any other peer is
/// keyed by the peer's own address, its header ignored, so a client that reaches the
/// server directly cannot choose its key.
///
/// From a trusted peer, a header that is missing is [`KeyError::Missing`] (the proxy is
/// not setting it: the layer's fallback key or 500), repeated [`KeyError::Repeated`] and
/// not an address [`KeyError::Malformed`] (400). IPv6 clients are keyed by their /64, as
/// with [`ForwardedFor`](super::ForwardedFor).
///
/// ```
/// use http::Request;
/// use slidegate::tower::{ClientIpHeader, KeyExtractor};
///
/// let key = ClientIpHeader::x_real_ip(["10.0.0.0/8"])?;
/// let mut req = Request::builder().header("x-real-ip", "203.0.113.9").body(()).unwrap();
/// req.extensions_mut().insert("10.0.0.2:41000".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).as_deref(), Ok(&"203.0.113.9".parse().unwrap()));
/// // The same header from a peer outside 10.0.0.0/8: the peer is the client.
/// req.extensions_mut().insert("198.51.100.4:41000".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).as_deref(), Ok(&"198.51.100.4".parse().unwrap()));
/// # Ok::<(), slidegate::tower::LayerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIpHeader {
    name: HeaderName,
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl ClientIpHeader {
    /// Reads header `name` from peers in `trusted` (CIDRs or addresses).
    /// [`LayerError::InvalidHeaderName`] or [`LayerError::InvalidNetwork`] for a bad name or
    /// network.
    ///
    /// ```
    /// use slidegate::tower::ClientIpHeader;
    /// let key = ClientIpHeader::new("x-client-ip", ["192.168.0.0/16"])?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn new<S: AsRef<str>>(
        name: &str,
        trusted: impl IntoIterator<Item = S>,
    ) -> Result<ClientIpHeader, LayerError> {
        Ok(ClientIpHeader { name: header_name(name)?, trusted: networks_of(trusted)?, ipv6_prefix: 64 })
    }

    /// `X-Real-IP`, as nginx's `proxy_set_header X-Real-IP $remote_addr` sets it.
    ///
    /// ```
    /// let key = slidegate::tower::ClientIpHeader::x_real_ip(["10.0.0.1"])?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn x_real_ip<S: AsRef<str>>(
        trusted: impl IntoIterator<Item = S>,
    ) -> Result<ClientIpHeader, LayerError> {
        ClientIpHeader::new("x-real-ip", trusted)
    }

    /// `CF-Connecting-IP`, set by Cloudflare; trust Cloudflare's published ranges.
    ///
    /// ```
    /// let key = slidegate::tower::ClientIpHeader::cf_connecting_ip(["173.245.48.0/20", "2400:cb00::/32"])?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn cf_connecting_ip<S: AsRef<str>>(
        trusted: impl IntoIterator<Item = S>,
    ) -> Result<ClientIpHeader, LayerError> {
        ClientIpHeader::new("cf-connecting-ip", trusted)
    }

    /// `True-Client-IP`, set by Akamai and by Cloudflare Enterprise.
    ///
    /// ```
    /// let key = slidegate::tower::ClientIpHeader::true_client_ip(["10.0.0.0/8"])?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn true_client_ip<S: AsRef<str>>(
        trusted: impl IntoIterator<Item = S>,
    ) -> Result<ClientIpHeader, LayerError> {
        ClientIpHeader::new("true-client-ip", trusted)
    }

    /// `Fly-Client-IP`, set by Fly.io's proxy.
    ///
    /// ```
    /// let key = slidegate::tower::ClientIpHeader::fly_client_ip(["172.16.0.0/12"])?;
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn fly_client_ip<S: AsRef<str>>(
        trusted: impl IntoIterator<Item = S>,
    ) -> Result<ClientIpHeader, LayerError> {
        ClientIpHeader::new("fly-client-ip", trusted)
    }

    /// Keys IPv6 clients by their first `bits` bits (default 64; values above 128 are 128).
    ///
    /// ```
    /// let key = slidegate::tower::ClientIpHeader::x_real_ip(["10.0.0.1"])?.ipv6_prefix(56);
    /// # let _ = key;
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> ClientIpHeader {
        self.ipv6_prefix = bits.min(128);
        self
    }
}

impl<B> KeyExtractor<B> for ClientIpHeader {
    type Key = IpAddr;
    type Lookup = IpAddr;

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, IpAddr>, KeyError> {
        let peer = PeerIp::of(req).ok_or(KeyError::Missing)?;
        let client = if self.trusted.iter().any(|net| net.contains(&peer)) {
            single(req, &self.name)?.to_str().ok().and_then(node).ok_or(KeyError::Malformed)?
        } else {
            peer
        };
        Ok(Cow::Owned(masked(client, self.ipv6_prefix)))
    }
}
