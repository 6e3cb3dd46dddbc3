//! The checker's own model of each algorithm, from the semantics guide and the limits'
//! numbers (no code of the library's): when does a request fit, given units placed at
//! known times.

use crate::workload::{Model, Spec, MAX_SLOTS};

/// The earliest time `>= l` at which `cost` more units fit `spec` (whose `max` is `max`)
/// under a window model, given the units already counted, placed at the given times (all
/// `<= l`). More units, or units placed later, never make it earlier.
pub fn earliest(model: Model, spec: &Spec, max: u64, units: &[(u64, u64)], l: u64, cost: u64) -> u64 {
    match model {
        Model::Strict | Model::Interpolated => sliding(model, spec, max, units, l, cost),
        Model::Fixed => {
            let w = spec.window;
            let m = l / w;
            let used: u64 = units.iter().filter(|&&(t, _)| t / w == m).map(|&(_, c)| c).sum();
            if used + cost <= max {
                l
            } else {
                (m + 1) * w
            }
        }
        Model::Log => {
            // A unit at t counts while T < t + w.
            let w = spec.window;
            let mut inside: Vec<u64> = Vec::new();
            for &(t, c) in units {
                if t + w > l {
                    inside.extend(std::iter::repeat_n(t, c as usize));
                }
            }
            let excess = (inside.len() as u64 + cost).saturating_sub(max);
            if excess == 0 {
                return l;
            }
            inside.sort_unstable();
            inside.get(excess as usize - 1).map_or(l, |&t| (t + w).max(l))
        }
        Model::Gcra => l, // from the order of admissions: `gcra_lower` / `gcra_upper`
    }
}

fn sliding(model: Model, spec: &Spec, max: u64, units: &[(u64, u64)], l: u64, cost: u64) -> u64 {
    // Units per slot, for the slots that can still count at any T >= l: `base` … `k0`
    // (every unit is placed at or before l).
    let (p, n) = (spec.precision, spec.slots());
    let k0 = l / p;
    let base = k0.saturating_sub(n + 1);
    let mut per_slot = [0u64; MAX_SLOTS + 2];
    for &(t, c) in units {
        let s = (t / p).min(k0);
        if s >= base {
            per_slot[(s - base) as usize] += c;
        }
    }
    // Units in slots `from ..= k0`, `from` >= base.
    let from_slot = |from: u64| -> u64 { per_slot[(from.max(base) - base) as usize..].iter().sum() };
    let in_slot = |s: u64| if s >= base { per_slot[(s - base) as usize] } else { 0 };
    for k in k0..=k0 + n + 1 {
        let from = if k == k0 { l - k0 * p } else { 0 };
        if model == Model::Strict {
            // At time T in slot k, slots k − n … k count whole.
            if from_slot(k.saturating_sub(n)) + cost <= max {
                return k * p + from;
            }
            continue;
        }
        // Interpolated: at T, e ns into slot k, slots k − n + 1 … k count whole and slot
        // k − n weighted by (p − e) / p; `cost` fits if whole + cost ≤ max and
        // oldest × (p − e) ≤ (max − whole − cost) × p.
        let whole = from_slot((k + 1).saturating_sub(n));
        let oldest = if k >= n { in_slot(k - n) } else { 0 };
        if whole + cost > max {
            continue;
        }
        if oldest == 0 || whole + cost + oldest <= max {
            return k * p + from;
        }
        let excess = whole + cost + oldest - max;
        if excess >= oldest {
            continue;
        }
        let need = (u128::from(excess) * u128::from(p)).div_ceil(u128::from(oldest));
        let e = (need as u64).max(from);
        if e < p {
            return k * p + e;
        }
    }
    (k0 + n + 2) * p
}

/// One admission (or possible commit) as GCRA's bounds see it: clock bracket, sequence
/// bracket, and units.
#[derive(Debug, Clone, Copy)]
pub struct Unit {
    pub b: u64,
    pub a: u64,
    pub sb: u64,
    pub sa: u64,
    pub units: u64,
}

/// GCRA: after admissions at `t_j` of `c_j` units in commit order, the theoretical arrival
/// time is `max(TAT₀ + T·Σc, max_j (t_j + T·(units committed at or after j)))`. The commit
/// order is known only in part: a lower bound counts after `j` only the units certainly
/// after it (sequence bracket after `j`'s), each placed at its bracket's start; `tat0`
/// bounds what came before all of them.
pub fn gcra_lower(interval: u64, tat0: u64, sure: &[Unit]) -> u64 {
    let total: u64 = sure.iter().map(|x| x.units).sum();
    let mut tat = tat0 + interval * total;
    // Units whose bracket starts after each `sb`, from the sorted starts.
    let (starts, after) = suffix_sums(sure, |x| x.sb);
    for j in sure {
        let later = after[starts.partition_point(|&sb| sb <= j.sa)];
        tat = tat.max(j.b + interval * (j.units + later));
    }
    tat
}

/// The upper bound: every unit possibly after `j` (sequence brackets that overlap or
/// follow), each placed at its bracket's end, capped at `clamp` (no unit that a check
/// counted can carry a time after the check's own end).
pub fn gcra_upper(interval: u64, tat0: u64, maybe: &[Unit], clamp: u64) -> u64 {
    let total: u64 = maybe.iter().map(|x| x.units).sum();
    let mut tat = tat0 + interval * total;
    // Units whose bracket ends after each `sb` (`j`'s own among them: `sa > sb`).
    let (ends, after) = suffix_sums(maybe, |x| x.sa);
    for j in maybe {
        let later = after[ends.partition_point(|&sa| sa <= j.sb)] - j.units;
        tat = tat.max(j.a.min(clamp) + interval * (j.units + later));
    }
    tat
}

/// The units' `key`s, sorted, and for each position the units at it and after it (one
/// more entry, 0, at the end).
fn suffix_sums(units: &[Unit], key: impl Fn(&Unit) -> u64) -> (Vec<u64>, Vec<u64>) {
    let mut sorted: Vec<(u64, u64)> = units.iter().map(|x| (key(x), x.units)).collect();
    sorted.sort_unstable();
    let mut after = vec![0u64; sorted.len() + 1];
    for i in (0..sorted.len()).rev() {
        after[i] = after[i + 1] + sorted[i].1;
    }
    (sorted.into_iter().map(|(k, _)| k).collect(), after)
}

/// GCRA: the earliest time `>= l` at which `cost` fits, for an arrival time `tat`.
pub fn gcra_fits_from(spec: &Spec, tat: u64, l: u64, cost: u64) -> u64 {
    (tat + cost * spec.interval()).saturating_sub(spec.burst()).max(l)
}
