//! The threads that serve connections: a few wait, already started, for the next one.
//!
//! Starting a thread costs the guest kernel a `clone`, a stack mapping and its first page
//! faults: about 0.3 s of guest time where the kernel is emulated (PLATFORM.md), more
//! than everything else a ping or an identity needs. A thread per connection made every
//! call pay it, and a fork's first answer twice (ping, identity). So [`IDLE_WORKERS`]
//! threads are started with the agent, before the template snapshot (every clone wakes
//! with them waiting), take connections from a queue and go back to waiting. A
//! connection that finds none idle (all busy with long execs) gets a new thread, which
//! joins the waiting ones afterwards if fewer than [`IDLE_WORKERS`] wait, else ends: a
//! slow call never blocks the accept loop, and a burst leaves no crowd of threads.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Threads kept waiting for connections.
pub const IDLE_WORKERS: usize = 4;

/// Hands connections to waiting threads, or to new ones.
pub struct Workers {
    queue: Sender<UnixStream>,
    shared: Arc<Shared>,
}

struct Shared {
    waiting: Mutex<Receiver<UnixStream>>,
    /// Threads waiting for a connection that no connection has been promised to yet.
    idle: AtomicUsize,
    /// Threads alive.
    threads: AtomicUsize,
    serve: Box<dyn Fn(UnixStream) + Send + Sync>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("idle", &self.shared.idle.load(Ordering::Relaxed))
            .field("threads", &self.shared.threads.load(Ordering::Relaxed))
            .finish()
    }
}

impl Workers {
    /// Starts [`IDLE_WORKERS`] threads that run `serve` for each connection given them.
    pub fn start(serve: impl Fn(UnixStream) + Send + Sync + 'static) -> Self {
        let (queue, waiting) = channel();
        let shared = Arc::new(Shared {
            waiting: Mutex::new(waiting),
            idle: AtomicUsize::new(0),
            threads: AtomicUsize::new(0),
            serve: Box::new(serve),
        });
        let workers = Self { queue, shared };
        for _ in 0..IDLE_WORKERS {
            workers.shared.idle.fetch_add(1, Ordering::SeqCst);
            workers.spawn(None);
        }
        workers
    }

    /// Serves `conn` on a waiting thread, or on a new one if none waits.
    pub fn dispatch(&self, conn: UnixStream) {
        let promised = self.shared.idle.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if !promised {
            return self.spawn(Some(conn));
        }
        // If every waiting thread is gone (they never end while `queue` lives, so this
        // is a bug's path), serve it on a new thread rather than drop it.
        if let Err(e) = self.queue.send(conn) {
            self.spawn(Some(e.0));
        }
    }

    fn spawn(&self, first: Option<UnixStream>) {
        let shared = self.shared.clone();
        self.shared.threads.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("conn".into()).spawn(move || {
            shared.work(first);
            shared.threads.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            self.shared.threads.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(error = %e, "spawning a connection thread");
        }
    }
}

impl Shared {
    /// Serves `first` (if any), then connections from the queue while this thread is
    /// among the [`IDLE_WORKERS`] that wait. A thread started idle was counted by its
    /// starter; one that comes back counts itself.
    fn work(&self, first: Option<UnixStream>) {
        let mut counted = first.is_none();
        if let Some(conn) = first {
            (self.serve)(conn);
        }
        loop {
            if !counted {
                let joined =
                    self.idle.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < IDLE_WORKERS).then_some(n + 1));
                if joined.is_err() {
                    return;
                }
            }
            let next = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok(conn) = next else { return };
            (self.serve)(conn);
            counted = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// Serves by echoing one byte after waiting for a second byte that releases it.
    fn echo_workers() -> Workers {
        Workers::start(|mut conn: UnixStream| {
            let mut b = [0u8; 1];
            if conn.read_exact(&mut b).is_ok() {
                let _ = conn.write_all(&b);
            }
        })
    }

    #[test]
    fn connections_are_served_by_the_waiting_threads_and_a_burst_leaves_no_crowd() {
        let workers = echo_workers();
        let threads = || workers.shared.threads.load(Ordering::SeqCst);
        assert_eq!(threads(), IDLE_WORKERS);
        // More connections at once than threads wait: every one is served.
        let mut clients = Vec::new();
        for i in 0..(IDLE_WORKERS * 3) {
            let (ours, theirs) = UnixStream::pair().unwrap();
            workers.dispatch(theirs);
            clients.push((i as u8, ours));
        }
        for (i, c) in &mut clients {
            c.write_all(&[*i]).unwrap();
            let mut b = [0u8; 1];
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.read_exact(&mut b).unwrap();
            assert_eq!(b[0], *i);
        }
        // The extra threads end once served; the waiting ones stay.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let idle = || workers.shared.idle.load(Ordering::SeqCst);
        while (threads(), idle()) != (IDLE_WORKERS, IDLE_WORKERS) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!((threads(), idle()), (IDLE_WORKERS, IDLE_WORKERS), "threads alive and idle after the burst");
        // And serve again.
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        workers.dispatch(theirs);
        ours.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        ours.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
    }

    #[test]
    fn a_busy_pool_still_serves_a_new_connection_at_once() {
        let workers = echo_workers();
        // Every waiting thread holds a connection whose client says nothing yet.
        let mut held = Vec::new();
        for _ in 0..IDLE_WORKERS {
            let (ours, theirs) = UnixStream::pair().unwrap();
            workers.dispatch(theirs);
            held.push(ours);
        }
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        workers.dispatch(theirs);
        ours.write_all(b"y").unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 1];
        ours.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"y");
        drop(held);
    }
}
