//! The thread behind a device with a backend (vsock, net): started by whoever builds the
//! VM, woken through an eventfd, stopped and joined when its handle is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use vmm_sys_util::eventfd::EventFd;

/// A running backend thread; dropping it asks the thread to stop, wakes it, and joins it.
#[derive(Debug)]
pub struct BackendThread {
    kick: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BackendThread {
    /// Starts thread `name` running `body(kick, stop)`: `body` must return soon after
    /// `stop` is set, which comes with a write to `kick` (a non-blocking eventfd).
    pub fn spawn(
        name: &str,
        kick: Arc<EventFd>,
        body: impl FnOnce(&EventFd, &AtomicBool) + Send + 'static,
    ) -> std::io::Result<BackendThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_kick, thread_stop) = (kick.clone(), stop.clone());
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || body(&thread_kick, &thread_stop))?;
        Ok(BackendThread { kick, stop, thread: Some(thread) })
    }
}

impl Drop for BackendThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.kick.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
