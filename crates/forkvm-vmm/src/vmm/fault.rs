//! Fault injection for the branch failure-mode table (seed `000_*`): every row — pause
//! fails, snapshot fails, disk full, resume fails after a good snapshot — must be
//! produced on demand in a test, on a real VMM, without a mock.
//!
//! A fault is armed for one use ([`FaultPlan::arm`]) and fires at its point in the next
//! branch. The control socket accepts `inject_fault` only when the VMM process was
//! started with `FORKVM_FAULT_INJECTION=1`, so production VMMs cannot be told to fail.

use serde::{Deserialize, Serialize};
use std::io;

/// Environment variable that enables `inject_fault` on the control socket.
pub const FAULT_INJECTION_ENV: &str = "FORKVM_FAULT_INJECTION";

/// Where a branch can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPoint {
    /// Pausing the vCPUs fails (the VM keeps running).
    Pause,
    /// Capturing vCPU/device state fails, after the pause.
    SaveState,
    /// Writing the memory image fails with EIO.
    WriteMemory,
    /// Writing the memory image fails with ENOSPC.
    DiskFull,
    /// Resuming the vCPUs fails after the snapshot was written.
    Resume,
    /// A live branch's writer waits 3 s before writing (to crash a VMM mid-write).
    StallWriter,
}

impl FaultPoint {
    /// The error this fault produces at an I/O step.
    pub fn io_error(self) -> io::Error {
        match self {
            FaultPoint::DiskFull => io::Error::from_raw_os_error(libc::ENOSPC),
            _ => io::Error::other(format!("injected fault: {self:?}")),
        }
    }
}

/// Faults armed for the next branch.
#[derive(Debug, Default)]
pub struct FaultPlan {
    armed: Vec<FaultPoint>,
}

impl FaultPlan {
    /// Arms `point` for one use.
    pub fn arm(&mut self, point: FaultPoint) {
        self.armed.push(point);
    }

    /// Consumes `point` if it is armed.
    pub fn take(&mut self, point: FaultPoint) -> bool {
        match self.armed.iter().position(|&p| p == point) {
            Some(i) => {
                self.armed.remove(i);
                true
            }
            None => false,
        }
    }

    /// Consumes whichever of the memory-write faults is armed.
    pub fn take_write_fault(&mut self) -> Option<FaultPoint> {
        [FaultPoint::WriteMemory, FaultPoint::DiskFull].into_iter().find(|&p| self.take(p))
    }

    /// Whether the control socket may arm faults in this process.
    pub fn allowed_by_env() -> bool {
        std::env::var(FAULT_INJECTION_ENV).is_ok_and(|v| v == "1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fire_once() {
        let mut plan = FaultPlan::default();
        plan.arm(FaultPoint::Resume);
        assert!(!plan.take(FaultPoint::Pause));
        assert!(plan.take(FaultPoint::Resume));
        assert!(!plan.take(FaultPoint::Resume));
        plan.arm(FaultPoint::DiskFull);
        assert_eq!(plan.take_write_fault(), Some(FaultPoint::DiskFull));
        assert_eq!(plan.take_write_fault(), None);
        assert_eq!(FaultPoint::DiskFull.io_error().raw_os_error(), Some(libc::ENOSPC));
        let p: FaultPoint = serde_json::from_str(r#""disk_full""#).unwrap();
        assert_eq!(p, FaultPoint::DiskFull);
    }
}
