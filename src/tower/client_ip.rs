//! The client's address behind reverse proxies: `X-Forwarded-For` and RFC 7239 `Forwarded`,
//! trusted by hop count or by the proxies' networks.
//!
//! The rules are on [`ForwardedFor`].

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::Request;
use ipnet::IpNet;

use super::{KeyError, KeyExtractor, LayerError, PeerIp};

/// Which proxies to believe.
#[derive(Debug, Clone)]
enum Trust {
    Hops(usize),
    Networks(Vec<IpNet>),
}

/// Which header lists the hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    XForwardedFor,
    Forwarded,
}

/// The client's address behind trusted reverse proxies, from `X-Forwarded-For`
/// ([`ForwardedFor::new`], [`ForwardedFor::trusting`]) or RFC 7239 `Forwarded`
/// ([`ForwardedFor::rfc7239`]). Only sound if clients cannot reach the server except
/// through those proxies.
///
/// Each proxy appends the address it received the request from, so the entries to the
/// right were written by proxies and those further left by whoever sent the request, which
/// a client can fill with anything. The client is found from the right:
/// - **by hop count** (`n` proxies, all of which every request passes through): the `n`-th
///   entry from the right; with fewer than `n` entries the request did not come through the
///   proxies, and the peer address is the key;
/// - **by networks** (nginx's `set_real_ip_from` with `real_ip_recursive on`, Envoy's
///   trusted CIDRs): if the peer is not in a trusted network it is the client and the
///   header is ignored; otherwise entries are skipped from the right while they are in a
///   trusted network, and the first that is not is the client (all trusted: the leftmost).
///
/// An entry is an IPv4 address, an IPv6 address (bracketed or not), either with a port
/// (`203.0.113.9:4711`, `[2001:db8::1]:443`). Lists are split at every `,` (and a
/// `Forwarded` element at every `;`) regardless of quotes: no node identifier contains
/// either, and a quote the client leaves open cannot swallow the entries proxies append.
///
/// **An entry the trust reads that is not an address** (an empty entry as in
/// `198.51.100.7,`, garbage, a bad port, RFC 7239's `unknown` and obfuscated `_name`
/// identifiers, a `Forwarded` element without `for=`) is [`KeyError::Malformed`]: the
/// layer answers 400 ([`MalformedKey`](super::RefusalKind::MalformedKey)), the client's
/// error, as such entries are what a client writes (left of the trusted hops, or on a
/// request that bypassed them). With [`on_malformed`](Self::on_malformed)`(OnMalformed::Peer)`
/// such a request is keyed by the peer's address instead. Only a request without a peer
/// address ([`KeyError::Missing`]) can reach the layer's fallback key or its 500: that is
/// the server's configuration.
///
/// IPv6 clients are keyed by their network, `/64` by default: a subscriber is given at
/// least a /64, so keying by address would let one client rotate through addresses for a
/// fresh budget each time. IPv4-mapped IPv6 addresses are keyed as IPv4.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{ForwardedFor, KeyExtractor};
///
/// // client -> proxy -> us: the proxy appended the client's address (and port).
/// let req = Request::builder().header("x-forwarded-for", "6.6.6.6, 203.0.113.9:4711").body(()).unwrap();
/// assert_eq!(ForwardedFor::new(1).extract(&req).as_deref(), Ok(&"203.0.113.9".parse().unwrap()));
///
/// let req = Request::builder().header("forwarded", "for=6.6.6.6, for=\"[2001:db8::1]:443\"").body(()).unwrap();
/// assert_eq!(ForwardedFor::new(1).rfc7239().extract(&req).as_deref(), Ok(&"2001:db8::".parse().unwrap()));
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedFor {
    trust: Trust,
    header: Header,
    ipv6_prefix: u8,
    on_malformed: OnMalformed,
}

/// What [`ForwardedFor`] does with a request whose client entry is not an address.
///
/// ```
/// use http::Request;
/// use slidegate::tower::{ForwardedFor, KeyError, KeyExtractor, OnMalformed};
///
/// let mut req = Request::builder().header("x-forwarded-for", "198.51.100.7,").body(()).unwrap();
/// req.extensions_mut().insert("192.0.2.1:5000".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(ForwardedFor::new(1).extract(&req), Err(KeyError::Malformed));
/// let lenient = ForwardedFor::new(1).on_malformed(OnMalformed::Peer);
/// assert_eq!(lenient.extract(&req).as_deref(), Ok(&"192.0.2.1".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnMalformed {
    /// Refuse it as [`KeyError::Malformed`] (400): the default.
    #[default]
    Refuse,
    /// Key it by the peer's address (the nearest proxy's, behind proxies: every such
    /// request then shares that proxy's budget).
    Peer,
}

impl ForwardedFor {
    /// Keys by the address `trusted` hops back in `X-Forwarded-For` (0: the peer address).
    ///
    /// ```
    /// let behind_one_proxy = slidegate::tower::ForwardedFor::new(1);
    /// # let _ = behind_one_proxy;
    /// ```
    pub fn new(trusted: usize) -> ForwardedFor {
        ForwardedFor::with(Trust::Hops(trusted))
    }

    fn with(trust: Trust) -> ForwardedFor {
        ForwardedFor {
            trust,
            header: Header::XForwardedFor,
            ipv6_prefix: 64,
            on_malformed: OnMalformed::Refuse,
        }
    }

    /// Keys by the first address, from the right, that is not in one of `networks` (CIDRs
    /// such as `10.0.0.0/8`, or single addresses), starting from the peer: a peer outside
    /// them is the client. [`LayerError::InvalidNetwork`] for an entry that is neither.
    ///
    /// ```
    /// use http::Request;
    /// use slidegate::tower::{ForwardedFor, KeyExtractor};
    ///
    /// let key = ForwardedFor::trusting(["10.0.0.0/8", "192.168.1.1"])?;
    /// let mut req = Request::builder().header("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.2.3").body(()).unwrap();
    /// req.extensions_mut().insert("192.168.1.1:50000".parse::<std::net::SocketAddr>().unwrap());
    /// assert_eq!(key.extract(&req).as_deref(), Ok(&"198.51.100.7".parse().unwrap()));
    /// # Ok::<(), slidegate::tower::LayerError>(())
    /// ```
    pub fn trusting<S: AsRef<str>>(
        networks: impl IntoIterator<Item = S>,
    ) -> Result<ForwardedFor, LayerError> {
        Ok(ForwardedFor::with(Trust::Networks(networks_of(networks)?)))
    }

    /// Reads RFC 7239 `Forwarded` (its `for=` parameters) instead of `X-Forwarded-For`.
    ///
    /// ```
    /// let key = slidegate::tower::ForwardedFor::new(1).rfc7239();
    /// # let _ = key;
    /// ```
    #[must_use]
    pub fn rfc7239(mut self) -> ForwardedFor {
        self.header = Header::Forwarded;
        self
    }

    /// Keys IPv6 clients by their first `bits` bits (default 64; 128 for the exact address;
    /// values above 128 are 128).
    ///
    /// ```
    /// use http::Request;
    /// use slidegate::tower::{ForwardedFor, KeyExtractor};
    /// let mut req = Request::new(());
    /// req.extensions_mut().insert("[2001:db8::1:2]:443".parse::<std::net::SocketAddr>().unwrap());
    /// assert_eq!(ForwardedFor::new(0).extract(&req).as_deref(), Ok(&"2001:db8::".parse().unwrap()));
    /// let exact = ForwardedFor::new(0).ipv6_prefix(128);
    /// assert_eq!(exact.extract(&req).as_deref(), Ok(&"2001:db8::1:2".parse().unwrap()));
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> ForwardedFor {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// What to do with a request whose client entry is not an address: refuse it with 400
    /// (the default) or key it by the peer's address (see [`OnMalformed`]).
    ///
    /// ```
    /// use slidegate::tower::{ForwardedFor, OnMalformed};
    /// let key = ForwardedFor::new(1).on_malformed(OnMalformed::Peer);
    /// # let _ = key;
    /// ```
    #[must_use]
    pub fn on_malformed(mut self, then: OnMalformed) -> ForwardedFor {
        self.on_malformed = then;
        self
    }

    /// The key of a request whose client entry is not an address.
    fn malformed(&self, peer: Option<IpAddr>) -> Result<IpAddr, KeyError> {
        match self.on_malformed {
            OnMalformed::Refuse => Err(KeyError::Malformed),
            OnMalformed::Peer => peer.ok_or(KeyError::Missing),
        }
    }

    /// The client among `hops_from_right` (the list's entries, the nearest proxy's first) and
    /// the `peer` that sent the request.
    fn client(
        &self,
        mut hops_from_right: impl Iterator<Item = Option<IpAddr>>,
        peer: Option<IpAddr>,
    ) -> Result<IpAddr, KeyError> {
        match &self.trust {
            Trust::Hops(0) => peer.ok_or(KeyError::Missing),
            Trust::Hops(n) => match hops_from_right.nth(n.saturating_sub(1)) {
                Some(Some(client)) => Ok(client),
                Some(None) => self.malformed(peer),
                // Fewer entries than trusted proxies: the peer is the client.
                None => peer.ok_or(KeyError::Missing),
            },
            Trust::Networks(networks) => {
                let trusted = |ip: &IpAddr| networks.iter().any(|n| n.contains(&canonical(*ip)));
                let mut client = peer.ok_or(KeyError::Missing)?;
                if !trusted(&client) {
                    return Ok(client);
                }
                for hop in hops_from_right {
                    let Some(hop) = hop else { return self.malformed(peer) };
                    client = hop;
                    if !trusted(&client) {
                        break;
                    }
                }
                Ok(client)
            }
        }
    }
}

impl<B> KeyExtractor<B> for ForwardedFor {
    type Key = IpAddr;
    type Lookup = IpAddr;

    fn extract<'r>(&self, req: &'r Request<B>) -> Result<Cow<'r, IpAddr>, KeyError> {
        let (name, parse): (&str, fn(&str) -> Option<IpAddr>) = match self.header {
            Header::XForwardedFor => ("x-forwarded-for", node),
            Header::Forwarded => ("forwarded", forwarded_for),
        };
        // Several header lines form one list, in order. It is walked from the right (the
        // nearest proxy first) without being collected, and only as far as the trust needs.
        // A comma is split on wherever it is (a quote a client leaves open cannot swallow the
        // proxies' entries); an entry that is not UTF-8 is no address.
        let hops = req
            .headers()
            .get_all(name)
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
            .map(|hop| std::str::from_utf8(hop).ok().and_then(parse));
        let client = self.client(hops, PeerIp::of(req))?;
        Ok(Cow::Owned(masked(client, self.ipv6_prefix)))
    }
}

/// A node: an IPv4 or IPv6 address, bracketed or not, with or without a port.
pub(super) fn node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60;proto=http;by=...`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let value = element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    })?;
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => value,
    };
    // An obfuscated port (`[2001:db8::1]:_p1`) still names the address.
    match value.rsplit_once(':') {
        Some((host, port)) if port.starts_with('_') => node(host),
        _ => node(value),
    }
}

/// IPv4-mapped IPv6 as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Trusted networks: CIDRs such as `10.0.0.0/8`, or single addresses.
pub(super) fn networks_of<S: AsRef<str>>(
    networks: impl IntoIterator<Item = S>,
) -> Result<Vec<IpNet>, LayerError> {
    networks
        .into_iter()
        .map(|n| {
            let n = n.as_ref().trim();
            n.parse::<IpNet>()
                .or_else(|_| n.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| LayerError::InvalidNetwork { network: n.to_owned() })
        })
        .collect()
}

/// `ip` as a key: IPv4 as is, IPv6 cut to its first `bits` bits.
pub(super) fn masked(ip: IpAddr, bits: u8) -> IpAddr {
    match canonical(ip) {
        IpAddr::V6(v6) => {
            let keep = u32::from(bits.min(128));
            let mask = u128::MAX.checked_shl(128u32.saturating_sub(keep)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }

    #[test]
    fn nodes_with_ports_and_brackets() {
        assert_eq!(node(" 203.0.113.9:4711"), Some(ip("203.0.113.9")));
        assert_eq!(node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        assert_eq!(node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(node("unknown"), None);
        assert_eq!(node("_hidden"), None);
        assert_eq!(forwarded_for("for=192.0.2.60;proto=http;by=203.0.113.43"), Some(ip("192.0.2.60")));
        assert_eq!(
            forwarded_for("proto=https; For=\"[2001:db8:cafe::17]:4711\""),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(forwarded_for("for=\"[2001:db8::1]:_p1\""), Some(ip("2001:db8::1")));
        assert_eq!(forwarded_for("for=_hidden"), None);
        assert_eq!(forwarded_for("for=unknown"), None);
        assert_eq!(forwarded_for("for=\"[2001:db8::1]"), None);
        assert_eq!(forwarded_for("by=1.2.3.4"), None);
    }

    #[test]
    fn ipv6_is_keyed_by_its_network() {
        assert_eq!(masked(ip("2001:db8:1:2:3:4:5:6"), 64), ip("2001:db8:1:2::"));
        assert_eq!(masked(ip("2001:db8:1:2:3:4:5:6"), 128), ip("2001:db8:1:2:3:4:5:6"));
        assert_eq!(masked(ip("2001:db8:1:2:3:4:5:6"), 0), ip("::"));
        assert_eq!(masked(ip("::ffff:192.0.2.1"), 64), ip("192.0.2.1"));
        assert_eq!(masked(ip("192.0.2.1"), 64), ip("192.0.2.1"));
    }
}
