//! The arguments of `SLIDEGATE.RUN`, read without the server: pure functions over the
//! arguments' bytes, so that the fuzz target (`fuzz/fuzz_targets/module_args.rs`) reaches
//! everything a client can send.
//!
//! `SLIDEGATE.RUN <routing key> <numkeys> <key>... <now> <ttl> <limits> (<max> <window>
//! <slot> <strict>)... (<mode> <cost>)...`: the routing key (the first key again, so that a
//! Cluster client sends the call to that key's node), `numkeys` windows keys, the time in
//! ms (empty: the server's), the TTL in ms, the limits, then one mode and cost per key.
//!
//! Two kinds of error. A **call error** (the server's `-ERR` reply) when the call's shape
//! or its limits are wrong, which no entry could survive: the argument count, `numkeys`,
//! the time, the TTL, a limit, or a cap ([`MOST_ENTRIES`], [`MOST_LIMITS`],
//! [`MOST_SLOTS`], [`MOST_KEY_BYTES`]), all checked before anything is allocated for them.
//! An **entry error** ([`EntryError`]) when one entry is wrong (its mode or its cost) or
//! its key holds another type: that entry answers `{3, code, 0, 0, now}` and its
//! neighbours are decided as if it were not there.

use std::ffi::CStr;

use crate::window::{Layout, Limit, Mode};

/// The most entries (keys) one call may carry: `RedisLimiter` batches at most 64.
pub const MOST_ENTRIES: usize = 64;
/// The most limits one call may carry: slidegate's `MAX_LIMITS`.
pub const MOST_LIMITS: usize = 8;
/// The most slots per limit: slidegate's `MAX_SLOTS`.
pub const MOST_SLOTS: i64 = 3600;
/// The most bytes of one key's windows: 8 limits of 3600 slots take 230,664.
pub const MOST_KEY_BYTES: usize = 256 * 1024;
/// The largest `max`: the script stores counts as doubles, exact below 2^53.
pub const MOST_MAX: i64 = (1 << 53) - 1;

/// Where the windows keys start (after the command name, the routing key and `numkeys`).
pub const FIRST_KEY: usize = 3;

/// Why a whole call is refused (its `-ERR` reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The arguments do not have the call's shape (what is wrong, for the message).
    Malformed(&'static str),
    /// More than [`MOST_ENTRIES`] keys.
    TooManyEntries,
    /// More than [`MOST_LIMITS`] limits.
    TooManyLimits,
    /// A limit with more than [`MOST_SLOTS`] slots.
    TooManySlots,
    /// A key's windows would take more than [`MOST_KEY_BYTES`].
    KeyTooLarge,
}

impl CallError {
    /// The error reply, NUL-terminated for the module API.
    ///
    /// ```
    /// use slidegate_redis::args::CallError;
    /// assert!(CallError::TooManyLimits.message().to_bytes().starts_with(b"ERR slidegate.run: "));
    /// ```
    pub fn message(self) -> &'static CStr {
        match self {
            CallError::Malformed(what) => match what {
                "numkeys" => c"ERR slidegate.run: malformed arguments (numkeys)",
                "count" => c"ERR slidegate.run: malformed arguments (argument count)",
                "now" => c"ERR slidegate.run: malformed arguments (now)",
                "ttl" => c"ERR slidegate.run: malformed arguments (ttl)",
                "limits" => c"ERR slidegate.run: malformed arguments (number of limits)",
                _ => c"ERR slidegate.run: malformed arguments (a limit)",
            },
            CallError::TooManyEntries => c"ERR slidegate.run: more than 64 keys in one call",
            CallError::TooManyLimits => c"ERR slidegate.run: more than 8 limits",
            CallError::TooManySlots => c"ERR slidegate.run: a limit with more than 3600 slots",
            CallError::KeyTooLarge => c"ERR slidegate.run: the windows would take more than 256 KiB per key",
        }
    }
}

/// Why one entry is refused: its reply is `{3, code, 0, 0, now}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryError {
    /// The mode is not `check` or `peek` (`add` and `push` go through the script).
    Mode = 1,
    /// The cost is not an unsigned 64-bit decimal integer.
    Cost = 2,
    /// The key holds a value of another type (answered when the key is opened).
    WrongType = 3,
    /// The server would not open the key.
    Key = 4,
}

impl EntryError {
    /// The code in the entry's reply.
    ///
    /// ```
    /// use slidegate_redis::args::EntryError;
    /// assert_eq!(EntryError::Cost.code(), 2);
    /// ```
    pub fn code(self) -> i64 {
        self as i64
    }

    /// The entry's five replies at time `now`.
    ///
    /// ```
    /// use slidegate_redis::args::EntryError;
    /// assert_eq!(EntryError::WrongType.reply(1000), [3, 3, 0, 0, 1000]);
    /// ```
    pub fn reply(self, now: i64) -> [i64; 5] {
        [3, self.code(), 0, 0, now]
    }
}

/// One entry: the position of its key among the arguments, its mode and cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The key's index in the arguments (`args[key]`).
    pub key: usize,
    /// Check or peek.
    pub mode: Mode,
    /// Units, any `u64` (a cost above a limit's `max` is answered `CostTooLarge`).
    pub cost: u64,
}

/// A call that has the right shape: its time, TTL, layout and entries.
#[derive(Debug, Clone)]
pub struct Call {
    /// The caller's time in ms, or `None` for the server's.
    pub now: Option<i64>,
    /// The windows' expiry, ms (positive).
    pub ttl: i64,
    /// The windows' byte layout, within the caps.
    pub layout: Layout,
    /// Per key, in order: the entry, or why it is refused.
    pub entries: Vec<Result<Entry, EntryError>>,
}

fn int(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn unsigned(bytes: &[u8]) -> Option<u64> {
    // Digits only: `u64::from_str` would also take a leading `+`.
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// `numkeys`, if it is a count the arguments hold (each key, then a mode and a cost).
fn numkeys(args: &[&[u8]]) -> Option<usize> {
    let n = usize::try_from(int(args.get(2)?)?).ok()?;
    let room = args.len().checked_sub(FIRST_KEY)?;
    (n.checked_mul(3)? <= room).then_some(n)
}

/// The positions of every key the call names, as the server's key extraction
/// (`getkeys-api`) must learn them for ACLs and Cluster slot checks: the routing key and
/// the `numkeys` windows keys. [`parse`] opens only keys from this list.
///
/// ```
/// use slidegate_redis::args::key_positions;
/// let args: Vec<&[u8]> = ["slidegate.run", "k", "2", "k", "j", "", "60000", "0", "check", "1", "peek", "1"]
///     .iter().map(|s| s.as_bytes()).collect();
/// assert_eq!(key_positions(&args).collect::<Vec<_>>(), [1, 3, 4]);
/// ```
pub fn key_positions(args: &[&[u8]]) -> impl Iterator<Item = usize> {
    let routing = (args.len() > 1).then_some(1);
    let keys = numkeys(args).map_or(0..0, |n| FIRST_KEY..FIRST_KEY.saturating_add(n));
    routing.into_iter().chain(keys)
}

/// Reads a call: a [`CallError`] if its shape, limits or caps are wrong, else its entries,
/// each an [`Entry`] or an [`EntryError`]. Allocates only after the caps are checked.
///
/// ```
/// use slidegate_redis::args::{parse, EntryError};
/// let args: Vec<&[u8]> = ["slidegate.run", "k", "2", "k", "j", "1000", "61000", "1", "5", "60000", "1000", "0",
///     "check", "1", "check", "-1"].iter().map(|s| s.as_bytes()).collect();
/// let call = parse(&args).unwrap();
/// assert_eq!(call.entries[0].unwrap().cost, 1);
/// assert_eq!(call.entries[1], Err(EntryError::Cost));
/// ```
pub fn parse(args: &[&[u8]]) -> Result<Call, CallError> {
    let arg = |i: usize| args.get(i).copied();
    let n = usize::try_from(arg(2).and_then(int).ok_or(CallError::Malformed("numkeys"))?)
        .map_err(|_| CallError::Malformed("numkeys"))?;
    if n == 0 {
        return Err(CallError::Malformed("numkeys"));
    }
    if n > MOST_ENTRIES {
        return Err(CallError::TooManyEntries);
    }
    let at = FIRST_KEY + n;
    let now = arg(at).ok_or(CallError::Malformed("count"))?;
    let now = if now.is_empty() {
        None
    } else {
        Some(int(now).filter(|&t| t >= 0).ok_or(CallError::Malformed("now"))?)
    };
    let ttl = arg(at + 1).and_then(int).filter(|&t| t > 0).ok_or(CallError::Malformed("ttl"))?;
    let nl = arg(at + 2).and_then(int).ok_or(CallError::Malformed("limits"))?;
    let nl = usize::try_from(nl).map_err(|_| CallError::Malformed("limits"))?;
    if nl == 0 {
        return Err(CallError::Malformed("limits"));
    }
    if nl > MOST_LIMITS {
        return Err(CallError::TooManyLimits);
    }
    let first = at + 3 + nl * 4;
    if args.len() != first + n * 2 {
        return Err(CallError::Malformed("count"));
    }
    let mut limits = Vec::with_capacity(nl);
    let mut bytes = 8usize;
    for i in 0..nl {
        let b = at + 3 + i * 4;
        let field = |j: usize| arg(b + j).and_then(int).ok_or(CallError::Malformed("limit"));
        let (max, window, p) = (field(0)?, field(1)?, field(2)?);
        let strict = match arg(b + 3) {
            Some(b"1") => true,
            Some(b"0") => false,
            _ => return Err(CallError::Malformed("limit")),
        };
        if !(0..=MOST_MAX).contains(&max) || p <= 0 || window <= 0 || window % p != 0 {
            return Err(CallError::Malformed("limit"));
        }
        let slots = window / p;
        if slots > MOST_SLOTS {
            return Err(CallError::TooManySlots);
        }
        // 24 bytes of head, 8 per ring entry (slots + 1): at most 8 + 8 × 28,832.
        bytes += 24 + 8 * (usize::try_from(slots).unwrap_or(usize::MAX / 16) + 1);
        limits.push(Limit { max, p, n: slots, strict });
    }
    if bytes > MOST_KEY_BYTES {
        return Err(CallError::KeyTooLarge);
    }
    let layout = Layout::new(limits).ok_or(CallError::Malformed("limit"))?;
    let entries = (0..n)
        .map(|j| {
            let mode = match arg(first + j * 2) {
                Some(b"check") => Mode::Check,
                Some(b"peek") => Mode::Peek,
                _ => return Err(EntryError::Mode),
            };
            let cost = arg(first + j * 2 + 1).and_then(unsigned).ok_or(EntryError::Cost)?;
            Ok(Entry { key: FIRST_KEY + j, mode, cost })
        })
        .collect();
    Ok(Call { now, ttl, layout, entries })
}
