//! The soak's table, and the counts that fail the run.

use std::fmt::Write as _;

use crate::checker::Stats;
use crate::workload::{Kind, Model, Spec};

/// The table, and what failed: every count below that must be zero, for every limiter.
pub fn report(kinds: &[Kind], stats: &[Stats]) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| limiter | limits | checks (check_all, shadow) | admitted units | refusals | resets | keys swept \
         | over-admissions (bound) | admitted with no room | most units in a window / max \
         | retry_after compared (exact) | short / long beyond slack (max ns) | refused with room \
         | early admissions | explained: long / early (by a larger max) | not analysed (raced a reset) |"
    );
    let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---|---:|---:|---|---:|");
    for (kind, s) in kinds.iter().zip(stats) {
        let limits: Vec<String> = kind.specs.iter().map(Spec::describe).collect();
        let over: u64 = s.over.iter().sum();
        let ratios: Vec<String> = kind
            .specs
            .iter()
            .enumerate()
            .map(|(l, spec)| {
                let max = spec.max.iter().copied().max().unwrap_or(1) as f64;
                let mut text = format!("{:.2}", s.most[l] as f64 / max);
                match kind.model {
                    Model::Interpolated => {
                        let _ = write!(text, " ({:.2} per n slots)", s.most_aligned[l] as f64 / max);
                    }
                    Model::Fixed => {
                        let _ = write!(text, " ({:.2} aligned)", s.most_aligned[l] as f64 / max);
                    }
                    _ => {}
                }
                text
            })
            .collect();
        let _ = writeln!(
            t,
            "| {} | {} | {} ({}, {}) | {} | {} | {} | {} | {over} ({}) | {} | {} | {} ({:.1} %) | {} / {} ({} / {}) \
             | {} | {} | {} / {} ({}) | {} |",
            kind.name,
            limits.join(" + "),
            s.checks,
            s.multi,
            s.shadow,
            s.admitted_units,
            s.refusals,
            s.resets,
            s.swept,
            kind.bound(),
            s.no_room,
            ratios.join(", "),
            s.analysed,
            100.0 * s.exact as f64 / s.analysed.max(1) as f64,
            s.short,
            s.long,
            s.short_max,
            s.long_max,
            s.room,
            s.early,
            s.long_explained,
            s.early_explained,
            s.early_larger,
            s.skipped,
        );
        let must_be_zero = [
            (over, "over-admissions"),
            (s.no_room, "admissions with no room"),
            (s.short, "retry_after earlier than the log allows"),
            (s.long, "retry_after later than the log allows, unexplained"),
            (s.room, "refusals with room"),
            (s.early, "early admissions, unexplained"),
            (s.other, "unexpected decisions"),
        ];
        for (count, what) in must_be_zero {
            if count > 0 {
                failures.push(format!("{}: {count} {what}", kind.name));
            }
        }
        if s.refusals == 0 || s.admitted_units == 0 || s.multi == 0 || s.shadow == 0 || s.resets == 0 {
            failures.push(format!(
                "{}: not every kind of traffic ran (checks {}, refusals {}, check_all {}, shadow {}, resets {})",
                kind.name, s.checks, s.refusals, s.multi, s.shadow, s.resets
            ));
        }
    }
    (failures, t)
}
