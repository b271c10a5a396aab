//! `forkvm template build`: a Dockerfile built into a tag, every step in a sandbox
//! (`forkvm_sandbox::build`). Progress goes to stderr as it happens (each step cached or
//! run, what RUN prints); the report is one JSON object on stdout.

use anyhow::{Context, Result};
use clap::Args;
use forkvm_image::dockerfile::tar_context::TarIndex;
use forkvm_image::dockerfile::Context as BuildContext;
use forkvm_image::progress::ProgressView;
use forkvm_sandbox::build::{build, BuildEvent, BuildRequest};
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;
use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The build context: a directory (COPY and ADD sources, `.dockerignore`, OCI images
    /// FROM names), or a tar archive of one (gzip-compressed or not; `-` reads it from
    /// stdin, e.g. `git archive HEAD | forkvm template build - -t app`).
    #[arg(default_value = ".")]
    pub context: PathBuf,
    /// The Dockerfile (default: `Dockerfile` in the context, or in the archive).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The tag the result is published as (what `fork --tag` starts from).
    #[arg(long, short = 't')]
    pub tag: String,
    /// An ARG's value: NAME=VALUE (repeatable).
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    pub build_args: Vec<String>,
    /// Run every step again instead of using the step snapshots of earlier builds.
    #[arg(long)]
    pub no_cache: bool,
    /// Replace the tag even if no build made it.
    #[arg(long)]
    pub replace: bool,
    /// Start CMD/ENTRYPOINT as a service before READY, so sandboxes have it running.
    #[arg(long)]
    pub start: bool,
    /// Print progress as JSON lines on stderr instead of text.
    #[arg(long)]
    pub json_progress: bool,
}

pub fn run(a: BuildArgs, remote: &crate::remote_cmd::RemoteArgs) -> Result<i32> {
    let mut build_args = BTreeMap::new();
    for arg in &a.build_args {
        let (k, v) = arg.split_once('=').with_context(|| format!("--build-arg {arg}: not NAME=VALUE"))?;
        build_args.insert(k.to_string(), v.to_string());
    }
    if let Some(client) = remote.client()? {
        return remote_build(&client, &a, &build_args);
    }
    let store = Store::open_default();
    let (context, _staged) = open_context(&store, &a.context)?;
    let dockerfile = match &a.file {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => context
            .read_small("Dockerfile", forkvm_image::dockerfile::MAX_TEXT)
            .map_err(anyhow::Error::msg)?
            .with_context(|| format!("no Dockerfile in {} (give one with -f)", a.context.display()))?,
    };
    let req = BuildRequest {
        dockerfile,
        context,
        build_args,
        tag: a.tag.clone(),
        replace: a.replace,
        no_cache: a.no_cache,
        start: a.start,
    };
    let mut view = ProgressView::new();
    let json = a.json_progress;
    let report = build(&Registry::open_default(), &store, &req, &mut |e| progress(json, &e), &mut |e| view.show(&e));
    view.finish();
    let report = report?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// The name a Dockerfile given with `-f` has in the archive sent to the daemon.
const SENT_DOCKERFILE: &str = ".forkvm-dockerfile";

/// Sends the context to the daemon as a tar archive (a directory archived here, links as
/// links; an archive as it is) and shows the build's progress as it comes back.
fn remote_build(client: &forkvm_client::Client, a: &BuildArgs, build_args: &BTreeMap<String, String>) -> Result<i32> {
    let mut q = forkvm_client::api::BuildTemplateQuery {
        tag: a.tag.clone(),
        dockerfile: None,
        build_args: (!build_args.is_empty()).then(|| serde_json::to_string(build_args)).transpose()?,
        no_cache: a.no_cache,
        replace: a.replace,
        start: a.start,
    };
    let is_dir = a.context != Path::new("-") && a.context.is_dir();
    let mut src: Box<dyn Read> = if is_dir {
        let mut tar = tar::Builder::new(tempfile::tempfile().context("a temporary file for the context")?);
        tar.follow_symlinks(false);
        tar.append_dir_all(".", &a.context).with_context(|| format!("archiving {}", a.context.display()))?;
        if let Some(file) = &a.file {
            tar.append_path_with_name(file, SENT_DOCKERFILE).with_context(|| format!("reading {}", file.display()))?;
            q.dockerfile = Some(SENT_DOCKERFILE.into());
        }
        let mut f = tar.into_inner().context("archiving the context")?;
        f.seek(std::io::SeekFrom::Start(0))?;
        Box::new(f)
    } else if a.file.is_some() {
        anyhow::bail!("-f with an archive as the context: put the Dockerfile in the archive");
    } else if a.context == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(&a.context).with_context(|| format!("the build context {}", a.context.display()))?)
    };
    let json = a.json_progress;
    let report = client.build_template(&mut src, &q, &mut |e| progress(json, e))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(0)
}

/// One progress event on stderr, as text or a JSON line.
fn progress(json: bool, e: &BuildEvent) {
    let mut stderr = std::io::stderr();
    let _ =
        if json { writeln!(stderr, "{}", serde_json::to_string(e).unwrap_or_default()) } else { show(&mut stderr, e) };
}

/// A staging directory removed when dropped.
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The context: the directory as it is, or an archive (a file, or `-` for stdin) staged
/// as a plain tar in the store's staging area and indexed there, never unpacked.
fn open_context(store: &Store, path: &Path) -> Result<(BuildContext, Option<Staged>)> {
    if path != Path::new("-") && path.is_dir() {
        return Ok((BuildContext::Dir(path.to_path_buf()), None));
    }
    let staged = Staged(forkvm_snapshot::chain::new_staging_dir(store, "context")?);
    let at = staged.0.join("context.tar");
    let index = if path == Path::new("-") {
        TarIndex::stage(&mut std::io::stdin().lock(), &at)
    } else {
        let mut f = std::fs::File::open(path).with_context(|| format!("the build context {}", path.display()))?;
        TarIndex::stage(&mut f, &at)
    }
    .map_err(anyhow::Error::msg)?;
    Ok((BuildContext::Tar(std::sync::Arc::new(index)), Some(staged)))
}

fn show(out: &mut impl Write, e: &BuildEvent) -> std::io::Result<()> {
    match e {
        BuildEvent::Planned { from, steps, unused_build_args } => {
            writeln!(out, "building {steps} step(s) on {from}")?;
            if !unused_build_args.is_empty() {
                writeln!(out, "warning: no ARG uses --build-arg {}", unused_build_args.join(", "))?;
            }
            Ok(())
        }
        BuildEvent::Base { from, kind, snapshot, cached, seconds } => writeln!(
            out,
            "FROM {from}: {kind} {snapshot} ({})",
            if *cached { "cached".to_string() } else { format!("made in {seconds:.1} s") }
        ),
        BuildEvent::Step { step, of, line, instruction, cached, .. } => {
            writeln!(out, "[{step}/{of}] line {line}: {instruction}{}", if *cached { "  (cached)" } else { "" })
        }
        BuildEvent::Output { text, .. } => write!(out, "{text}"),
        BuildEvent::StepDone { step, seconds, spawn_ms, work_ms, branch_ms, diff_ms } => writeln!(
            out,
            "[{step}] ran in {seconds:.2} s (fork {spawn_ms:.0} ms, work {work_ms:.0} ms, branch {branch_ms:.0} ms, diff {diff_ms:.0} ms)"
        ),
        BuildEvent::Done { report } => writeln!(out, "built {} ({} step(s) ran, {} cached)", report.tag, report.ran, report.cached),
        BuildEvent::Error { error } => writeln!(out, "the build failed: {error}"),
        BuildEvent::Finished { snapshot, cached, seconds } => writeln!(
            out,
            "configuration and READY: {snapshot} ({})",
            if *cached { "cached".to_string() } else { format!("{seconds:.2} s") }
        ),
    }
}
