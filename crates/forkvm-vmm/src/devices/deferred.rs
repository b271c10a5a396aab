//! Device work that waits for a time rather than for the guest: requests a rate limit
//! held back (`virtio::throttle`), and requests a restored VM's queues still hold.
//!
//! Devices serve their queues on the vCPU thread that notified them, so nothing else
//! runs a device's queue. A device that must finish work later asks for a pass at a
//! time ([`Deferral::at`]); one thread per VMM, started only when a device may ask,
//! sleeps until the earliest time asked and then runs the device's pass under its
//! transport's lock, like a notification would. Devices skip passes while the VM is
//! paused (a snapshot must see the queues as they are) and ask again when it resumes.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Schedule {
    /// Slot index → the earliest time its device asked for.
    due: BTreeMap<usize, Instant>,
    stop: bool,
}

/// The passes devices of one VMM asked for.
#[derive(Debug, Default)]
pub struct DeferredWork {
    schedule: Mutex<Schedule>,
    changed: Condvar,
}

/// What a device asks for passes with: its slot in its VMM's [`DeferredWork`].
#[derive(Debug, Clone)]
pub struct Deferral {
    work: Arc<DeferredWork>,
    slot: usize,
}

impl Deferral {
    pub fn new(work: Arc<DeferredWork>, slot: usize) -> Deferral {
        Deferral { work, slot }
    }

    /// Asks for a pass at `when` (or earlier, if one was asked for earlier).
    pub fn at(&self, when: Instant) {
        let mut s = self.work.lock();
        let due = s.due.entry(self.slot).or_insert(when);
        *due = (*due).min(when);
        self.work.changed.notify_one();
    }
}

impl DeferredWork {
    fn lock(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the thread serving this work (the VM stops).
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_one();
    }

    /// The slots due at `now`, taken off the schedule; waits until one is (or until
    /// stopped: `None`).
    fn next_due(&self) -> Option<Vec<usize>> {
        let mut s = self.lock();
        loop {
            if s.stop {
                return None;
            }
            let now = Instant::now();
            let due: Vec<usize> = s.due.iter().filter(|(_, t)| **t <= now).map(|(slot, _)| *slot).collect();
            if !due.is_empty() {
                for slot in &due {
                    s.due.remove(slot);
                }
                return Some(due);
            }
            let wait = s.due.values().min().map_or(Duration::from_secs(3600), |t| t.saturating_duration_since(now));
            s = self.changed.wait_timeout(s, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Starts the thread that runs `run(slot)` for every pass asked of `work`, until `work`
/// is stopped or `run` says the devices are gone (false). The thread runs under the
/// vCPU thread's seccomp filter: a pass does what a notification does on a vCPU.
pub fn spawn(work: Arc<DeferredWork>, run: impl Fn(usize) -> bool + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new().name("device-timer".into()).stack_size(256 << 10).spawn(move || {
        crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Vcpu);
        while let Some(slots) = work.next_due() {
            for slot in slots {
                if !run(slot) {
                    return;
                }
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn passes_run_at_their_time_in_order_and_earlier_asks_win() {
        let work = Arc::new(DeferredWork::default());
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        spawn(work.clone(), move |slot| tx.send((slot, t0.elapsed())).is_ok()).unwrap();
        let (a, b) = (Deferral::new(work.clone(), 0), Deferral::new(work.clone(), 1));
        a.at(t0 + Duration::from_millis(120));
        b.at(t0 + Duration::from_millis(300));
        b.at(t0 + Duration::from_millis(40));
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let second = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((first.0, second.0), (1, 0), "{first:?} {second:?}");
        assert!(first.1 >= Duration::from_millis(40), "{first:?}");
        assert!(second.1 >= Duration::from_millis(120), "{second:?}");
        // Each ask is one pass: nothing more comes.
        assert!(rx.recv_timeout(Duration::from_millis(400)).is_err());
        work.stop();
    }

    #[test]
    fn stopping_ends_the_thread_with_passes_still_asked() {
        let work = Arc::new(DeferredWork::default());
        let (tx, rx) = mpsc::channel::<usize>();
        spawn(work.clone(), move |slot| tx.send(slot).is_ok()).unwrap();
        Deferral::new(work.clone(), 3).at(Instant::now() + Duration::from_secs(60));
        work.stop();
        // The thread dropped its sender: the channel closes without a pass.
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Err(mpsc::RecvTimeoutError::Disconnected));
    }
}
