//! `forkvm doctor`: what this host can and cannot run, checked, not guessed.

use anyhow::Result;
use clap::Args;
use forkvm_vmm::host::{open_kvm, HostKind};
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use forkvm_vmm::vstate::vm::Vm;
use serde_json::json;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DoctorArgs) -> Result<i32> {
    let kind = HostKind::detect();
    let mut checks = Vec::new();
    let mut ok = true;
    match open_kvm() {
        Ok(kvm) => {
            checks.push(json!({"check": "kvm", "ok": true, "detail": "/dev/kvm opens, API version 12"}));
            for mode in [IrqchipMode::Split, IrqchipMode::Kernel] {
                let t = Instant::now();
                let r = Vm::create(&kvm, mode);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                ok &= r.is_ok();
                checks.push(json!({
                    "check": format!("vm-{}-irqchip", mode.name()),
                    "ok": r.is_ok(),
                    "detail": match r { Ok(_) => format!("VM with {mode} irqchip created in {ms:.2} ms"), Err(e) => e.to_string() },
                }));
            }
        }
        Err(e) => {
            ok = false;
            checks.push(json!({"check": "kvm", "ok": false, "detail": e.to_string()}));
        }
    }
    let host_note = match kind {
        HostKind::Hardware => "hardware virtualization (VMX/SVM): guests run natively",
        HostKind::Pvm => "PVM (kvm_pvm, no VMX/SVM): guest user code runs natively, guest kernel code through KVM's emulator (~1000x slower); the pvm-compat CPU template is used",
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"host": kind.name(), "note": host_note, "ok": ok, "checks": checks}))?
        );
    } else {
        println!("host: {} — {host_note}", kind.name());
        for c in &checks {
            println!(
                "  [{}] {}: {}",
                if c["ok"] == true { " ok " } else { "FAIL" },
                c["check"].as_str().unwrap_or(""),
                c["detail"].as_str().unwrap_or("")
            );
        }
    }
    Ok(if ok { 0 } else { 1 })
}
