//! Requests no limit applies to: paths (health checks), peers (internal networks) and keys
//! (an allow-list), set on [`RateLimitLayer`] and checked before anything is counted.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::net::IpAddr;

use ipnet::IpNet;

use super::client_ip::networks_of;
use super::{path, LayerError, RateLimitLayer};

/// What a layer lets through without a check.
#[derive(Clone)]
pub(super) struct Exemptions<K> {
    /// Normalised prefixes, matched as routes are.
    paths: Vec<String>,
    networks: Vec<IpNet>,
    keys: HashSet<K, ahash::RandomState>,
}

impl<K> Default for Exemptions<K> {
    fn default() -> Self {
        Exemptions { paths: Vec::new(), networks: Vec::new(), keys: HashSet::default() }
    }
}

impl<K: Hash + Eq> Exemptions<K> {
    /// Is the normalised `path` under an exempt prefix?
    pub(super) fn path(&self, path: &str) -> bool {
        self.paths.iter().any(|prefix| path::under(path, prefix))
    }

    /// Is the request's peer in an exempt network?
    pub(super) fn peer(&self, peer: impl FnOnce() -> Option<IpAddr>) -> bool {
        !self.networks.is_empty()
            && peer().is_some_and(|ip| self.networks.iter().any(|net| net.contains(&ip)))
    }

    /// Is `key` on the allow-list?
    pub(super) fn key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        !self.keys.is_empty() && self.keys.contains(key)
    }
}

impl<K, X, C, R> RateLimitLayer<K, X, C, R>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Clone,
    C: Clone,
    R: Clone,
{
    /// Requests whose path is one of `prefixes` or below it (matched as
    /// [`route`](Self::route) matches, on the normalised path) pass without a check and
    /// without `RateLimit` fields: health checks, metrics scrapes. A path without a single
    /// normal form is still refused (400). [`LayerError::InvalidRoute`] for a prefix that
    /// cannot be normalised.
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.exempt_paths(["/healthz", "/metrics"])?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_paths<S: AsRef<str>>(
        self,
        prefixes: impl IntoIterator<Item = S>,
    ) -> Result<Self, LayerError> {
        let ignore_case = self.config.ignore_case;
        let normal = prefixes
            .into_iter()
            .map(|p| {
                let p = p.as_ref();
                path::normalize(p, ignore_case)
                    .map(|n| n.into_owned())
                    .map_err(|e| LayerError::InvalidRoute { prefix: p.to_owned(), reason: e.reason() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.edit(|c| c.exempt.paths.extend(normal)))
    }

    /// Requests whose peer (the address the connection comes from, not a forwarded one) is
    /// in one of `networks` (CIDRs or addresses) pass without a check: internal callers,
    /// a monitoring host. [`LayerError::InvalidNetwork`] for an entry that is neither.
    /// Behind a proxy every request's peer is the proxy: exempt by key instead.
    ///
    /// ```
    /// use slidegate::tower::{PeerIp, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<std::net::IpAddr>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, PeerIp)?.exempt_networks(["10.0.0.0/8", "192.168.7.1"])?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_networks<S: AsRef<str>>(
        self,
        networks: impl IntoIterator<Item = S>,
    ) -> Result<Self, LayerError> {
        let networks = networks_of(networks)?;
        Ok(self.edit(|c| c.exempt.networks.extend(networks)))
    }

    /// Requests whose key (as the extractor finds it) is one of `keys` pass without a
    /// check: an allow-list of partners' API keys, the addresses of your own services.
    ///
    /// ```
    /// use slidegate::tower::{HeaderKey, RateLimitLayer};
    /// use slidegate::{Limit, Limiter};
    /// let limiter = Limiter::<Vec<u8>>::builder().limit(Limit::per_second(10)).max_keys(100_000).build()?;
    /// let layer = RateLimitLayer::new("api", limiter, HeaderKey::new("x-api-key")?)?
    ///     .exempt_keys([b"internal-batch-job".to_vec()]);
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_keys(self, keys: impl IntoIterator<Item = K>) -> Self {
        self.edit(|c| c.exempt.keys.extend(keys))
    }
}
