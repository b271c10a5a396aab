//! PID 1 duties: early mounts, the boot hostname, and shutdown.
//!
//! Shutdown uses `reboot(LINUX_REBOOT_CMD_RESTART)`, not power-off: forkvm's VMM has no
//! ACPI, so a power-off would just halt the vCPUs, while a restart resets the CPU and
//! KVM reports it as `KVM_EXIT_SHUTDOWN`, which the VMM treats as the guest exiting.

use std::ffi::CString;
use std::io;

/// Whether this process is the guest's init.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// (source, target, fstype, mode for tmpfs)
const MOUNTS: [(&str, &str, &str, Option<&str>); 5] = [
    ("proc", "/proc", "proc", None),
    ("sysfs", "/sys", "sysfs", None),
    ("devtmpfs", "/dev", "devtmpfs", None),
    ("tmpfs", "/tmp", "tmpfs", Some("mode=1777")),
    ("tmpfs", "/run", "tmpfs", Some("mode=0755")),
];

/// Mounts proc, sysfs, devtmpfs and the tmpfs dirs; already-mounted (EBUSY) is fine.
/// Returns the failures (target, error) so the caller can log them and carry on.
pub fn mount_early() -> Vec<(&'static str, io::Error)> {
    let mut failures = Vec::new();
    for (source, target, fstype, data) in MOUNTS {
        let _ = std::fs::create_dir_all(target);
        if let Err(e) = mount(source, target, fstype, data) {
            if e.raw_os_error() != Some(libc::EBUSY) {
                failures.push((target, e));
            }
        }
    }
    failures
}

/// Where the writable layer of an overlay root lives (the data disk, or a tmpfs), and where the overlay is
/// assembled before it replaces `/`. Both directories must exist in the image.
const OVERLAY_DIR: &str = "/overlay";
const NEWROOT_DIR: &str = "/newroot";

/// Whether `/` is mounted read-only (the shared image of a sandbox).
pub fn root_is_read_only() -> bool {
    // SAFETY: statvfs fills the zeroed struct; the path is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(c"/".as_ptr(), &mut st) };
    rc == 0 && st.f_flag & libc::ST_RDONLY != 0
}

/// Serial of the sandbox's own data disk (the host's `DATA_DISK_ID`).
pub const DATA_DISK_SERIAL: &str = "forkvm-data";

/// Puts an overlay over the read-only root image and makes it `/`: the image stays
/// shared and untouched; the sandbox's writes go to its data disk (an ext4 on the
/// layered virtio disk whose serial is [`DATA_DISK_SERIAL`]), so they are on a disk the
/// host snapshots, forks and backs up. Without such a disk they go to a tmpfs.
pub fn overlay_root() -> io::Result<()> {
    let step = |what: &str, r: io::Result<()>| r.map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")));
    match mount_data_disk() {
        Ok(true) => {}
        Ok(false) => {
            step("mounting the overlay tmpfs", mount_with("tmpfs", OVERLAY_DIR, "tmpfs", Some("mode=0755"), 0))?
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("mounting the data disk: {e}"))),
    }
    for d in ["upper", "work"] {
        step("creating overlay dirs", std::fs::create_dir_all(format!("{OVERLAY_DIR}/{d}")))?;
    }
    let opts = format!("lowerdir=/,upperdir={OVERLAY_DIR}/upper,workdir={OVERLAY_DIR}/work");
    step("mounting the overlay", mount_with("overlay", NEWROOT_DIR, "overlay", Some(&opts), 0))?;
    step("entering the new root", std::env::set_current_dir(NEWROOT_DIR))?;
    step("moving the overlay to /", mount_with(".", "/", "", None, libc::MS_MOVE))?;
    // SAFETY: chroot(".") with a valid C string; we are root (PID 1).
    if unsafe { libc::chroot(c".".as_ptr()) } != 0 {
        return Err(io::Error::new(io::Error::last_os_error().kind(), "chroot into the overlay"));
    }
    step("chdir /", std::env::set_current_dir("/"))
}

/// Mounts the data disk at [`OVERLAY_DIR`] if the VM has one (found by serial through
/// a temporary sysfs and devtmpfs, unmounted again). `Ok(false)`: there is none.
fn mount_data_disk() -> io::Result<bool> {
    for (source, target, fstype) in [("sysfs", "/sys", "sysfs"), ("devtmpfs", "/dev", "devtmpfs")] {
        if let Err(e) = mount_with(source, target, fstype, None, 0) {
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(io::Error::new(e.kind(), format!("mounting {target} to look for it: {e}")));
            }
        }
    }
    let found = disk_by_serial(DATA_DISK_SERIAL);
    let mounted = match &found {
        // Inode tables are left unzeroed by mkfs on a sparse, all-zero disk: do not
        // spend (emulated) kernel time zeroing them again.
        Some(dev) => mount_with(&format!("/dev/{dev}"), OVERLAY_DIR, "ext4", Some("noinit_itable"), 0)
            .map_err(|e| io::Error::new(e.kind(), format!("mounting /dev/{dev} (ext4): {e}"))),
        None => Ok(()),
    };
    for target in [c"/dev", c"/sys"] {
        // SAFETY: a valid C string; detaching our own temporary mounts.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
    mounted.map(|()| found.is_some())
}

/// The block device (`vdb`) whose virtio serial is `serial`, from `/sys/block`.
pub(crate) fn disk_by_serial(serial: &str) -> Option<String> {
    std::fs::read_dir("/sys/block").ok()?.filter_map(Result::ok).find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let s = std::fs::read_to_string(e.path().join("serial")).ok()?;
        (s.trim_end_matches(['\n', '\0']) == serial).then_some(name)
    })
}

fn mount(source: &str, target: &str, fstype: &str, data: Option<&str>) -> io::Result<()> {
    let c = |s: &str| CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let (source, target, fstype) = (c(source)?, c(target)?, c(fstype)?);
    let data = data.map(c).transpose()?;
    let data_ptr = data.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast());
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    // devtmpfs needs device nodes, so it must not get MS_NODEV.
    let flags = if fstype.as_bytes() == b"devtmpfs" { libc::MS_NOSUID } else { flags };
    mount_raw(&source, &target, &fstype, data_ptr, flags)
}

pub(crate) fn mount_with(
    source: &str,
    target: &str,
    fstype: &str,
    data: Option<&str>,
    flags: libc::c_ulong,
) -> io::Result<()> {
    let c = |s: &str| CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let (source, target, fstype) = (c(source)?, c(target)?, c(fstype)?);
    let data = data.map(c).transpose()?;
    let data_ptr = data.as_ref().map_or(std::ptr::null(), |d| d.as_ptr().cast());
    mount_raw(&source, &target, &fstype, data_ptr, flags)
}

fn mount_raw(
    source: &CString,
    target: &CString,
    fstype: &CString,
    data_ptr: *const libc::c_void,
    flags: libc::c_ulong,
) -> io::Result<()> {
    // SAFETY: all pointers are NUL-terminated strings (or null data) alive for the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data_ptr) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Flushes filesystems and resets the guest (PID 1), or exits the agent otherwise.
pub fn shutdown(pid1: bool) -> ! {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    if pid1 {
        // SAFETY: reboot(2) with a valid command; on success it does not return.
        unsafe { libc::reboot(libc::LINUX_REBOOT_CMD_RESTART) };
        tracing::error!(error = %io::Error::last_os_error(), "reboot failed; exiting (kernel will panic)");
    }
    std::process::exit(0)
}
