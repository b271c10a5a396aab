//! Helpers shared by the KVM tests: boot a test guest, read its console.

#![allow(dead_code)]

pub mod children;
pub mod driver;

use forkvm_testguest::{TestGuest, IMAGE_BASE};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::open_kvm;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::{boot, BootConfig, Payload, Vmm};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub fn kvm() -> kvm_ioctls::Kvm {
    open_kvm().expect("these tests need /dev/kvm")
}

/// A console stream: the VMM writes the guest's serial output to one end, a thread of
/// the test drains the other as it comes. Drained at once, not when the test gets to
/// it: the vCPU writes one byte per `outb`, each costs the socket a whole buffer, and a
/// vCPU blocked on a full socket holds the UART, so a test thread queueing input (which
/// takes the UART) while nothing reads would wait on it forever.
pub struct Console {
    chunks: std::sync::mpsc::Receiver<Vec<u8>>,
    pub seen: Vec<u8>,
}

impl Console {
    pub fn pair() -> (Console, ConsoleOut) {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (tx, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends when the VMM's end closes (or the test dropped its console).
            while let Ok(n @ 1..) = a.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        (Console { chunks, seen: Vec::new() }, ConsoleOut::new(None, Some(b)))
    }

    /// Reads until the output contains `needle`, or panics after `timeout`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        use std::sync::mpsc::RecvTimeoutError;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = find(&self.seen, needle.as_bytes()) {
                let text = String::from_utf8_lossy(&self.seen[..pos + needle.len()]).into_owned();
                self.seen.drain(..pos + needle.len());
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {needle:?}; console so far: {:?}",
                String::from_utf8_lossy(&self.seen)
            );
            match self.chunks.recv_timeout(Duration::from_millis(50)) {
                Ok(chunk) => self.seen.extend_from_slice(&chunk),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("console closed; so far: {:?}", String::from_utf8_lossy(&self.seen))
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// The next line (without the newline).
    pub fn line(&mut self, timeout: Duration) -> String {
        let text = self.wait_for("\n", timeout);
        text.trim_end_matches('\n').to_string()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn template() -> CpuTemplate {
    CpuTemplate::for_this_host()
}

pub fn boot_guest(guest: TestGuest, args: &[u64], mem_mib: u64, irqchip: IrqchipMode) -> (Vmm, Console) {
    boot_guest_on(guest, args, mem_mib, irqchip, 1)
}

/// [`boot_guest`] on `vcpus` vCPUs.
pub fn boot_guest_on(guest: TestGuest, args: &[u64], mem_mib: u64, irqchip: IrqchipMode, vcpus: u8) -> (Vmm, Console) {
    let (console, out) = Console::pair();
    let vmm = boot(
        &kvm(),
        BootConfig {
            mem_size: mem_mib << 20,
            vcpu_count: vcpus,
            irqchip,
            cpu_template: template(),
            payload: Payload::Flat {
                name: guest.name().into(),
                image: guest.image().to_vec(),
                image_base: IMAGE_BASE,
                args: args.to_vec(),
            },
            console: out,
            devices: Default::default(),
            start_paused: false,
        },
    )
    .expect("boot");
    (vmm, console)
}

pub const T: Duration = Duration::from_secs(10);
