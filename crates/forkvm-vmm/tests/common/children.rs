//! Children of a fork of a running VM, seen from the test: their control sockets,
//! console logs and processes.

use forkvm_vmm::control::{ControlClient, Request};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Waits until `log` contains `needle` at least `times` times; returns the log.
pub fn wait_log(log: &Path, needle: &str, times: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return text;
        }
        assert!(Instant::now() < deadline, "{} never showed {needle:?} x{times}: {text:?}", log.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn wait_socket(path: &Path) -> ControlClient {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(c) = ControlClient::connect(path) {
            return c;
        }
        assert!(Instant::now() < deadline, "{} never came up", path.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn alive(pid: i32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z")
}

pub fn shutdown(client: &mut ControlClient, pid: i32) {
    client.call(&Request::Shutdown {}).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "child {pid} did not exit after shutdown");
        std::thread::sleep(Duration::from_millis(5));
    }
}
