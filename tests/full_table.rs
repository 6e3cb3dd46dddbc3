//! A table at `max_keys`: an idle key (its windows count nothing) gives its place to a new
//! key at the new key's check, without a sweep, on a manual clock, for every algorithm and
//! across shards; when every key is live, `WhenFull::Refuse` refuses the new key and leaves
//! every count alone, and `WhenFull::EvictLeastRecent` admits it in place of the least
//! recently used key of a sample; `peek` agrees with the check where the table's hints
//! allow it to know.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Algorithm, Denial, Limit, Limiter, ManualClock, WhenFull};

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

fn limiter(
    algorithm: Algorithm,
    limit: Limit,
    max_keys: usize,
    when_full: WhenFull,
) -> (ManualClock, Limiter<u64>) {
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .algorithm(algorithm)
        .limit(limit)
        .max_keys(max_keys)
        .when_full(when_full)
        .clock(clock.clone())
        .build()
        .unwrap();
    (clock, limiter)
}

#[test]
fn an_idle_key_gives_its_place_to_a_new_key_without_a_sweep() {
    for algorithm in ALGORITHMS {
        let (clock, limiter) = limiter(algorithm, Limit::per_second(1), 2, WhenFull::Refuse);
        assert!(limiter.check(&1).is_allowed(), "{algorithm:?}");
        assert!(limiter.check(&2).is_allowed(), "{algorithm:?}");
        // Both keys live: refused, and neither key's count is touched.
        assert_eq!(limiter.check(&3).denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!(limiter.peek(&3).denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0)), "{algorithm:?}");
        // Every algorithm's state of a 1/s limit counts nothing 3 s after its last unit.
        clock.advance(Duration::from_secs(3));
        assert!(limiter.peek(&3).is_allowed(), "{algorithm:?}: the peek sees room");
        assert!(limiter.check(&3).is_allowed(), "{algorithm:?}: an idle key made room");
        assert!(limiter.check(&4).is_allowed(), "{algorithm:?}: the other idle key too");
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
        // Now 3 and 4 are live and 1 and 2 are gone.
        assert_eq!(limiter.check(&1).denial(), Some(Denial::TooManyKeys), "{algorithm:?}");
        assert_eq!(limiter.check(&3).denial(), Some(Denial::Limit(0)), "{algorithm:?}");
    }
}

/// With 64 shards and 4 keys, a new key's shard almost never holds one: the room is found
/// in other shards, through their hints. Round after round, every new key gets in at its
/// first check as soon as the old ones are idle, and never before. 50 limiters, each with
/// its own random hashing, put keys in every slot of a shard's array, the last included.
#[test]
fn idle_keys_in_other_shards_make_room() {
    for limiter_no in 0..50 {
        let (clock, limiter) = limiter(Algorithm::SlidingWindow, Limit::per_second(5), 4, WhenFull::Refuse);
        let mut next = 0u64;
        for round in 0..200 {
            for _ in 0..4 {
                assert!(limiter.check(&next).is_allowed(), "limiter {limiter_no}, round {round}: key {next}");
                next += 1;
            }
            assert_eq!(limiter.check(&next).denial(), Some(Denial::TooManyKeys), "round {round}: all live");
            assert_eq!(limiter.len(), 4);
            // Expiry of a one-slot 1 s window: 2 s after the last unit.
            clock.advance(Duration::from_millis(1999));
            assert_eq!(
                limiter.check(&next).denial(),
                Some(Denial::TooManyKeys),
                "round {round}: not yet idle"
            );
            clock.advance(Duration::from_millis(1));
        }
    }
}

/// An idle key in a table of many keys is found by the hands' laps, whatever its shard,
/// with the rest of the table live.
#[test]
fn a_few_idle_keys_among_many_live_ones_are_found() {
    let (clock, limiter) = limiter(Algorithm::SlidingWindow, Limit::per_minute(10), 4096, WhenFull::Refuse);
    for key in 0..16 {
        assert!(limiter.check(&key).is_allowed());
    }
    // 61 s later (expiry: the window and one slot) keys 0..16 are idle; the rest are
    // inserted now and live.
    clock.advance(Duration::from_secs(61));
    for key in 16..4096 {
        assert!(limiter.check(&key).is_allowed());
    }
    // A new client retries until it gets in. A refused check has looked at 16 keys in each
    // of at least two shards that may hold an idle key (those 16 keys' shards, each of about
    // 64 keys, under 100 with the spread of hashing; the others' keys were all inserted at
    // 61 s, so their hints say none is idle before 122 s): 4 from each shard's hand and 12
    // sampled elsewhere in it. One lap of those shards' hands passes every idle key, and
    // its end sets the shard's hint to 122 s (every key the lap passed is live): so at most
    // 16 × 100 / 8 = 200 refused checks (fewer, as the samples find most first).
    let mut refused = 0;
    for key in 10_000..10_016 {
        while !limiter.check(&key).is_allowed() {
            refused += 1;
            assert!(refused <= 200, "key {key}: {refused} checks refused while idle keys remain");
        }
    }
    assert_eq!(limiter.check(&20_000).denial(), Some(Denial::TooManyKeys));
    for key in 16..4096 {
        assert_eq!(limiter.peek(&key).remaining(), 8, "live key {key} keeps its unit");
    }
}

#[test]
fn evict_least_recent_admits_a_new_key_in_place_of_an_old_one() {
    for algorithm in ALGORITHMS {
        let (clock, limiter) = limiter(algorithm, Limit::per_minute(10), 2, WhenFull::EvictLeastRecent);
        assert!(limiter.check(&1).is_allowed(), "{algorithm:?}");
        assert!(limiter.check(&2).is_allowed(), "{algorithm:?}");
        clock.advance(Duration::from_secs(1));
        assert!(limiter.peek(&3).is_allowed(), "{algorithm:?}");
        let d = limiter.check(&3);
        assert!(d.is_allowed(), "{algorithm:?}: a live key evicted: {d:?} len {}", limiter.len());
        assert_eq!(limiter.len(), 2, "{algorithm:?}");
    }
}

/// Sampled LRU: with half the keys a minute old and half fresh, evictions fall on the old.
#[test]
fn evict_least_recent_evicts_old_keys_first() {
    let (clock, limiter) =
        limiter(Algorithm::SlidingWindow, Limit::per_hour(10), 2048, WhenFull::EvictLeastRecent);
    for key in 0..1024 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(60));
    for key in 1024..2048 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(60));
    for key in 100_000..100_512 {
        assert!(limiter.check(&key).is_allowed());
    }
    assert_eq!(limiter.len(), 2048);
    // A held key's peek has 8 left (one unit used), an evicted one's 9.
    let gone = |keys: std::ops::Range<u64>| keys.filter(|key| limiter.peek(key).remaining() == 9).count();
    let (old, fresh, new) = (gone(0..1024), gone(1024..2048), gone(100_000..100_512));
    assert_eq!(old + fresh + new, 512);
    // A sample of 8 keys of a shard holds no old key with odds of 2^-8 at first; by the end
    // about a quarter of each shard's keys are old ones still held (16 of 32, less 8
    // evicted), so at worst 0.75^8 ≈ 0.10: fewer than 51 of 512 fresh evictions expected,
    // and 64 leaves room for the shards' spread. A new key goes only when a whole sample is
    // new keys (a quarter of the keys at the end: 0.25^8 per eviction, a few in a thousand
    // over 512 even counting samples that meet a key twice); 8 leaves room.
    assert!(fresh <= 64, "{old} old, {fresh} fresh and {new} new keys evicted");
    assert!(new <= 8, "{old} old, {fresh} fresh and {new} new keys evicted");
}

/// A spray of new keys against a full table of live keys, with `Refuse`: every new key is
/// refused and every held key keeps its count, whichever shard the searches visit.
#[test]
fn a_spray_against_live_keys_is_refused_and_changes_nothing() {
    let (clock, limiter) = limiter(Algorithm::SlidingWindow, Limit::per_minute(10), 1000, WhenFull::Refuse);
    for key in 0..1000 {
        assert!(limiter.check_n(&key, 3).is_allowed());
    }
    for step in 0..50 {
        clock.advance(Duration::from_millis(500));
        for key in 0..200 {
            let key = 1_000_000 + step * 200 + key;
            assert_eq!(limiter.check(&key).denial(), Some(Denial::TooManyKeys));
        }
    }
    for key in 0..1000 {
        assert_eq!(limiter.peek(&key).remaining(), 6, "key {key}");
    }
}

/// Under `EvictLeastRecent`, a request charged to more keys than the table holds would
/// have its keys evict one another for ever: `check_all` answers `TooManyKeys` instead, and
/// pairs of new keys at a full table of 64 all get an answer.
#[test]
fn check_all_terminates_when_its_keys_cannot_all_be_held() {
    let (_clock, tiny) =
        limiter(Algorithm::SlidingWindow, Limit::per_second(10), 1, WhenFull::EvictLeastRecent);
    let d = tiny.check_all(&[&1, &2], 1).unwrap();
    assert_eq!(d.denial(), Some(Denial::TooManyKeys));
    let (_clock, full) =
        limiter(Algorithm::SlidingWindow, Limit::per_second(10), 64, WhenFull::EvictLeastRecent);
    for key in 0..64 {
        assert!(full.check(&key).is_allowed());
    }
    for pair in 0..2000u64 {
        let (a, b) = (1000 + 2 * pair, 1001 + 2 * pair);
        let _ = full.check_all(&[&a, &b], 1).unwrap();
        assert!(full.len() <= 64);
    }
}

/// A shard that a sweep emptied holds no key: a peek of a new key at a table full of live
/// keys says `TooManyKeys`, as the check does, rather than hoping for room there.
#[test]
fn peek_and_check_agree_after_a_sweep_emptied_shards() {
    let (clock, limiter) = limiter(Algorithm::SlidingWindow, Limit::per_second(1), 4, WhenFull::Refuse);
    for key in 0..4 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(3));
    assert_eq!(limiter.sweep(), 4);
    for key in 10..14 {
        assert!(limiter.check(&key).is_allowed());
    }
    for key in 20..40 {
        assert_eq!(limiter.peek(&key).denial(), Some(Denial::TooManyKeys), "peek of {key}");
        assert_eq!(limiter.check(&key).denial(), Some(Denial::TooManyKeys), "check of {key}");
    }
}

/// A key moved to a policy that forgets sooner (`set_policy`, which replaces its state)
/// is found idle by that policy's expiry, not the old one's.
#[test]
fn a_key_moved_to_a_shorter_policy_is_idle_by_the_new_expiry() {
    use slidegate::PolicyConfig;
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .policy("slow", PolicyConfig::new([Limit::per_hour(10)]))
        .policy("fast", PolicyConfig::new([Limit::per_second(10)]))
        .max_keys(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(limiter.check(&1).is_allowed());
    limiter.set_policy(&1, "fast").unwrap();
    clock.advance(Duration::from_secs(3));
    assert!(limiter.check(&2).is_allowed(), "key 1 is idle under its new policy");
    assert_eq!(limiter.len(), 1);
}

/// `EvictLeastRecent` admits every new key, from several threads at once at a small full
/// table: none is refused for a busy shard or a place another insert took.
#[test]
fn evict_least_recent_admits_every_new_key_under_threads() {
    let (_clock, limiter) =
        limiter(Algorithm::SlidingWindow, Limit::per_second(10), 64, WhenFull::EvictLeastRecent);
    let refused = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (limiter, refused) = (&limiter, &refused);
            s.spawn(move || {
                for i in 0..20_000u64 {
                    if !limiter.check(&(t << 32 | i)).is_allowed() {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(refused.into_inner(), 0);
    assert!(limiter.len() <= 64);
}

fn per_second_5(max_keys: usize, when_full: WhenFull) -> (ManualClock, Limiter<u64>) {
    limiter(Algorithm::SlidingWindow, Limit::per_second(5), max_keys, when_full)
}

/// With the clock stopped, every idle key is found: a spray of new keys at a table of
/// `idle` idle keys and the rest live admits exactly `idle` of them (each takes one idle
/// key's place; the new keys are live), however the searches' samples and hands fall.
#[test]
fn every_idle_key_is_found_with_the_clock_stopped() {
    for no in 0..20u64 {
        let (clock, limiter) = per_second_5(4096, WhenFull::Refuse);
        let idle = 100 + (no % 4) * 100;
        for key in 0..idle {
            assert!(limiter.check(&key).is_allowed());
        }
        clock.advance(Duration::from_secs(3));
        for key in idle..4096 {
            assert!(limiter.check(&key).is_allowed());
        }
        // A run of 3,000 refusals in a row: every hand has gone round its shard (at most
        // about 100 keys each, 8 per refusal in two shards), so no idle key is left.
        let (mut admitted, mut run, mut next) = (0u64, 0u64, 1u64 << 40);
        while run < 3000 {
            next += 1;
            if limiter.check(&next).is_allowed() {
                (admitted, run) = (admitted + 1, 0);
            } else {
                run += 1;
            }
        }
        assert_eq!(admitted, idle, "limiter {no}");
    }
}

/// The clock moves in 1 s steps; a key admitted at step j is idle from step j + 2. At each
/// step a spray runs until 2,000 refusals in a row; then no idle key is left: the keys
/// idle by then (inserted two steps ago or earlier) all gave their places.
#[test]
fn every_idle_key_is_found_as_time_moves() {
    for no in 0..6u64 {
        let (clock, limiter) = per_second_5(4096, WhenFull::Refuse);
        clock.advance(Duration::from_millis(500));
        let mut inserted = vec![0u64; 80];
        let mut key = 0u64;
        for slot in inserted.iter_mut().take(16) {
            for _ in 0..256 {
                assert!(limiter.check(&key).is_allowed());
                key += 1;
            }
            *slot = 256;
            clock.advance(Duration::from_secs(1));
        }
        let mut taken = 0u64;
        let mut next = 1u64 << 40;
        for step in 16..60 {
            let (mut run, mut got) = (0, 0u64);
            while run < 2000 {
                next += 1;
                if limiter.check(&next).is_allowed() {
                    (got, run) = (got + 1, 0);
                } else {
                    run += 1;
                }
            }
            inserted[step] = got;
            taken += got;
            let idle: u64 = inserted[..=step - 2].iter().sum();
            assert_eq!(idle, taken, "limiter {no} step {step}: idle keys left unfound");
            clock.advance(Duration::from_secs(1));
        }
    }
}

/// Four threads spray new keys at a table full of idle keys: none is refused for a busy
/// shard while idle keys remain (4,000 new keys take at most a fifth of them).
#[test]
fn a_busy_shard_does_not_refuse_new_keys_while_keys_are_idle() {
    let (clock, limiter) = per_second_5(20_000, WhenFull::Refuse);
    for key in 0..20_000 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(10));
    let refused = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (limiter, refused) = (&limiter, &refused);
            s.spawn(move || {
                for i in 0..1000 {
                    if !limiter.check(&(1_000_000 * (t + 1) + i)).is_allowed() {
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(refused.into_inner(), 0);
}

/// Two first checks of one new key at once, at a full table with idle keys: both are
/// admitted (the second waits for the first's insert and finds the key), never one
/// admitted and one refused as too many keys. 500 rounds take a quarter of the 2,000 idle
/// keys, so a search (48 keys looked at, most at random, three quarters of them idle)
/// misses with odds far below 1e-9: a refusal here is the race, not the search.
#[test]
fn two_first_checks_of_one_new_key_agree() {
    let (clock, limiter) = per_second_5(2000, WhenFull::Refuse);
    for key in 0..2000 {
        assert!(limiter.check(&key).is_allowed());
    }
    clock.advance(Duration::from_secs(10));
    let barrier = std::sync::Barrier::new(2);
    let answers: Vec<Vec<Option<Denial>>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (limiter, barrier) = (&limiter, &barrier);
                s.spawn(move || {
                    (0..500u64)
                        .map(|round| {
                            barrier.wait();
                            limiter.check(&(10_000_000 + round)).denial()
                        })
                        .collect()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (round, (a, b)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert!(a.is_none() && b.is_none(), "round {round}: {a:?} and {b:?}");
    }
}

/// `EvictLeastRecent` with the new key's shard holding one key in an array left large by
/// resets: the search reads that key or goes on to other shards, and every new key gets in.
#[test]
fn evict_least_recent_admits_new_keys_of_a_sparse_shard() {
    for seed in 0..10u64 {
        let (_clock, limiter) =
            limiter(Algorithm::SlidingWindow, Limit::per_minute(10), 3000, WhenFull::EvictLeastRecent);
        let shard = limiter.shard_of(&(seed * 1_000_000_007));
        let mut same = (seed * 10_000_000..).filter(|k| limiter.shard_of(k) == shard);
        let mut others = (seed * 10_000_000 + 5_000_000..).filter(|k| limiter.shard_of(k) != shard);
        let crowded: Vec<u64> = same.by_ref().take(2000).collect();
        for key in crowded.iter().copied().chain(others.by_ref().take(1000)) {
            assert!(limiter.check(&key).is_allowed());
        }
        for key in &crowded[..1999] {
            assert!(limiter.reset(key));
        }
        for key in others.by_ref().take(1999) {
            assert!(limiter.check(&key).is_allowed());
        }
        assert_eq!(limiter.len(), 3000);
        for key in same.take(10) {
            assert!(limiter.check(&key).is_allowed(), "seed {seed}: key {key}");
        }
    }
}
