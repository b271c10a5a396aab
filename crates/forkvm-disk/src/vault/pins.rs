//! Pins: snapshots that retention must keep because something still reads them lazily.
//!
//! Why this exists: a lazily restored disk ([`super::VaultLayer`]) fetches chunks long
//! after its restore started, without holding the vault's lock (holding it would stall
//! the source sandbox's own snapshots). Retention would otherwise delete a snapshot
//! and its chunks from under it. A pin is an empty file `pins/<seq, 16 digits>.<holder>`;
//! [`Vault::retain`] keeps every pinned snapshot that exists.
//!
//! Ordering: a pin is created under the shared lock after the manifest was read, and
//! retention lists pins under the exclusive lock, so either retention sees the pin or
//! the pinning reader sees the manifest already gone (and fails with `not_found`).
//! A pin outlives the process: it belongs to the cache directory that still needs the
//! chunks, and is removed when that cache is complete (`VaultLayer::seal_cache`) or
//! discarded (`VaultLayer::discard`, [`Vault::unpin`]).
//!
//! **Anchors.** A holder can die without unpinning (a VMM killed by SIGKILL before its
//! lazy disk settled). So a pin may name an *anchor*, the path whose existence is the
//! reason for the pin (a lazy layer's cache directory, an archive's directory), as the
//! pin file's content. Retention drops a pin whose anchor is gone, once the pin is
//! older than [`ANCHOR_GRACE`] (the anchor may be created just after its pin). A pin
//! without an anchor (an empty file) is kept until it is removed.
//!
//! A lazy layer's pin (holder `lazy-…`, [`LAZY_HOLDER_PREFIX`]) is made only once its
//! cache exists, so it needs no grace: its cache gone, it is stale at once. (The VMM
//! that held it runs under a uid of its own and cannot remove it; its run directory,
//! cache included, goes when it stops.)
//!
//! **Settled anchors.** A lazily restoring VMM runs under a uid of its own and cannot
//! remove its pin when its cache is complete (the pins are root's). So a pin whose
//! anchor holds a *sealed* layer bitmap (a settled lazy cache, see
//! [`super::lazy`]) is dropped too, at once: that cache no longer reads the vault. The
//! anchor lives in the VMM's own run directory, so a VMM that seals it early only stops
//! protecting its own restore.

use super::fsutil::{self, create_dir};
use super::{io_err, validate_name, Vault, VaultError};
use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The pins directory inside a vault.
pub(crate) const PINS_DIR: &str = "pins";
/// A pin: the snapshot's sequence number and the holder's name.
pub type Pin = (u64, String);
/// How long a pin whose anchor does not exist is still honoured.
pub const ANCHOR_GRACE: std::time::Duration = std::time::Duration::from_secs(600);
/// The holder names of lazy layers' pins start so (see the module doc).
pub const LAZY_HOLDER_PREFIX: &str = "lazy-";
/// Longest anchor path read back.
const MAX_ANCHOR_BYTES: u64 = 4096;

/// Removes `holder`'s pin of `seq` in the vault at `vault_root` (Ok if there is none).
/// Needs no key: a caller that lets go of a snapshot (a deleted archive) may no longer
/// be able to unlock the vault, and must still not keep the snapshot forever.
pub fn remove_pin(vault_root: &Path, seq: u64, holder: &str) -> Result<(), VaultError> {
    validate_name("pin holder", holder)?;
    let dir = vault_root.join(PINS_DIR);
    let path = dir.join(format!("{seq:016}.{holder}"));
    match fs::remove_file(&path) {
        Ok(()) => fsutil::sync_dir(&dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("removing pin", &path)(e)),
    }
}

impl Vault {
    fn pin_path(&self, seq: u64, holder: &str) -> PathBuf {
        self.root.join(PINS_DIR).join(format!("{seq:016}.{holder}"))
    }

    /// Pins snapshot `seq` for `holder` (a name, see [`super::validate_name`]): retention
    /// keeps it until [`Vault::unpin`]. Fails with `not_found` if the snapshot is gone.
    pub fn pin(&self, seq: u64, holder: &str) -> Result<(), VaultError> {
        self.pin_while(seq, holder, None)
    }

    /// [`Vault::pin`] for as long as `anchor` exists (see the module doc); `None`: until
    /// [`Vault::unpin`].
    pub fn pin_while(&self, seq: u64, holder: &str, anchor: Option<&Path>) -> Result<(), VaultError> {
        validate_name("pin holder", holder)?;
        let _lock = self.lock(libc::LOCK_SH)?;
        self.load(seq)?;
        self.pin_locked(seq, holder, anchor)
    }

    /// Creates (or re-anchors) the pin file; the caller holds the lock and has checked
    /// the manifest.
    pub(crate) fn pin_locked(&self, seq: u64, holder: &str, anchor: Option<&Path>) -> Result<(), VaultError> {
        use std::io::Write;
        use std::os::unix::ffi::OsStrExt;
        let dir = self.root.join(PINS_DIR);
        create_dir(&dir, 0o700)?;
        let path = self.pin_path(seq, holder);
        let anchor =
            anchor.map(std::path::absolute).transpose().map_err(io_err("resolving the pin's anchor", &path))?;
        let content = anchor.as_ref().map_or(&[][..], |a| a.as_os_str().as_bytes());
        let existed = path.exists();
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err("creating pin", &path))?;
        f.write_all(content).and_then(|()| f.sync_all()).map_err(io_err("writing pin", &path))?;
        if existed {
            Ok(())
        } else {
            fsutil::sync_dir(&dir)
        }
    }

    /// Removes `holder`'s pin of `seq` (Ok if there is none).
    pub fn unpin(&self, seq: u64, holder: &str) -> Result<(), VaultError> {
        remove_pin(&self.root, seq, holder)
    }

    /// Every pin, as `(seq, holder)`, sorted. Names that are not pins are ignored.
    pub fn pins(&self) -> Result<Vec<Pin>, VaultError> {
        Ok(list_pins(&self.root)?.into_iter().map(|(seq, holder, _)| (seq, holder)).collect())
    }

    /// The sequence numbers of live pins, and the pins dropped: those whose anchor is
    /// gone (past [`ANCHOR_GRACE`]) are removed and not counted. Under the exclusive lock.
    pub(crate) fn pinned_seqs(&self) -> Result<(BTreeSet<u64>, Vec<Pin>), VaultError> {
        let (mut live, mut stale) = (BTreeSet::new(), Vec::new());
        for (seq, holder) in self.pins()? {
            if pin_is_stale(&self.pin_path(seq, &holder), &holder) {
                remove_pin(&self.root, seq, &holder)?;
                stale.push((seq, holder));
            } else {
                live.insert(seq);
            }
        }
        Ok((live, stale))
    }
}

/// The holders of the live pins in the vault at `vault_root` (stale ones, see the module
/// doc, left out), read without the key: who still reads this vault's snapshots.
pub fn live_holders(vault_root: &Path) -> Result<Vec<String>, VaultError> {
    let mut out: Vec<String> = list_pins(vault_root)?
        .into_iter()
        .filter(|(_, holder, path)| !pin_is_stale(path, holder))
        .map(|(_, holder, _)| holder)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every pin file in the vault at `vault_root` as `(seq, holder, path)`, sorted; names
/// that are not pins are ignored. Needs no key.
fn list_pins(vault_root: &Path) -> Result<Vec<(u64, String, PathBuf)>, VaultError> {
    let dir = vault_root.join(PINS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("listing pins", &dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("listing pins", &dir))?;
        let name = entry.file_name();
        let Some((seq, holder)) = name.to_str().and_then(|n| n.split_once('.')) else { continue };
        if seq.len() != 16 || !seq.bytes().all(|c| c.is_ascii_digit()) || validate_name("", holder).is_err() {
            continue;
        }
        out.extend(seq.parse::<u64>().ok().map(|s| (s, holder.to_string(), entry.path())));
    }
    out.sort();
    Ok(out)
}

/// Whether the pin at `path`, `holder`'s, names an anchor that no longer exists (and is
/// older than [`ANCHOR_GRACE`], unless a lazy layer's) or that holds a sealed layer.
fn pin_is_stale(path: &Path, holder: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let content = match super::fsutil::read_capped(path, MAX_ANCHOR_BYTES) {
        Ok(c) => c,
        // Removed meanwhile, or unreadable (kept: never drop a pin by mistake).
        Err(_) => return false,
    };
    if content.is_empty() {
        return false;
    }
    let anchor = Path::new(std::ffi::OsStr::from_bytes(&content));
    if std::fs::symlink_metadata(anchor).is_ok() {
        // A settled lazy cache (see the module doc).
        return crate::layered_disk::dir_holds_sealed_layer(anchor);
    }
    if holder.starts_with(LAZY_HOLDER_PREFIX) {
        return true;
    }
    let age = fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    age.is_some_and(|a| a > ANCHOR_GRACE)
}
