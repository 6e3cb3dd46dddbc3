//! Limits that survive a restart (feature `serde`): [`Limiter::save`] writes every held
//! key's counts to a stream while checks go on, and [`Limiter::load`] merges such a stream
//! into a live limiter, all of it or nothing.
//!
//! # What a snapshot holds
//! Per key: the key (as JSON, through its `serde` implementation), its policy's name, and per
//! limit of that policy the limit's string form with the units the limit still counts, by
//! the slot they were counted in (GCRA: the units its TAT is ahead by; a sliding log: its
//! timestamps), each as its age at the save. Keys are read one at a time, without a lock
//! and without stopping checks, each limit as of one moment (`protocol/snapshot.rs`): a check
//! racing the save may be in it or not.
//!
//! # What a load does
//! It reads and verifies the whole stream first (checksum, version, every length and count
//! within bounds, every key and limit parsed), and changes nothing unless all of it is good.
//! Then key by key (`limiter/persist.rs`):
//! - **Aged by the wall clock.** A unit saved at age `a` is placed `a` plus the wall-clock
//!   time since the save before the load's time (never after it; a wall clock that went back
//!   counts as no time). Units that have left their window meanwhile are dropped.
//! - **Added, never removed.** A key the loading limiter already holds keeps its own units
//!   and gets the loaded ones on top, each in its own slot. A load never lowers a count, so it
//!   never grants a budget afresh.
//! - **Matched by name.** A key not held goes under its override, else under the policy of
//!   the saved name if there is one, else under the policy a check would give it; a held key
//!   keeps its policy. A limit takes the saved limit with the same string form, or else one
//!   of the same window (its `max`, precision or accuracy changed: units carry over, as
//!   [`Limiter::update_policy`] carries them, each into the slot that holds the end of its
//!   saved slot); a limit with none starts empty; a saved limit no limit takes is dropped.
//! - **Bounded.** A key that finds the table full (no idle key gives its place, see
//!   [`WhenFull`](crate::WhenFull); a load never evicts a live key) is counted in
//!   [`SnapshotStats::full`], not inserted. A count over what one entry holds (2³²−1
//!   units: a GCRA lead, units recorded past `max`) is written as several entries at one
//!   time, which a load adds up.
//!
//! # The format (version 1)
//! ```text
//! "slidegate-snapshot\n"  version: u8 = 1  saved_at: u64 LE (ns since the Unix epoch)
//! items, each a tag byte:
//!   1  a policy: name, limit count (u8), each limit's string form
//!   2  a key: key (JSON bytes), policy (index of an earlier 1), then per limit of that
//!      policy: entry count, each entry: age (ns before the save, zigzag), units
//!   0  the end: key count, then CRC-32 (IEEE, u32 LE) of every byte before it
//! ```
//! Numbers are LEB128 varints unless marked; strings and bytes are a varint length and the
//! bytes. Memory while loading is proportional to the stream: it is read whole, and every key
//! parsed, before any is applied.

use std::hash::Hash;
use std::io::{self, BufWriter, Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::algorithm::MAX_LOG_UNITS;
use crate::limit::{Limit, MAX_SLOTS, MAX_UNITS, MAX_WINDOW};
use crate::limiter::Merged;
use crate::{Limiter, MAX_LIMITS};

const MAGIC: &[u8] = b"slidegate-snapshot\n";
/// The version this build writes and reads.
pub const SNAPSHOT_VERSION: u8 = 1;

const END: u8 = 0;
const POLICY: u8 = 1;
const KEY: u8 = 2;

/// The longest key, policy name and limit string a load accepts.
const MAX_KEY_BYTES: u64 = 64 * 1024;
const MAX_NAME_BYTES: u64 = 1024;
const MAX_LIMIT_BYTES: u64 = 256;
/// The most policy versions one snapshot names (a save meets each version of each
/// policy once; versions change only through `update_policy`).
const MAX_POLICIES: usize = 65_536;
/// The most entries one limit of one key holds: a sliding log's distinct times, or a
/// window's slots and the open one.
const MAX_ENTRIES: u64 = MAX_LOG_UNITS + MAX_SLOTS + 2;

/// What a [`Limiter::save`] wrote or a [`Limiter::load`] did.
///
/// ```
/// use slidegate::SnapshotStats;
/// let stats = SnapshotStats::default();
/// assert_eq!(stats.keys, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotStats {
    /// Keys in the snapshot: written by a save, read by a load.
    pub keys: u64,
    /// Save: keys left out because a load would refuse their record, which would make the
    /// whole snapshot unloadable: a key whose JSON is over 64 KiB, a policy name over
    /// 1 KiB, more than 65,536 policy versions in one save.
    pub skipped: u64,
    /// Load: keys not held, inserted with their counts.
    pub inserted: u64,
    /// Load: keys held, the loaded counts added to theirs.
    pub added: u64,
    /// Load: keys whose units had all left their windows (or matched no limit): unchanged.
    pub expired: u64,
    /// Load: keys not inserted because the table was full (no idle key gave its place: a
    /// load never evicts a live key, whatever [`WhenFull`](crate::WhenFull) says).
    pub full: u64,
    /// Keys other threads moved or removed each time the save came to read them, or the
    /// load to merge them (a policy replaced again and again, a key swept or reset between
    /// a load's insert and its merge, four times over): not saved, or not loaded.
    pub raced: u64,
    /// Bytes written or read.
    pub bytes: u64,
}

/// Why a [`Limiter::save`] or [`Limiter::load`] failed. A load that fails changes nothing.
///
/// ```
/// use slidegate::{Limit, Limiter, SnapshotError};
/// let limiter = Limiter::<String>::builder().limit(Limit::per_second(5)).build()?;
/// let err = limiter.load(&b"not a snapshot"[..]).unwrap_err();
/// assert!(matches!(err, SnapshotError::NotASnapshot));
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading or writing the stream failed.
    Io(io::Error),
    /// The stream does not start as a snapshot does.
    NotASnapshot,
    /// A snapshot of a version this build does not read.
    Version {
        /// The version in the stream.
        found: u8,
        /// The version this build reads.
        supported: u8,
    },
    /// The stream ends before the snapshot does.
    Truncated,
    /// The checksum does not match: the stream was changed or damaged.
    Checksum {
        /// The checksum in the stream.
        stored: u32,
        /// The checksum of what was read.
        computed: u32,
    },
    /// Something in the stream is out of bounds or malformed.
    Corrupt {
        /// What.
        what: String,
    },
    /// A key could not be written or read as JSON through its `serde` implementation.
    Key {
        /// serde_json's message.
        message: String,
    },
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Io(e) => write!(f, "snapshot I/O failed: {e}"),
            SnapshotError::NotASnapshot => f.write_str("not a slidegate snapshot (wrong magic bytes)"),
            SnapshotError::Version { found, supported } => {
                write!(f, "snapshot version {found} is not supported (this build reads version {supported})")
            }
            SnapshotError::Truncated => f.write_str("the snapshot is truncated"),
            SnapshotError::Checksum { stored, computed } => {
                write!(f, "snapshot checksum mismatch (stored {stored:08x}, computed {computed:08x}): damaged or changed")
            }
            SnapshotError::Corrupt { what } => write!(f, "corrupt snapshot: {what}"),
            SnapshotError::Key { message } => write!(f, "a snapshot key does not (de)serialise: {message}"),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for SnapshotError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            SnapshotError::Truncated
        } else {
            SnapshotError::Io(e)
        }
    }
}

fn corrupt(what: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt { what: what.into() }
}

impl<K> Limiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static + Serialize + DeserializeOwned,
{
    /// Writes every held key's counts to `writer` (buffered here), while checks go on: one
    /// key at a time, each limit as of one moment (a check racing the save may be in it or
    /// not); a key that moves while the save walks its shard (a policy change, a load) is
    /// read where it moved. A shard's records (a 64th of the keys) are encoded while the walk
    /// holds its nodes and written once it has let them go: a slow `writer` holds up no
    /// memory reclamation, and no more than that is held in memory. Keys inserted or removed
    /// during the save may be in it or not. See [the reliability
    /// guide](crate::guide::reliability) for the format and what a load does.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter};
    /// let old = Limiter::<String>::builder().limit(Limit::per_minute(5)).build()?;
    /// for _ in 0..5 {
    ///     assert!(old.check("alice").is_allowed());
    /// }
    /// let mut file = Vec::new();
    /// assert_eq!(old.save(&mut file)?.keys, 1);
    ///
    /// // The next process: alice's minute is still used up.
    /// let new = Limiter::<String>::builder().limit(Limit::per_minute(5)).build()?;
    /// assert_eq!(new.load(&file[..])?.inserted, 1);
    /// assert!(!new.check("alice").is_allowed());
    /// assert!(new.check("bob").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save(&self, writer: impl Write) -> Result<SnapshotStats, SnapshotError> {
        let mut out = Checked::new(BufWriter::with_capacity(1 << 16, writer));
        // The limiter's clock first: the wall-clock time a load ages units by then counts
        // from no earlier than the ages' reference (never less conservative).
        let start = self.clock_nanos();
        let saved_at = wall_nanos();
        out.put(MAGIC)?;
        out.put(&[SNAPSHOT_VERSION])?;
        out.put(&saved_at.to_le_bytes())?;
        // The policy versions met so far, by their number (unique in the process: an
        // address could be reused by a later version once the walk lets an old one go).
        let mut policies: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        // A shard's items, encoded while the walk holds its nodes and written once it has
        // let them go (a slow writer then holds up no grace period): a 64th of the keys.
        let shard = std::cell::RefCell::new(Vec::new());
        let (mut keys, mut skipped) = (0u64, 0u64);
        let raced = self.each_saved(
            |key, name, policy, _, history| {
                let mut guard = shard.borrow_mut();
                let shard: &mut Vec<u8> = &mut guard;
                // What a load would refuse is not written (one such record would make the
                // whole snapshot unloadable): the key is left out, and counted.
                let version = policy.version();
                let known = policies.get(&version).copied();
                if known.is_none() && (name.len() as u64 > MAX_NAME_BYTES || policies.len() >= MAX_POLICIES) {
                    skipped = skipped.saturating_add(1);
                    return Ok(());
                }
                let begin = shard.len();
                let index = match known {
                    Some(index) => index,
                    None => {
                        shard.push(POLICY);
                        bytes(shard, name.as_bytes());
                        let limits: Vec<String> = policy.limits().map(Limit::to_string).collect();
                        shard.push(u8::try_from(limits.len()).unwrap_or(u8::MAX));
                        for limit in &limits {
                            bytes(shard, limit.as_bytes());
                        }
                        policies.len()
                    }
                };
                shard.push(KEY);
                // The key's length goes first: written after the key, then moved into place.
                let at = shard.len();
                serde_json::to_writer(&mut *shard, key)
                    .map_err(|e| SnapshotError::Key { message: e.to_string() })?;
                let written = shard.len().saturating_sub(at) as u64;
                if written > MAX_KEY_BYTES {
                    shard.truncate(begin);
                    skipped = skipped.saturating_add(1);
                    return Ok(());
                }
                if known.is_none() {
                    policies.insert(version, index);
                }
                let mut len = Vec::with_capacity(4);
                varint(&mut len, written);
                shard.splice(at..at, len);
                varint(shard, index as u64);
                for entries in &history {
                    entries_of(shard, entries, start);
                }
                keys = keys.saturating_add(1);
                Ok::<(), SnapshotError>(())
            },
            || {
                let mut shard = shard.borrow_mut();
                out.put(&shard)?;
                shard.clear();
                Ok(())
            },
        )?;
        let mut end = vec![END];
        varint(&mut end, keys);
        out.put(&end)?;
        let crc = out.crc.clone().finalize();
        out.put(&crc.to_le_bytes())?;
        out.inner.flush()?;
        Ok(SnapshotStats { keys, skipped, raced, bytes: out.bytes, ..SnapshotStats::default() })
    }

    /// Merges a snapshot written by [`save`](Self::save) into this limiter, while checks go
    /// on: every saved unit still inside its window is added to its key, aged by the wall
    /// clock since the save, in the slot it was counted in; held keys keep their own units
    /// too. The stream is read and verified whole first: a truncated, damaged, foreign or
    /// hostile one is an error, and then nothing changes. See
    /// [the module docs](crate::guide::reliability) for how keys and limits are matched.
    ///
    /// ```
    /// use slidegate::{Limit, Limiter, SnapshotError};
    /// let limiter = Limiter::<u64>::builder().limit(Limit::per_second(5)).build()?;
    /// let mut file = Vec::new();
    /// let _ = limiter.check(&7);
    /// limiter.save(&mut file)?;
    /// file.truncate(file.len() - 1);
    /// assert!(matches!(limiter.load(&file[..]), Err(SnapshotError::Truncated)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(&self, reader: impl Read) -> Result<SnapshotStats, SnapshotError> {
        let parsed = Parsed::<K>::read(reader)?;
        // The wall-clock time since the save, none if the clock went back.
        let elapsed = wall_nanos().saturating_sub(parsed.saved_at);
        let now = self.clock_nanos();
        let mut stats = SnapshotStats {
            keys: parsed.records.len() as u64,
            bytes: parsed.bytes,
            ..SnapshotStats::default()
        };
        let mut limits: Vec<(Limit, Vec<(u64, u64)>)> = Vec::new();
        let mut scratch = Vec::new();
        for record in &parsed.records {
            let Some((name, policy)) = parsed.policies.get(record.policy) else { continue };
            // The buffers of the last key's limits are reused.
            limits.resize_with(policy.len(), || (Limit::per_second(1), Vec::new()));
            let spans = parsed.spans.get(record.limits.clone()).unwrap_or_default();
            for ((limit, span), (into, placed)) in policy.iter().zip(spans).zip(limits.iter_mut()) {
                *into = *limit;
                placed.clear();
                placed.extend(parsed.entries.get(span.clone()).unwrap_or_default().iter().map(
                    |&(age, units)| {
                        // `age + elapsed` before the load's time, never after it.
                        let at = i128::from(now)
                            .saturating_sub(i128::from(elapsed))
                            .saturating_sub(i128::from(age));
                        (u64::try_from(at.clamp(0, i128::from(now))).unwrap_or(now), units)
                    },
                ));
            }
            match self.merge_saved(&record.key, name, &limits, &mut scratch) {
                Merged::Inserted => stats.inserted = stats.inserted.saturating_add(1),
                Merged::Added => stats.added = stats.added.saturating_add(1),
                Merged::Nothing => stats.expired = stats.expired.saturating_add(1),
                Merged::Full => stats.full = stats.full.saturating_add(1),
                Merged::Raced => stats.raced = stats.raced.saturating_add(1),
            }
        }
        Ok(stats)
    }
}

/// ns since the Unix epoch (0 for a clock before it).
fn wall_nanos() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ 0i64.wrapping_sub((n & 1) as i64)
}

/// A writer that counts its bytes and keeps the CRC of what went through.
struct Checked<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Checked<W> {
    fn new(inner: W) -> Self {
        Checked { inner, crc: crc32fast::Hasher::new(), bytes: 0 }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.bytes = self.bytes.saturating_add(bytes.len() as u64);
        self.inner.write_all(bytes)
    }
}

/// Appends `n` as a LEB128 varint.
fn varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        // Truncation is the point: the low 7 bits.
        let byte = (n as u8) & 0x7F;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends one limit's entries, ages from `start`: a count above [`MAX_UNITS`] (a GCRA lead
/// or units recorded past `max`) as several entries at the same time, which a load adds up,
/// as many as fit [`MAX_ENTRIES`] in all; beyond that the count saturates (a limit that
/// holds more than `MAX_ENTRIES × MAX_UNITS` units refuses for longer than any window).
fn entries_of(out: &mut Vec<u8>, entries: &[(u64, u64)], start: u64) {
    let pieces = |units: u64| units.div_ceil(MAX_UNITS).max(1);
    let mut budget = MAX_ENTRIES;
    let mut kept: Vec<(u64, u64)> = Vec::with_capacity(entries.len());
    // The newest first, so that saturation keeps the most recent units.
    for &(at, units) in entries.iter().rev() {
        let n = pieces(units).min(budget);
        if n == 0 {
            break;
        }
        budget = budget.saturating_sub(n);
        kept.push((at, units.min(n.saturating_mul(MAX_UNITS))));
    }
    let count: u64 = kept.iter().map(|&(_, units)| pieces(units)).sum();
    varint(out, count);
    for &(at, mut units) in kept.iter().rev() {
        // Before the save's start (positive) or during it (negative).
        let age = zigzag(i64::try_from(i128::from(start).saturating_sub(i128::from(at))).unwrap_or(i64::MAX));
        loop {
            let piece = units.min(MAX_UNITS);
            varint(out, age);
            varint(out, piece);
            units = units.saturating_sub(piece);
            if units == 0 {
                break;
            }
        }
    }
}

/// Appends a length and the bytes.
fn bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A snapshot read and verified whole, before any of it is applied.
struct Parsed<K> {
    saved_at: u64,
    /// Per policy version: its name and limits.
    policies: Vec<(String, Vec<Limit>)>,
    records: Vec<Record<K>>,
    /// Every record's limits, each a range of `entries`.
    spans: Vec<std::ops::Range<usize>>,
    /// Every record's entries, `(age, units)`.
    entries: Vec<(i64, u64)>,
    bytes: u64,
}

struct Record<K> {
    key: K,
    policy: usize,
    /// Its limits' ranges of entries: a range of `spans`.
    limits: std::ops::Range<usize>,
}

/// The stream being parsed, from memory: what is left of it.
struct Source<'a> {
    rest: &'a [u8],
}

impl<'a> Source<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if n > self.rest.len() {
            return Err(SnapshotError::Truncated);
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, SnapshotError> {
        let (&b, rest) = self.rest.split_first().ok_or(SnapshotError::Truncated)?;
        self.rest = rest;
        Ok(b)
    }

    #[allow(clippy::arithmetic_side_effects, reason = "i < 10: shifts of at most 63")]
    fn varint(&mut self) -> Result<u64, SnapshotError> {
        let mut n = 0u64;
        for i in 0..10u32 {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7F);
            if i == 9 && bits > 1 {
                return Err(corrupt("a number over 64 bits"));
            }
            n |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(corrupt("a number over 64 bits"))
    }

    fn bounded(&mut self, most: u64, what: &str) -> Result<&'a [u8], SnapshotError> {
        let len = self.varint()?;
        if len > most {
            return Err(corrupt(format!("{what} of {len} bytes (at most {most})")));
        }
        self.take(usize::try_from(len).unwrap_or(usize::MAX))
    }

    fn text(&mut self, most: u64, what: &str) -> Result<&'a str, SnapshotError> {
        std::str::from_utf8(self.bounded(most, what)?).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }
}

impl<K: DeserializeOwned> Parsed<K> {
    fn read(mut reader: impl Read) -> Result<Parsed<K>, SnapshotError> {
        let mut data = Vec::new();
        reader.read_to_end(&mut data)?;
        let mut src = Source { rest: &data };
        match src.take(MAGIC.len()) {
            Ok(magic) if magic == MAGIC => {}
            _ => return Err(SnapshotError::NotASnapshot),
        }
        let version = src.byte()?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version { found: version, supported: SNAPSHOT_VERSION });
        }
        let saved_at = src.take(8)?;
        let saved_at = u64::from_le_bytes(saved_at.try_into().map_err(|_| SnapshotError::Truncated)?);
        let mut parsed = Parsed {
            saved_at,
            policies: Vec::new(),
            records: Vec::new(),
            spans: Vec::new(),
            entries: Vec::new(),
            bytes: 0,
        };
        // An age beyond any window's reach (and its slot's) is no age a save writes.
        let most_age = i64::try_from(MAX_WINDOW.as_nanos().saturating_mul(2)).unwrap_or(i64::MAX);
        loop {
            match src.byte()? {
                END => break,
                POLICY => {
                    if parsed.policies.len() >= MAX_POLICIES {
                        return Err(corrupt(format!("more than {MAX_POLICIES} policies")));
                    }
                    let name = src.text(MAX_NAME_BYTES, "a policy name")?.to_owned();
                    let count = usize::from(src.byte()?);
                    if count == 0 || count > MAX_LIMITS {
                        return Err(corrupt(format!("a policy of {count} limits (1 to {MAX_LIMITS})")));
                    }
                    let mut limits = Vec::with_capacity(count);
                    for _ in 0..count {
                        let text = src.text(MAX_LIMIT_BYTES, "a limit")?;
                        let limit: Limit = text
                            .parse()
                            .map_err(|e| corrupt(format!("limit {text:?} does not parse: {e}")))?;
                        limits.push(limit);
                    }
                    parsed.policies.push((name, limits));
                }
                KEY => {
                    let bytes = src.bounded(MAX_KEY_BYTES, "a key")?;
                    let key: K = serde_json::from_slice(bytes)
                        .map_err(|e| SnapshotError::Key { message: e.to_string() })?;
                    let policy = usize::try_from(src.varint()?).unwrap_or(usize::MAX);
                    let Some((_, limits)) = parsed.policies.get(policy) else {
                        return Err(corrupt(format!(
                            "a key under policy {policy}, which is not defined before it"
                        )));
                    };
                    let first = parsed.spans.len();
                    for _ in 0..limits.len() {
                        let count = src.varint()?;
                        if count > MAX_ENTRIES {
                            return Err(corrupt(format!(
                                "a limit of {count} entries (at most {MAX_ENTRIES})"
                            )));
                        }
                        let from = parsed.entries.len();
                        for _ in 0..count {
                            let age = unzigzag(src.varint()?);
                            let units = src.varint()?;
                            if age.unsigned_abs() > most_age.unsigned_abs() {
                                return Err(corrupt(format!("an age of {age} ns")));
                            }
                            if units > MAX_UNITS {
                                return Err(corrupt(format!(
                                    "{units} units in one entry (at most {MAX_UNITS})"
                                )));
                            }
                            parsed.entries.push((age, units));
                        }
                        parsed.spans.push(from..parsed.entries.len());
                    }
                    parsed.records.push(Record { key, policy, limits: first..parsed.spans.len() });
                }
                tag => return Err(corrupt(format!("unknown item tag {tag}"))),
            }
        }
        let keys = src.varint()?;
        if keys != parsed.records.len() as u64 {
            return Err(corrupt(format!("{} keys where the end says {keys}", parsed.records.len())));
        }
        let body = data.len().saturating_sub(src.rest.len());
        let stored = src.take(4)?;
        let stored = u32::from_le_bytes(stored.try_into().map_err(|_| SnapshotError::Truncated)?);
        let computed = crc32fast::hash(data.get(..body).unwrap_or_default());
        if stored != computed {
            return Err(SnapshotError::Checksum { stored, computed });
        }
        if !src.rest.is_empty() {
            return Err(corrupt("bytes after the end"));
        }
        parsed.bytes = data.len() as u64;
        Ok(parsed)
    }
}
