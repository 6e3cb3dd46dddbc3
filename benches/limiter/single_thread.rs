//! One thread: a hot key (admitted; refused against history in older slots and in the
//! current slot), 1,000 keys and 1 M keys in random order (one slot, sixty slots, sixty
//! slots on frozen clocks, the three-limit policy), GCRA against GCRA, and a new key every
//! check. The policies and the key orders are `slidegate_tools::workloads`' (its module
//! docs list the rules they follow); each timed pass's decisions are asserted.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use slidegate::Algorithm;
use slidegate_tools::workloads::{
    self, three_limits, AgedKey, Contender, Governor, GovernorThree, Pass, Policy, Slidegate, Visits,
    FEW_KEYS, HISTORY_AGE, HOT_KEY, MANY_KEYS, VISIT_SEED,
};

/// Passes whose decisions are not the workload's fail the bench.
fn admitted(pass: Pass) -> Duration {
    assert!(pass.all_admitted(), "a check was refused in a workload that admits every check: {pass:?}");
    pass.elapsed
}

fn refused(pass: Pass) -> Duration {
    assert!(pass.all_refused(), "a check was admitted in a workload that refuses every check: {pass:?}");
    pass.elapsed
}

/// An aged key's admission older than this is renewed (and aged again, untimed): the
/// refusals are timed against an admission 2.5 s to 3 s old.
const MAX_AGE: Duration = Duration::from_secs(3);

fn older_slots<C: Contender>(c: &C, aged: &mut AgedKey, iters: u64) -> Duration {
    if aged.current().is_none_or(|(_, age)| age > MAX_AGE) {
        aged.renew(c);
    }
    let (key, _) = aged.aged().unwrap_or_else(|| unreachable!("renewed above"));
    refused(workloads::hot(c, key, iters))
}

pub fn hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key");
    let (s, g) = (Slidegate::sliding(Policy::HotMinute), Governor::new(Policy::HotMinute));
    group.bench_function(BenchmarkId::new("slidegate", "admitted"), |b| {
        b.iter_custom(|iters| admitted(workloads::hot(&s, HOT_KEY, iters)))
    });
    group.bench_function(BenchmarkId::new("governor", "admitted"), |b| {
        b.iter_custom(|iters| admitted(workloads::hot(&g, HOT_KEY, iters)))
    });
    let (s, g) = (Slidegate::sliding(Policy::OnePerMinute), Governor::new(Policy::OnePerMinute));
    let (mut ours, mut theirs) = (1 << 40, 1 << 40);
    group.bench_function(BenchmarkId::new("slidegate", "refused_current_slot"), |b| {
        b.iter_custom(|iters| refused(workloads::refused_now(&s, &mut ours, iters)))
    });
    group.bench_function(BenchmarkId::new("governor", "refused_current_slot"), |b| {
        b.iter_custom(|iters| refused(workloads::refused_now(&g, &mut theirs, iters)))
    });
    // Each renewal sleeps HISTORY_AGE: fewer samples, so that the pair takes under a minute.
    group.sample_size(20).measurement_time(Duration::from_secs(2)).warm_up_time(HISTORY_AGE);
    let (mut ours, mut theirs) = (AgedKey::new(1 << 41), AgedKey::new(1 << 41));
    group.bench_function(BenchmarkId::new("slidegate", "refused_older_slots"), |b| {
        b.iter_custom(|iters| older_slots(&s, &mut ours, iters))
    });
    group.bench_function(BenchmarkId::new("governor", "refused_older_slots"), |b| {
        b.iter_custom(|iters| older_slots(&g, &mut theirs, iters))
    });
    group.finish();
}

/// Both contenders, `keys` inserted into each in `workloads::shuffled` order, then visited
/// in the random sequence of `VISIT_SEED`; the cursor goes on from sample to sample, so at
/// 1 M keys a key's previous visit is often seconds (slots) earlier.
fn random_both<S: Contender, G: Contender>(c: &mut Criterion, group: &str, s: S, g: G, keys: u64) {
    let order = workloads::shuffled(0, keys);
    assert_eq!(workloads::prefill(&s, &order) + workloads::prefill(&g, &order), 2 * keys);
    let mut group = c.benchmark_group(group);
    if keys == MANY_KEYS {
        group.sample_size(20).measurement_time(Duration::from_secs(10));
    }
    let mut visits = Visits::new(VISIT_SEED, 0, keys);
    group.bench_function("slidegate", |b| {
        b.iter_custom(|iters| workloads::random(&s, &mut visits, iters).elapsed)
    });
    let mut visits = Visits::new(VISIT_SEED, 0, keys);
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| workloads::random(&g, &mut visits, iters).elapsed)
    });
    group.finish();
}

pub fn many_keys(c: &mut Criterion) {
    let pair = |policy| (Slidegate::sliding(policy), Governor::new(policy));
    let (s, g) = pair(Policy::HotSecond);
    random_both(c, "keys_1k_random", s, g, FEW_KEYS);
    let (s, g) = pair(Policy::PerSecond);
    random_both(c, "keys_1m_random_one_slot", s, g, MANY_KEYS);
    let (s, g) = pair(Policy::PerMinute);
    random_both(c, "keys_1m_random_60_slots", s, g, MANY_KEYS);
    let s = Slidegate::frozen(&[Policy::PerMinute.limit()], Algorithm::SlidingWindow);
    random_both(c, "keys_1m_random_60_slots_frozen_clock", s, Governor::frozen(Policy::PerMinute), MANY_KEYS);
    let s = Slidegate::new(&three_limits(), Algorithm::SlidingWindow);
    random_both(c, "keys_1m_random_three_limits", s, GovernorThree::new(), MANY_KEYS);
}

/// slidegate's `Algorithm::Gcra` against governor's GCRA.
pub fn gcra(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra_hot_key");
    let s = Slidegate::new(&[Policy::HotMinute.limit()], Algorithm::Gcra);
    let g = Governor::new(Policy::HotMinute);
    group
        .bench_function("slidegate", |b| b.iter_custom(|iters| admitted(workloads::hot(&s, HOT_KEY, iters))));
    group.bench_function("governor", |b| b.iter_custom(|iters| admitted(workloads::hot(&g, HOT_KEY, iters))));
    group.finish();
    let s = Slidegate::new(&[Policy::PerMinute.limit()], Algorithm::Gcra);
    random_both(c, "gcra_keys_1m_random", s, Governor::new(Policy::PerMinute), MANY_KEYS);
}

pub fn inserts(c: &mut Criterion) {
    let mut group = c.benchmark_group("insert_every_check");
    group.sample_size(20);
    group.bench_function("slidegate", |b| {
        b.iter_custom(|iters| admitted(workloads::new_keys(|| Slidegate::sliding(Policy::PerSecond), iters)))
    });
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| admitted(workloads::new_keys(|| Governor::new(Policy::PerSecond), iters)))
    });
    group.finish();
}
