//! COM1: an 8250 UART (vm-superio) whose output goes to the VM's console.
//!
//! The console is a per-VM log file and, optionally, a stream (a socket the caller
//! reads, e.g. the fork benchmark waiting for a child's answer). Input is queued into the
//! UART's receive FIFO, which raises the COM1 interrupt when the guest enabled it.

use super::console_log::ConsoleLog;
use super::irq::IrqLine;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::net::UnixStream;
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::Serial;

/// I/O ports of COM1.
pub const COM1_BASE: u16 = 0x3f8;
pub const COM1_LEN: u16 = 8;
/// COM1's ISA interrupt line.
pub const COM1_IRQ: u32 = 4;

/// Where the guest's serial output goes. Log output is gathered over one port write
/// (the UART takes a byte at a time; a `rep outsb` brings many) and written when the
/// bus flushes after it, so a flood costs one write per exit, not per byte.
#[derive(Debug, Default)]
pub struct ConsoleOut {
    pub log: Option<ConsoleLog>,
    pub stream: Option<UnixStream>,
    pending: Vec<u8>,
    failed: bool,
}

/// Log bytes gathered before a write even without a flush.
const PENDING_MAX: usize = 64 << 10;

impl ConsoleOut {
    pub fn new(log: Option<ConsoleLog>, stream: Option<UnixStream>) -> ConsoleOut {
        ConsoleOut { log, stream, pending: Vec::new(), failed: false }
    }

    fn note_failure(&mut self, result: std::io::Result<()>) {
        // A console that cannot be written must not stop the guest: note it once.
        if let Err(e) = result {
            if !self.failed {
                tracing::warn!(error = %e, "console output failed; further failures are not logged");
                self.failed = true;
            }
        }
    }

    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let result = match self.log.as_mut() {
            Some(log) => log.append(&self.pending),
            None => Ok(()),
        };
        self.pending.clear();
        self.note_failure(result);
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.log.is_some() {
            self.pending.extend_from_slice(buf);
            if self.pending.len() >= PENDING_MAX {
                self.write_pending();
            }
        }
        if let Some(stream) = self.stream.as_mut() {
            let result = stream.write_all(buf);
            self.note_failure(result);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write_pending();
        Ok(())
    }
}

impl Drop for ConsoleOut {
    fn drop(&mut self) {
        self.write_pending();
    }
}

/// Saved UART registers and receive FIFO.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialDeviceState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

/// The largest receive FIFO a saved state may carry.
const MAX_FIFO: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    #[error("serial state: receive FIFO holds {0} bytes, more than the UART's {MAX_FIFO}")]
    FifoTooLarge(usize),
    #[error("serial: restoring the UART: {0:?}")]
    Restore(vm_superio::serial::Error<std::io::Error>),
    #[error("serial: queueing input: {0:?}")]
    Enqueue(vm_superio::serial::Error<std::io::Error>),
}

pub struct SerialDevice {
    uart: Serial<IrqLine, NoEvents, ConsoleOut>,
}

impl std::fmt::Debug for SerialDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialDevice").field("state", &self.save()).finish()
    }
}

impl SerialDevice {
    pub fn new(irq: IrqLine, out: ConsoleOut) -> SerialDevice {
        SerialDevice { uart: Serial::new(irq, out) }
    }

    pub fn restore(state: &SerialDeviceState, irq: IrqLine, out: ConsoleOut) -> Result<SerialDevice, SerialError> {
        if state.in_buffer.len() > MAX_FIFO {
            return Err(SerialError::FifoTooLarge(state.in_buffer.len()));
        }
        let s = SerialState {
            baud_divisor_low: state.baud_divisor_low,
            baud_divisor_high: state.baud_divisor_high,
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let uart = Serial::from_state(&s, irq, NoEvents, out).map_err(SerialError::Restore)?;
        Ok(SerialDevice { uart })
    }

    pub fn save(&self) -> SerialDeviceState {
        let s = self.uart.state();
        SerialDeviceState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    pub fn read(&mut self, offset: u8) -> u8 {
        self.uart.read(offset)
    }

    pub fn write(&mut self, offset: u8, value: u8) {
        if let Err(e) = self.uart.write(offset, value) {
            tracing::debug!(error = ?e, "serial register write failed");
        }
    }

    /// Queues as much of `input` as the FIFO takes; returns how many bytes it took.
    pub fn enqueue(&mut self, input: &[u8]) -> Result<usize, SerialError> {
        let room = self.uart.fifo_capacity();
        let n = input.len().min(room);
        if n == 0 {
            return Ok(0);
        }
        self.uart.enqueue_raw_bytes(&input[..n]).map_err(SerialError::Enqueue)
    }

    /// Redirects the console (a restored VM gets its own log and stream).
    pub fn console_mut(&mut self) -> &mut ConsoleOut {
        self.uart.writer_mut()
    }
}
