#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    reason = "test code: a panic or an overflow is a failed test"
)]

use std::collections::HashMap;
use std::time::Instant;

use super::*;

/// No decay within any test's clock.
const NEVER: u64 = u64::MAX;

fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(1, 2, 3, 4)
}

/// xorshift64*: small, seeded, good enough to draw ranks.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Ranks 1..=keys drawn with probability ∝ rank^-exponent; each rank a key id unrelated to
/// it (so hash order and rank order differ).
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(keys: usize, exponent: f64) -> Zipf {
        let mut total = 0.0;
        let cumulative = (1..=keys)
            .map(|rank| {
                total += (rank as f64).powf(-exponent);
                total
            })
            .collect();
        Zipf { cumulative }
    }
    fn draw(&self, rng: &mut Rng) -> u64 {
        let target = rng.unit() * self.cumulative.last().unwrap();
        let rank = self.cumulative.partition_point(|&c| c <= target).min(self.cumulative.len() - 1);
        key_of(rank as u64)
    }
}

/// A bijection from ranks to key ids.
fn key_of(rank: u64) -> u64 {
    rank.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5555
}

/// Feeds `refusals` Zipf draws (1 unit each) from `threads` threads, each with its own
/// seed; returns the true counts.
fn feed_zipf(offenders: &Offenders<u64>, zipf: &Zipf, refusals: usize, threads: u64) -> HashMap<u64, u64> {
    let per_thread = refusals / threads as usize;
    let counts: Vec<HashMap<u64, u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|seed| {
                scope.spawn(move || {
                    let (mut rng, mut truth, hasher) = (Rng::new(seed + 1), HashMap::new(), hasher());
                    for _ in 0..per_thread {
                        let key = zipf.draw(&mut rng);
                        offenders.refused(hasher.hash_one(key), &key, 1, 0);
                        *truth.entry(key).or_insert(0) += 1;
                    }
                    truth
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut truth = HashMap::new();
    for part in counts {
        for (key, count) in part {
            *truth.entry(key).or_insert(0) += count;
        }
    }
    truth
}

/// The true top `n` (key, count), most first; asserts no tie among the first `n + 1`.
fn true_top<K: Clone + Hash + Eq>(truth: &HashMap<K, u64>, n: usize) -> Vec<(K, u64)> {
    let mut all: Vec<(K, u64)> = truth.iter().map(|(k, &c)| (k.clone(), c)).collect();
    all.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    all.truncate(n + 1);
    for pair in all.windows(2) {
        assert!(pair[0].1 > pair[1].1, "the stream has a tie in its top {n}: change the seed");
    }
    all
}

/// `top(10)` is the true top 10 in order; every count is within the proven bound (which
/// is itself within N / m); the bound is below every gap between ranks 1 to 11, so the
/// parameters make the order certain rather than lucky.
fn assert_top_10<K: Clone + Hash + Eq + std::fmt::Debug>(
    top: &[(K, u64)],
    truth: &HashMap<K, u64>,
    bound: u64,
    units: u64,
    capacity: u64,
) {
    let expected = true_top(truth, 10);
    let gap = expected.windows(2).map(|pair| pair[0].1 - pair[1].1).min().unwrap();
    eprintln!("top 10: smallest gap {gap}, bound {bound}, N / m {}", units / capacity);
    assert!(bound <= units / capacity, "bound {bound} above N / m = {}", units / capacity);
    // The parameters make the order certain a priori (N / m), and the state proves more.
    assert!(gap > units / capacity, "the smallest gap {gap} is not above N / m");
    assert!(gap > bound, "the smallest gap {gap} is not above the bound {bound}");
    let keys: Vec<&K> = top.iter().map(|(k, _)| k).collect();
    let wanted: Vec<&K> = expected.iter().take(10).map(|(k, _)| k).collect();
    assert_eq!(keys, wanted);
    for (key, count) in top {
        let real = truth[key];
        assert!(
            real <= *count && *count <= real + bound,
            "{key:?}: reported {count}, true {real}, bound {bound}"
        );
    }
}

const KEYS: usize = 100_000;
const EXPONENT: f64 = 1.1;
const REFUSALS: usize = 1_500_000;
/// Entries per stripe in the Zipf tests: N / m = 1,464, under the smallest true gap among
/// the top 11 (about 1,600 for these parameters: `c_r - c_{r+1} ≈ 1.1 · c_r / r`).
const ZIPF_CAPACITY: usize = 1024;

#[test]
fn zipf_top_10_from_one_thread() {
    let zipf = Zipf::new(KEYS, EXPONENT);
    let offenders = Offenders::new(ZIPF_CAPACITY, NEVER);
    let truth = feed_zipf(&offenders, &zipf, REFUSALS, 1);
    let top = offenders.top(10, 0);
    assert_top_10(&top, &truth, offenders.bound(), REFUSALS as u64, ZIPF_CAPACITY as u64);
}

#[test]
fn zipf_top_10_from_four_threads() {
    let zipf = Zipf::new(KEYS, EXPONENT);
    let offenders = Offenders::new(ZIPF_CAPACITY, NEVER);
    let truth = feed_zipf(&offenders, &zipf, REFUSALS, 4);
    let top = offenders.top(10, 0);
    assert_top_10(&top, &truth, offenders.bound(), REFUSALS as u64, ZIPF_CAPACITY as u64);
}

/// Heavy keys, then the same heavy keys interleaved with a million one-off keys (`String`
/// keys, looked up as `&str`): the top 10 stay the same, in the same order, and the
/// one-offs clone a key far less often than once each.
#[test]
fn a_spray_of_one_off_keys_neither_displaces_the_top_nor_clones_each() {
    const CAPACITY: usize = 128;
    const SPRAY: u64 = 1_000_000;
    let zipf = Zipf::new(KEYS, EXPONENT);
    let offenders: Offenders<String> = Offenders::new(CAPACITY, NEVER);
    let (mut rng, hasher) = (Rng::new(7), hasher());
    let mut truth: HashMap<String, u64> = HashMap::new();
    let mut heavy = |offenders: &Offenders<String>, truth: &mut HashMap<String, u64>| {
        let key = format!("heavy-{:x}", zipf.draw(&mut rng));
        offenders.refused(hasher.hash_one(key.as_str()), key.as_str(), 1, 0);
        *truth.entry(key).or_insert(0) += 1;
    };
    for _ in 0..REFUSALS / 2 {
        heavy(&offenders, &mut truth);
    }
    let before = offenders.top(10, 0);
    let entered = offenders.entered();
    let per_spray = SPRAY / (REFUSALS as u64 / 2);
    let mut sprayed = 0;
    for _ in 0..REFUSALS / 2 {
        heavy(&offenders, &mut truth);
        for _ in 0..=per_spray {
            if sprayed < SPRAY {
                let key = format!("spray-{sprayed:010}");
                offenders.refused(hasher.hash_one(key.as_str()), key.as_str(), 1, 0);
                sprayed += 1;
            }
        }
    }
    assert_eq!(sprayed, SPRAY);
    let after = offenders.top(10, 0);
    let keys = |top: &[(String, u64)]| top.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&before), keys(&after));
    let expected = true_top(&truth, 10);
    assert_eq!(keys(&after), expected.iter().take(10).map(|(k, _)| k.clone()).collect::<Vec<_>>());
    let bound = offenders.bound();
    for (key, count) in &after {
        assert!(truth[key] <= *count && *count <= truth[key] + bound, "{key}: {count} vs {}", truth[key]);
    }
    // The spray's entries (clones), heavy keys' churn included: plain Space-Saving would
    // clone a million.
    let clones = offenders.entered() - entered;
    eprintln!("spray: {clones} keys entered for {SPRAY} one-offs, bound {bound}");
    assert!(clones <= SPRAY / 9, "{clones} clones for {SPRAY} one-offs");
}

#[test]
fn counts_halve_every_half_life_and_recent_refusals_rank_first() {
    const HALF_LIFE: u64 = 1_000;
    let offenders: Offenders<String> = Offenders::new(16, HALF_LIFE);
    // "key count, key count", most first.
    let top = |now| {
        let top = offenders.top(2, now);
        top.iter().map(|(k, c)| format!("{k} {c}")).collect::<Vec<_>>().join(", ")
    };
    let hash = |key: &str| hasher().hash_one(key);
    offenders.refused(hash("old"), "old", 1_000, 0);
    assert_eq!(top(999), "old 1000");
    assert_eq!(top(1_000), "old 500");
    assert_eq!(top(2_500), "old 250");
    offenders.refused(hash("new"), "new", 100, 5_000);
    // 1000 / 2⁵ = 31 (rounded down).
    assert_eq!(top(5_000), "new 100, old 31");
    // A refusal read slightly late (an earlier epoch) counts in the stripe's epoch.
    offenders.refused(hash("new"), "new", 10, 4_900);
    assert_eq!(top(5_999), "new 110, old 31");
    // 64 half-lives or more clear everything.
    assert_eq!(top(5_000 + 64 * HALF_LIFE), "");
    assert_eq!(top(u64::MAX), "");
}

#[test]
fn a_half_life_of_zero_means_no_decay() {
    let offenders: Offenders<u64> = Offenders::new(4, 0);
    offenders.refused(hasher().hash_one(1u64), &1, 7, 0);
    offenders.refused(hasher().hash_one(1u64), &1, 7, u64::MAX);
    assert_eq!(offenders.top(1, u64::MAX), vec![(1, 14)]);
}

#[test]
fn edge_cases_neither_panic_nor_wrap() {
    let nothing: Offenders<u64> = Offenders::new(0, 1);
    nothing.refused(1, &1, 5, 0);
    assert_eq!(nothing.top(10, 0), vec![]);
    assert_eq!(nothing.entered(), 0);

    let offenders: Offenders<u64> = Offenders::new(4, NEVER);
    offenders.refused(11, &1, u64::MAX, 0);
    offenders.refused(11, &1, u64::MAX, 0);
    offenders.refused(12, &2, 0, 0);
    assert_eq!(offenders.top(0, 0), vec![]);
    assert_eq!(offenders.top(usize::MAX, 0), vec![(1, u64::MAX)]);
    // A full summary, saturated counts, a new key whose filter count is u64::MAX too.
    for key in 2..10u64 {
        offenders.refused(key, &key, u64::MAX, u64::MAX);
    }
    let top = offenders.top(100, u64::MAX);
    assert!(!top.is_empty() && top.len() <= 10, "{top:?}");
    assert!(top.iter().all(|&(_, count)| count == u64::MAX));
    assert!(offenders.bytes() > 0);
}

/// Four threads refusing the same keys, fewer than the capacity: the counts are exact.
#[test]
fn refusals_from_several_threads_are_all_counted() {
    let offenders: Offenders<u64> = Offenders::new(8, NEVER);
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let offenders = &offenders;
            scope.spawn(move || {
                for i in 0..100_000u64 {
                    let key = i % 3;
                    offenders.refused(hasher().hash_one(key), &key, 1 + (i + thread) % 3, 0);
                }
            });
        }
    });
    let expected = |key: u64| -> u64 {
        (0..4u64)
            .map(|t| (0..100_000u64).filter(|i| i % 3 == key).map(|i| 1 + (i + t) % 3).sum::<u64>())
            .sum()
    };
    let mut top = offenders.top(10, 0);
    top.sort();
    assert_eq!(top, (0..3).map(|k| (k, expected(k))).collect::<Vec<_>>());
}

/// The index, the heap and the filter keep their invariants through evictions with many
/// hash collisions, and every key's true count stays between a summary's count minus its
/// error and that count, or below its filter counter when not tracked.
#[test]
fn invariants_hold_through_evictions_and_collisions() {
    // 64 keys over 8 hash values (the index and the filter see collisions at every step),
    // then 5,000 keys with their own hashes (the filter counts them one by one); skewed.
    for (keys, hash) in [(64, (|key| key % 8) as fn(u64) -> u64), (5_000, |key| hasher().hash_one(key))] {
        let mut stripe: Stripe<u64> = Stripe::new();
        let mut truth: HashMap<u64, u64> = HashMap::new();
        let mut rng = Rng::new(3);
        for step in 0..50_000u64 {
            let key = rng.next() % (1 + rng.next() % keys);
            let units = 1 + rng.next() % 4;
            stripe.add(hash(key), &key, units, 0, 6);
            *truth.entry(key).or_insert(0) += units;
            if step % 97 == 0 {
                check(&stripe, &truth, 6, hash);
            }
        }
        check(&stripe, &truth, 6, hash);
    }
}

fn check(stripe: &Stripe<u64>, truth: &HashMap<u64, u64>, capacity: usize, hash: fn(u64) -> u64) {
    let full = stripe.entries.len() == capacity;
    assert!(stripe.entries.len() <= capacity);
    assert_eq!(stripe.heap.len(), stripe.entries.len());
    for (at, node) in stripe.heap.iter().enumerate() {
        assert_eq!(stripe.entries[node.entry as usize].at as usize, at);
        if at > 0 {
            assert!(stripe.heap[(at - 1) / 2].count <= node.count, "heap order");
        }
    }
    let smallest = if full { stripe.heap[0].count } else { 0 };
    assert_eq!(stripe.index.iter().filter(|&&n| n != EMPTY).count(), stripe.entries.len());
    for (number, entry) in stripe.entries.iter().enumerate() {
        assert_eq!(stripe.find(entry.hash, &entry.key), Some(number));
    }
    let units: u64 = truth.values().sum();
    assert!(smallest <= units / capacity as u64);
    for (key, &real) in truth {
        match stripe.find(hash(*key), key) {
            Some(number) => {
                let node = stripe.heap[stripe.entries[number].at as usize];
                assert!(node.count - node.error <= real && real <= node.count, "{key}: {real}");
                assert!(node.error <= smallest);
            }
            None => {
                let filtered = stripe.filter[bucket(hash(*key), stripe.filter.len())];
                assert!(real <= filtered && filtered <= smallest, "{key}: {real} > {filtered}");
            }
        }
    }
}

/// A key held by one stripe and not by another: `top` adds the other's filter counter, so
/// the sum is still an upper bound (its units there are not lost to the report).
#[test]
fn a_key_missing_from_a_stripe_counts_its_filter_there() {
    let offenders: Offenders<&'static str> = Offenders {
        stripes: (0..2).map(|_| CachePadded::new(Mutex::new(Stripe::new()))).collect(),
        capacity: 2,
        half_life: None,
    };
    let add = |stripe: usize, key: &'static str, units: u64| {
        offenders.stripes[stripe].lock().unwrap().add(hasher().hash_one(key), &key, units, 0, 2);
    };
    add(0, "a", 100);
    add(1, "x", 1_000);
    add(1, "y", 900);
    add(1, "a", 5);
    let top = offenders.top(3, 0);
    let a = top.iter().find(|(key, _)| *key == "a").map(|&(_, count)| count);
    assert_eq!(a, Some(105), "{top:?}");
    assert_eq!(offenders.bound(), 900);
}

#[test]
fn memory_is_bounded_by_the_capacity() {
    let offenders: Offenders<String> = Offenders::new(128, NEVER);
    let empty = offenders.bytes();
    for i in 0..100_000u64 {
        let key = format!("key-{i}");
        offenders.refused(hasher().hash_one(key.as_str()), key.as_str(), 1, 0);
    }
    let one = offenders.bytes() - empty;
    assert_eq!(one, 128 * (std::mem::size_of::<String>() + 40) + 256 * 4 + 1024 * 8);
    eprintln!("capacity 128, String keys: {one} bytes per stripe touched, {empty} for the stripes");
}

/// The cost of `refused`, one thread: `cargo test --release --lib offenders::tests::timing
/// -- --ignored --nocapture`.
#[test]
#[ignore = "a timing, not a test: run it in release"]
fn timing() {
    let hasher = hasher();
    let offenders: Offenders<String> = Offenders::new(128, 60_000_000_000);
    let hot = "203.0.113.7:key1".to_owned();
    let hash = hasher.hash_one(hot.as_str());
    let calls = 20_000_000u64;
    let start = Instant::now();
    for i in 0..calls {
        offenders.refused(std::hint::black_box(hash), std::hint::black_box(hot.as_str()), 1, i);
    }
    let hot_ns = start.elapsed().as_nanos() as f64 / calls as f64;

    let spray: Vec<(u64, String)> = (0..2_000_000u64)
        .map(|i| {
            let key = format!("198.51.{:03}.{:04}", i % 1000, i / 1000);
            (hasher.hash_one(key.as_str()), key)
        })
        .collect();
    let entered = offenders.entered();
    let start = Instant::now();
    for (i, (hash, key)) in spray.iter().enumerate() {
        offenders.refused(*hash, key.as_str(), 1, i as u64);
    }
    let spray_ns = start.elapsed().as_nanos() as f64 / spray.len() as f64;
    let clones = offenders.entered() - entered;
    eprintln!("refused: hot key {hot_ns:.1} ns, spray of distinct 16-byte String keys {spray_ns:.1} ns ({clones} entered)");
}

/// A key whose `Drop` is refused by the summary that drops it: the summary must drop the
/// keys it evicts outside its stripe's lock. With one stripe (one core), dropping under the
/// lock re-enters `refused`, which finds its own stripe busy and waits for it for ever (the
/// thread then deadlocks: this test times out).
#[test]
fn a_key_dropped_by_the_summary_may_come_back_to_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct Key(&'static str);
    static SUMMARY: OnceLock<Offenders<Key>> = OnceLock::new();
    static ARMED: AtomicBool = AtomicBool::new(false);
    impl Drop for Key {
        fn drop(&mut self) {
            if self.0 == "victim" && ARMED.swap(false, Ordering::SeqCst) {
                // E.g. a connection handle whose drop charges a disconnect, refused.
                if let Some(summary) = SUMMARY.get() {
                    summary.refused(3, &Key("other"), 1, 0);
                }
            }
        }
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let summary = SUMMARY.get_or_init(|| Offenders::with_stripes(1, NEVER, 1));
        summary.refused(1, &Key("victim"), 1, 0);
        ARMED.store(true, Ordering::SeqCst);
        // "intruder" takes "victim"'s place once its filtered count passes it.
        for _ in 0..4 {
            summary.refused(2, &Key("intruder"), 1, 0);
        }
        let dropped = !ARMED.load(Ordering::SeqCst);
        let _ = done.send(dropped);
    });
    let dropped = finished.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(dropped, Ok(true), "deadlocked re-entering the summary, or the victim was never dropped");
}

/// A key whose `Clone` (the summary clones a key that enters it, under the stripe's lock)
/// is refused by the same summary: that refusal is not recorded rather than wait for the
/// lock its own thread holds (with one stripe it would wait for ever).
#[test]
fn a_key_whose_clone_is_refused_does_not_deadlock_the_summary() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    #[derive(PartialEq, Eq, Hash, Debug)]
    struct Key(&'static str);
    static SUMMARY: OnceLock<Offenders<Key>> = OnceLock::new();
    static ARMED: AtomicBool = AtomicBool::new(false);
    impl Clone for Key {
        fn clone(&self) -> Self {
            if ARMED.swap(false, Ordering::SeqCst) {
                if let Some(summary) = SUMMARY.get() {
                    summary.refused(9, &Key("other"), 1, 0);
                }
            }
            Key(self.0)
        }
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let summary = SUMMARY.get_or_init(|| Offenders::with_stripes(4, NEVER, 1));
        ARMED.store(true, Ordering::SeqCst);
        // Enters the summary: cloned under the lock, and the clone's refusal comes back.
        summary.refused(1, &Key("victim"), 1, 0);
        let _ = done.send(summary.top(10, 0));
    });
    let top = finished.recv_timeout(std::time::Duration::from_secs(10)).expect("deadlocked in the summary");
    assert_eq!(top, [(Key("victim"), 1)], "the victim counted, the refusal from inside its clone not");
}

/// A refusal from a key's `Drop` while `top` merges what it copied out (no lock held then)
/// is recorded.
#[test]
fn a_refusal_from_a_drop_during_top_is_recorded() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct Key(&'static str);
    static SUMMARY: OnceLock<Offenders<Key>> = OnceLock::new();
    static ARMED: AtomicBool = AtomicBool::new(false);
    impl Drop for Key {
        fn drop(&mut self) {
            if self.0 == "small" && ARMED.swap(false, Ordering::SeqCst) {
                SUMMARY.get().unwrap().refused(7, &Key("fromdrop"), 5, 0);
            }
        }
    }
    let summary = SUMMARY.get_or_init(|| Offenders::with_stripes(8, NEVER, 1));
    summary.refused(1, &Key("big"), 10, 0);
    summary.refused(2, &Key("small"), 1, 0);
    ARMED.store(true, Ordering::SeqCst);
    let top = summary.top(1, 0); // "small" copies dropped inside top, after the locks
    assert!(!ARMED.load(Ordering::SeqCst), "drop not run");
    drop(top);
    let all = summary.top(10, 0);
    assert!(
        all.iter().any(|(k, _)| k.0 == "fromdrop"),
        "refusal from a Drop run after the locks lost: {all:?}"
    );
}

/// A refusal into another summary (another limiter) from a key's `Clone` under this one's
/// lock is recorded: only this summary's own lock is held.
#[test]
fn a_refusal_on_another_summary_from_inside_clone_is_recorded() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;
    #[derive(PartialEq, Eq, Hash, Debug)]
    struct Key(&'static str);
    static OTHER: OnceLock<Offenders<Key>> = OnceLock::new();
    static ARMED: AtomicBool = AtomicBool::new(false);
    impl Clone for Key {
        fn clone(&self) -> Self {
            if ARMED.swap(false, Ordering::SeqCst) {
                OTHER.get().unwrap().refused(9, &Key("x"), 1, 0);
            }
            Key(self.0)
        }
    }
    let other = OTHER.get_or_init(|| Offenders::with_stripes(4, NEVER, 1));
    let first = Offenders::with_stripes(4, NEVER, 1);
    ARMED.store(true, Ordering::SeqCst);
    first.refused(1, &Key("victim"), 1, 0);
    assert!(!ARMED.load(Ordering::SeqCst));
    assert_eq!(other.top(10, 0).len(), 1, "refusal on an unrelated summary dropped");
}

/// A panic in a key's `Clone` under the lock leaves the thread able to record again.
#[test]
fn a_panic_in_clone_under_the_lock_leaves_tracking_on() {
    use std::sync::atomic::{AtomicBool, Ordering};
    #[derive(PartialEq, Eq, Hash, Debug)]
    struct Key(&'static str);
    static ARMED: AtomicBool = AtomicBool::new(false);
    impl Clone for Key {
        fn clone(&self) -> Self {
            if ARMED.swap(false, Ordering::SeqCst) {
                panic!("clone");
            }
            Key(self.0)
        }
    }
    let s = Offenders::with_stripes(4, NEVER, 1);
    ARMED.store(true, Ordering::SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.refused(1, &Key("a"), 1, 0)));
    assert!(r.is_err());
    s.refused(2, &Key("b"), 1, 0);
    assert!(s.top(10, 0).iter().any(|(k, _)| k.0 == "b"));
}
