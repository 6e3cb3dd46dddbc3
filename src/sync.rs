//! The one place atomics and locks come from, so that `loom` can stand in for `std` under
//! `--cfg slidegate_loom` (the same shim tokio and crossbeam use). The per-key state
//! (`protocol/`, `algorithm/`) and the key table (`table/`) go through it: those are the lock-free
//! protocols the loom models check, and the grace periods (`grace.rs`) that free their memory.
//! (`crossbeam-utils` follows with `--cfg crossbeam_loom`.)

#[cfg(not(slidegate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(slidegate_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(slidegate_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(slidegate_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
