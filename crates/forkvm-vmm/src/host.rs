//! What kind of KVM host this is, and whether `/dev/kvm` is usable at all.
//!
//! forkvm runs on hardware KVM (VMX/SVM) and on PVM hosts (`kvm_pvm`: a software KVM
//! backend for VMs inside VMs, where guest ring-0 code is emulated). The CPU template,
//! the guest command line and the tests' expectations depend on which one we are on.

pub mod cgroup;
pub mod confinement;
pub mod ids;
pub mod jail;
pub mod peer_guard;
pub mod preopen;
pub mod privileges;
pub mod process;
pub mod rlimits;
pub mod seccomp;

use std::path::Path;

/// How this host provides KVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// VMX or SVM in hardware.
    Hardware,
    /// The `kvm_pvm` module: no VMX/SVM; guest kernel code goes through the emulator.
    Pvm,
}

impl HostKind {
    /// Detects the host kind from `/sys/module` and `/proc/cpuinfo`.
    pub fn detect() -> HostKind {
        let pvm_loaded = Path::new("/sys/module/kvm_pvm").exists();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let hw_virt = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
        if pvm_loaded || !hw_virt {
            HostKind::Pvm
        } else {
            HostKind::Hardware
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HostKind::Hardware => "hardware",
            HostKind::Pvm => "pvm",
        }
    }
}

/// Why `/dev/kvm` cannot be used, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum KvmUnavailable {
    #[error("{0} does not exist: this host has no KVM (load kvm_intel, kvm_amd or kvm_pvm, or run on a host with virtualization)")]
    Missing(String),
    #[error("/dev/kvm exists but cannot be opened read-write ({0}): run as root or add your user to the kvm group")]
    Permission(std::io::Error),
    #[error("/dev/kvm cannot be opened: {0}")]
    Open(std::io::Error),
    #[error("the KVM device answered API version {0}, not 12: it is not a usable /dev/kvm")]
    ApiVersion(i32),
}

/// Environment variable that points forkvm at another KVM device node (for tests of
/// the "no KVM" path, and hosts with an unusual layout).
pub const KVM_DEVICE_ENV: &str = "FORKVM_KVM_DEVICE";

/// Opens `/dev/kvm` (or `$FORKVM_KVM_DEVICE`), turning each failure into an explanation.
pub fn open_kvm() -> Result<kvm_ioctls::Kvm, KvmUnavailable> {
    let path = kvm_device();
    if let Some(offered) = forkvm_snapshot::preopened::offered_file(&path, true) {
        let fd = std::os::fd::IntoRawFd::into_raw_fd(offered.map_err(KvmUnavailable::Open)?);
        // SAFETY: the descriptor is the KVM device node this process opened before it
        // gave up its uid (`preopen`), duplicated for the Kvm to own.
        return Ok(unsafe { <kvm_ioctls::Kvm as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
    open_kvm_at(&path)
}

/// The KVM device node: `$FORKVM_KVM_DEVICE`, else `/dev/kvm`.
pub fn kvm_device() -> std::path::PathBuf {
    std::env::var_os(KVM_DEVICE_ENV).unwrap_or_else(|| "/dev/kvm".into()).into()
}

/// Opens a KVM device node at `path` (tests point this elsewhere).
pub fn open_kvm_at(path: &Path) -> Result<kvm_ioctls::Kvm, KvmUnavailable> {
    if !path.exists() {
        return Err(KvmUnavailable::Missing(path.display().to_string()));
    }
    let c_path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| KvmUnavailable::Open(e.into()))?;
    let kvm = kvm_ioctls::Kvm::new_with_path(&c_path).map_err(|e| {
        let io = std::io::Error::from_raw_os_error(e.errno());
        if matches!(e.errno(), libc::EACCES | libc::EPERM) {
            KvmUnavailable::Permission(io)
        } else {
            KvmUnavailable::Open(io)
        }
    })?;
    match kvm.get_api_version() {
        12 => Ok(kvm),
        v => Err(KvmUnavailable::ApiVersion(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_is_explained() {
        let err = open_kvm_at(Path::new("/nonexistent/kvm")).unwrap_err();
        assert!(matches!(err, KvmUnavailable::Missing(_)));
        assert!(err.to_string().contains("/nonexistent/kvm does not exist: this host has no KVM"));
    }

    #[test]
    fn a_non_kvm_file_is_refused() {
        let err = open_kvm_at(Path::new("/dev/null")).unwrap_err();
        assert!(!err.to_string().is_empty());
    }
}
