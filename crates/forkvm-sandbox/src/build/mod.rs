//! Dockerfile builds, each step inside a sandbox, each step's result a diff snapshot.
//!
//! A build evaluates the Dockerfile first (`forkvm_image::dockerfile`: parsed, variables
//! expanded, COPY sources read and hashed), so a bad line fails before anything runs.
//! FROM becomes a base snapshot ([`base`]). Then every RUN, COPY and ADD is a step: its
//! key is the hash of its parent's key and of everything it depends on, and its result
//! is the diff snapshot `build-<key>` over its parent's, made by forking the parent,
//! doing the step in that sandbox ([`step`]) and taking what changed
//! ([`crate::chain_ops::snapshot_diff_with`]: memory and disk, so page cache and all).
//! A step whose snapshot exists is not run again: changing one input reruns that step
//! and the ones after it. The last step writes the configuration and waits for READY
//! ([`finish`]), and the result is published under the build's tag.
//!
//! A Dockerfile of several stages builds the stages the last one needs, in order, each
//! as above: a stage on an earlier stage starts from that stage's last snapshot and key,
//! and a `COPY --from` step takes its files from a sandbox of that stage's result
//! ([`copy_from`]), its key covering that stage's key. Only the last stage is finished
//! and published. Every key is worked out before anything runs, so only the steps whose
//! snapshot is missing and that something missing needs are run: a stage only copied
//! from is skipped when the copies from it are found.
//!
//! Nothing of the build runs on the host: the host reads the build context and sends
//! it; every command runs in a guest, under KVM, as the sandboxes of users do.

pub mod base;
pub mod copy_from;
pub mod finish;
pub mod prune;
pub mod step;

use crate::chain_ops::{snapshot_diff_via, ChainOpError};
use crate::ready::SpawnedSandbox;
use crate::registry::Registry;
use crate::SpawnOptions;
use forkvm_image::dockerfile::{self, Action, Context, DockerfileError, StageBase};
use forkvm_image::kernel::BuildEvent as KernelEvent;
use forkvm_snapshot::chain::{self, RemoveMode};
use forkvm_snapshot::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// What to build.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The Dockerfile's text.
    pub dockerfile: String,
    /// The build context: COPY sources, `.dockerignore`; OCI image paths FROM names when
    /// it is a directory.
    pub context: Context,
    pub build_args: BTreeMap<String, String>,
    /// The tag the result is published as.
    pub tag: String,
    /// Replace `tag` even when a build did not make it.
    pub replace: bool,
    /// Run every step again (fresh step snapshots; the old ones stay until removed).
    pub no_cache: bool,
    /// Start CMD/ENTRYPOINT as a detached service before READY and the snapshot.
    pub start: bool,
}

pub use forkvm_api::{
    TemplateBuildEvent as BuildEvent, TemplateBuildReport as BuildReport, TemplateBuildStep as StepReport,
};

/// How a build starts the sandbox of a step, from its parent's tag: the CLI forks VMMs
/// itself ([`LocalSandboxes`]); the daemon asks its spawner process.
pub trait StepSandboxes {
    fn spawn(&self, tag: &str) -> Result<SpawnedSandbox, ChainOpError>;
}

/// Sandboxes started by this process, as `fork --tag` starts them.
#[derive(Debug)]
pub struct LocalSandboxes<'a> {
    pub registry: &'a Registry,
    pub store: &'a Store,
}

impl StepSandboxes for LocalSandboxes<'_> {
    fn spawn(&self, tag: &str) -> Result<SpawnedSandbox, ChainOpError> {
        crate::chain_ops::spawn_from_tag(self.registry, self.store, tag, &SpawnOptions::default())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Dockerfile(#[from] DockerfileError),
    #[error("Dockerfile line {line}: FROM {from}: {detail}")]
    From { line: usize, from: String, detail: String },
    #[error("Dockerfile line {line}: COPY --from={from}: {detail}")]
    CopyFromImage { line: usize, from: String, detail: String },
    #[error("the base: {0}")]
    Base(String),
    #[error("tag {tag} exists and no build made it; give --replace to replace it")]
    TagTaken { tag: String },
    #[error("replacing tag {tag}: {detail}")]
    Replace { tag: String, detail: String },
    #[error("{step_label}: {source}")]
    Step { step_label: String, source: Box<ChainOpError> },
    #[error(transparent)]
    Store(#[from] forkvm_snapshot::StoreError),
    #[error("{0}")]
    Lock(String),
}

impl BuildError {
    /// The API code.
    pub fn code(&self) -> forkvm_api::ErrorCode {
        use forkvm_api::ErrorCode;
        match self {
            BuildError::Dockerfile(_) | BuildError::From { .. } | BuildError::CopyFromImage { .. } => {
                ErrorCode::BadRequest
            }
            BuildError::TagTaken { .. } | BuildError::Replace { .. } => ErrorCode::Conflict,
            BuildError::Step { source, .. } => source.code(),
            BuildError::Store(e) => e.code(),
            BuildError::Base(_) | BuildError::Lock(_) => ErrorCode::Internal,
        }
    }
}

/// The prefix of every snapshot a build makes for its steps.
pub const STEP_PREFIX: &str = "build-";

/// Builds `req` with sandboxes of this process, reporting as it goes; the kernel's own
/// build (first use only) reports to `kernel`.
pub fn build(
    registry: &Registry,
    store: &Store,
    req: &BuildRequest,
    events: &mut dyn FnMut(BuildEvent),
    kernel: &mut dyn FnMut(KernelEvent),
) -> Result<BuildReport, BuildError> {
    let sandboxes = LocalSandboxes { registry, store };
    prepare(store, req.clone())?.run(registry, store, &sandboxes, events, kernel)
}

/// A build whose Dockerfile checked out and whose tag may be published: what
/// [`prepare`] found before anything runs.
#[derive(Debug)]
pub struct Prepared {
    req: BuildRequest,
    plan: dockerfile::Plan,
    replaced: bool,
    started: Instant,
}

/// Parses and evaluates the Dockerfile (reading and hashing the COPY sources) and checks
/// the tag: a bad line, a missing source or a taken tag fails here, in milliseconds.
pub fn prepare(store: &Store, req: BuildRequest) -> Result<Prepared, BuildError> {
    let started = Instant::now();
    let parsed = dockerfile::parse(&req.dockerfile)?;
    let ignore = dockerfile::read_ignore(&req.context)?;
    let plan = dockerfile::plan(&parsed, &req.build_args, &req.context, &ignore)?;
    let replaced = check_tag(store, &req.tag, req.replace)?;
    Ok(Prepared { req, plan, replaced, started })
}

impl Prepared {
    /// Runs the build: the base, every step not found, the last step, the tag.
    pub fn run(
        self,
        registry: &Registry,
        store: &Store,
        sandboxes: &dyn StepSandboxes,
        events: &mut dyn FnMut(BuildEvent),
        kernel: &mut dyn FnMut(KernelEvent),
    ) -> Result<BuildReport, BuildError> {
        let Prepared { req, plan, replaced, started } = self;
        // Shared for the whole build: a prune waits for no build, and removes nothing of one.
        let _building = prune::hold_for_build(store)?;
        let spawn_one = |tag: &str| sandboxes.spawn(tag);
        let last = plan.stages.len() - 1;
        let (root, _) = plan.root_image(last);
        let of = plan.needed.iter().map(|i| plan.stages[*i].steps.len() as u32).sum::<u32>();
        events(BuildEvent::Planned {
            from: root.to_string(),
            steps: of,
            unused_build_args: plan.unused_build_args.clone(),
        });
        // A fresh series of keys for --no-cache: the old step snapshots are left as they are.
        let nonce = if req.no_cache { format!("no-cache-{}", crate::registry::now_unix_ms()) } else { String::new() };
        // Each image a stage starts from, resolved once; then every step's key and
        // snapshot, before anything runs (a key depends only on what came before).
        let mut bases: BTreeMap<String, base::Base> = BTreeMap::new();
        let mut keyed: BTreeMap<usize, Keyed> = BTreeMap::new();
        for &index in &plan.needed {
            let stage = &plan.stages[index];
            let (base_tag, base_key) = match &stage.base {
                StageBase::Stage(earlier) => keyed[earlier].last().clone(),
                StageBase::Image(image) => {
                    if !bases.contains_key(image) {
                        let b = base::resolve(image, stage.from_line, &req.context, store, events, kernel).map_err(
                            |e| match e {
                                // An implicit stage is a COPY --from=IMAGE's: say so.
                                BuildError::From { line, from, detail } if stage.implicit => {
                                    BuildError::CopyFromImage { line, from, detail }
                                }
                                e => e,
                            },
                        )?;
                        bases.insert(image.clone(), b);
                    }
                    let b = &bases[image];
                    (b.tag.clone(), b.key.clone())
                }
            };
            let mut key = base_key.clone();
            let mut steps = Vec::new();
            for s in &stage.steps {
                key = match &s.action {
                    Action::CopyFrom { stage: from, .. } => {
                        base::hash(&["step", &key, &s.digest, &nonce, "from", &keyed[from].last().1])
                    }
                    _ => base::hash(&["step", &key, &s.digest, &nonce]),
                };
                steps.push((format!("{STEP_PREFIX}{}", &key[..24]), key.clone()));
            }
            keyed.insert(index, Keyed { base: (base_tag, base_key), steps });
        }
        let (_, last_key) = keyed[&last].last().clone();
        let config_json = serde_json::to_string(&plan.result().config).expect("plain data serializes");
        let finish_key = base::hash(&["finish", &last_key, &config_json, if req.start { "start" } else { "" }, &nonce]);
        let finish_tag = format!("{STEP_PREFIX}{}", &finish_key[..24]);
        // The steps that must run: those whose snapshot is missing and that something
        // missing needs; a stage only copied from is not run when its copies are found.
        let mut to_run = BTreeSet::new();
        if store.lookup(&finish_tag).is_err() {
            must_exist(&plan, &keyed, store, last, plan.stages[last].steps.len().checked_sub(1), &mut to_run);
        }
        let mut steps = Vec::new();
        let mut n = 0u32;
        for &index in &plan.needed {
            let stage = &plan.stages[index];
            let mut parent = keyed[&index].base.0.clone();
            for (i, s) in stage.steps.iter().enumerate() {
                n += 1;
                let tag = keyed[&index].steps[i].0.clone();
                // Held until the step's snapshot exists: a build beside this one that
                // reaches the same step waits, then finds it.
                let _making = step_lock(store, &tag)?;
                let cached = !to_run.contains(&(index, i)) || store.lookup(&tag).is_ok();
                events(BuildEvent::Step {
                    step: n,
                    of,
                    line: s.line as u32,
                    instruction: s.text.clone(),
                    snapshot: tag.clone(),
                    cached,
                });
                let mut seconds = None;
                if !cached {
                    let ran = Instant::now();
                    // COPY --from's source: a sandbox of the stage's last snapshot, for the step.
                    let source = |from: usize,
                                  work: &mut dyn FnMut(
                        &forkvm_proto::AgentClient<std::os::unix::net::UnixStream>,
                    ) -> Result<String, ChainOpError>| {
                        let sandbox = spawn_one(&keyed[&from].last().0)?;
                        let result = work(&sandbox.client);
                        let killed = crate::verbs::kill(registry, &sandbox.record.id);
                        let output = result?;
                        killed?;
                        Ok(output)
                    };
                    let r = snapshot_diff_via(registry, store, &parent, &tag, &spawn_one, |client| {
                        step::run(client, n, &s.text, &s.action, &source, events)
                    })
                    .map_err(|source| BuildError::Step {
                        step_label: format!("step {n} (line {}: {})", s.line, s.text),
                        source: Box::new(source),
                    })?;
                    let took = ran.elapsed().as_secs_f64();
                    events(BuildEvent::StepDone {
                        step: n,
                        seconds: took,
                        spawn_ms: r.spawn_ms,
                        work_ms: r.steps_ms,
                        branch_ms: r.branch_ms,
                        diff_ms: r.diff_ms,
                    });
                    seconds = Some(took);
                }
                steps.push(StepReport {
                    step: n,
                    line: s.line as u32,
                    instruction: s.text.clone(),
                    snapshot: tag.clone(),
                    cached,
                    seconds,
                });
                parent = tag;
            }
        }
        let parent = keyed[&last].last().0.clone();
        let result = plan.result();
        let base = &bases[root];
        // The last step: configuration, start, READY. Cached like the others.
        let finish_lock = step_lock(store, &finish_tag)?;
        let finish_cached = store.lookup(&finish_tag).is_ok();
        let finishing = Instant::now();
        if !finish_cached {
            snapshot_diff_via(registry, store, &parent, &finish_tag, &spawn_one, |client| {
                finish::run(client, &result.config, req.start, events)
            })
            .map_err(|source| BuildError::Step {
                step_label: "the last step (configuration, READY)".into(),
                source: Box::new(source),
            })?;
        }
        events(BuildEvent::Finished {
            snapshot: finish_tag.clone(),
            cached: finish_cached,
            seconds: finishing.elapsed().as_secs_f64(),
        });
        drop(finish_lock);
        // Two builds publishing one tag: one at a time, each deciding again under the
        // lock whether the tag is a build's to replace.
        let publish_lock = step_lock(store, &req.tag)?;
        let replaced = replaced || check_tag(store, &req.tag, req.replace)?;
        publish(registry, store, &finish_tag, &req.tag, replaced, &spawn_one)?;
        drop(publish_lock);
        let ran = steps.iter().filter(|s| !s.cached).count() as u32;
        let config = &result.config;
        let pair = |(k, v): &(String, String)| format!("{k}={v}");
        Ok(BuildReport {
            tag: req.tag.clone(),
            from: root.to_string(),
            base_snapshot: base.tag.clone(),
            base_cached: base.cached,
            cached: steps.len() as u32 - ran,
            ran,
            steps,
            finish_cached,
            env: config.env.iter().map(pair).collect(),
            workdir: config.workdir.clone(),
            user: config.user.clone(),
            command: config.command(),
            expose: config.expose.clone(),
            labels: config.labels.iter().map(pair).collect(),
            ready: config.ready.as_ref().map(|r| config.argv(r)),
            replaced,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// A needed stage's snapshots and keys: its base's, then each step's.
struct Keyed {
    base: (String, String),
    steps: Vec<(String, String)>,
}

impl Keyed {
    /// The stage's result: its last step's snapshot and key, or its base's.
    fn last(&self) -> &(String, String) {
        self.steps.last().unwrap_or(&self.base)
    }
}

/// Marks step `step` of stage `stage` (`None`: its base) to run unless its snapshot
/// exists, and so on down what it needs: the step before it (or the stage it starts
/// from), and for a COPY --from the source stage's result.
fn must_exist(
    plan: &dockerfile::Plan,
    keyed: &BTreeMap<usize, Keyed>,
    store: &Store,
    stage: usize,
    step: Option<usize>,
    to_run: &mut BTreeSet<(usize, usize)>,
) {
    let mut todo = vec![(stage, step)];
    while let Some((stage, step)) = todo.pop() {
        let Some(i) = step else {
            // A stage's base: an image is resolved; an earlier stage's result must exist.
            if let StageBase::Stage(earlier) = plan.stages[stage].base {
                todo.push((earlier, plan.stages[earlier].steps.len().checked_sub(1)));
            }
            continue;
        };
        if to_run.contains(&(stage, i)) || store.lookup(&keyed[&stage].steps[i].0).is_ok() {
            continue;
        }
        to_run.insert((stage, i));
        todo.push((stage, i.checked_sub(1)));
        if let Action::CopyFrom { stage: from, .. } = plan.stages[stage].steps[i].action {
            todo.push((from, plan.stages[from].steps.len().checked_sub(1)));
        }
    }
}

/// Lock files of build steps: one of [`STEP_LOCKS`] by the name's hash, so their number
/// is bounded whatever the builds (two steps sharing one only wait for each other).
const STEP_LOCK_DIR: &str = "build-locks";
const STEP_LOCKS: u64 = 256;

/// An exclusive lock on making snapshot `name`, held while the returned file lives.
fn step_lock(store: &Store, name: &str) -> Result<std::fs::File, BuildError> {
    let dir = store.root().join(STEP_LOCK_DIR);
    let lock_error = |e: std::io::Error| BuildError::Lock(format!("locking {name} in {}: {e}", dir.display()));
    std::fs::create_dir_all(&dir).map_err(lock_error)?;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(name.as_bytes());
    let slot = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) % STEP_LOCKS;
    forkvm_snapshot::flock::lock_file(&dir.join(format!("{slot:02x}.lock")), libc::LOCK_EX).map_err(lock_error)
}

/// Whether `tag` exists and is to be replaced: a tag an earlier build published (its
/// parent is a build's last step) is, any other only with `replace`.
fn check_tag(store: &Store, tag: &str, replace: bool) -> Result<bool, BuildError> {
    match chain::info(store, tag) {
        Err(_) => {
            store.check_free(tag)?;
            Ok(false)
        }
        Ok(info) => {
            let by_build = info.parent_tag.as_deref().is_some_and(|p| p.starts_with(STEP_PREFIX));
            if by_build || replace {
                Ok(true)
            } else {
                Err(BuildError::TagTaken { tag: tag.to_string() })
            }
        }
    }
}

/// Publishes `tag` as a diff over the build's last step with nothing changed (a spawn
/// and a live branch): removing the old `tag` first when it is being replaced.
fn publish(
    registry: &Registry,
    store: &Store,
    last: &str,
    tag: &str,
    replace: bool,
    spawn_one: &dyn Fn(&str) -> Result<SpawnedSandbox, ChainOpError>,
) -> Result<(), BuildError> {
    if replace {
        chain::remove(store, &crate::source::assembled_cache(), tag, RemoveMode::Refuse)
            .map_err(|e| BuildError::Replace { tag: tag.to_string(), detail: e.to_string() })?;
    }
    snapshot_diff_via(registry, store, last, tag, spawn_one, |_| Ok(String::new()))
        .map_err(|source| BuildError::Step { step_label: format!("publishing {tag}"), source: Box::new(source) })?;
    Ok(())
}
