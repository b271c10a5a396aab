//! `forkvm image`: guest images. `forkvm image kernel` builds the guest kernel from
//! Debian's `linux-source-6.1` (minutes, once per content hash) or finds it in the cache,
//! and prints its path. Progress goes to stderr: a progress bar on a terminal, a few plain
//! lines otherwise.

use std::path::Path;

use anyhow::Result;
use clap::{Args, Subcommand};
use forkvm_image::kernel::{base_cmdline, ensure_kernel_at, BuildEvent, BuildPlan, Flavour};
use forkvm_image::progress::{fmt_duration, ProgressView};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::host::HostKind;
use serde_json::json;

#[derive(Args, Debug)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Build the guest kernel (or find it in the cache) and print the path of its vmlinux.
    ///
    /// Needs: apt-get install linux-source-6.1 build-essential bc flex bison libelf-dev.
    /// Cache: $FORKVM_CACHE or ~/.cache/forkvm.
    Kernel(KernelArgs),
    /// Build a template's root filesystem image (and the kernel, if missing) and print it.
    ///
    /// TEMPLATE is a template name: built in (tiny, python) or a <name>.toml in the
    /// template directory (`forkvm doctor` shows it); never a path. Needs the
    /// static agent (crates/forkvm-agent/build-static.sh), busybox-static or mmdebstrap.
    Build(BuildArgs),
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// Template name (`forkvm doctor` lists them).
    pub template: String,
    /// Also boot it once into its template snapshot (what `forkvm run` restores).
    #[arg(long)]
    pub snapshot: bool,
    /// The machine's vCPUs (more than one: the SMP kernel); default: the template's
    /// `vcpus`, else 1.
    #[arg(long)]
    pub vcpus: Option<u8>,
}

#[derive(Args, Debug)]
pub struct KernelArgs {
    /// The kernel for guests with several vCPUs (SMP on) instead of the one-vCPU kernel.
    #[arg(long)]
    pub smp: bool,
    /// Print one JSON object on stdout (path, key, cached, build_seconds, size_bytes, cmdline).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: ImageArgs) -> Result<i32> {
    match a.command {
        ImageCommand::Kernel(k) => kernel(k),
        ImageCommand::Build(b) => build(b),
    }
}

fn build(a: BuildArgs) -> Result<i32> {
    let started = std::time::Instant::now();
    let mut view = ProgressView::new();
    let artifacts = forkvm_sandbox::Artifacts::ensure(&a.template, &mut |e| view.show(&e))
        .and_then(|art| art.with_vcpus(a.vcpus, &mut |e| view.show(&e)));
    view.finish();
    let artifacts = artifacts?;
    let mut out = json!({
        "template": artifacts.image.name,
        "image": artifacts.image.rootfs,
        "image_key": artifacts.image.key,
        "image_bytes": artifacts.image.size_bytes,
        "kernel": artifacts.kernel,
        "vcpus": artifacts.vcpus,
        "memory_mib": artifacts.mem_mib,
    });
    if a.snapshot {
        let t = forkvm_sandbox::ensure_template_snapshot(artifacts)?;
        out["snapshot"] = json!(t.dir);
        out["boot_seconds"] = json!(t.boot_seconds);
    }
    out["seconds"] = json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn kernel(a: KernelArgs) -> Result<i32> {
    let flavour = if a.smp { Flavour::Smp } else { Flavour::Up };
    let plan = BuildPlan::flavour(flavour)?;
    let key = plan.key();
    let mut view = ProgressView::new();
    let mut built_seconds = None;
    let result = ensure_kernel_at(&plan, &mut |e| {
        if let BuildEvent::Done { seconds, .. } = e {
            built_seconds = Some(seconds);
        }
        view.show(&e);
    });
    view.finish();
    let path = match result {
        Ok(path) => path,
        Err(e) => {
            if let Some(log) = e.log_path() {
                print_log_tail(log, 20);
            }
            return Err(e.into());
        }
    };
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let host = HostKind::detect();
    let cmdline = format!("{} {}", base_cmdline(), CpuTemplate::for_this_host().linux_cmdline()).trim().to_string();
    if a.json {
        let out = json!({
            "path": path,
            "key": key,
            "flavour": flavour.name(),
            "cached": built_seconds.is_none(),
            "build_seconds": built_seconds,
            "size_bytes": size,
            "host": host.name(),
            "cmdline": cmdline,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{}", path.display());
        match built_seconds {
            Some(s) => eprintln!("built in {} ({:.1} MiB, key {key})", fmt_duration(s), size as f64 / 1048576.0),
            None => eprintln!("cached ({:.1} MiB, key {key})", size as f64 / 1048576.0),
        }
        eprintln!("kernel command line for this host ({}): {cmdline}", host.name());
    }
    Ok(0)
}

fn print_log_tail(log: &Path, lines: usize) {
    let Ok(text) = std::fs::read_to_string(log) else { return };
    let all: Vec<&str> = text.lines().collect();
    eprintln!("--- last {} lines of {} ---", lines.min(all.len()), log.display());
    for l in &all[all.len().saturating_sub(lines)..] {
        eprintln!("{l}");
    }
    eprintln!("---");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        image: ImageCommand,
    }

    #[test]
    fn parses_kernel_subcommand() {
        let c = Cli::try_parse_from(["x", "kernel", "--json"]).unwrap();
        assert!(matches!(c.image, ImageCommand::Kernel(KernelArgs { json: true, smp: false })));
        let c = Cli::try_parse_from(["x", "kernel", "--smp"]).unwrap();
        assert!(matches!(c.image, ImageCommand::Kernel(KernelArgs { json: false, smp: true })));
        let c = Cli::try_parse_from(["x", "build", "tiny", "--snapshot"]).unwrap();
        assert!(matches!(c.image, ImageCommand::Build(BuildArgs { snapshot: true, vcpus: None, .. })));
        let c = Cli::try_parse_from(["x", "build", "tiny", "--snapshot", "--vcpus", "2"]).unwrap();
        assert!(matches!(c.image, ImageCommand::Build(BuildArgs { vcpus: Some(2), .. })));
        assert!(Cli::try_parse_from(["x", "rootfs"]).is_err());
    }
}
