//! Named background threads (the clock ticker, the sweeper) that stop and are joined when
//! their handle drops, so dropping a limiter leaves no thread behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// A thread that runs `work` every `interval` until this handle is dropped.
#[derive(Debug)]
pub(crate) struct Periodic {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Periodic {
    pub(crate) fn spawn(
        name: &str,
        interval: Duration,
        mut work: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new().name(name.to_owned()).spawn(move || {
            // Acquire pairs with the Release store in `drop`: once the flag is seen, this
            // thread does no more work on state its owner may be tearing down.
            while !flag.load(Ordering::Acquire) {
                work();
                thread::park_timeout(interval);
            }
        })?;
        Ok(Periodic { stop, thread: Some(thread) })
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        // Release pairs with the Acquire load in the loop above.
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            // A panic inside `work` is the only way this fails; there is nothing left to
            // stop then, and a Drop must not panic in turn.
            let _ = thread.join();
        }
    }
}
