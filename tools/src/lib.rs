//! The parts slidegate's measuring tools share: the workloads the criterion bench and
//! `bench_report` both time (so the bench and the performance guide's table run the same
//! loops), the gateway set-up of `gateway_report` and the bench's layer group, and, from the
//! integration tests' support, the counting allocator, the resident-set reader and the
//! seeded generator.
//!
//! The binaries in `src/bin` are the reports; `figures` runs them all and writes their
//! tables into the README and the guides.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod workloads;

#[cfg(feature = "gateway")]
pub mod gateway;

#[path = "../../tests/support/counting_alloc.rs"]
pub mod counting_alloc;

#[path = "../../tests/support/rss.rs"]
pub mod rss;

#[path = "../../tests/support/rng.rs"]
#[allow(clippy::should_implement_trait)]
pub mod rng;

/// `v` with a comma between each group of three digits: `1,000,000`.
pub fn thousands(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
