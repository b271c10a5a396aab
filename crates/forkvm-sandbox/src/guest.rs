//! The Linux guest every sandbox runs, as the host sees it: the agent's vsock port, the
//! guest's CID, its memory and interrupt controller, the kernel command line and the
//! devices a template boots with. One place, because the template snapshot's key hashes
//! them and every start path (cold boot, disk fork, restore) must agree with it.

use crate::artifacts::Artifacts;
use crate::source::{volume_slot_id, DATA_DISK_ID, ROOT_DISK_ID, VOLUME_SLOTS};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::cold_boot::Machine;
use forkvm_vmm::devices::attach::{BlockConfig, DeviceConfig, LayeredConfig, NetConfig, VsockConfig};
use forkvm_vmm::devices::virtio::blk::LazySource;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::Payload;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// vsock port the agent listens on.
pub const AGENT_PORT: u32 = 1024;
/// The guest CID of every sandbox (each VM has its own vsock device, so they never meet).
pub const GUEST_CID: u64 = 3;
/// How long a cold boot may take to reach the agent (guest kernels are emulated on PVM).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
pub(crate) const IRQCHIP: IrqchipMode = IrqchipMode::Kernel;

/// The machine a template cold-boots as: the artifacts' memory, vCPUs and kernel,
/// [`IRQCHIP`], `cpu`, and [`cmdline`].
pub(crate) fn machine(a: &Artifacts, cpu: CpuTemplate) -> Machine {
    Machine {
        mem_size: u64::from(a.mem_mib) << 20,
        vcpu_count: a.vcpus,
        irqchip: IRQCHIP,
        cpu_template: cpu,
        payload: Payload::Linux { kernel: a.kernel.clone(), initrd: None, cmdline: cmdline(a) },
    }
}

/// Whether templates boot with a network device: wherever this process can give
/// sandboxes a network (`network::available`). Part of the template snapshot's key
/// (through [`cmdline`]).
pub(crate) fn has_network() -> bool {
    crate::network::available()
}

/// The devices a template boots with: the shared root image, read-only, the sandbox's
/// own data disk, layered over the blank base, `lazy` (a vault snapshot restored lazily)
/// and `sealed` (tops in `disk_dir/disk1`), [`VOLUME_SLOTS`] empty volume slots (a
/// restore puts volumes into them), and the tap of `net`.
pub(crate) fn boot_devices(
    a: &Artifacts,
    vsock_uds: &Path,
    disk_dir: &Path,
    sealed: Vec<PathBuf>,
    lazy: Option<LazySource>,
    net: Option<&crate::network::NetSlot>,
) -> DeviceConfig {
    DeviceConfig {
        vsock: Some(VsockConfig { guest_cid: GUEST_CID, uds_path: vsock_uds.to_path_buf() }),
        rng: true,
        blocks: vec![
            BlockConfig { path: a.image.rootfs.clone(), read_only: true, id: ROOT_DISK_ID.into(), layers: None },
            BlockConfig {
                path: a.scratch.clone(),
                read_only: false,
                id: DATA_DISK_ID.into(),
                layers: Some(LayeredConfig {
                    sealed,
                    dir: disk_dir.join("disk1"),
                    lazy: lazy.map(Box::new),
                    replaces: Vec::new(),
                }),
            },
        ]
        .into_iter()
        .chain((0..VOLUME_SLOTS).map(|slot| BlockConfig {
            path: a.empty_slot.clone(),
            read_only: false,
            id: volume_slot_id(slot),
            layers: Some(LayeredConfig {
                sealed: Vec::new(),
                dir: disk_dir.join(format!("disk{}", 2 + slot)),
                lazy: None,
                replaces: Vec::new(),
            }),
        }))
        .collect(),
        net: net.map(|slot| NetConfig { tap: slot.tap_source(), mac: crate::network::GUEST_MAC }),
        rate_limits: Default::default(),
    }
}

pub(crate) fn cmdline(a: &Artifacts) -> String {
    let mut c =
        "console=ttyS0 reboot=k panic=1 quiet root=/dev/vda ro rootfstype=ext4 init=/sbin/forkvm-agent".to_string();
    if let Some(python) = &a.image.python {
        c.push_str(&format!(" FORKVM_AGENT_PYTHON={python}"));
    }
    if has_network() {
        c.push(' ');
        c.push_str(&crate::network::guest_ip_arg());
    }
    c
}
