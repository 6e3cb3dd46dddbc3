//! Regression tests for five breaks of the documented contract that an outside test suite
//! found. Each test states the contract it holds the limiter to, and fails where the code
//! breaks it:
//!
//! 1. `check_all`: a key under a shadow policy never weakens an enforced key's limit: the
//!    request is decided and charged exactly as if the shadow key were not there, even when
//!    the shadow key would answer `CostTooLarge` (compared with a twin limiter that checks
//!    the enforced key alone).
//! 2. Units recorded near 2³² per slot (`record`) stay counted while they are inside the
//!    window: no check is admitted early, and a refusal's `retry_after` is never earlier
//!    than the exact reference model's (`support/model.rs`), strict and interpolated, with
//!    one, two and ten slots per window.
//! 3. `peek` predicts `check` in shadow mode (a limiter in shadow mode, or a shadow
//!    policy): the same `is_allowed()` and the same `shadow_denial()`.
//! 4. `max_keys` under concurrent inserts: `len()` never exceeds it while `check_all`
//!    inserts keys from several threads, and a new key is never refused with
//!    `Denial::TooManyKeys` while the table has room (neither because of another request's
//!    transient count, nor in a table that never fills).
//! 5. Sweeping keeps every key it does not evict findable: after most keys expire and a
//!    sweep rebuilds the shrunken shards, every key that used its budget is still refused
//!    (`u64` keys, whose hashing `ahash` specialises on nightly, and `String` keys).
//!
//! Time is a `ManualClock` everywhere; the stress tests of 4 are bounded to a few seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Algorithm, Denial, Limit, Limiter, ManualClock, PolicyConfig, MAX_UNITS};

#[allow(dead_code)]
mod support {
    pub mod model;
}
use support::model::Rule;

// ---------------------------------------------------------------------------------------
// 1. check_all: a shadow key never weakens an enforced one
// ---------------------------------------------------------------------------------------

/// Keys starting with `trial:` are under the shadow policy "trial" (2/s), every other key
/// under the enforced default "enforced" (10/s).
fn tiered(clock: &ManualClock) -> Limiter<String> {
    Limiter::<String>::builder()
        .policy("enforced", PolicyConfig::new([Limit::per_second(10)]))
        .policy("trial", PolicyConfig::new([Limit::per_second(2)]).shadow(true))
        .default_policy("enforced")
        .resolver(|key: &String| key.starts_with("trial:").then_some("trial"))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_shadow_key_too_small_for_the_cost_does_not_bypass_the_enforced_key() {
    for shadow_first in [false, true] {
        let clock = ManualClock::new();
        let limiter = tiered(&clock);
        let twin = tiered(&clock);
        assert_eq!(limiter.policy_of("trial:t"), "trial");
        assert_eq!(limiter.policy_of("user"), "enforced");
        let keys: [&str; 2] = if shadow_first { ["trial:t", "user"] } else { ["user", "trial:t"] };
        let user = usize::from(shadow_first);
        // Cost 5: above the shadow key's max (2), within the enforced key's (10). Two fit
        // the enforced key, the third and fourth must be refused by it.
        for round in 0..4 {
            let both = limiter.check_all(&keys, 5).unwrap();
            let alone = twin.check_n("user", 5);
            let what =
                format!("shadow key first: {shadow_first}, round {round}: {both:?} vs alone {alone:?}");
            assert_eq!(both.is_allowed(), alone.is_allowed(), "{what}");
            assert_eq!(both.is_allowed(), round < 2, "{what}");
            if both.is_allowed() {
                // The shadow key would refuse it: that is reported, not enforced.
                assert!(both.shadow_denial().is_some(), "{what}");
            } else {
                assert_eq!(both.denial(), Some(Denial::Limit(0)), "{what}");
                assert_eq!(both.key(), user, "{what}");
                assert_eq!(both.retry_after(), alone.retry_after(), "{what}");
            }
            // The enforced key was charged exactly as the twin's.
            assert_eq!(limiter.peek("user").remaining(), twin.peek("user").remaining(), "{what}");
        }
    }
}

#[test]
fn what_the_enforced_key_refuses_stays_refused_next_to_a_shadow_key() {
    let clock = ManualClock::new();
    let limiter = tiered(&clock);
    assert!(limiter.check_n("user", 8).is_allowed());
    for keys in [["user", "trial:t"], ["trial:t", "user"]] {
        // 5 more do not fit the enforced key (8 of 10 used); the shadow key could never
        // fit 5 (CostTooLarge), which must not turn the refusal into an admission.
        let d = limiter.check_all(&keys, 5).unwrap();
        assert!(!d.is_allowed(), "{keys:?}: {d:?}");
        assert_eq!(d.denial(), Some(Denial::Limit(0)), "{keys:?}: {d:?}");
        assert!(d.retry_after().is_some(), "{keys:?}: {d:?}");
        // A cost above the enforced max too: CostTooLarge from the enforced key.
        let d = limiter.check_all(&keys, 11).unwrap();
        assert!(!d.is_allowed(), "{keys:?}: {d:?}");
        assert_eq!(d.denial(), Some(Denial::CostTooLarge(0)), "{keys:?}: {d:?}");
        // Nothing was charged by either refusal.
        assert_eq!(limiter.peek("user").remaining(), 1, "{keys:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Units recorded near 2^32 per slot stay counted while in the window
// ---------------------------------------------------------------------------------------

/// Records `units` in each given slot (one record per slot), then checks the key at the
/// start, middle and end of every slot until well after the window drains, against the
/// exact model. Returns the first disagreement.
///
/// A ring entry holds a count only as wide as the limit needs (8 bits for a `max` up to
/// 254, 16 up to 65,534, else 32): a slot recorded past that saturates and, as the oldest
/// slot, weighs more than `max` until it has left the window. With `saturates` the limiter
/// may then refuse where the exact model admits (conservative), but never the reverse, and
/// `retry_after` is still never early.
fn replay_records(limit: Limit, records: &[(u64, u64)], saturates: bool) -> Result<(), String> {
    let rule = Rule::of(&limit, Algorithm::SlidingWindow);
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build().unwrap();
    let mut log: Vec<(u64, u64)> = Vec::new();
    let check = |t: u64, log: &mut Vec<(u64, u64)>| -> Result<(), String> {
        clock.set(Duration::from_nanos(t));
        let expected = rule.admits(log, t, 1);
        let earliest = rule.earliest(log, t, 1);
        let d = limiter.check(&1);
        let at = format!("{limit} after records {records:?}, check at {t} ns: {d:?}");
        let conservative = saturates && expected && !d.is_allowed();
        if d.is_allowed() != expected && !conservative {
            return Err(format!("{at}: admitted {}, the exact model says {expected}", d.is_allowed()));
        }
        if d.is_allowed() {
            log.push((t, 1));
        } else {
            let Some(wait) = d.retry_after() else { return Err(format!("{at}: no retry_after")) };
            let wait = u64::try_from(wait.as_nanos()).unwrap();
            if t + wait < earliest {
                return Err(format!(
                    "{at}: retry_after {wait} ns is early: the window drains at {earliest} ns"
                ));
            }
        }
        Ok(())
    };
    for &(slot, units) in records {
        let t = slot * rule.p;
        clock.set(Duration::from_nanos(t));
        let _ = limiter.record(&1, units);
        log.push((t, units));
        check(t, &mut log)?;
    }
    let last = records.iter().map(|&(slot, _)| slot).max().unwrap_or(0);
    for slot in last..=last + rule.n + 2 {
        let start = slot * rule.p;
        for t in [start, start + 1, start + rule.p / 2, start + rule.p - 1] {
            check(t, &mut log)?;
        }
    }
    Ok(())
}

/// The record patterns, each slot recorded with up to `top` units.
fn patterns(top: u64) -> [Vec<(u64, u64)>; 4] {
    [
        vec![(0, top), (1, top), (2, top), (3, top), (4, top)],
        vec![(0, top), (1, top), (3, top)],
        vec![(0, top - 1), (1, top - 1), (2, top / 2 + 1), (4, top - 1)],
        vec![(0, top), (2, top), (4, top), (6, top)],
    ]
}

#[test]
fn units_recorded_near_2_pow_32_per_slot_stay_counted_while_in_the_window() {
    // (max, units per recorded slot, whether that saturates the limit's ring entries): up to
    // the entry's width every decision is the exact model's; past it, conservative.
    let cases = [
        (MAX_UNITS, MAX_UNITS, false),
        (1000, MAX_UNITS, true),
        // 1,000: 10-bit entries, whose largest count, 1,023, means saturated.
        (1000, 0x3FE, false),
        (1000, 0xFFFE, true),
        (200, 0xFE, false),
        (200, 100_000, true),
        // 50: 6-bit entries (63 means saturated).
        (50, 62, false),
        (50, 63, true),
        (40_000, 0xFFFE, false),
    ];
    let mut failures = Vec::new();
    let mut count = 0;
    for (max, top, saturates) in cases {
        for (window, precision) in [(10, 1), (2, 1), (10, 10)] {
            let limit =
                Limit::new(max, Duration::from_secs(window)).precision(Duration::from_secs(precision));
            for limit in [limit, limit.strict()] {
                limit.validate().unwrap();
                for pattern in patterns(top) {
                    count += 1;
                    if let Err(failure) = replay_records(limit, &pattern, saturates) {
                        failures.push(failure);
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases broke the contract:\n{}",
        failures.len(),
        count,
        failures.join("\n")
    );
}

#[test]
fn a_key_with_huge_records_is_refused_until_the_window_drains() {
    // The cases above in their plainest form: 2³²−1 units recorded in slots 0, 1 and 3 of
    // a strict 10 s window of 1 s slots. Nothing fits until slot 3 has left the window
    // whole, at 14 s, and every refusal before that must say so.
    let limit = Limit::new(MAX_UNITS, Duration::from_secs(10)).precision(Duration::from_secs(1)).strict();
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build().unwrap();
    for slot in [0, 1, 3] {
        clock.set(Duration::from_secs(slot));
        let _ = limiter.record(&1, MAX_UNITS);
    }
    let drained = Duration::from_secs(14);
    let mut broken = Vec::new();
    let mut t = Duration::from_secs(3);
    while t < drained {
        clock.set(t);
        let d = limiter.check(&1);
        match d.retry_after() {
            _ if d.is_allowed() => broken.push(format!("admitted at {t:?}")),
            Some(wait) if t + wait < drained => broken.push(format!("at {t:?}: retry_after {wait:?}")),
            _ => {}
        }
        t += Duration::from_millis(250);
    }
    assert!(
        broken.is_empty(),
        "units still in the window were forgotten (the window drains at {drained:?}): {}",
        broken.join(", ")
    );
    clock.set(drained);
    assert!(limiter.check(&1).is_allowed());
}

// ---------------------------------------------------------------------------------------
// 3. peek predicts check in shadow mode
// ---------------------------------------------------------------------------------------

/// Uses `key`'s budget step by step; before every check, `peek` must say what it will say.
fn peek_predicts_check(limiter: &Limiter<String>, key: &str, checks: usize) {
    let mut denials = 0;
    for i in 0..checks {
        let peeked = limiter.peek(key);
        let checked = limiter.check(key);
        let what = format!("{key}, check #{i}: peek {peeked:?}, check {checked:?}");
        assert_eq!(peeked.is_allowed(), checked.is_allowed(), "{what}");
        assert_eq!(peeked.shadow_denial(), checked.shadow_denial(), "{what}");
        assert_eq!(peeked.denial(), checked.denial(), "{what}");
        if checked.shadow_denial().is_some() {
            denials += 1;
        }
    }
    assert!(denials > 0, "{key}: the budget was never used up: the test tests nothing");
}

#[test]
fn peek_agrees_with_check_for_a_shadow_limiter() {
    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .limit(Limit::per_second(3))
        .shadow(true)
        .clock(clock.clone())
        .build()
        .unwrap();
    peek_predicts_check(&limiter, "alice", 6);
    // Every check is admitted in shadow mode: after the budget is used, peek too.
    assert!(limiter.peek("alice").is_allowed());
    assert_eq!(limiter.peek("alice").shadow_denial(), Some(Denial::Limit(0)));
}

#[test]
fn peek_agrees_with_check_for_a_shadow_policy() {
    let clock = ManualClock::new();
    let limiter = tiered(&clock);
    peek_predicts_check(&limiter, "trial:t", 5);
    assert!(limiter.peek("trial:t").is_allowed());
    assert_eq!(limiter.peek("trial:t").shadow_denial(), Some(Denial::Limit(0)));
    // The enforced key next to it still peeks refusals as refusals.
    for _ in 0..10 {
        assert!(limiter.check("user").is_allowed());
    }
    let peeked = limiter.peek("user");
    assert!(!peeked.is_allowed());
    assert_eq!(peeked.denial(), Some(Denial::Limit(0)));
    assert_eq!(peeked.shadow_denial(), None);
    assert_eq!(limiter.check("user").denial(), Some(Denial::Limit(0)));
}

// ---------------------------------------------------------------------------------------
// 4. max_keys under concurrent inserts
// ---------------------------------------------------------------------------------------

const INSERTERS: usize = 4;

/// `limit` of keys `(thread, i, j)` packed into a `u64`.
fn fresh(thread: usize, i: u64, j: u64) -> u64 {
    ((thread as u64 + 1) << 48) | (i << 2) | j
}

#[test]
fn len_never_exceeds_max_keys_while_check_all_inserts_concurrently() {
    const MAX_KEYS: usize = 64;
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(1000))
        .max_keys(MAX_KEYS)
        .clock(clock.clone())
        .build()
        .unwrap();
    let stop = AtomicBool::new(false);
    let most_seen = AtomicUsize::new(0);
    let samples = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(2);
    thread::scope(|s| {
        for t in 0..INSERTERS {
            let (limiter, stop) = (&limiter, &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (a, b) = (fresh(t, i, 0), fresh(t, i, 1));
                    let _ = limiter.check_all(&[&a, &b], 1).unwrap();
                    i += 1;
                }
            });
        }
        s.spawn(|| {
            let mut n = 0u64;
            while most_seen.load(Ordering::Relaxed) <= MAX_KEYS {
                n += 1;
                if n % 4096 == 0 && Instant::now() >= deadline {
                    break;
                }
                most_seen.fetch_max(limiter.len(), Ordering::Relaxed);
            }
            samples.store(n, Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(samples.load(Ordering::Relaxed) > 0);
    let most = most_seen.load(Ordering::Relaxed);
    assert!(most <= MAX_KEYS, "len() read {most} with max_keys({MAX_KEYS})");
    assert_eq!(limiter.len(), MAX_KEYS, "the inserters filled the table");
}

#[test]
fn a_table_that_never_fills_never_refuses_a_new_key() {
    const PER_THREAD: u64 = 20_000;
    // Room for every key the threads insert: nothing may be refused for capacity.
    let max_keys = INSERTERS * PER_THREAD as usize * 3;
    let clock = ManualClock::new();
    let limiter = Limiter::<u64>::builder()
        .limit(Limit::per_second(1000))
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .unwrap();
    let refused = AtomicUsize::new(0);
    let barrier = Barrier::new(INSERTERS);
    thread::scope(|s| {
        for t in 0..INSERTERS {
            let (limiter, refused, barrier) = (&limiter, &refused, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..PER_THREAD {
                    let (a, b, c) = (fresh(t, i, 0), fresh(t, i, 1), fresh(t, i, 2));
                    let pair = limiter.check_all(&[&a, &b], 1).unwrap();
                    let single = limiter.check(&c);
                    for d in [*pair, single] {
                        if d.denial() == Some(Denial::TooManyKeys) {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(refused.load(Ordering::Relaxed), 0, "TooManyKeys from a table with room for every key");
    assert_eq!(limiter.len(), INSERTERS * PER_THREAD as usize * 3);
}

/// A full table, threads spraying new keys through `check_all` (refused while it is full),
/// and the main thread making room for one key with `reset`, then inserting a new key into
/// it, again and again. Only the main thread ever frees room, and a sprayer's insert is
/// never undone, so when the main thread's new key is refused with `TooManyKeys`, it pauses
/// the sprayers and counts the table: if no sprayer took the room (`len() < max_keys`), the
/// room was there all along and the refusal came from a sprayer's transient count. (A
/// sprayer taking the room first is a fair refusal.)
#[test]
fn a_new_key_is_not_refused_for_room_another_request_only_tried_to_take() {
    const MAX_KEYS: usize = 64;
    const SPRAYERS: usize = 6;
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut rounds, mut inserts, mut fair) = (0u64, 0u64, 0u64);
    let mut unfair: Vec<String> = Vec::new();
    while Instant::now() < deadline && unfair.is_empty() {
        rounds += 1;
        let clock = ManualClock::new();
        let limiter = Limiter::<u64>::builder()
            .limit(Limit::per_second(1000))
            .max_keys(MAX_KEYS)
            .clock(clock.clone())
            .build()
            .unwrap();
        // Keys the main thread knows are held: the ones it frees room from.
        let mut held: Vec<u64> = (0..MAX_KEYS as u64).collect();
        for key in &held {
            assert!(limiter.check(key).is_allowed());
        }
        let (stop, pause, paused) = (AtomicBool::new(false), AtomicBool::new(false), AtomicUsize::new(0));
        thread::scope(|s| {
            for t in 0..SPRAYERS {
                let (limiter, stop, pause, paused) = (&limiter, &stop, &pause, &paused);
                s.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        if pause.load(Ordering::SeqCst) {
                            paused.fetch_add(1, Ordering::SeqCst);
                            while pause.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                                thread::yield_now();
                            }
                            paused.fetch_sub(1, Ordering::SeqCst);
                            continue;
                        }
                        let key = fresh(t, i, 0);
                        let _ = limiter.check_all(&[&key], 1).unwrap();
                        i += 1;
                    }
                });
            }
            let mut j = 0u64;
            while let Some(victim) = held.pop() {
                if j % 256 == 0 && Instant::now() >= deadline {
                    break;
                }
                j += 1;
                assert!(limiter.reset(&victim));
                let new = (1 << 60) | (rounds << 32) | j;
                inserts += 1;
                let d =
                    if j % 2 == 0 { limiter.check(&new) } else { *limiter.check_all(&[&new], 1).unwrap() };
                if d.is_allowed() {
                    held.push(new);
                    continue;
                }
                assert_eq!(d.denial(), Some(Denial::TooManyKeys), "{d:?}");
                pause.store(true, Ordering::SeqCst);
                while paused.load(Ordering::SeqCst) < SPRAYERS {
                    thread::yield_now();
                }
                let len = limiter.len();
                pause.store(false, Ordering::SeqCst);
                if len < MAX_KEYS {
                    unfair.push(format!(
                        "round {rounds}, insert {j}: a new key was refused with TooManyKeys ({}) \
                         although no other key took the room: len() = {len} of max_keys({MAX_KEYS})",
                        if j % 2 == 0 { "check" } else { "check_all" }
                    ));
                    break;
                }
                fair += 1;
            }
            stop.store(true, Ordering::SeqCst);
        });
        assert!(limiter.len() <= MAX_KEYS);
    }
    eprintln!("{rounds} rounds, {inserts} inserts, {fair} refusals where a sprayer took the room");
    assert!(unfair.is_empty(), "{}", unfair.join("\n"));
}

// ---------------------------------------------------------------------------------------
// 5. A sweep that rebuilds shards loses no key
// ---------------------------------------------------------------------------------------

/// Inserts `fillers` keys at 0 s, uses up the budget of every `keep`th key at 10 s, sweeps
/// at 11 s (the fillers expire: 5 per 10 s in 1 s slots expires after 11 s; the shards,
/// left far below a quarter full, are rebuilt), then asserts every kept key is still held
/// and refused, from a thread whose key cache has never seen it.
fn sweep_keeps_spent_keys<K>(name: &str, key: impl Fn(usize) -> K + Sync)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    const KEYS: usize = 60_000;
    const EVERY: usize = 40;
    let clock = ManualClock::new();
    let limiter = Limiter::<K>::builder()
        .limit(Limit::new(5, Duration::from_secs(10)).precision(Duration::from_secs(1)))
        .clock(clock.clone())
        .build()
        .unwrap();
    for i in (0..KEYS).filter(|i| i % EVERY != 0) {
        assert!(limiter.check(&key(i)).is_allowed());
    }
    clock.set(Duration::from_secs(10));
    let kept: Vec<K> = (0..KEYS).step_by(EVERY).map(&key).collect();
    for k in &kept {
        assert_eq!(limiter.check_n(k, 5).remaining(), 0, "{name}: {k:?}");
    }
    assert_eq!(limiter.len(), KEYS);
    clock.set(Duration::from_secs(11));
    let evicted = limiter.sweep();
    assert_eq!(evicted, KEYS - kept.len(), "{name}: the fillers expire, the kept keys do not");
    assert_eq!(limiter.len(), kept.len(), "{name}");
    // A fresh thread: every lookup starts from the table.
    thread::scope(|s| {
        s.spawn(|| {
            let mut lost = Vec::new();
            for k in &kept {
                let peeked = limiter.peek(k);
                let checked = limiter.check(k);
                if peeked.is_allowed() || checked.is_allowed() {
                    lost.push(format!("{k:?}: peek {peeked:?}, check {checked:?}"));
                }
            }
            assert!(
                lost.is_empty(),
                "{name}: {} of {} keys that used their budget were found fresh after the sweep, e.g. {:?}",
                lost.len(),
                kept.len(),
                &lost[..lost.len().min(3)]
            );
        });
    });
    assert_eq!(limiter.len(), kept.len(), "{name}: a lost key was inserted again");
    // And the kept keys are evicted in their turn, all of them.
    clock.set(Duration::from_secs(30));
    assert_eq!(limiter.sweep(), kept.len(), "{name}");
    assert!(limiter.is_empty(), "{name}");
}

#[test]
fn a_sweep_that_rebuilds_shards_keeps_every_u64_key_findable() {
    sweep_keeps_spent_keys("u64", |i| i as u64 * 0x9E37_79B9);
}

#[test]
fn a_sweep_that_rebuilds_shards_keeps_every_string_key_findable() {
    sweep_keeps_spent_keys("String", |i| format!("client-{i}"));
}
