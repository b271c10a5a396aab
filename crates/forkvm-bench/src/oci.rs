//! `forkvm bench oci`: what making a template from an OCI image costs (host side: the
//! import, the confined unpack, mkfs), as one JSON object.
//!
//! * `busybox`: the same tree (busybox and its applets) built by the busybox builder and
//!   from a two-layer OCI image (import of a `docker save` archive, then build); medians
//!   over `--runs` in milliseconds, and their ratio;
//! * `payload`: an image whose base layer carries `--payload-mib` MiB of files: import
//!   and build seconds, unpack throughput;
//! * `sharing`: a second image on the same base layer: the bytes its import added to the
//!   blob store against those it found there (the base is stored once).
//! * `debian` (with `--debian`): a Debian minbase template built by mmdebstrap (the path
//!   an OCI image replaces; needs a Debian mirror), and the same tree, dumped out of that
//!   image and packed as a one-layer image, imported and built.
//!
//! Everything runs in a scratch directory (its own template directory, blob store and
//! image cache), removed afterwards. The image writer is `forkvm_image::oci::writer`.

use crate::util::{in_scratch_dir, machine, median, r2, Rng};
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_image::oci::writer::{ImageSpec, LayerBuilder};
use forkvm_image::oci::{import, BlobStore};
use forkvm_image::rootfs::{ensure_image, Template};
use serde_json::json;
use std::path::Path;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchOciArgs {
    /// Builds of each kind (each a new image key).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// MiB of files in the payload image's base layer.
    #[arg(long, default_value_t = 256)]
    pub payload_mib: usize,
    /// Also build a Debian minbase template with mmdebstrap once (needs a mirror).
    #[arg(long)]
    pub debian: bool,
}

pub fn run(a: BenchOciArgs) -> Result<i32> {
    if a.runs == 0 || a.runs > 20 || a.payload_mib > 4096 {
        bail!("--runs is 1..=20 and --payload-mib at most 4096");
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("image builds unpack layers in a user namespace on an id range: run as root");
    }
    let agent = forkvm_sandbox::artifacts::agent_binary()?;
    let report = in_scratch_dir(None, "oci", |dir| measure(dir, &agent, &a))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

fn measure(dir: &Path, agent: &Path, a: &BenchOciArgs) -> Result<serde_json::Value> {
    let templates = dir.join("templates");
    let cache = dir.join("cache");
    // The build finds the blob store through the template directory.
    std::env::set_var(forkvm_image::rootfs::catalog::TEMPLATES_ENV, &templates);
    let store = forkvm_image::oci::configured_store();
    let base = busybox_layer(0, &mut Rng(1))?;
    let (mut builder, mut imports, mut builds) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..a.runs {
        let text = format!("# bench run {run}\nname = \"bench-busybox\"\nbase = \"busybox\"\n");
        let started = Instant::now();
        ensure_image(&Template::parse(&text)?, &text, agent, &cache)?;
        builder.push(started.elapsed().as_secs_f64());

        let top = LayerBuilder::new().file("etc/bench-run", run.to_string().as_bytes(), 0o644, 0)?.finish()?;
        let archive = dir.join(format!("busybox-{run}.tar"));
        ImageSpec { layers: vec![base.clone(), top], config: json!({"Env": ["PATH=/bin"]}) }
            .write_docker_save(&archive, "bench:latest")?;
        let (import_s, build_s, _) = import_and_build(&archive, &store, agent, &cache, "bench-oci")?;
        imports.push(import_s);
        builds.push(build_s);
    }
    let (builder_s, import_s, build_s) = (median(&mut builder), median(&mut imports), median(&mut builds));

    let payload = busybox_layer(a.payload_mib, &mut Rng(7))?;
    let archive = dir.join("payload.tar");
    ImageSpec { layers: vec![payload.clone()], config: json!({}) }.write_docker_save(&archive, "payload:latest")?;
    let (p_import, p_build, _) = import_and_build(&archive, &store, agent, &cache, "bench-payload")?;

    let second = LayerBuilder::new().file("etc/second", b"a second image on the same base", 0o644, 0)?.finish()?;
    let layout = dir.join("second");
    ImageSpec { layers: vec![payload.clone(), second], config: json!({}) }.write_layout_dir(&layout)?;
    let shared = import(&layout, &store)?;

    let mut report = json!({
        "bench": "oci",
        "machine": machine(),
        "runs": a.runs,
        "busybox": {
            "builder_ms": r2(builder_s * 1e3),
            "oci_import_ms": r2(import_s * 1e3),
            "oci_build_ms": r2(build_s * 1e3),
            "oci_total_ms": r2((import_s + build_s) * 1e3),
            "oci_vs_builder": r2((import_s + build_s) / builder_s),
        },
        "payload": {
            "mib": a.payload_mib,
            "layer_bytes": payload.len(),
            "import_s": r2(p_import),
            "build_s": r2(p_build),
            "build_mib_per_s": r2(a.payload_mib as f64 / p_build),
        },
        "sharing": {
            "base_layer_bytes": payload.len(),
            "second_image_new_bytes": shared.new_bytes,
            "second_image_shared_bytes": shared.shared_bytes,
        },
    });
    if a.debian {
        report["debian"] = debian(dir, &store, agent, &cache)?;
    }
    Ok(report)
}

/// The same Debian tree two ways: built by mmdebstrap, then (dumped out of that image
/// with debugfs and packed as one gzip layer) imported and built as an OCI image.
fn debian(dir: &Path, store: &BlobStore, agent: &Path, cache: &Path) -> Result<serde_json::Value> {
    let text = format!("# bench {}\nname = \"bench-debian\"\nbase = \"debian:bookworm\"\n", std::process::id());
    let started = Instant::now();
    let built = ensure_image(&Template::parse(&text)?, &text, agent, cache).context("building the Debian template")?;
    let mmdebstrap_s = started.elapsed().as_secs_f64();
    let tree = dir.join("debian-tree");
    std::fs::create_dir_all(&tree)?;
    let dump = std::process::Command::new("debugfs")
        .arg("-R")
        .arg(format!("rdump / {}", tree.display()))
        .arg(&built.rootfs)
        .output()
        .context("running debugfs (e2fsprogs)")?;
    if !dump.status.success() {
        bail!("debugfs rdump failed: {}", String::from_utf8_lossy(&dump.stderr));
    }
    let mut layer = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    layer.follow_symlinks(false);
    layer.append_dir_all(".", &tree)?;
    let layer = layer.into_inner()?.finish()?;
    let archive = dir.join("debian.tar");
    ImageSpec { layers: vec![layer.clone()], config: json!({}) }.write_docker_save(&archive, "debian:bench")?;
    let (import_s, build_s, _) = import_and_build(&archive, store, agent, cache, "bench-debian-oci")?;
    Ok(json!({
        "mmdebstrap_build_s": r2(mmdebstrap_s),
        "image_bytes": built.size_bytes,
        "layer_bytes": layer.len(),
        "oci_import_s": r2(import_s),
        "oci_build_s": r2(build_s),
        "oci_vs_mmdebstrap": r2((import_s + build_s) / mmdebstrap_s),
    }))
}

/// Imports `archive` as the template `name` (its text unique to this build) and builds
/// its image; (import seconds, build seconds, image bytes).
fn import_and_build(
    archive: &Path,
    store: &BlobStore,
    agent: &Path,
    cache: &Path,
    name: &str,
) -> Result<(f64, f64, u64)> {
    let started = Instant::now();
    let image = import(archive, store)?;
    let import_s = started.elapsed().as_secs_f64();
    let text = format!("name = \"{name}\"\nbase = \"oci:{}\"\n", image.manifest);
    let started = Instant::now();
    let built = ensure_image(&Template::parse(&text)?, &text, agent, cache)?;
    Ok((import_s, started.elapsed().as_secs_f64(), built.size_bytes))
}

/// busybox, its applets, `/etc/passwd`, and `payload_mib` MiB of incompressible files
/// (1 MiB each) under `/data`, gzip-compressed as registries carry layers.
fn busybox_layer(payload_mib: usize, rng: &mut Rng) -> Result<Vec<u8>> {
    let busybox = std::fs::read("/bin/busybox").context("reading /bin/busybox (apt-get install busybox-static)")?;
    let list = std::process::Command::new("/bin/busybox").arg("--list").output()?;
    let mut l = LayerBuilder::new().dir("bin", 0o755, 0)?.dir("etc", 0o755, 0)?;
    l = l.file("bin/busybox", &busybox, 0o755, 0)?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
        l = l.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    l = l.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644, 0)?;
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..payload_mib {
        rng.fill(&mut chunk);
        l = l.file(&format!("data/{:02}/{i}.bin", i % 64), &chunk, 0o644, 0)?;
    }
    Ok(l.finish_gzip()?)
}
