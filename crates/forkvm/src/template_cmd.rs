//! `forkvm template`: templates made from what users bring. `from-oci` imports an OCI
//! image (layout directory, OCI archive or `docker save` archive) into the image store,
//! writes the template `<name>.toml` whose base it is, and builds its root filesystem
//! (and, with `--snapshot`, its template snapshot). With `--daemon` the archive is
//! uploaded (`POST /v1/templates/oci`) and the daemon does the same on its host; a
//! layout directory is local only. `build` builds a Dockerfile (`build_cmd`).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use forkvm_image::oci::defaults::ImageDefaults;
use forkvm_image::oci::template_file::{save_template, template_text, TemplateOptions};
use forkvm_image::progress::ProgressView;
use forkvm_image::rootfs::Catalog;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct TemplateArgs {
    #[command(subcommand)]
    pub command: TemplateCommand,
}

#[derive(Subcommand, Debug)]
pub enum TemplateCommand {
    /// Make a template from an OCI image: an OCI layout directory (`skopeo copy ...
    /// oci:DIR`), an OCI archive, or a `docker save` archive (gzip-compressed or not).
    ///
    /// The image's layers go into the image store beside the template directory (shared
    /// layers are stored once); its Env, WorkingDir and User become the template's
    /// `[exec]` defaults. Layers are unpacked as root of a user namespace on
    /// unprivileged ids, never as host root; nothing of the image runs on the host.
    FromOci(FromOciArgs),
    /// Build a Dockerfile into a tag, every step inside a sandbox and cached as a diff
    /// snapshot: FROM a template, a tag or an OCI image; RUN, COPY/ADD (with
    /// .dockerignore), ENV, ARG, WORKDIR, USER, EXPOSE, CMD/ENTRYPOINT, LABEL, SHELL,
    /// and READY (a command whose success marks the result warm).
    Build(crate::build_cmd::BuildArgs),
    /// Remove the build cache's step snapshots (`build-*`) nothing needs: none under a
    /// tag that is not a build step's, none a sandbox runs from. Refused while a build
    /// runs.
    Prune(PruneArgs),
}

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// List what would go; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep step snapshots younger than this (30m, 24h, ...).
    #[arg(long, value_parser = seconds)]
    pub older_than: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct FromOciArgs {
    /// The image: a layout directory or an archive file.
    pub source: PathBuf,
    /// The template's name (a <name>.toml in the template directory).
    #[arg(long)]
    pub name: String,
    /// Run the image's command (Entrypoint + Cmd) as the template's `start` service.
    #[arg(long, conflicts_with = "start")]
    pub start_image_command: bool,
    /// A `start` service (shell command) to run before the template snapshot.
    #[arg(long)]
    pub start: Option<String>,
    /// A `ready` check for the start service (retried until it succeeds).
    #[arg(long)]
    pub ready: Option<String>,
    #[arg(long)]
    pub vcpus: Option<u8>,
    #[arg(long)]
    pub memory_mib: Option<u32>,
    /// Replace a template of that name.
    #[arg(long)]
    pub force: bool,
    /// Import and write the template only; build nothing.
    #[arg(long, conflicts_with = "snapshot")]
    pub no_build: bool,
    /// Also boot it once into its template snapshot (what sandboxes restore).
    #[arg(long)]
    pub snapshot: bool,
}

pub fn run(a: TemplateArgs, remote: &crate::remote_cmd::RemoteArgs) -> Result<i32> {
    match a.command {
        TemplateCommand::FromOci(f) => match remote.client()? {
            Some(client) => from_oci_remote(&client, f),
            None => from_oci(f),
        },
        TemplateCommand::Build(b) => crate::build_cmd::run(b, remote),
        TemplateCommand::Prune(p) => prune(p, remote),
    }
}

/// An interval (`30m`, `24h`) in whole seconds, more than 0.
fn seconds(text: &str) -> Result<u64, String> {
    match forkvmd::disk::parse_interval(text).map_err(|e| e.to_string())? {
        Some(d) if d.as_secs() > 0 => Ok(d.as_secs()),
        _ => Err(format!("{text:?}: give an interval of a second or more (30m, 24h, ...)")),
    }
}

fn prune(a: PruneArgs, remote: &crate::remote_cmd::RemoteArgs) -> Result<i32> {
    let req = forkvm_client::api::PruneBuildsRequest { dry_run: a.dry_run, older_than_seconds: a.older_than };
    let report = match remote.client()? {
        Some(client) => client.prune_builds(&req)?,
        None => forkvm_sandbox::build::prune::prune(
            &forkvm_sandbox::Registry::open_default(),
            &forkvm_snapshot::Store::open_default(),
            &req,
        )?,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let verb = if report.dry_run { "would remove" } else { "removed" };
        for tag in &report.removed {
            println!("{tag}");
        }
        eprintln!(
            "{verb} {} step snapshot(s), {:.1} MiB; kept {}",
            report.removed.len(),
            report.freed_bytes as f64 / (1u64 << 20) as f64,
            report.kept
        );
    }
    Ok(0)
}

/// Uploads the archive to the daemon; prints its progress lines as they were sent.
fn from_oci_remote(client: &forkvm_client::Client, a: FromOciArgs) -> Result<i32> {
    if a.source.is_dir() {
        anyhow::bail!(
            "{}: a layout directory cannot be uploaded; give an archive (OCI or docker save)",
            a.source.display()
        );
    }
    if a.no_build {
        anyhow::bail!("--no-build is local only: the daemon always builds what it imports");
    }
    let q = forkvm_client::api::ImportOciQuery {
        name: a.name,
        start: a.start,
        start_image_command: a.start_image_command,
        ready: a.ready,
        vcpus: a.vcpus,
        memory_mib: a.memory_mib,
        force: a.force,
        snapshot: a.snapshot,
    };
    for event in client.import_oci_template_file(&a.source, &q)? {
        println!("{}", serde_json::to_string(&event)?);
    }
    Ok(0)
}

fn from_oci(a: FromOciArgs) -> Result<i32> {
    let started = Instant::now();
    let store = forkvm_image::oci::configured_store();
    let image = forkvm_image::oci::import(&a.source, &store).context("importing the image")?;
    let import_seconds = started.elapsed().as_secs_f64();
    let defaults = ImageDefaults::from_config(&image.config);
    let start = defaults
        .start_service(a.start.clone(), a.start_image_command)
        .map_err(|e| anyhow::anyhow!("--start-image-command: {e}"))?;
    let options = TemplateOptions { start, ready: a.ready.clone(), vcpus: a.vcpus, memory_mib: a.memory_mib };
    let text = template_text(&a.name, &image, &defaults, &options)?;
    let catalog = Catalog::configured();
    let path = save_template(catalog.dir(), &a.name, &text, a.force)?;
    let mut out = json!({
        "template": a.name,
        "file": path,
        "manifest": image.manifest.to_string(),
        "layers": image.layers.len(),
        "new_bytes": image.new_bytes,
        "shared_bytes": image.shared_bytes,
        "import_seconds": round(import_seconds),
        "exec": defaults.exec,
        "command": defaults.command,
        "exposed_ports": defaults.exposed_ports,
    });
    if !a.no_build {
        let build_started = Instant::now();
        let mut view = ProgressView::new();
        let artifacts = forkvm_sandbox::Artifacts::ensure(&a.name, &mut |e| view.show(&e));
        view.finish();
        let artifacts = artifacts?;
        out["image"] = json!(artifacts.image.rootfs);
        out["image_bytes"] = json!(artifacts.image.size_bytes);
        out["build_seconds"] = json!(round(build_started.elapsed().as_secs_f64()));
        if a.snapshot {
            let t = forkvm_sandbox::ensure_template_snapshot(artifacts)?;
            out["snapshot"] = json!(t.dir);
            out["boot_seconds"] = json!(t.boot_seconds);
        }
    }
    out["seconds"] = json!(round(started.elapsed().as_secs_f64()));
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

fn round(s: f64) -> f64 {
    (s * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        t: TemplateCommand,
    }

    #[test]
    fn parses_from_oci() {
        let c = Cli::try_parse_from(["x", "from-oci", "img.tar", "--name", "web", "--start-image-command"]).unwrap();
        let TemplateCommand::FromOci(f) = c.t else { panic!("{:?}", c.t) };
        assert!(f.start_image_command && f.start.is_none() && !f.snapshot);
        assert!(Cli::try_parse_from(["x", "from-oci", "img.tar"]).is_err(), "--name is required");
        assert!(Cli::try_parse_from(["x", "from-oci", "i", "--name", "w", "--start", "a", "--start-image-command"])
            .is_err());
        assert!(Cli::try_parse_from(["x", "from-oci", "i", "--name", "w", "--start", "s", "--ready", "true"]).is_ok());
    }

    #[test]
    fn parses_build() {
        let c = Cli::try_parse_from(["x", "build", "ctx", "-t", "app", "--build-arg", "A=1", "--build-arg", "B=2"])
            .unwrap();
        let TemplateCommand::Build(b) = c.t else { panic!("{:?}", c.t) };
        assert_eq!((b.context.to_str(), b.tag.as_str(), b.build_args.len()), (Some("ctx"), "app", 2));
        assert!(b.file.is_none() && !b.no_cache && !b.replace && !b.start);
        assert!(Cli::try_parse_from(["x", "build", "ctx"]).is_err(), "--tag is required");
    }
}
