//! `Algorithm::Gcra` is governor's GCRA: fed the same requests at the same instants (two
//! manual clocks moved together, random gaps around the emission interval), a slidegate
//! GCRA limit and a governor limiter with the equivalent `Quota` (burst `max`, or the
//! limit's `burst` as `allow_burst`; one cell per `window / max`) agree on every decision, and a slidegate refusal's `retry_after` equals
//! governor's `wait_time_from(now)` to the nanosecond. Limits are chosen so `window / max`
//! is a whole number of nanoseconds (governor rounds the interval down, slidegate up).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, FakeRelativeClock};
use governor::{Quota, RateLimiter};
use slidegate::{Algorithm, Limit, Limiter, ManualClock};

#[allow(dead_code)]
mod support {
    pub mod rng;
}
use support::rng::Rng;

#[test]
fn gcra_decides_exactly_as_governor() {
    for (limit, quota) in [
        (Limit::per_second(10), Quota::per_second(NonZeroU32::new(10).unwrap())),
        (Limit::per_minute(100), Quota::per_minute(NonZeroU32::new(100).unwrap())),
        (Limit::per_hour(1), Quota::per_hour(NonZeroU32::new(1).unwrap())),
        (Limit::per_second(50), Quota::per_second(NonZeroU32::new(50).unwrap())),
        // A burst set apart from the rate (`Limit::burst`, governor's `allow_burst`),
        // larger and smaller than the rate's `max`.
        (
            Limit::per_second(10).burst(50),
            Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(50).unwrap()),
        ),
        (
            Limit::per_minute(100).burst(5),
            Quota::per_minute(NonZeroU32::new(100).unwrap()).allow_burst(NonZeroU32::new(5).unwrap()),
        ),
    ] {
        let interval = u64::try_from(quota.replenish_interval().as_nanos()).unwrap();
        for seed in 1..=5u64 {
            let ours = ManualClock::new();
            let theirs = FakeRelativeClock::default();
            let slidegate = Limiter::<u64>::builder()
                .algorithm(Algorithm::Gcra)
                .limit(limit)
                .clock(ours.clone())
                .build()
                .unwrap();
            let governor = RateLimiter::direct_with_clock(quota, theirs.clone());
            let mut rng = Rng(seed);
            let (mut allowed, mut refused) = (0, 0);
            for step in 0..3000 {
                // Mostly bursts (gap 0), often around the interval, now and then a long pause,
                // and exact multiples of the interval (the boundary cases).
                let gap = match rng.below(40) {
                    0..=19 => 0,
                    20..=29 => rng.below(2 * interval),
                    30..=33 => interval * rng.below(3),
                    34..=36 => interval - 1,
                    37 | 38 => rng.below(interval),
                    _ => rng.below(u64::try_from(limit.window().as_nanos()).unwrap() / 8),
                };
                ours.advance(Duration::from_nanos(gap));
                theirs.advance(Duration::from_nanos(gap));
                let d = slidegate.check(&1);
                match governor.check() {
                    Ok(()) => {
                        allowed += 1;
                        assert!(
                            d.is_allowed(),
                            "{limit} seed {seed} step {step}: governor allowed, slidegate {d:?}"
                        );
                    }
                    Err(not_until) => {
                        refused += 1;
                        assert!(
                            !d.is_allowed(),
                            "{limit} seed {seed} step {step}: governor refused, slidegate {d:?}"
                        );
                        let wait = not_until.wait_time_from(theirs.now());
                        assert_eq!(d.retry_after(), Some(wait), "{limit} seed {seed} step {step}");
                    }
                }
            }
            assert!(
                allowed > 100 && refused > 50,
                "{limit} seed {seed}: {allowed} allowed, {refused} refused"
            );
        }
    }
}
