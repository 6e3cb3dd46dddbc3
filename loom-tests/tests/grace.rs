//! Loom models of the grace periods (`src/grace.rs`) that free what a check may still be
//! reading: a reader pins, loads a pointer and reads through it, while a writer swaps the
//! pointer out, defers its free and flushes (seals, advances the epoch, frees what is two
//! epochs old) again and again. The "free" writes the object's cell through loom's
//! `UnsafeCell`, so a free that is not ordered after the reader's read is a data race that
//! loom reports. Under loom both halves of the fence pair are SeqCst fences (the protocol
//! of `crossbeam-epoch`); `grace.rs` argues the asymmetric substitution the real build
//! makes.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests --test grace`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicPtr, Ordering};
use loom::sync::Arc;
use loom::thread;
use slidegate::model::{pin, Guard};

/// What the pointer points to: a value a reader reads, and a free that writes it.
struct Object {
    value: UnsafeCell<u64>,
}

/// Carries the swapped-out object to the deferred free, which may run on another thread.
struct Retired(*mut Object);
// SAFETY: the pointer is only dereferenced by the deferred free, once no reader holds it.
#[allow(unsafe_code)]
unsafe impl Send for Retired {}

fn object(value: u64) -> *mut Object {
    Box::into_raw(Box::new(Object { value: UnsafeCell::new(value) }))
}

/// Swaps object 2 in and defers the "free" of object 1: a write no read of a reader may
/// race with. The object is then leaked rather than deallocated, so a failing model reports
/// the race instead of touching freed memory.
fn retire_the_first(guard: &Guard, shared: &AtomicPtr<Object>) {
    let old = Retired(shared.swap(object(2), Ordering::AcqRel));
    // SAFETY: unreachable from now on; readers pinned before may hold it.
    #[allow(unsafe_code)]
    unsafe {
        guard.defer(move || {
            let old = old;
            (*old.0).value.with_mut(|v| *v = 0);
        });
    }
}

/// A reader pinned across a load and a read, against a writer that swaps, defers the free
/// and flushes `flushes` times (each flush may advance the epoch once). Every read sees 1
/// or 2, never a freed object: the free of object 1 is ordered after every read of it.
fn reader_against_a_free(flushes: usize, readers: usize) {
    loom::model(move || {
        let shared = Arc::new(AtomicPtr::new(object(1)));
        let handles: Vec<_> = (0..readers)
            .map(|_| {
                let shared = Arc::clone(&shared);
                thread::spawn(move || {
                    let guard = pin();
                    let found = shared.load(Ordering::Acquire);
                    // SAFETY: loaded while pinned: freed only after this guard drops.
                    #[allow(unsafe_code)]
                    let value = unsafe { (*found).value.with(|v| *v) };
                    assert!(value == 1 || value == 2, "read {value}: a freed object");
                    drop(guard);
                })
            })
            .collect();
        retire_the_first(&pin(), &shared);
        for _ in 0..flushes {
            pin().flush();
        }
        for handle in handles {
            handle.join().unwrap();
        }
        // Everything is quiet: a few more flushes free object 1 for certain.
        for _ in 0..3 {
            pin().flush();
        }
        let last = shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: no reader is left.
        #[allow(unsafe_code)]
        drop(unsafe { Box::from_raw(last) });
    });
}

#[test]
fn a_free_waits_for_a_pinned_reader() {
    reader_against_a_free(3, 1);
}

#[test]
fn a_free_waits_for_two_pinned_readers() {
    reader_against_a_free(2, 2);
}

/// A reader that pinned while the writer's own guard held the epoch back, and flushes
/// from the reader's side too: the collection may run on either thread.
#[test]
fn a_free_run_by_the_reader_waits_for_the_reader() {
    loom::model(|| {
        let shared = Arc::new(AtomicPtr::new(object(1)));
        let reader = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                for _ in 0..2 {
                    let guard = pin();
                    let found = shared.load(Ordering::Acquire);
                    // SAFETY: loaded while pinned.
                    #[allow(unsafe_code)]
                    let value = unsafe { (*found).value.with(|v| *v) };
                    assert!(value == 1 || value == 2, "read {value}: a freed object");
                    guard.flush();
                }
            })
        };
        let guard = pin();
        retire_the_first(&guard, &shared);
        guard.flush();
        drop(guard);
        pin().flush();
        reader.join().unwrap();
        let last = shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: no reader is left.
        #[allow(unsafe_code)]
        drop(unsafe { Box::from_raw(last) });
    });
}
