//! FROM: the snapshot a build starts from, and the key its steps' keys grow from.
//!
//! FROM names, in this order: a template of the catalog (its template snapshot, booted
//! once and cached, published as the tag `build-base-<key>`), a tag of the store (a
//! previous build's result, say), or an OCI image — a layout directory or an archive,
//! relative to the build context or absolute, `oci:` in front optional — imported into
//! the template `oci-<manifest>` and then used as a template. Nothing else is fetched.

use super::{BuildError, BuildEvent};
use crate::template_snapshot::ensure_template_snapshot;
use crate::{publish_template, Artifacts, SpawnOptions};
use forkvm_image::dockerfile::Context;
use forkvm_image::kernel::BuildEvent as KernelEvent;
use forkvm_image::oci::defaults::ImageDefaults;
use forkvm_image::oci::template_file::{save_template, template_text, TemplateOptions};
use forkvm_image::rootfs::Catalog;
use forkvm_snapshot::{chain, Store};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The snapshot the first step forks.
#[derive(Debug, Clone)]
pub struct Base {
    pub tag: String,
    /// What the first step's key is chained to: the content the base stands for.
    pub key: String,
    /// Whether the base already existed (no boot, no import).
    pub cached: bool,
    /// `template`, `tag` or `oci`.
    pub kind: &'static str,
}

pub(super) const BASE_PREFIX: &str = "build-base-";

/// Resolves FROM `from` (line `line`), booting or importing what it needs.
pub fn resolve(
    from: &str,
    line: usize,
    context: &Context,
    store: &Store,
    events: &mut dyn FnMut(BuildEvent),
    kernel: &mut dyn FnMut(KernelEvent),
) -> Result<Base, BuildError> {
    let started = Instant::now();
    let catalog = Catalog::configured();
    let base = if catalog.get(from).is_ok() {
        from_template(from, store, kernel)?
    } else if let Ok(info) = chain::info(store, from) {
        // When it was made, not its content hash: the first step moves a whole-image tag
        // into the chunk store, which gives it a content hash it did not have.
        let made = info.created_at_unix_ms.to_string();
        Base { tag: from.to_string(), key: hash(&["tag", from, &made]), cached: true, kind: "tag" }
    } else if let Some(path) = context.dir().and_then(|dir| oci_path(from, dir)) {
        let name = import_oci(&path, &catalog)?;
        let mut b = from_template(&name, store, kernel)?;
        b.kind = "oci";
        b
    } else {
        return Err(BuildError::From {
            line,
            from: from.to_string(),
            detail: match context {
                Context::Dir(_) => format!(
                    "not a template (in {}), a snapshot tag, or an OCI image path in the build context",
                    catalog.dir().display()
                ),
                Context::Tar(_) => format!(
                    "not a template (in {}) or a snapshot tag (an OCI image through the API: import it first, POST /v1/templates/oci, and FROM that template)",
                    catalog.dir().display()
                ),
            },
        });
    };
    events(BuildEvent::Base {
        from: from.to_string(),
        kind: base.kind.to_string(),
        snapshot: base.tag.clone(),
        cached: base.cached,
        seconds: started.elapsed().as_secs_f64(),
    });
    Ok(base)
}

fn from_template(name: &str, store: &Store, kernel: &mut dyn FnMut(KernelEvent)) -> Result<Base, BuildError> {
    let artifacts = Artifacts::ensure(name, kernel).map_err(|e| BuildError::Base(format!("template {name}: {e}")))?;
    let template = ensure_template_snapshot(artifacts)
        .map_err(|e| BuildError::Base(format!("template {name}'s snapshot: {e}")))?;
    let key = hash(&["template", &template.key]);
    let tag = format!("{BASE_PREFIX}{}", &key[..24]);
    let mut cached = template.boot_seconds.is_none();
    if store.lookup(&tag).is_err() {
        publish_template(store, &template, &tag, &SpawnOptions::default(), None)
            .map_err(|e| BuildError::Base(format!("publishing template {name}'s snapshot as {tag}: {e}")))?;
        cached = false;
    }
    Ok(Base { tag, key, cached, kind: "template" })
}

/// FROM as an image path: `oci:` in front optional, relative to the context.
fn oci_path(from: &str, context: &Path) -> Option<PathBuf> {
    let p = Path::new(from.strip_prefix("oci:").unwrap_or(from));
    let path = if p.is_absolute() { p.to_path_buf() } else { context.join(p) };
    path.exists().then_some(path)
}

/// Imports the image at `path` as the template `oci-<manifest digest, 16 hex>`, unless
/// that template exists (same manifest, same template).
fn import_oci(path: &Path, catalog: &Catalog) -> Result<String, BuildError> {
    let blobs = forkvm_image::oci::configured_store();
    let image =
        forkvm_image::oci::import(path, &blobs).map_err(|e| BuildError::Base(format!("{}: {e}", path.display())))?;
    let manifest = image.manifest.to_string();
    let hex = manifest.rsplit(':').next().unwrap_or(&manifest);
    let name = format!("oci-{}", &hex[..16.min(hex.len())]);
    if catalog.get(&name).is_ok() {
        return Ok(name);
    }
    let defaults = ImageDefaults::from_config(&image.config);
    let options = TemplateOptions { start: None, ready: None, vcpus: None, memory_mib: None };
    let text = template_text(&name, &image, &defaults, &options).map_err(|e| BuildError::Base(e.to_string()))?;
    save_template(catalog.dir(), &name, &text, false).map_err(|e| BuildError::Base(e.to_string()))?;
    Ok(name)
}

/// Hex SHA-256 of `parts`, each ended by a zero byte.
pub(super) fn hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    forkvm_image::dockerfile::context::hex(&h.finalize())
}
