//! What a request weighs: [`Cost`], one unit by default ([`UnitCost`]) or a closure's
//! answer ([`CostFn`], from [`RateLimitLayer::cost`](super::RateLimitLayer::cost)).

use std::fmt;

use http::Request;

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

/// A closure as a [`Cost`]: see [`RateLimitLayer::cost`](super::RateLimitLayer::cost).
#[derive(Clone)]
pub struct CostFn<F>(pub(super) F);

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
