//! `forkvm doctor`: what this host can and cannot run, checked, not guessed.

use anyhow::Result;
use clap::Args;
use forkvm_vmm::host::{open_kvm, HostKind};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vm::Vm;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also restore a `tiny` sandbox (its template is built and booted first if missing:
    /// minutes) and check in it that the guest kernel preserves every vector register
    /// class user code can use.
    #[arg(long)]
    pub guest: bool,
}

fn check(name: &str, ok: bool, detail: impl Into<String>) -> Value {
    json!({"check": name, "ok": ok, "detail": detail.into()})
}

fn kvm_checks(checks: &mut Vec<Value>) -> bool {
    let kvm = match open_kvm() {
        Ok(k) => k,
        Err(e) => {
            checks.push(check("kvm", false, e.to_string()));
            return false;
        }
    };
    checks.push(check("kvm", true, "/dev/kvm opens, API version 12"));
    let mut ok = emulation_probe(&kvm, checks);
    for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
        let t = Instant::now();
        let r = Vm::create(&kvm, mode);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        ok &= r.is_ok();
        let detail = match r {
            Ok(_) => format!("VM with {mode} irqchip created in {ms:.2} ms"),
            Err(e) => e.to_string(),
        };
        checks.push(check(&format!("vm-{}-irqchip", mode.name()), detail.contains("created"), detail));
    }
    ok
}

/// Boots the `traps` test guest, which runs `fwait` and `int3` in ring 0, and reports
/// how the VMM's emulation-failure handler fared (on hardware KVM nothing needs fixing).
fn emulation_probe(kvm: &kvm_ioctls::Kvm, checks: &mut Vec<Value>) -> bool {
    use forkvm_testguest::{TestGuest, IMAGE_BASE};
    use forkvm_vmm::{BootConfig, Payload};
    let config = BootConfig {
        mem_size: 4 << 20,
        vcpu_count: 1,
        irqchip: IrqchipMode::Split,
        cpu_template: forkvm_vmm::arch::x86_64::cpuid::CpuTemplate::for_this_host(),
        payload: Payload::Flat {
            name: "traps".into(),
            image: TestGuest::Traps.image().to_vec(),
            image_base: IMAGE_BASE,
            args: vec![],
        },
        console: forkvm_vmm::devices::serial::ConsoleOut::default(),
        devices: Default::default(),
        start_paused: false,
    };
    let result = forkvm_vmm::boot(kvm, config).map_err(|e| e.to_string()).and_then(|vmm| {
        match vmm.exit_latch().wait(Some(std::time::Duration::from_secs(10))) {
            Some(forkvm_vmm::vstate::vcpu::VcpuExitReason::GuestExit(forkvm_testguest::EXIT_CODE_FAULT)) => {
                Ok(vmm.status().emulation_fixups)
            }
            other => Err(format!("the probe guest ended with {other:?}, not its #BP report")),
        }
    });
    let ok = result.is_ok();
    let detail = match result {
        Ok(fixups) => {
            let list: Vec<String> = fixups.iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k}×{n}")).collect();
            if list.is_empty() {
                "int3/fwait ran natively: no emulation fix-ups needed".to_string()
            } else {
                format!("the VMM completed what KVM's emulator could not: {}", list.join(", "))
            }
        }
        Err(e) => e,
    };
    checks.push(check("emulation-fixups", ok, detail));
    ok
}

/// How a sandbox's VMM process is confined on this host, read back from a child that
/// confines itself the same way (`host::confinement::probe`).
fn jail_check(checks: &mut Vec<Value>) {
    use forkvm_vmm::host::seccomp::Seccomp;
    let registry = forkvm_sandbox::Registry::open_default();
    let jail = forkvm_sandbox::start::jail::for_vmms(&registry, &Default::default());
    // A sandbox's own uid, where sandboxes get one (the range's last: a probe touches nothing).
    let by_uid = forkvm_sandbox::sandbox_uid::confines_by_uid(&registry);
    let ids = by_uid.then(|| forkvm_vmm::host::ids::SandboxIds::of(forkvm_vmm::host::ids::SANDBOX_ID_RANGE.end - 1));
    let probed = match jail {
        Ok(jail) => forkvm_vmm::host::confinement::probe(Seccomp::Enforce, jail, ids),
        Err(e) => Err(e.to_string()),
    };
    let (ok, detail) = match probed {
        Ok(c) => (
            c.seccomp_on_every_thread() && c.no_new_privs && c.no_capabilities && (!by_uid || c.uid != 0),
            format!(
                "a VMM runs with seccomp {} on {}/{} threads, {}, no_new_privs {}, uid {} ({}), namespaces of its own [{}], root {}",
                if c.seccomp_on_every_thread() { "filters" } else { "OFF" },
                c.seccomp_filtered_threads,
                c.threads,
                if c.no_capabilities { "no capabilities" } else { "CAPABILITIES LEFT" },
                c.no_new_privs,
                c.uid,
                if by_uid { "its sandbox's own" } else { "no uid of its own: not root, or the jail is off" },
                c.own_namespaces.join(", "),
                c.root
            ),
        ),
        Err(e) => (false, format!("confining a VMM process failed: {e}")),
    };
    checks.push(check("vmm-jail", ok, detail));
}

/// Whether sandboxes get a network here: one namespace and tap made and set up, and
/// linked to the uplink (its rules installed), timed.
fn network_check(checks: &mut Vec<Value>) {
    use forkvm_sandbox::network::{uplink, NetSlot};
    let started = std::time::Instant::now();
    let (ok, detail) = match uplink::current().and_then(|u| NetSlot::create_with(u).map(|slot| (u, slot))) {
        Ok((u, slot)) => {
            let way_out = match slot.link() {
                Some(link) => format!(
                    "linked to the uplink, {} ({} at {}; the table inet forkvm there)",
                    u.describe(),
                    link.outer_name(),
                    link.outer_ip()
                ),
                None => format!("no way out: the uplink is {}", u.describe()),
            };
            (
                true,
                format!(
                    "a sandbox network (namespace, tap with virtio headers, its address) made in {:.2} ms, {way_out}",
                    started.elapsed().as_secs_f64() * 1e3
                ),
            )
        }
        Err(e) => (false, format!("sandboxes get no network here (root, /dev/net/tun and nft are needed): {e}")),
    };
    checks.push(check("network", ok, detail));
}

/// Informational checks: a missing one limits features but does not fail the doctor.
fn facility_checks(checks: &mut Vec<Value>) {
    jail_check(checks);
    network_check(checks);
    let cgroup = match forkvm_vmm::host::cgroup::CgroupRoot::detect() {
        Ok(root) => {
            let controllers: Vec<&str> = root.controllers().iter().map(|c| c.name()).collect();
            let version = match root.version() {
                forkvm_vmm::host::cgroup::CgroupVersion::V1 => "v1",
                forkvm_vmm::host::cgroup::CgroupVersion::V2 => "v2",
            };
            (
                true,
                format!(
                    "cgroup {version} with {} under {}: every sandbox gets its group (CPU {} millis, {} tasks by default; memory when asked)",
                    controllers.join(", "),
                    root.dir().display(),
                    forkvm_sandbox::start::DEFAULT_CPU_MILLIS,
                    forkvm_sandbox::start::DEFAULT_PIDS_MAX
                ),
            )
        }
        Err(e) => (false, format!("no usable cgroup: sandboxes run without memory, CPU or tasks limits ({e})")),
    };
    checks.push(check("cgroups", cgroup.0, cgroup.1));
    let tun = Path::new("/dev/net/tun").exists();
    checks.push(check(
        "tun",
        tun,
        if tun { "/dev/net/tun present: tap networking possible" } else { "no /dev/net/tun: no guest networking" },
    ));
    let vhost = Path::new("/dev/vhost-vsock").exists();
    checks.push(check(
        "vhost-vsock",
        true,
        if vhost {
            "/dev/vhost-vsock present (forkvm uses its own userspace vsock anyway)"
        } else {
            "no /dev/vhost-vsock: forkvm's userspace vsock backend is used"
        },
    ));
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let thp_mode = thp.split_whitespace().find(|w| w.starts_with('[')).unwrap_or("[unknown]").to_string();
    checks.push(check(
        "transparent-hugepages",
        !thp_mode.contains("never"),
        format!("THP {thp_mode}: live branch and cold boots use MADV_HUGEPAGE"),
    ));
    let cache = std::env::var_os("FORKVM_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/forkvm")))
        .unwrap_or_else(|| "/var/cache/forkvm".into());
    let kernels = std::fs::read_dir(cache.join("kernel"))
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.path().join("vmlinux").exists()).count())
        .unwrap_or(0);
    checks.push(check(
        "kernel-cache",
        true,
        format!("{kernels} guest kernel(s) built under {}", cache.join("kernel").display()),
    ));
    let count = |sub: &str| {
        std::fs::read_dir(cache.join(sub))
            .map(|d| d.filter_map(|e| e.ok()).filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
            .unwrap_or(0)
    };
    let cached =
        format!("{} image(s), {} template snapshot(s) under {}", count("images"), count("snapshots"), cache.display());
    checks.push(check("image-cache", true, cached));
    let agent = match forkvm_sandbox::artifacts::agent_binary() {
        Ok(path) => (true, format!("the guest agent put into new images is {}", path.display())),
        Err(e) => (false, format!("{e}; cached images still run")),
    };
    checks.push(check("agent", agent.0, agent.1));
    let catalog = forkvm_image::rootfs::Catalog::configured();
    let templates: Vec<String> =
        catalog.entries().into_iter().map(|(name, origin)| format!("{name} ({origin})")).collect();
    checks.push(check(
        "templates",
        true,
        format!(
            "{}; the template directory is {} (${}, a <name>.toml there adds or replaces one)",
            templates.join(", "),
            catalog.dir().display(),
            forkvm_image::rootfs::catalog::TEMPLATES_ENV
        ),
    ));
    let tools = [
        ("busybox-static", "/bin/busybox"),
        ("mmdebstrap", "/usr/bin/mmdebstrap"),
        ("e2fsprogs", "/usr/sbin/mkfs.ext4"),
        ("linux-source-6.1", "/usr/src/linux-source-6.1.tar.xz"),
    ];
    let missing: Vec<&str> = tools.iter().filter(|(_, p)| !Path::new(p).exists()).map(|(n, _)| *n).collect();
    let detail = if missing.is_empty() {
        "kernel and image build tools installed".to_string()
    } else {
        format!("missing, so no new kernels or images (apt-get install {}); cached ones still run", missing.join(" "))
    };
    checks.push(check("image-tools", missing.is_empty(), detail));
}

/// Restores a `tiny` sandbox and runs the vector-state check in it (see
/// `forkvm_sandbox::vector_guard`).
fn guest_vector_check(checks: &mut Vec<Value>) -> bool {
    let result = (|| -> Result<forkvm_proto::vector_check::VectorCheckReport> {
        let artifacts = forkvm_sandbox::Artifacts::ensure("tiny", &mut |_| {})?;
        let template = forkvm_sandbox::ensure_template_snapshot(artifacts)?;
        let sandbox = forkvm_sandbox::Sandbox::start(&template)?;
        Ok(forkvm_sandbox::vector_guard::run(&sandbox.client, 3, 300)?)
    })();
    let (ok, detail) = match result {
        Ok(r) => {
            let failures = r.describe_failures();
            let verdict =
                if failures.is_empty() { "every class held".to_string() } else { format!("WRONG: {failures}") };
            let classes: Vec<&str> = r.classes.iter().map(|c| c.class.as_str()).collect();
            let detail = format!(
                "{} processes x {} switches in a tiny sandbox, level {} (CPUID advertises {}), XCR0 {}, kernel saves {}; {}: {verdict}",
                r.processes,
                r.switches,
                r.level,
                r.advertised,
                r.xcr0,
                r.kernel_xfeatures.as_deref().unwrap_or("?"),
                classes.join(", ")
            );
            (failures.is_empty(), detail)
        }
        Err(e) => (false, format!("{e:#}")),
    };
    checks.push(check("vector-state", ok, detail));
    ok
}

pub fn run(a: DoctorArgs) -> Result<i32> {
    let kind = HostKind::detect();
    let mut checks = Vec::new();
    let mut ok = kvm_checks(&mut checks);
    facility_checks(&mut checks);
    if a.guest && ok {
        ok &= guest_vector_check(&mut checks);
    } else {
        checks.push(check("vector-state", true, "not run: `forkvm doctor --guest` checks it in a tiny sandbox"));
    }
    let host_note = match kind {
        HostKind::Hardware => "hardware virtualization (VMX/SVM): guests run natively; CPU template `host`",
        HostKind::Pvm => "PVM (kvm_pvm, no VMX/SVM): guest user code runs natively, guest kernel code through KVM's emulator (~1000x slower); CPU template `pvm-xsave`, and the VMM completes the instructions the emulator cannot run (counted in each VMM's `status`)",
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"host": kind.name(), "note": host_note, "ok": ok, "checks": checks}))?
        );
    } else {
        println!("host: {} — {host_note}", kind.name());
        for c in &checks {
            let mark = if c["ok"] == true { " ok " } else { "FAIL" };
            println!("  [{mark}] {}: {}", c["check"].as_str().unwrap_or(""), c["detail"].as_str().unwrap_or(""));
        }
    }
    Ok(if ok { 0 } else { 1 })
}
