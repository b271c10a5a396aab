//! vCPU threads: each runs `KVM_RUN`, dispatches exits to the device bus, and obeys
//! requests (pause, resume, save, stop) from the VMM.
//!
//! A request is sent on the thread's channel and the thread is kicked out of `KVM_RUN`
//! with a signal whose handler sets `kvm_run.immediate_exit`, so a kick that lands just
//! before the thread enters `KVM_RUN` is not lost: the next entry returns at once.
//!
//! KVM finishes an I/O-port or MMIO access only on the next `KVM_RUN` (it writes the
//! value read into the register and moves RIP past the instruction then). A vCPU that
//! stopped right after such an exit holds a half-done instruction, which a snapshot
//! would run a second time in every copy: a second byte read from COM1's data register
//! (one byte of input lost), a second byte written. So before it pauses or saves, a vCPU
//! with an access outstanding enters `KVM_RUN` once more with `immediate_exit` set: KVM
//! completes the access and returns `EINTR` without running guest code.

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
    /// The last exit was an I/O or MMIO access that KVM completes on the next entry.
    pub io_pending: bool,
}

/// What one `KVM_RUN` return asks of the thread.
enum Step {
    /// Enter the guest again.
    Run,
    /// An I/O or MMIO access was served; KVM completes it on the next entry.
    Io,
    /// An instruction the emulator could not run (`handle_internal_error`).
    Emulate,
    /// The vCPU stops for good.
    Exit(VcpuExitReason),
}

/// Serves one `KVM_RUN` return.
fn step(devices: &Devices, run: Result<VcpuExit<'_>, kvm_ioctls::Error>) -> Step {
    match run {
        Ok(VcpuExit::IoIn(port, data)) => {
            devices.pio_read(port, data);
            Step::Io
        }
        Ok(VcpuExit::IoOut(port, data)) => match devices.pio_write(port, data) {
            BusAction::Continue => Step::Io,
            BusAction::GuestExit(code) => Step::Exit(VcpuExitReason::GuestExit(code)),
            BusAction::Reset => Step::Exit(VcpuExitReason::Reset),
        },
        Ok(VcpuExit::MmioRead(addr, data)) => {
            devices.mmio_read(addr, data);
            Step::Io
        }
        Ok(VcpuExit::MmioWrite(addr, data)) => {
            devices.mmio_write(addr, data);
            Step::Io
        }
        Ok(VcpuExit::Shutdown) => Step::Exit(VcpuExitReason::Shutdown),
        // With the LAPIC in the kernel (both irqchip modes) KVM handles HLT itself.
        Ok(VcpuExit::Hlt) => Step::Exit(VcpuExitReason::Failed("unexpected HLT exit (no in-kernel LAPIC?)".into())),
        Ok(VcpuExit::InternalError) => Step::Emulate,
        Ok(VcpuExit::FailEntry(reason, cpu)) => {
            Step::Exit(VcpuExitReason::Failed(format!("KVM entry failed: reason {reason:#x} on cpu {cpu}")))
        }
        Ok(VcpuExit::Intr) => Step::Run,
        Ok(other) => Step::Exit(VcpuExitReason::Failed(format!("unexpected vCPU exit: {other:?}"))),
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Run,
        Err(e) => Step::Exit(VcpuExitReason::Failed(format!("KVM_RUN: {e}"))),
    }
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

    /// Handles one request; `Err` when the thread must stop.
    fn handle(&mut self, req: VcpuRequest, paused: &mut bool) -> Result<(), VcpuExitReason> {
        match req {
            VcpuRequest::Pause => {
                self.settle_io()?;
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
                let settled = self.settle_io();
                let state = VcpuState::save(&self.fd, &self.cpuid, &self.msr_indices);
                let _ = reply.send(state);
                settled?;
            }
            VcpuRequest::Stop => return Err(VcpuExitReason::Stopped),
        }
        Ok(())
    }

    /// Completes an outstanding I/O or MMIO access without running guest code (see the
    /// module doc). A string instruction may need several rounds, one per chunk.
    fn settle_io(&mut self) -> Result<(), VcpuExitReason> {
        while self.io_pending {
            self.fd.set_kvm_immediate_exit(1);
            let step = step(&self.devices, self.fd.run());
            self.fd.set_kvm_immediate_exit(0);
            self.io_pending = false;
            match step {
                Step::Run => {}
                Step::Io => self.io_pending = true,
                Step::Emulate => self.handle_internal_error()?,
                Step::Exit(reason) => return Err(reason),
            }
        }
        Ok(())
    }

    fn run_loop(&mut self, requests: &Receiver<VcpuRequest>, paused: &mut bool) -> VcpuExitReason {
        loop {
            // Pending requests first; while paused, block for the next one.
            loop {
                let req = if *paused { requests.recv().ok() } else { requests.try_recv().ok() };
                match req {
                    Some(r) => {
                        if let Err(reason) = self.handle(r, paused) {
                            return reason;
                        }
                    }
                    None if *paused => return VcpuExitReason::Stopped, // VMM gone
                    None => break,
                }
            }
            let step = step(&self.devices, self.fd.run());
            self.io_pending = matches!(step, Step::Io);
            match step {
                Step::Run | Step::Io => {}
                Step::Emulate => {
                    if let Err(reason) = self.handle_internal_error() {
                        return reason;
                    }
                }
                Step::Exit(reason) => return reason,
            }
            // A kick sets `immediate_exit`; it was seen (this return), so clear it. A
            // kick that lands after this line leaves its request in the channel, which
            // is read before the next entry.
            self.fd.set_kvm_immediate_exit(0);
        }
    }
}
