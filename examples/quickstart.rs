//! slidegate at work: `cargo run --release --example quickstart`
//!
//! 1. A gateway policy (10/s, 120/min, 240/h at 1-minute precision) on a simulated clock:
//!    a burst, the refusals with their Retry-After, and why hammering does not burn the
//!    minute budget.
//! 2. The boundary burst that fixed windows let through, refused by the sliding window.
//! 3. Four threads on one key with the real clock: exactly the limit is admitted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use slidegate::{ConfigError, Limit, Limiter, ManualClock};

/// slidegate at work: a gateway policy on a simulated clock, the boundary burst that fixed
/// windows let through, and four threads on one key.
#[derive(argh::FromArgs)]
struct Args {}

fn main() -> Result<(), ConfigError> {
    let Args {} = argh::from_env();
    gateway_policy()?;
    boundary_burst()?;
    threads_on_one_key()?;
    Ok(())
}

fn gateway_policy() -> Result<(), ConfigError> {
    println!("== 1. Policy 10/s + 120/min + 240/h@1min, simulated clock");
    let clock = ManualClock::new();
    let limiter = Limiter::<String>::builder()
        .limit("10/s".parse()?)
        .limit("120/min".parse()?)
        .limit("240/h@1min".parse()?)
        .clock(clock.clone())
        .build()?;

    print!("burst of 13 from user_a at t=0: ");
    for _ in 0..13 {
        let d = limiter.check("user_a");
        print!("{}", if d.is_allowed() { '+' } else { '-' });
    }
    let d = limiter.check("user_a");
    println!(
        "\n  next request: allowed={} denied_by={:?} retry_after={:?} remaining={}",
        d.is_allowed(),
        d.denial(),
        d.retry_after(),
        d.remaining()
    );

    // A client that ignores Retry-After and sends 50 requests per second for 20 s.
    let mut admitted = 0;
    let mut refused = 0;
    for _ in 0..20 * 50 {
        clock.advance(Duration::from_millis(20));
        if limiter.check("user_a").is_allowed() {
            admitted += 1;
        } else {
            refused += 1;
        }
    }
    println!("  then 50 req/s for 20 s: {admitted} admitted, {refused} refused");
    let d = limiter.peek("user_a");
    println!(
        "  only admitted requests count: the 120/min limit holds the 10 + {admitted} admitted, not the \
         {refused} refused (a peek now: allowed={}, limit #{} frees up in {:?})",
        d.is_allowed(),
        d.tightest_limit(),
        d.retry_after()
    );

    let d = limiter.check_n("user_b", 7);
    println!("  a request weighing 7 from user_b: allowed={} remaining={}", d.is_allowed(), d.remaining());
    let d = limiter.check_n("user_b", 500);
    println!("  a request weighing 500: {:?} (can never pass, so no retry_after)", d.denial());
    Ok(())
}

fn boundary_burst() -> Result<(), ConfigError> {
    println!("\n== 2. The boundary burst: 60/min, 60 requests at 0:59 and 60 more at 1:01");
    for (name, limit) in
        [("interpolated (default)", Limit::per_minute(60)), ("strict", Limit::per_minute(60).strict())]
    {
        let clock = ManualClock::new();
        let limiter = Limiter::<u64>::builder().limit(limit).clock(clock.clone()).build()?;
        clock.set(Duration::from_secs(59));
        let first = (0..60).filter(|_| limiter.check(&1).is_allowed()).count();
        clock.set(Duration::from_secs(61));
        let second = (0..60).filter(|_| limiter.check(&1).is_allowed()).count();
        println!(
            "  {name:24} admitted {first} then {second}: {} within 2 s (a fixed window admits 120)",
            first + second
        );
    }
    Ok(())
}

fn threads_on_one_key() -> Result<(), ConfigError> {
    println!("\n== 3. Four threads hammering one key for 300 ms, real clock, limit 1000/min");
    println!("  (the machine's cores are shared by the four threads; see the benches for costs)");
    let limiter = Arc::new(Limiter::<u64>::builder().limit(Limit::per_minute(1000)).build()?);
    let admitted = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, admitted, checks) = (limiter.clone(), admitted.clone(), checks.clone());
            thread::spawn(move || {
                let (mut mine, mut allowed) = (0, 0);
                while started.elapsed() < Duration::from_millis(300) {
                    for _ in 0..256 {
                        mine += 1;
                        allowed += u64::from(limiter.check(&42).is_allowed());
                    }
                }
                checks.fetch_add(mine, Ordering::Relaxed);
                admitted.fetch_add(allowed, Ordering::Relaxed);
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "  {} checks in {elapsed:.2} s, {} admitted: exactly the limit",
        checks.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
    );
    Ok(())
}
