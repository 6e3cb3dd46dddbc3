//! Named policies (tiers) and their runtime changes: the resolver, `default_policy`,
//! `set_policy` (which outlives the key's eviction) and `clear_policy` choose each key's
//! policy, and bad names are errors that say which policy; `update_policy` carries counts
//! over as `Carry` documents (a change of `max` alone exactly, whatever `Carry` says, GCRA
//! rounding units up; a new layout conservatively or from empty), and so do `set_policy` and
//! `clear_policy` when they move a held key; a shadow policy admits everything, reports what
//! it would refuse and consumes nothing for it, next to an enforced one, alone and in
//! `check_all`; `check_all` charges keys of different tiers by their own limits; and, under
//! contention at a frozen clock, keys never get more than the largest `max` while another
//! thread keeps changing their policy (`update_policy`, or `set_policy`/`clear_policy`),
//! with every algorithm. Two tests reproduce bugs this suite found (units above a lowered
//! `max` dropped by the next carry; a GCRA state carried beyond its burst expiring early).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use slidegate::{Algorithm, Carry, ConfigError, Denial, Limit, Limiter, ManualClock, PolicyConfig};

#[allow(dead_code)]
mod support {
    pub mod race;
    pub mod rng;
}
use support::race::THREADS;
use support::rng::Rng;

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

fn limit(text: &str) -> Limit {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn config(limits: &[&str]) -> PolicyConfig {
    PolicyConfig::new(limits.iter().map(|text| limit(text)))
}

/// A limiter of `u64` keys with these named policies (the first is the default); with
/// `resolve`, keys below 100 get the second.
fn tiers_with(
    algorithm: Algorithm,
    policies: &[(&'static str, PolicyConfig)],
    resolve: bool,
    clock: &ManualClock,
) -> Limiter<u64> {
    let mut builder = Limiter::<u64>::builder().algorithm(algorithm).clock(clock.clone());
    for (name, config) in policies {
        builder = builder.policy(name, config.clone());
    }
    if let (true, Some(&(second, _))) = (resolve, policies.get(1)) {
        builder = builder.resolver(move |key: &u64| (*key < 100).then_some(second));
    }
    builder.build().unwrap()
}

/// [`tiers_with`] with the resolver: keys below 100 get the second policy.
fn tiers(
    algorithm: Algorithm,
    policies: &[(&'static str, PolicyConfig)],
    clock: &ManualClock,
) -> Limiter<u64> {
    tiers_with(algorithm, policies, true, clock)
}

/// One policy named "p" with these limits.
fn single(algorithm: Algorithm, limits: &[&str], clock: &ManualClock) -> Limiter<u64> {
    tiers(algorithm, &[("p", config(limits))], clock)
}

/// What a key may still take now (a check of cost 0 consumes nothing).
fn room(limiter: &Limiter<u64>, key: u64) -> u64 {
    limiter.check_n(&key, 0).remaining()
}

/// Checks of cost 1 until the first refusal (at most `most`): how many were admitted.
fn admit_until_refused(limiter: &Limiter<u64>, key: u64, most: u64) -> u64 {
    (0..most).take_while(|_| limiter.check(&key).is_allowed()).count() as u64
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

// ---------------------------------------------------------------------------------------
// Tiers: which policy a key gets.
// ---------------------------------------------------------------------------------------

/// "free" (2/s, the default), "paid" (5/s), "internal" (100/s), chosen by the key's
/// prefix before a colon.
fn by_prefix(clock: &ManualClock) -> Limiter<String> {
    Limiter::<String>::builder()
        .policy("free", PolicyConfig::new([Limit::per_second(2)]))
        .policy("paid", PolicyConfig::new([Limit::per_second(5)]))
        .policy("internal", PolicyConfig::new([Limit::per_second(100)]))
        .resolver(|key: &String| key.split_once(':').map(|(tier, _)| tier))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn the_resolver_picks_the_policy_and_unknown_names_or_none_get_the_default() {
    let limiter = by_prefix(&ManualClock::new());
    assert_eq!(limiter.policy_names().collect::<Vec<_>>(), ["free", "paid", "internal"]);
    // (key, policy it must get, remaining after its first check: that policy's max − 1)
    for (key, policy, remaining) in [
        ("paid:acme", "paid", 4),
        ("internal:billing", "internal", 99),
        ("free:bob", "free", 1),
        ("gold:carol", "free", 1), // a name that is no policy's: the default (the first)
        ("anonymous", "free", 1),  // the resolver says None: the default
    ] {
        assert_eq!(limiter.policy_of(key), policy, "{key} before its first check");
        assert_eq!(limiter.check(key).remaining(), remaining, "{key}");
        assert_eq!(limiter.policy_of(key), policy, "{key} once held");
    }
    assert_eq!(limiter.len(), 5);
    assert_eq!(limiter.policy("paid"), Some(PolicyConfig::new([Limit::per_second(5)])));
    assert_eq!(limiter.policy("gold"), None);
    // limits() is the default policy's.
    assert_eq!(limiter.limits(), [Limit::per_second(2)]);
}

#[test]
fn default_policy_chooses_the_policy_of_keys_nothing_else_chooses_for() {
    let build = |default: Option<&str>| {
        let mut builder = Limiter::<String>::builder()
            .limit(Limit::per_second(3)) // the policy named "default"
            .policy("trial", PolicyConfig::new([Limit::per_second(1)]))
            .policy("paid", PolicyConfig::new([Limit::per_second(7)]))
            .resolver(|key: &String| key.split_once(':').map(|(tier, _)| tier))
            .clock(ManualClock::new());
        if let Some(name) = default {
            builder = builder.default_policy(name);
        }
        builder.build().unwrap()
    };
    // Without default_policy: the limits given with .limit() ("default").
    let limiter = build(None);
    assert_eq!(limiter.policy_names().collect::<Vec<_>>(), ["default", "trial", "paid"]);
    assert_eq!(limiter.policy_of("bob"), "default");
    assert_eq!(limiter.check("bob").remaining(), 2);
    assert_eq!(limiter.limits(), [Limit::per_second(3)]);

    let limiter = build(Some("trial"));
    assert_eq!(limiter.policy_of("bob"), "trial");
    assert_eq!(limiter.check("bob").remaining(), 0);
    assert_eq!(limiter.policy_of("nope:bob"), "trial", "an unknown name gets the chosen default");
    // The resolver still wins for keys it names a policy for, "default" included.
    assert_eq!(limiter.check("paid:acme").remaining(), 6);
    assert_eq!(limiter.check("default:x").remaining(), 2);
    assert_eq!(limiter.limits(), [Limit::per_second(1)], "limits() is the chosen default's");
}

#[test]
fn set_policy_overrides_the_resolver_survives_eviction_and_clear_policy_undoes_it() {
    let clock = ManualClock::new();
    let limiter = by_prefix(&clock);
    let bob = "free:bob";
    assert_eq!(limiter.check(bob).remaining(), 1);
    limiter.set_policy(bob, "paid").unwrap();
    assert_eq!(limiter.policy_of(bob), "paid");
    // Same layout (2/s and 5/s differ only in max): the unit used carries over exactly.
    assert_eq!(limiter.check(bob).remaining(), 3);

    // Idle beyond every window (1 s window + 1 s slot): swept away, override kept.
    clock.advance(secs(3));
    assert_eq!(limiter.sweep(), 1);
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.policy_of(bob), "paid", "the override outlives the key's state");
    assert_eq!(limiter.check(bob).remaining(), 4, "a fresh state under the override: 5 − 1");

    // An override for a key never seen before applies at its first check.
    limiter.set_policy("paid:zed", "free").unwrap();
    assert_eq!(limiter.policy_of("paid:zed"), "free");
    assert_eq!(limiter.check("paid:zed").remaining(), 1);

    // clear_policy: back to the resolver's choice, the held state moved at once (exactly:
    // same layout): bob used 1 under "paid", so "free" (max 2) has 1 left, then none.
    assert!(limiter.clear_policy(bob));
    assert_eq!(limiter.policy_of(bob), "free");
    assert_eq!(limiter.check(bob).remaining(), 0);
    assert!(!limiter.check(bob).is_allowed());
    assert!(!limiter.clear_policy(bob), "no override left to clear");
    assert!(!limiter.clear_policy("free:nobody"));

    // An unknown name changes nothing.
    assert_eq!(limiter.set_policy(bob, "gold"), Err(ConfigError::UnknownPolicy { name: "gold".to_owned() }));
    assert_eq!(limiter.policy_of(bob), "free");
}

#[test]
fn bad_policy_names_and_limits_are_errors_that_name_the_policy() {
    let builder = || Limiter::<u64>::builder().clock(ManualClock::new());
    let free = || PolicyConfig::new([Limit::per_second(2)]);

    let err = builder().policy("free", free()).default_policy("gold").build().unwrap_err();
    assert_eq!(err, ConfigError::UnknownPolicy { name: "gold".to_owned() });
    assert_eq!(err.to_string(), r#"no policy named "gold""#);

    let err = builder().policy("free", free()).policy("free", free()).build().unwrap_err();
    assert_eq!(err, ConfigError::DuplicatePolicy { name: "free".to_owned() });
    assert!(err.to_string().contains(r#""free""#), "{err}");
    // .limit() makes a policy named "default": naming another one so is a duplicate.
    let err = builder().limit(Limit::per_second(1)).policy("default", free()).build().unwrap_err();
    assert_eq!(err, ConfigError::DuplicatePolicy { name: "default".to_owned() });

    let err = builder().policy("free", free()).policy("paid", PolicyConfig::new([])).build().unwrap_err();
    assert_eq!(
        err,
        ConfigError::InPolicy { name: "paid".to_owned(), error: Box::new(ConfigError::NoLimits) }
    );
    assert_eq!(err.to_string(), format!(r#"policy "paid": {}"#, ConfigError::NoLimits));

    let zero = Limit::per_second(0);
    let err = builder().policy("trial", PolicyConfig::new([zero])).build().unwrap_err();
    let inner = ConfigError::ZeroMax { limit: zero };
    assert_eq!(err.to_string(), format!(r#"policy "trial": {inner}"#));
    assert_eq!(err, ConfigError::InPolicy { name: "trial".to_owned(), error: Box::new(inner.clone()) });
    // The unnamed policy of .limit() reports its errors as they are.
    assert_eq!(builder().limit(zero).build().unwrap_err(), inner);
    assert_eq!(builder().build().unwrap_err(), ConfigError::NoLimits);

    // At runtime: unknown names, and an invalid new configuration that changes nothing.
    let clock = ManualClock::new();
    let limiter = single(Algorithm::SlidingWindow, &["5/min"], &clock);
    assert!(limiter.check_n(&1, 2).is_allowed());
    let unknown = Err(ConfigError::UnknownPolicy { name: "gold".to_owned() });
    assert_eq!(limiter.set_policy(&1, "gold"), unknown);
    assert_eq!(limiter.update_policy("gold", config(&["9/min"]), Carry::Reset), unknown);
    assert!(limiter.update_policy("p", PolicyConfig::new([]), Carry::Reset).is_err());
    assert!(limiter.update_policy("p", PolicyConfig::new([zero]), Carry::Conservative).is_err());
    assert_eq!(limiter.policy("p"), Some(config(&["5/min"])));
    assert_eq!(room(&limiter, 1), 3, "a refused update keeps the counts");
}

// ---------------------------------------------------------------------------------------
// Carry rules of update_policy, set_policy and clear_policy.
// ---------------------------------------------------------------------------------------

#[test]
fn a_change_of_max_alone_keeps_the_counts_exactly_even_with_reset() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        clock.set(secs(7200));
        let limiter = single(algorithm, &["10/min", "100/h"], &clock);
        let what = format!("{algorithm:?}");
        assert_eq!(limiter.check_n(&1, 10).remaining(), 0, "{what}");
        // Raise: 10 used of 15/min and 200/h → a check leaves 15 − 11 = 4.
        limiter.update_policy("p", config(&["15/min", "200/h"]), Carry::Reset).unwrap();
        assert_eq!(limiter.check(&1).remaining(), 4, "{what}: raised");
        // Lower the minute: 11 used of 12/min → one more (remaining 0), then refused by it.
        limiter.update_policy("p", config(&["12/min", "200/h"]), Carry::Reset).unwrap();
        let d = limiter.check(&1);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 0), "{what}: lowered: {d:?}");
        assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(0)), "{what}");
        // Lower the hour instead: 12 used of 13/h → one more, then refused by the hour.
        limiter.update_policy("p", config(&["20/min", "13/h"]), Carry::Reset).unwrap();
        let d = limiter.check(&1);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 0), "{what}: hour lowered: {d:?}");
        assert_eq!(limiter.check(&1).denial(), Some(Denial::Limit(1)), "{what}");
        assert_eq!(limiter.policy("p"), Some(config(&["20/min", "13/h"])), "{what}");
    }
}

#[test]
fn a_new_window_carries_what_was_used_conservatively_or_starts_empty_with_reset() {
    for algorithm in ALGORITHMS {
        for (carry, remaining) in [
            // 10 used of 10/s; 100/min's window (60 s) is longer than every old one (1 s),
            // so it starts with the most any old limit counted, 10: a check leaves 89.
            (Carry::Conservative, 89),
            // Every window starts empty: a check leaves 99.
            (Carry::Reset, 99),
        ] {
            let clock = ManualClock::new();
            clock.set(secs(1000));
            let limiter = single(algorithm, &["10/s"], &clock);
            let what = format!("{algorithm:?}, {carry:?}");
            assert_eq!(limiter.check_n(&1, 10).remaining(), 0, "{what}");
            assert!(!limiter.check(&1).is_allowed(), "{what}");
            limiter.update_policy("p", config(&["100/min"]), carry).unwrap();
            assert_eq!(limiter.check(&1).remaining(), remaining, "{what}");
        }
    }
}

#[test]
fn a_shorter_new_window_takes_the_units_of_a_longer_old_one_recorded_at_the_change() {
    // 30 used of "100/h@1min" at 3600 s; the change to "10/s" happens 30.25 s later, in the
    // hour's current slot, which still holds all 30. The old window (1 h) covers the new
    // one (1 s): the new limit starts with those 30, recorded as used at 3630.25 s, three
    // times its max. When each algorithm admits again, if nothing else comes (retry_after):
    // * SlidingWindow, one 1 s slot [3630 s, 3631 s): 30 units there; from 3631 s they
    //   weigh 30 × (1 − f), and one more unit fits once that is ≤ 9: f = 0.7, at 3631.7 s,
    //   1.45 s after the change. Admitted then with 10 − 1 − ⌈30 × 0.3⌉ = 0 left.
    // * FixedWindow: the window [3630 s, 3631 s) is full; the next one takes it: 0.75 s,
    //   and then 9 are left.
    // * SlidingLog: 30 entries at 3630.25 s leave the window together 1 s later; 9 left.
    // (GCRA: see the next test.)
    for (algorithm, retry, left) in [
        (Algorithm::SlidingWindow, ms(1450), 0),
        (Algorithm::FixedWindow, ms(750), 9),
        (Algorithm::SlidingLog, secs(1), 9),
    ] {
        shorter_window_after_a_longer_one(algorithm, retry, left);
    }
}

/// 30 used of "100/h@1min" at 3600 s, changed to "10/s" at 3630.25 s: the first check is
/// refused until `retry` (not 1 ns earlier), then admitted with `left` to spare.
fn shorter_window_after_a_longer_one(algorithm: Algorithm, retry: Duration, left: u64) {
    let clock = ManualClock::new();
    clock.set(secs(3600));
    let limiter = single(algorithm, &["100/h@1min"], &clock);
    let what = format!("{algorithm:?}");
    assert_eq!(limiter.check_n(&1, 30).remaining(), 70, "{what}");
    clock.advance(ms(30_250));
    limiter.update_policy("p", config(&["10/s"]), Carry::Conservative).unwrap();
    let d = limiter.check(&1);
    assert_eq!(d.denial(), Some(Denial::Limit(0)), "{what}: {d:?}");
    assert_eq!(d.retry_after(), Some(retry), "{what}: {d:?}");
    clock.advance(retry - Duration::from_nanos(1));
    let d = limiter.check(&1);
    assert!(!d.is_allowed(), "{what}: admitted 1 ns before retry_after: {d:?}");
    assert_eq!(limiter.sweep(), 0, "{what}: the key still holds units: it must not be evicted");
    clock.advance(Duration::from_nanos(1));
    let d = limiter.check(&1);
    assert_eq!((d.is_allowed(), d.remaining()), (true, left), "{what}: at retry_after: {d:?}");
}

#[test]
fn gcra_units_carried_above_max_keep_refusing_until_retry_after() {
    // As above, under GCRA. 100/h is one unit per 36 s: 30 units at 3600 s put the arrival
    // time at 4680 s; at 3630.25 s it is 1049.75 s ahead: 29.16 units, rounded up 30 used.
    // 10/s (one unit per 100 ms, burst 1 s) starts with those 30: its arrival time 3 s
    // ahead, one more fits once (3 s + 100 ms) − t ≤ 1 s: t = 2.1 s; then 0 are left.
    shorter_window_after_a_longer_one(Algorithm::Gcra, ms(2100), 0);
}

#[test]
fn a_change_in_the_number_of_limits_carries_each_new_limit_its_covering_count() {
    // History under ["10/s", "100/min"]: 8 units at 1020 s, 3 at 1022 s. At 1022 s the
    // second counts 3 (the 8 are 2 s old) and the minute 11 (1020 s and 1022 s share the
    // fixed window [1020 s, 1080 s) too). Each new limit starts with the fewest units
    // counted by an old limit whose window is at least as long as its own, or the most any
    // counted if none is:
    //   50/500ms: both cover it, fewest 3   → a check leaves 50 − 3 − 1 = 46
    //   20/5s:    only the minute, 11       → 20 − 11 − 1 = 8
    //   1000/h:   none covers it, most 11   → 1000 − 11 − 1 = 988 (2 limits → 1)
    //   ["5/s", "100/min", "1000/h"] (2 → 3): 3, 11, 11 → rooms 2, 89, 989: a check leaves
    //   1, and then 2 more units do not fit the second.
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog] {
        for (new, remaining) in [
            (&["50/500ms"][..], 46),
            (&["20/5s"][..], 8),
            (&["1000/h"][..], 988),
            (&["5/s", "100/min", "1000/h"][..], 1),
        ] {
            let clock = ManualClock::new();
            clock.set(secs(1020));
            let limiter = single(algorithm, &["10/s", "100/min"], &clock);
            let what = format!("{algorithm:?} → {new:?}");
            assert!(limiter.check_n(&1, 8).is_allowed(), "{what}");
            clock.advance(secs(2));
            assert!(limiter.check_n(&1, 3).is_allowed(), "{what}");
            limiter.update_policy("p", config(new), Carry::Conservative).unwrap();
            assert_eq!(limiter.check(&1).remaining(), remaining, "{what}");
            if new.len() == 3 {
                assert_eq!(limiter.check_n(&1, 2).denial(), Some(Denial::Limit(0)), "{what}");
                assert!(limiter.check(&1).is_allowed(), "{what}");
            }
        }
    }
}

#[test]
fn gcra_carries_the_units_used_rounded_up_when_only_max_changes() {
    // 10/s: one unit per 100 ms, burst 1 s. 3 units at 500 s put the arrival time 300 ms
    // ahead; 150 ms later 1.5 units are still in use: rounded up, 2 carry over.
    // * to 20/s (50 ms each): 2 units = 100 ms ahead; a check leaves (1000 − 150) / 50 = 17
    //   (an exact carry of the time, 150 ms, would leave 16);
    // * to 4/s (250 ms each): 2 units = 500 ms ahead; two checks fit (750 ms, 1000 ms), the
    //   third is refused until 1250 ms − 1000 ms = 250 ms later.
    // Carry::Reset is ignored: only max changed.
    let start = |new: &str| {
        let clock = ManualClock::new();
        clock.set(secs(500));
        let limiter = single(Algorithm::Gcra, &["10/s"], &clock);
        assert_eq!(limiter.check_n(&1, 3).remaining(), 7);
        clock.advance(ms(150));
        limiter.update_policy("p", config(&[new]), Carry::Reset).unwrap();
        limiter
    };
    let raised = start("20/s");
    assert_eq!(raised.check(&1).remaining(), 17);

    let lowered = start("4/s");
    assert_eq!(lowered.check(&1).remaining(), 1);
    assert_eq!(lowered.check(&1).remaining(), 0);
    let d = lowered.check(&1);
    assert_eq!((d.denial(), d.retry_after()), (Some(Denial::Limit(0)), Some(ms(250))), "{d:?}");
}

#[test]
fn units_above_a_lowered_max_still_count_after_a_later_change() {
    // 90 used of 100/min; max lowered to 60/min (the key is over it, and a check moves it to
    // that version: refused); then the window changes to 100/2min@10s. The old limit
    // (60/min) counts all 90 units (it refuses because of them); its window (1 min) is
    // shorter than the new one, so the new limit starts with the most it counted, 90:
    // exactly 10 more fit. For GCRA, where a change of max alone carries the units used,
    // raising max back to 100/min must likewise keep the 90. And a key moved by set_policy
    // from "big" (100/min) to "small" (60/min) with 90 used, then back by clear_policy, has
    // 10 left (SlidingLog and GCRA carry these moves conservatively, the others exactly).
    let mut wrong = Vec::new();
    for algorithm in ALGORITHMS {
        let next: &[&str] = if algorithm == Algorithm::Gcra { &["100/min"] } else { &["100/2min@10s"] };
        let clock = ManualClock::new();
        clock.set(secs(600));
        let limiter = single(algorithm, &["100/min"], &clock);
        let what = format!("{algorithm:?}: 100/min (90 used) → 60/min → {next:?}");
        assert_eq!(limiter.check_n(&1, 90).remaining(), 10, "{what}");
        limiter.update_policy("p", config(&["60/min"]), Carry::Conservative).unwrap();
        assert!(!limiter.check(&1).is_allowed(), "{what}: 90 used of 60");
        limiter.update_policy("p", config(next), Carry::Conservative).unwrap();
        let admitted = admit_until_refused(&limiter, 1, 100);
        if admitted != 10 {
            wrong.push(format!("{what}: {admitted} admitted, not 10"));
        }

        let policies = [("big", config(&["100/min"])), ("small", config(&["60/min"]))];
        let limiter = tiers_with(algorithm, &policies, false, &clock);
        let what = format!("{algorithm:?}: big (90 used) → set_policy small → clear_policy");
        assert_eq!(limiter.check_n(&1, 90).remaining(), 10, "{what}");
        limiter.set_policy(&1, "small").unwrap();
        assert!(!limiter.check(&1).is_allowed(), "{what}: 90 used of 60");
        assert!(limiter.clear_policy(&1));
        let admitted = admit_until_refused(&limiter, 1, 100);
        if admitted != 10 {
            wrong.push(format!("{what}: {admitted} admitted, not 10"));
        }
    }
    assert!(wrong.is_empty(), "units lost:\n{}", wrong.join("\n"));
}

#[test]
fn set_policy_upgrade_keeps_the_used_units_exactly_for_the_same_layout() {
    // free 10/min, paid 100/min (same windows): 6 units at 600 s, 4 at 630 s, then the
    // upgrade at 630 s. Right after it 90 are left. At 661 s the 6 units of slot [600 s,
    // 601 s) have left the minute: the carry is exact (the key keeps its counters, under
    // the new policy), so it counts the 4 alone, 96 left, for the sliding log too.
    for (algorithm, later) in [(Algorithm::SlidingWindow, 96), (Algorithm::SlidingLog, 96)] {
        let clock = ManualClock::new();
        clock.set(secs(600));
        let limiter =
            tiers(algorithm, &[("free", config(&["10/min"])), ("paid", config(&["100/min"]))], &clock);
        let what = format!("{algorithm:?}");
        let key = 500; // at or above 100: the default, "free"
        assert!(limiter.check_n(&key, 6).is_allowed(), "{what}");
        clock.advance(secs(30));
        assert_eq!(limiter.check_n(&key, 4).remaining(), 0, "{what}");
        assert!(!limiter.check(&key).is_allowed(), "{what}");
        limiter.set_policy(&key, "paid").unwrap();
        assert_eq!(limiter.policy_of(&key), "paid");
        assert_eq!(room(&limiter, key), 90, "{what}: right after the upgrade");
        clock.advance(secs(31));
        assert_eq!(room(&limiter, key), later, "{what}: 31 s later");
    }
}

#[test]
fn set_policy_and_clear_policy_between_layouts_carry_conservatively() {
    // free 10/s, paid ["100/min", "1000/h"]: 10 used at 1200 s. Moving to paid: neither
    // new window is covered by the old (1 s), so both start with the most counted, 10: 90
    // left, still 2 s later (the second's units would have aged out of a 1 s window, but
    // they were recorded in the minute). Back to free (clear_policy): both old windows
    // cover 1 s and count 10, so the second starts full: refused.
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog] {
        let clock = ManualClock::new();
        clock.set(secs(1200));
        let limiter = tiers(
            algorithm,
            &[("free", config(&["10/s"])), ("paid", config(&["100/min", "1000/h"]))],
            &clock,
        );
        let what = format!("{algorithm:?}");
        let key = 500;
        assert_eq!(limiter.check_n(&key, 10).remaining(), 0, "{what}");
        limiter.set_policy(&key, "paid").unwrap();
        assert_eq!(room(&limiter, key), 90, "{what}: moved to paid");
        clock.advance(secs(2));
        assert_eq!(room(&limiter, key), 90, "{what}: 2 s later");
        assert!(limiter.clear_policy(&key));
        assert_eq!(limiter.policy_of(&key), "free");
        let d = limiter.check(&key);
        assert_eq!(d.denial(), Some(Denial::Limit(0)), "{what}: back to free: {d:?}");
        // A key never moved, for comparison, has its whole second.
        assert_eq!(limiter.check(&501).remaining(), 9, "{what}");
    }
}

// ---------------------------------------------------------------------------------------
// Shadow mode per policy.
// ---------------------------------------------------------------------------------------

/// "enforced" (5/min, the default) and "trial" (5/min, shadow) for keys below 100.
fn shadowed(clock: &ManualClock) -> Limiter<u64> {
    tiers(
        Algorithm::SlidingWindow,
        &[("enforced", config(&["5/min"])), ("trial", config(&["5/min"]).shadow(true))],
        clock,
    )
}

#[test]
fn a_shadow_policy_admits_everything_and_its_denials_consume_nothing() {
    let clock = ManualClock::new();
    let limiter = shadowed(&clock);
    let (trial, enforced) = (7, 700);
    for i in 0..8 {
        let d = limiter.check(&trial);
        assert!(d.is_allowed(), "check {i}: {d:?}");
        assert_eq!(d.denial(), None, "check {i}: {d:?}");
        let expected = if i < 5 { None } else { Some(Denial::Limit(0)) };
        assert_eq!(d.shadow_denial(), expected, "check {i}: {d:?}");
        assert_eq!(d.retry_after(), None, "check {i}: {d:?}");
    }
    // A cost that can never fit: admitted too, and reported.
    let d = limiter.check_n(&8, 6);
    assert_eq!((d.is_allowed(), d.shadow_denial()), (true, Some(Denial::CostTooLarge(0))), "{d:?}");
    assert_eq!(room(&limiter, 8), 5, "a shadow denial consumed nothing");
    // Next to it, the enforced policy refuses.
    assert_eq!(admit_until_refused(&limiter, enforced, 10), 5);
    let d = limiter.check(&enforced);
    assert_eq!((d.is_allowed(), d.denial(), d.shadow_denial()), (false, Some(Denial::Limit(0)), None));

    // Enforce the trial with a larger max: a change of max and shadow alone keeps the
    // counts exactly. The 5 shadow admissions counted, the 3 shadow denials did not: 8 − 5
    // = 3 more fit, then a real refusal.
    let enforced_trial = PolicyConfig { limits: vec![limit("8/min")], shadow: false };
    limiter.update_policy("trial", enforced_trial.clone(), Carry::Conservative).unwrap();
    assert_eq!(limiter.policy("trial"), Some(enforced_trial));
    assert_eq!(room(&limiter, trial), 3);
    assert_eq!(admit_until_refused(&limiter, trial, 10), 3);
    let d = limiter.check(&trial);
    assert_eq!((d.is_allowed(), d.denial(), d.shadow_denial()), (false, Some(Denial::Limit(0)), None));
    assert!(d.retry_after().is_some());
    assert!(!limiter.check(&enforced).is_allowed(), "the other policy is untouched");
}

#[test]
fn check_all_checks_shadow_keys_after_the_enforced_ones_admitted() {
    let clock = ManualClock::new();
    let limiter = tiers(
        Algorithm::SlidingWindow,
        &[("enforced", config(&["3/min"])), ("trial", config(&["2/min"]).shadow(true))],
        &clock,
    );
    let (user, trial) = (700, 7);
    let keys = [&user, &trial];
    // 1, 2: both have room.
    for i in 0..2 {
        let d = limiter.check_all(&keys, 1).unwrap();
        assert!(d.is_allowed() && d.shadow_denial().is_none(), "check {i}: {d:?}");
    }
    assert_eq!(room(&limiter, trial), 0, "shadow admissions count");
    // 3: the enforced key admits, the shadow key would refuse: admitted, reported, about it.
    let d = limiter.check_all(&keys, 1).unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!((d.shadow_denial(), d.key()), (Some(Denial::Limit(0)), 1), "{d:?}");
    // 4: the enforced key is full: refused, about it; the shadow key is not charged.
    let d = limiter.check_all(&keys, 1).unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!((d.denial(), d.key()), (Some(Denial::Limit(0)), 0), "{d:?}");
    assert_eq!(room(&limiter, user), 0);
    // The trial key holds exactly its 2 admissions: enforced with max 4 it has 2 left.
    let enforced = PolicyConfig::new([limit("4/min")]);
    limiter.update_policy("trial", enforced, Carry::Conservative).unwrap();
    assert_eq!(room(&limiter, trial), 2);
    // Now both are enforced: the trial key refuses for itself.
    let fresh = 701;
    assert!(limiter.check_all(&[&fresh, &trial], 2).unwrap().is_allowed());
    let d = limiter.check_all(&[&fresh, &trial], 1).unwrap();
    assert_eq!((d.is_allowed(), d.key(), d.shadow_denial()), (false, 1, None), "{d:?}");
}

#[test]
fn check_all_charges_keys_of_different_tiers_by_their_own_limits() {
    let clock = ManualClock::new();
    // Users (at or above 100) 5/min; IPs (below 100) 8/min.
    let limiter =
        tiers(Algorithm::SlidingWindow, &[("user", config(&["5/min"])), ("ip", config(&["8/min"]))], &clock);
    let (alice, bob, carol, ip, other_ip) = (100, 101, 102, 1, 2);
    assert_eq!((limiter.policy_of(&alice), limiter.policy_of(&ip)), ("user", "ip"));
    // alice through ip: alice's 5 decide; ip keeps 3.
    let first = limiter.check_all(&[&alice, &ip], 1).unwrap();
    assert_eq!((first.remaining(), first.key()), (4, 0), "the least room: alice's");
    let admitted = 1 + (0..10).filter(|_| limiter.check_all(&[&alice, &ip], 1).unwrap().is_allowed()).count();
    assert_eq!(admitted, 5);
    let d = limiter.check_all(&[&alice, &ip], 1).unwrap();
    assert_eq!((d.is_allowed(), d.key(), d.denial()), (false, 0, Some(Denial::Limit(0))), "{d:?}");
    assert_eq!(room(&limiter, ip), 3);
    // bob through the same ip: the ip's 3 left decide; bob keeps 2.
    let admitted = (0..10).filter(|_| limiter.check_all(&[&bob, &ip], 1).unwrap().is_allowed()).count();
    assert_eq!(admitted, 3);
    let d = limiter.check_all(&[&bob, &ip], 1).unwrap();
    assert_eq!((d.is_allowed(), d.key()), (false, 1), "{d:?}");
    assert_eq!(room(&limiter, bob), 2);
    // Cost 2, carol through a fresh ip: 5/min takes two such requests, not a third.
    let admitted =
        (0..10).filter(|_| limiter.check_all(&[&other_ip, &carol], 2).unwrap().is_allowed()).count();
    assert_eq!(admitted, 2);
    assert_eq!((room(&limiter, carol), room(&limiter, other_ip)), (1, 4));
}

// ---------------------------------------------------------------------------------------
// Stress: policy changes racing checks at a frozen clock.
// ---------------------------------------------------------------------------------------

/// The hot keys of the stress tests.
const KEYS: [u64; 4] = [1, 2, 3, 4];

/// The largest `max` of every configuration the stress tests use.
const BOUND: u64 = 100;

/// Runs `THREADS` checker threads on `KEYS` (checks of cost 1, checks of cost 2, and
/// check_all on two keys) while this thread calls `change(i)` for `i` in `0..changes`;
/// returns the units admitted per key.
fn hammer(limiter: &Limiter<u64>, changes: usize, change: impl Fn(usize)) -> [u64; KEYS.len()] {
    let barrier = Barrier::new(THREADS + 1);
    let done = AtomicBool::new(false);
    // Checks made: the changes end only once the checkers have run (on a loaded machine the
    // changer can otherwise finish before they get a core, and the run admits nothing).
    let checks = AtomicU64::new(0);
    let admitted: [AtomicU64; KEYS.len()] = Default::default();
    thread::scope(|s| {
        for t in 0..THREADS {
            let (barrier, done, admitted, checks) = (&barrier, &done, &admitted, &checks);
            s.spawn(move || {
                let mut mine = [0u64; KEYS.len()];
                let mut rng = Rng(t as u64 + 1);
                barrier.wait();
                // Acquire pairs with the Release store below.
                let mut n = 0u64;
                while !done.load(Ordering::Acquire) {
                    n += 1;
                    if n % 32 == 0 {
                        checks.fetch_add(32, Ordering::Relaxed);
                        thread::yield_now();
                    }
                    let a = rng.below(KEYS.len() as u64) as usize;
                    match rng.below(4) {
                        0 => {
                            let b = (a + 1 + rng.below(KEYS.len() as u64 - 1) as usize) % KEYS.len();
                            if limiter.check_all(&[&KEYS[a], &KEYS[b]], 1).unwrap().is_allowed() {
                                mine[a] += 1;
                                mine[b] += 1;
                            }
                        }
                        1 => mine[a] += 2 * u64::from(limiter.check_n(&KEYS[a], 2).is_allowed()),
                        _ => mine[a] += u64::from(limiter.check(&KEYS[a]).is_allowed()),
                    }
                }
                for (total, mine) in admitted.iter().zip(mine) {
                    total.fetch_add(mine, Ordering::Relaxed);
                }
            });
        }
        barrier.wait();
        for i in 0..changes {
            change(i);
            if i % 16 == 0 {
                thread::yield_now();
            }
        }
        while checks.load(Ordering::Relaxed) < 64 * THREADS as u64 {
            thread::yield_now();
        }
        done.store(true, Ordering::Release);
    });
    admitted.map(|a| a.into_inner())
}

fn assert_bounded(admitted: &[u64], what: &str) {
    for (key, &units) in KEYS.iter().zip(admitted) {
        assert!(units <= BOUND, "{what}: key {key} admitted {units} units, more than {BOUND}: {admitted:?}");
    }
    assert!(admitted.iter().sum::<u64>() > 0, "{what}: nothing admitted");
}

/// Rounds per algorithm, each on a fresh limiter (so keys have room while the changes
/// race), and changes per round: 3000 in all.
const ROUNDS: usize = 10;
const CHANGES: usize = 300;

/// `update_policy` cycling through `configs` (`ROUNDS` × `CHANGES` times, Conservative)
/// while `hammer` checks: no key may exceed `BOUND`.
fn updates_racing_checks(algorithms: &[Algorithm], configs: &[&[&str]]) {
    for &algorithm in algorithms {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(secs(3600) + ms(round as u64 * 37));
            let limiter = single(algorithm, configs[0], &clock);
            let admitted = hammer(&limiter, CHANGES, |i| {
                let next = config(configs[(i + 1) % configs.len()]);
                limiter.update_policy("p", next, Carry::Conservative).unwrap();
            });
            assert_bounded(&admitted, &format!("{algorithm:?}, {configs:?}, round {round}"));
        }
    }
}

/// Keys moved between "big" (100/min, the default) and "small" (60/min) by `set_policy`
/// and back by `clear_policy` while `hammer` checks: no key may exceed `BOUND`.
fn moves_racing_checks(algorithms: &[Algorithm]) {
    for &algorithm in algorithms {
        for round in 0..ROUNDS {
            let clock = ManualClock::new();
            clock.set(secs(3600) + ms(round as u64 * 37));
            let policies = [("big", config(&["100/min"])), ("small", config(&["60/min"]))];
            let limiter = tiers_with(algorithm, &policies, false, &clock);
            let admitted = hammer(&limiter, CHANGES, |i| {
                let key = &KEYS[(i / 2) % KEYS.len()];
                if i % 2 == 0 {
                    limiter.set_policy(key, "small").unwrap();
                } else {
                    assert!(limiter.clear_policy(key));
                }
            });
            assert_bounded(&admitted, &format!("{algorithm:?}, round {round}"));
            assert!(KEYS.iter().all(|k| limiter.policy_of(k) == "big"), "every override cleared");
        }
    }
}

#[test]
fn update_policy_racing_checks_never_lets_a_key_exceed_the_largest_max() {
    // Max-only changes (100/min → 60/min) and layout changes (a 2 min window, strict, a
    // 5 s precision), in a cycle. At a frozen clock every admitted unit stays inside
    // every window, so conservative carries hand every new limit everything admitted so
    // far: no key may ever exceed the largest max, 100.
    let configs: [&[&str]; 5] =
        [&["100/min"], &["60/min"], &["100/2min@10s"], &["80/min strict"], &["100/min@5s"]];
    updates_racing_checks(&ALGORITHMS, &configs);
}

#[test]
fn layout_changes_racing_checks_never_let_a_key_exceed_max() {
    // The same race, every layout at one max (so no key is ever over the max it is read
    // with): a window, strictness and precision change at every update.
    let configs: [&[&str]; 4] = [&["100/min"], &["100/2min@10s"], &["100/min strict"], &["100/min@5s"]];
    updates_racing_checks(&ALGORITHMS, &configs);
}

#[test]
fn max_only_changes_racing_checks_never_let_a_key_exceed_the_largest_max() {
    // Only max changes: the sliding and fixed windows and the log share the counters with
    // the new version, exactly. (GCRA carries units even then: see the test above.)
    let configs: [&[&str]; 3] = [&["100/min"], &["60/min"], &["80/min"]];
    updates_racing_checks(
        &[Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog],
        &configs,
    );
}

#[test]
fn set_and_clear_policy_racing_checks_never_let_a_key_exceed_the_larger_max() {
    // The sliding and fixed windows copy the counts exactly between the two (same layout).
    moves_racing_checks(&[Algorithm::SlidingWindow, Algorithm::FixedWindow]);
}

#[test]
fn set_and_clear_policy_racing_checks_never_let_a_key_exceed_the_larger_max_with_conservative_moves() {
    moves_racing_checks(&[Algorithm::SlidingLog, Algorithm::Gcra]);
}

// ---------------------------------------------------------------------------------------
// Ring entry widths: a sliding window's ring entries are as narrow as `max` allows (8, 16
// or 32 bits), shared by every policy of the limiter and only ever widened, so a change of
// `max` alone, or a move between policies that differ only in `max`, carries every slot's
// count exactly even when it crosses a width.
// ---------------------------------------------------------------------------------------

/// Units a key holds now under a strict window (exact): `max - room`, `max` being the
/// key's policy's current one.
fn held(limiter: &Limiter<u64>, key: u64, max: u64) -> u64 {
    max - room(limiter, key)
}

#[test]
fn a_change_of_max_across_an_entry_width_carries_every_slot_exactly() {
    for (from, to) in [(200, 300), (200, 70_000), (60_000, 70_000), (300, 200)] {
        let clock = ManualClock::new();
        let window = format!("{from}/10s@1s strict");
        let limiter = single(Algorithm::SlidingWindow, &[window.as_str()], &clock);
        // 5, 6, 7 ... units in slots 0 to 5: a history the ring holds slot by slot.
        let mut recorded = Vec::new();
        for slot in 0..6u64 {
            clock.set(secs(slot));
            let units = 5 + slot;
            assert_eq!(admit_until_refused(&limiter, 7, units), units);
            recorded.push(units);
        }
        let window = format!("{to}/10s@1s strict");
        limiter.update_policy("p", config(&[window.as_str()]), Carry::Reset).unwrap();
        // A strict window counts every slot it touches: at 10 s, slot 0 still; from then
        // on, each second exactly one slot's units leave.
        clock.set(secs(10));
        assert_eq!(held(&limiter, 7, to), recorded.iter().sum::<u64>(), "{from} -> {to}, at 10 s");
        for (slot, _) in recorded.iter().enumerate() {
            clock.set(secs(11 + slot as u64));
            let left: u64 = recorded[slot + 1..].iter().sum();
            assert_eq!(held(&limiter, 7, to), left, "{from} -> {to}, at {} s", 11 + slot);
        }
    }
}

#[test]
fn a_move_between_policies_of_different_entry_widths_is_exact() {
    let clock = ManualClock::new();
    let limiter = tiers_with(
        Algorithm::SlidingWindow,
        &[("small", config(&["100/4s@1s strict"])), ("big", config(&["50000/4s@1s strict"]))],
        false,
        &clock,
    );
    for slot in 0..3u64 {
        clock.set(secs(slot));
        assert_eq!(admit_until_refused(&limiter, 1, 10 + slot), 10 + slot);
    }
    limiter.set_policy(&1, "big").unwrap();
    assert_eq!(held(&limiter, 1, 50_000), 33);
    // 300 more in slot 3 (more than a byte holds), then back to "small": still exact.
    clock.set(secs(3));
    assert!(limiter.check_n(&1, 300).is_allowed());
    limiter.set_policy(&1, "small").unwrap();
    assert_eq!(held(&limiter, 1, 100), 100, "333 held: the room is 0");
    // Strict: a slot counts until the window has wholly left it (slot 0 until 5 s).
    for (at, left) in [(4, 333), (5, 323), (6, 312), (7, 300), (8, 0)] {
        clock.set(secs(at));
        limiter.set_policy(&1, "big").unwrap();
        assert_eq!(held(&limiter, 1, 50_000), left, "at {at} s");
    }
}

// ---------------------------------------------------------------------------------------
// A saturated slot stays saturated through every re-encoding and carry: a slot that took
// more units than its ring entry holds (`record`) counts as full until it leaves the
// window, whatever the key's policy becomes (the property test `records_and_policy_changes
// _match_the_model` in tests/model.rs found each case).
// ---------------------------------------------------------------------------------------

/// A key of one policy "p" = `limits`, with 2³²−1 units recorded at 0 s and 4 at 0.25 s (so
/// that slot 0 of the 250 ms-slotted limit is closed, saturated, into a ring of 7-bit
/// entries), the clock left at 0.25 s.
fn saturated_at_0(limits: &[&str], clock: &ManualClock) -> Limiter<u64> {
    let limiter = single(Algorithm::SlidingWindow, limits, clock);
    let _ = limiter.record(&1, u64::from(u32::MAX));
    clock.set(ms(250));
    let _ = limiter.record(&1, 4);
    limiter
}

#[test]
fn a_saturated_slot_stays_full_when_its_ring_is_widened() {
    for (before, after, refusing) in [
        (&["100/10s@250ms strict"][..], &["266/10s@250ms strict"][..], 0),
        (&["1000/100ms", "100/10s@250ms strict"][..], &["1000/100ms", "266/10s@250ms strict"][..], 1),
    ] {
        let clock = ManualClock::new();
        let limiter = saturated_at_0(before, &clock);
        // 126 keeps 7-bit entries; 266 needs 9-bit ones: the next check re-encodes the ring.
        let narrow: Vec<String> = before.iter().map(|l| l.replace("100/10s", "126/10s")).collect();
        let narrow: Vec<&str> = narrow.iter().map(String::as_str).collect();
        limiter.update_policy("p", config(&narrow), Carry::Reset).unwrap();
        assert_eq!(limiter.check_n(&1, 0).denial(), Some(Denial::Limit(refusing)), "{before:?}");
        limiter.update_policy("p", config(after), Carry::Reset).unwrap();
        // Slot 0 [0, 0.25 s) is saturated: a strict 10 s window counts it until 10.25 s.
        let d = limiter.check_n(&1, 0);
        assert_eq!((d.denial(), d.remaining()), (Some(Denial::Limit(refusing)), 0), "{after:?}: {d:?}");
        assert_eq!(d.retry_after(), Some(secs(10)), "{after:?}");
        clock.set(ms(10_249));
        assert!(!limiter.check(&1).is_allowed(), "{after:?}: slot 0 still in the window");
        clock.set(ms(10_250));
        assert!(limiter.check(&1).is_allowed(), "{after:?}: slot 0 has left the window");
    }
}

#[test]
fn a_saturated_slot_carried_into_a_new_precision_stays_full_for_the_new_window() {
    let clock = ManualClock::new();
    let limiter = saturated_at_0(&["100/10s@250ms strict"], &clock);
    // Everything the key is known to have used (more than 2³²−1 units) is recorded as used
    // at 0.25 s in the new limit: its slot [250 ms, 260 ms) saturates, and counts as full
    // until it leaves the 100 ms window (interpolated: once it is no longer the oldest
    // slot, at 360 ms).
    limiter.update_policy("p", config(&["1000/100ms@10ms"]), Carry::Conservative).unwrap();
    let d = limiter.check(&1);
    assert_eq!((d.denial(), d.remaining()), (Some(Denial::Limit(0)), 0), "{d:?}");
    assert_eq!(d.retry_after(), Some(ms(110)));
    clock.set(ms(359));
    assert!(!limiter.check(&1).is_allowed());
    clock.set(ms(360));
    assert!(limiter.check(&1).is_allowed());
}
