//! The fake internet's HTTP server: answers every request on a port of its host (both
//! addresses) with one body, counting them, until dropped. Bounded: at most
//! [`MAX_REQUESTS`] requests, each read for at most 30 s.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Requests one server answers at most.
pub const MAX_REQUESTS: usize = 1000;

/// A running fake HTTP server; stops when dropped.
#[derive(Debug)]
pub struct FakeHttp {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHttp {
    /// Requests answered so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `body` on `listener` (bound in the fake internet's host) on a thread of its own.
pub(super) fn start(listener: TcpListener, body: &'static str) -> std::io::Result<FakeHttp> {
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (stopping, counted) = (stop.clone(), served.clone());
    let thread = std::thread::Builder::new().name("fake-http".into()).spawn(move || {
        while !stopping.load(Ordering::Relaxed) && counted.load(Ordering::Relaxed) < MAX_REQUESTS {
            let Ok((mut conn, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
                match conn.read(&mut buf) {
                    Ok(n) if n > 0 => request.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            // Counted before it is answered: whoever got the answer finds it counted.
            counted.fetch_add(1, Ordering::Relaxed);
            let head = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(body.as_bytes()));
        }
    })?;
    Ok(FakeHttp { stop, served, thread: Some(thread) })
}
