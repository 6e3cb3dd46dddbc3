//! The checker's state for one limiter, fed one round of records at a time: per key, the
//! pass in sequence order (`track.rs`) and the over-admission scan (`window.rs`).

use crate::track::Track;
use crate::window::{Hist, Scan};
use crate::workload::{Kind, Rec, ALL_KEYS};

/// Per limiter: what happened and what the checker found.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Records (one per key an operation touched; a `check_all` makes one per key).
    pub checks: u64,
    /// Of which from `check_all`, and on shadow keys.
    pub multi: u64,
    pub shadow: u64,
    pub admitted_units: u64,
    pub refusals: u64,
    /// `check_all` records of keys that did not refuse, when another key did.
    pub nothing: u64,
    pub resets: u64,
    pub other: u64,
    pub swept: u64,
    /// Per limit: over-admissions (admissions that break the bound wherever they were
    /// decided), the most units certainly in one window, and (interpolated, fixed) in
    /// one aligned run.
    pub over: Vec<u64>,
    pub most: Vec<u64>,
    pub most_aligned: Vec<u64>,
    /// Admissions tested by the scan, and those whose brackets held too many clock values
    /// to place.
    pub placed: u64,
    pub unplaced: u64,
    /// Admissions replayed against what certainly came before them, and those that had
    /// no room.
    pub replayed: u64,
    pub no_room: u64,
    /// Refusals whose `retry_after` was compared, and those where the comparison was exact
    /// (clock brackets of zero width and no admission of uncertain order).
    pub analysed: u64,
    pub exact: u64,
    pub short: u64,
    pub short_max: u64,
    pub room: u64,
    pub long: u64,
    pub long_max: u64,
    pub long_explained: u64,
    pub early: u64,
    pub early_explained: u64,
    /// Of which explained only by a larger `max` that may have decided the admission.
    pub early_larger: u64,
    /// Records that overlap a reset of their key: not analysed.
    pub skipped: u64,
    /// The first few failures in full, for the report.
    pub examples: Vec<String>,
}

impl Stats {
    /// Keeps the first few failures' descriptions (made only when kept).
    pub fn example(&mut self, text: impl FnOnce() -> String) {
        if self.examples.len() < 5 {
            self.examples.push(text());
        }
    }
}

/// The clock values the driver set, in order, from the oldest bracket still to be placed.
#[derive(Default)]
pub struct Held {
    values: Vec<u64>,
}

impl Held {
    pub fn extend(&mut self, round: Vec<u64>) {
        self.values.extend(round);
    }

    /// Forgets the values before `t`.
    pub fn prune(&mut self, t: u64) {
        let gone = self.values.partition_point(|&v| v < t);
        self.values.drain(..gone);
    }

    pub fn values(&self) -> &[u64] {
        &self.values
    }
}

pub struct Checker {
    tracks: Vec<Track>,
    scans: Vec<Scan>,
    fresh: Vec<Hist>,
    pub stats: Stats,
}

impl Checker {
    pub fn new(kind: &Kind) -> Checker {
        let n = kind.specs.len();
        Checker {
            tracks: (0..ALL_KEYS).map(|_| Track::new(kind)).collect(),
            scans: (0..ALL_KEYS).map(|_| Scan::default()).collect(),
            fresh: Vec::new(),
            stats: Stats { over: vec![0; n], most: vec![0; n], most_aligned: vec![0; n], ..Stats::default() },
        }
    }

    /// One round's records of this limiter; `floor`: the clock when the round ended.
    pub fn round(&mut self, kind: &Kind, mut recs: Vec<Rec>, floor: u64, held: &Held) {
        recs.sort_unstable_by_key(|r| (r.key, r.sb));
        let mut rest = &recs[..];
        let mut seen = vec![false; ALL_KEYS];
        while let Some(first) = rest.first() {
            let key = usize::from(first.key);
            let n = rest.partition_point(|r| usize::from(r.key) == key);
            self.tracks[key].pass(
                kind,
                key,
                &rest[..n],
                floor,
                held.values(),
                &mut self.stats,
                &mut self.fresh,
            );
            self.scans[key].round(kind, key, &mut self.fresh, floor, held.values(), &mut self.stats);
            seen[key] = true;
            rest = &rest[n..];
        }
        // Keys with no record this round may still hold admissions to test.
        for (key, scan) in self.scans.iter_mut().enumerate().filter(|&(key, _)| !seen[key]) {
            scan.round(kind, key, &mut Vec::new(), floor, held.values(), &mut self.stats);
        }
    }

    /// The earliest bracket start still to be tested.
    pub fn oldest(&self) -> u64 {
        self.scans.iter().map(Scan::oldest).min().unwrap_or(u64::MAX)
    }

    /// After the last round: every admission is final.
    pub fn finish(&mut self, kind: &Kind, held: &Held) {
        for (key, scan) in self.scans.iter_mut().enumerate() {
            scan.round(kind, key, &mut Vec::new(), u64::MAX, held.values(), &mut self.stats);
        }
    }
}
