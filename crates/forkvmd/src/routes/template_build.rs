//! `POST /v1/templates/build?tag=...`: a Dockerfile build through the daemon, as
//! `forkvm template build` does on its host (`docs/dockerfile.md`). The body is the build
//! context as a tar archive (gzip-compressed or not), the Dockerfile in it. It is staged
//! in the store and indexed in place, never unpacked: no name of the body becomes a host
//! path. The Dockerfile is checked and the tag too before the response starts (400,
//! 409); then the build's progress streams as NDJSON lines ([`TemplateBuildEvent`]),
//! `done` with the report or `error` last. Every step's sandbox is started by the
//! daemon's spawner process, as any sandbox of the daemon is.

use super::upload::{receive, Staged};
use crate::error::ApiError;
use crate::extract::QueryArgs;
use crate::spawner::SpawnOrder;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use forkvm_api::{BuildTemplateQuery, TemplateBuildEvent};
use forkvm_image::dockerfile::tar_context::TarIndex;
use forkvm_image::dockerfile::{Context, MAX_TEXT};
use forkvm_sandbox::build::{prepare, BuildError, BuildRequest, StepSandboxes};
use forkvm_sandbox::registry::Origin;
use forkvm_sandbox::start::new_sandbox_id;
use forkvm_sandbox::{ChainOpError, SandboxState, SpawnOptions, SpawnSource, SpawnedSandbox};
use forkvm_snapshot::{chain, validate_tag};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The largest build context accepted.
pub const MAX_CONTEXT_UPLOAD: u64 = 16 << 30;

pub async fn build_template(
    State(s): State<AppState>,
    QueryArgs(q): QueryArgs<BuildTemplateQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let staged = Staged(s.blocking(|s| Ok(chain::new_staging_dir(&s.store, "context")?)).await?);
    let upload = staged.0.join("context.upload");
    // The whole body first, even for a request refused below: a client still writing
    // its upload would see its connection cut, not the reason.
    receive(body, &upload, MAX_CONTEXT_UPLOAD, "the build context").await?;
    validate_tag(&q.tag)?;
    let build_args = build_args(q.build_args.as_deref())?;
    let dockerfile_name = q.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into());
    let prepared = s
        .blocking(move |s| {
            let mut file = std::fs::File::open(&upload).map_err(|e| ApiError::internal(format!("the upload: {e}")))?;
            let index = TarIndex::stage(&mut file, &staged.0.join("context.tar"))
                .map_err(|e| ApiError::bad_request(format!("the body is not a usable build context: {e}")))?;
            let _ = std::fs::remove_file(&upload);
            let context = Context::Tar(Arc::new(index));
            let dockerfile = context
                .read_small(&dockerfile_name, MAX_TEXT)
                .map_err(ApiError::bad_request)?
                .ok_or_else(|| ApiError::bad_request(format!("the context has no {dockerfile_name:?}")))?;
            let req = BuildRequest {
                dockerfile,
                context,
                build_args,
                tag: q.tag.clone(),
                replace: q.replace,
                no_cache: q.no_cache,
                start: q.start,
            };
            let prepared = prepare(&s.store, req).map_err(build_error)?;
            Ok((prepared, staged))
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    let state = s.clone();
    tokio::task::spawn_blocking(move || {
        let (prepared, _staged) = prepared;
        let send = |e: &TemplateBuildEvent| {
            let _ = tx.blocking_send(super::run::ndjson_line(e));
        };
        let sandboxes = DaemonSandboxes { s: &state };
        let started = Instant::now();
        let result = prepared.run(&state.registry, &state.store, &sandboxes, &mut |e| send(&e), &mut |event| {
            tracing::info!(?event, "building the kernel for a Dockerfile build");
        });
        let last = match result {
            Ok(report) => {
                tracing::info!(tag = %report.tag, ran = report.ran, cached = report.cached,
                    seconds = started.elapsed().as_secs_f64(), "built a Dockerfile");
                TemplateBuildEvent::Done { report: Box::new(report) }
            }
            Err(error) => {
                tracing::warn!(%error, "a Dockerfile build failed");
                TemplateBuildEvent::Error { error: error.to_string() }
            }
        };
        send(&last);
    });
    let body = Body::from_stream(futures_util::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, std::io::Error>,
    ));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// `build_args`: a JSON object of strings.
fn build_args(text: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
    let Some(text) = text else { return Ok(BTreeMap::new()) };
    serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("build_args is not a JSON object of strings: {e}")))
}

fn build_error(e: BuildError) -> ApiError {
    match e.code() {
        forkvm_api::ErrorCode::Conflict => ApiError::conflict(e.to_string(), "exists"),
        code => ApiError::new(code, e.to_string()),
    }
}

/// A step's sandbox, started by the spawner like any of the daemon's sandboxes (and
/// listed while it runs).
struct DaemonSandboxes<'a> {
    s: &'a AppState,
}

impl StepSandboxes for DaemonSandboxes<'_> {
    fn spawn(&self, tag: &str) -> Result<SpawnedSandbox, ChainOpError> {
        let failed = |detail: String| ChainOpError::Work { step: format!("starting a sandbox from {tag}"), detail };
        let started = Instant::now();
        let source = SpawnSource::from_tag(&self.s.store, tag)?;
        let spawner = self.s.spawner.clone().ok_or_else(|| failed("this daemon has no spawner process".into()))?;
        let ids = vec![new_sandbox_id()];
        let origin = Origin {
            template: source.template().map(String::from),
            source_tag: Some(tag.to_string()),
            vcpus: Some(source.meta.vcpu_count),
            ..Origin::default()
        };
        let limits = SpawnOptions::default();
        self.s
            .begin_sandboxes(&ids, &format!("build-{}", ids[0]), &limits.recorded_in(origin))
            .map_err(|e| failed(e.message))?;
        let order = SpawnOrder { tag: tag.to_string(), ids: ids.clone(), limits, volumes: Vec::new() };
        let made = spawner
            .start_vmms(&order)
            .map_err(|r| failed(r.message))
            .and_then(|vmms| Ok(forkvm_sandbox::finish(&self.s.registry, vmms.records, started)?));
        match made {
            Ok(mut ready) => Ok(ready.remove(0)),
            Err(e) => {
                let _ = self.s.registry.remove_if(&ids[0], &[SandboxState::Starting]);
                Err(e)
            }
        }
    }
}
