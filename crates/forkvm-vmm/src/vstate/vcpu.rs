//! vCPU threads: each runs `KVM_RUN`, dispatches exits to the device bus, and obeys
//! requests (pause, resume, save, stop) from the VMM.
//!
//! A request is sent on the thread's channel and the thread is kicked out of `KVM_RUN`
//! with a signal whose handler sets `kvm_run.immediate_exit`, so a kick that lands just
//! before the thread enters `KVM_RUN` is not lost: the next entry returns at once.

use super::emulation;
use super::exit::ExitLatch;
use super::vcpu_state::{VcpuState, VcpuStateError};
use crate::devices::{BusAction, Devices};
use kvm_bindings::{kvm_cpuid_entry2, kvm_run};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::cell::Cell;
use std::os::unix::thread::JoinHandleExt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;

/// Why a vCPU thread ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuExitReason {
    /// The guest wrote its exit code to the test-exit port.
    GuestExit(u8),
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN).
    Shutdown,
    /// The guest reset the machine on purpose (i8042 reset: Linux's `reboot`).
    Reset,
    /// The VMM told it to stop.
    Stopped,
    /// KVM reported something we cannot continue from.
    Failed(String),
}

/// What a vCPU thread tells the VMM.
#[derive(Debug)]
pub enum VcpuEvent {
    Paused(u8),
    Resumed(u8),
    Exited(u8, VcpuExitReason),
}

/// What the VMM asks of a vCPU thread.
#[derive(Debug)]
pub enum VcpuRequest {
    Pause,
    Resume,
    Save(Sender<Result<VcpuState, VcpuStateError>>),
    Stop,
}

thread_local! {
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN.with(|c| c.get());
    if !run.is_null() {
        // SAFETY: the pointer is this thread's own mapped `kvm_run`, set before the
        // thread first enters KVM_RUN and valid until the thread exits; a volatile byte
        // store is async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        vmm_sys_util::signal::register_signal_handler(kick_signal(), kick_handler)
            .expect("registering the vCPU kick signal handler");
    });
}

/// The VMM's handle on one vCPU thread.
#[derive(Debug)]
pub struct VcpuHandle {
    pub index: u8,
    requests: Sender<VcpuRequest>,
    thread: Option<JoinHandle<()>>,
}

impl VcpuHandle {
    /// Sends a request and kicks the thread out of `KVM_RUN`.
    pub fn send(&self, req: VcpuRequest) {
        if self.requests.send(req).is_ok() {
            if let Some(t) = &self.thread {
                // SAFETY: the pthread is alive (we hold its JoinHandle); the signal's
                // handler only sets a flag.
                unsafe { libc::pthread_kill(t.as_pthread_t(), kick_signal()) };
            }
        }
    }

    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Everything a vCPU thread needs.
#[derive(Debug)]
pub struct VcpuRunner {
    pub index: u8,
    pub fd: VcpuFd,
    pub devices: Arc<Devices>,
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub msr_indices: Vec<u32>,
    pub events: Sender<VcpuEvent>,
    /// Set when this vCPU stops for good (before `Exited` is sent).
    pub exit: Arc<ExitLatch>,
    /// Guest memory, to read instructions the emulator could not complete.
    pub mem: vm_memory::GuestMemoryMmap,
    /// Whether KVM_CAP_EXCEPTION_PAYLOAD is on (changes how exceptions are injected).
    pub payload_events: bool,
    /// Emulation fix-up kinds already reported on the console (bit per `Fixup`).
    pub fixups_seen: u8,
    /// The XSAVE area layout from `cpuid`, made on the first XSAVE/XRSTOR completion
    /// (never on hardware KVM, and not on the restore path).
    pub xsave_layout: std::cell::OnceCell<emulation::xsave::Layout>,
}

impl VcpuRunner {
    /// Starts the thread, paused or running.
    pub fn spawn(self, start_paused: bool) -> std::io::Result<VcpuHandle> {
        install_kick_handler();
        let (tx, rx) = channel();
        let index = self.index;
        let thread = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .stack_size(256 << 10)
            .spawn(move || self.run(rx, start_paused))?;
        Ok(VcpuHandle { index, requests: tx, thread: Some(thread) })
    }

    fn run(mut self, requests: Receiver<VcpuRequest>, mut paused: bool) {
        crate::host::seccomp::enter_thread(crate::host::seccomp::ThreadKind::Vcpu);
        KVM_RUN.with(|c| c.set(self.fd.get_kvm_run() as *mut kvm_run));
        let reason = self.run_loop(&requests, &mut paused);
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
        self.exit.set(reason.clone());
        let _ = self.events.send(VcpuEvent::Exited(self.index, reason));
    }

    /// KVM_EXIT_INTERNAL_ERROR: completes an instruction the emulator could not run
    /// (see `emulation`), or says why the VM must stop.
    fn handle_internal_error(&mut self) -> Result<(), VcpuExitReason> {
        // SAFETY: for KVM_EXIT_INTERNAL_ERROR the kvm_run union holds `internal`.
        let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
        if suberror != kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
            let rip = self.fd.get_regs().map(|r| r.rip).unwrap_or(0);
            return Err(VcpuExitReason::Failed(format!("KVM internal error (suberror {suberror}) at rip {rip:#x}")));
        }
        let layout = self.xsave_layout.get_or_init(|| emulation::xsave::Layout::from_cpuid(&self.cpuid));
        match emulation::complete(&self.fd, &self.mem, layout, self.payload_events) {
            Ok(fixup) => {
                if self.fixups_seen & (1 << fixup as u8) == 0 {
                    self.fixups_seen |= 1 << fixup as u8;
                    self.devices.console_note(&format!(
                        "emulation fix-up: completing `{}` (counted from now on)",
                        fixup.name()
                    ));
                }
                Ok(())
            }
            Err(e) => Err(VcpuExitReason::Failed(e.to_string())),
        }
    }

    /// Handles one request; returns false when the thread must stop.
    fn handle(&mut self, req: VcpuRequest, paused: &mut bool) -> bool {
        match req {
            VcpuRequest::Pause => {
                *paused = true;
                // Tells a guest using kvm-clock that this vCPU was stopped on purpose, so
                // a lockup watchdog (if its kernel has one) does not fire after a long
                // pause. Fails harmlessly when the guest never enabled kvm-clock.
                let _ = self.fd.kvmclock_ctrl();
                let _ = self.events.send(VcpuEvent::Paused(self.index));
            }
            VcpuRequest::Resume => {
                *paused = false;
                let _ = self.events.send(VcpuEvent::Resumed(self.index));
            }
            VcpuRequest::Save(reply) => {
                let _ = reply.send(VcpuState::save(&self.fd, &self.cpuid, &self.msr_indices));
            }
            VcpuRequest::Stop => return false,
        }
        true
    }

    fn run_loop(&mut self, requests: &Receiver<VcpuRequest>, paused: &mut bool) -> VcpuExitReason {
        loop {
            // Pending requests first; while paused, block for the next one.
            loop {
                let req = if *paused { requests.recv().ok() } else { requests.try_recv().ok() };
                match req {
                    Some(r) => {
                        if !self.handle(r, paused) {
                            return VcpuExitReason::Stopped;
                        }
                    }
                    None if *paused => return VcpuExitReason::Stopped, // VMM gone
                    None => break,
                }
            }
            match self.fd.run() {
                Ok(VcpuExit::IoIn(port, data)) => self.devices.pio_read(port, data),
                Ok(VcpuExit::IoOut(port, data)) => match self.devices.pio_write(port, data) {
                    BusAction::Continue => {}
                    BusAction::GuestExit(code) => return VcpuExitReason::GuestExit(code),
                    BusAction::Reset => return VcpuExitReason::Reset,
                },
                Ok(VcpuExit::MmioRead(addr, data)) => self.devices.mmio_read(addr, data),
                Ok(VcpuExit::MmioWrite(addr, data)) => self.devices.mmio_write(addr, data),
                Ok(VcpuExit::Shutdown) => return VcpuExitReason::Shutdown,
                Ok(VcpuExit::Hlt) => *paused = true,
                Ok(VcpuExit::InternalError) => {
                    if let Err(reason) = self.handle_internal_error() {
                        return reason;
                    }
                }
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return VcpuExitReason::Failed(format!("KVM entry failed: reason {reason:#x} on cpu {cpu}"))
                }
                Ok(VcpuExit::Intr) => {}
                Ok(other) => return VcpuExitReason::Failed(format!("unexpected vCPU exit: {other:?}")),
                Err(e) if e.errno() == libc::EINTR => self.fd.set_kvm_immediate_exit(0),
                Err(e) if e.errno() == libc::EAGAIN => {}
                Err(e) => return VcpuExitReason::Failed(format!("KVM_RUN: {e}")),
            }
        }
    }
}
