//! A cold boot in a VMM process of its own: what a sandbox that starts from a disk
//! rather than from memory (a disk-only fork) runs in.
//!
//! Like a zygote child ([`crate::zygote`]), the process is forked from the caller,
//! detaches, is moved into its cgroup, builds its VM — here by booting the kernel — and serves
//! its control socket until the VM stops; it owns and removes its run directory.

use crate::arch::x86_64::cpuid::CpuTemplate;
use crate::builder::{boot, BootConfig, Payload};
use crate::devices::serial::ConsoleOut;
use crate::host::open_kvm;
use crate::host::process::{close_fds_except, detach_stdio};
use crate::vstate::irqchip::IrqchipMode;
use crate::zygote::{fork_vmm, open_console_log, serve_to_exit_code, ChildSpec, ZygoteError, EXIT_RESTORE_FAILED};
use std::io::Write;

/// The machine a cold-booted VMM builds.
#[derive(Debug, Clone)]
pub struct Machine {
    pub mem_size: u64,
    pub vcpu_count: u8,
    pub irqchip: IrqchipMode,
    pub cpu_template: CpuTemplate,
    pub payload: Payload,
}

/// Forks a detached VMM process that boots `machine` with `spec`'s devices and serves
/// `spec.socket`; returns its pid. The caller must be single-threaded (it forks).
pub fn boot_detached(machine: Machine, spec: ChildSpec) -> Result<libc::pid_t, ZygoteError> {
    let log = open_console_log(spec.console_log.as_deref())?;
    // Opened here: the child's jail may not show /dev/kvm.
    let kvm = open_kvm()?;
    let owned = spec.owned.clone();
    fork_vmm(&owned, true, move || {
        detach_stdio(log.as_ref().map(crate::devices::console_log::ConsoleLog::file));
        let mut error_log = log.as_ref().and_then(|f| f.file().try_clone().ok());
        // The VMM outlives its caller: it keeps none of the caller's files or sockets.
        use std::os::fd::AsRawFd;
        let mut keep = vec![0, 1, 2, kvm.as_raw_fd()];
        keep.extend(spec.owned.jail_fds());
        keep.extend(spec.devices.tap_fd());
        keep.extend(log.as_ref().map(|f| f.file().as_raw_fd()));
        keep.extend(error_log.as_ref().map(|f| f.as_raw_fd()));
        close_fds_except(&keep);
        let fail = |msg: String, error_log: &mut Option<std::fs::File>| {
            if let Some(f) = error_log.as_mut() {
                let _ = writeln!(f, "\n[forkvm] {msg}");
            }
            EXIT_RESTORE_FAILED
        };
        if spec.owned.ids.is_some() {
            // Root's files it reads (kernel, images, layers), opened while it still may.
            crate::host::preopen::offer_for(&spec.devices, Some(&machine.payload), Some(&kvm));
        }
        if let Err(e) = spec.owned.enter() {
            let code = fail(format!("confining the VMM: {e}"), &mut error_log);
            spec.owned.release(true);
            return code;
        }
        let code = run(&kvm, machine, &spec, log, &mut error_log, fail);
        spec.owned.release(code == EXIT_RESTORE_FAILED);
        code
    })
}

fn run(
    kvm: &kvm_ioctls::Kvm,
    machine: Machine,
    spec: &ChildSpec,
    log: Option<crate::devices::console_log::ConsoleLog>,
    error_log: &mut Option<std::fs::File>,
    fail: impl Fn(String, &mut Option<std::fs::File>) -> i32,
) -> i32 {
    let config = BootConfig {
        mem_size: machine.mem_size,
        vcpu_count: machine.vcpu_count,
        irqchip: machine.irqchip,
        cpu_template: machine.cpu_template,
        payload: machine.payload,
        console: ConsoleOut::new(log, None),
        devices: spec.devices.clone(),
        start_paused: false,
    };
    let mut vmm = match boot(kvm, config) {
        Ok(v) => v,
        Err(e) => return fail(format!("boot failed: {e}"), error_log),
    };
    vmm.set_labels(spec.labels.clone());
    serve_to_exit_code(vmm, spec.socket.as_deref(), error_log, fail)
}
