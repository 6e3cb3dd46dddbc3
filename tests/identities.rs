//! `Limiter::check_all`: one request charged to several keys. Sequentially it decides
//! exactly as checking each key alone would allow (admitted iff every key has room; then
//! counted in all; refused: counted in none, naming the key that frees up last), on random
//! traffic, also with keys of different tiers; under contention, threads charging the same keys in opposite orders admit
//! exactly the limit, with no deadlock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use slidegate::{IdentitiesError, Limiter, ManualClock, PolicyConfig, MAX_IDENTITIES};

#[allow(dead_code)]
mod support {
    pub mod rng;
}
use support::rng::Rng;

/// One policy of `limits`; or, if they hold a `"|"`, two tiers: even keys get the limits
/// before it, odd keys those after.
fn limiter(limits: &[&str], clock: &ManualClock) -> Limiter<u64> {
    let mut b = Limiter::<u64>::builder().clock(clock.clone());
    let parse = |ls: &[&str]| ls.iter().map(|l| l.parse().unwrap()).collect::<Vec<_>>();
    match limits.iter().position(|&l| l == "|") {
        Some(bar) => {
            b = b
                .policy("even", PolicyConfig::new(parse(&limits[..bar])))
                .policy("odd", PolicyConfig::new(parse(&limits[bar + 1..])))
                .resolver(|key: &u64| Some(if key % 2 == 0 { "even" } else { "odd" }));
        }
        None => {
            for limit in parse(limits) {
                b = b.limit(limit);
            }
        }
    }
    b.build().unwrap()
}

#[test]
fn check_all_decides_as_its_keys_would_on_random_traffic() {
    for (set, limits) in [
        vec!["5/s"],
        vec!["4/s@250ms strict", "9/min@10s"],
        vec!["3/2s@500ms", "6/10s strict"],
        // Keys of different tiers charged together, each against its own limits.
        vec!["5/s", "|", "3/2s@500ms", "6/10s strict"],
    ]
    .into_iter()
    .enumerate()
    {
        for seed in 0..20u64 {
            let clock = ManualClock::new();
            let (multi, reference) = (limiter(&limits, &clock), limiter(&limits, &clock));
            let mut rng = Rng(seed * 31 + set as u64);
            for step in 0..300 {
                if rng.below(4) == 0 {
                    clock.advance(Duration::from_millis(rng.below(1500)));
                }
                let n = 1 + rng.below(3) as usize;
                let keys: Vec<u64> = (0..n).map(|_| rng.below(4)).collect();
                let cost = [1, 1, 2, 3][rng.below(4) as usize];
                let refs: Vec<&u64> = keys.iter().collect();
                let got = multi.check_all(&refs, cost).unwrap();
                // The reference: every distinct key's room (cost 0) decides.
                let mut distinct: Vec<(usize, u64)> = Vec::new();
                for (i, k) in keys.iter().enumerate() {
                    if !distinct.iter().any(|(_, d)| d == k) {
                        distinct.push((i, *k));
                    }
                }
                let rooms: Vec<u64> =
                    distinct.iter().map(|(_, k)| reference.check_n(k, 0).remaining()).collect();
                let what = format!(
                    "set {set} seed {seed} step {step} keys {keys:?} cost {cost} rooms {rooms:?}: {got:?}"
                );
                if rooms.iter().all(|&r| r >= cost) {
                    let after: Vec<u64> =
                        distinct.iter().map(|(_, k)| reference.check_n(k, cost).remaining()).collect();
                    let least = *after.iter().min().unwrap();
                    let at = after.iter().position(|&r| r == least).unwrap();
                    assert!(got.is_allowed(), "{what}");
                    assert_eq!((got.remaining(), got.key()), (least, distinct[at].0), "{what}");
                } else {
                    // Only the keys without room are asked (a check of a key with room would count).
                    let refusals: Vec<_> = distinct
                        .iter()
                        .zip(&rooms)
                        .map(|((_, k), &room)| (room < cost).then(|| reference.check_n(k, cost)))
                        .collect();
                    let latest = refusals.iter().flatten().map(|d| d.retry_after()).max().unwrap();
                    let at =
                        refusals.iter().position(|d| d.is_some_and(|d| d.retry_after() == latest)).unwrap();
                    assert!(!got.is_allowed(), "{what}");
                    assert_eq!(got.retry_after(), latest, "{what}");
                    assert_eq!(got.key(), distinct[at].0, "{what}");
                    assert_eq!(got.remaining(), *rooms.iter().min().unwrap(), "{what}");
                    assert_eq!(got.denial(), refusals[at].unwrap().denial(), "{what}");
                }
            }
        }
    }
}

#[test]
fn threads_charging_keys_in_opposite_orders_admit_exactly_the_limit() {
    const MAX: u64 = 120;
    for round in 0..30 {
        let clock = ManualClock::new();
        clock.advance(Duration::from_millis(500 + round));
        let limiter = limiter(&["120/min"], &clock);
        let (both, single) = (AtomicU64::new(0), AtomicU64::new(0));
        let barrier = Barrier::new(6);
        thread::scope(|s| {
            for t in 0..6u64 {
                let (limiter, both, single, barrier) = (&limiter, &both, &single, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..60 {
                        match t % 3 {
                            0 => both.fetch_add(
                                u64::from(limiter.check_all(&[&1, &2], 1).unwrap().is_allowed()),
                                Ordering::Relaxed,
                            ),
                            1 => both.fetch_add(
                                u64::from(limiter.check_all(&[&2, &1], 1).unwrap().is_allowed()),
                                Ordering::Relaxed,
                            ),
                            // Key 2 alone, now and then.
                            _ if i % 2 == 0 => {
                                single.fetch_add(u64::from(limiter.check(&2).is_allowed()), Ordering::Relaxed)
                            }
                            _ => 0,
                        };
                    }
                });
            }
        });
        let (both, single) = (both.load(Ordering::Relaxed), single.load(Ordering::Relaxed));
        // Key 2 took every admission: it is exactly full; key 1 holds exactly the shared ones.
        assert_eq!(both + single, MAX, "round {round}: {both} together + {single} alone");
        assert_eq!(limiter.check_n(&1, 0).remaining(), MAX - both, "round {round}");
        assert_eq!(limiter.check_n(&2, 0).remaining(), 0, "round {round}");
    }
}

#[test]
fn too_many_keys_and_edge_cases() {
    let clock = ManualClock::new();
    let limiter = limiter(&["2/s"], &clock);
    let keys: Vec<u64> = (0..=MAX_IDENTITIES as u64).collect();
    let refs: Vec<&u64> = keys.iter().collect();
    assert_eq!(
        limiter.check_all(&refs, 1).unwrap_err(),
        IdentitiesError::TooManyKeys { given: MAX_IDENTITIES + 1, most: MAX_IDENTITIES }
    );
    // A key listed twice counts once.
    assert_eq!(limiter.check_all(&[&7, &7], 1).unwrap().remaining(), 1);
    // No keys is an error whatever the cost; cost 0: nothing counted, nothing inserted.
    assert_eq!(limiter.check_all(&[], 1).unwrap_err(), IdentitiesError::NoKeys);
    assert_eq!(limiter.check_all(&[], 0).unwrap_err(), IdentitiesError::NoKeys);
    assert_eq!(limiter.check_all(&[&8], 0).unwrap().remaining(), 2);
    assert_eq!(limiter.len(), 1);
    // A cost above max can never pass.
    assert_eq!(limiter.check_all(&[&7, &9], 3).unwrap().denial(), Some(slidegate::Denial::CostTooLarge(0)));
}
