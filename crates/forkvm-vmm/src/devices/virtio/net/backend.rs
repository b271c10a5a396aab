//! The backend thread: moves frames between the two queues and the tap.
//!
//! The vCPU thread only kicks an [`EventFd`] (from `queue_notify`); this thread sleeps in
//! `poll(2)` on that eventfd and on the tap, and on each wake locks [`Shared`] and does
//! one pass: the tx queue drained to the tap, then frames read from the tap into the rx
//! queue until the tap is empty or the guest has no buffers left, then one used-buffer
//! interrupt if the guest wants one. A frame is moved whole under the lock, so a pause
//! (for a snapshot) never sees half of one.
//!
//! The host side is a [`FrameEndpoint`]: a tap here; vhost-net, if these hosts ever get
//! it, would replace this thread rather than the endpoint.
//!
//! Rate limits (`throttle::Limiter`, per direction): a tx chain over the cap stays in
//! its queue; while rx is over it the tap is not read (the kernel queues, then drops,
//! and TCP backs off). The poll timeout is when the bucket admits again.

use super::frames::{read_tx_chain, write_rx_frame, Delivery};
use super::metrics::{add, NetMetrics};
use super::{tap_offloads, Tap, F_MRG_RXBUF, MAX_BUFFER_LEN, VNET_HDR_LEN};
use crate::devices::virtio::backend_thread::BackendThread;
use crate::devices::virtio::ratelimit::LogLimiter;
use crate::devices::virtio::throttle::{Limiter, RateLimit};
use crate::devices::virtio::Interrupt;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// `poll` timeout when nothing is due: a safety net, every event of interest wakes it.
/// Long, because every idle sandbox's thread wakes this often for nothing.
const IDLE_POLL: Duration = Duration::from_secs(10);
/// Most frames moved each way in one pass, so a guest that sends without end cannot
/// keep the lock (and a pause) waiting; the next pass follows at once.
const FRAMES_PER_PASS: usize = 1024;

/// The host side of the device: where the guest's frames go and the guest's come from.
pub trait FrameEndpoint: Send + Sync + std::fmt::Debug {
    /// The descriptor to poll for frames to read.
    fn raw_fd(&self) -> RawFd;
    /// One frame, header first; `WouldBlock` when there is none.
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Sends one frame, header first.
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize>;
    /// Which offloaded frames (`TUN_F_*`) the guest takes.
    fn set_offload(&self, flags: u32) -> io::Result<()>;
}

impl FrameEndpoint for Tap {
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.write(frame)
    }
    fn set_offload(&self, flags: u32) -> io::Result<()> {
        Tap::set_offload(self, flags)
    }
}

/// The queues and memory of an activated device.
#[derive(Debug)]
pub struct ActiveQueues {
    pub mem: GuestMemoryMmap,
    pub rx: Queue,
    pub tx: Queue,
    pub irq: Arc<dyn Interrupt>,
}

/// The device's caps on what its guest sends and receives per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetRateLimits {
    pub tx: RateLimit,
    pub rx: RateLimit,
}

/// State shared between the device (vCPU and control threads) and the backend thread.
#[derive(Debug)]
pub struct Shared {
    pub active: Option<ActiveQueues>,
    pub acked_features: u64,
    /// The VM is paused: the backend must not touch guest memory or queues.
    pub paused: bool,
    /// The tap's offloads match `acked_features` (set once per activation).
    offloads_set: bool,
    rx_buf: Vec<u8>,
    /// Length of a frame in `rx_buf` that waits for the guest's buffers.
    rx_pending: Option<usize>,
    /// The guest had no buffers for `rx_pending`: wait for a notification.
    rx_blocked: bool,
    tx_buf: Vec<u8>,
    tx_limit: Option<Limiter>,
    rx_limit: Option<Limiter>,
    /// When a held-back direction may go on.
    tx_due: Option<Instant>,
    rx_due: Option<Instant>,
    /// The last pass stopped at [`FRAMES_PER_PASS`]: the next one is due at once.
    more: bool,
    log: LogLimiter,
    metrics: Arc<NetMetrics>,
}

/// Locks `shared`, surviving a poisoned lock (a panic elsewhere must not take the device
/// down with it).
pub fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(limits: NetRateLimits, metrics: Arc<NetMetrics>) -> Shared {
        let now = Instant::now();
        Shared {
            active: None,
            acked_features: 0,
            paused: false,
            offloads_set: false,
            rx_buf: vec![0; MAX_BUFFER_LEN],
            rx_pending: None,
            rx_blocked: false,
            tx_buf: Vec::with_capacity(MAX_BUFFER_LEN),
            tx_limit: Limiter::new(limits.tx, now),
            rx_limit: Limiter::new(limits.rx, now),
            tx_due: None,
            rx_due: None,
            more: false,
            log: LogLimiter::default(),
            metrics,
        }
    }

    /// The queues were handed over (activation, restore): start afresh on them.
    pub fn activate(&mut self, q: ActiveQueues) {
        self.active = Some(q);
        self.offloads_set = false;
        self.rx_pending = None;
        self.rx_blocked = false;
    }

    /// The driver reset the device.
    pub fn reset(&mut self) {
        self.active = None;
        self.acked_features = 0;
        self.rx_pending = None;
        self.rx_blocked = false;
    }

    fn warn(&mut self, what: &str, err: &dyn std::fmt::Display) {
        if let Some(suppressed) = self.log.allow() {
            tracing::warn!(device = "net", suppressed, "{what}: {err}");
        }
    }

    /// Whether to poll the tap, and for how long to sleep at most.
    fn plan(&self, now: Instant) -> (bool, Duration) {
        let running = self.active.is_some() && !self.paused;
        let read_tap = running && !self.rx_blocked && self.rx_due.is_none() && self.rx_pending.is_none();
        let due = [self.tx_due, self.rx_due].into_iter().flatten().min().filter(|_| running);
        let timeout = due.map_or(IDLE_POLL, |d| d.saturating_duration_since(now));
        let timeout = if running && self.more { Duration::ZERO } else { timeout };
        (read_tap, timeout)
    }

    /// One pass over both queues (see the module doc).
    pub fn pass(&mut self, ep: &dyn FrameEndpoint, now: Instant) {
        if self.paused || self.active.is_none() {
            return;
        }
        add(&self.metrics.passes, 1);
        if !self.offloads_set {
            self.offloads_set = true;
            let flags = tap_offloads(self.acked_features);
            if let Err(e) = ep.set_offload(flags) {
                self.warn("setting the tap's offloads", &e);
            }
        }
        if self.tx_due.is_some_and(|d| d <= now) {
            self.tx_due = None;
        }
        if self.rx_due.is_some_and(|d| d <= now) {
            self.rx_due = None;
        }
        self.more = false;
        let tx_used = self.transmit(ep, now);
        let rx_used = self.receive(ep, now);
        let Some(q) = self.active.as_mut() else { return };
        // With EVENT_IDX the driver says when it wants to hear; without, always.
        let mut notify = false;
        if tx_used {
            notify |= q.tx.needs_notification(&q.mem).unwrap_or(true);
        }
        if rx_used {
            notify |= q.rx.needs_notification(&q.mem).unwrap_or(true);
        }
        if notify {
            add(&self.metrics.interrupts, 1);
            if let Err(e) = q.irq.trigger() {
                self.warn("raising the used-buffer interrupt", &e);
            }
        }
    }

    /// Sends every frame the guest queued (as far as the tx cap allows); whether any
    /// chain went to the used ring.
    fn transmit(&mut self, ep: &dyn FrameEndpoint, now: Instant) -> bool {
        let Shared { active: Some(q), tx_buf, tx_limit, tx_due, more, metrics, .. } = self else { return false };
        if tx_due.is_some() {
            return false;
        }
        let mut used = false;
        let mut budget = FRAMES_PER_PASS;
        let mut errors: Vec<String> = Vec::new();
        loop {
            // The guest need not notify while this pass drains the queue.
            let _ = q.tx.disable_notification(&q.mem);
            let mut popped = false;
            while let Some(chain) = q.tx.pop_descriptor_chain(&q.mem) {
                let head = chain.head_index();
                popped = true;
                budget -= 1;
                match read_tx_chain(chain, tx_buf) {
                    Ok(len) => {
                        if let Some(Err(wait)) = tx_limit.as_mut().map(|l| l.admit(len as u64, now)) {
                            q.tx.go_to_previous_position();
                            *tx_due = Some(now + wait);
                            add(&metrics.tx_throttled, 1);
                            break;
                        }
                        match ep.write_frame(tx_buf) {
                            Ok(_) => {
                                add(&metrics.tx_frames, 1);
                                add(&metrics.tx_bytes, len as u64);
                            }
                            Err(e) => {
                                add(&metrics.tx_errors, 1);
                                errors.push(format!("the tap refused a frame: {e}"));
                            }
                        }
                    }
                    Err(e) => {
                        add(&metrics.tx_malformed, 1);
                        errors.push(e.to_string());
                    }
                }
                if let Err(e) = q.tx.add_used(&q.mem, head, 0) {
                    errors.push(format!("adding to the tx used ring: {e}"));
                }
                used = true;
                if budget == 0 {
                    break;
                }
            }
            if budget == 0 {
                *more = true;
                break;
            }
            if tx_due.is_some() {
                break;
            }
            // Notifications back on; go again if the guest queued more meanwhile. A
            // queue that says it holds chains but gives none (an avail index the guest
            // ran far ahead) waits for the next notification instead.
            if !q.tx.enable_notification(&q.mem).unwrap_or(false) || !popped {
                break;
            }
        }
        for e in errors {
            self.warn("net tx", &e);
        }
        used
    }

    /// Moves frames from the tap into the guest's buffers until the tap is empty, the
    /// guest has no buffers, or the rx cap is reached; whether any chain was used.
    fn receive(&mut self, ep: &dyn FrameEndpoint, now: Instant) -> bool {
        let mergeable = self.acked_features & F_MRG_RXBUF != 0;
        let Shared { active: Some(q), rx_buf, rx_pending, rx_blocked, rx_limit, rx_due, more, metrics, .. } = self
        else {
            return false;
        };
        let mut used = false;
        let mut budget = FRAMES_PER_PASS;
        let mut errors: Vec<String> = Vec::new();
        // Whether the guest's buffers were looked for again after notifications were
        // turned back on: once per frame, so a queue that gives none cannot spin here.
        let mut looked_again = false;
        *rx_blocked = false;
        while rx_due.is_none() {
            if budget == 0 {
                *more = true;
                break;
            }
            budget -= 1;
            let len = match *rx_pending {
                Some(len) => len,
                None => {
                    if let Some(Err(wait)) = rx_limit.as_mut().map(|l| l.admit(0, now)) {
                        *rx_due = Some(now + wait);
                        add(&metrics.rx_throttled, 1);
                        break;
                    }
                    match ep.read_frame(rx_buf) {
                        Ok(n) if n >= VNET_HDR_LEN => {
                            if let Some(l) = rx_limit.as_mut() {
                                l.charge(n as u64, now);
                            }
                            *rx_pending = Some(n);
                            n
                        }
                        Ok(_) => continue,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => {
                            errors.push(format!("reading the tap: {e}"));
                            break;
                        }
                    }
                }
            };
            match write_rx_frame(&mut q.rx, &q.mem, &mut rx_buf[..len], mergeable) {
                Delivery::Delivered { .. } => {
                    looked_again = false;
                    *rx_pending = None;
                    add(&metrics.rx_frames, 1);
                    add(&metrics.rx_bytes, len as u64);
                    used = true;
                }
                Delivery::NoBuffers => {
                    // Ask the guest to notify when it posts buffers; it may have just.
                    if q.rx.enable_notification(&q.mem).unwrap_or(false) && !looked_again {
                        looked_again = true;
                        continue;
                    }
                    add(&metrics.rx_no_buffers, 1);
                    *rx_blocked = true;
                    break;
                }
                Delivery::Dropped(e) => {
                    looked_again = false;
                    *rx_pending = None;
                    add(&metrics.rx_dropped, 1);
                    errors.push(e.to_string());
                    used = true;
                }
            }
        }
        for e in errors {
            self.warn("net rx", &e);
        }
        used
    }
}

/// The running backend thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct Backend {
    /// Held for its drop, which stops the thread.
    _thread: BackendThread,
}

impl Backend {
    /// Starts the thread. `kick` must be a non-blocking eventfd.
    pub fn spawn(shared: Arc<Mutex<Shared>>, kick: Arc<EventFd>, ep: Arc<dyn FrameEndpoint>) -> io::Result<Backend> {
        let thread = BackendThread::spawn("net-backend", kick, move |kick, stop| run(&shared, kick, stop, &*ep))?;
        Ok(Backend { _thread: thread })
    }
}

fn run(shared: &Mutex<Shared>, kick: &EventFd, stop: &AtomicBool, ep: &dyn FrameEndpoint) {
    crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Device);
    while !stop.load(Ordering::Acquire) {
        let (read_tap, timeout) = lock(shared).plan(Instant::now());
        let pollfd = |fd, events| libc::pollfd { fd, events, revents: 0 };
        let mut fds = [pollfd(kick.as_raw_fd(), libc::POLLIN), pollfd(ep.raw_fd(), libc::POLLIN)];
        let n_fds = if read_tap { 2 } else { 1 };
        let timeout_ms = i32::try_from(timeout.as_millis().max(u128::from(!timeout.is_zero()))).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a valid array of at least `n_fds` pollfd structs that outlives
        // the call; poll only writes their `revents` fields.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), n_fds, timeout_ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != ErrorKind::Interrupted {
                tracing::error!(device = "net", "poll failed: {err}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        if fds[0].revents != 0 {
            let _ = kick.read();
        }
        lock(shared).pass(ep, Instant::now());
    }
}
