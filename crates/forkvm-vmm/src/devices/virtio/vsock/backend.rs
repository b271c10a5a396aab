//! The backend thread: host-socket I/O and all queue processing.
//!
//! The vCPU thread only kicks an [`EventFd`] (from `queue_notify`); this thread sleeps
//! in `poll(2)` on that eventfd, the listening socket, host clients that have not yet
//! sent their `CONNECT` line, and every stream socket with I/O to wait for. On each wake
//! it locks [`Shared`] and, in order: accepts clients, reads `CONNECT` lines, does the
//! signalled socket I/O, drains the tx queue, flushes buffered bytes to host sockets,
//! posts a pending transport-reset event, fills rx buffers, drops closed streams, and
//! triggers the used-buffer interrupt if it added anything to a used ring.
//!
//! **After a restore, nothing goes to the guest until it has taken the transport reset
//! in** ([`ResetAck`]): a guest kills every connection it knows when it handles the
//! event, without telling the host, so a host connection whose request reached it
//! first would wait forever (a fork's first call waited out a 10 s limit and retried).
//! The guest refills the event queue once it has handled the event; that refill is the
//! acknowledgement. A guest that never refills is given [`RESET_ACK_LIMIT`].
//!
//! Host sockets are non-blocking, so the lock is never held across a blocking call.

use super::metrics::VsockMetrics;
use super::muxer::{ConnKey, Muxer};
use super::packet::{read_tx_chain, RxBuffers, HDR_SIZE};
use super::{EVENT_TRANSPORT_RESET, MAX_CONNECT_LINE, MAX_PENDING_CLIENTS};
use crate::devices::virtio::backend_thread::BackendThread;
use crate::devices::virtio::ratelimit::LogLimiter;
use crate::devices::virtio::Interrupt;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// `poll` timeout: a safety net only, every event of interest wakes the thread. Long,
/// because every idle sandbox's thread wakes this often for nothing (a host of a
/// thousand idle sandboxes pays it a thousand times over).
const POLL_TIMEOUT_MS: i32 = 10_000;

/// How long rx waits for a guest to acknowledge a transport reset before it goes on
/// anyway (a guest driver that never refills its event queue). Generous: a hundred
/// guests restored at once on two cores, their kernels emulated, take seconds each to
/// get to the event.
const RESET_ACK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// While a reset is unacknowledged, the used-buffer interrupt is raised again this often.
/// A restored guest could miss the first one (raised as its vCPU and interrupt state are
/// being put back): idle, it then slept until its own next timer, or until
/// [`RESET_ACK_LIMIT`], before it took the reset in, and a fork of a sandbox idle for a
/// while took 10 s to answer. An interrupt with nothing new in the rings is harmless: the
/// guest's handler finds no work.
const RESET_NUDGE: std::time::Duration = std::time::Duration::from_millis(20);

/// Where a restored device is with the transport reset it owes the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResetAck {
    /// Nothing owed: rx flows.
    #[default]
    Settled,
    /// Posted; the guest had made `avail` event buffers available at the time. Rx waits
    /// until it makes more (it refills after handling the event), or until `deadline`.
    /// `nudged`: when the interrupt was last raised for it ([`RESET_NUDGE`]).
    Awaiting { avail: std::num::Wrapping<u16>, deadline: std::time::Instant, nudged: std::time::Instant },
}

/// Errors starting the backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("spawning the vsock backend thread: {0}")]
    SpawnThread(std::io::Error),
}

/// The queues and memory of an activated device.
#[derive(Debug)]
pub struct ActiveQueues {
    pub mem: GuestMemoryMmap,
    pub rx: Queue,
    pub tx: Queue,
    pub event: Queue,
    pub irq: Arc<dyn Interrupt>,
}

#[derive(Debug)]
struct PendingClient {
    stream: UnixStream,
    line: Vec<u8>,
}

/// State shared between the device (vCPU thread) and the backend thread.
#[derive(Debug)]
pub struct Shared {
    pub active: Option<ActiveQueues>,
    pub muxer: Muxer,
    /// A `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` is owed to the guest (after a restore).
    pub reset_event_pending: bool,
    /// Whether the guest has taken the reset in (rx waits until it has).
    pub reset_ack: ResetAck,
    /// The VM is paused: the backend must not touch guest memory or queues.
    pub paused: bool,
    listener: UnixListener,
    pending: BTreeMap<u64, PendingClient>,
    next_pending_id: u64,
    log: LogLimiter,
    metrics: Arc<VsockMetrics>,
}

/// Lock `shared`, surviving a poisoned lock (the state stays usable; a panic elsewhere
/// must not take the device down with it).
pub fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy)]
enum Tag {
    Kick,
    Listener,
    Pending(u64),
    Conn(ConnKey),
}

impl Shared {
    /// `listener` must be non-blocking.
    pub fn new(listener: UnixListener, muxer: Muxer, metrics: Arc<VsockMetrics>) -> Shared {
        Shared {
            active: None,
            muxer,
            reset_event_pending: false,
            reset_ack: ResetAck::Settled,
            paused: false,
            listener,
            pending: BTreeMap::new(),
            next_pending_id: 0,
            log: LogLimiter::default(),
            metrics,
        }
    }

    fn warn(&mut self, what: &str, err: &dyn std::fmt::Display) {
        self.metrics.guest_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(device = "vsock", suppressed, "{what}: {err}");
        }
    }

    fn accept_clients(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if !crate::host::peer_guard::admits(&stream, "vsock") {
                        self.metrics.host_clients_rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING_CLIENTS || stream.set_nonblocking(true).is_err() {
                        self.metrics.host_clients_rejected.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    self.next_pending_id += 1;
                    self.pending.insert(self.next_pending_id, PendingClient { stream, line: Vec::new() });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    /// Reads from a client that has not finished its `CONNECT <port>\n` line.
    fn read_pending(&mut self, id: u64) {
        let Some(client) = self.pending.get_mut(&id) else { return };
        let mut buf = [0u8; 4096];
        match client.stream.read(&mut buf) {
            Ok(0) => {
                self.pending.remove(&id);
                return;
            }
            Ok(n) => client.line.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return,
            Err(_) => {
                self.pending.remove(&id);
                return;
            }
        }
        let newline = client.line.iter().position(|&b| b == b'\n');
        let Some(pos) = newline.filter(|&p| p <= MAX_CONNECT_LINE) else {
            if client.line.len() > MAX_CONNECT_LINE {
                self.pending.remove(&id);
                self.metrics.host_clients_rejected.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        let Some(client) = self.pending.remove(&id) else { return };
        let port = parse_connect_line(&client.line[..pos]);
        let result = match port {
            Some(port) => self.muxer.add_host_connection(client.stream, port, &client.line[pos + 1..]).map(|_| ()),
            None => {
                self.metrics.host_clients_rejected.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        };
        if let Err(err) = result {
            self.metrics.host_clients_rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(device = "vsock", "refusing host client: {err}");
        }
    }

    fn poll_set(&self, kick: &EventFd) -> (Vec<libc::pollfd>, Vec<Tag>) {
        let pollfd = |fd, events| libc::pollfd { fd, events, revents: 0 };
        let mut fds = vec![pollfd(kick.as_raw_fd(), libc::POLLIN)];
        let mut tags = vec![Tag::Kick];
        if self.pending.len() < MAX_PENDING_CLIENTS {
            fds.push(pollfd(self.listener.as_raw_fd(), libc::POLLIN));
            tags.push(Tag::Listener);
        }
        for (id, client) in &self.pending {
            fds.push(pollfd(client.stream.as_raw_fd(), libc::POLLIN));
            tags.push(Tag::Pending(*id));
        }
        for (key, fd, events) in self.muxer.poll_interest() {
            fds.push(pollfd(fd, events));
            tags.push(Tag::Conn(key));
        }
        (fds, tags)
    }

    /// How long the backend may sleep: until a transport reset's acknowledgement is
    /// overdue, else the safety net.
    fn poll_timeout_ms(&self) -> i32 {
        match self.reset_ack {
            ResetAck::Awaiting { deadline, nudged, .. } => {
                let now = std::time::Instant::now();
                let left =
                    deadline.saturating_duration_since(now).min((nudged + RESET_NUDGE).saturating_duration_since(now));
                i32::try_from(left.as_millis() + 1).unwrap_or(POLL_TIMEOUT_MS).min(POLL_TIMEOUT_MS)
            }
            ResetAck::Settled => POLL_TIMEOUT_MS,
        }
    }

    /// Runs the queues: tx, host writes, event, rx (once a reset is taken in),
    /// teardown, interrupt.
    pub fn process_queues(&mut self) {
        let mut errors: Vec<String> = Vec::new();
        let Shared { active, muxer, reset_event_pending, reset_ack, .. } = self;
        let Some(q) = active.as_mut() else { return };
        let mut used = false;
        while let Some(chain) = q.tx.pop_descriptor_chain(&q.mem) {
            let head = chain.head_index();
            let packet = read_tx_chain(chain);
            used |= q.tx.add_used(&q.mem, head, 0).is_ok();
            match packet {
                Ok(packet) => muxer.handle_guest_packet(packet),
                Err(err) => {
                    if let Some(hdr) = err.header() {
                        muxer.reset_reply(hdr);
                    }
                    errors.push(format!("bad tx packet: {err}"));
                }
            }
        }
        muxer.flush_all();
        if *reset_event_pending {
            if let Some(chain) = q.event.pop_descriptor_chain(&q.mem) {
                let head = chain.head_index();
                let event = EVENT_TRANSPORT_RESET.to_le_bytes();
                let len =
                    RxBuffers::from_chain(chain).and_then(|b| b.write_all(&q.mem, &event)).unwrap_or_else(|err| {
                        errors.push(format!("writing transport-reset event: {err}"));
                        0
                    });
                used |= q.event.add_used(&q.mem, head, len).is_ok();
                *reset_event_pending = false;
                let avail = q.event.avail_idx(&q.mem, std::sync::atomic::Ordering::Acquire).unwrap_or_default();
                let now = std::time::Instant::now();
                *reset_ack = ResetAck::Awaiting { avail, deadline: now + RESET_ACK_LIMIT, nudged: now };
            }
        }
        if let ResetAck::Awaiting { avail, deadline, nudged } = *reset_ack {
            let now_avail = q.event.avail_idx(&q.mem, std::sync::atomic::Ordering::Acquire).unwrap_or(avail);
            let now = std::time::Instant::now();
            if now_avail != avail {
                *reset_ack = ResetAck::Settled;
            } else if now < deadline && now >= nudged + RESET_NUDGE {
                *reset_ack = ResetAck::Awaiting { avail, deadline, nudged: now };
                self.metrics.reset_nudges.fetch_add(1, Ordering::Relaxed);
                used = true;
            } else if now >= deadline {
                *reset_ack = ResetAck::Settled;
                errors.push(format!(
                    "the guest did not acknowledge the transport reset within {RESET_ACK_LIMIT:?}; going on"
                ));
            }
        }
        let rx_open = !*reset_event_pending && *reset_ack == ResetAck::Settled;
        while let Some(chain) = rx_open.then(|| q.rx.pop_descriptor_chain(&q.mem)).flatten() {
            let head = chain.head_index();
            let len = match RxBuffers::from_chain(chain) {
                Ok(bufs) if bufs.capacity() >= HDR_SIZE => {
                    let Some((hdr, payload)) = muxer.next_rx_packet(bufs.capacity() - HDR_SIZE) else {
                        q.rx.go_to_previous_position();
                        break;
                    };
                    bufs.write_packet(&q.mem, &hdr, &payload).unwrap_or_else(|err| {
                        errors.push(format!("writing rx packet: {err}"));
                        0
                    })
                }
                Ok(bufs) => {
                    errors.push(format!("rx buffer of {} bytes is smaller than a header", bufs.capacity()));
                    0
                }
                Err(err) => {
                    errors.push(format!("bad rx chain: {err}"));
                    0
                }
            };
            used |= q.rx.add_used(&q.mem, head, len).is_ok();
        }
        muxer.reap();
        if used {
            self.metrics.interrupts.fetch_add(1, Ordering::Relaxed);
            if let Err(err) = q.irq.trigger() {
                errors.push(format!("raising the used-buffer interrupt: {err}"));
            }
        }
        for err in errors {
            self.warn("vsock queue", &err);
        }
    }
}

/// Parses `CONNECT <port>` (an optional trailing `\r` is accepted).
pub fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let port = line.trim_end_matches('\r').strip_prefix("CONNECT ")?;
    port.parse().ok()
}

/// The running backend thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct Backend {
    /// Held for its drop, which stops the thread.
    _thread: BackendThread,
}

impl Backend {
    /// Starts the thread. `kick` must be a non-blocking eventfd.
    pub fn spawn(shared: Arc<Mutex<Shared>>, kick: Arc<EventFd>) -> Result<Backend, BackendError> {
        let thread = BackendThread::spawn("vsock-backend", kick, move |kick, stop| run(&shared, kick, stop));
        Ok(Backend { _thread: thread.map_err(BackendError::SpawnThread)? })
    }
}

fn run(shared: &Mutex<Shared>, kick: &EventFd, stop: &AtomicBool) {
    crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Device);
    // Host clients wait in the listener's backlog until the guest first activates the
    // device (activation sets the queues, then kicks).
    while !stop.load(Ordering::Acquire) && lock(shared).active.is_none() {
        let mut fd = libc::pollfd { fd: kick.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd that outlives the call.
        unsafe { libc::poll(&mut fd, 1, POLL_TIMEOUT_MS) };
        let _ = kick.read();
    }
    // The activation's own kick may have been read just above: run the queues once now
    // rather than sleep until the next kick or the safety net.
    let _ = kick.write(1);
    while !stop.load(Ordering::Acquire) {
        let (mut fds, tags, timeout_ms) = {
            let s = lock(shared);
            let (fds, tags) = s.poll_set(kick);
            (fds, tags, s.poll_timeout_ms())
        };
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfd
        // structs that outlives the call; poll only writes their `revents` fields.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != ErrorKind::Interrupted {
                tracing::error!(device = "vsock", "poll failed: {err}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        let mut s = lock(shared);
        if s.paused {
            // Host sockets stay ready while paused; wait without spinning on them.
            drop(s);
            let _ = kick.read();
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        for (fd, tag) in fds.iter().zip(tags) {
            if fd.revents == 0 {
                continue;
            }
            match tag {
                Tag::Kick => {
                    let _ = kick.read();
                }
                Tag::Listener => s.accept_clients(),
                Tag::Pending(id) => s.read_pending(id),
                Tag::Conn(key) => s.muxer.host_io(key),
            }
        }
        s.process_queues();
    }
}
