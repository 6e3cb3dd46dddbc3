//! The workloads slidegate and governor are compared on, defined once and run both by the
//! criterion bench (`benches/limiter/`, package `slidegate-benches`) and by `bench_report`
//! (`tools/src/bin/bench_report/`), whose table the performance guide and the README print.
//!
//! The rules every timed comparison follows, and where each is kept:
//!
//! 1. **Access order unrelated to allocation order.** Keys are inserted in one random order
//!    ([`shuffled`]) and visited in an independent random sequence with repeats
//!    ([`Visits`]).
//! 2. **Time moves on the real clock.** Both contenders run on their real coarse clocks
//!    (slidegate's ticker, governor's `QuantaUpkeepClock`, both refreshed every
//!    millisecond). A 1 M-key pass of `bench_report` lasts about 1.5 s (0.25 s in
//!    `--quick`), and a visit cursor goes on from pass to pass, so keys are revisited after
//!    their 1-second slot moved on; a frozen-clock variant ([`Slidegate::frozen`],
//!    [`Governor::frozen`]) is measured beside it.
//! 3. **Refusals against history in older slots and in the current slot.** `per_minute(1)`
//!    keys admitted [`HISTORY_AGE`] (2.5 s) before their refusals are timed ([`AgedKey`]),
//!    and keys admitted just before each chunk of refusals ([`refused_now`]).
//! 4. **governor called directly.** [`Contender::check`] is `check_key` on one governor
//!    limiter, or on three as fields ([`GovernorThree`]) checked in order up to the first
//!    refusal; every loop is generic over the contender (monomorphized; no `dyn`, no loop
//!    over a list of limiters on either side).
//! 5. **The same algorithm on both sides** where the row says so: slidegate with
//!    `Algorithm::Gcra` against governor's GCRA.
//! 6. **Memory** is not measured here: `memory` (`tools/src/bin/memory.rs`) reports heap
//!    and RSS growth per key, each configuration in a fresh process.
//! 7. **Limits as users build them**: `Limit::per_second(n)`, `per_minute(n)`,
//!    `per_hour(n)` with their default precision ([`Policy`], [`three_limits`]) and the
//!    matching `Quota::per_second` / `per_minute` / `per_hour`.
//! 8. **Interleaved rounds** (`bench_report`): each round runs every scenario on both
//!    contenders, which goes first alternating from round to round; the report gives the
//!    medians of the rounds and of the per-round ratios.
//!
//! A pass counts its admissions ([`Pass::admitted`]): a caller holds it against what the
//! workload expects (all admitted, all refused), so a limiter that decides otherwise fails
//! the run instead of producing a figure for the wrong path.

mod contenders;
mod keys;
mod passes;

pub use contenders::{
    three_limits, Contender, Governor, GovernorThree, KeyedGovernor, Policy, Slidegate, HOT_MAX,
    SWEEP_INTERVAL,
};
pub use keys::{shuffled, Visits, VISIT_SEED};
pub use passes::{
    hot, new_keys, prefill, random, random_one_at_a_time, refused_now, two_threads, AgedKey, Keys, Pass,
    HISTORY_AGE, HOT_KEY, REFUSAL_CHUNK,
};

/// Keys in the "many keys" workloads.
pub const MANY_KEYS: u64 = 1_000_000;
/// Keys in the "1,000 keys" workload, and in each thread's set of the disjoint-keys one.
pub const FEW_KEYS: u64 = 1_000;
