//! [`PackWriter`]: writes packs crash-safely into `<out>.partial`, renamed into place once synced.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::sparse::SparseEncoder;
use super::{
    check_name, io_err, padding, shown, PackEntry, PackError, PackLimits, PackManifest, SparseExtents, BLOCK, CHUNK,
    PACK_FORMAT, PACK_MANIFEST, PACK_VERSION,
};

/// zstd compression level used by [`PackWriter`].
const ZSTD_LEVEL: i32 = 3;

/// Writes a pack into `<out>.partial` and renames it to `out` in [`PackWriter::finish`].
///
/// Dropping a writer without finishing it removes `<out>.partial`. After an I/O error while writing an entry
/// the writer is unusable (every later call fails) and should be dropped.
pub struct PackWriter {
    out: PathBuf,
    partial: PathBuf,
    encoder: Option<zstd::Encoder<'static, File>>,
    entries: Vec<PackEntry>,
    names: HashSet<String>,
    buf: Vec<u8>,
    failed: bool,
    published: bool,
}

impl fmt::Debug for PackWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackWriter")
            .field("out", &self.out)
            .field("partial", &self.partial)
            .field("entries", &self.entries.len())
            .field("failed", &self.failed)
            .field("published", &self.published)
            .finish()
    }
}

impl PackWriter {
    /// Creates `<out>.partial` next to `out` (refusing with [`PackError::Exists`] if `out` or the partial file
    /// already exists) and starts a zstd stream at level 3 with the frame checksum enabled.
    ///
    /// Compression is single-threaded: the workspace's `zstd` dependency lacks the `zstdmt` feature.
    pub fn create(out: &Path) -> Result<PackWriter, PackError> {
        let partial = partial_path(out)?;
        match fs::symlink_metadata(out) {
            Ok(_) => return Err(PackError::Exists(out.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(PackError::Io { step: "check output path", path: out.to_path_buf(), source }),
        }
        let file = OpenOptions::new().write(true).create_new(true).mode(0o644).open(&partial).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                PackError::Exists(partial.clone())
            } else {
                PackError::Io { step: "create", path: partial.clone(), source }
            }
        })?;
        // From here on, dropping `writer` removes the partial file.
        let mut writer = PackWriter {
            out: out.to_path_buf(),
            partial,
            encoder: None,
            entries: Vec::new(),
            names: HashSet::new(),
            buf: Vec::new(),
            failed: false,
            published: false,
        };
        let encoder = zstd::Encoder::new(file, ZSTD_LEVEL)
            .and_then(|mut enc| enc.include_checksum(true).map(|()| enc))
            .map_err(io_err("start zstd compression of", &writer.partial))?;
        writer.encoder = Some(encoder);
        Ok(writer)
    }

    /// Adds an entry named `name` holding `data`.
    pub fn add_bytes(&mut self, name: &str, data: &[u8]) -> Result<(), PackError> {
        self.add_stream(name, data.len() as u64, &mut &data[..], Path::new("<memory>"))
    }

    /// Streams the regular file at `path` into an entry named `name`, hashing it on the way (never holding it
    /// whole in memory). Holes in sparse files are read (and compressed) as zeros.
    ///
    /// The size is taken when the file is opened; a file that shrinks while being read is an error, and
    /// bytes appended meanwhile are not packed.
    pub fn add_file(&mut self, name: &str, path: &Path) -> Result<(), PackError> {
        self.check_new_name(name)?;
        let mut file = File::open(path).map_err(io_err("open source file", path))?;
        let meta = file.metadata().map_err(io_err("stat source file", path))?;
        if !meta.is_file() {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
            return Err(io_err("pack source file", path)(e));
        }
        self.add_stream(name, meta.len(), &mut file, path)
    }

    /// Streams the regular file at `path` as a sparse entry holding only `extents` (see
    /// [`SparseExtents`]): the entry costs the extents' bytes, not the file's size.
    /// `extents.size()` must be the file's size.
    pub fn add_sparse_file(&mut self, name: &str, path: &Path, extents: &SparseExtents) -> Result<(), PackError> {
        self.check_new_name(name)?;
        let file = File::open(path).map_err(io_err("open source file", path))?;
        let meta = file.metadata().map_err(io_err("stat source file", path))?;
        if !meta.is_file() || meta.len() != extents.size() {
            let msg = format!("not a regular file of {} bytes", extents.size());
            return Err(io_err("pack source file", path)(io::Error::new(io::ErrorKind::InvalidInput, msg)));
        }
        let mut encoder = SparseEncoder::new(&file, extents);
        self.add_stream(name, extents.encoded_len(), &mut encoder, path)
    }

    /// Writes one entry of exactly `size` bytes read from `src` (`src_path` names it in errors).
    fn add_stream(&mut self, name: &str, size: u64, src: &mut impl Read, src_path: &Path) -> Result<(), PackError> {
        self.check_new_name(name)?;
        let header = entry_header(name, size)?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(CHUNK, 0);
        let enc = match (self.failed, self.encoder.as_mut()) {
            (false, Some(enc)) => enc,
            _ => return Err(failed_error(&self.partial)),
        };
        // Until this entry is complete, the archive is inconsistent.
        self.failed = true;
        let partial = &self.partial;
        let write_err = |source| PackError::Io { step: "write", path: partial.clone(), source };
        enc.write_all(header.as_bytes()).map_err(write_err)?;
        let mut hasher = blake3::Hasher::new();
        let mut remaining = size;
        while remaining > 0 {
            let want = usize::try_from(remaining).unwrap_or(usize::MAX).min(buf.len());
            let n = match src.read(&mut buf[..want]) {
                Ok(0) => {
                    let msg = format!("shrank while being packed: {} of {size} bytes read", size - remaining);
                    return Err(io_err("read", src_path)(io::Error::new(io::ErrorKind::UnexpectedEof, msg)));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("read", src_path)(e)),
            };
            hasher.update(&buf[..n]);
            enc.write_all(&buf[..n]).map_err(write_err)?;
            remaining -= n as u64;
        }
        enc.write_all(&[0u8; BLOCK as usize][..padding(size)]).map_err(write_err)?;
        self.buf = buf;
        self.failed = false;
        self.names.insert(name.to_string());
        let blake3 = hasher.finalize().to_hex().to_string();
        self.entries.push(PackEntry { name: name.to_string(), size, blake3 });
        Ok(())
    }

    /// Appends [`PACK_MANIFEST`] (with `meta`) as the last entry, finishes the tar and zstd streams, fsyncs,
    /// and renames `<out>.partial` to `out` (refusing with [`PackError::Exists`] if `out` appeared meanwhile).
    /// Returns the pack's size in bytes and the manifest written.
    pub fn finish(self, meta: serde_json::Value) -> Result<(u64, PackManifest), PackError> {
        self.finish_signed(meta, None)
    }

    /// [`PackWriter::finish`], signing the manifest with `key` when given (see [`super::signature`]).
    pub fn finish_signed(
        mut self,
        meta: serde_json::Value,
        key: Option<&ed25519_dalek::SigningKey>,
    ) -> Result<(u64, PackManifest), PackError> {
        let mut manifest = PackManifest {
            format: PACK_FORMAT.into(),
            version: PACK_VERSION,
            entries: self.entries.clone(),
            meta,
            signature: None,
        };
        if let Some(key) = key {
            super::signature::sign(&mut manifest, key);
        }
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| PackError::Manifest(format!("cannot serialise the manifest: {e}")))?;
        let limit = PackLimits::default().max_manifest_bytes;
        if json.len() as u64 > limit {
            return Err(PackError::Limit { name: PACK_MANIFEST.into(), what: "manifest size (bytes)", limit });
        }
        let header = entry_header(PACK_MANIFEST, json.len() as u64)?;
        let mut enc = match (self.failed, self.encoder.take()) {
            (false, Some(enc)) => enc,
            _ => return Err(failed_error(&self.partial)),
        };
        let partial = &self.partial;
        write_member(&mut enc, &header, &json).map_err(io_err("write", partial))?;
        enc.write_all(&[0u8; 2 * BLOCK as usize]).map_err(io_err("write", partial))?;
        let file = enc.finish().map_err(io_err("finish zstd stream of", partial))?;
        file.sync_all().map_err(io_err("sync", partial))?;
        let bytes = file.metadata().map_err(io_err("stat", partial))?.len();
        drop(file);
        publish(&self.partial, &self.out)?;
        self.published = true;
        sync_parent(&self.out)?;
        Ok((bytes, manifest))
    }

    fn check_new_name(&self, name: &str) -> Result<(), PackError> {
        if name == PACK_MANIFEST {
            let reason = "reserved for the pack manifest".to_string();
            return Err(PackError::UnsafeName { name: name.into(), reason });
        }
        if self.names.contains(name) {
            return Err(PackError::Duplicate(name.into()));
        }
        Ok(())
    }
}

impl Drop for PackWriter {
    fn drop(&mut self) {
        if !self.published {
            self.encoder.take();
            // Best effort: nothing useful can be done about a failure here.
            let _ = fs::remove_file(&self.partial);
        }
    }
}

/// The error for calls on a writer whose earlier write failed.
fn failed_error(partial: &Path) -> PackError {
    let source = io::Error::other("an earlier write to this pack failed; drop the writer");
    PackError::Io { step: "continue writing", path: partial.to_path_buf(), source }
}

/// `<out>.partial`, next to `out`.
fn partial_path(out: &Path) -> Result<PathBuf, PackError> {
    let Some(file_name) = out.file_name() else {
        let source = io::Error::new(io::ErrorKind::InvalidInput, "output path has no file name");
        return Err(PackError::Io { step: "create pack at", path: out.to_path_buf(), source });
    };
    let mut partial = file_name.to_os_string();
    partial.push(".partial");
    Ok(out.with_file_name(partial))
}

/// Moves `partial` to `out` without ever replacing an existing `out`.
fn publish(partial: &Path, out: &Path) -> Result<(), PackError> {
    match fs::hard_link(partial, out) {
        Ok(()) => {
            fs::remove_file(partial).map_err(|source| PackError::Io { step: "remove", path: partial.into(), source })
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(PackError::Exists(out.to_path_buf())),
        Err(_) => {
            // Filesystems without hard links: check, then rename (racy, but only against other writers).
            if fs::symlink_metadata(out).is_ok() {
                return Err(PackError::Exists(out.to_path_buf()));
            }
            fs::rename(partial, out).map_err(|source| PackError::Io { step: "rename", path: partial.into(), source })
        }
    }
}

/// Fsyncs the directory holding `path`.
fn sync_parent(path: &Path) -> Result<(), PackError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync directory", dir))
}

/// A ustar header for a regular-file entry; refuses names [`extract_pack`](super::extract_pack) would refuse
/// or ustar cannot hold.
pub(super) fn entry_header(name: &str, size: u64) -> Result<tar::Header, PackError> {
    check_name(name.as_bytes())?;
    let mut header = tar::Header::new_ustar();
    header.set_path(name).map_err(|e| PackError::UnsafeName {
        name: shown(name),
        reason: format!("cannot be stored in a ustar header (at most 155 + 100 bytes split at a '/'): {e}"),
    })?;
    if header.path_bytes().as_ref() != name.as_bytes() {
        let reason = "does not survive a round trip through a ustar header".to_string();
        return Err(PackError::UnsafeName { name: shown(name), reason });
    }
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    Ok(header)
}

/// Writes one tar member: header, data, padding.
fn write_member(w: &mut impl Write, header: &tar::Header, data: &[u8]) -> io::Result<()> {
    w.write_all(header.as_bytes())?;
    w.write_all(data)?;
    w.write_all(&[0u8; BLOCK as usize][..padding(data.len() as u64)])
}
