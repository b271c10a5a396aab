//! `/v1/templates`: templates made from what users bring (`docs/templates.md`).

use serde::{Deserialize, Serialize};

/// `POST /v1/templates/oci?name=...`: the query of an image import. The body is the
/// image: an OCI archive or a `docker save` archive, gzip-compressed or not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportOciQuery {
    /// The template's name: 1-64 letters, digits, `-` or `_`; not a built-in template's.
    pub name: String,
    /// A `start` service (shell command) run before the template snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// Run the image's Entrypoint + Cmd as the `start` service.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_image_command: bool,
    /// A `ready` check for the start service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Replace a template of that name made before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Also boot the template into its snapshot (minutes where the guest kernel is emulated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
}

/// One NDJSON line of `POST /v1/templates/oci`'s progress. The first line is `imported`
/// (a body that is not an image is a 400 before any line); `done` or `error` is last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TemplateImportEvent {
    /// The image is in the blob store and the template file written.
    Imported {
        manifest: String,
        layers: u32,
        /// Blob bytes this import added to the store.
        new_bytes: u64,
        /// Blob bytes it found there already (layers shared with other images).
        shared_bytes: u64,
        /// The image's Entrypoint + Cmd.
        command: Vec<String>,
        exposed_ports: Vec<String>,
    },
    /// The root filesystem image is built.
    Built { image_bytes: u64, seconds: f64 },
    /// The template snapshot is made (with `snapshot=true`).
    Snapshot { seconds: f64 },
    /// The template is ready; the last line.
    Done { template: String },
    /// The build failed; the last line.
    Error { error: String },
}

/// `POST /v1/templates/build?tag=...`: the query of a Dockerfile build. The body is the
/// build context as a tar archive (gzip-compressed or not), the Dockerfile in it
/// (`docs/dockerfile.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildTemplateQuery {
    /// The tag the result is published as.
    pub tag: String,
    /// The Dockerfile's path in the context; `Dockerfile` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    /// ARG values: a JSON object of strings, such as `{"VERSION":"2"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_args: Option<String>,
    /// Run every step again (fresh step snapshots; the old ones stay).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_cache: bool,
    /// Replace the tag even if no build made it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    /// Start CMD/ENTRYPOINT as a service before READY and the snapshot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start: bool,
}

/// One step of a build's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TemplateBuildStep {
    /// From 1.
    pub step: u32,
    /// The Dockerfile line it starts on.
    pub line: u32,
    /// The instruction's first line as written.
    pub instruction: String,
    /// Its diff snapshot, `build-<key>`.
    pub snapshot: String,
    /// Found from an earlier build, not run.
    pub cached: bool,
    /// How long it ran (absent when cached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

/// What a Dockerfile build did, and the configuration the result runs with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TemplateBuildReport {
    pub tag: String,
    /// FROM, variables expanded.
    pub from: String,
    /// The snapshot the first step forked.
    pub base_snapshot: String,
    pub base_cached: bool,
    pub steps: Vec<TemplateBuildStep>,
    /// Steps run and steps found.
    pub ran: u32,
    pub cached: u32,
    /// The last step (configuration, start, READY) was found too.
    pub finish_cached: bool,
    /// ENV, in order, as `NAME=VALUE` (over the base image's own).
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// ENTRYPOINT and CMD as one argv.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// EXPOSE, as written (`8080`, `53/udp`).
    pub expose: Vec<String>,
    /// LABEL (and MAINTAINER), in order, as `KEY=VALUE`.
    pub labels: Vec<String>,
    /// READY as an argv.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<Vec<String>>,
    /// An earlier tag of that name was replaced.
    pub replaced: bool,
    pub seconds: f64,
}

/// One NDJSON line of `POST /v1/templates/build`'s progress (and of `forkvm template
/// build --json-progress`). A Dockerfile that does not check out is a 400 before any
/// line; `done` or `error` is last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TemplateBuildEvent {
    /// The Dockerfile is valid: `steps` steps on `from`.
    Planned { from: String, steps: u32, unused_build_args: Vec<String> },
    /// The base snapshot is there (booted or imported unless `cached`).
    Base { from: String, kind: String, snapshot: String, cached: bool, seconds: f64 },
    /// Step `step` of `of` begins: found (`cached`) or running.
    Step { step: u32, of: u32, line: u32, instruction: String, snapshot: String, cached: bool },
    /// What a running step printed (step 0: the last step).
    Output { step: u32, text: String },
    /// A step that ran is done: its fork, its work, the branch and the diff, ms.
    StepDone { step: u32, seconds: f64, spawn_ms: f64, work_ms: f64, branch_ms: f64, diff_ms: f64 },
    /// The configuration is written and READY passed.
    Finished { snapshot: String, cached: bool, seconds: f64 },
    /// The tag is published; the last line.
    Done { report: Box<TemplateBuildReport> },
    /// The build failed; the last line. Nothing was published under the tag.
    Error { error: String },
}

/// `POST /v1/templates/prune`: remove the snapshots Dockerfile builds made for their
/// steps (`build-*`) that nothing needs any more: not below a tag of the store's in its
/// chain, not what a sandbox runs from. Refused (409) while a build runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneBuildsRequest {
    /// Report what would go, remove nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Keep step snapshots made less than this many seconds ago.
    #[serde(default)]
    pub older_than_seconds: Option<u64>,
}

/// What a prune removed (or would remove, in a dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PruneBuildsReport {
    /// The step snapshots removed, leaves first.
    pub removed: Vec<String>,
    /// Step snapshots kept: below a tag, run from, or too recent.
    pub kept: u32,
    /// Bytes they held in the store (their memory and disk layers as `info` counts
    /// them; chunks another snapshot shares stay).
    pub freed_bytes: u64,
    pub dry_run: bool,
}
