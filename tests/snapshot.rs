//! Feature `serde`: `Limiter::save` and `Limiter::load`. A loaded limiter never admits what
//! the saving one would have refused at the same moment (the twin tests), a load merges into
//! held keys and never lowers a count, limits match by string form or window, keys beyond
//! `max_keys` are counted and left out, and a damaged or hostile stream is an error that
//! changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::sync::Arc;
use std::time::Duration;

use slidegate::{Algorithm, Limit, Limiter, ManualClock, PolicyConfig, SnapshotError};

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn limiter(algorithm: Algorithm, limits: &[Limit], clock: &ManualClock) -> Limiter<String> {
    let mut builder = Limiter::<String>::builder().algorithm(algorithm).clock(clock.clone());
    for &limit in limits {
        builder = builder.limit(limit);
    }
    builder.build().unwrap()
}

fn saved(limiter: &Limiter<String>) -> Vec<u8> {
    let mut file = Vec::new();
    limiter.save(&mut file).unwrap();
    file
}

/// The saving limiter goes on as if nothing happened; the loading one starts at another
/// clock reading (a new process) and loads. Peeked at the same moments after the save, the
/// loaded one is within one slot of the original (a fixed window's slot is its window):
/// a unit is placed in the loading limiter's slot that holds the end of its saved slot, or
/// in the current slot if that end is still to come, and the two limiters' slots need not
/// line up (their clocks have different origins; here they are half a slot apart). So the
/// loaded one never has more room than the original has one slot later, nor less than it
/// had one slot (and one step of the peeks) earlier. (The wall clock also moves a few µs
/// between the save and the load, which the load ages the units by; the twins' clocks do
/// not: within the same slot.)
fn twins(algorithm: Algorithm, limits: &[Limit]) {
    let old_clock = ManualClock::new();
    old_clock.set(secs(3600.0));
    let old = limiter(algorithm, limits, &old_clock);
    // A burst, a pause, more: history spread over several slots.
    let mut admitted = 0;
    for step in 0..40 {
        old_clock.advance(secs(0.25));
        for _ in 0..(step % 3) {
            admitted += u32::from(old.check("k").is_allowed());
        }
    }
    // And one now, so that even a fixed window counts something at the save.
    admitted += u32::from(old.check("k").is_allowed());
    assert!(admitted > 0);
    let file = saved(&old);
    let new_clock = ManualClock::new();
    new_clock.set(secs(7200.5));
    let new = limiter(algorithm, limits, &new_clock);
    let stats = new.load(&file[..]).unwrap();
    assert_eq!((stats.keys, stats.inserted), (1, 1), "{algorithm:?}");
    // Then both are asked, a peek at a time, for the next two windows: with no checks,
    // what remains only grows, so each can be compared with the other a slot earlier or later.
    let window = limits.iter().map(|l| l.window()).max().unwrap();
    let slot = match algorithm {
        Algorithm::FixedWindow => window,
        _ => limits.iter().map(|l| l.get_precision()).max().unwrap(),
    };
    let step = slot.min(window) / 4;
    let (mut olds, mut news) = (Vec::new(), Vec::new());
    let mut t = Duration::ZERO;
    while t < window * 2 + slot * 2 {
        olds.push(old.peek("k").remaining());
        news.push(new.peek("k").remaining());
        t += step;
        old_clock.advance(step);
        new_clock.advance(step);
    }
    let k = (slot.as_nanos() / step.as_nanos()) as usize;
    for (i, &n) in news.iter().enumerate() {
        let later = olds[(i + k).min(olds.len() - 1)];
        assert!(n <= later, "{algorithm:?} {limits:?}: {n} remaining after load at step {i}, the original has {later} a slot later");
        if i > k + 1 {
            let earlier = olds[i - k - 1];
            assert!(n >= earlier, "{algorithm:?} {limits:?}: {n} remaining after load at step {i}, the original had {earlier} a slot earlier");
        }
    }
}

#[test]
fn a_loaded_limiter_never_admits_what_the_original_refuses() {
    for algorithm in ALGORITHMS {
        twins(algorithm, &[Limit::per_second(5)]);
        twins(algorithm, &[Limit::per_minute(20)]);
        twins(algorithm, &[Limit::per_second(4), Limit::per_minute(12)]);
    }
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(20).strict()]);
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(20).precision(Duration::from_secs(10))]);
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(1000)]);
    // Ring layouts: entries of 6, 16 and 32 bits, narrow and wide words, rings whose last
    // word has room to spare, a ring of 3 slots.
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(60)]);
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(40_000)]);
    twins(Algorithm::SlidingWindow, &[Limit::per_minute(100_000)]);
    twins(
        Algorithm::SlidingWindow,
        &[Limit::new(6, Duration::from_secs(2)).precision(Duration::from_millis(500))],
    );
    twins(
        Algorithm::SlidingWindow,
        &[Limit::new(9, Duration::from_secs(3)).precision(Duration::from_secs(1)).strict()],
    );
    twins(Algorithm::Gcra, &[Limit::per_second(2).burst(8)]);
}

#[test]
fn an_exhausted_login_stays_refused_after_a_restart() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        clock.set(secs(100.0));
        let old = limiter(algorithm, &[Limit::per_minute(5)], &clock);
        for _ in 0..5 {
            assert!(old.check("alice").is_allowed());
        }
        let original = old.check("alice").retry_after().unwrap();
        let file = saved(&old);
        let new_clock = ManualClock::new();
        new_clock.set(secs(5000.0));
        let new = limiter(algorithm, &[Limit::per_minute(5)], &new_clock);
        new.load(&file[..]).unwrap();
        let refused = new.check("alice");
        assert!(!refused.is_allowed(), "{algorithm:?}");
        // No sooner than the original would have let alice in (less the µs of wall time
        // the load ages units by), and at most a window (the loading limiter's fixed
        // window may start at the load).
        let wait = refused.retry_after().unwrap();
        assert!(
            wait + secs(0.1) >= original && wait <= secs(61.0),
            "{algorithm:?}: {wait:?} after {original:?}"
        );
        assert!(new.check("bob").is_allowed());
    }
}

#[test]
fn units_that_left_their_window_are_dropped() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_second(5), Limit::per_minute(100)], &clock);
    for key in ["a", "b"] {
        for _ in 0..5 {
            assert!(old.check(key).is_allowed());
        }
    }
    clock.advance(secs(40.0));
    // "b" again: it still has per-minute units; "a" only has units 40 s old.
    assert!(old.check("b").is_allowed());
    clock.advance(secs(30.0)); // "a"'s units are 70 s old: out of every window
    let file = saved(&old);
    let new_clock = ManualClock::new();
    new_clock.set(secs(1000.0));
    let new = limiter(Algorithm::SlidingWindow, &[Limit::per_second(5), Limit::per_minute(100)], &new_clock);
    let stats = new.load(&file[..]).unwrap();
    // The save skips keys whose windows hold nothing.
    assert_eq!(stats.keys, 1);
    assert_eq!(new.len(), 1);
    assert!(new.peek("a").is_allowed() && new.len() == 1);
    // "b": the per-minute limit still counts the unit 30 s old, and 5 more fill its second.
    assert_eq!(new.peek("b").remaining(), old.peek("b").remaining());
    assert!(new.check_n("b", 5).is_allowed());
    assert_eq!(new.check_n("b", 5).denial(), Some(slidegate::Denial::Limit(0)));
    assert!(old.check_n("b", 5).is_allowed());
    // A minute on, the loaded unit has left both.
    clock.advance(secs(60.0));
    new_clock.advance(secs(60.0));
    assert_eq!(old.peek("b").remaining(), new.peek("b").remaining());
}

#[test]
fn a_load_adds_to_a_held_key_and_never_lowers_it() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(10)], &clock);
    assert!(old.check_n("k", 3).is_allowed());
    let file = saved(&old);
    let new = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(10)], &clock);
    assert!(new.check_n("k", 4).is_allowed());
    let stats = new.load(&file[..]).unwrap();
    assert_eq!((stats.added, stats.inserted), (1, 0));
    assert_eq!(new.peek("k").remaining(), 10 - 7 - 1);
    // Loaded twice: counted twice (a load adds; it cannot know what it added before).
    new.load(&file[..]).unwrap();
    assert_eq!(new.peek("k").remaining(), 0);
    assert!(!new.check("k").is_allowed());
}

#[test]
fn limits_match_by_string_form_or_by_window() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_second(50), Limit::per_minute(30)], &clock);
    assert!(old.check_n("k", 20).is_allowed());
    let file = saved(&old);
    // 30/min became 40/min at 10 s precision (same window: carried over); 50/s is gone; an
    // hourly limit is new (starts empty).
    let new = limiter(
        Algorithm::SlidingWindow,
        &[Limit::per_minute(40).precision(Duration::from_secs(10)), Limit::per_hour(1000)],
        &clock,
    );
    new.load(&file[..]).unwrap();
    let peek = new.peek("k");
    assert_eq!(peek.remaining(), 40 - 20 - 1, "{peek:?}");
}

#[test]
fn keys_go_under_the_policy_of_their_saved_name() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let build = || {
        Limiter::<String>::builder()
            .policy("free", PolicyConfig::new([Limit::per_minute(5)]))
            .policy("paid", PolicyConfig::new([Limit::per_minute(50)]))
            .resolver(|key: &String| key.starts_with("paid").then_some("paid"))
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let old = build();
    assert!(old.check_n("paid-1", 30).is_allowed());
    assert!(old.check_n("free-1", 5).is_allowed());
    let file = saved(&old);
    let new = build();
    new.load(&file[..]).unwrap();
    assert_eq!(new.policy_of("paid-1"), "paid");
    assert_eq!(new.peek("paid-1").remaining(), 50 - 30 - 1);
    assert!(!new.check("free-1").is_allowed());
    // A limiter without the saved policy's name: the policy a check would give the key.
    let other =
        Limiter::<String>::builder().limit(Limit::per_minute(40)).clock(clock.clone()).build().unwrap();
    other.load(&file[..]).unwrap();
    assert_eq!(other.peek("paid-1").remaining(), 40 - 30 - 1);
}

#[test]
fn keys_beyond_max_keys_are_counted_not_inserted() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(5)], &clock);
    for i in 0..100 {
        assert!(old.check(&format!("k{i}")).is_allowed());
    }
    let file = saved(&old);
    let small = Limiter::<String>::builder()
        .limit(Limit::per_minute(5))
        .max_keys(40)
        .clock(clock.clone())
        .build()
        .unwrap();
    let stats = small.load(&file[..]).unwrap();
    assert_eq!(stats.keys, 100);
    assert_eq!(stats.inserted + stats.full, 100);
    assert!(stats.inserted <= 40 && stats.full >= 60, "{stats:?}");
    assert_eq!(small.len() as u64, stats.inserted);
}

/// What a limiter answers about a few keys: for "changes nothing".
fn looks(limiter: &Limiter<String>) -> (usize, Vec<u64>) {
    (limiter.len(), (0..20).map(|i| limiter.peek(&format!("k{i}")).remaining()).collect())
}

fn sample_file() -> Vec<u8> {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_second(5), Limit::per_minute(20)], &clock);
    for i in 0..20 {
        for _ in 0..(i % 6) {
            let _ = old.check(&format!("k{i}"));
        }
        clock.advance(secs(0.7));
    }
    saved(&old)
}

#[test]
fn a_truncated_or_damaged_snapshot_is_an_error_and_changes_nothing() {
    let file = sample_file();
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let target = limiter(Algorithm::SlidingWindow, &[Limit::per_second(5), Limit::per_minute(20)], &clock);
    let _ = target.check_n("k3", 2);
    let before = looks(&target);
    for len in 0..file.len() {
        let err = target.load(&file[..len]).unwrap_err();
        assert!(matches!(err, SnapshotError::Truncated | SnapshotError::NotASnapshot), "cut at {len}: {err}");
    }
    for at in 0..file.len() {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut bad = file.clone();
            bad[at] ^= flip;
            assert!(target.load(&bad[..]).is_err(), "byte {at} ^ {flip:#x} loaded");
        }
    }
    let mut longer = file.clone();
    longer.push(0);
    assert!(matches!(target.load(&longer[..]), Err(SnapshotError::Corrupt { .. })));
    assert_eq!(looks(&target), before);
    // And the good one loads.
    assert!(target.load(&file[..]).is_ok());
    assert_ne!(looks(&target), before);
}

/// A well-formed stream (right checksum) with hostile content.
fn forged(body: &[u8]) -> Vec<u8> {
    let mut out = b"slidegate-snapshot\n".to_vec();
    out.push(1);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    out.extend_from_slice(&(wall.as_nanos() as u64).to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn hostile_snapshots_are_refused_before_anything_is_allocated_or_applied() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let target = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(5)], &clock);
    let policy = b"\x01\x07default\x01\x055/min";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a key of 2^62 bytes", [&policy[..], b"\x02\xff\xff\xff\xff\xff\xff\xff\xff\x3f"].concat()),
        ("a key that is not a string", [&policy[..], b"\x02\x0212\x00\x00\x00\x01"].concat()),
        ("an undefined policy", [&policy[..], b"\x02\x03\"a\"\x05\x00\x00\x01"].concat()),
        ("too many entries", [&policy[..], b"\x02\x03\"a\"\x00\xff\xff\xff\x0f"].concat()),
        ("units over 2^32", [&policy[..], b"\x02\x03\"a\"\x00\x01\x00\xff\xff\xff\xff\x7f\x00\x01"].concat()),
        ("a limit that does not parse", b"\x01\x07default\x01\x055/moo\x00\x00".to_vec()),
        ("a policy of no limits", b"\x01\x07default\x00\x00\x00".to_vec()),
        ("an unknown tag", b"\x09\x00\x00".to_vec()),
        ("a wrong key count", [&policy[..], b"\x00\x05"].concat()),
        ("a number over 64 bits", b"\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f".to_vec()),
    ];
    for (what, body) in cases {
        let err = target.load(&forged(&body)[..]).unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. } | SnapshotError::Key { .. }), "{what}: {err}");
        assert_eq!(target.len(), 0, "{what}");
    }
    // The forger's framing is right: a well-formed one loads.
    let good = [&policy[..], b"\x02\x03\"a\"\x00\x01\x00\x05\x00\x01"].concat();
    let stats = target.load(&forged(&good)[..]).unwrap();
    assert_eq!(stats.inserted, 1);
    assert!(!target.check("a").is_allowed());
    let mut wrong_version = forged(&good);
    wrong_version[19] = 9;
    assert!(matches!(
        target.load(&wrong_version[..]),
        Err(SnapshotError::Version { found: 9, supported: 1 })
    ));
}

#[test]
fn a_save_runs_while_checks_go_on_and_misses_no_unit_admitted_before_it() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = Arc::new(limiter(Algorithm::SlidingWindow, &[Limit::per_minute(1_000_000)], &clock));
    for i in 0..2000 {
        assert!(old.check_n(&format!("k{i}"), 3).is_allowed());
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (old, stop, clock) = (Arc::clone(&old), Arc::clone(&stop), clock.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = old.check(&format!("k{}", (n * 7 + w) % 2500));
                    n += 1;
                    if n % 500 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();
    let mut file = Vec::new();
    let stats = old.save(&mut file).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(stats.keys >= 2000);
    let new = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(1_000_000)], &clock);
    new.load(&file[..]).unwrap();
    for i in 0..2000 {
        let key = format!("k{i}");
        let (saved, now) =
            (1_000_000 - new.peek(&key).remaining() - 1, 1_000_000 - old.peek(&key).remaining() - 1);
        assert!(saved >= 3 && saved <= now, "{key}: {saved} saved, {now} now");
    }
}

#[test]
fn keys_of_any_serde_type_round_trip() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = Limiter::<(u32, std::net::IpAddr)>::builder()
        .limit(Limit::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let key = (7, "2001:db8::1".parse().unwrap());
    let _ = old.check_n(&key, 2);
    let mut file = Vec::new();
    old.save(&mut file).unwrap();
    let new = Limiter::<(u32, std::net::IpAddr)>::builder()
        .limit(Limit::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    new.load(&file[..]).unwrap();
    assert!(!new.check(&key).is_allowed());
    // A snapshot of other keys' type is an error, and changes nothing.
    let strings = Limiter::<u64>::builder().limit(Limit::per_second(2)).clock(clock).build().unwrap();
    assert!(matches!(strings.load(&file[..]), Err(SnapshotError::Key { .. })));
    assert!(strings.is_empty());
}

/// A key whose serialisation (the save runs it while it walks a shard) first makes what
/// other threads could do meanwhile: every shard's array rebuilt (new keys), then every key
/// moved to a new policy version (`update_policy`, then a cost-0 check of each). The walk
/// still holds the arrays it loaded, whose nodes are now the moved-out states: it must look
/// each such key up again, or the keys held throughout with units go missing from the save.
mod meddling {
    use std::cell::RefCell;
    use std::sync::Arc;

    use serde::{Deserialize, Serialize, Serializer};
    use slidegate::{Carry, Limit, Limiter, PolicyConfig};

    #[derive(Clone, PartialEq, Eq, Hash, Debug, Deserialize)]
    pub struct Key(pub String);

    thread_local! {
        /// The limiter to meddle with, taken (once) by the first key serialised.
        pub static ARMED: RefCell<Option<Arc<Limiter<Key>>>> = const { RefCell::new(None) };
    }

    pub const KEYS: u64 = 2000;

    impl Serialize for Key {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if let Some(limiter) = ARMED.with(|a| a.borrow_mut().take()) {
                for j in 0..4 * KEYS {
                    let _ = limiter.check(&Key(format!("new{j}")));
                }
                let moved =
                    PolicyConfig::new([Limit::per_minute(1000).precision(std::time::Duration::from_secs(2))]);
                limiter.update_policy("default", moved, Carry::Conservative).unwrap();
                for i in 0..KEYS {
                    let _ = limiter.check_n(&Key(format!("k{i}")), 0);
                }
            }
            self.0.serialize(s)
        }
    }
}

#[test]
fn a_key_moved_while_the_save_walks_its_shard_is_saved_where_it_moved() {
    use meddling::{Key, ARMED, KEYS};
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let build =
        || Limiter::<Key>::builder().limit(Limit::per_minute(1000)).clock(clock.clone()).build().unwrap();
    let old = Arc::new(build());
    for i in 0..KEYS {
        assert!(old.check_n(&Key(format!("k{i}")), 3).is_allowed());
    }
    ARMED.with(|a| *a.borrow_mut() = Some(Arc::clone(&old)));
    let mut file = Vec::new();
    old.save(&mut file).unwrap();
    assert!(ARMED.with(|a| a.borrow().is_none()), "the meddling ran");
    let new = build();
    new.load(&file[..]).unwrap();
    let missing: Vec<u64> =
        (0..KEYS).filter(|&i| new.peek(&Key(format!("k{i}"))).remaining() > 1000 - 3 - 1).collect();
    assert!(missing.is_empty(), "{} of {KEYS} keys held throughout are missing from the save", missing.len());
}

/// A policy version freed during a save (the walk lets each shard's nodes go before the
/// next) and a later version allocated at its address: the save must name versions by
/// their number, not their address, or the later version's keys are written under the
/// earlier one's limits and the stream does not load.
#[test]
fn a_policy_version_freed_during_a_save_is_not_confused_with_a_later_one() {
    const KEYS: u64 = 4000;
    struct Meddling {
        out: Vec<u8>,
        limiter: Arc<Limiter<String>>,
        calls: usize,
    }
    let key = |i: u64| format!("k{i}-{}", "x".repeat(1000));
    impl std::io::Write for Meddling {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.calls += 1;
            let l = &self.limiter;
            let key = |i: u64| format!("k{i}-{}", "x".repeat(1000));
            let every_key_moves = |limits: Vec<Limit>| {
                l.update_policy("default", PolicyConfig::new(limits), slidegate::Carry::Conservative)
                    .unwrap();
                for i in 0..KEYS {
                    let _ = l.check_n(&key(i), 0);
                }
            };
            match self.calls {
                1 => every_key_moves(vec![Limit::per_minute(1000).precision(Duration::from_secs(2))]),
                // Grace periods pass between the shards' walks: the first version is freed.
                2..=8 => {
                    l.sweep();
                }
                9 => every_key_moves(vec![Limit::per_minute(1000), Limit::per_second(500)]),
                _ => {}
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for _ in 0..10 {
        let clock = ManualClock::new();
        clock.set(secs(100.0));
        let build = || {
            Limiter::<String>::builder().limit(Limit::per_minute(1000)).clock(clock.clone()).build().unwrap()
        };
        let old = Arc::new(build());
        for i in 0..KEYS {
            assert!(old.check_n(&key(i), 3).is_allowed());
        }
        let mut file = Meddling { out: Vec::new(), limiter: Arc::clone(&old), calls: 0 };
        old.save(&mut file).unwrap();
        let loaded = build().load(&file.out[..]);
        assert!(loaded.is_ok(), "the limiter's own save does not load: {loaded:?}");
    }
}

/// Counts over what one entry holds (2³²−1 units): a GCRA key recorded twice with the most a
/// record counts, whose lead is then about 2³³ units. The save splits such a count into
/// entries a load adds back up; the limiter's own save must always load.
#[test]
fn a_count_over_what_one_entry_holds_is_saved_in_pieces() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let build = || limiter(Algorithm::Gcra, &[Limit::per_minute(100)], &clock);
    let old = build();
    for i in 0..100 {
        let _ = old.check(&format!("innocent{i}"));
    }
    let _ = old.record("abuser", u64::from(u32::MAX));
    let _ = old.record("abuser", u64::from(u32::MAX));
    let wait = old.peek("abuser").retry_after().unwrap();
    let new = build();
    new.load(&saved(&old)[..]).unwrap();
    assert_eq!(new.len(), 101);
    let loaded = new.peek("abuser").retry_after().unwrap();
    assert!(loaded + secs(1.0) >= wait, "{loaded:?} against {wait:?}");
}

/// Loading into a full table that evicts the least recently used key for a new one: a load
/// takes idle places only, never a live key's (it never lowers a count).
#[test]
fn a_load_never_evicts_a_live_key() {
    let clock = ManualClock::new();
    clock.set(secs(100.0));
    let old = limiter(Algorithm::SlidingWindow, &[Limit::per_minute(5)], &clock);
    for i in 0..10 {
        assert!(old.check(&format!("loaded{i}")).is_allowed());
    }
    let file = saved(&old);
    let full = Limiter::<String>::builder()
        .limit(Limit::per_minute(5))
        .max_keys(4)
        .when_full(slidegate::WhenFull::EvictLeastRecent)
        .clock(clock.clone())
        .build()
        .unwrap();
    for i in 0..4 {
        assert!(full.check_n(&format!("live{i}"), 5).is_allowed());
    }
    let stats = full.load(&file[..]).unwrap();
    assert_eq!((stats.inserted, stats.full), (0, 10));
    for i in 0..4 {
        assert!(!full.check(&format!("live{i}")).is_allowed(), "live{i} lost its units");
    }
}

/// Races of a save and a load with other threads, and bounds a save must keep: from an
/// independent review of the feature, each failing before its fix.
mod review {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use slidegate::{Limit, Limiter, ManualClock};

    static SLOW: AtomicBool = AtomicBool::new(false);

    #[derive(Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    struct Key(String);

    impl Clone for Key {
        fn clone(&self) -> Self {
            // The node's key is cloned by `apply` (Change::Replace) under the shard's mutex,
            // after the old state was marked MOVED: a slow clone widens that window (any move
            // of a long sliding log takes microseconds there anyway).
            if SLOW.swap(false, Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(400));
            }
            Key(self.0.clone())
        }
    }

    #[test]
    fn a_key_held_throughout_a_save_is_saved_even_while_it_is_being_moved() {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(100));
        let build =
            || Limiter::<Key>::builder().limit(Limit::per_minute(10)).clock(clock.clone()).build().unwrap();
        let limiter = Arc::new(build());
        let key = Key("a".into());
        for _ in 0..3 {
            assert!(limiter.check(&key).is_allowed());
        }
        let mut first = Vec::new();
        limiter.save(&mut first).unwrap();
        SLOW.store(true, Ordering::SeqCst);
        let loader = {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || limiter.load(&first[..]).unwrap())
        };
        std::thread::sleep(Duration::from_millis(150));
        let mut second = Vec::new();
        let stats = limiter.save(&mut second).unwrap();
        let loaded = loader.join().unwrap();
        assert_eq!(loaded.added, 1);
        assert_eq!(stats.keys, 1, "key 'a' (6 units, held throughout) is missing from the save");
    }

    mod full {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use std::time::Duration;

        use slidegate::{Limit, Limiter, ManualClock};

        static SLOW_X: AtomicBool = AtomicBool::new(false);

        #[derive(Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub struct Key(pub String);

        impl Clone for Key {
            fn clone(&self) -> Self {
                // `to_owned` of a new key runs under its shard's mutex (`Table::insert`).
                if self.0.starts_with('x') && SLOW_X.swap(false, Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(400));
                }
                Key(self.0.clone())
            }
        }

        fn keys_in(
            limiter: &Limiter<Key>,
            prefix: &str,
            shard: Option<usize>,
            not: &[usize],
            n: usize,
        ) -> Vec<Key> {
            (0..100_000)
                .map(|i| Key(format!("{prefix}{i}")))
                .filter(|k| {
                    let s = limiter.shard_of(k);
                    shard.map_or(true, |want| s == want) && !not.contains(&s)
                })
                .take(n)
                .collect()
        }

        /// A full table with two idle keys in shard A and live ones elsewhere; a check of a new
        /// key X in shard B holds B's mutex (its `to_owned`) after taking one idle key. A load
        /// of key K, also in B, meanwhile is refused at once (`Merged::Full`, its saved units
        /// dropped) although the other idle key would make room once B's mutex is free.
        #[test]
        fn a_load_is_not_dropped_because_its_shard_is_busy_for_a_moment() {
            let clock = ManualClock::new();
            clock.set(Duration::from_secs(100));
            let build = |max| {
                Limiter::<Key>::builder()
                    .limit(Limit::per_minute(10))
                    .max_keys(max)
                    .clock(clock.clone())
                    .build()
                    .unwrap()
            };
            let old = build(100);
            let limiter = Arc::new(build(4));
            let k = keys_in(&limiter, "k", None, &[], 1).remove(0);
            let b = limiter.shard_of(&k);
            let x = keys_in(&limiter, "x", Some(b), &[], 1).remove(0);
            let idle = keys_in(&limiter, "i", None, &[b], 2);
            let a = limiter.shard_of(&idle[0]);
            let idle: Vec<Key> = keys_in(&limiter, "i", Some(a), &[], 2);
            let live = keys_in(&limiter, "l", Some(b), &[], 1).remove(0);
            let other = keys_in(&limiter, "m", None, &[a, b], 1).remove(0);
            for key in &idle {
                assert!(limiter.check(key).is_allowed());
            }
            clock.set(Duration::from_secs(300));
            assert!(limiter.check(&live).is_allowed());
            assert!(limiter.check(&other).is_allowed());
            assert_eq!(limiter.len(), 4);
            for _ in 0..5 {
                assert!(old.check(&k).is_allowed());
            }
            let mut file = Vec::new();
            old.save(&mut file).unwrap();
            SLOW_X.store(true, Ordering::SeqCst);
            let checker = {
                let limiter = Arc::clone(&limiter);
                std::thread::spawn(move || limiter.check(&x).is_allowed())
            };
            std::thread::sleep(Duration::from_millis(100));
            let stats = limiter.load(&file[..]).unwrap();
            assert!(checker.join().unwrap());
            assert_eq!((stats.inserted, stats.full), (1, 0), "K's 5 saved units dropped: {stats:?}");
        }
    }

    /// One client-chosen key whose JSON is over the reader's 64 KiB (a 12 KB header value of
    /// control characters, each written `\u0001`) makes the whole snapshot unloadable.
    #[test]
    fn one_long_key_does_not_make_the_whole_snapshot_unloadable() {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(100));
        let build = || {
            Limiter::<String>::builder().limit(Limit::per_minute(10)).clock(clock.clone()).build().unwrap()
        };
        let old = build();
        for _ in 0..10 {
            assert!(old.check("alice").is_allowed());
        }
        let hostile = "\u{1}".repeat(12_000);
        assert!(old.check(hostile.as_str()).is_allowed());
        let mut file = Vec::new();
        let saved = old.save(&mut file).unwrap();
        assert_eq!((saved.keys, saved.skipped), (1, 1), "the long key left out, and counted");
        let new = build();
        let loaded = new.load(&file[..]);
        assert!(loaded.is_ok(), "{loaded:?}");
        assert!(!new.check("alice").is_allowed(), "alice's minute survived");
    }

    /// Extreme states saved and loaded (debug build: overflow checks on).
    #[test]
    fn extreme_states_save_and_load_without_panicking() {
        use slidegate::Algorithm;
        for algorithm in
            [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra]
        {
            for at in [
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_nanos((1u64 << 62) - 1_000_000_000),
                Duration::from_nanos(1u64 << 62),
                Duration::from_nanos(u64::MAX),
            ] {
                let clock = ManualClock::new();
                clock.set(at);
                let build = || {
                    Limiter::<u64>::builder()
                        .algorithm(algorithm)
                        .limit(Limit::per_second(4096))
                        .limit("10/day".parse().unwrap())
                        .clock(clock.clone())
                        .build()
                        .unwrap()
                };
                let old = build();
                for _ in 0..3 {
                    let _ = old.record(&1, u64::MAX);
                    let _ = old.record(&2, u64::from(u32::MAX) + 7);
                }
                for i in 0..5000u64 {
                    let _ = old.check(&3);
                    clock.set(at.saturating_add(Duration::from_nanos(i)));
                }
                let mut file = Vec::new();
                let saved = old.save(&mut file).unwrap();
                let new = build();
                let loaded = new.load(&file[..]).unwrap();
                let again = new.load(&file[..]).unwrap();
                eprintln!("{algorithm:?} at {at:?}: saved {saved:?} loaded {loaded:?} again {again:?}");
                let _ = (new.peek(&1), new.peek(&2), new.peek(&3));
            }
        }
    }
}
