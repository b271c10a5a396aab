//! Hash-checked `.tar.zst` packs: the container snapshots travel in between hosts.
//!
//! Moving a snapshot to another host means shipping several files (metadata, VM state, a memory image
//! that may be many GiB and mostly holes) as one stream. This module is only that container layer; it does
//! not know what a snapshot is. A pack is:
//!
//! * one zstd frame, always written with its content checksum, holding
//! * a ustar tar stream of regular-file entries with relative `/`-separated UTF-8 names,
//! * whose LAST entry is [`PACK_MANIFEST`], a JSON [`PackManifest`] listing every other entry (in archive
//!   order) with its size and BLAKE3 hash, plus an opaque caller description (`meta`),
//! * followed by the tar end-of-archive marker and nothing else.
//!
//! [`PackWriter`] writes packs crash-safely (into `<out>.partial`, renamed into place once synced).
//!
//! **Packs are untrusted input.** [`extract_pack`] never uses the tar crate's unpacking: it walks the raw
//! headers (no PAX / GNU long-name processing, so such headers are refused rather than interpreted), checks
//! every name itself, accepts only regular files, creates every file and directory itself under the staging
//! directory, caps entry counts and sizes while reading, refuses truncated streams and trailing data, and
//! only returns once every staged file matches the manifest's size and BLAKE3 hash.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde::{Deserialize, Serialize};

/// Name of the manifest entry; always the last entry of a pack.
pub const PACK_MANIFEST: &str = "forkvm-pack.json";
/// Value of [`PackManifest::format`].
pub const PACK_FORMAT: &str = "forkvm-pack";
/// Value of [`PackManifest::version`] written and accepted by this build.
pub const PACK_VERSION: u32 = 1;

/// Tar block size.
const BLOCK: u64 = 512;
/// Copy buffer size for streaming entry data.
const CHUNK: usize = 1 << 20;
/// Granularity at which all-zero data is left as a hole when extracting.
const HOLE_BLOCK: usize = 4096;
/// Longest entry name accepted (the most a ustar prefix + name can hold).
const MAX_NAME_BYTES: usize = 255;
/// Most zero padding accepted after the tar end-of-archive marker (GNU tar pads to 10 KiB records).
const MAX_TRAILER_BYTES: u64 = 1 << 20;
/// zstd compression level used by [`PackWriter`].
const ZSTD_LEVEL: i32 = 3;
/// zstd frame magic number, little endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// `Content_Checksum_flag` in the zstd frame header descriptor.
const ZSTD_CHECKSUM_FLAG: u8 = 0x04;

/// The manifest stored as the last entry ([`PACK_MANIFEST`]) of every pack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PackManifest {
    /// Always [`PACK_FORMAT`].
    pub format: String,
    /// Always [`PACK_VERSION`].
    pub version: u32,
    /// Every entry of the pack in archive order, excluding the manifest itself.
    pub entries: Vec<PackEntry>,
    /// The caller's description of the pack contents; opaque to this module.
    pub meta: serde_json::Value,
}

/// One entry listed in a [`PackManifest`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PackEntry {
    /// Relative `/`-separated entry name, e.g. `snapshots/a/snapshot.json`.
    pub name: String,
    /// Content length in bytes.
    pub size: u64,
    /// BLAKE3 hash of the content, 64 lowercase hex digits.
    pub blake3: String,
}

/// Errors from writing or extracting a pack. Names taken from a pack are shown quoted and shortened.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A host filesystem operation (`step`) on `path` failed; not a problem with the pack's contents.
    #[error("pack: cannot {step} {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: io::Error },
    /// The output (or its `.partial` twin) already exists.
    #[error(
        "pack: {0} already exists; refusing to overwrite it (a leftover `.partial` file means an interrupted \
         or concurrent pack write: remove it if no write is running)"
    )]
    Exists(PathBuf),
    /// An entry name (lossily decoded, shortened) is unsafe, unrepresentable, or refused by the caller.
    #[error("pack entry {name:?}: name refused: {reason}")]
    UnsafeName { name: String, reason: String },
    /// An entry is not a regular file; `kind` describes its tar type.
    #[error("pack entry {name:?}: entry type {kind} is not allowed (packs hold only regular files)")]
    EntryType { name: String, kind: String },
    /// The same name appears twice.
    #[error("pack entry {0:?} appears more than once")]
    Duplicate(String),
    /// The `what` cap (a [`PackLimits`] field, whose value is `limit`) was exceeded at entry `name`.
    #[error("pack entry {name:?}: pack exceeds the {what} limit of {limit}")]
    Limit { name: String, what: &'static str, limit: u64 },
    /// The pack ends early (cut zstd frame, cut tar stream, or missing end-of-archive marker).
    #[error("pack is truncated: {0}")]
    Truncated(String),
    /// The pack's bytes are damaged (zstd or tar level) or carry trailing data.
    #[error("pack is corrupt: {0}")]
    Corrupt(String),
    /// The manifest entry is missing, misplaced, unparsable or inconsistent.
    #[error("pack manifest forkvm-pack.json: {0}")]
    Manifest(String),
    /// An entry's BLAKE3 (`actual`, hex) differs from the manifest's (`expected`).
    #[error("pack entry {name:?}: BLAKE3 {actual} does not match the manifest's {expected}: the pack is corrupt")]
    HashMismatch { name: String, expected: String, actual: String },
    /// An entry's length (`actual`) differs from the manifest's (`expected`).
    #[error("pack entry {name:?}: holds {actual} bytes but the manifest lists {expected}: the pack is corrupt")]
    SizeMismatch { name: String, expected: u64, actual: u64 },
    /// The manifest lists an entry the archive does not contain.
    #[error("pack entry {0:?} is listed in the manifest but absent from the archive")]
    Missing(String),
    /// The archive contains an entry the manifest does not list.
    #[error("pack entry {0:?} is in the archive but not listed in the manifest")]
    Unlisted(String),
}

/// Caps applied by [`extract_pack`] while reading, before any allocation or write they would bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    /// Most entries, not counting the manifest.
    pub max_entries: u64,
    /// Largest single entry, in bytes (the manifest is capped by `max_manifest_bytes` instead).
    pub max_entry_bytes: u64,
    /// Largest sum of all entry sizes, manifest included.
    pub max_total_bytes: u64,
    /// Largest manifest, in bytes. [`PackWriter::finish`] refuses to write a bigger one than the default.
    pub max_manifest_bytes: u64,
}

impl Default for PackLimits {
    /// 1 000 000 entries, 1 TiB per entry, 4 TiB in total, 64 MiB of manifest.
    fn default() -> Self {
        PackLimits {
            max_entries: 1_000_000,
            max_entry_bytes: 1 << 40,
            max_total_bytes: 4 << 40,
            max_manifest_bytes: 64 << 20,
        }
    }
}

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
    pub fn finish(mut self, meta: serde_json::Value) -> Result<(u64, PackManifest), PackError> {
        let manifest =
            PackManifest { format: PACK_FORMAT.into(), version: PACK_VERSION, entries: self.entries.clone(), meta };
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

/// Maps an I/O error at `path` during `step` to [`PackError::Io`].
fn io_err(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PackError {
    let path = path.to_path_buf();
    move |source| PackError::Io { step, path, source }
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

/// Zero bytes needed after `size` bytes of data to reach a tar block boundary.
fn padding(size: u64) -> usize {
    ((BLOCK - size % BLOCK) % BLOCK) as usize
}

/// A ustar header for a regular-file entry; refuses names [`extract_pack`] would refuse or ustar cannot hold.
fn entry_header(name: &str, size: u64) -> Result<tar::Header, PackError> {
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

/// A name for display in errors: at most [`MAX_NAME_BYTES`] bytes of it.
fn shown(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_string();
    }
    let mut end = MAX_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

/// Checks an entry name against the pack's name rules (not the caller's grammar).
fn check_name(raw: &[u8]) -> Result<&str, PackError> {
    let refuse =
        |reason: &str| PackError::UnsafeName { name: shown(&String::from_utf8_lossy(raw)), reason: reason.to_string() };
    if raw.is_empty() {
        return Err(refuse("empty name"));
    }
    if raw.len() > MAX_NAME_BYTES {
        return Err(refuse(&format!("{} bytes long (the limit is {MAX_NAME_BYTES})", raw.len())));
    }
    if raw.contains(&0) {
        return Err(refuse("contains a NUL byte"));
    }
    let name = std::str::from_utf8(raw).map_err(|_| refuse("not valid UTF-8"))?;
    if name.starts_with('/') {
        return Err(refuse("absolute path"));
    }
    if name.contains('\\') {
        return Err(refuse("contains a backslash"));
    }
    for component in name.split('/') {
        match component {
            "" => return Err(refuse("empty path component (doubled or trailing '/')")),
            "." => return Err(refuse("contains a '.' component")),
            ".." => return Err(refuse("contains a '..' component")),
            _ => {}
        }
    }
    Ok(name)
}

/// Reads the pack at `pack` into `staging` and checks it against its manifest.
///
/// `staging` must be an existing, empty directory. Entry `a/b/c` becomes `staging/a/b/c`; intermediate
/// directories are created here (mode 0755, minus umask), files with mode 0644, runs of all-zero 4 KiB blocks
/// are left as holes, and every file is fsynced. The manifest entry itself is not written to `staging`; it
/// is returned. `accept_name` decides which entry names may appear (the caller's grammar; it is not consulted
/// for [`PACK_MANIFEST`], which must appear exactly once, as the last entry).
///
/// Returns the manifest only if everything checks out: safe names, regular files only, limits respected,
/// no duplicates, a complete zstd frame (checksum verified) and tar stream (end marker present, nothing but
/// zero padding after it), a well-formed manifest of format [`PACK_FORMAT`] version [`PACK_VERSION`], and
/// every entry present in both archive and manifest, in the same order, with the listed size and BLAKE3.
///
/// On any error `staging` may hold partial content: **the caller must delete `staging`**. Nothing outside
/// `staging` is created or modified. `staging` must not be modified by anyone else during extraction.
pub fn extract_pack(
    pack: &Path,
    staging: &Path,
    accept_name: &dyn Fn(&str) -> bool,
    limits: &PackLimits,
) -> Result<PackManifest, PackError> {
    check_staging(staging)?;
    let mut file = File::open(pack).map_err(io_err("open", pack))?;
    check_zstd_header(&mut file, pack)?;
    let progress = Rc::new(Progress::default());
    let decoder = zstd::Decoder::new(PackFile(file, Rc::clone(&progress)))
        .map_err(io_err("start zstd decompression of", pack))?
        .single_frame();
    let mut stream = Counting(decoder, Rc::clone(&progress));
    let mut ex = Extraction {
        pack,
        staging,
        accept_name,
        limits,
        progress: Rc::clone(&progress),
        staged: Vec::new(),
        index: HashMap::new(),
        dirs: HashSet::new(),
        manifest: None,
        total: 0,
        buf: vec![0; CHUNK],
    };

    let mut end_of_entries = 0;
    {
        let mut archive = tar::Archive::new(&mut stream);
        let entries = archive.entries().map_err(|e| ex.stream_err("start reading the tar stream".into(), e))?;
        for entry in entries.raw(true) {
            let mut entry = entry.map_err(|e| {
                let after = ex.staged.last().map_or_else(|| "at the start".into(), |s| format!("after {:?}", s.name));
                ex.stream_err(format!("reading the tar header {after}"), e)
            })?;
            let size = entry.size();
            ex.entry(&mut entry)?;
            end_of_entries = entry.raw_file_position() + size + padding(size) as u64;
        }
    }
    ex.check_end(&mut stream, end_of_entries)?;
    let mut rest = stream.0.finish();
    let trailing = rest.fill_buf().map_err(|e| ex.stream_err("checking for data after the zstd frame".into(), e))?;
    if !trailing.is_empty() {
        return Err(PackError::Corrupt("unexpected data after the zstd frame".into()));
    }
    let dirs: Vec<PathBuf> = ex.dirs.iter().map(|d| staging.join(d)).collect();
    let manifest = ex.verify()?;
    // Make the new directory entries durable too (file contents were synced as they were written).
    for dir in dirs.iter().map(PathBuf::as_path).chain([staging]) {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync directory", dir))?;
    }
    Ok(manifest)
}

/// Refuses a staging path that is not an existing, empty, real directory.
fn check_staging(staging: &Path) -> Result<(), PackError> {
    let io_err = |source| PackError::Io { step: "use staging directory", path: staging.to_path_buf(), source };
    let meta = fs::symlink_metadata(staging).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(io_err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory")));
    }
    if fs::read_dir(staging).map_err(io_err)?.next().is_some() {
        return Err(io_err(io::Error::new(io::ErrorKind::DirectoryNotEmpty, "staging directory is not empty")));
    }
    Ok(())
}

/// Refuses anything but a zstd frame whose header announces a content checksum, then rewinds.
fn check_zstd_header(file: &mut File, pack: &Path) -> Result<(), PackError> {
    let io_err = |source| PackError::Io { step: "read", path: pack.to_path_buf(), source };
    let mut head = [0u8; 5];
    let n = fill(file, &mut head).map_err(io_err)?;
    let magic_len = n.min(ZSTD_MAGIC.len());
    if head[..magic_len] != ZSTD_MAGIC[..magic_len] {
        return Err(PackError::Corrupt("not a zstd stream (bad magic number)".into()));
    }
    if n < head.len() {
        return Err(PackError::Truncated(format!("only {n} bytes long")));
    }
    if head[4] & ZSTD_CHECKSUM_FLAG == 0 {
        return Err(PackError::Corrupt("the zstd frame carries no content checksum (packs always do)".into()));
    }
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    Ok(())
}

/// Shared between the readers and [`Extraction`]: how far the tar parser got, and how the stream failed.
#[derive(Debug, Default)]
struct Progress {
    /// Decompressed bytes handed to the tar parser.
    bytes: Cell<u64>,
    /// The decompressed stream ended (so a parse error means truncation).
    eof: Cell<bool>,
    /// Reading the pack file itself failed (a host I/O error, not bad pack contents).
    file_failed: Cell<bool>,
}

/// The pack file, recording its read failures in [`Progress::file_failed`].
struct PackFile(File, Rc<Progress>);

impl Read for PackFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let result = self.0.read(buf);
        if result.as_ref().is_err_and(|e| e.kind() != io::ErrorKind::Interrupted) {
            self.1.file_failed.set(true);
        }
        result
    }
}

/// Counts the decompressed bytes handed to the tar parser.
struct Counting<R>(R, Rc<Progress>);

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.1.eof.set(true);
        }
        self.1.bytes.set(self.1.bytes.get() + n as u64);
        Ok(n)
    }
}

/// One extracted entry.
struct Staged {
    name: String,
    size: u64,
    blake3: String,
}

/// State of one [`extract_pack`] call.
struct Extraction<'a> {
    pack: &'a Path,
    staging: &'a Path,
    accept_name: &'a dyn Fn(&str) -> bool,
    limits: &'a PackLimits,
    progress: Rc<Progress>,
    staged: Vec<Staged>,
    index: HashMap<String, usize>,
    dirs: HashSet<String>,
    manifest: Option<Vec<u8>>,
    total: u64,
    buf: Vec<u8>,
}

impl Extraction<'_> {
    /// Classifies an error from the decompressed stream: pack-file I/O, truncation, or corruption.
    fn stream_err(&self, what: String, e: io::Error) -> PackError {
        if self.progress.file_failed.get() {
            return PackError::Io { step: "read", path: self.pack.to_path_buf(), source: e };
        }
        if e.kind() == io::ErrorKind::UnexpectedEof || self.progress.eof.get() {
            PackError::Truncated(format!("{what}: {e}"))
        } else {
            PackError::Corrupt(format!("{what}: {e}"))
        }
    }

    /// Checks and extracts one raw tar member.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), PackError> {
        let raw_name = entry.path_bytes().into_owned();
        // Type first: for extension headers (GNU long name, PAX) the name field is a placeholder.
        let kind = entry.header().entry_type();
        if kind != tar::EntryType::Regular {
            let name = shown(&String::from_utf8_lossy(&raw_name));
            return Err(PackError::EntryType { name, kind: describe_type(kind) });
        }
        let name = check_name(&raw_name)?.to_string();
        let size = entry.size();
        let limit_err = |what, limit| PackError::Limit { name: name.clone(), what, limit };
        if self.manifest.is_some() {
            if name == PACK_MANIFEST {
                return Err(PackError::Duplicate(name));
            }
            return Err(PackError::Manifest(format!("entry {name:?} follows the manifest, which must be last")));
        }
        if name == PACK_MANIFEST {
            if size > self.limits.max_manifest_bytes {
                return Err(limit_err("manifest size (bytes)", self.limits.max_manifest_bytes));
            }
        } else {
            if !(self.accept_name)(&name) {
                let reason = "not a name this kind of pack may contain".to_string();
                return Err(PackError::UnsafeName { name, reason });
            }
            if self.staged.len() as u64 >= self.limits.max_entries {
                return Err(limit_err("entry count", self.limits.max_entries));
            }
            if size > self.limits.max_entry_bytes {
                return Err(limit_err("entry size (bytes)", self.limits.max_entry_bytes));
            }
        }
        self.total = match self.total.checked_add(size) {
            Some(total) if total <= self.limits.max_total_bytes => total,
            _ => return Err(limit_err("total size (bytes)", self.limits.max_total_bytes)),
        };
        if name == PACK_MANIFEST {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(|e| self.stream_err(format!("reading {name:?}"), e))?;
            if bytes.len() as u64 != size {
                return Err(PackError::Truncated(format!("entry {name:?} ends after {} of {size} bytes", bytes.len())));
            }
            self.manifest = Some(bytes);
            return Ok(());
        }
        if self.index.contains_key(&name) {
            return Err(PackError::Duplicate(name));
        }
        if self.dirs.contains(&name) {
            let reason = "also a directory holding earlier entries".to_string();
            return Err(PackError::UnsafeName { name, reason });
        }
        self.make_parents(&name)?;
        let blake3 = self.write_file(&name, size, entry)?;
        self.index.insert(name.clone(), self.staged.len());
        self.staged.push(Staged { name, size, blake3 });
        Ok(())
    }

    /// Creates the missing intermediate directories of `name`, each only once and only under `staging`.
    fn make_parents(&mut self, name: &str) -> Result<(), PackError> {
        for (i, _) in name.match_indices('/') {
            let dir = &name[..i];
            if self.index.contains_key(dir) {
                let reason = format!("its parent {dir:?} is a file entry");
                return Err(PackError::UnsafeName { name: name.into(), reason });
            }
            if !self.dirs.contains(dir) {
                let path = self.staging.join(dir);
                DirBuilder::new().mode(0o755).create(&path).map_err(io_err("create directory", &path))?;
                self.dirs.insert(dir.to_string());
            }
        }
        Ok(())
    }

    /// Copies one entry's data into a new file, leaving all-zero blocks as holes; returns its BLAKE3 hex.
    fn write_file(&mut self, name: &str, size: u64, data: &mut impl Read) -> Result<String, PackError> {
        let path = self.staging.join(name);
        let file = OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                PackError::Duplicate(name.into())
            } else {
                PackError::Io { step: "create entry file", path: path.clone(), source }
            }
        })?;
        let mut buf = std::mem::take(&mut self.buf);
        let mut hasher = blake3::Hasher::new();
        let mut offset = 0u64;
        loop {
            let n = fill(data, &mut buf).map_err(|e| self.stream_err(format!("reading entry {name:?}"), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            write_sparse_chunk(&file, &buf[..n], offset).map_err(io_err("write entry file", &path))?;
            offset += n as u64;
        }
        self.buf = buf;
        if offset != size {
            return Err(PackError::Truncated(format!("entry {name:?} ends after {offset} of {size} bytes")));
        }
        file.set_len(size).map_err(io_err("set length of entry file", &path))?;
        file.sync_all().map_err(io_err("sync entry file", &path))?;
        Ok(hasher.finalize().to_hex().to_string())
    }

    /// After the last member: the tar end-of-archive marker (two zero blocks, possibly more zero padding)
    /// must follow, then the end of the zstd frame (which verifies its checksum).
    fn check_end<R: Read>(&self, stream: &mut Counting<R>, end_of_entries: u64) -> Result<(), PackError> {
        let consumed = self.progress.bytes.get();
        if consumed == end_of_entries {
            return Err(PackError::Truncated("the tar stream ends without its end-of-archive marker".into()));
        }
        if consumed != end_of_entries + BLOCK {
            let msg = format!("tar stream position {consumed} after the last entry ending at {end_of_entries}");
            return Err(PackError::Corrupt(msg));
        }
        let mut rest = Vec::new();
        (&mut *stream)
            .take(MAX_TRAILER_BYTES + 1)
            .read_to_end(&mut rest)
            .map_err(|e| self.stream_err("reading the tar end-of-archive marker".into(), e))?;
        if rest.len() as u64 > MAX_TRAILER_BYTES {
            return Err(PackError::Corrupt("more than 1 MiB of data after the tar end-of-archive marker".into()));
        }
        if (rest.len() as u64) < BLOCK {
            return Err(PackError::Truncated("the tar end-of-archive marker is incomplete".into()));
        }
        if !is_zero(&rest) {
            return Err(PackError::Corrupt("non-zero data after the tar end-of-archive marker".into()));
        }
        Ok(())
    }

    /// Parses the manifest and checks it against the staged entries.
    fn verify(self) -> Result<PackManifest, PackError> {
        let Some(bytes) = self.manifest else {
            return Err(PackError::Manifest("the pack has no manifest entry".into()));
        };
        let manifest: PackManifest =
            serde_json::from_slice(&bytes).map_err(|e| PackError::Manifest(format!("cannot parse: {e}")))?;
        if manifest.format != PACK_FORMAT {
            let found = shown(&manifest.format);
            return Err(PackError::Manifest(format!("format is {found:?}, expected {PACK_FORMAT:?}")));
        }
        if manifest.version != PACK_VERSION {
            let msg =
                format!("version {} is not supported (this build reads version {PACK_VERSION})", manifest.version);
            return Err(PackError::Manifest(msg));
        }
        let mut listed = HashSet::new();
        for entry in &manifest.entries {
            let name = shown(&entry.name);
            if !listed.insert(entry.name.as_str()) {
                return Err(PackError::Manifest(format!("lists entry {name:?} more than once")));
            }
            let Some(&i) = self.index.get(&entry.name) else {
                return Err(PackError::Missing(name));
            };
            let staged = &self.staged[i];
            if staged.size != entry.size {
                return Err(PackError::SizeMismatch { name, expected: entry.size, actual: staged.size });
            }
            if !is_hex64(&entry.blake3) {
                return Err(PackError::Manifest(format!("entry {name:?}: blake3 is not 64 lowercase hex digits")));
            }
            if staged.blake3 != entry.blake3 {
                let (expected, actual) = (entry.blake3.clone(), staged.blake3.clone());
                return Err(PackError::HashMismatch { name, expected, actual });
            }
            let path = self.staging.join(&entry.name);
            let meta = fs::symlink_metadata(&path).map_err(io_err("stat staged entry", &path))?;
            if !meta.is_file() || meta.len() != entry.size {
                return Err(PackError::SizeMismatch { name, expected: entry.size, actual: meta.len() });
            }
        }
        if let Some(unlisted) = self.staged.iter().find(|s| !listed.contains(s.name.as_str())) {
            return Err(PackError::Unlisted(unlisted.name.clone()));
        }
        for (position, entry) in manifest.entries.iter().enumerate() {
            let archived = self.index.get(&entry.name).copied().unwrap_or(usize::MAX);
            if archived != position {
                let name = shown(&entry.name);
                return Err(PackError::Manifest(format!(
                    "entry {name:?} is listed at position {position} but is at position {archived} in the archive"
                )));
            }
        }
        Ok(manifest)
    }
}

/// Tar entry type for errors, e.g. `Symlink ('2')`.
fn describe_type(kind: tar::EntryType) -> String {
    let byte = char::from(kind.as_byte());
    match kind.as_byte() {
        b'0'..=b'7' | b'x' | b'g' | b'L' | b'K' | b'S' => format!("{kind:?} ({byte:?})"),
        _ => format!("unknown ({byte:?})"),
    }
}

/// Reads until `buf` is full or the reader is exhausted; returns the bytes read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes `data` at `offset`, skipping [`HOLE_BLOCK`]-sized all-zero blocks (the file is new, so they read
/// back as zeros; the caller sets the final length).
fn write_sparse_chunk(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut run_start = None;
    let mut pos = 0;
    for block in data.chunks(HOLE_BLOCK) {
        match (is_zero(block), run_start) {
            (true, Some(start)) => {
                file.write_all_at(&data[start..pos], offset + start as u64)?;
                run_start = None;
            }
            (false, None) => run_start = Some(pos),
            _ => {}
        }
        pos += block.len();
    }
    if let Some(start) = run_start {
        file.write_all_at(&data[start..], offset + start as u64)?;
    }
    Ok(())
}

fn is_zero(data: &[u8]) -> bool {
    data.chunks(64).all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
#[path = "pack_archive_tests.rs"]
mod tests;
