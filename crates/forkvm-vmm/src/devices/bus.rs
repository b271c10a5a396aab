//! Routes vCPU I/O-port and MMIO exits to devices, and holds the devices' saved state.
//!
//! Port map: COM1 at 0x3f8, the test-exit port at 0x501. MMIO map: virtio-mmio slots
//! from 0xd000_0000 (4 KiB each), the IOAPIC window (split irqchip only). Unclaimed reads return all ones and unclaimed writes are
//! dropped, as on a PC bus; a guest cannot stop the VMM by touching a hole.

use super::attach::VirtioSlot;
use super::ioapic::{Ioapic, IoapicState};
use super::serial::{SerialDevice, SerialDeviceState, COM1_BASE, COM1_LEN};
use super::virtio::mmio::MmioTransportState;
use crate::arch::x86_64::layout::{IOAPIC_SIZE, IOAPIC_START, VIRTIO_MMIO_SIZE, VIRTIO_MMIO_START};
use crate::devices::deferred::{Deferral, DeferredWork};
use serde::{Deserialize, Serialize};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Writing a byte here ends the run with that byte as the guest's exit code.
pub const TEST_EXIT_PORT: u16 = 0x501;
/// The i8042 keyboard controller's command port; command 0xFE pulses the CPU reset line,
/// which is how a Linux guest booted with `reboot=k` restarts: the VMM stops the VM.
pub const I8042_COMMAND_PORT: u16 = 0x64;
const I8042_RESET_CPU: u8 = 0xfe;

/// What the vCPU loop must do after a bus access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusAction {
    Continue,
    GuestExit(u8),
    /// The guest reset the machine (i8042 reset): treated as a shutdown.
    Reset,
}

/// Saved state of every device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesState {
    pub serial: SerialDeviceState,
    pub ioapic: Option<IoapicState>,
    /// virtio-mmio transports (with their devices), in slot order.
    pub virtio: Vec<MmioTransportState>,
}

/// The VM's devices, shared by the vCPU threads and the control thread.
#[derive(Debug)]
pub struct Devices {
    pub serial: Arc<Mutex<SerialDevice>>,
    pub ioapic: Option<Arc<Mutex<Ioapic>>>,
    pub virtio: Vec<VirtioSlot>,
    irqs_armed: Arc<AtomicBool>,
    unclaimed: AtomicU64,
    /// The passes devices ask for later (`devices::deferred`), when one may.
    deferred: Option<Arc<DeferredWork>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Devices {
    /// `irqs_armed` is the switch shared by the devices' interrupt lines.
    pub fn new(
        serial: SerialDevice,
        ioapic: Option<Arc<Mutex<Ioapic>>>,
        virtio: Vec<VirtioSlot>,
        irqs_armed: Arc<AtomicBool>,
    ) -> Devices {
        let mut deferred: Option<Arc<DeferredWork>> = None;
        for (i, slot) in virtio.iter().enumerate() {
            let mut t = lock(&slot.transport);
            if t.device().wants_deferral() {
                let work = deferred.get_or_insert_with(Arc::default);
                t.device_mut().set_deferral(Deferral::new(work.clone(), i));
            }
        }
        Devices {
            serial: Arc::new(Mutex::new(serial)),
            ioapic,
            virtio,
            irqs_armed,
            unclaimed: AtomicU64::new(0),
            deferred,
        }
    }

    /// Holds device backends while the vCPUs are paused (nothing may touch guest memory
    /// during a snapshot), or lets them go again.
    pub fn set_paused(&self, paused: bool) {
        for slot in &self.virtio {
            let mut t = lock(&slot.transport);
            if paused {
                t.device_mut().pause();
            } else {
                t.device_mut().resume();
            }
        }
    }

    /// Each rate-limited device's kind and how many times its cap held a request back.
    /// The kinds of the virtio devices, in slot order.
    pub fn kinds(&self) -> Vec<String> {
        self.virtio.iter().map(|s| s.kind.to_string()).collect()
    }

    pub fn throttled(&self) -> Vec<(String, u64)> {
        self.virtio
            .iter()
            .filter_map(|s| lock(&s.transport).device().throttled().map(|n| (s.kind.to_string(), n)))
            .collect()
    }

    /// Releases every device's host resources (the VM is stopping for good).
    pub fn shutdown(&self) {
        if let Some(work) = &self.deferred {
            work.stop();
        }
        for slot in &self.virtio {
            lock(&slot.transport).device_mut().shutdown();
        }
    }

    /// Lets device interrupts through; called once the VM is complete. Starts the
    /// device timer if a device may ask for passes (each asked for one at once when it
    /// got its deferral: a restored queue may hold requests the guest will not notify
    /// again, and their interrupts must come after this).
    pub fn arm_interrupts(self: &Arc<Self>) -> std::io::Result<()> {
        self.irqs_armed.store(true, Ordering::Release);
        // A disk a restore put into an empty slot: the driver learns its capacity now.
        for slot in &self.virtio {
            let mut t = lock(&slot.transport);
            if t.device_mut().take_config_change() {
                t.notify_config_change()?;
            }
        }
        let Some(work) = &self.deferred else { return Ok(()) };
        let devices = Arc::downgrade(self);
        crate::devices::deferred::spawn(work.clone(), move |slot| match devices.upgrade() {
            Some(d) => {
                if let Some(s) = d.virtio.get(slot) {
                    lock(&s.transport).device_mut().run_deferred();
                }
                true
            }
            None => false,
        })?;
        Ok(())
    }

    pub fn save(&self) -> DevicesState {
        DevicesState {
            serial: lock(&self.serial).save(),
            ioapic: self.ioapic.as_ref().map(|i| lock(i).save()),
            virtio: self.virtio.iter().map(|v| lock(&v.transport).save()).collect(),
        }
    }

    fn note_unclaimed(&self, what: &str, addr: u64) {
        // Rate-limited: a guest probing holes must not flood the log.
        let n = self.unclaimed.fetch_add(1, Ordering::Relaxed);
        if n < 16 || n.is_power_of_two() {
            tracing::debug!(addr = format_args!("{addr:#x}"), count = n + 1, "unclaimed {what}");
        }
    }

    pub fn pio_read(&self, port: u16, data: &mut [u8]) {
        if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&port) && data.len() == 1 {
            data[0] = lock(&self.serial).read((port - COM1_BASE) as u8);
        } else if port == I8042_COMMAND_PORT {
            // Status: output buffer empty, input buffer empty — ready for a command.
            data.fill(0);
        } else {
            self.note_unclaimed("port read", port.into());
            data.fill(0xff);
        }
    }

    pub fn pio_write(&self, port: u16, data: &[u8]) -> BusAction {
        if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&port) && data.len() == 1 {
            let mut serial = lock(&self.serial);
            serial.write((port - COM1_BASE) as u8, data[0]);
            let _ = serial.console_mut().flush();
        } else if port == COM1_BASE && data.len() > 1 {
            // `rep outsb` to the transmit register: each byte in turn, one log write.
            let mut serial = lock(&self.serial);
            for b in data {
                serial.write(0, *b);
            }
            let _ = serial.console_mut().flush();
        } else if port == TEST_EXIT_PORT && !data.is_empty() {
            return BusAction::GuestExit(data[0]);
        } else if port == I8042_COMMAND_PORT && data.first() == Some(&I8042_RESET_CPU) {
            return BusAction::Reset;
        } else {
            self.note_unclaimed("port write", port.into());
        }
        BusAction::Continue
    }

    fn ioapic_at(&self, addr: u64) -> Option<&Arc<Mutex<Ioapic>>> {
        self.ioapic.as_ref().filter(|_| (IOAPIC_START..IOAPIC_START + IOAPIC_SIZE).contains(&addr))
    }

    fn virtio_at(&self, addr: u64) -> Option<&VirtioSlot> {
        if !(VIRTIO_MMIO_START..VIRTIO_MMIO_START + VIRTIO_MMIO_SIZE * self.virtio.len() as u64).contains(&addr) {
            return None;
        }
        self.virtio.get(((addr - VIRTIO_MMIO_START) / VIRTIO_MMIO_SIZE) as usize)
    }

    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        if let Some(slot) = self.virtio_at(addr) {
            return lock(&slot.transport).read(addr - slot.base, data);
        }
        match self.ioapic_at(addr) {
            Some(io) => lock(io).mmio_read(addr - IOAPIC_START, data),
            None => {
                self.note_unclaimed("MMIO read", addr);
                data.fill(0xff);
            }
        }
    }

    pub fn mmio_write(&self, addr: u64, data: &[u8]) {
        if let Some(slot) = self.virtio_at(addr) {
            return lock(&slot.transport).write(addr - slot.base, data);
        }
        match self.ioapic_at(addr) {
            Some(io) => lock(io).mmio_write(addr - IOAPIC_START, data),
            None => self.note_unclaimed("MMIO write", addr),
        }
    }

    /// Writes a VMM note on the console (not the guest's output), as `[forkvm] ...`.
    pub fn console_note(&self, note: &str) {
        use std::io::Write;
        let mut serial = lock(&self.serial);
        let _ = writeln!(serial.console_mut(), "\n[forkvm] {note}");
        let _ = serial.console_mut().flush();
    }

    /// Queues serial input, waiting for FIFO room as the guest drains it (up to `timeout`).
    pub fn send_serial_input(&self, mut input: &[u8], timeout: std::time::Duration) -> Result<(), SerialInputError> {
        let deadline = std::time::Instant::now() + timeout;
        while !input.is_empty() {
            let n = lock(&self.serial).enqueue(input)?;
            input = &input[n..];
            if n == 0 {
                if std::time::Instant::now() > deadline {
                    return Err(SerialInputError::Stalled { unsent: input.len() });
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        Ok(())
    }
}

/// Why serial input was not all queued.
#[derive(Debug, thiserror::Error)]
pub enum SerialInputError {
    #[error("serial input: {0}")]
    Fifo(#[from] crate::devices::serial::SerialError),
    #[error("serial input: the guest did not read its FIFO; {unsent} bytes not sent")]
    Stalled { unsent: usize },
}
