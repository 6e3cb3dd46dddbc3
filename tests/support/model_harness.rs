//! The harness of the reference model (`model.rs`, which includes this file): the
//! operations a case runs, and [`run`], which runs them through a `Limiter` on a
//! `ManualClock` and through the [`Model`] side by side and checks every answer.

use super::*;

#[derive(Debug, Clone)]
pub enum Op {
    /// Move the clock forward by this many ns.
    Advance(u64),
    /// Move the clock to the next multiple of `unit` ns, plus `offset` ns.
    Align {
        unit: u64,
        offset: i8,
    },
    /// `check_n(key, cost)`, `times` times in a row.
    Check {
        key: usize,
        cost: u64,
        times: u8,
    },
    Peek {
        key: usize,
    },
    Reset {
        key: usize,
    },
    Sweep,
    /// `set_policy(key, tier)`, `clear_policy(key)`, and a new `max` for every limit of a
    /// tier (`+ bump`, or `- 1` for a bump of 0), through `update_policy`.
    SetPolicy {
        key: usize,
        tier: usize,
    },
    ClearPolicy {
        key: usize,
    },
    UpdateMax {
        tier: usize,
        bump: u64,
    },
    /// `record(key, cost)`: units counted without a check (sliding and fixed windows).
    Record {
        key: usize,
        cost: u64,
    },
    /// `update_policy` of the first policy to `limits`, moving its keys with `carry`
    /// (sliding and fixed windows, without tiers).
    UpdatePolicy {
        limits: Vec<Limit>,
        carry: Carry,
    },
}

/// Compares one decision with the model's, including the `retry_after` property.
pub fn compare(
    model: &Model,
    key: usize,
    cost: u64,
    got: &Decision,
    want: &Expected,
    what: &str,
) -> Result<(), String> {
    let now = model.now;
    ensure_eq!(&Expected::of(got), want, "{} key {} cost {} at {} ns", what, key, cost, now);
    ensure_eq!(got.is_allowed(), want.denial.is_none());
    if let Some(wait) = got.retry_after() {
        // The earliest moment the model admits the same request, to the nanosecond.
        let wait = u64::try_from(wait.as_nanos()).unwrap();
        ensure!(wait > 0, "{} key {} cost {} at {}: refused with retry_after 0", what, key, cost, now);
        ensure!(
            model.admits_all(key, now + wait, cost),
            "{} at {}: not admitted after {} ns",
            what,
            now,
            wait
        );
        ensure!(
            !model.admits_all(key, now + wait - 1, cost),
            "{} at {}: already admitted after {} - 1 ns",
            what,
            now,
            wait
        );
    }
    Ok(())
}

/// `limit` with another `max` (same window, precision and accuracy).
pub fn with_max(limit: &Limit, max: u64) -> Limit {
    let same = Limit::new(max, limit.window()).precision(limit.get_precision());
    if limit.accuracy() == Accuracy::Strict {
        same.strict()
    } else {
        same
    }
}

pub const TIERS: [&str; 3] = ["t0", "t1", "t2"];

/// Runs `ops` through a limiter on a [`ManualClock`] and through the model side by side,
/// both starting at `start` ns (at most [`MAX_TIME`]), and checks every answer: one policy
/// of `limits` (through `.limit()`), or with `tiers`, three policies that differ from
/// `limits` in `max` only, chosen per key by a resolver (key modulo 3). Advances of any
/// size are applied up to `MAX_TIME` (the rest is dropped, for the limiter and the model
/// alike). The first mismatch is returned as an `Err` saying what differed.
pub fn run(
    algorithm: Algorithm,
    limits: &[Limit],
    tiers: bool,
    keys: usize,
    ops: &[Op],
    start: u64,
) -> Result<(), String> {
    ensure!(start <= MAX_TIME, "start {} is beyond MAX_TIME {}", start, MAX_TIME);
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(start));
    let mut builder = Limiter::<u64>::builder().clock(clock.clone()).algorithm(algorithm);
    let mut tier_limits = vec![limits.to_vec()];
    if tiers {
        tier_limits.push(limits.iter().map(|l| with_max(l, l.max() + 3)).collect());
        tier_limits.push(limits.iter().map(|l| with_max(l, (l.max() - 1).max(1))).collect());
        for (name, limits) in TIERS.iter().zip(&tier_limits) {
            builder = builder.policy(name, PolicyConfig::new(limits.iter().copied()));
        }
        builder = builder.resolver(|key: &u64| Some(TIERS[*key as usize % TIERS.len()]));
    } else {
        for limit in limits {
            builder = builder.limit(*limit);
        }
    }
    let limiter = builder.build().map_err(|e| format!("build: {e}"))?;
    ensure_eq!(&limiter.limits(), &limits, "the limiter's limits");
    let rules = |limits: &[Limit]| limits.iter().map(|l| Rule::of(l, algorithm)).collect::<Vec<_>>();
    let mut model = Model::new(tier_limits.iter().map(|l| rules(l)).collect(), keys, start);
    // Records and changes of layout are modelled for the windows (see the module docs).
    let changes = !tiers && matches!(algorithm, Algorithm::SlidingWindow | Algorithm::FixedWindow);

    for (step, op) in ops.iter().enumerate() {
        if let Op::Check { key, .. } | Op::Peek { key } | Op::Record { key, .. } = *op {
            model.look_up(key % keys);
        }
        match *op {
            Op::Advance(by) => {
                let by = by.min(MAX_TIME - model.now);
                clock.advance(Duration::from_nanos(by));
                model.now += by;
            }
            Op::Align { unit, offset } => {
                // The next multiple of `unit` (skipped if it is beyond MAX_TIME).
                let next = (model.now / unit.max(1) + 1).checked_mul(unit);
                let target = next.map_or(u64::MAX, |next| next.saturating_add_signed(i64::from(offset)));
                if target > model.now && target <= MAX_TIME {
                    clock.set(Duration::from_nanos(target));
                    model.now = target;
                }
            }
            Op::Check { key, cost, times } => {
                let key = key % keys;
                for _ in 0..times {
                    let got = limiter.check_n(&(key as u64), cost);
                    let want = model.decide(key, cost, true);
                    compare(&model, key, cost, &got, &want, &format!("step {step} check"))?;
                }
            }
            Op::Peek { key } => {
                let key = key % keys;
                let got = limiter.peek(&(key as u64));
                let want = model.decide(key, 1, false);
                compare(&model, key, 1, &got, &want, &format!("step {step} peek"))?;
            }
            Op::Reset { key } => {
                let key = key % keys;
                let held = limiter.reset(&(key as u64));
                let k = &mut model.keys[key];
                match k.held {
                    Held::Yes => ensure!(held, "step {}: reset of a held key {} said false", step, key),
                    Held::No => {
                        ensure!(!held, "step {}: reset of an absent key {} said true", step, key)
                    }
                    Held::Maybe => {}
                }
                k.held = Held::No;
                model.forget(key);
            }
            Op::Sweep => {
                let before = limiter.len();
                // `must`: held for sure and idle for longer than the longest window plus one
                // of its slots (README), so the windows are empty and the key is evicted.
                // `may`: possibly held and every window empty. Nothing else may go.
                let (mut must, mut may, mut idle) = (Vec::new(), Vec::new(), Vec::new());
                for key in 0..keys {
                    let held = model.keys[key].held;
                    if held == Held::No {
                        continue;
                    }
                    let empty = model.empty(key);
                    let long_idle = model.idle(key).is_some_and(|idle| idle > model.expiry);
                    ensure!(!long_idle || empty, "model: idle key {} not empty", key);
                    if long_idle {
                        idle.push(key);
                        if held == Held::Yes {
                            must.push(key);
                        }
                    }
                    if empty {
                        may.push(key);
                    }
                }
                let evicted = limiter.sweep();
                ensure!(
                    (must.len()..=may.len()).contains(&evicted),
                    "step {} at {}: sweep evicted {}, must {:?}, may {:?}",
                    step,
                    model.now,
                    evicted,
                    must,
                    may
                );
                ensure_eq!(limiter.len(), before - evicted);
                for &key in &may {
                    let held = &mut model.keys[key].held;
                    if idle.contains(&key) || evicted == may.len() {
                        *held = Held::No;
                    } else if evicted > must.len() && *held == Held::Yes {
                        // Some key beyond `must` went; which one is not observable.
                        *held = Held::Maybe;
                    }
                }
            }
            Op::SetPolicy { .. } | Op::ClearPolicy { .. } | Op::UpdateMax { .. } if !tiers => {}
            Op::Record { .. } | Op::UpdatePolicy { .. } if !changes => {}
            Op::SetPolicy { key, tier } => {
                let key = key % keys;
                let tier = tier % TIERS.len();
                limiter.set_policy(&(key as u64), TIERS[tier]).map_err(|e| format!("set_policy: {e}"))?;
                model.set_tier(key, tier);
                model.keys[key].overridden = true;
                ensure_eq!(limiter.policy_of(&(key as u64)), TIERS[tier]);
            }
            Op::ClearPolicy { key } => {
                let key = key % keys;
                let had = limiter.clear_policy(&(key as u64));
                ensure_eq!(had, model.keys[key].overridden);
                if had {
                    model.set_tier(key, key % TIERS.len());
                }
                model.keys[key].overridden = false;
                ensure_eq!(limiter.policy_of(&(key as u64)), TIERS[key % TIERS.len()]);
            }
            Op::Record { key, cost } => {
                let key = key % keys;
                let got = limiter.record(&(key as u64), cost);
                let want = model.record(key, cost);
                compare(&model, key, 0, &got, &want, &format!("step {step} record {cost}"))?;
            }
            Op::UpdatePolicy { ref limits, carry } => {
                let config = PolicyConfig::new(limits.iter().copied());
                limiter
                    .update_policy(DEFAULT_POLICY, config, carry)
                    .map_err(|e| format!("step {step}: update_policy: {e}"))?;
                model.update(0, rules(limits), carry);
            }
            Op::UpdateMax { tier, bump } => {
                let tier = tier % TIERS.len();
                let limits = &mut tier_limits[tier];
                for limit in limits.iter_mut() {
                    let max = if bump == 0 { (limit.max() - 1).max(1) } else { limit.max() + bump };
                    *limit = with_max(limit, max);
                }
                // Only `max` changes: the counts carry over exactly, whatever `Carry` says.
                let config = PolicyConfig::new(limits.iter().copied());
                limiter
                    .update_policy(TIERS[tier], config, Carry::Reset)
                    .map_err(|e| format!("step {step}: update_policy: {e}"))?;
                model.update(tier, rules(limits), Carry::Reset);
            }
        }
        let sure = model.keys.iter().filter(|k| k.held == Held::Yes).count();
        let maybe = model.keys.iter().filter(|k| k.held == Held::Maybe).count();
        let len = limiter.len();
        ensure!((sure..=sure + maybe).contains(&len), "step {}: len {}, held {}+{}?", step, len, sure, maybe);
        ensure_eq!(limiter.is_empty(), len == 0);
    }

    // The accuracy bound, on the log of what the limiter admitted (per life of each key; every
    // limit logs the same admissions). (With tiers, a key's limits change over its life, and
    // records count beyond them: the model's decisions were checked.)
    let changed = ops.iter().any(|op| matches!(op, Op::Record { .. } | Op::UpdatePolicy { .. }));
    for (key, k) in model.keys.iter().enumerate().filter(|_| !tiers && !changed) {
        for log in k.earlier.iter().chain(k.logs.first()) {
            for (i, rule) in model.tiers[0].iter().enumerate() {
                let densest = densest(log, rule.window);
                let exact = rule.algorithm == Algorithm::SlidingLog;
                let sliding = rule.algorithm == Algorithm::SlidingWindow;
                if exact || sliding && rule.strict {
                    ensure!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else if !sliding {
                    // Fixed window and GCRA: a full window's worth on each side of a boundary
                    // (or a full bucket, then its refill).
                    ensure!(densest <= 2 * rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else if rule.strict {
                    ensure!(densest <= rule.max, "key {} limit {}: {} in one window", key, i, densest);
                } else {
                    ensure!(densest < 2 * rule.max, "key {} limit {}: {} in one window", key, i, densest);
                }
            }
        }
    }
    Ok(())
}

/// The most units logged in any interval `[t, t + window)` (the log is in time order).
pub fn densest(log: &[(u64, u64)], window: u64) -> u64 {
    // Two pointers: `inside` holds the units of `log[i..end]`, those before `start + window`.
    let (mut best, mut inside, mut end) = (0, 0, 0);
    for (i, &(start, cost)) in log.iter().enumerate() {
        debug_assert!(i == 0 || log[i - 1].0 <= start, "the log is in time order");
        while end < log.len() && log[end].0 < start + window {
            inside += log[end].1;
            end += 1;
        }
        best = best.max(inside);
        inside -= cost;
    }
    best
}
