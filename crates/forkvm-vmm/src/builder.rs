//! Builds a running [`Vmm`]: `boot(config)` from a kernel or test-guest image, and
//! `restore(snapshot)` from a snapshot directory. Both share the `attach_*` helpers.
//!
//! Boot order (each step needs the ones before it):
//! 1. Allocate guest memory (private anonymous).
//! 2. Create the VM and register guest memory with KVM.
//! 3. Create its interrupt controllers (kernel or split irqchip; PIT with the kernel
//!    irqchip) — KVM requires them before any vCPU exists; after the memory, because on
//!    PVM hosts a memory slot added to a VM with KVM's full irqchip costs milliseconds.
//! 4. Load the payload: a Linux kernel (boot params, e820, command line, initrd, and
//!    for several vCPUs an MP table) or a flat test-guest image and its argument block.
//! 5. Write the boot GDT, an empty IDT and the identity page tables.
//! 6. Create the devices (COM1, and our IOAPIC with a split irqchip).
//! 7. Create each vCPU: CPUID (KVM's set through the CPU template), boot MSRs, general,
//!    special and FPU registers, LAPIC LINT0/LINT1. With a flat image every vCPU starts
//!    at the entry, RDI holding its index; a Linux kernel's other vCPUs wait for the
//!    INIT and SIPI its boot CPU sends them (KVM creates them waiting).
//! 8. Start the vCPU threads.
//!
//! Restore order: read and check the snapshot ([`PreparedSnapshot`], once per snapshot,
//! shared by every child of a fork); then per VM: map `memory.img` copy-on-write (1),
//! create the VM, register the memory, create the irqchip (2, 3), restore the devices (6), create the
//! vCPUs and load their saved state (7), restore the in-kernel irqchip, PIT and clock,
//! start the threads (8).

use crate::arch::x86_64::cpuid::{base_cpuid, vcpu_cpuid, CpuTemplate};
use crate::arch::x86_64::layout::ZERO_PAGE_START;
use crate::arch::x86_64::linux_boot::{load_linux, LinuxBootConfig, LinuxBootError};
use crate::arch::x86_64::{msr, paging, regs};
use crate::devices::attach::{build_slots, restore_slots, AttachError, DeviceConfig, SlotWiring};
use crate::devices::ioapic::{BadIoapicState, Ioapic};
use crate::devices::irq::{IrqLine, IrqRoute};
use crate::devices::serial::{ConsoleOut, SerialDevice, SerialError, COM1_IRQ};
use crate::devices::Devices;
use crate::persist::{StateError, VmState};
use crate::phase_timer::PhaseTimer;
use crate::vmm::{GuestInfo, VmParts, Vmm};
use crate::vstate::exit::ExitLatch;
use crate::vstate::irqchip::{IrqchipError, IrqchipMode};
use crate::vstate::memory::{self, MemoryError};
use crate::vstate::vcpu::VcpuRunner;
use crate::vstate::vcpu_state::VcpuStateError;
use crate::vstate::vm::{Vm, VmError};
use forkvm_snapshot::{SnapshotDir, SnapshotMeta};
use kvm_ioctls::{Kvm, VcpuFd};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("starting the device timer thread: {0}")]
    DeviceTimer(std::io::Error),
    #[error("guest memory: {0}")]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Irqchip(#[from] IrqchipError),
    #[error("loading the Linux kernel: {0}")]
    LoadLinux(#[from] LinuxBootError),
    #[error(transparent)]
    MpTable(#[from] crate::arch::x86_64::mptable::MpTableError),
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("test guest image of {size} bytes does not fit below the top of {mem_size} bytes of memory")]
    ImageTooLarge { size: usize, mem_size: u64 },
    #[error("test guest takes at most {max} arguments, got {got}")]
    TooManyArgs { got: usize, max: usize },
    #[error("writing {what} into guest memory: {source}")]
    WriteGuest { what: &'static str, source: vm_memory::GuestMemoryError },
    #[error("reading KVM's supported CPUID: {0}")]
    Cpuid(kvm_ioctls::Error),
    #[error("creating vCPU {index}: {source}")]
    CreateVcpu { index: u8, source: kvm_ioctls::Error },
    #[error("setting up vCPU {index}: {step}: {source}")]
    SetupVcpu { index: u8, step: &'static str, source: kvm_ioctls::Error },
    #[error("restoring vCPU {index}: {source}")]
    RestoreVcpu { index: u8, source: VcpuStateError },
    #[error("a VM has 1 to {max} vCPUs, not {got}")]
    VcpuCount { got: usize, max: usize },
    #[error("restoring the serial port: {0}")]
    Serial(#[from] SerialError),
    #[error("virtio devices: {0}")]
    Virtio(#[from] AttachError),
    #[error("restoring the IOAPIC: {0}")]
    Ioapic(#[from] BadIoapicState),
    #[error("snapshot {dir}: {source}")]
    SnapshotDir { dir: PathBuf, source: forkvm_snapshot::DirError },
    #[error("snapshot {dir}: {source}")]
    State { dir: PathBuf, source: StateError },
    #[error("snapshot {dir}: {source}")]
    MemoryImage { dir: PathBuf, source: forkvm_snapshot::MemoryImageError },
    #[error("snapshot {0}: prepared without a memory image, so it restores only lazily (from a memory source)")]
    NoMemoryImage(PathBuf),
    #[error(transparent)]
    LazyMemory(#[from] crate::vstate::lazy_memory::LazyMemoryError),
    #[error("snapshot {dir}: snapshot.json says {meta} but vmstate.bin says {state}")]
    Mismatch { dir: PathBuf, meta: String, state: String },
    #[error("starting vCPU thread {index}: {source}")]
    SpawnVcpu { index: u8, source: std::io::Error },
}

/// What the guest runs.
#[derive(Debug, Clone)]
pub enum Payload {
    /// A flat image loaded at `image_base` and entered in 64-bit mode with `args` (u64
    /// words) at `ZERO_PAGE_START`.
    Flat { name: String, image: Vec<u8>, image_base: u64, args: Vec<u64> },
    /// A Linux kernel (ELF vmlinux or bzImage), optional initrd and command line.
    Linux { kernel: PathBuf, initrd: Option<PathBuf>, cmdline: String },
}

/// Most u64 arguments a flat image takes.
pub const MAX_FLAT_ARGS: usize = 8;

#[derive(Debug)]
pub struct BootConfig {
    pub mem_size: u64,
    pub vcpu_count: u8,
    pub irqchip: IrqchipMode,
    pub cpu_template: CpuTemplate,
    pub payload: Payload,
    pub console: ConsoleOut,
    /// virtio devices (announced to a Linux guest on its command line).
    pub devices: DeviceConfig,
    pub start_paused: bool,
}

/// Boots a new VM (steps 1–8 of the module doc).
pub fn boot(kvm: &Kvm, config: BootConfig) -> Result<Vmm, BuildError> {
    let vcpu_count = usize::from(config.vcpu_count);
    if vcpu_count == 0 || vcpu_count > crate::persist::MAX_VCPUS {
        return Err(BuildError::VcpuCount { got: vcpu_count, max: crate::persist::MAX_VCPUS });
    }
    let mem = memory::anonymous(config.mem_size)?;
    let vm = Vm::create_with_memory(kvm, config.irqchip, &mem)?;
    let extra_cmdline = format!("{} {}", config.devices.cmdline(), config.cpu_template.linux_cmdline());
    let (entry, guest) = load_payload(&mem, config.mem_size, &config.payload, &extra_cmdline)?;
    let flat = matches!(config.payload, Payload::Flat { .. });
    if !flat && config.vcpu_count > 1 {
        crate::arch::x86_64::mptable::write(&mem, config.vcpu_count)?;
    }
    regs::write_boot_tables(&mem).map_err(|source| BuildError::WriteGuest { what: "boot GDT", source })?;
    let cr3 =
        paging::write_identity_tables(&mem).map_err(|source| BuildError::WriteGuest { what: "page tables", source })?;
    let devices = attach_devices(&vm, &mem, config.console, &config.devices, None)?;
    let base = base_cpuid(kvm, config.cpu_template).map_err(BuildError::Cpuid)?;
    let mut runners = Vec::new();
    let (events_tx, events) = channel();
    let exit = Arc::new(ExitLatch::default());
    let run_size = vcpu_run_size(kvm)?;
    for index in 0..config.vcpu_count {
        let fd = create_vcpu(&vm, index, run_size)?;
        let cpuid = vcpu_cpuid(&base, index, config.vcpu_count).map_err(|_| BuildError::SetupVcpu {
            index,
            step: "building CPUID",
            source: kvm_ioctls::Error::new(libc::EINVAL),
        })?;
        setup_boot_vcpu(&fd, index, &cpuid, entry, cr3)?;
        if index > 0 && flat {
            let runnable = kvm_bindings::kvm_mp_state { mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE };
            fd.set_mp_state(runnable).map_err(|source| BuildError::SetupVcpu {
                index,
                step: "KVM_SET_MP_STATE",
                source,
            })?;
        }
        let msr_indices = msr::saved_msr_indices(kvm, &fd).to_vec();
        runners.push(VcpuRunner {
            index,
            fd,
            devices: devices.clone(),
            cpuid: cpuid.as_slice().to_vec(),
            msr_indices,
            events: events_tx.clone(),
            exit: exit.clone(),
            mem: mem.clone(),
            payload_events: vm.payload_events,
            fixups_seen: 0,
            xsave_layout: Default::default(),
            io_pending: false,
        });
    }
    devices.arm_interrupts().map_err(BuildError::DeviceTimer)?;
    let parts = VmParts {
        vm,
        memory: mem,
        devices,
        runners,
        events,
        exit,
        guest,
        cpu_template: config.cpu_template,
        device_config: config.devices.clone(),
    };
    Vmm::start(parts, config.start_paused)
}

fn load_payload(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    payload: &Payload,
    extra_cmdline: &str,
) -> Result<(u64, GuestInfo), BuildError> {
    match payload {
        Payload::Flat { name, image, image_base, args } => {
            if args.len() > MAX_FLAT_ARGS {
                return Err(BuildError::TooManyArgs { got: args.len(), max: MAX_FLAT_ARGS });
            }
            if image_base.saturating_add(image.len() as u64) > mem_size {
                return Err(BuildError::ImageTooLarge { size: image.len(), mem_size });
            }
            mem.write_slice(image, GuestAddress(*image_base))
                .map_err(|source| BuildError::WriteGuest { what: "test guest image", source })?;
            let words: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
            mem.write_slice(&words, GuestAddress(ZERO_PAGE_START))
                .map_err(|source| BuildError::WriteGuest { what: "test guest arguments", source })?;
            Ok((*image_base, GuestInfo { kind: "testguest".into(), name: name.clone() }))
        }
        Payload::Linux { kernel, initrd, cmdline } => {
            let open = |p: &PathBuf| {
                forkvm_snapshot::preopened::open(p, false)
                    .map_err(|source| BuildError::Open { path: p.clone(), source })
            };
            let mut kernel_file = open(kernel)?;
            let mut initrd_file = initrd.as_ref().map(open).transpose()?;
            // Device and CPU-profile arguments go last so they win over the caller's.
            let cmdline = format!("{cmdline} {extra_cmdline}");
            let loaded = load_linux(
                mem,
                mem_size,
                LinuxBootConfig { kernel: &mut kernel_file, initrd: initrd_file.as_mut(), cmdline: cmdline.trim() },
            )?;
            let name = kernel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            Ok((loaded.entry.0, GuestInfo { kind: "linux".into(), name }))
        }
    }
}

/// Creates the device set; `state` restores it from a snapshot.
fn attach_devices(
    vm: &Vm,
    mem: &GuestMemoryMmap,
    console: ConsoleOut,
    config: &DeviceConfig,
    state: Option<&crate::devices::DevicesState>,
) -> Result<Arc<Devices>, BuildError> {
    let ioapic = match (vm.irqchip, state.and_then(|s| s.ioapic.as_ref())) {
        (IrqchipMode::Kernel, _) => None,
        (IrqchipMode::Split, Some(s)) => Some(Arc::new(Mutex::new(Ioapic::restore(s)?))),
        (IrqchipMode::Split, None) => Some(Arc::new(Mutex::new(Ioapic::default()))),
    };
    let route = match &ioapic {
        None => IrqRoute::Kernel { gsi: COM1_IRQ },
        Some(io) => IrqRoute::Split { ioapic: io.clone(), pin: COM1_IRQ as usize },
    };
    let armed = Arc::new(AtomicBool::new(false));
    let irq = IrqLine::new(vm.fd.clone(), route, armed.clone());
    let serial = match state {
        Some(s) => SerialDevice::restore(&s.serial, irq, console)?,
        None => SerialDevice::new(irq, console),
    };
    let wiring = SlotWiring { vm: &vm.fd, irqchip: vm.irqchip, ioapic: ioapic.as_ref(), mem, armed: &armed };
    let virtio = match state {
        Some(s) => restore_slots(config, &s.virtio, &wiring)?,
        None => build_slots(config, &wiring)?,
    };
    Ok(Arc::new(Devices::new(serial, ioapic, virtio, armed)))
}

/// Creates vCPU `index`. Its `kvm_run` page is marked `MADV_DONTFORK`: a process forked
/// from this VMM (a live branch's writer, a fork of the running VM) must not keep this
/// VM's vCPUs alive through an inherited mapping.
fn create_vcpu(vm: &Vm, index: u8, run_size: usize) -> Result<VcpuFd, BuildError> {
    let mut fd = vm.fd.create_vcpu(u64::from(index)).map_err(|source| BuildError::CreateVcpu { index, source })?;
    let run: *mut kvm_bindings::kvm_run = fd.get_kvm_run();
    // SAFETY: `run` is the start of this vCPU's kvm_run mapping of `run_size` bytes (KVM's
    // vCPU mmap size); MADV_DONTFORK only changes what fork() copies, not this mapping.
    let rc = unsafe { libc::madvise(run.cast(), run_size, libc::MADV_DONTFORK) };
    if rc != 0 {
        return Err(BuildError::SetupVcpu {
            index,
            step: "madvise(kvm_run, MADV_DONTFORK)",
            source: kvm_ioctls::Error::last(),
        });
    }
    Ok(fd)
}

/// KVM's size of a vCPU's `kvm_run` mapping.
fn vcpu_run_size(kvm: &Kvm) -> Result<usize, BuildError> {
    kvm.get_vcpu_mmap_size().map_err(|source| BuildError::SetupVcpu {
        index: 0,
        step: "KVM_GET_VCPU_MMAP_SIZE",
        source,
    })
}

fn setup_boot_vcpu(
    fd: &VcpuFd,
    index: u8,
    cpuid: &kvm_bindings::CpuId,
    entry: u64,
    cr3: u64,
) -> Result<(), BuildError> {
    let step = |step: &'static str| move |source| BuildError::SetupVcpu { index, step, source };
    fd.set_cpuid2(cpuid).map_err(step("KVM_SET_CPUID2"))?;
    let msrs = msr::msrs_from_entries(&msr::boot_msr_entries()).map_err(|_| BuildError::SetupVcpu {
        index,
        step: "building MSRs",
        source: kvm_ioctls::Error::new(libc::EINVAL),
    })?;
    fd.set_msrs(&msrs).map_err(step("KVM_SET_MSRS"))?;
    fd.set_regs(&regs::boot_regs(entry, index)).map_err(step("KVM_SET_REGS"))?;
    let sregs = fd.get_sregs().map_err(step("KVM_GET_SREGS"))?;
    fd.set_sregs(&regs::long_mode_sregs(sregs, cr3)).map_err(step("KVM_SET_SREGS"))?;
    fd.set_fpu(&regs::boot_fpu()).map_err(step("KVM_SET_FPU"))?;
    let mut lapic = fd.get_lapic().map_err(step("KVM_GET_LAPIC"))?;
    regs::set_lint_modes(&mut lapic);
    fd.set_lapic(&lapic).map_err(step("KVM_SET_LAPIC"))
}

/// A snapshot read and checked once, ready to restore any number of VMs from.
#[derive(Debug)]
pub struct PreparedSnapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
    pub state: VmState,
    /// The memory image to map; `None` for a snapshot restored lazily ([`prepare_lazy`]).
    pub memory: Option<File>,
}

/// Reads `snapshot.json` and `vmstate.bin`, opens `memory.img`, and checks they agree.
pub fn prepare(dir: &Path) -> Result<PreparedSnapshot, BuildError> {
    prepare_with_memory(dir, None)
}

/// [`prepare`], with the memory image taken from `memory` instead of the directory's
/// `memory.img`: a chunked snapshot's assembled image (`forkvm_snapshot::chain`).
pub fn prepare_with_memory(dir: &Path, memory: Option<&Path>) -> Result<PreparedSnapshot, BuildError> {
    let mut prepared = prepare_lazy(dir)?;
    let memory_path = memory.map(Path::to_path_buf).unwrap_or_else(|| dir.join(forkvm_snapshot::MEMORY_IMG));
    let memory = forkvm_snapshot::open_image(&memory_path, prepared.state.mem_size)
        .map_err(|source| BuildError::MemoryImage { dir: prepared.dir.clone(), source })?;
    prepared.memory = Some(memory);
    Ok(prepared)
}

/// [`prepare`] without the memory image: for a restore whose memory arrives from a
/// memory source while the guest runs ([`restore_lazy`]).
pub fn prepare_lazy(dir: &Path) -> Result<PreparedSnapshot, BuildError> {
    let d = dir.to_path_buf();
    let snap = SnapshotDir::open(dir).map_err(|source| BuildError::SnapshotDir { dir: d.clone(), source })?;
    let payload = forkvm_snapshot::read_vmstate_file(&snap.vmstate_path())
        .map_err(|e| BuildError::State { dir: d.clone(), source: e.into() })?;
    let state = VmState::decode_payload(&payload).map_err(|source| BuildError::State { dir: d.clone(), source })?;
    let mismatch = |what: &str, meta: String, state: String| BuildError::Mismatch {
        dir: d.clone(),
        meta: format!("{what} {meta}"),
        state,
    };
    if snap.meta.mem_size_bytes != state.mem_size {
        return Err(mismatch("memory size", snap.meta.mem_size_bytes.to_string(), state.mem_size.to_string()));
    }
    if usize::from(snap.meta.vcpu_count) != state.vcpus.len() {
        return Err(mismatch("vCPU count", snap.meta.vcpu_count.to_string(), state.vcpus.len().to_string()));
    }
    if snap.meta.irqchip != state.irqchip_mode.name() {
        return Err(mismatch("irqchip", snap.meta.irqchip.clone(), state.irqchip_mode.name().to_string()));
    }
    Ok(PreparedSnapshot { dir: d, meta: snap.meta, state, memory: None })
}

/// Restores one VM from a prepared snapshot; its memory is a private copy-on-write
/// mapping of `memory.img`.
pub fn restore(
    kvm: &Kvm,
    snap: &PreparedSnapshot,
    console: ConsoleOut,
    devices: &DeviceConfig,
    start_paused: bool,
) -> Result<Vmm, BuildError> {
    let mut timer = PhaseTimer::new();
    let image = snap.memory.as_ref().ok_or_else(|| BuildError::NoMemoryImage(snap.dir.clone()))?;
    let mem = memory::private_file_mapping(image, snap.state.mem_size)?;
    timer.mark("map_memory");
    let guest = GuestInfo { kind: snap.meta.guest.kind.clone(), name: snap.meta.guest.name.clone() };
    restore_state(kvm, &snap.state, mem, guest, console, devices, start_paused, timer)
}

/// Restores one VM whose memory is `lazy` (mapped beforehand, while privileged), filled
/// from `source` as the guest touches it and in the background
/// (`vstate::lazy_memory`; in the background unless `$FORKVM_LAZY_AHEAD` is `0`);
/// `failure` gets the reason if a window cannot be had.
#[allow(clippy::too_many_arguments)]
pub fn restore_lazy(
    kvm: &Kvm,
    snap: &PreparedSnapshot,
    lazy: crate::vstate::lazy_memory::LazyMemory,
    source: Box<dyn forkvm_snapshot::memory_windows::WindowSource>,
    failure: crate::vstate::lazy_memory::FailureAction,
    console: ConsoleOut,
    devices: &DeviceConfig,
    start_paused: bool,
) -> Result<Vmm, BuildError> {
    let mut timer = PhaseTimer::new();
    let ahead = crate::vstate::lazy_memory::ahead_from_env();
    let (mem, progress) = lazy.serve(source, failure, ahead)?;
    timer.mark("serve_memory");
    let guest = GuestInfo { kind: snap.meta.guest.kind.clone(), name: snap.meta.guest.name.clone() };
    let mut vmm = restore_state(kvm, &snap.state, mem, guest, console, devices, start_paused, timer)?;
    vmm.set_lazy_memory(progress);
    Ok(vmm)
}

/// Builds a VM around guest memory that already holds the saved state's contents (a
/// mapping of `memory.img`, or memory inherited copy-on-write through `fork()`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_state(
    kvm: &Kvm,
    state: &VmState,
    mem: GuestMemoryMmap,
    guest: GuestInfo,
    console: ConsoleOut,
    devices: &DeviceConfig,
    start_paused: bool,
    mut timer: PhaseTimer,
) -> Result<Vmm, BuildError> {
    let vm = Vm::create_with_memory(kvm, state.irqchip_mode, &mem)?;
    timer.mark("create_vm_and_memory");
    let device_config = devices.clone();
    let devices = attach_devices(&vm, &mem, console, devices, Some(&state.devices))?;
    timer.mark("devices");
    let (events_tx, events) = channel();
    let exit = Arc::new(ExitLatch::default());
    let run_size = vcpu_run_size(kvm)?;
    let mut runners = Vec::new();
    for (i, vs) in state.vcpus.iter().enumerate() {
        let index = i as u8;
        let fd = create_vcpu(&vm, index, run_size)?;
        vs.restore(&fd).map_err(|source| BuildError::RestoreVcpu { index, source })?;
        runners.push(VcpuRunner {
            index,
            fd,
            devices: devices.clone(),
            cpuid: vs.cpuid.clone(),
            msr_indices: vs.msrs.iter().map(|m| m.index).collect(),
            events: events_tx.clone(),
            exit: exit.clone(),
            mem: mem.clone(),
            payload_events: vm.payload_events,
            fixups_seen: 0,
            xsave_layout: Default::default(),
            io_pending: false,
        });
    }
    timer.mark("vcpus");
    if let Some(k) = &state.kernel_irqchip {
        k.restore(&vm.fd)?;
    }
    vm.restore_clock(&state.clock)?;
    devices.arm_interrupts().map_err(BuildError::DeviceTimer)?;
    timer.mark("irqchip_clock");
    let parts = VmParts {
        vm,
        memory: mem,
        devices,
        runners,
        events,
        exit,
        guest,
        cpu_template: state.cpu_template,
        device_config,
    };
    let mut vmm = Vmm::start(parts, start_paused)?;
    timer.mark("start_threads");
    vmm.set_restore_phases(&timer);
    Ok(vmm)
}
