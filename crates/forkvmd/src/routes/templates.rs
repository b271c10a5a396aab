//! `POST /v1/templates/oci?name=...`: a template from an OCI image sent as the body (an
//! OCI archive or a `docker save` archive), as `forkvm template from-oci` makes one
//! (`docs/templates.md`). The upload is staged in the store and imported into the blob
//! store before the response starts, so a body that is not an image is a 400 and a name
//! taken is a 409; then the build's progress streams as NDJSON lines
//! ([`TemplateImportEvent`]). The API never names a host path: the image is the body.

use super::upload::{receive, Staged};
use crate::error::ApiError;
use crate::extract::QueryArgs;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use forkvm_api::{ImportOciQuery, TemplateImportEvent};
use forkvm_image::oci::defaults::ImageDefaults;
use forkvm_image::oci::template_file::{save_template, template_text, TemplateFileError, TemplateOptions};
use forkvm_image::oci::OciError;
use forkvm_image::rootfs::catalog::{is_template_name, BUILT_IN};
use forkvm_image::rootfs::Catalog;
use forkvm_snapshot::chain;
use std::time::Instant;

/// The largest image archive accepted.
pub const MAX_IMAGE_UPLOAD: u64 = 64 << 30;

pub async fn import_oci(
    State(s): State<AppState>,
    QueryArgs(q): QueryArgs<ImportOciQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let staged = Staged(s.blocking(|s| Ok(chain::new_staging_dir(&s.store, "image")?)).await?);
    let path = staged.0.join("image.tar");
    // The whole body first, even for a request refused below: a client still writing
    // its upload would see its connection cut, not the reason.
    receive(body, &path, MAX_IMAGE_UPLOAD, "the image archive").await?;
    check_name(&q)?;
    let name = q.name.clone();
    let first = s
        .blocking(move |_| {
            let store = forkvm_image::oci::configured_store();
            let image = forkvm_image::oci::import(&path, &store).map_err(import_error)?;
            drop(staged);
            let defaults = ImageDefaults::from_config(&image.config);
            let start = defaults
                .start_service(q.start.clone(), q.start_image_command)
                .map_err(|e| ApiError::bad_request(format!("start_image_command: {e}")))?;
            let options = TemplateOptions { start, ready: q.ready.clone(), vcpus: q.vcpus, memory_mib: q.memory_mib };
            let text = template_text(&q.name, &image, &defaults, &options).map_err(file_error)?;
            save_template(Catalog::configured().dir(), &q.name, &text, q.force).map_err(file_error)?;
            tracing::info!(template = %q.name, manifest = %image.manifest, layers = image.layers.len(),
                new_bytes = image.new_bytes, shared_bytes = image.shared_bytes, "imported an OCI image");
            Ok(TemplateImportEvent::Imported {
                manifest: image.manifest.to_string(),
                layers: image.layers.len() as u32,
                new_bytes: image.new_bytes,
                shared_bytes: image.shared_bytes,
                command: defaults.command,
                exposed_ports: defaults.exposed_ports,
            })
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let snapshot = q.snapshot;
    tokio::task::spawn_blocking(move || {
        let send = |e: &TemplateImportEvent| {
            let _ = tx.blocking_send(super::run::ndjson_line(e));
        };
        send(&first);
        let last = match build(&name, snapshot, &send) {
            Ok(()) => TemplateImportEvent::Done { template: name.clone() },
            Err(error) => {
                tracing::warn!(template = %name, %error, "building an imported template failed");
                TemplateImportEvent::Error { error }
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

/// Builds the template's image (and snapshot), reporting each step.
fn build(name: &str, snapshot: bool, send: &dyn Fn(&TemplateImportEvent)) -> Result<(), String> {
    let started = Instant::now();
    let artifacts = forkvm_sandbox::Artifacts::ensure(name, &mut |event| {
        tracing::info!(template = %name, ?event, "building template artefacts");
    })
    .map_err(|e| e.to_string())?;
    send(&TemplateImportEvent::Built {
        image_bytes: artifacts.image.size_bytes,
        seconds: started.elapsed().as_secs_f64(),
    });
    if snapshot {
        let started = Instant::now();
        forkvm_sandbox::ensure_template_snapshot(artifacts).map_err(|e| e.to_string())?;
        send(&TemplateImportEvent::Snapshot { seconds: started.elapsed().as_secs_f64() });
    }
    Ok(())
}

/// A plain name, not a built-in template's (the API never shadows what the operator
/// ships), and not taken unless `force`.
fn check_name(q: &ImportOciQuery) -> Result<(), ApiError> {
    if !is_template_name(&q.name) {
        return Err(ApiError::bad_request(format!(
            "{:?} is not a template name (1-64 letters, digits, '-' or '_')",
            q.name.chars().take(80).collect::<String>()
        )));
    }
    if BUILT_IN.iter().any(|(n, _)| *n == q.name) {
        return Err(ApiError::conflict(format!("{:?} is a built-in template's name", q.name), "built-in"));
    }
    let file = Catalog::configured().dir().join(format!("{}.toml", q.name));
    if file.exists() && !q.force {
        return Err(ApiError::conflict(
            format!("template {:?} exists already (force=true replaces it)", q.name),
            "exists",
        ));
    }
    Ok(())
}

fn import_error(e: OciError) -> ApiError {
    match e {
        OciError::Source { .. } | OciError::Invalid(_) | OciError::DigestMismatch { .. } => {
            ApiError::bad_request(format!("the body is not a usable image: {e}"))
        }
        OciError::MissingBlob { .. } | OciError::Store { .. } => ApiError::internal(e.to_string()),
    }
}

fn file_error(e: TemplateFileError) -> ApiError {
    match e {
        TemplateFileError::Exists(_) => ApiError::conflict(e.to_string(), "exists"),
        TemplateFileError::BadName(_) | TemplateFileError::Invalid(_) => ApiError::bad_request(e.to_string()),
        TemplateFileError::Write { .. } => ApiError::internal(e.to_string()),
    }
}
