//! What a check may have counted besides the admissions before it: the records that may
//! have committed units into a key, as the checker keeps them, and the units each may
//! have left.
//!
//! The units that no admission accounts for are these, and only these. They widen what a
//! refusal may have seen (`upper`, and so refusals with room, late waits and early
//! admissions), never what an admission certainly saw (`lower`) nor the over-admission
//! scan: no tolerance here can hide an over-admission, only explain a refusal. A check that
//! rolls back and was refused (here or by another key) may have committed only if one of
//! its views had room, which needs room with the units certainly counted before it began
//! (`lower` within its bracket); otherwise it counts for nothing.
//! - **transient**: a check that rolls back (several limits, or `check_all`) commits limit
//!   by limit, key by key, and takes its units back when a later one has no room. A check
//!   overlapping it may see them: its cost counts as possible for overlapping refusals.
//! - **left behind**: a rollback that finds the slot it counted in already closed leaves
//!   the units there (the protocol's conservative error, design guide). The closing check
//!   read a clock no later than the rolled-back check's end, and the units were committed
//!   in a slot no earlier than its start: a sliding window can keep at most one cost per
//!   slot boundary (of that limit's precision) inside the rolled-back check's clock
//!   bracket, so a check with a bracket of zero width leaves nothing. A fixed window's
//!   rollback in a closed window leaves units nobody counts again (every later check is in
//!   a later window), and a sliding log's rollback takes entries back by their stamp:
//!   neither leaves any. GCRA takes a rollback back only while the word still holds the
//!   value it wrote; after another commit it leaves the units. Each cost left needs
//!   another check's commit to land on the word between this check's commit and its
//!   rollback: the checker allows one per check that overlapped it and may have committed
//!   on the key. A racing check that itself rolled back and committed again could land a
//!   second one; the checker does not allow for it (it would show as a refusal with room,
//!   a failure, not hide one). What a check left behind counts for its own later
//!   attempts too: a check that starts over after such a rollback may see its own units.

use crate::model::Unit;
use crate::workload::{Kind, Model, Rec};

/// A record that may have committed units into the key, as the checker keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Adm {
    pub b: u64,
    pub a: u64,
    pub sb: u64,
    pub sa: u64,
    /// Units admitted (0: refused, here or by another key).
    pub admitted: u64,
    /// The check's cost.
    pub cost: u64,
    /// Counted for certain by the checks certainly after it (admitted, and on the same
    /// side of every reset).
    pub sure: bool,
    /// It rolls back (several limits, or several keys).
    pub rolls: bool,
    /// Checks of the key that overlapped it and may have committed.
    pub overlapping: u32,
}

impl Adm {
    pub fn of(r: &Rec, sure: bool, rolls: bool, overlapping: u32) -> Adm {
        let cost = u64::from(r.cost);
        let admitted = if r.admitted() { cost } else { 0 };
        Adm { b: r.b, a: r.a, sb: r.sb, sa: r.sa, admitted, cost, sure, rolls, overlapping }
    }

    /// The most units it may have left counted in limit `spec` of `kind` for a check
    /// whose sequence bracket starts at `r_sb` (see the module's essay).
    pub fn maybe(&self, kind: &Kind, spec: usize, r_sb: u64) -> u64 {
        let transient = self.rolls && self.sa > r_sb;
        let base = if self.admitted > 0 {
            self.admitted
        } else if transient {
            self.cost
        } else {
            0
        };
        base + self.left_behind(kind, spec)
    }

    /// Whether a check whose sequence bracket starts at `next` or later can count any of
    /// its units.
    pub fn matters(&self, kind: &Kind, next: u64) -> bool {
        self.admitted > 0 || self.sa > next || (0..kind.specs.len()).any(|l| self.left_behind(kind, l) > 0)
    }

    pub fn left_behind(&self, kind: &Kind, spec: usize) -> u64 {
        if !self.rolls {
            return 0;
        }
        match kind.model {
            Model::Strict | Model::Interpolated => {
                let p = kind.specs[spec].precision;
                self.cost * (self.a / p - self.b / p)
            }
            Model::Gcra => self.cost * u64::from(self.overlapping),
            Model::Fixed | Model::Log => 0,
        }
    }
}

pub fn unit(x: &Adm, units: u64) -> Unit {
    Unit { b: x.b, a: x.a, sb: x.sb, sa: x.sa, units }
}
