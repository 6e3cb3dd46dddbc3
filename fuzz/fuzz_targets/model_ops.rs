//! Fuzz target: a random configuration and a random sequence of operations, run through a
//! limiter and the exact reference model of the property tests (`tests/support/model.rs`,
//! shared): every decision must match the model (admitted, remaining, denial, tightest
//! limit), `retry_after` must be the model's earliest admissible nanosecond, sweeps may
//! evict only empty keys, strict limits and the sliding log never admit more than `max` in
//! any window, and only admitted units count. Any mismatch panics with the model's message.
//!
//! The input is read byte by byte (integers little-endian, missing bytes read as zero), so
//! seeds are easy to write by hand (`fuzz/seeds.py`; `MODEL_OPS_PRINT=1` prints each case
//! as decoded):
//!
//! ```text
//! byte 0       algorithm (bits 0-1: SlidingWindow, FixedWindow, SlidingLog, Gcra),
//!              tiers (bit 2; sliding and fixed windows only), keys - 1 (bits 3-4)
//! byte 1       limits - 1 (0-2, modulo 3)
//! 1 byte each  a limit: index into LIMITS ++ FINE_LIMITS (bits 0-6), strict (bit 7)
//! byte         start: 0 at 0; 1 before a wrap point (u8 pick, u32 ns before);
//!              2 before a wrap point (u8 pick, u32 ms before); 3 anywhere (u64, modulo 2^62 + 1)
//! then ops     one tag byte each (modulo 16), with its operands; at most MAX_OPS ops
//! ```
#![no_main]

use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use slidegate::{Algorithm, Limit};

#[allow(dead_code)]
#[path = "../../tests/support/model.rs"]
mod model;

use model::{wrap_points, Op, FINE_LIMITS, LIMITS, MAX_TIME, NS_PER_MS, NS_PER_S};

/// Bounds each input's work (the property tests draw up to 200 ops too).
const MAX_OPS: usize = 200;

#[derive(Debug)]
struct Case {
    algorithm: Algorithm,
    limits: Vec<Limit>,
    tiers: bool,
    keys: usize,
    start: u64,
    ops: Vec<Op>,
}

/// `n` bytes, little-endian (zero once the input runs out).
fn int(u: &mut Unstructured<'_>, n: u32) -> u64 {
    (0..n).fold(0, |acc, i| acc | u64::from(u.arbitrary::<u8>().unwrap_or(0)) << (8 * i))
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary::<u8>().unwrap_or(0)
}

/// Alignment units: common slot and window lengths, and 2³² slots of each precision in the
/// tables (the next point where that precision's slot tags wrap).
fn align_unit(pick: u8) -> u64 {
    // Every slot (or fixed window) of the tables that wraps before the clock's end, 2⁶² ns.
    const MS: [u64; 7] = [1, 10, 20, 100, 250, 500, 1_000];
    const COMMON: [u64; 7] = [100, 250, 500, 1_000, 10_000, 60_000, 20];
    let pick = usize::from(pick) % (MS.len() + COMMON.len());
    match MS.get(pick) {
        Some(ms) => (ms * NS_PER_MS) << 32,
        None => COMMON[pick - MS.len()] * NS_PER_MS,
    }
}

fn cost(u: &mut Unstructured<'_>) -> u64 {
    let b = byte(u);
    match b % 8 {
        0..=3 => 1,
        4 => u64::from(b >> 3) % 5,
        5 => u64::from(b >> 3) % 12,
        6 => u64::MAX,
        _ => int(u, 8),
    }
}

fn op(u: &mut Unstructured<'_>) -> Op {
    let key = |u: &mut Unstructured<'_>| usize::from(byte(u) % 4);
    match byte(u) % 16 {
        0 => Op::Advance(int(u, 1)),
        1 => Op::Advance(int(u, 2) * NS_PER_MS),
        2 => Op::Advance(int(u, 4)),
        3 => Op::Advance(int(u, 2) * NS_PER_S),
        // Any size up to 2⁶² ns (`run` stops the clock at MAX_TIME, the clock's end).
        4 => Op::Advance(int(u, 8) >> 2),
        5 => Op::Align { unit: align_unit(byte(u)), offset: byte(u) as i8 },
        6..=9 => Op::Check { key: key(u), cost: cost(u), times: 1 + byte(u) % 12 },
        10 => Op::Peek { key: key(u) },
        11 => Op::Reset { key: key(u) },
        12 => Op::Sweep,
        13 => Op::SetPolicy { key: key(u), tier: usize::from(byte(u) % 3) },
        14 => Op::ClearPolicy { key: key(u) },
        _ => Op::UpdateMax { tier: usize::from(byte(u) % 3), bump: int(u, 1) % 4 },
    }
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Case> {
        let head = byte(u);
        let algorithm = model::ALGORITHMS[usize::from(head & 3)];
        let tiers = head & 4 != 0 && matches!(algorithm, Algorithm::SlidingWindow | Algorithm::FixedWindow);
        let keys = 1 + usize::from((head >> 3) & 3);
        let table: Vec<&str> = LIMITS.iter().chain(&FINE_LIMITS).copied().collect();
        let count = 1 + byte(u) % 3;
        let limits = (0..count)
            .map(|_| {
                let b = byte(u);
                let text = table[usize::from(b & 0x7F) % table.len()];
                let text = if b & 0x80 != 0 { format!("{text} strict") } else { text.to_owned() };
                text.parse().expect("the table's limits parse")
            })
            .collect::<Vec<Limit>>();
        let start = match byte(u) % 4 {
            0 => 0,
            kind @ (1 | 2) => {
                let points = wrap_points(&limits, algorithm);
                let point = points[usize::from(byte(u)) % points.len()];
                let before = int(u, 4) * if kind == 1 { 1 } else { NS_PER_MS };
                point.saturating_sub(before)
            }
            _ => int(u, 8) % ((1 << 62) + 1),
        };
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            ops.push(op(u));
        }
        Ok(Case { algorithm, limits, tiers, keys, start, ops })
    }
}

/// `MODEL_OPS_PRINT=1` prints each decoded case (to read a corpus or check seeds).
fn print_cases() -> bool {
    static PRINT: OnceLock<bool> = OnceLock::new();
    *PRINT.get_or_init(|| std::env::var_os("MODEL_OPS_PRINT").is_some())
}

fuzz_target!(|case: Case| {
    if print_cases() {
        eprintln!("{case:?}");
    }
    assert!(case.start <= MAX_TIME);
    if let Err(mismatch) =
        model::run(case.algorithm, &case.limits, case.tiers, case.keys, &case.ops, case.start)
    {
        panic!("the limiter disagrees with the model: {mismatch}\n{case:#?}");
    }
});
