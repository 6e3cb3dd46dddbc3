//! Loom models of the key table's memory reclamation (`src/reclaim.rs`): readers pin with
//! plain stores, a reclaimer frees what it unlinked only after a barrier and an epoch scan
//! show that no reader pinned before the unlink is still pinned. Under loom both barriers
//! are `SeqCst` fences (the protocol's classic form); the models check that an object is
//! never freed while a reader that loaded it is pinned, and that it is freed once no reader
//! holds it.
//!
//! Run (from the workspace root):
//! `RUSTFLAGS="--cfg slidegate_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release -p slidegate-loom-tests`
#![cfg(slidegate_loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use loom::sync::Arc;
use loom::thread;
use slidegate::model::{collect, pin};

/// What readers load through the shared pointer. The deferred "free" only sets `freed`
/// (the model frees the memory itself at the end), so a reader that sees it set while
/// pinned would, in the real table, have read freed memory.
struct Object {
    freed: AtomicBool,
}

/// A reader loads the pointer and reads the object while pinned; the reclaimer unlinks it,
/// defers its free and collects (twice, as a sweep's `settle` would, and once more after
/// the reader is done). The object is never freed under the reader, and always freed at
/// the end.
#[test]
fn a_free_never_overtakes_a_pinned_reader() {
    loom::model(|| {
        let object = Box::into_raw(Box::new(Object { freed: AtomicBool::new(false) }));
        let shared = Arc::new(AtomicPtr::new(object));
        let reader = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let _guard = pin();
                let seen = shared.load(Ordering::Acquire);
                if !seen.is_null() {
                    // SAFETY: loaded while pinned: not freed until we unpin (what the model checks).
                    #[allow(unsafe_code)]
                    let object = unsafe { &*seen };
                    assert!(!object.freed.load(Ordering::Relaxed), "read after the free");
                }
            })
        };
        let unlinked = shared.swap(std::ptr::null_mut(), Ordering::AcqRel);
        struct Owned(*mut Object);
        // SAFETY (for the model): the pointer crosses to whichever thread runs the free.
        #[allow(unsafe_code)]
        unsafe impl Send for Owned {}
        let owned = Owned(unlinked);
        pin().defer(move || {
            let owned = owned;
            // SAFETY: alive until the model's end.
            #[allow(unsafe_code)]
            unsafe { &*owned.0 }.freed.store(true, Ordering::Relaxed);
        });
        collect();
        reader.join().unwrap();
        collect();
        // SAFETY: unlinked, and the reader is done.
        #[allow(unsafe_code)]
        let object = unsafe { Box::from_raw(unlinked) };
        assert!(object.freed.load(Ordering::Relaxed), "never freed once no reader was pinned");
    });
}
