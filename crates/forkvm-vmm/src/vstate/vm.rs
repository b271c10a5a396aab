//! A KVM VM: its file descriptor, interrupt controllers, memory slots and clock.

use super::irqchip::{IrqchipError, IrqchipMode};
use kvm_bindings::{
    kvm_clock_data, kvm_enable_cap, kvm_userspace_memory_region, KVM_CAP_EXCEPTION_PAYLOAD, KVM_CAP_HALT_POLL,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::{Kvm, VmFd};
use std::sync::Arc;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Address of the three pages VMX needs for its real-mode TSS (unused on SVM/PVM).
const TSS_ADDRESS: usize = 0xfffb_d000;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("creating the VM (KVM_CREATE_VM): {0}")]
    Create(kvm_ioctls::Error),
    #[error("setting the TSS address (KVM_SET_TSS_ADDR): {0}")]
    TssAddress(kvm_ioctls::Error),
    #[error("enabling exception payloads (KVM_CAP_EXCEPTION_PAYLOAD): {0}")]
    ExceptionPayload(kvm_ioctls::Error),
    #[error("turning halt polling off (KVM_CAP_HALT_POLL): {0}")]
    HaltPoll(kvm_ioctls::Error),
    #[error(transparent)]
    Irqchip(#[from] IrqchipError),
    #[error("registering guest memory slot {slot} at {addr:#x} (KVM_SET_USER_MEMORY_REGION): {source}")]
    RegisterMemory { slot: u32, addr: u64, source: kvm_ioctls::Error },
    #[error("reading the guest clock (KVM_GET_CLOCK): {0}")]
    GetClock(kvm_ioctls::Error),
    #[error("setting the guest clock (KVM_SET_CLOCK): {0}")]
    SetClock(kvm_ioctls::Error),
}

/// With `KVM_CAP_EXCEPTION_PAYLOAD`, KVM reports a pending and an injected exception
/// apart and sets them back exactly; without it a vCPU paused mid-delivery of an
/// exception comes back in a (harmlessly) different but not identical state.
fn enable_exception_payload(fd: &VmFd) -> Result<bool, VmError> {
    if fd.check_extension_raw(u64::from(KVM_CAP_EXCEPTION_PAYLOAD)) <= 0 {
        return Ok(false);
    }
    let mut cap = kvm_enable_cap { cap: KVM_CAP_EXCEPTION_PAYLOAD, ..Default::default() };
    cap.args[0] = 1;
    fd.enable_cap(&cap).map_err(VmError::ExceptionPayload)?;
    Ok(true)
}

/// Turns KVM's halt polling off for this VM (where the host lets a VM choose). A vCPU
/// that halts would otherwise spin in the host for up to `halt_poll_ns` (200 µs by
/// default) in case it is woken at once: a gain for one busy guest's latency, but host
/// CPU burnt at every idle wake-up of every sandbox, which is what a host of hundreds of
/// mostly idle sandboxes cannot afford. Their wake-ups come from timers and from the
/// VMM's device threads, which take longer than a poll anyway.
fn disable_halt_polling(fd: &VmFd) -> Result<(), VmError> {
    if fd.check_extension_raw(u64::from(KVM_CAP_HALT_POLL)) <= 0 {
        return Ok(());
    }
    let cap = kvm_enable_cap { cap: KVM_CAP_HALT_POLL, ..Default::default() };
    fd.enable_cap(&cap).map_err(VmError::HaltPoll)
}

#[derive(Debug)]
pub struct Vm {
    pub fd: Arc<VmFd>,
    pub irqchip: IrqchipMode,
    /// KVM_CAP_EXCEPTION_PAYLOAD is enabled.
    pub payload_events: bool,
}

impl Vm {
    /// Creates the VM and its interrupt controllers; vCPUs come after this.
    pub fn create(kvm: &Kvm, irqchip: IrqchipMode) -> Result<Vm, VmError> {
        let fd = kvm.create_vm().map_err(VmError::Create)?;
        fd.set_tss_address(TSS_ADDRESS).map_err(VmError::TssAddress)?;
        let payload_events = enable_exception_payload(&fd)?;
        disable_halt_polling(&fd)?;
        irqchip.create(&fd)?;
        Ok(Vm { fd: Arc::new(fd), irqchip, payload_events })
    }

    /// Creates the VM with `mem` registered *before* the interrupt controllers: on PVM
    /// hosts adding a memory slot to a VM that already has KVM's full irqchip costs
    /// milliseconds, adding it first costs what it does with the split one.
    pub fn create_with_memory(kvm: &Kvm, irqchip: IrqchipMode, mem: &GuestMemoryMmap) -> Result<Vm, VmError> {
        let fd = kvm.create_vm().map_err(VmError::Create)?;
        fd.set_tss_address(TSS_ADDRESS).map_err(VmError::TssAddress)?;
        let payload_events = enable_exception_payload(&fd)?;
        disable_halt_polling(&fd)?;
        let vm = Vm { fd: Arc::new(fd), irqchip, payload_events };
        vm.register_memory(mem)?;
        irqchip.create(&vm.fd)?;
        Ok(vm)
    }

    /// Registers every region of `mem` as a KVM memory slot.
    pub fn register_memory(&self, mem: &GuestMemoryMmap) -> Result<(), VmError> {
        for (slot, region) in mem.iter().enumerate() {
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            debug_assert_eq!(r.flags & KVM_MEM_LOG_DIRTY_PAGES, 0);
            // SAFETY: the host range is a live mapping owned by `mem`, which the caller
            // keeps alive for as long as the VM exists (both live in the `Vmm`).
            unsafe { self.fd.set_user_memory_region(r) }.map_err(|source| VmError::RegisterMemory {
                slot: slot as u32,
                addr: r.guest_phys_addr,
                source,
            })?;
        }
        Ok(())
    }

    pub fn save_clock(&self) -> Result<kvm_clock_data, VmError> {
        self.fd.get_clock().map_err(VmError::GetClock)
    }

    /// Sets kvm-clock so the guest's clock continues from where it was saved.
    pub fn restore_clock(&self, clock: &kvm_clock_data) -> Result<(), VmError> {
        let c = kvm_clock_data { clock: clock.clock, ..Default::default() };
        self.fd.set_clock(&c).map_err(VmError::SetClock)
    }
}
