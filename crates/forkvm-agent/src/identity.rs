//! The post-restore `identity` request: hostname, wall clock and kernel RNG entropy.
//!
//! The three system calls sit behind [`IdentitySys`] so the order and arguments can be
//! tested without root or touching the host: [`LinuxSys`] makes the real calls (the
//! default), [`RecordingSys`] appends each call as a JSON line to a file (the binary's
//! `--identity-record PATH`, used by the host-side integration tests). The real calls
//! are exercised by the Linux-tier tests inside a guest.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use forkvm_proto::{AgentError, EntropyOutcome, ErrorKind, IdentityRequest};

/// The system calls identity needs.
pub trait IdentitySys: Send + Sync {
    /// `sethostname(2)`.
    fn set_hostname(&self, name: &str) -> io::Result<()>;
    /// `clock_settime(CLOCK_REALTIME)`.
    fn set_wall_clock(&self, unix_ns: u64) -> io::Result<()>;
    /// `ioctl(RNDADDENTROPY)` on `/dev/random`: mixed in and credited.
    fn add_entropy(&self, bytes: &[u8]) -> io::Result<()>;
    /// Write to `/dev/urandom`: mixed in, not credited.
    fn mix_entropy(&self, bytes: &[u8]) -> io::Result<()>;
}

/// Applies `req` through `sys`: hostname, then clock, then entropy (credited if
/// possible, else mixed). Returns what happened to the entropy.
pub fn apply(sys: &dyn IdentitySys, req: &IdentityRequest) -> Result<EntropyOutcome, AgentError> {
    if req.hostname.is_empty() || req.hostname.len() > 64 {
        let msg = format!("hostname {:?} must be 1..=64 bytes", req.hostname);
        return Err(AgentError::new(ErrorKind::InvalidInput, msg));
    }
    sys.set_hostname(&req.hostname).map_err(|e| AgentError::from_io("sethostname", &e))?;
    sys.set_wall_clock(req.wall_clock_unix_ns).map_err(|e| AgentError::from_io("clock_settime(CLOCK_REALTIME)", &e))?;
    if req.entropy.is_empty() {
        return Ok(EntropyOutcome::None);
    }
    match sys.add_entropy(&req.entropy) {
        Ok(()) => Ok(EntropyOutcome::Credited),
        Err(credit_err) => {
            tracing::warn!(error = %credit_err, "RNDADDENTROPY failed; mixing into /dev/urandom instead");
            sys.mix_entropy(&req.entropy).map_err(|e| {
                AgentError::from_io(&format!("RNDADDENTROPY ({credit_err}), then write /dev/urandom"), &e)
            })?;
            Ok(EntropyOutcome::MixedNotCredited)
        }
    }
}

/// The real system calls.
#[derive(Debug, Default)]
pub struct LinuxSys;

/// `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now (Linux 5.18+).
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Builds a `struct rand_pool_info { int entropy_count; int buf_size; u32 buf[] }`
/// crediting 8 bits per byte.
pub fn rand_pool_info(bytes: &[u8]) -> Vec<u8> {
    let bits = (bytes.len() * 8) as i32;
    let mut buf = Vec::with_capacity(8 + bytes.len().next_multiple_of(4));
    buf.extend_from_slice(&bits.to_ne_bytes());
    buf.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    buf.extend_from_slice(bytes);
    buf.resize(8 + bytes.len().next_multiple_of(4), 0);
    buf
}

impl IdentitySys for LinuxSys {
    fn set_hostname(&self, name: &str) -> io::Result<()> {
        // SAFETY: the pointer and length describe `name`'s bytes, which outlive the call.
        let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn set_wall_clock(&self, unix_ns: u64) -> io::Result<()> {
        let ts = libc::timespec {
            tv_sec: (unix_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (unix_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: `ts` is a valid timespec that lives across the call.
        let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn add_entropy(&self, bytes: &[u8]) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let dev = OpenOptions::new().write(true).open("/dev/random")?;
        let info = rand_pool_info(bytes);
        // SAFETY: `info` is a complete rand_pool_info whose buf_size matches the bytes
        // that follow the header; the kernel only reads it during the call.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // Credited entropy reaches /dev/urandom only at the CRNG's next reseed, which
        // may be a minute away: clones restored from one snapshot would until then
        // share their random stream. Reseed now.
        // SAFETY: RNDRESEEDCRNG takes no argument.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG as _) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn mix_entropy(&self, bytes: &[u8]) -> io::Result<()> {
        OpenOptions::new().write(true).open("/dev/urandom")?.write_all(bytes)
    }
}

/// Records calls as JSON lines (`{"call":"set_hostname","arg":"h"}`) instead of making
/// them. `fail_credit` makes `add_entropy` fail, to exercise the fallback.
#[derive(Debug)]
pub struct RecordingSys {
    path: PathBuf,
    lock: Mutex<()>,
    fail_credit: bool,
}

impl RecordingSys {
    /// Records into `path` (appending).
    pub fn new(path: PathBuf, fail_credit: bool) -> Self {
        Self { path, lock: Mutex::new(()), fail_credit }
    }

    fn record(&self, call: &str, arg: serde_json::Value) -> io::Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut line = serde_json::json!({ "call": call, "arg": arg }).to_string();
        line.push('\n');
        OpenOptions::new().create(true).append(true).open(&self.path)?.write_all(line.as_bytes())
    }
}

impl IdentitySys for RecordingSys {
    fn set_hostname(&self, name: &str) -> io::Result<()> {
        self.record("set_hostname", name.into())
    }

    fn set_wall_clock(&self, unix_ns: u64) -> io::Result<()> {
        self.record("set_wall_clock", unix_ns.into())
    }

    fn add_entropy(&self, bytes: &[u8]) -> io::Result<()> {
        if self.fail_credit {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        self.record("add_entropy", bytes.len().into())
    }

    fn mix_entropy(&self, bytes: &[u8]) -> io::Result<()> {
        self.record("mix_entropy", bytes.len().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(entropy: Vec<u8>) -> IdentityRequest {
        IdentityRequest {
            sandbox_id: "sb".into(),
            hostname: "clone-7".into(),
            wall_clock_unix_ns: 5_000_000_123,
            entropy,
            interpreter_seed: Vec::new(),
        }
    }

    fn calls(path: &std::path::Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn applies_hostname_clock_then_credited_entropy() {
        let dir = tempfile::tempdir().unwrap();
        let sys = RecordingSys::new(dir.path().join("calls"), false);
        assert_eq!(apply(&sys, &req(vec![7; 32])).unwrap(), EntropyOutcome::Credited);
        let got = calls(&dir.path().join("calls"));
        let names: Vec<_> = got.iter().map(|c| c["call"].as_str().unwrap()).collect();
        assert_eq!(names, ["set_hostname", "set_wall_clock", "add_entropy"]);
        assert_eq!(got[0]["arg"], "clone-7");
        assert_eq!(got[1]["arg"], 5_000_000_123u64);
        assert_eq!(got[2]["arg"], 32);
    }

    #[test]
    fn falls_back_to_mixing_when_crediting_fails() {
        let dir = tempfile::tempdir().unwrap();
        let sys = RecordingSys::new(dir.path().join("calls"), true);
        assert_eq!(apply(&sys, &req(vec![1; 16])).unwrap(), EntropyOutcome::MixedNotCredited);
        assert_eq!(calls(&dir.path().join("calls"))[2]["call"], "mix_entropy");
    }

    #[test]
    fn rejects_bad_hostname_before_any_call() {
        let dir = tempfile::tempdir().unwrap();
        let sys = RecordingSys::new(dir.path().join("calls"), false);
        let mut r = req(Vec::new());
        r.hostname = "x".repeat(65);
        assert_eq!(apply(&sys, &r).unwrap_err().kind, ErrorKind::InvalidInput);
        assert!(calls(&dir.path().join("calls")).is_empty());
    }

    #[test]
    fn rand_pool_info_layout() {
        let info = rand_pool_info(&[1, 2, 3, 4, 5]);
        assert_eq!(&info[..4], &40i32.to_ne_bytes());
        assert_eq!(&info[4..8], &5i32.to_ne_bytes());
        assert_eq!(&info[8..], &[1, 2, 3, 4, 5, 0, 0, 0]);
    }
}
