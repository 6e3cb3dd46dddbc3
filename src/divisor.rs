//! Division by a divisor fixed at build time, as two multiplications instead of a `div`
//! instruction (which costs 15 to 40 cycles on the machines slidegate targets and would be
//! three of them per check: the slot of `now`, its ring position, and the faded share of
//! the oldest slot).
//!
//! With `m = ⌈2¹²⁸ / d⌉`, `⌊n / d⌋ = ⌊n · m / 2¹²⁸⌋` for every 64-bit `n` (Lemire, Kaser and
//! Kurz, "Faster Remainder by Direct Computation", 2019); the product is formed from two
//! 64×64→128 multiplications. Powers of two shift instead.

/// A non-zero `u64` divisor prepared for fast division.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    divisor: u64,
    /// `⌈2¹²⁸ / divisor⌉`, or 0 for a power of two.
    multiplier: u128,
}

impl Divisor {
    /// `None` for 0.
    pub(crate) fn new(divisor: u64) -> Option<Divisor> {
        if divisor == 0 {
            return None;
        }
        #[allow(
            clippy::arithmetic_side_effects,
            reason = "divisor ≥ 3 here, so the quotient is far below u128::MAX"
        )]
        let multiplier = if divisor.is_power_of_two() { 0 } else { u128::MAX / u128::from(divisor) + 1 };
        Some(Divisor { divisor, multiplier })
    }

    /// `(n / divisor, n % divisor)`.
    #[inline]
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "products of 64-bit halves; their sum is ⌊n·m / 2⁶⁴⌋ < 2¹²⁸; q·divisor ≤ n"
    )]
    pub(crate) fn div_rem(&self, n: u64) -> (u64, u64) {
        let q = if self.multiplier == 0 {
            n >> self.divisor.trailing_zeros()
        } else {
            let n = u128::from(n);
            let high = n * (self.multiplier >> 64);
            let low = (n * u128::from(self.multiplier as u64)) >> 64;
            // Below 2⁶⁴: it is ⌊n / divisor⌋.
            ((high + low) >> 64) as u64
        };
        (q, n - q * self.divisor)
    }

    /// `n % divisor`.
    #[inline]
    pub(crate) fn rem(&self, n: u64) -> u64 {
        self.div_rem(n).1
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, reason = "test code: an overflow is a failed test")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(n: u64, d: u64) {
        let div = Divisor::new(d).unwrap();
        assert_eq!(div.div_rem(n), (n / d, n % d), "{n} / {d}");
    }

    #[test]
    fn edges() {
        assert_eq!(Divisor::new(0), None);
        for d in [1, 2, 3, 7, 10, 1_000_000, 1_000_000_000, 3_600_000_000_000, u64::MAX - 1, u64::MAX] {
            for n in [0, 1, d - 1, d, d.wrapping_add(1), u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                check(n, d);
            }
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_div_instruction(n: u64, d in 1u64..) {
            check(n, d);
        }

        #[test]
        fn agrees_on_small_divisors(n: u64, d in 1u64..5000) {
            check(n, d);
        }
    }
}
