//! The one place atomics and locks come from, so that `loom` can stand in for `std` under
//! `--cfg slidegate_loom` (the same shim tokio and crossbeam use). The per-key state
//! (`protocol.rs`, `algorithm/`) and the key table (`table.rs`) go through it: those are the lock-free
//! protocols the loom models check, and the table's reclamation (`reclaim.rs`).

#[cfg(not(slidegate_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(slidegate_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(slidegate_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(slidegate_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
