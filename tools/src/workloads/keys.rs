//! Which keys a workload checks, and in what order.
//!
//! Keys are inserted in one random order ([`shuffled`]) and visited in an independent
//! random sequence with repeats ([`Visits`]): a key's place in the visit sequence says
//! nothing about where its state was allocated, so the hardware prefetcher cannot hide a
//! lookup's misses by streaming nodes in allocation order. Both contenders of a scenario see
//! the same insertion order and the same visit sequence (the same seeds).

use crate::rng::Rng;

/// The seed of the insertion order.
const INSERT_SEED: u64 = 0x5EED_1A5E_0000_0001;
/// The seed of the first visit sequence; thread `t` of a threaded workload adds `t`.
pub const VISIT_SEED: u64 = 0x5EED_0F0A_11CE_0002;

/// `base..base + n` in one fixed pseudo-random order (Fisher-Yates on SplitMix64): the
/// order keys are inserted in.
pub fn shuffled(base: u64, n: u64) -> Vec<u64> {
    let mut keys: Vec<u64> = (base..base + n).collect();
    let mut rng = Rng(INSERT_SEED ^ base);
    for i in (1..keys.len()).rev() {
        let j = below(rng.next(), i as u64 + 1) as usize;
        keys.swap(i, j);
    }
    keys
}

/// `x` (uniform over `u64`) mapped to `0..n` by a multiply and a shift (no division on
/// the timed path).
#[inline]
fn below(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// An endless visit sequence: keys drawn uniformly from `base..base + n`, with repeats,
/// independently of the insertion order. Each draw is one SplitMix64 step and a multiply
/// (a few instructions, the same for both contenders, and independent of the lookups, so
/// they overlap). A `Visits` is a cursor: a pass that stops leaves it where the next pass
/// on the same key set goes on.
#[derive(Debug, Clone)]
pub struct Visits {
    /// SplitMix64's state (`crate::rng::Rng`'s generator, inlined here for the timed loop).
    state: u64,
    base: u64,
    n: u64,
}

impl Visits {
    /// The sequence over `base..base + n` seeded with `seed`.
    pub fn new(seed: u64, base: u64, n: u64) -> Visits {
        Visits { state: seed, base, n }
    }

    /// The next key to check.
    #[inline]
    pub fn next_key(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.base + below(z ^ (z >> 31), self.n)
    }
}
