//! The five ways a limit can run (the four algorithms, the sliding window both interpolated
//! and strict), shared by the tests that go through all of them.

use slidegate::{Algorithm, Limit};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Interpolated,
    Strict,
    Fixed,
    Log,
    Gcra,
}

pub const VARIANTS: [Variant; 5] =
    [Variant::Interpolated, Variant::Strict, Variant::Fixed, Variant::Log, Variant::Gcra];

impl Variant {
    pub fn algorithm(self) -> Algorithm {
        match self {
            Variant::Interpolated | Variant::Strict => Algorithm::SlidingWindow,
            Variant::Fixed => Algorithm::FixedWindow,
            Variant::Log => Algorithm::SlidingLog,
            Variant::Gcra => Algorithm::Gcra,
        }
    }

    /// `limit` as this variant runs it (strict for [`Variant::Strict`]).
    pub fn limit(self, limit: Limit) -> Limit {
        if self == Variant::Strict {
            limit.strict()
        } else {
            limit
        }
    }
}
