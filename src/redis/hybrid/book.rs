//! A hybrid replica's bookkeeping of the keys it syncs, and which of them each sync takes.
//!
//! Per key: Redis's total (`n` in the key's `:book`) after this replica's last sync of it,
//! the units admitted here and not yet pushed (owed), when it was last admitted here, and
//! how often to pull it while it owes nothing. At most `max_keys` keys; each index below
//! is a `BTreeMap`, so that a sync costs O(log n) per key it touches and nothing per key it
//! does not:
//!
//! * `lru`: every key, by its last admission here: the idle ones are forgotten from the
//!   front, and a new key beyond `max_keys` evicts from there (the first that owes nothing
//!   among the 64 least recently admitted, else the least recently admitted, whose owed
//!   units are then counted as dropped);
//! * `heaviest` and `oldest`: the keys that owe, by owed units (powers of two, most first,
//!   then oldest) and by when they began to owe;
//! * `pulls`: the keys that owe nothing, by backoff level, then due sync, then age. A pull
//!   that finds other replicas' units, or of a key at its limit here (whose units leaving
//!   the window reopen it, the moment the others' news matters most), puts the key at
//!   level 0 (pulled every sync); any other doubles its period, up to [`MAX_LEVEL`].
//!
//! A sync [`take`](Book::take)s at most its budget of keys: the half that owe most, then a
//! quarter of due pulls, then the keys owing longest, then more due pulls. So the keys that
//! owe most are pushed every sync; every owed unit is pushed within `owing keys ÷ (budget ÷
//! 4)` syncs; and at least a quarter of the budget pulls, while pulls are due.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The longest pull period, as a power of two of syncs: 2³ = every 8th sync.
pub(super) const MAX_LEVEL: u8 = 3;

/// How many of the least recently admitted keys an eviction looks through for one that
/// owes nothing.
const EVICTION_SCAN: usize = 64;

/// The most units one push sends: the script computes in doubles, exact below 2⁵³ (the
/// rest goes with the next sync).
const MOST_PER_PUSH: u64 = (1 << 53) - 1;

struct Slot<K> {
    key: K,
    /// Redis's total after this replica's last sync of the key (`None` before the first).
    total: Option<u64>,
    /// Units admitted here, not yet pushed.
    owed: u64,
    /// The key's place in `oldest` (and `heaviest`) while it owes.
    owe_seq: u64,
    /// The owed units' bucket in `heaviest` (their bit length).
    weight: u32,
    /// The key's place in `lru`, and when it was last admitted here.
    active_seq: u64,
    active_at: Instant,
    /// Pull backoff: every `2^level` syncs; due at sync `due`; `pull_seq` orders ties.
    level: u8,
    due: u64,
    pull_seq: u64,
}

/// What a sync of a key says of the other replicas' units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard {
    /// Units the others added to Redis's total since this replica's last sync of the key.
    Since(u64),
    /// This replica's first sync of the key (new to it, forgotten after the TTL, evicted at
    /// `max_keys`, or a restart): Redis's total counts every unit since the key's
    /// bookkeeping last expired, so it says nothing about the window; `unpushed` are the
    /// units this replica owes beyond this push.
    First { unpushed: u64 },
}

/// A key a sync took: push `units` (0 for a pull).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pick {
    pub(super) id: usize,
    pub(super) units: u64,
}

/// Every key this replica syncs: see the [module docs](self).
pub(super) struct Book<K> {
    index: HashMap<K, usize>,
    slots: Vec<Option<Slot<K>>>,
    free: Vec<usize>,
    lru: BTreeMap<u64, usize>,
    heaviest: BTreeMap<(Reverse<u32>, u64), usize>,
    oldest: BTreeMap<u64, usize>,
    pulls: BTreeMap<(u8, u64, u64), usize>,
    /// Syncs so far (pull periods count in them), and the source of every `*_seq`.
    tick: u64,
    seq: u64,
    owed_units: u64,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone> Book<K> {
    pub(super) fn new(max_keys: usize) -> Book<K> {
        Book {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            lru: BTreeMap::new(),
            heaviest: BTreeMap::new(),
            oldest: BTreeMap::new(),
            pulls: BTreeMap::new(),
            tick: 0,
            seq: 0,
            owed_units: 0,
            max_keys: max_keys.max(1),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Keys that owe units, and the units they owe.
    pub(super) fn owing(&self) -> (usize, u64) {
        (self.oldest.len(), self.owed_units)
    }

    /// Starts a sync: pulls due at this sync are taken from now on.
    pub(super) fn new_sync(&mut self) {
        self.tick = self.tick.wrapping_add(1);
    }

    /// The key of `id` (a [`Pick`]'s).
    pub(super) fn key(&self, id: usize) -> Option<&K> {
        self.slot(id).map(|s| &s.key)
    }

    fn slot(&self, id: usize) -> Option<&Slot<K>> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, id: usize) -> Option<&mut Slot<K>> {
        self.slots.get_mut(id).and_then(Option::as_mut)
    }

    /// `units` admitted here for `key` at `now`: owed until pushed. Returns the owed units
    /// of a key evicted to make room (0 if none), which no replica will hear of.
    pub(super) fn admit(&mut self, key: &K, units: u64, now: Instant) -> u64 {
        let mut dropped = 0;
        let id = match self.index.get(key) {
            Some(&id) => id,
            None => {
                if self.index.len() >= self.max_keys {
                    dropped = self.evict();
                }
                self.insert(key.clone(), now)
            }
        };
        let active_seq = self.next_seq();
        let owe_seq = self.next_seq();
        let Some(slot) = self.slot_mut(id) else { return dropped };
        let (old_active, was_owing) = (slot.active_seq, slot.owed > 0);
        let (old_weight, old_owe, old_pull) =
            (slot.weight, slot.owe_seq, (slot.level, slot.due, slot.pull_seq));
        slot.owed = slot.owed.saturating_add(units);
        slot.weight = weight(slot.owed);
        slot.active_seq = active_seq;
        slot.active_at = now;
        if !was_owing {
            slot.owe_seq = owe_seq;
        }
        let (new_weight, new_owe) = (slot.weight, slot.owe_seq);
        self.owed_units = self.owed_units.saturating_add(units);
        self.lru.remove(&old_active);
        self.lru.insert(active_seq, id);
        if was_owing {
            self.heaviest.remove(&(Reverse(old_weight), old_owe));
        } else {
            self.pulls.remove(&old_pull);
            self.oldest.insert(new_owe, id);
        }
        self.heaviest.insert((Reverse(new_weight), new_owe), id);
        dropped
    }

    fn insert(&mut self, key: K, now: Instant) -> usize {
        let slot = Slot {
            key: key.clone(),
            total: None,
            owed: 0,
            owe_seq: 0,
            weight: 0,
            active_seq: 0,
            active_at: now,
            level: 0,
            due: self.tick,
            pull_seq: self.next_seq(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(place) = self.slots.get_mut(id) {
                    *place = Some(slot);
                }
                id
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len().saturating_sub(1)
            }
        };
        self.index.insert(key, id);
        // Not in `pulls` yet: `admit` puts it in the owing indexes at once.
        id
    }

    /// Makes room for one key: the first among the [`EVICTION_SCAN`] least recently
    /// admitted that owes nothing, else the least recently admitted. Returns its owed units.
    fn evict(&mut self) -> u64 {
        let idle = self
            .lru
            .values()
            .take(EVICTION_SCAN)
            .copied()
            .find(|&id| self.slot(id).is_some_and(|s| s.owed == 0));
        match idle.or_else(|| self.lru.values().next().copied()) {
            Some(id) => self.remove(id),
            None => 0,
        }
    }

    /// Forgets `id` (wherever it is indexed) and returns the units it still owed.
    pub(super) fn remove(&mut self, id: usize) -> u64 {
        let Some(slot) = self.slots.get_mut(id).and_then(Option::take) else { return 0 };
        self.index.remove(&slot.key);
        self.lru.remove(&slot.active_seq);
        if slot.owed > 0 {
            self.heaviest.remove(&(Reverse(slot.weight), slot.owe_seq));
            self.oldest.remove(&slot.owe_seq);
        } else {
            self.pulls.remove(&(slot.level, slot.due, slot.pull_seq));
        }
        self.owed_units = self.owed_units.saturating_sub(slot.owed);
        self.free.push(id);
        slot.owed
    }

    /// Forgets keys not admitted here for `after` (and owing nothing), looking at no more
    /// than `scan` of the least recently admitted. Returns how many it forgot.
    pub(super) fn forget_idle(&mut self, now: Instant, after: Duration, scan: usize) -> usize {
        let idle: Vec<usize> = self
            .lru
            .values()
            .take(scan)
            .copied()
            .take_while(|&id| {
                self.slot(id).is_some_and(|s| now.saturating_duration_since(s.active_at) >= after)
            })
            .filter(|&id| self.slot(id).is_some_and(|s| s.owed == 0))
            .collect();
        for &id in &idle {
            self.remove(id);
        }
        idle.len()
    }

    /// Takes at most `budget` keys for this sync (see the [module docs](self)); each is
    /// out of every index until [`synced`](Book::synced), [`put_back`](Book::put_back) or
    /// [`remove`](Book::remove) is called for it.
    pub(super) fn take(&mut self, budget: usize) -> Vec<Pick> {
        let mut picks = Vec::new();
        self.take_owing(&mut picks, budget / 2, true);
        self.take_pulls(&mut picks, (budget / 2).saturating_add(budget / 4));
        self.take_owing(&mut picks, budget, false);
        self.take_pulls(&mut picks, budget);
        picks
    }

    /// Owing keys, heaviest or oldest first, until `picks` holds `upto`.
    fn take_owing(&mut self, picks: &mut Vec<Pick>, upto: usize, heaviest: bool) {
        while picks.len() < upto {
            let first = if heaviest {
                self.heaviest.first_key_value().map(|(_, &id)| id)
            } else {
                self.oldest.first_key_value().map(|(_, &id)| id)
            };
            let Some(id) = first else { return };
            let Some(slot) = self.slot(id) else { return };
            let (weight, owe_seq, units) = (slot.weight, slot.owe_seq, slot.owed.min(MOST_PER_PUSH));
            self.heaviest.remove(&(Reverse(weight), owe_seq));
            self.oldest.remove(&owe_seq);
            picks.push(Pick { id, units });
        }
    }

    /// Pulls due at this sync, lowest level first, then most overdue, until `picks` holds
    /// `upto`.
    fn take_pulls(&mut self, picks: &mut Vec<Pick>, upto: usize) {
        for level in 0..=MAX_LEVEL {
            while picks.len() < upto {
                let due = self.pulls.range((level, 0, 0)..=(level, self.tick, u64::MAX)).next();
                let Some((&place, &id)) = due else { break };
                self.pulls.remove(&place);
                picks.push(Pick { id, units: 0 });
            }
        }
    }

    /// Redis answered `total` for `pick`: hands `record` the key and what the sync says of
    /// the other replicas' units ([`Heard`]), and returns the units `record` counted into
    /// the local limiter. `record` also says whether the key is at its limit here: such a
    /// key, and one that heard of units of the others, is pulled at the next sync; any other
    /// backs off.
    pub(super) fn synced(
        &mut self,
        pick: Pick,
        total: u64,
        record: impl FnOnce(&K, Heard) -> (u64, bool),
    ) -> u64 {
        let (tick, pull_seq) = (self.tick, self.next_seq());
        let Some(slot) = self.slot_mut(pick.id) else { return 0 };
        let heard = match slot.total {
            Some(before) => Heard::Since(total.saturating_sub(before.saturating_add(pick.units))),
            None => Heard::First { unpushed: slot.owed.saturating_sub(pick.units) },
        };
        let (others, at_limit) = record(&slot.key, heard);
        slot.total = Some(total);
        slot.owed = slot.owed.saturating_sub(pick.units);
        slot.level = if others > 0 || at_limit { 0 } else { slot.level.saturating_add(1).min(MAX_LEVEL) };
        slot.due = tick.saturating_add(1 << slot.level);
        slot.pull_seq = pull_seq;
        self.owed_units = self.owed_units.saturating_sub(pick.units);
        self.put_back(pick.id);
        others
    }

    /// Puts `id` back in the indexes its state calls for (a pick Redis did not answer
    /// keeps its place: owed units, or a pull that is still due).
    pub(super) fn put_back(&mut self, id: usize) {
        let Some(slot) = self.slot_mut(id) else { return };
        slot.weight = weight(slot.owed);
        let (owed, weight, owe_seq) = (slot.owed, slot.weight, slot.owe_seq);
        let pull = (slot.level, slot.due, slot.pull_seq);
        if owed > 0 {
            self.heaviest.insert((Reverse(weight), owe_seq), id);
            self.oldest.insert(owe_seq, id);
        } else {
            self.pulls.insert(pull, id);
        }
    }
}

/// The bucket of `units` in `heaviest`: their bit length (so 1, 2-3, 4-7, ...).
fn weight(units: u64) -> u32 {
    u64::BITS.saturating_sub(units.leading_zeros())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::arithmetic_side_effects, clippy::indexing_slicing)]
    use super::*;

    /// A `record` that counts what the others added since the last sync (nothing on a first).
    fn since(_: &u64, heard: Heard) -> (u64, bool) {
        match heard {
            Heard::Since(others) => (others, false),
            Heard::First { .. } => (0, false),
        }
    }

    fn keys(book: &Book<u64>, picks: &[Pick]) -> Vec<(u64, u64)> {
        picks.iter().map(|p| (*book.key(p.id).unwrap(), p.units)).collect()
    }

    /// Every index agrees with the slots: each live key in `lru`, and in the owing indexes
    /// or in `pulls` by its owed units (`out`: taken and not yet back).
    fn consistent(book: &Book<u64>, out: &[usize]) {
        assert_eq!(book.index.len(), book.lru.len());
        let live: Vec<usize> = book.index.values().copied().collect();
        let owing = live.iter().filter(|&&id| book.slot(id).unwrap().owed > 0).count();
        let out_owing = out.iter().filter(|&&id| book.slot(id).unwrap().owed > 0).count();
        assert_eq!(book.oldest.len() + out_owing, owing);
        assert_eq!(book.heaviest.len(), book.oldest.len());
        assert_eq!(book.pulls.len() + out.len() - out_owing, live.len() - owing);
        let units: u64 = live.iter().map(|&id| book.slot(id).unwrap().owed).sum();
        assert_eq!(book.owed_units, units);
    }

    #[test]
    fn a_sync_takes_the_heaviest_half_then_pulls_then_the_oldest() {
        let now = Instant::now();
        let mut book = Book::new(1000);
        // 100 keys owing 1 unit each (a spray), then 4 keys owing 5 (active), oldest first.
        for k in 0..100 {
            book.admit(&k, 1, now);
        }
        for k in 1000..1004 {
            book.admit(&k, 5, now);
        }
        book.new_sync();
        let picks = book.take(8);
        let taken = keys(&book, &picks);
        // The 4 heaviest, then (no pulls due) the 4 oldest.
        assert_eq!(taken, [(1000, 5), (1001, 5), (1002, 5), (1003, 5), (0, 1), (1, 1), (2, 1), (3, 1)]);
        consistent(&book, &picks.iter().map(|p| p.id).collect::<Vec<_>>());
        for p in &picks {
            assert_eq!(book.synced(*p, p.units, since), 0);
        }
        consistent(&book, &[]);
        assert_eq!(book.owing(), (96, 96));
        // The pushed keys are pulled at their due sync, at most a quarter of the budget
        // while others owe: a pushed key is due 2 syncs later (level 1).
        book.new_sync();
        let picks = book.take(8);
        let taken = keys(&book, &picks);
        assert!(taken.iter().all(|&(_, units)| units == 1), "{taken:?}");
        book.new_sync();
        let picks = book.take(8);
        let pulls = picks.iter().filter(|p| p.units == 0).count();
        assert_eq!(pulls, 2, "{:?}", keys(&book, &picks));
    }

    #[test]
    fn pulls_back_off_while_nothing_changes_and_reset_when_something_does() {
        let now = Instant::now();
        let mut book = Book::new(10);
        book.admit(&7, 1, now);
        let mut total = 0;
        let mut pulled_at = Vec::new();
        for sync in 1..=40u64 {
            book.new_sync();
            // Another replica adds 3 units at sync 30.
            if sync == 30 {
                total += 3;
            }
            for p in book.take(4) {
                total += p.units;
                let others = book.synced(p, total, since);
                pulled_at.push((sync, others));
            }
        }
        // Pushed at 1 (level 1), pulled at 3 (level 2), 7 (3), 15, 23, 31 (every 8th), and
        // after the change, every sync.
        let syncs: Vec<u64> = pulled_at.iter().map(|&(s, _)| s).collect();
        assert_eq!(&syncs[..6], [1, 3, 7, 15, 23, 31]);
        assert_eq!(pulled_at[5], (31, 3), "the change is found at the next due pull");
        assert_eq!(&syncs[6..8], [32, 34], "then pulled every sync, backing off again");
    }

    #[test]
    fn at_max_keys_a_new_key_evicts_an_idle_one_else_the_oldest_and_counts_its_units() {
        let now = Instant::now();
        let mut book = Book::new(3);
        for k in 0..3 {
            assert_eq!(book.admit(&k, 2, now), 0);
        }
        // Key 1 pushed: it owes nothing, so it goes first although 0 is older.
        book.new_sync();
        let picks = book.take(3);
        for p in picks {
            if *book.key(p.id).unwrap() == 1 {
                book.synced(p, p.units, since);
            } else {
                book.put_back(p.id);
            }
        }
        assert_eq!(book.admit(&3, 1, now), 0);
        assert_eq!(book.len(), 3);
        assert!(!book.index.contains_key(&1));
        // All owe now: the least recently admitted (0) goes, with its 2 units.
        assert_eq!(book.admit(&4, 1, now), 2);
        assert!(!book.index.contains_key(&0));
        assert_eq!(book.owing(), (3, 4));
        consistent(&book, &[]);
    }

    #[test]
    fn idle_keys_are_forgotten_unless_they_owe() {
        let start = Instant::now();
        let mut book = Book::new(10);
        book.admit(&1, 1, start);
        book.admit(&2, 1, start);
        book.new_sync();
        let picks = book.take(10);
        let one = picks.iter().find(|p| *book.key(p.id).unwrap() == 1).copied().unwrap();
        book.synced(one, 1, since);
        let two = picks.iter().find(|p| *book.key(p.id).unwrap() == 2).copied().unwrap();
        book.put_back(two.id);
        book.admit(&3, 1, start + Duration::from_secs(5));
        let later = start + Duration::from_secs(61);
        assert_eq!(book.forget_idle(later, Duration::from_secs(60), 100), 1);
        assert!(!book.index.contains_key(&1), "idle and owing nothing");
        assert!(book.index.contains_key(&2), "idle, but still owes");
        assert!(book.index.contains_key(&3), "admitted within the minute");
        consistent(&book, &[]);
    }

    #[test]
    fn every_owing_key_is_taken_within_owing_over_a_quarter_of_the_budget_syncs() {
        let now = Instant::now();
        let mut book = Book::new(10_000);
        for k in 0..1000 {
            book.admit(&k, 1, now);
        }
        let mut syncs = 0;
        while book.owing().0 > 0 {
            syncs += 1;
            book.new_sync();
            // New heavy keys every sync take the heaviest half.
            for k in 0..32 {
                book.admit(&(100_000 + syncs * 100 + k), 4, now);
            }
            for p in book.take(64) {
                let before = book.slot(p.id).unwrap().total.unwrap_or(0);
                book.synced(p, before + p.units, since);
            }
            assert!(syncs <= 1000 / 16 + 1, "still {} owing after {syncs} syncs", book.owing().0);
        }
    }
}
