//! Turning a capture of a paused sandbox into an encrypted archive (format in
//! [`super::format`]).
//!
//! Why this exists: a branch writes a sandbox as plaintext files — `memory.img`,
//! `vmstate.bin`, its disks' sealed layers. The archive path has the branch write them
//! into the sandbox's own run directory (local, like its live disk) with its disks only
//! referenced, then moves them into the store encrypted: memory and sealed layers as one
//! vault snapshot, the state as a sealed file. Only names, sizes and the read-only
//! images it was started from reach the store readable.

use super::format::{
    ArchiveManifest, ArchivedDisk, ARCHIVED_RECORD, ARCHIVE_FORMAT, ARCHIVE_PIN, MEMORY_BASE_KEY, MEMORY_DISK_ID,
    VMSTATE_SEALED,
};
use super::ArchiveError;
use crate::disk_grant::{DiskGrant, Kind};
use crate::disk_snapshots::{base_key, open_vault, write_owner, VaultOwner};
use crate::registry::SandboxRecord;
use forkvm_snapshot::layered_disk::SealedLayerBuilder;
use forkvm_snapshot::vault::{DiskInput, Vault};
use forkvm_snapshot::{DiskReferences, LayerId, Store, DISK_DIR, MEMORY_IMG, SNAPSHOT_JSON, VMSTATE_BIN};
use std::path::{Path, PathBuf};

/// The label binding an archive's sealed state to its vault snapshot.
pub(super) fn vmstate_label(seq: u64) -> String {
    format!("archive {seq} {VMSTATE_BIN}")
}

/// Seals `capture` (a full branch of `record`'s sandbox taken with its disks
/// referenced) into `out` (created, must not exist) and a new snapshot of the
/// sandbox's vault, pinned for the archive. `capture`'s memory image is consumed.
pub(super) fn seal_capture(
    store: &Store,
    record: &SandboxRecord,
    capture: &Path,
    out: &Path,
) -> Result<ArchiveManifest, ArchiveError> {
    let id = record.id.as_str();
    let io = |step: &str| {
        let step = step.to_string();
        move |source: std::io::Error| ArchiveError::Io { id: id.to_string(), step, source }
    };
    let meta = forkvm_snapshot::read_meta(&capture.join(SNAPSHOT_JSON))
        .map_err(|e| io("reading the capture's description")(std::io::Error::other(e)))?;
    let devices = meta.devices.clone().unwrap_or_default();
    if let Some(d) = devices.disks.iter().find(|d| !d.has_plain_name()) {
        let named = format!("disk {:?} has a file or layer name that is not a plain name", d.file);
        return Err(io("reading the capture's description")(std::io::Error::other(named)));
    }
    std::fs::create_dir_all(out.join(DISK_DIR)).map_err(io("creating the archive directory"))?;

    // Disks: read-only images and bases are linked (they hold nothing the sandbox
    // wrote); layered disks' sealed layers go to the vault.
    let captured_disks = capture.join(DISK_DIR);
    let refs = DiskReferences::read(&captured_disks)
        .map_err(|e| io("reading the capture's disk references")(std::io::Error::other(e)))?;
    let grant = DiskGrant::of(store, record);
    let resolve = |name: &str, kind: Kind| {
        let named = refs.get(name).map_err(std::io::Error::other)?;
        grant.check(named, kind)
    };
    let mut inputs = Vec::new();
    let mut archived = Vec::new();
    for (index, d) in devices.disks.iter().enumerate() {
        let file = resolve(&d.file, Kind::File).map_err(io(&format!("finding disk {}", d.id)))?;
        match &d.layers {
            // A layered disk nothing was written to is its base alone.
            Some(layers) if !layers.is_empty() => {
                let dirs = layers
                    .iter()
                    .map(|l| resolve(&format!("{}.layers/{l}", d.file), Kind::Dir))
                    .collect::<Result<Vec<PathBuf>, _>>()
                    .map_err(io(&format!("finding the layers of disk {}", d.id)))?;
                let base_key = base_key(&file).map_err(io(&format!("identifying the base of disk {}", d.id)))?;
                inputs.push(DiskInput { id: d.id.clone(), base_key, layers: dirs });
                archived.push(ArchivedDisk { index, id: d.id.clone(), layers: layers.clone() });
            }
            None if !d.read_only => {
                return Err(io(&format!("archiving disk {}", d.id))(std::io::Error::other(
                    "it is a writable raw image, which cannot be archived encrypted (only layered disks can)",
                )))
            }
            _ => {}
        }
        forkvm_snapshot::link_or_copy(&file, &out.join(DISK_DIR).join(&d.file))
            .map_err(io(&format!("linking disk {} into the archive", d.id)))?;
    }

    // Memory: the image becomes a sealed layer over an all-zero base (its non-zero pages).
    let memory_layer = capture.join("memory-layer");
    let layer = SealedLayerBuilder::adopt(&memory_layer, &capture.join(MEMORY_IMG), LayerId::BASE)
        .map_err(|e| io("preparing the memory image")(std::io::Error::other(e)))?;
    if layer.disk_size() != meta.mem_size_bytes {
        return Err(io("checking the memory image")(std::io::Error::other(format!(
            "{} bytes, the capture says {}",
            layer.disk_size(),
            meta.mem_size_bytes
        ))));
    }
    drop(layer);
    inputs.push(DiskInput { id: MEMORY_DISK_ID.into(), base_key: MEMORY_BASE_KEY.into(), layers: vec![memory_layer] });

    let vault = open_vault(store, id).map_err(|e| ArchiveError::Step {
        id: id.into(),
        step: "opening the vault",
        reason: e.to_string(),
    })?;
    write_owner(store, id, &VaultOwner::of(record)).map_err(io("recording the vault's owner"))?;
    let info = vault.snapshot(&inputs).map_err(vault_err(id, "writing memory and disks to the vault"))?;
    // Pinned while the archive exists (its final directory: a pin outlives a crash).
    let anchor = super::format::archives_dir(store).join(id);
    vault
        .pin_while(info.seq, ARCHIVE_PIN, Some(&anchor))
        .map_err(vault_err(id, "pinning the archive's vault snapshot"))?;
    let written = write_files(&vault, record, capture, out, info.seq);
    let manifest = ArchiveManifest {
        format: ARCHIVE_FORMAT,
        sandbox_id: id.to_string(),
        vault_seq: info.seq,
        memory_bytes: meta.mem_size_bytes,
        disks: archived,
        created_unix_ms: crate::registry::now_unix_ms(),
    };
    let committed =
        written.and_then(|()| super::format::write_manifest(out, &manifest).map_err(io("writing archive.json")));
    if let Err(e) = committed {
        let _ = vault.unpin(info.seq, ARCHIVE_PIN);
        return Err(e);
    }
    Ok(manifest)
}

/// The sealed state, the description and the record.
fn write_files(
    vault: &Vault,
    record: &SandboxRecord,
    capture: &Path,
    out: &Path,
    seq: u64,
) -> Result<(), ArchiveError> {
    let id = record.id.as_str();
    let io = |step: &'static str| move |source| ArchiveError::Io { id: id.to_string(), step: step.into(), source };
    let state = std::fs::read(capture.join(VMSTATE_BIN)).map_err(io("reading the captured state"))?;
    vault
        .write_sealed_file(&out.join(VMSTATE_SEALED), &vmstate_label(seq), &state)
        .map_err(vault_err(id, "sealing the vCPU and device state"))?;
    std::fs::copy(capture.join(SNAPSHOT_JSON), out.join(SNAPSHOT_JSON)).map_err(io("copying snapshot.json"))?;
    let json = serde_json::to_vec_pretty(record).expect("a record serializes");
    std::fs::write(out.join(ARCHIVED_RECORD), json).map_err(io("saving the sandbox record"))
}

fn vault_err<'a>(
    id: &'a str,
    step: &'static str,
) -> impl FnOnce(forkvm_snapshot::vault::VaultError) -> ArchiveError + 'a {
    move |e| ArchiveError::Step { id: id.to_string(), step, reason: e.to_string() }
}
