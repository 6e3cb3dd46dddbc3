//! A full table and new clients: `cargo run --release -p slidegate-tools --bin room [-- --quick] [--max-keys M]`.
//!
//! Three sprays of new keys at a limiter of `10/s` per key (a key is idle 2 s after its last
//! unit) capped at `--max-keys` (1,000,000; `--quick` 100,000), on a [`ManualClock`] in ticks
//! of 100 ms, with no sweep at all (no sweeper thread runs on a manual clock):
//!
//! 1. **Idle table.** `max_keys` keys are checked once, then the clock moves 3 s (all idle).
//!    A spray of 10 × `max_keys` new keys arrives at `max_keys / 4` per second (40 s), with
//!    100 new legitimate clients per tick. At most 2 s of spray and clients, 52 % of the
//!    table, is live at any time, so new clients must get in throughout. The bound, argued
//!    from the search (`src/table/room.rs`): a new key looks at 36 keys sampled at random
//!    in three shards (and 12 at their hands), and in a shard of about `max_keys / 64` keys
//!    the idle share stays above 0.44 (0.48 on average, less three standard deviations of a
//!    shard's share), so a search finds none with odds below `0.56^36` ≈ 1e-9: over 40,000
//!    clients far fewer than one refusal is expected, and more than 3 has odds below
//!    1e-20. So at most 3 clients may be refused. The table must never hold more than `max_keys`, and the
//!    heap's peak must stay within 10 % of the heap with the table full at the start (a
//!    shard's array rebuilt beside the old one, nodes waiting for their grace period).
//! 2. **Live table, `WhenFull::Refuse`.** `max_keys` keys, each checked once a second
//!    (staggered over the ticks, so all stay live), while 10 × `max_keys` new keys arrive over
//!    10 s. Bounds: every new key refused `TooManyKeys`, and every held key's decision the
//!    same as a twin limiter's (same limit and clock, no spray, no `max_keys`).
//! 3. **Live table, `WhenFull::EvictLeastRecent`.** The same traffic. Bound: every new key
//!    admitted and the table never above `max_keys`; reported: how many held keys' decisions
//!    differ from the twin's (an evicted key's windows restart).
//!
//! Reported beside each: ns per spray check (wall time over the spray's checks, one thread)
//! and ns per held key's check in the same ticks. Exits non-zero if a bound breaks.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use slidegate::{ConfigError, Denial, Limit, Limiter, ManualClock, WhenFull};
use slidegate_tools::counting_alloc::{self, live_bytes as heap, peak_bytes as peak_heap, Counting};
use slidegate_tools::thousands as n;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_SECOND: u64 = 10;
/// New legitimate clients per tick in the idle-table spray.
const NEW_CLIENTS: u64 = 100;
/// The spray keys' offset, far from the held keys and the new clients.
const SPRAY: u64 = 1 << 40;
const CLIENTS: u64 = 1 << 41;
/// The idle-table spray's heap may peak this much above the full table's heap.
const HEAP_SLACK: f64 = 0.10;
/// New clients the idle-table spray may refuse (module docs: the search's odds).
const REFUSED_CLIENTS: u64 = 3;

/// a full table and new clients: sprays of new keys against idle and live tables, with no
/// sweep; exits non-zero if a bound breaks
#[derive(argh::FromArgs)]
struct Flags {
    /// a smaller table: 100,000 keys (CI)
    #[argh(switch)]
    quick: bool,
    /// the limiter's max_keys, `_` allowed (default 1_000_000; 100_000 with --quick)
    #[argh(option, from_str_fn(count))]
    max_keys: Option<u64>,
}

fn count(value: &str) -> Result<u64, String> {
    value.replace('_', "").parse().map_err(|_| format!("not a number: {value}"))
}

fn limiter(
    clock: &ManualClock,
    max_keys: Option<u64>,
    when_full: WhenFull,
) -> Result<Limiter<u64>, ConfigError> {
    let mut builder =
        Limiter::<u64>::builder().limit(Limit::per_second(10)).clock(clock.clone()).when_full(when_full);
    if let Some(max) = max_keys {
        builder = builder.max_keys(max as usize);
    }
    builder.build()
}

fn ns_per(took: Duration, checks: u64) -> f64 {
    took.as_nanos() as f64 / checks.max(1) as f64
}

fn main() -> ExitCode {
    let Flags { quick, max_keys } = argh::from_env();
    let max = max_keys.unwrap_or(if quick { 100_000 } else { 1_000_000 }).max(1000);
    let quick_flag = if quick { " -- --quick" } else { "" };
    let started = Instant::now();
    let run = || -> Result<bool, ConfigError> {
        let mut ok = idle_table(max)?;
        ok &= live_table(max, WhenFull::Refuse)?;
        ok &= live_table(max, WhenFull::EvictLeastRecent)?;
        Ok(ok)
    };
    let ok = match run() {
        Ok(ok) => ok,
        Err(e) => {
            eprintln!("room: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "\n`cargo run --release -p slidegate-tools --bin room{quick_flag}`: `max_keys({})`, `10/s` per key, \
         `u64` keys, a manual clock in ticks of 100 ms, no sweep, one thread; {:.1} s. {}",
        n(max),
        started.elapsed().as_secs_f64(),
        if ok { "Every bound held." } else { "**A bound broke.**" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Scenario 1 (module docs).
fn idle_table(max: u64) -> Result<bool, ConfigError> {
    let clock = ManualClock::new();
    let limiter = limiter(&clock, Some(max), WhenFull::Refuse)?;
    for key in 0..max {
        let _ = limiter.check(&key);
    }
    let full_heap = heap();
    clock.advance(Duration::from_secs(3));
    counting_alloc::reset_peak();
    let per_tick = max / 4 / TICKS_PER_SECOND;
    let seconds = 10 * max / (per_tick * TICKS_PER_SECOND);
    let (mut sprayed, mut spray_in, mut clients, mut clients_in, mut most) = (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut worst_second = 100.0f64;
    let mut spray_time = Duration::ZERO;
    for second in 0..seconds {
        let (mut arrived, mut admitted) = (0u64, 0u64);
        for tick in 0..TICKS_PER_SECOND {
            let t0 = Instant::now();
            for _ in 0..per_tick {
                spray_in += u64::from(limiter.check(&(SPRAY + sprayed)).is_allowed());
                sprayed += 1;
            }
            spray_time += t0.elapsed();
            for c in 0..NEW_CLIENTS {
                let key = CLIENTS + (second * TICKS_PER_SECOND + tick) * NEW_CLIENTS + c;
                admitted += u64::from(limiter.check(&key).is_allowed());
                arrived += 1;
            }
            most = most.max(limiter.len());
            clock.advance(TICK);
        }
        clients += arrived;
        clients_in += admitted;
        worst_second = worst_second.min(100.0 * admitted as f64 / arrived as f64);
    }
    let peak = peak_heap() as u64;
    let grew = peak as f64 / full_heap as f64 - 1.0;
    let refused = clients - clients_in;
    let (all_in, bounded, small) = (refused <= REFUSED_CLIENTS, most as u64 <= max, grew <= HEAP_SLACK);
    println!("### 1. A table full of idle keys\n");
    println!(
        "{} keys checked once, then 3 s later (all idle) {} new keys over {seconds} s ({} a second) and {} new \
         clients a second, with no sweep.\n",
        n(max),
        n(sprayed),
        n(per_tick * TICKS_PER_SECOND),
        n(NEW_CLIENTS * TICKS_PER_SECOND),
    );
    println!("| | figure | bound |\n|---|---:|---|");
    println!(
        "| new clients admitted | {} of {} ({:.2} % in the worst second) | at most {REFUSED_CLIENTS} refused: {} |",
        n(clients_in),
        n(clients),
        worst_second,
        verdict(all_in)
    );
    println!("| spray keys admitted | {} of {} | — |", n(spray_in), n(sprayed));
    println!("| most keys held | {} | ≤ {}: {} |", n(most as u64), n(max), verdict(bounded));
    println!(
        "| heap: full table at the start / peak during the spray | {:.1} / {:.1} MiB (+{:.1} %) | ≤ +{:.0} %: {} |",
        full_heap as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        grew * 100.0,
        HEAP_SLACK * 100.0,
        verdict(small)
    );
    println!(
        "| ns per spray check (each takes an idle key's place) | {:.0} ns | — |\n",
        ns_per(spray_time, sprayed)
    );
    Ok(all_in && bounded && small)
}

/// Scenarios 2 and 3 (module docs).
fn live_table(max: u64, when_full: WhenFull) -> Result<bool, ConfigError> {
    let clock = ManualClock::new();
    let twin = limiter(&clock, None, WhenFull::Refuse)?;
    let limiter = limiter(&clock, Some(max), when_full)?;
    for key in 0..max {
        let _ = (limiter.check(&key), twin.check(&key));
    }
    let per_tick = max / TICKS_PER_SECOND;
    let (mut sprayed, mut spray_in, mut spray_full, mut most) = (0u64, 0u64, 0u64, 0usize);
    let (mut held_checks, mut differ) = (0u64, 0u64);
    let (mut spray_time, mut held_time) = (Duration::ZERO, Duration::ZERO);
    for tick in 0..10 * TICKS_PER_SECOND {
        clock.advance(TICK);
        // Held keys: a tenth of them each tick, so each is checked once a second.
        let t0 = Instant::now();
        let mut decisions = Vec::with_capacity(per_tick as usize);
        for key in (tick % TICKS_PER_SECOND..max).step_by(TICKS_PER_SECOND as usize) {
            decisions.push(limiter.check(&key));
        }
        held_time += t0.elapsed();
        for (i, key) in (tick % TICKS_PER_SECOND..max).step_by(TICKS_PER_SECOND as usize).enumerate() {
            held_checks += 1;
            differ += u64::from(decisions.get(i) != Some(&twin.check(&key)));
        }
        let t0 = Instant::now();
        for _ in 0..per_tick {
            let d = limiter.check(&(SPRAY + sprayed));
            spray_in += u64::from(d.is_allowed());
            spray_full += u64::from(d.denial() == Some(Denial::TooManyKeys));
            sprayed += 1;
        }
        spray_time += t0.elapsed();
        most = most.max(limiter.len());
    }
    let bounded = most as u64 <= max;
    let (title, spray_ok, held_ok) = match when_full {
        WhenFull::Refuse => {
            ("2. A table full of live keys, `WhenFull::Refuse`", spray_full == sprayed, differ == 0)
        }
        _ => ("3. A table full of live keys, `WhenFull::EvictLeastRecent`", spray_in == sprayed, true),
    };
    println!("### {title}\n");
    println!(
        "{} keys, each checked once a second, and {} new keys over 10 s ({} a second), with no sweep.\n",
        n(max),
        n(sprayed),
        n(per_tick * TICKS_PER_SECOND),
    );
    println!("| | figure | bound |\n|---|---:|---|");
    match when_full {
        WhenFull::Refuse => println!(
            "| new keys refused `TooManyKeys` | {} of {} | all: {} |",
            n(spray_full),
            n(sprayed),
            verdict(spray_ok)
        ),
        _ => {
            println!("| new keys admitted | {} of {} | all: {} |", n(spray_in), n(sprayed), verdict(spray_ok))
        }
    }
    let held = match when_full {
        WhenFull::Refuse => format!("none: {}", verdict(held_ok)),
        _ => "— (an evicted key's windows restart)".to_owned(),
    };
    println!(
        "| held keys' decisions that differ from the twin's | {} of {} | {held} |",
        n(differ),
        n(held_checks)
    );
    println!("| most keys held | {} | ≤ {}: {} |", n(most as u64), n(max), verdict(bounded));
    println!(
        "| ns per spray check / per held key's check | {:.0} / {:.0} ns | — |\n",
        ns_per(spray_time, sprayed),
        ns_per(held_time, held_checks)
    );
    Ok(spray_ok && held_ok && bounded)
}

fn verdict(held: bool) -> &'static str {
    if held {
        "held"
    } else {
        "**broken**"
    }
}
