//! The base kernel command line of the forkvm guest kernel.
//!
//! `console=ttyS0 reboot=k panic=1`: the console on the 8250 UART, reboot through the
//! keyboard controller (the VMM sees the reset command and stops the VM), and a panic
//! turns into a reboot after one second instead of a hang. The VMM appends the rest:
//! its virtio devices (`virtio_mmio.device=...`) and the CPU profile's arguments — on PVM
//! hosts the `clearcpuid=...` list of the `pvm-xsave` CPU template, kept in one place:
//! `forkvm_vmm::arch::x86_64::cpuid::CpuTemplate::linux_cmdline`.

/// Arguments every forkvm guest kernel gets, whatever the host.
pub fn base_cmdline() -> &'static str {
    "console=ttyS0 reboot=k panic=1"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_line_reboots_through_the_keyboard_controller() {
        assert!(base_cmdline().contains("reboot=k"));
        assert!(base_cmdline().starts_with("console=ttyS0"));
    }
}
