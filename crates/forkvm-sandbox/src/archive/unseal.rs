//! Turning an encrypted archive back into something a VMM can restore from.
//!
//! Why this exists: a VMM restores from a snapshot directory (`vmstate.bin`,
//! `memory.img`, `disk/`). For an encrypted archive that directory is rebuilt in the
//! restored sandbox's own run directory (local, like its live disk): the state is
//! unsealed, the memory decrypted from the vault in full (the VMM maps it), and the
//! read-only images linked. Layered disks are not decrypted here: the VMM serves them
//! lazily from the same vault snapshot, standing in for the layers the saved state
//! names, until their first seal settles them (`blk/lazy.rs`).

use super::format::{ArchiveManifest, MEMORY_DISK_ID, VMSTATE_SEALED};
use super::seal::vmstate_label;
use super::ArchiveError;
use crate::disk_snapshots::{keys_dir, open_vault, vault_dir};
use crate::run_dir::RunDir;
use crate::source::{SpawnSource, VaultLower};
use forkvm_snapshot::vault::KeyStore;
use forkvm_snapshot::{Store, DISK_DIR, MEMORY_IMG, SNAPSHOT_JSON, VMSTATE_BIN};
use forkvm_vmm::devices::virtio::blk::LazySource;
use std::path::Path;

/// Largest sealed state read back.
const MAX_STATE_BYTES: u64 = 1 << 30;

/// Rebuilds archive `dir` (described by `m`) of sandbox `id` under `run_dir` and returns
/// the source to start its VMM from.
pub(crate) fn unseal(
    store: &Store,
    id: &str,
    dir: &Path,
    m: &ArchiveManifest,
    run_dir: &Path,
) -> Result<SpawnSource, ArchiveError> {
    let io = |step: &'static str| move |source| ArchiveError::Io { id: id.to_string(), step: step.into(), source };
    let step = |step: &'static str| move |e: String| ArchiveError::Step { id: id.to_string(), step, reason: e };
    let image = RunDir::at(run_dir).restored_image();
    let _ = std::fs::remove_dir_all(&image);
    std::fs::create_dir_all(image.join(DISK_DIR)).map_err(io("creating the restore directory"))?;

    let vault = open_vault(store, id).map_err(|e| step("opening the vault")(e.to_string()))?;
    let state = vault
        .read_sealed_file(&dir.join(VMSTATE_SEALED), &vmstate_label(m.vault_seq), MAX_STATE_BYTES)
        .map_err(|e| step("unsealing the vCPU and device state")(e.to_string()))?;
    std::fs::write(image.join(VMSTATE_BIN), state).map_err(io("writing the state"))?;
    std::fs::copy(dir.join(SNAPSHOT_JSON), image.join(SNAPSHOT_JSON)).map_err(io("copying snapshot.json"))?;
    for entry in std::fs::read_dir(dir.join(DISK_DIR)).map_err(io("listing the archive's disks"))? {
        let entry = entry.map_err(io("listing the archive's disks"))?;
        forkvm_snapshot::link_or_copy(&entry.path(), &image.join(DISK_DIR).join(entry.file_name()))
            .map_err(io("linking a disk image"))?;
    }

    let layer_dir = image.join("memory-layer");
    let restored = vault
        .restore_layer(m.vault_seq, MEMORY_DISK_ID, &layer_dir)
        .map_err(|e| step("decrypting the memory")(e.to_string()))?;
    if restored.disk_size != m.memory_bytes {
        return Err(step("decrypting the memory")(format!(
            "the vault holds {} bytes, the archive says {}",
            restored.disk_size, m.memory_bytes
        )));
    }
    std::fs::rename(layer_dir.join(forkvm_snapshot::layered_disk::DATA_FILE), image.join(MEMORY_IMG))
        .map_err(io("placing the memory image"))?;
    std::fs::remove_dir_all(&layer_dir).map_err(io("removing the memory layer's bitmap"))?;

    let mut source = SpawnSource::from_dir(&image)?;
    let key = KeyStore::open(&keys_dir())
        .and_then(|k| k.sandbox_key(id))
        .map_err(|e| step("unlocking the vault")(e.to_string()))?;
    for d in &m.disks {
        let saved = source.meta.devices.as_ref().and_then(|v| v.disks.get(d.index)).and_then(|x| x.layers.clone());
        if saved.as_ref() != Some(&d.layers) {
            return Err(step("matching the archive's disks")(format!(
                "disk {} (index {}) has layers {saved:?} in snapshot.json, {:?} in archive.json",
                d.id, d.index, d.layers
            )));
        }
        let lazy = LazySource {
            vault: vault_dir(store, id),
            key: key.clone(),
            seq: m.vault_seq,
            disk_id: d.id.clone(),
            cache: RunDir::at(run_dir)
                .disks()
                .join(format!("disk{}", d.index))
                .join(format!("from-archive-{}", m.vault_seq)),
            playbook: None,
            prefetch: false,
        };
        // Opened once here so that a bad snapshot fails this call, not the VMM.
        lazy.open().map_err(|e| step("opening the disk snapshot lazily")(e.to_string()))?;
        source.vault_lowers.push(VaultLower { index: d.index, source: lazy, replaces: d.layers.clone() });
    }
    Ok(source)
}
