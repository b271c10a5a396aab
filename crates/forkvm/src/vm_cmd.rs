//! `forkvm boot`, `forkvm restore` and `forkvm ctl`: one VM in this process, and the
//! client side of its control socket.

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_testguest::{TestGuest, IMAGE_BASE};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::control::{serve_until_exit, ControlClient, Request};
use forkvm_vmm::devices::attach::{BlockConfig, DeviceConfig, VsockConfig};
use forkvm_vmm::devices::console_log::ConsoleLog;
use forkvm_vmm::devices::serial::ConsoleOut;
use forkvm_vmm::host::open_kvm;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vcpu::VcpuExitReason;
use forkvm_vmm::{BootConfig, Payload, Vmm};
use std::fs::File;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// Control socket to serve (status, pause, resume, snapshot, shutdown).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Append the guest's serial output to this file instead of standard output.
    #[arg(long)]
    pub console: Option<PathBuf>,
    /// Feed standard input to the guest's serial port.
    #[arg(long)]
    pub stdin: bool,
    #[command(flatten)]
    pub devices: DeviceArgs,
}

/// virtio devices; a restore must name the same kinds as its snapshot, in the same order.
#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// virtio-vsock with this host Unix socket (`CONNECT <port>` reaches the guest).
    #[arg(long)]
    pub vsock: Option<PathBuf>,
    /// Guest CID for the vsock device.
    #[arg(long, default_value_t = 3)]
    pub cid: u64,
    /// virtio-rng.
    #[arg(long)]
    pub rng: bool,
    /// virtio-blk disk: PATH, or PATH:ro for read-only; repeat for more (vda, vdb, ...).
    #[arg(long = "disk")]
    pub disks: Vec<String>,
}

impl DeviceArgs {
    pub fn config(&self) -> Result<DeviceConfig> {
        let blocks = self
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (path, read_only) = match d.strip_suffix(":ro") {
                    Some(p) => (p, true),
                    None => (d.as_str(), false),
                };
                if path.is_empty() {
                    bail!("--disk needs a path, got {d:?}");
                }
                Ok(BlockConfig { path: path.into(), read_only, id: format!("forkvm-disk{i}"), layers: None })
            })
            .collect::<Result<Vec<_>>>()?;
        let vsock = self.vsock.clone().map(|uds_path| VsockConfig { guest_cid: self.cid, uds_path });
        Ok(DeviceConfig { vsock, rng: self.rng, blocks, net: None, rate_limits: Default::default() })
    }
}

#[derive(Args, Debug)]
pub struct BootArgs {
    /// Test guest to run: hello, count, echo, monitor.
    #[arg(long, conflicts_with = "kernel")]
    pub guest: Option<TestGuest>,
    /// Test-guest argument (u64, decimal or 0x-hex); repeat for more.
    #[arg(long = "arg", value_parser = parse_u64)]
    pub args: Vec<u64>,
    /// Linux kernel (ELF vmlinux or bzImage).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    #[arg(long, requires = "kernel")]
    pub initrd: Option<PathBuf>,
    #[arg(long, default_value = "console=ttyS0 reboot=k panic=1", requires = "kernel")]
    pub cmdline: String,
    #[arg(long, default_value_t = 64)]
    pub mem_mib: u64,
    #[arg(long, default_value_t = 1)]
    pub vcpus: u8,
    /// kernel (KVM's PIC/IOAPIC/PIT) or split (LAPIC in KVM, IOAPIC in the VMM).
    #[arg(long, default_value = "split")]
    pub irqchip: IrqchipMode,
    /// host, pvm-xsave or pvm-compat (legacy, noxsave); default: chosen by host kind.
    #[arg(long)]
    pub cpu_template: Option<CpuTemplate>,
    #[command(flatten)]
    pub console: ConsoleArgs,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Snapshot directory.
    #[arg(long)]
    pub snapshot: PathBuf,
    /// Restore with the vCPUs paused (resume through the control socket).
    #[arg(long)]
    pub paused: bool,
    #[command(flatten)]
    pub console: ConsoleArgs,
}

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The VMM's control socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// status | pause | resume | shutdown | snapshot DIR | send HEX | send-text TEXT
    #[arg(required = true, num_args = 1..=2)]
    pub request: Vec<String>,
}

pub fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a u64: {e}"))
}

fn open_console(args: &ConsoleArgs) -> Result<ConsoleOut> {
    let log = match &args.console {
        Some(path) => ConsoleLog::open(path).with_context(|| format!("opening the console log {}", path.display()))?,
        None => {
            // Standard output, as a File the console can write unbuffered.
            let fd = std::io::stdout().lock();
            let dup = std::os::fd::AsFd::as_fd(&fd).try_clone_to_owned().context("duplicating stdout")?;
            ConsoleLog::unbounded(File::from(dup))
        }
    };
    Ok(ConsoleOut::new(Some(log), None))
}

fn run_vmm(vmm: Vmm, args: &ConsoleArgs) -> Result<i32> {
    if args.stdin {
        forward_stdin(&vmm);
    }
    let reason = serve_until_exit(vmm, args.socket.as_deref()).context("serving the control socket")?;
    match reason {
        VcpuExitReason::GuestExit(code) => Ok(i32::from(code)),
        VcpuExitReason::Stopped | VcpuExitReason::Reset => Ok(0),
        VcpuExitReason::Shutdown => bail!("the guest triple-faulted (KVM_EXIT_SHUTDOWN)"),
        VcpuExitReason::Failed(why) => bail!("the VM failed: {why}"),
    }
}

fn forward_stdin(vmm: &Vmm) {
    use std::io::Read;
    let devices = vmm.devices().clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || devices.send_serial_input(&buf[..n], std::time::Duration::from_secs(60)).is_err() {
                break;
            }
        }
    });
}

pub fn boot(a: BootArgs) -> Result<i32> {
    let payload = match (&a.guest, &a.kernel) {
        (Some(g), None) => Payload::Flat {
            name: g.name().into(),
            image: g.image().to_vec(),
            image_base: IMAGE_BASE,
            args: a.args.clone(),
        },
        (None, Some(k)) => Payload::Linux { kernel: k.clone(), initrd: a.initrd.clone(), cmdline: a.cmdline.clone() },
        _ => bail!("say what to boot: --guest NAME (hello, count, echo, monitor) or --kernel PATH"),
    };
    let kvm = open_kvm()?;
    let config = BootConfig {
        mem_size: a.mem_mib << 20,
        vcpu_count: a.vcpus,
        irqchip: a.irqchip,
        cpu_template: a.cpu_template.unwrap_or_else(CpuTemplate::for_this_host),
        payload,
        console: open_console(&a.console)?,
        devices: a.console.devices.config()?,
        start_paused: false,
    };
    let vmm = forkvm_vmm::boot(&kvm, config).context("booting the VM")?;
    run_vmm(vmm, &a.console)
}

pub fn restore(a: RestoreArgs) -> Result<i32> {
    let kvm = open_kvm()?;
    let snapshot = forkvm_vmm::prepare(&a.snapshot).context("reading the snapshot")?;
    let vmm = forkvm_vmm::restore(&kvm, &snapshot, open_console(&a.console)?, &a.console.devices.config()?, a.paused)
        .context("restoring the VM")?;
    run_vmm(vmm, &a.console)
}

fn ctl_request(words: &[String]) -> Result<Request> {
    let arg = || words.get(1).cloned().with_context(|| format!("`{}` needs an argument", words[0]));
    Ok(match words[0].as_str() {
        "status" => Request::Status {},
        "pause" => Request::Pause {},
        "resume" => Request::Resume {},
        "shutdown" => Request::Shutdown {},
        "snapshot" => Request::Snapshot { dir: absolute(Path::new(&arg()?))? },
        "send" => Request::SendInput { hex: arg()? },
        "send-text" => Request::SendInput { hex: forkvm_vmm::control::protocol::hex_encode(arg()?.as_bytes()) },
        other => bail!("unknown control request {other:?}: status, pause, resume, shutdown, snapshot DIR, send HEX, send-text TEXT"),
    })
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

pub fn ctl(a: CtlArgs) -> Result<i32> {
    let req = ctl_request(&a.request)?;
    let mut client = ControlClient::connect(&a.socket)?;
    let result = client.call(&req)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(0)
}
