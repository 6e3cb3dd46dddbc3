//! The one place atomics come from, so that `loom` can stand in for `std` under
//! `--cfg slidegate_loom` (the same shim tokio and crossbeam use). Only the per-key state
//! (`window.rs`) goes through it: that is the lock-free protocol the loom models check.

#[cfg(not(slidegate_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(slidegate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
