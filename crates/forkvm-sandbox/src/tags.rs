//! Publishing a template snapshot under a tag in the snapshot store
//! (`forkvm snapshot create --image python --tag py`).
//!
//! The template snapshot (cache, keyed by content hash) is made on first use: boot, wait
//! for the agent, run the template's warm-up, snapshot. The tag gets its own directory
//! whose files are hard links to the template snapshot's (both are immutable once
//! written; copies across filesystems), disks included, so the tag stays valid
//! when the cache is deleted.

use crate::template_snapshot::TemplateSnapshot;
use forkvm_snapshot::{
    link_or_copy, SnapshotDir, SnapshotStatus, SnapshotWriter, Store, StoreError, DISK_DIR, MEMORY_IMG, SNAPSHOT_JSON,
    VMSTATE_BIN,
};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("publishing tag {tag}: {step}: {source}")]
    Io { tag: String, step: String, source: std::io::Error },
    #[error("publishing tag {tag}: {source}")]
    Dir { tag: String, source: forkvm_snapshot::DirError },
    #[error("publishing tag {tag}: {source}")]
    Meta { tag: String, source: forkvm_snapshot::MetadataError },
    #[error("the tag's default limits: {0}")]
    Limit(#[from] crate::start::LimitError),
    #[error("the tag's default network policy: {0}")]
    Network(#[from] crate::network::policy::PolicyError),
}

impl PublishError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            PublishError::Store(e) => e.code(),
            PublishError::Limit(_) | PublishError::Network(_) => forkvm_api::ErrorCode::BadRequest,
            PublishError::Dir { source: forkvm_snapshot::DirError::AlreadyExists(_), .. } => {
                forkvm_api::ErrorCode::Conflict
            }
            _ => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// Checks a tag's defaults: the limits in bounds, the policy's entries well-formed
/// (callers check before a template's minutes-long first boot; [`publish_template`]
/// again).
pub fn check_tag_defaults(
    defaults: &crate::SpawnOptions,
    network: Option<&forkvm_api::NetworkPolicy>,
) -> Result<(), PublishError> {
    defaults.validate()?;
    if let Some(p) = network {
        crate::network::policy::EgressPolicy::parse(p)?;
    }
    Ok(())
}

/// Publishes `template`'s snapshot as `tag` in `store`, with `defaults` as the limits and
/// `network` as the egress policy a sandbox spawned from the tag gets unless its spawn
/// asks otherwise; a taken tag is a conflict, and limits out of bounds or a bad policy
/// are refused before anything is written.
pub fn publish_template(
    store: &Store,
    template: &TemplateSnapshot,
    tag: &str,
    defaults: &crate::SpawnOptions,
    network: Option<&forkvm_api::NetworkPolicy>,
) -> Result<SnapshotDir, PublishError> {
    check_tag_defaults(defaults, network)?;
    let final_dir = store.check_free(tag)?;
    store.ensure()?;
    let src = SnapshotDir::open(&template.dir)
        .map_err(|source| StoreError::Invalid { tag: template.artifacts.image.name.clone(), source })?;
    let dir_err = |source| PublishError::Dir { tag: tag.to_string(), source };
    let writer = SnapshotWriter::begin(&final_dir).map_err(dir_err)?;
    let io = |step: String| move |source| PublishError::Io { tag: tag.to_string(), step, source };
    for name in [VMSTATE_BIN, MEMORY_IMG] {
        link_or_copy(&src.path.join(name), &writer.path(name)).map_err(io(format!("linking {name}")))?;
    }
    link_tree(&src.path.join(DISK_DIR), &writer.staging().join(DISK_DIR)).map_err(io("linking disk/".into()))?;
    let mut meta = src.meta.clone();
    meta.tag = tag.to_string();
    meta.status = SnapshotStatus::Ready;
    meta.created_at_unix_ms = crate::registry::now_unix_ms();
    meta.template = Some(template.artifacts.image.name.clone());
    meta.guest.content_hash = Some(template.key.clone());
    meta.writer_pid = None;
    meta.default_limits = defaults.as_snapshot_defaults();
    meta.default_network = network.filter(|p| !p.is_default()).cloned();
    forkvm_snapshot::write_meta(&writer.path(SNAPSHOT_JSON), &meta)
        .map_err(|source| PublishError::Meta { tag: tag.to_string(), source })?;
    let path = writer.commit().map_err(dir_err)?;
    Ok(SnapshotDir { path, meta })
}

/// Recreates the directory tree `from` at `to`, every file hard-linked (copied across
/// filesystems): disk images and sealed layers are immutable.
fn link_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            link_tree(&entry.path(), &target)?;
        } else {
            link_or_copy(&entry.path(), &target)?;
        }
    }
    Ok(())
}
