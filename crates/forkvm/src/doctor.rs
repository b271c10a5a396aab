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
    let mut ok = true;
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

/// Informational checks: a missing one limits features but does not fail the doctor.
fn facility_checks(checks: &mut Vec<Value>) {
    let cgroup = if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        (true, "cgroup v1 memory controller at /sys/fs/cgroup/memory: per-sandbox memory limits available".to_string())
    } else if std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
    {
        (true, "cgroup v2 with the memory controller: per-sandbox memory limits available".to_string())
    } else {
        (false, "no cgroup memory controller found: sandboxes run without memory limits".to_string())
    };
    checks.push(check("cgroup-memory", cgroup.0, cgroup.1));
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
}

pub fn run(a: DoctorArgs) -> Result<i32> {
    let kind = HostKind::detect();
    let mut checks = Vec::new();
    let ok = kvm_checks(&mut checks);
    facility_checks(&mut checks);
    let host_note = match kind {
        HostKind::Hardware => "hardware virtualization (VMX/SVM): guests run natively; CPU template `host`",
        HostKind::Pvm => "PVM (kvm_pvm, no VMX/SVM): guest user code runs natively, guest kernel code through KVM's emulator (~1000x slower); CPU template `pvm-compat`, and the VMM completes the instructions the emulator cannot run (counted in each VMM's `status`)",
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
