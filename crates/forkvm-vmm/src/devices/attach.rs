//! Which devices a VM has, where they live, and how they are built — from a
//! [`DeviceConfig`] at boot, or from saved state plus a fresh config at restore.
//!
//! virtio-mmio slots are laid out in a fixed order (vsock, rng, block devices, then the
//! network device), one
//! 4 KiB window each from `VIRTIO_MMIO_START`, interrupt lines from
//! [`FIRST_VIRTIO_IRQ`]. A Linux guest learns about them from the command line
//! ([`DeviceConfig::cmdline`]). A restore must be given the same kinds of devices in
//! the same order; paths (block images, the vsock socket) are the caller's, so a fork
//! can point each child at its own.

use super::irq::{IrqLine, IrqRoute};
use super::virtio::blk::{Block, BlockError, LazySource};
use super::virtio::mmio::{MmioError, MmioTransport, MmioTransportState};
use super::virtio::net::backend::NetRateLimits;
use super::virtio::net::{Net, Tap};
use super::virtio::rng::Rng;
use super::virtio::throttle::RateLimit;
use super::virtio::vsock::Vsock;
use super::virtio::{Interrupt, VirtioDevice, VirtioDeviceState};
use crate::arch::x86_64::layout::{VIRTIO_MMIO_SIZE, VIRTIO_MMIO_START};
use crate::vstate::irqchip::IrqchipMode;
use kvm_ioctls::VmFd;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryMmap;

/// Interrupt line of the first virtio slot (COM1 has 4).
pub const FIRST_VIRTIO_IRQ: u32 = 5;
/// Slots that fit below IRQ 16 (legacy PIC lines; the in-kernel irqchip routes them).
pub const MAX_VIRTIO_SLOTS: usize = 11;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockConfig {
    /// The raw image, or a layered disk's base.
    pub path: PathBuf,
    pub read_only: bool,
    /// Serial the guest sees (`/sys/block/vdX/serial`), at most 20 bytes.
    pub id: String,
    /// Makes the disk layered: `path` is its base. Writable unless `read_only` (then
    /// the guest's writes are refused; its top is never written).
    pub layers: Option<LayeredConfig>,
}

/// A layered disk's lower layers and where this VM keeps the layers it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayeredConfig {
    /// Sealed layer directories over the base, oldest first (shared, never written).
    pub sealed: Vec<PathBuf>,
    /// This VM's own directory for the disk: its writable tops (`top-<n>`) live here,
    /// and stay here once sealed. One VM per directory.
    pub dir: PathBuf,
    /// The disk's lowest layer, restored lazily from a vault snapshot (below `sealed`),
    /// until the first seal settles it into `sealed[0]`.
    pub lazy: Option<Box<LazySource>>,
    /// A restore whose lower layers were rebuilt from a vault snapshot (an archive):
    /// the saved sealed layer ids that `lazy` (or, eager, `sealed`'s first entry) stands
    /// for. The saved state's layer list must start with exactly these; the layers
    /// given after the rebuilt one must match the rest. Empty for every other open.
    pub replaces: Vec<String>,
}

impl LayeredConfig {
    /// The first `top-<n>` of this VM's directory not yet on disk: where its next top
    /// goes (a top is created on its first write, so an unwritten one is never there).
    pub fn free_top(&self) -> PathBuf {
        let free = (0u32..).map(|n| self.dir.join(format!("top-{n}"))).find(|p| std::fs::symlink_metadata(p).is_err());
        free.expect("an unused name exists")
    }
}

impl BlockConfig {
    /// Opens the device: a raw image, or a layered disk with a fresh top at
    /// [`LayeredConfig::free_top`] (made with its directory on the first write: a
    /// restore that never writes its disk creates nothing).
    pub fn open(&self) -> Result<Block, BlockError> {
        let Some(l) = &self.layers else {
            return Block::new(&self.path, self.read_only, &self.id);
        };
        let block = match &l.lazy {
            Some(lazy) => Block::layered_lazy(&self.path, lazy, &l.sealed, &l.free_top(), &self.id),
            None => Block::layered(&self.path, &l.sealed, &l.free_top(), &self.id),
        };
        block.map(|b| b.refusing_writes(self.read_only))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockConfig {
    pub guest_cid: u64,
    /// Host Unix socket: `CONNECT <port>\n` reaches guest port `<port>`; guest connections
    /// to host port P go to `<uds_path>_<P>`.
    pub uds_path: PathBuf,
}

/// The VM's network device (`virtio::net`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    pub tap: TapSource,
    /// The guest's MAC: the same in every clone of a snapshot.
    pub mac: [u8; 6],
}

/// Where the network device's tap comes from.
#[derive(Debug, Clone)]
pub enum TapSource {
    /// Opened by whoever set up the sandbox's network namespace and passed in: how
    /// every jailed VMM gets its tap. Each device built from it uses a duplicate.
    Fd(Arc<OwnedFd>),
    /// Created (or attached to) by name in the VMM's own namespace: for VMMs run by
    /// hand and for tests, never for a jailed VMM (which cannot open `/dev/net/tun`).
    Named(String),
}

impl PartialEq for TapSource {
    fn eq(&self, other: &TapSource) -> bool {
        match (self, other) {
            (TapSource::Fd(a), TapSource::Fd(b)) => a.as_raw_fd() == b.as_raw_fd(),
            (TapSource::Named(a), TapSource::Named(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for TapSource {}

impl TapSource {
    /// The tap, checked (`Tap::from_fd`) or created (`Tap::open_named`).
    pub fn open(&self) -> Result<Tap, String> {
        match self {
            TapSource::Fd(fd) => {
                let dup = fd.try_clone().map_err(|e| format!("duplicating the tap descriptor: {e}"))?;
                Tap::from_fd(dup).map_err(|e| e.to_string())
            }
            TapSource::Named(name) => Tap::open_named(name).map_err(|e| e.to_string()),
        }
    }
}

/// The virtio devices of a VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceConfig {
    pub vsock: Option<VsockConfig>,
    pub rng: bool,
    pub blocks: Vec<BlockConfig>,
    /// A network device, in the slot after the disks.
    pub net: Option<NetConfig>,
    /// Caps on what the devices do for the guest per second (none by default).
    pub rate_limits: RateLimits,
}

/// A VM's device rate limits (`virtio::throttle`): each disk's, the rng's and the
/// network device's, each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RateLimits {
    /// Per disk: every block device gets a bucket of this size of its own.
    pub disk: RateLimit,
    pub rng: RateLimit,
    /// What the guest sends (tx) and receives (rx).
    #[serde(default)]
    pub net_tx: RateLimit,
    #[serde(default)]
    pub net_rx: RateLimit,
}

impl RateLimits {
    fn net(&self) -> NetRateLimits {
        NetRateLimits { tx: self.net_tx, rx: self.net_rx }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("{0} virtio devices requested; a VM has at most {MAX_VIRTIO_SLOTS}")]
    TooMany(usize),
    #[error("creating the {kind} device: {reason}")]
    Create { kind: &'static str, reason: String },
    #[error("the snapshot has virtio devices [{saved}] but the restore was given [{given}]")]
    Mismatch { saved: String, given: String },
    #[error("restoring virtio slot {slot} ({kind}): {source}")]
    RestoreTransport { slot: usize, kind: &'static str, source: MmioError },
}

/// One device to place, in slot order.
#[derive(Debug, Clone)]
enum Planned {
    Vsock(VsockConfig),
    Rng,
    Block(BlockConfig),
    Net(NetConfig),
}

impl Planned {
    fn kind(&self) -> &'static str {
        match self {
            Planned::Vsock(_) => "vsock",
            Planned::Rng => "rng",
            Planned::Block(_) => "block",
            Planned::Net(_) => "net",
        }
    }
}

fn state_kind(s: &VirtioDeviceState) -> &'static str {
    match s {
        VirtioDeviceState::Vsock(_) => "vsock",
        VirtioDeviceState::Rng(_) => "rng",
        VirtioDeviceState::Block(_) => "block",
        VirtioDeviceState::Net(_) => "net",
    }
}

impl DeviceConfig {
    fn planned(&self) -> Vec<Planned> {
        let mut v: Vec<Planned> = self.vsock.iter().cloned().map(Planned::Vsock).collect();
        if self.rng {
            v.push(Planned::Rng);
        }
        v.extend(self.blocks.iter().cloned().map(Planned::Block));
        v.extend(self.net.iter().cloned().map(Planned::Net));
        v
    }

    /// The descriptor of the network device's tap, if it is given as one: what a VMM
    /// process that closes everything else must keep.
    pub fn tap_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.net.as_ref()?.tap {
            TapSource::Fd(fd) => Some(fd.as_raw_fd()),
            TapSource::Named(_) => None,
        }
    }

    /// `virtio_mmio.device=` arguments announcing every slot to a Linux guest.
    pub fn cmdline(&self) -> String {
        (0..self.planned().len())
            .map(|i| format!("virtio_mmio.device=4K@{:#x}:{}", slot_base(i), FIRST_VIRTIO_IRQ + i as u32))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn slot_base(i: usize) -> u64 {
    VIRTIO_MMIO_START + i as u64 * VIRTIO_MMIO_SIZE
}

/// A virtio-mmio device at its window.
#[derive(Debug)]
pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
    pub kind: &'static str,
    pub transport: Mutex<MmioTransport>,
}

/// What slot devices need from the VM.
#[derive(Debug, Clone)]
pub struct SlotWiring<'a> {
    pub vm: &'a Arc<VmFd>,
    pub irqchip: IrqchipMode,
    pub ioapic: Option<&'a Arc<Mutex<super::ioapic::Ioapic>>>,
    pub mem: &'a GuestMemoryMmap,
    pub armed: &'a Arc<AtomicBool>,
}

impl SlotWiring<'_> {
    fn interrupt(&self, irq: u32) -> Arc<dyn Interrupt> {
        let route = match (self.irqchip, self.ioapic) {
            (IrqchipMode::Split, Some(io)) => IrqRoute::Split { ioapic: io.clone(), pin: irq as usize },
            _ => IrqRoute::Kernel { gsi: irq },
        };
        Arc::new(IrqLine::new(self.vm.clone(), route, self.armed.clone()))
    }
}

fn create(p: &Planned, limits: &RateLimits) -> Result<Box<dyn VirtioDevice>, AttachError> {
    let err = |kind, reason: String| AttachError::Create { kind, reason };
    Ok(match p {
        Planned::Vsock(c) => {
            Box::new(Vsock::new(c.guest_cid, c.uds_path.clone()).map_err(|e| err("vsock", e.to_string()))?)
        }
        Planned::Rng => Box::new(Rng::new().with_rate_limit(limits.rng)),
        Planned::Block(c) => Box::new(c.open().map_err(|e| err("block", e.to_string()))?.with_rate_limit(limits.disk)),
        Planned::Net(c) => {
            let tap = c.tap.open().map_err(|e| err("net", e))?;
            Box::new(Net::with_tap(tap, c.mac, limits.net()).map_err(|e| err("net", e.to_string()))?)
        }
    })
}

fn restore_device(
    p: &Planned,
    s: &VirtioDeviceState,
    limits: &RateLimits,
) -> Result<Box<dyn VirtioDevice>, AttachError> {
    let err = |kind, reason: String| AttachError::Create { kind, reason };
    Ok(match (p, s) {
        (Planned::Vsock(c), VirtioDeviceState::Vsock(s)) => {
            Box::new(Vsock::restore(s, c.uds_path.clone()).map_err(|e| err("vsock", e.to_string()))?)
        }
        (Planned::Rng, VirtioDeviceState::Rng(s)) => {
            Box::new(Rng::restore(s).map_err(|e| err("rng", e.to_string()))?.with_rate_limit(limits.rng))
        }
        (Planned::Block(c), VirtioDeviceState::Block(s)) => {
            let replaces = c.layers.as_ref().map_or(&[][..], |l| &l.replaces[..]);
            let block = c.open().and_then(|b| b.with_state_replacing(s, replaces));
            Box::new(block.map_err(|e| err("block", e.to_string()))?.with_rate_limit(limits.disk))
        }
        (Planned::Net(c), VirtioDeviceState::Net(s)) => {
            let tap = c.tap.open().map_err(|e| err("net", e))?;
            Box::new(Net::restore(s, Arc::new(tap), limits.net()).map_err(|e| err("net", e.to_string()))?)
        }
        _ => unreachable!("kinds were matched before"),
    })
}

/// Builds the slots for a fresh VM.
pub fn build_slots(config: &DeviceConfig, w: &SlotWiring<'_>) -> Result<Vec<VirtioSlot>, AttachError> {
    let planned = config.planned();
    if planned.len() > MAX_VIRTIO_SLOTS {
        return Err(AttachError::TooMany(planned.len()));
    }
    planned
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let irq = FIRST_VIRTIO_IRQ + i as u32;
            let transport = MmioTransport::new(create(p, &config.rate_limits)?, w.mem.clone(), w.interrupt(irq));
            Ok(VirtioSlot { base: slot_base(i), irq, kind: p.kind(), transport: Mutex::new(transport) })
        })
        .collect()
}

/// Rebuilds the slots of a restored VM from their saved transports.
pub fn restore_slots(
    config: &DeviceConfig,
    saved: &[MmioTransportState],
    w: &SlotWiring<'_>,
) -> Result<Vec<VirtioSlot>, AttachError> {
    let planned = config.planned();
    let saved_kinds: Vec<&str> = saved.iter().map(|s| state_kind(&s.device)).collect();
    let given_kinds: Vec<&str> = planned.iter().map(Planned::kind).collect();
    if saved_kinds != given_kinds {
        return Err(AttachError::Mismatch { saved: saved_kinds.join(", "), given: given_kinds.join(", ") });
    }
    planned
        .iter()
        .zip(saved)
        .enumerate()
        .map(|(i, (p, s))| {
            let irq = FIRST_VIRTIO_IRQ + i as u32;
            let device = restore_device(p, &s.device, &config.rate_limits)?;
            let transport = MmioTransport::restore(s, device, w.mem.clone(), w.interrupt(irq))
                .map_err(|source| AttachError::RestoreTransport { slot: i, kind: p.kind(), source })?;
            Ok(VirtioSlot { base: slot_base(i), irq, kind: p.kind(), transport: Mutex::new(transport) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_announced_in_order() {
        let c = DeviceConfig {
            vsock: Some(VsockConfig { guest_cid: 3, uds_path: "/tmp/v.sock".into() }),
            rng: true,
            blocks: vec![BlockConfig { path: "/tmp/disk".into(), read_only: true, id: "root".into(), layers: None }],
            net: Some(NetConfig {
                tap: TapSource::Named("tap0".into()),
                mac: crate::devices::virtio::net::DEFAULT_GUEST_MAC,
            }),
            rate_limits: Default::default(),
        };
        assert_eq!(
            c.cmdline(),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 \
             virtio_mmio.device=4K@0xd0002000:7 virtio_mmio.device=4K@0xd0003000:8"
        );
        let kinds: Vec<_> = c.planned().iter().map(Planned::kind).collect();
        assert_eq!(kinds, ["vsock", "rng", "block", "net"]);
        assert_eq!(DeviceConfig::default().cmdline(), "");
    }
}
