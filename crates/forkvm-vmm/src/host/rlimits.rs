//! Resource limits of a VMM process, set as it confines itself ([`crate::zygote::Owned::enter`]):
//! enough descriptors for every vsock connection the device allows and no more, and no
//! locked memory (a VMM never locks pages; a guest bug must not pin host memory with
//! `mlock`). Core dumps are off as well (`privileges`).

use crate::devices::virtio::vsock::MAX_CONNECTIONS;

/// Descriptors a VMM may hold: one per vsock connection, plus its own (KVM, eventfds,
/// disks, control connections).
pub const VMM_MAX_FILES: u64 = MAX_CONNECTIONS as u64 + 256;

#[derive(Debug, thiserror::Error)]
#[error("setting {what} to {value}: {source}")]
pub struct RlimitError {
    what: &'static str,
    value: u64,
    source: std::io::Error,
}

fn set(resource: libc::__rlimit_resource_t, what: &'static str, value: u64) -> Result<(), RlimitError> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: setrlimit only reads the struct, which lives across the call.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(RlimitError { what, value, source: std::io::Error::last_os_error() });
    }
    Ok(())
}

/// Sets the calling process's limits (see the module doc). The descriptor limit is
/// lowered to what the process may have if its hard limit is below [`VMM_MAX_FILES`].
pub fn apply_vmm_rlimits() -> Result<(), RlimitError> {
    let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut current) };
    set(libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", VMM_MAX_FILES.min(current.rlim_max))?;
    set(libc::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", 0)
}
