//! Fuzz target: the `Limit` string parser and the builder's validation, and a limiter of
//! any configuration that builds.
//!
//! Input: text up to the first NUL byte, then bytes decoded with `arbitrary`.
//! - The text (lossy UTF-8), whole and line by line, is parsed as a `Limit`: no panic; an
//!   error's message says what is wrong; a limit that parses displays as a string that
//!   parses back to an equal limit, and builds a limiter. The same text is loaded as a
//!   `PolicyConfig` from TOML and from JSON (feature `serde`); what loads round-trips.
//! - The bytes after the NUL are a builder configuration: limits of any numbers (any `max`,
//!   any window and precision including zero and `Duration::MAX`, strict or not), any
//!   algorithm, named policies with any names, a default policy, a resolver, shadow mode,
//!   `max_keys`, `sweep_interval`, `clock_tick` of any value, always on a `ManualClock` (no
//!   background threads). `build()` must return `Ok` or an error with a message; a limiter
//!   that builds is driven by a few operations of any cost at any time (checks, records,
//!   `check_all`, peeks, resets, sweeps, policy changes, clock moves of any size, up to the
//!   end of time), none of which may panic. Every decision must be consistent, and a
//!   refusal's `retry_after` must hold: one nanosecond earlier the same request is still
//!   refused, at `retry_after` it is admitted.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use slidegate::{
    Algorithm, Carry, ConfigError, Decision, Denial, Limit, Limiter, ManualClock, PolicyConfig, MAX_LIMITS,
    MAX_LOG_UNITS, MAX_UNITS,
};

fuzz_target!(|data: &[u8]| {
    let (text, rest) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    parse_limit(&text);
    for line in text.lines() {
        parse_limit(line);
    }
    load_policy(&text);
    if let Ok(config) = Config::arbitrary_take_rest(Unstructured::new(rest)) {
        if print_cases() {
            eprintln!("{config:#?}");
        }
        config.run();
    }
});

/// `LIMIT_CONFIG_PRINT=1` prints each decoded configuration (to read a corpus or a crash).
fn print_cases() -> bool {
    static PRINT: OnceLock<bool> = OnceLock::new();
    *PRINT.get_or_init(|| std::env::var_os("LIMIT_CONFIG_PRINT").is_some())
}

/// An error message must say something: a few words at least.
fn check_message(err: &ConfigError) {
    let message = err.to_string();
    assert!(message.split_whitespace().count() >= 3, "uninformative error {err:?}: {message:?}");
    if let ConfigError::Parse { input, reason } = err {
        assert!(!reason.trim().is_empty(), "a parse error without a reason: {err:?}");
        assert!(message.contains(reason), "{message:?} does not give the reason {reason:?}");
        assert!(message.contains(&format!("{input:?}")), "{message:?} does not quote the input");
    }
    if let ConfigError::InPolicy { error, .. } = err {
        check_message(error);
    }
}

fn parse_limit(text: &str) {
    match text.parse::<Limit>() {
        Ok(limit) => {
            assert_eq!(limit.validate(), Ok(()), "{text:?} parsed to an invalid limit");
            round_trip(&limit);
            // A valid limit on its own always builds (one limit cannot span too many slots).
            let built = Limiter::<u64>::builder().limit(limit).clock(ManualClock::new()).build();
            if let Err(err) = &built {
                panic!("{text:?} parses to {limit:?}, which does not build: {err}");
            }
        }
        Err(err) => check_message(&err),
    }
}

/// `Display` writes a string that parses back to an equal limit.
fn round_trip(limit: &Limit) {
    let shown = limit.to_string();
    assert_eq!(shown.parse::<Limit>(), Ok(*limit), "{limit:?} displays as {shown:?}");
}

fn load_policy(text: &str) {
    match toml::from_str::<PolicyConfig>(text) {
        Ok(policy) => {
            let written = toml::to_string(&policy).expect("a loaded policy serializes");
            let again = toml::from_str::<PolicyConfig>(&written).expect("a written policy loads");
            assert_eq!(again, policy, "TOML round trip through {written:?}");
            for limit in &policy.limits {
                assert_eq!(limit.validate(), Ok(()), "TOML loaded an invalid limit");
            }
        }
        Err(err) => assert!(!err.to_string().trim().is_empty(), "a TOML error without a message"),
    }
    if let Ok(policy) = serde_json::from_str::<PolicyConfig>(text) {
        let written = serde_json::to_string(&policy).expect("a loaded policy serializes");
        assert_eq!(serde_json::from_str::<PolicyConfig>(&written).ok(), Some(policy), "JSON round trip");
    }
    // A JSON string holding the text loads as a `Limit` exactly when the text parses.
    let quoted = serde_json::to_string(text).expect("a string serializes");
    let loaded = serde_json::from_str::<Limit>(&quoted);
    assert_eq!(loaded.as_ref().ok(), text.parse::<Limit>().ok().as_ref(), "JSON {quoted} vs parse");
    if let Err(err) = loaded {
        assert!(!err.to_string().trim().is_empty(), "a JSON error without a message");
    }
}

/// A duration: typical values most of the time, any value otherwise.
#[derive(Debug, Arbitrary)]
enum Span {
    Common(u8),
    Millis(u32),
    Secs(u64),
    Nanos(u64),
    Raw(u64, u32),
    Zero,
    Max,
}

impl Span {
    fn get(&self) -> Duration {
        const COMMON: [u64; 14] =
            [1, 10, 20, 100, 250, 500, 1_000, 2_000, 10_000, 60_000, 3_600_000, 86_400_000, 1_500, 7_000];
        match *self {
            Span::Common(i) => Duration::from_millis(COMMON[usize::from(i) % COMMON.len()]),
            Span::Millis(ms) => Duration::from_millis(u64::from(ms)),
            Span::Secs(s) => Duration::from_secs(s),
            Span::Nanos(ns) => Duration::from_nanos(ns),
            Span::Raw(secs, nanos) => Duration::new(secs, nanos % 1_000_000_000),
            Span::Zero => Duration::ZERO,
            Span::Max => Duration::MAX,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Max {
    Small(u8),
    Any(u64),
    Units,
    LogUnits,
}

impl Max {
    fn get(&self) -> u64 {
        match *self {
            Max::Small(n) => u64::from(n),
            Max::Any(n) => n,
            Max::Units => MAX_UNITS,
            Max::LogUnits => MAX_LOG_UNITS,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct ArbLimit {
    max: Max,
    window: Span,
    precision: Option<Span>,
    strict: bool,
}

impl ArbLimit {
    fn get(&self) -> Limit {
        let mut limit = Limit::new(self.max.get(), self.window.get());
        if let Some(p) = &self.precision {
            limit = limit.precision(p.get());
        }
        if self.strict {
            limit = limit.strict();
        }
        if limit.validate().is_ok() {
            round_trip(&limit);
        } else {
            check_message(&limit.validate().unwrap_err());
        }
        limit
    }
}

/// Names the resolver can return, and any other.
const NAMES: [&str; 4] = ["default", "free", "paid", ""];

#[derive(Debug, Arbitrary)]
enum Name {
    Known(u8),
    Any(String),
}

impl Name {
    fn get(&self) -> &str {
        match self {
            Name::Known(i) => NAMES[usize::from(*i) % NAMES.len()],
            Name::Any(name) => name,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct ArbPolicy {
    name: Name,
    limits: Vec<ArbLimit>,
    shadow: bool,
}

impl ArbPolicy {
    fn config(&self) -> PolicyConfig {
        PolicyConfig::new(self.limits.iter().take(2 * MAX_LIMITS).map(ArbLimit::get)).shadow(self.shadow)
    }
}

#[derive(Debug, Arbitrary)]
enum Cost {
    Small(u8),
    Any(u64),
    Max,
}

impl Cost {
    fn get(&self) -> u64 {
        match *self {
            Cost::Small(n) => u64::from(n % 16),
            Cost::Any(n) => n,
            Cost::Max => u64::MAX,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Action {
    Check { key: u8, cost: Cost },
    Record { key: u8, cost: Cost },
    CheckAll { keys: Vec<u8>, cost: Cost },
    Peek { key: u8 },
    Reset { key: u8 },
    Sweep,
    Advance(Span),
    Set(Span),
    SetPolicy { key: u8, name: Name },
    ClearPolicy { key: u8 },
    Update { name: Name, policy: ArbPolicy, reset: bool },
    Inspect { key: u8 },
}

#[derive(Debug, Arbitrary)]
struct Config {
    algorithm: u8,
    name: Option<String>,
    limits: Vec<ArbLimit>,
    policies: Vec<ArbPolicy>,
    default_policy: Option<Name>,
    resolver: bool,
    shadow: Option<bool>,
    max_keys: Option<usize>,
    sweep_interval: Option<Span>,
    clock_tick: Option<Span>,
    start: Option<Span>,
    actions: Vec<Action>,
}

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

/// Decisions must be consistent whatever the configuration (`now`: the clock).
fn consistent(d: &Decision, now: Duration) {
    assert_eq!(d.is_allowed(), d.denial().is_none(), "{d:?}");
    let by_limit = matches!(d.denial(), Some(Denial::Limit(_)));
    assert_eq!(d.retry_after().is_some(), by_limit, "{d:?}");
    if let Some(wait) = d.retry_after() {
        assert!(!wait.is_zero(), "refused with retry_after 0 at {now:?}: {d:?}");
    }
    if d.shadow_denial().is_some() {
        assert!(d.is_allowed(), "{d:?}");
    }
    if !matches!(d.denial(), Some(Denial::TooManyKeys)) {
        assert!(d.tightest_limit() < MAX_LIMITS, "{d:?}");
    }
    assert!(d.remaining() <= MAX_UNITS, "{d:?}");
}

impl Config {
    fn run(&self) {
        let clock = ManualClock::new();
        if let Some(start) = &self.start {
            clock.set(start.get());
        }
        let algorithm = ALGORITHMS[usize::from(self.algorithm) % ALGORITHMS.len()];
        let mut builder = Limiter::<u64>::builder().clock(clock.clone()).algorithm(algorithm);
        if let Some(name) = &self.name {
            builder = builder.name(name);
        }
        for limit in self.limits.iter().take(2 * MAX_LIMITS) {
            builder = builder.limit(limit.get());
        }
        for policy in self.policies.iter().take(5) {
            builder = builder.policy(policy.name.get(), policy.config());
        }
        if let Some(name) = &self.default_policy {
            builder = builder.default_policy(name.get());
        }
        if self.resolver {
            builder = builder.resolver(|key: &u64| NAMES.get(*key as usize % (NAMES.len() + 1)).copied());
        }
        if let Some(on) = self.shadow {
            builder = builder.shadow(on);
        }
        if let Some(n) = self.max_keys {
            builder = builder.max_keys(n);
        }
        if let Some(every) = &self.sweep_interval {
            builder = builder.sweep_interval(every.get());
        }
        if let Some(tick) = &self.clock_tick {
            builder = builder.clock_tick(tick.get());
        }
        let limiter = match builder.build() {
            Ok(limiter) => limiter,
            Err(err) => return check_message(&err),
        };
        for limit in limiter.limits() {
            assert_eq!(limit.validate(), Ok(()), "the limiter holds an invalid limit");
        }
        let _ = limiter.state_bytes_per_key();
        for action in self.actions.iter().take(64) {
            match action {
                Action::Check { key, cost } => {
                    let (key, cost) = (u64::from(*key % 8), cost.get());
                    let d = limiter.check_n(&key, cost);
                    consistent(&d, clock.now());
                    if let Some(wait) = d.retry_after() {
                        retry_holds(&limiter, &clock, key, cost, wait);
                    }
                }
                Action::Record { key, cost } => {
                    consistent(&limiter.record(&u64::from(*key % 8), cost.get()), clock.now())
                }
                Action::CheckAll { keys, cost } => {
                    let keys: Vec<u64> = keys.iter().take(6).map(|k| u64::from(*k % 8)).collect();
                    let refs: Vec<&u64> = keys.iter().collect();
                    match limiter.check_all(&refs, cost.get()) {
                        Ok(d) => {
                            consistent(&d.decision(), clock.now());
                            assert!(d.key() < keys.len().max(1), "{d:?} for {} keys", keys.len());
                        }
                        // No key, or more than MAX_IDENTITIES: an error that says so.
                        Err(err) => {
                            let count_wrong = keys.is_empty() || keys.len() > slidegate::MAX_IDENTITIES;
                            assert!(count_wrong, "{err:?} for {} keys", keys.len());
                            assert!(err.to_string().contains("check_all"), "{err}");
                        }
                    }
                }
                Action::Peek { key } => consistent(&limiter.peek(&u64::from(*key % 8)), clock.now()),
                Action::Reset { key } => {
                    let _ = limiter.reset(&u64::from(*key % 8));
                }
                Action::Sweep => {
                    let before = limiter.len();
                    let evicted = limiter.sweep();
                    assert!(evicted <= before, "swept {evicted} of {before} keys");
                    assert_eq!(limiter.len(), before - evicted);
                }
                Action::Advance(by) => clock.advance(by.get()),
                Action::Set(to) => clock.set(to.get()),
                Action::SetPolicy { key, name } => {
                    if let Err(err) = limiter.set_policy(&u64::from(*key % 8), name.get()) {
                        check_message(&err);
                    }
                }
                Action::ClearPolicy { key } => {
                    let _ = limiter.clear_policy(&u64::from(*key % 8));
                }
                Action::Update { name, policy, reset } => {
                    let carry = if *reset { Carry::Reset } else { Carry::Conservative };
                    if let Err(err) = limiter.update_policy(name.get(), policy.config(), carry) {
                        check_message(&err);
                    }
                }
                Action::Inspect { key } => {
                    let policy = limiter.policy_of(&u64::from(*key % 8)).to_owned();
                    assert!(limiter.policy(&policy).is_some(), "key on an unknown policy {policy:?}");
                    assert!(limiter.policy_names().any(|name| name == policy));
                    let len = limiter.len();
                    assert_eq!(limiter.is_empty(), len == 0);
                    let _ = (limiter.name(), limiter.algorithm(), limiter.limits());
                }
            }
        }
    }
}

/// `retry_after` is exact: one nanosecond before it the same request is still refused (and a
/// refusal consumes nothing), at it the request is admitted. Nothing to check when the
/// clock cannot get there (it stands still at its end, 2^62 ns).
fn retry_holds(limiter: &Limiter<u64>, clock: &ManualClock, key: u64, cost: u64, wait: Duration) {
    let now = clock.now();
    let Some(at) = now.checked_add(wait) else { return };
    let before = at - Duration::from_nanos(1);
    clock.set(before);
    if clock.now() != before {
        return;
    }
    let early = limiter.check_n(&key, cost);
    assert!(
        matches!(early.denial(), Some(Denial::Limit(_))),
        "at {now:?}: cost {cost} refused with retry_after {wait:?}, but 1 ns before that: {early:?}"
    );
    clock.set(at);
    if clock.now() != at {
        return;
    }
    let then = limiter.check_n(&key, cost);
    assert!(then.is_allowed(), "at {now:?}: cost {cost} refused with retry_after {wait:?}, then: {then:?}");
}
