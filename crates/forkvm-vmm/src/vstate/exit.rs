//! The VM's exit latch: set once, by the first vCPU that stops for good or by a
//! shutdown request; the VMM process's main thread waits on it.

use super::vcpu::VcpuExitReason;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Set once when the VM stops for good; the process's main thread waits on it.
#[derive(Debug, Default)]
pub struct ExitLatch {
    reason: Mutex<Option<VcpuExitReason>>,
    cond: Condvar,
}

impl ExitLatch {
    pub fn set(&self, reason: VcpuExitReason) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        self.cond.notify_all();
    }

    pub fn get(&self) -> Option<VcpuExitReason> {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until set, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<VcpuExitReason> {
        let guard = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        let guard = match timeout {
            None => self.cond.wait_while(guard, |r| r.is_none()).unwrap_or_else(|p| p.into_inner()),
            Some(t) => self.cond.wait_timeout_while(guard, t, |r| r.is_none()).unwrap_or_else(|p| p.into_inner()).0,
        };
        guard.clone()
    }
}
