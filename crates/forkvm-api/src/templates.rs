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
