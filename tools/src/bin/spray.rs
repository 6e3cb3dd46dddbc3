//! Key spraying: `cargo run --release -p slidegate-tools --bin spray [-- --quick] [--keys N] [--max-keys M]`.
//!
//! An attacker rotates through an IPv6 /64 (a fixed prefix, random low 64 bits from a seeded
//! SplitMix64, every key distinct) and sends one request per address: `--keys` addresses
//! (10,000,000; `--quick` 1,000,000) at a limiter of 10/s per key capped at `--max-keys`
//! (1,000,000; `--quick` 100,000). Time is simulated with a [`ManualClock`] in ticks of
//! 100 ms; the spray arrives at `max_keys` new addresses per simulated second, twice what the
//! table can hold for the 2 s a key lives (window + precision), so the table runs full and
//! about half the spray is refused with `TooManyKeys` while the other half gets in as
//! expired spray makes room (a new key takes an idle key's place at its check, or the
//! sweeper removes it first).
//!
//! Real threads race: two spray threads, one thread of 1,000 legitimate keys (inserted
//! before the spray, each checking twice per tick with costs of 1 or 2, so some are refused
//! by their limit), and a sweeper thread calling `limiter.sweep()` each time the clock has
//! moved, racing that tick's checks. The clock moves only while the spray and legitimate
//! threads wait at a barrier, so every legitimate decision is compared with a twin limiter
//! (same limit and clock, no spray, no `max_keys`): admitted, remaining, retry-after,
//! denial, all identical.
//!
//! When the spray stops, the sweeper thread stops and the legitimate keys check for 3 more
//! simulated seconds (the spray keys expire), then the main thread sweeps twice and the
//! legitimate keys check for 1 s more. Heap is live bytes from a counting allocator (with its
//! high-water mark); RSS is resident pages from `/proc/self/statm` × the page size (its
//! high-water mark `VmHWM`, reset through `/proc/self/clear_refs`).
//!
//! The "documented bytes/key" is measured the way `tools/src/bin/memory.rs` measures it: a fresh
//! process (this program with `--baseline`) inserts `max_keys` keys into a fresh limiter and
//! reports (heap after − heap before) / keys, for `Ipv6Addr` keys (and for `u64` keys, the
//! reliability guide's figure at 1,000,000). The slack (see the constants and `report`): one more
//! doubling of the map's table and 10% of the documented figure; for RSS also malloc's
//! overhead per allocation, one table's worth of freed tables, and a fixed 4 MiB. Exits non-zero if (a) the peak
//! heap or peak RSS during the spray grew beyond documented × `max_keys` plus that slack,
//! (b) any legitimate decision differs from the twin's, (c) the table was seen holding more
//! than `max_keys`, (d) no spray key was refused with `TooManyKeys`, or (e) the first sweep
//! after the spray gives back less than 95% of the heap the spray added (RSS is reported).

use std::net::Ipv6Addr;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{Denial, Limit, Limiter, ManualClock};

use slidegate_tools::counting_alloc;
use slidegate_tools::rng;
use slidegate_tools::rss;
use slidegate_tools::thousands as n;

use counting_alloc::{live_bytes as heap, peak_bytes as peak_heap, Counting};
use rng::Rng;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type Error = Box<dyn std::error::Error>;

/// One tick of simulated time; the spray sends `max_keys / TICKS_PER_SECOND` keys per tick.
const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_SECOND: usize = 10;
const SPRAY_THREADS: usize = 2;
const LEGIT_KEYS: u64 = 1_000;
/// Checks per legitimate key and tick (20 a second against 10/s: some are refused).
const LEGIT_CHECKS: usize = 2;
/// Legitimate-only ticks after the spray: 3 s, beyond a key's 2 s life.
const DRAIN_TICKS: usize = 30;
/// Legitimate-only ticks after the two sweeps.
const AFTER_TICKS: usize = 10;
/// The spray prefix (attacker) and the legitimate keys' prefix, both documentation space.
const ATTACKER: u64 = 0x2001_0db8_0bad_0bad;
const LEGIT: u64 = 0x2001_0db8_0001_0001;
const BASELINE: u64 = 0x2001_0db8_0ba5_e000;
const SEED: u64 = 0x5EED_5EED_5EED_5EED;
/// SplitMix64's increment: `Rng(SEED + i × GAMMA).next()` is the generator's `i + 1`-th
/// output, and SplitMix64's outputs are distinct for distinct states, so keys never repeat.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// Slack on the memory bound (see `report`), beyond one more doubling of the map's table:
/// a share of the documented figure for uneven shards (one that fills past its table's load
/// limit grows by load before tombstones double it), a shard's old and new tables side by side
/// while it resizes, and `sweep()`'s list of one shard's expired keys.
const UNEVEN: f64 = 0.10;
/// RSS only: malloc's header and rounding on each key's one allocation (48 B asked, a 64 B
/// chunk with glibc on x86-64), and a fixed allowance for thread stacks and malloc's
/// per-thread arenas. (RSS is also allowed one table's worth that malloc keeps after a shard's
/// table is replaced by a larger or smaller one.)
const MALLOC_OVERHEAD: f64 = 16.0;
const FIXED_RSS: f64 = 4.0 * 1024.0 * 1024.0;
/// The node's header in front of its state, as the bound counts it: the 8-byte policy
/// pointer and 8 bytes of key. (An `Ipv6Addr` key's other 8 bytes and the node's alignment
/// fall to the table's share instead, which only loosens the bound.)
const ARC_COUNTS: f64 = 16.0;
/// The share of the heap the spray added that the first sweep after it must give back.
const RETURNED: f64 = 0.95;
/// Heap a sweep may keep however little the spray added (64 KiB).
const KEPT_ALLOWANCE: f64 = 65_536.0;

fn addr(prefix: u64, low: u64) -> Ipv6Addr {
    Ipv6Addr::from((u128::from(prefix) << 64) | u128::from(low))
}

/// The `i`-th spray address.
fn spray_key(i: u64) -> Ipv6Addr {
    addr(ATTACKER, Rng(SEED.wrapping_add(i.wrapping_mul(GAMMA))).next())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn signed_mib(bytes: i64) -> String {
    format!("{:+.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn rss_now() -> u64 {
    rss::resident_bytes().unwrap_or(0)
}

fn heap_now() -> u64 {
    heap() as u64
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

struct Args {
    keys: u64,
    max_keys: usize,
    quick: bool,
    baseline: bool,
}

/// key spraying: one request from each of many random IPv6 addresses at a limiter capped
/// at --max-keys; exits non-zero if a documented bound is broken.
#[derive(argh::FromArgs)]
struct Flags {
    /// a smaller spray: 1,000,000 addresses at 100,000 keys (CI)
    #[argh(switch)]
    quick: bool,
    /// addresses sprayed, `_` allowed (default 10_000_000; 1_000_000 with --quick)
    #[argh(option, from_str_fn(count))]
    keys: Option<u64>,
    /// the limiter's max_keys, `_` allowed (default 1_000_000; 100_000 with --quick)
    #[argh(option, from_str_fn(count))]
    max_keys: Option<u64>,
    /// internal: measure heap and RSS per key of --max-keys keys, in this process
    #[argh(switch)]
    baseline: bool,
}

/// A count, `_` between digits allowed.
fn count(value: &str) -> Result<u64, String> {
    value.replace('_', "").parse().map_err(|_| format!("not a number: {value}"))
}

fn args() -> Result<Args, Error> {
    let Flags { quick, keys, max_keys, baseline } = argh::from_env();
    let keys = keys.unwrap_or(if quick { 1_000_000 } else { 10_000_000 });
    let max_keys = max_keys.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    if max_keys == 0 || keys == 0 {
        return Err("--keys and --max-keys must be positive".into());
    }
    Ok(Args { keys, max_keys: max_keys as usize, quick, baseline })
}

fn limiter(clock: &ManualClock, max_keys: Option<usize>) -> Result<Limiter<Ipv6Addr>, Error> {
    let mut builder = Limiter::<Ipv6Addr>::builder().limit(Limit::per_second(10)).clock(clock.clone());
    if let Some(max) = max_keys {
        builder = builder.max_keys(max);
    }
    Ok(builder.build()?)
}

/// `--baseline`: in a fresh process, heap and RSS per key of `max_keys` keys inserted into a
/// fresh limiter (the way `tools/src/bin/memory.rs` measures), for `Ipv6Addr` keys, then heap per
/// key for `u64` keys. Prints one line for the parent.
fn baseline(keys: usize) -> Result<(), Error> {
    let (heap0, rss0) = (heap_now(), rss_now());
    let clock = ManualClock::new();
    let ipv6 = limiter(&clock, None)?;
    for i in 0..keys as u64 {
        let _ = ipv6.check(&addr(BASELINE, Rng(i.wrapping_mul(GAMMA)).next()));
    }
    let heap_per_key = (heap_now() - heap0) as f64 / keys as f64;
    let rss_per_key = rss_now().saturating_sub(rss0) as f64 / keys as f64;
    let state = ipv6.state_bytes_per_key();
    drop(ipv6);
    let heap1 = heap_now();
    let words = Limiter::<u64>::builder().limit(Limit::per_second(10)).clock(clock).build()?;
    for k in 0..keys as u64 {
        let _ = words.check(&k);
    }
    let u64_per_key = (heap_now() - heap1) as f64 / keys as f64;
    println!("baseline {heap_per_key} {rss_per_key} {state} {u64_per_key}");
    Ok(())
}

/// What `--baseline` measured.
struct Documented {
    heap_per_key: f64,
    rss_per_key: f64,
    state: f64,
    u64_per_key: f64,
}

fn documented(max_keys: usize) -> Result<Documented, Error> {
    let out = Command::new(std::env::current_exe()?)
        .args(["--baseline", "--max-keys", &max_keys.to_string()])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("baseline ")).ok_or("--baseline printed nothing")?;
    let v: Vec<f64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    match v[..] {
        [heap_per_key, rss_per_key, state, u64_per_key] => {
            Ok(Documented { heap_per_key, rss_per_key, state, u64_per_key })
        }
        _ => Err("--baseline: bad line".into()),
    }
}

/// Keys held, heap and RSS at one point.
struct Row {
    phase: String,
    held: usize,
    heap: u64,
    rss: u64,
}

impl Row {
    fn now(phase: impl Into<String>, limiter: &Limiter<Ipv6Addr>) -> Row {
        Row { phase: phase.into(), held: limiter.len(), heap: heap_now(), rss: rss_now() }
    }
}

/// Counters the threads fill.
#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    too_many: AtomicU64,
    other: AtomicU64,
    legit_checks: AtomicU64,
    legit_admitted: AtomicU64,
    mismatches: AtomicU64,
    sweeps: AtomicU64,
    swept: AtomicU64,
    max_held: AtomicUsize,
}

/// What the driver saw.
#[derive(Default)]
struct Seen {
    pre: Option<Row>,
    /// Every tenth of the spray: simulated s, keys held, heap, RSS, admitted, refused.
    timeline: Vec<(f64, usize, u64, u64, u64, u64)>,
    peak_heap: u64,
    peak_rss: u64,
    after: Vec<Row>,
    sweep_took: Duration,
    sweep_peak_heap: u64,
    sweep_peak_rss: u64,
    sweep_heap_before: u64,
}

/// The spray threads, the legitimate thread and the main thread meet at `barrier` around
/// every tick; the main thread moves the clock only between ticks, while the others wait.
struct Run<'a> {
    keys: u64,
    per_tick: u64,
    spray_ticks: u64,
    limited: &'a Limiter<Ipv6Addr>,
    twin: &'a Limiter<Ipv6Addr>,
    counts: &'a Counts,
    /// The tick the workers are to run, `u64::MAX` to stop.
    tick: &'a AtomicU64,
    barrier: &'a Barrier,
    mismatch: &'a Mutex<Option<String>>,
}

impl Run<'_> {
    /// Waits for the next tick; `None` to stop.
    fn next(&self) -> Option<u64> {
        self.barrier.wait();
        let k = self.tick.load(Ordering::Acquire);
        (k != u64::MAX).then_some(k)
    }

    fn spray(&self, thread: u64) {
        while let Some(k) = self.next() {
            if (1..=self.spray_ticks).contains(&k) {
                let start = (k - 1) * self.per_tick;
                let end = (start + self.per_tick).min(self.keys);
                let share = (end - start).div_ceil(SPRAY_THREADS as u64);
                let (from, to) = (start + thread * share, (start + (thread + 1) * share).min(end));
                let (mut admitted, mut too_many, mut other) = (0, 0, 0);
                for i in from..to {
                    match self.limited.check(&spray_key(i)).denial() {
                        None => admitted += 1,
                        Some(Denial::TooManyKeys) => too_many += 1,
                        Some(_) => other += 1,
                    }
                }
                let c = self.counts;
                c.admitted.fetch_add(admitted, Ordering::Relaxed);
                c.too_many.fetch_add(too_many, Ordering::Relaxed);
                c.other.fetch_add(other, Ordering::Relaxed);
                c.max_held.fetch_max(self.limited.len(), Ordering::Relaxed);
            }
            self.barrier.wait();
        }
    }

    fn legit(&self) {
        let mut rng = Rng(SEED ^ 0x1E61);
        while let Some(k) = self.next() {
            let (mut checks, mut admitted, mut wrong) = (0, 0, 0);
            for key in (0..LEGIT_KEYS).map(|i| addr(LEGIT, i)) {
                for _ in 0..LEGIT_CHECKS {
                    let cost = 1 + rng.below(2);
                    let (ours, theirs) = (self.limited.check_n(&key, cost), self.twin.check_n(&key, cost));
                    checks += 1;
                    admitted += u64::from(ours.is_allowed());
                    if ours != theirs {
                        wrong += 1;
                        if let Ok(mut first) = self.mismatch.lock() {
                            first.get_or_insert_with(|| {
                                format!("tick {k}, {key}, cost {cost}: {ours:?}, the twin {theirs:?}")
                            });
                        }
                    }
                }
            }
            let c = self.counts;
            c.legit_checks.fetch_add(checks, Ordering::Relaxed);
            c.legit_admitted.fetch_add(admitted, Ordering::Relaxed);
            c.mismatches.fetch_add(wrong, Ordering::Relaxed);
            self.barrier.wait();
        }
    }

    /// Runs tick `k` on the workers, after moving the clock by one tick if `advance`.
    fn tick(&self, clock: &ManualClock, k: &mut u64, advance: bool) {
        if advance {
            clock.advance(TICK);
        }
        self.tick.store(*k, Ordering::Release);
        self.barrier.wait();
        self.barrier.wait();
        *k += 1;
    }

    /// The main thread's part: the ticks, the measurements and the sweeps after the spray.
    fn drive(&self, clock: &ManualClock, spraying: &AtomicBool, sweeper: impl FnOnce()) -> Seen {
        let mut seen = Seen::default();
        let limited = self.limited;
        let mut k = 0;
        self.tick(clock, &mut k, false); // tick 0: the legitimate keys arrive
        seen.pre = Some(Row::now("before the spray (legitimate keys only)", limited));
        counting_alloc::reset_peak();
        rss::reset_peak();
        let every = (self.spray_ticks / 10).max(1);
        for t in 1..=self.spray_ticks {
            self.tick(clock, &mut k, true);
            if t % every == 0 || t == self.spray_ticks {
                let c = self.counts;
                seen.timeline.push((
                    t as f64 / TICKS_PER_SECOND as f64,
                    limited.len(),
                    heap_now(),
                    rss_now(),
                    c.admitted.load(Ordering::Relaxed),
                    c.too_many.load(Ordering::Relaxed),
                ));
            }
        }
        spraying.store(false, Ordering::Release);
        sweeper();
        seen.peak_heap = peak_heap() as u64;
        seen.peak_rss = rss::peak_resident_bytes().unwrap_or(0);
        seen.after.push(Row::now("end of the spray (sweeper thread stopped)", limited));
        for _ in 0..DRAIN_TICKS {
            self.tick(clock, &mut k, true);
        }
        let later = format!("{} s later, legitimate traffic only, not swept", DRAIN_TICKS / TICKS_PER_SECOND);
        seen.after.push(Row::now(later, limited));
        counting_alloc::reset_peak();
        rss::reset_peak();
        seen.sweep_heap_before = heap_now();
        let t0 = Instant::now();
        let evicted = limited.sweep();
        seen.sweep_took = t0.elapsed();
        seen.sweep_peak_heap = peak_heap() as u64;
        seen.sweep_peak_rss = rss::peak_resident_bytes().unwrap_or(0);
        seen.after.push(Row::now(format!("after `sweep()` 1 (evicted {})", n(evicted as u64)), limited));
        let evicted = limited.sweep();
        seen.after.push(Row::now(format!("after `sweep()` 2 (evicted {})", n(evicted as u64)), limited));
        for _ in 0..AFTER_TICKS {
            self.tick(clock, &mut k, true);
        }
        let later = format!("{} s more legitimate traffic", AFTER_TICKS / TICKS_PER_SECOND);
        seen.after.push(Row::now(later, limited));
        self.tick.store(u64::MAX, Ordering::Release);
        self.barrier.wait();
        seen
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("spray: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool, Error> {
    let args = args()?;
    if args.baseline {
        baseline(args.max_keys)?;
        return Ok(true);
    }
    let started = Instant::now();
    let doc = documented(args.max_keys)?;
    let per_tick = (args.max_keys as u64).div_ceil(TICKS_PER_SECOND as u64);
    let clock = ManualClock::new();
    let limited = limiter(&clock, Some(args.max_keys))?;
    let twin = limiter(&clock, None)?;
    let counts = Counts::default();
    let (tick, barrier, mismatch) = (AtomicU64::new(0), Barrier::new(SPRAY_THREADS + 2), Mutex::new(None));
    let spraying = AtomicBool::new(true);
    let run = Run {
        keys: args.keys,
        per_tick,
        spray_ticks: args.keys.div_ceil(per_tick),
        limited: &limited,
        twin: &twin,
        counts: &counts,
        tick: &tick,
        barrier: &barrier,
        mismatch: &mismatch,
    };
    let seen = thread::scope(|s| {
        for j in 0..SPRAY_THREADS as u64 {
            let run = &run;
            s.spawn(move || run.spray(j));
        }
        s.spawn(|| run.legit());
        // The sweeper: one sweep each time the clock has moved, racing that tick's checks
        // (the background sweeper's cadence, one sweep per shortest window or less, would be
        // one every ten ticks).
        let sweeper = s.spawn(|| {
            let mut swept_at = None;
            while spraying.load(Ordering::Acquire) {
                let now = clock.now();
                if swept_at == Some(now) {
                    thread::sleep(Duration::from_micros(200));
                    continue;
                }
                swept_at = Some(now);
                let evicted = limited.sweep();
                counts.sweeps.fetch_add(1, Ordering::Relaxed);
                counts.swept.fetch_add(evicted as u64, Ordering::Relaxed);
            }
        });
        run.drive(&clock, &spraying, || {
            let _ = sweeper.join();
        })
    });
    let first_mismatch = mismatch.lock().ok().and_then(|mut m| m.take());
    Ok(report(&args, &doc, &counts, &seen, first_mismatch, started.elapsed()))
}

/// Prints the tables and returns the verdict.
fn report(
    args: &Args,
    doc: &Documented,
    counts: &Counts,
    seen: &Seen,
    first_mismatch: Option<String>,
    took: Duration,
) -> bool {
    let max_keys = args.max_keys as u64;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (admitted, too_many, other) = (load(&counts.admitted), load(&counts.too_many), load(&counts.other));
    let mismatches = load(&counts.mismatches);
    let max_held = counts.max_held.load(Ordering::Relaxed) as u64;
    let Some(pre) = &seen.pre else { return false };
    let quick = if args.quick { " -- --quick" } else { "" };
    println!(
        "Key spraying, `cargo run --release -p slidegate-tools --bin spray{quick}`: {} IPv6 addresses from one /64, \
         one request each, at `10/s` per key with `max_keys({})`; {} new addresses per simulated \
         second (ticks of 100 ms); {SPRAY_THREADS} spray threads, {} legitimate keys on a third, a \
         sweeper thread; {:.1} s.\n",
        n(args.keys),
        n(max_keys),
        n(max_keys),
        n(LEGIT_KEYS),
        took.as_secs_f64(),
    );
    println!("| spray | |\n|---|---:|");
    println!("| addresses sent | {} |", n(args.keys));
    println!("| admitted (a key's first request) | {} ({:.1}%) |", n(admitted), pct(admitted, args.keys));
    println!("| refused with `TooManyKeys` | {} ({:.1}%) |", n(too_many), pct(too_many, args.keys));
    if other > 0 {
        println!("| refused otherwise | {} |", n(other));
    }
    println!("| most keys held / `max_keys` | {} / {} |", n(max_held), n(max_keys));
    println!(
        "| sweeper thread | {} sweeps, {} keys evicted |",
        n(load(&counts.sweeps)),
        n(load(&counts.swept))
    );
    let legit = load(&counts.legit_checks);
    println!(
        "| legitimate decisions, each compared with the twin | {} ({:.1}% admitted), **{} differ** |",
        n(legit),
        pct(load(&counts.legit_admitted), legit),
        n(mismatches)
    );

    // The bound, per `max_keys` key: the documented figure, plus one more doubling of the
    // map's table (the documented figure less the state's allocation), plus `UNEVEN` of the
    // documented figure; RSS also pays malloc's overhead on the state's allocation, one table's
    // worth of freed tables that malloc keeps, and `FIXED_RSS`.
    let table = doc.heap_per_key - (doc.state + ARC_COUNTS);
    let heap_slack = table + UNEVEN * doc.heap_per_key;
    let rss_slack = heap_slack + MALLOC_OVERHEAD + table;
    let heap_bound = (doc.heap_per_key + heap_slack) * max_keys as f64;
    let rss_bound = (doc.heap_per_key + rss_slack) * max_keys as f64 + FIXED_RSS;
    let heap_grew = seen.peak_heap.saturating_sub(pre.heap);
    let rss_grew = seen.peak_rss.saturating_sub(pre.rss);
    println!(
        "\nMemory during the spray. Documented bytes/key: a fresh limiter with {} `Ipv6Addr` keys, \
         measured as `tools/src/bin/memory.rs` measures (in a fresh process; `u64` keys there: {:.0} B, \
         state {:.0} B). Slack per key, heap: {table:.0} B for one more doubling of the map's table \
         (the documented figure less the state's {:.0} B allocation: under churn the key \
         table's tombstones can double a shard's array once, see `src/table/`) and {:.0}% of the documented \
         figure (uneven shards, a shard's two tables while it resizes, `sweep()`'s list of one \
         shard's expired keys); RSS also {MALLOC_OVERHEAD:.0} B of malloc header and rounding on \
         the state's allocation, {table:.0} B for replaced tables that malloc keeps, and {} for \
         thread stacks and malloc's arenas.\n",
        n(max_keys),
        doc.u64_per_key,
        doc.state,
        doc.state + ARC_COUNTS,
        UNEVEN * 100.0,
        mib(FIXED_RSS as u64),
    );
    println!("| | heap | RSS |\n|---|---:|---:|");
    println!(
        "| before the spray ({} legitimate keys, twin included) | {} | {} |",
        n(LEGIT_KEYS),
        mib(pre.heap),
        mib(pre.rss)
    );
    println!("| peak during the spray | {} | {} |", mib(seen.peak_heap), mib(seen.peak_rss));
    println!("| growth, peak − before | {} | {} |", mib(heap_grew), mib(rss_grew));
    println!(
        "| growth per `max_keys` key | {:.0} B | {:.0} B |",
        heap_grew as f64 / max_keys as f64,
        rss_grew as f64 / max_keys as f64
    );
    println!("| documented per key | {:.0} B | {:.0} B |", doc.heap_per_key, doc.rss_per_key);
    println!(
        "| bound per key: documented heap + slack | {:.0} + {heap_slack:.0} B | {:.0} + {rss_slack:.0} B |",
        doc.heap_per_key, doc.heap_per_key
    );
    println!(
        "| bound: per key × `max_keys` (+ fixed) | {} | {} + {} |",
        mib(heap_bound as u64),
        mib((rss_bound - FIXED_RSS) as u64),
        mib(FIXED_RSS as u64)
    );
    println!(
        "\n| simulated s | keys held | heap | RSS | heap/key held | RSS/key held | admitted | refused |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(t, held, heap, rss, admitted, refused) in &seen.timeline {
        let extra = held.saturating_sub(LEGIT_KEYS as usize).max(1) as f64;
        println!(
            "| {t:.1} | {} | {} | {} | {:.0} B | {:.0} B | {} | {} |",
            n(held as u64),
            mib(heap),
            mib(rss),
            heap.saturating_sub(pre.heap) as f64 / extra,
            rss.saturating_sub(pre.rss) as f64 / extra,
            n(admitted),
            n(refused)
        );
    }

    println!("\nAfter the spray:\n");
    println!("| | keys held | heap | RSS | heap − before the spray | RSS − before the spray |");
    println!("|---|---:|---:|---:|---:|---:|");
    for row in &seen.after {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.phase,
            n(row.held as u64),
            mib(row.heap),
            mib(row.rss),
            signed_mib(row.heap as i64 - pre.heap as i64),
            signed_mib(row.rss as i64 - pre.rss as i64)
        );
    }
    let spike = seen.sweep_peak_heap.saturating_sub(seen.sweep_heap_before);
    println!(
        "\n`sweep()` 1 took {:.0} ms; heap peaked {} above its level before the sweep, RSS peaked at {}.",
        seen.sweep_took.as_secs_f64() * 1e3,
        mib(spike),
        mib(seen.sweep_peak_rss)
    );

    // Verdicts.
    let mut ok = true;
    let swept = seen.after.iter().find(|r| r.phase.starts_with("after `sweep()` 1"));
    let added = heap_grew as f64;
    let kept = swept.map_or(f64::INFINITY, |r| r.heap.saturating_sub(pre.heap) as f64);
    let returned = if added > 0.0 { 1.0 - kept / added } else { 1.0 };
    println!();
    let mut verdict = |pass: bool, what: String| {
        println!("- {}: {what}", if pass { "ok" } else { "FAILED" });
        ok &= pass;
    };
    verdict(
        heap_grew as f64 <= heap_bound,
        format!("heap growth {} ≤ bound {}", mib(heap_grew), mib(heap_bound as u64)),
    );
    verdict(
        rss_grew as f64 <= rss_bound,
        format!("RSS growth {} ≤ bound {}", mib(rss_grew), mib(rss_bound as u64)),
    );
    verdict(
        max_held <= max_keys,
        format!("keys held never above max_keys ({} ≤ {})", n(max_held), n(max_keys)),
    );
    verdict(too_many > 0, format!("refusals visible ({} `TooManyKeys`)", n(too_many)));
    verdict(
        mismatches == 0,
        format!("legitimate decisions identical to the twin's ({} differ)", n(mismatches)),
    );
    // A spray whose keys never fit (legitimate keys hold all of `max_keys`) adds next to
    // nothing, and a ratio of next to nothing is noise: what may stay is the larger of the
    // ratio's remainder and a small absolute allowance.
    verdict(
        kept <= (added * (1.0 - RETURNED)).max(KEPT_ALLOWANCE),
        format!(
            "sweep 1 gave back {:.1}% of the heap the spray added, {:.0} KiB kept (≥ {:.0}% required, or at most {:.0} KiB kept)",
            100.0 * returned,
            kept / 1024.0,
            100.0 * RETURNED,
            KEPT_ALLOWANCE / 1024.0
        ),
    );
    if let Some(first) = first_mismatch {
        println!("first difference: {first}");
    }
    ok
}
