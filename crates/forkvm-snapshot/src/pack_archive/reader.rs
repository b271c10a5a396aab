//! [`extract_pack`]: reads an untrusted pack into a staging directory and verifies it against its manifest.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::signature::PackTrust;
use super::{
    check_name, io_err, padding, shown, PackError, PackLimits, PackManifest, BLOCK, CHUNK, PACK_FORMAT, PACK_MANIFEST,
    PACK_VERSION,
};

/// Granularity at which all-zero data is left as a hole when extracting.
const HOLE_BLOCK: usize = 4096;
/// Most zero padding accepted after the tar end-of-archive marker (GNU tar pads to 10 KiB records).
const MAX_TRAILER_BYTES: u64 = 1 << 20;
/// zstd frame magic number, little endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// `Content_Checksum_flag` in the zstd frame header descriptor.
const ZSTD_CHECKSUM_FLAG: u8 = 0x04;

/// Reads the pack at `pack` into `staging` and checks it against its manifest.
///
/// `staging` must be an existing, empty directory. Entry `a/b/c` becomes `staging/a/b/c`; intermediate
/// directories are created here (mode 0755, minus umask), files with mode 0644, runs of all-zero 4 KiB blocks
/// are left as holes, and every file is fsynced. The manifest entry itself is not written to `staging`; it
/// is returned. `accept_name` decides which entry names may appear (the caller's grammar; it is not consulted
/// for [`PACK_MANIFEST`], which must appear exactly once, as the last entry).
///
/// **Nothing is written before the whole pack is checked.** A first pass reads the pack through and writes
/// nothing: safe names, regular files only, limits respected, no duplicates, a complete zstd frame (checksum
/// verified) and tar stream (end marker present, nothing but zero padding after it), a well-formed manifest
/// of format [`PACK_FORMAT`] version [`PACK_VERSION`], and every entry present in both archive and manifest,
/// in the same order, with the listed size and BLAKE3. It also counts the bytes extraction would allocate
/// (the non-zero blocks), which must fit in the free space of `staging`'s filesystem, less a reserve of
/// 1/20 of it. Only then does the second pass extract, checking all of it again (the pack file is not
/// trusted to stay the same between the passes).
///
/// On any error `staging` may hold partial content (only if the pack changed between the passes): **the
/// caller must delete `staging`**. Nothing outside `staging` is created or modified. `staging` must not be
/// modified by anyone else during extraction.
pub fn extract_pack(
    pack: &Path,
    staging: &Path,
    accept_name: &dyn Fn(&str) -> bool,
    limits: &PackLimits,
) -> Result<PackManifest, PackError> {
    extract_pack_trusted(pack, staging, accept_name, limits, &PackTrust::any())
}

/// [`extract_pack`], also checking the pack's signature against `trust` in the first
/// pass (so an unsigned or untrusted pack writes nothing).
pub fn extract_pack_trusted(
    pack: &Path,
    staging: &Path,
    accept_name: &dyn Fn(&str) -> bool,
    limits: &PackLimits,
    trust: &PackTrust,
) -> Result<PackManifest, PackError> {
    check_staging(staging)?;
    let (checked, allocated) = read_pack(pack, staging, false, accept_name, limits)?;
    trust.check(&checked)?;
    check_free_space(staging, allocated)?;
    let (manifest, _) = read_pack(pack, staging, true, accept_name, limits)?;
    if manifest != checked {
        return Err(PackError::Corrupt("the pack changed between its check and its extraction".into()));
    }
    Ok(manifest)
}

/// Refuses an extraction of `allocated` bytes that would not leave a twentieth of the filesystem free.
pub(super) fn check_free_space(staging: &Path, allocated: u64) -> Result<(), PackError> {
    let (free, total) = free_space(staging).map_err(io_err("find the free space of", staging))?;
    let reserve = total / 20;
    if allocated.saturating_add(reserve) > free {
        return Err(PackError::NoSpace { needed: allocated, free: free.saturating_sub(reserve) });
    }
    Ok(())
}

/// Bytes available to this user, and the size, of the filesystem holding `path`.
fn free_space(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct it is given; `c` outlives the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// One pass over the pack: checks everything, and writes the entries into `staging` when `write` is set.
/// Returns the manifest and the bytes of non-zero 4 KiB blocks (what extraction allocates).
fn read_pack(
    pack: &Path,
    staging: &Path,
    write: bool,
    accept_name: &dyn Fn(&str) -> bool,
    limits: &PackLimits,
) -> Result<(PackManifest, u64), PackError> {
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
        write,
        accept_name,
        limits,
        progress: Rc::clone(&progress),
        staged: Vec::new(),
        index: HashMap::new(),
        dirs: HashSet::new(),
        manifest: None,
        total: 0,
        allocated: 0,
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
    let allocated = ex.allocated;
    let manifest = ex.verify()?;
    if write {
        // Make the new directory entries durable too (file contents were synced as they were written).
        for dir in dirs.iter().map(PathBuf::as_path).chain([staging]) {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync directory", dir))?;
        }
    }
    Ok((manifest, allocated))
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
    /// Write the entries into `staging` (the second pass); else only check them.
    write: bool,
    accept_name: &'a dyn Fn(&str) -> bool,
    limits: &'a PackLimits,
    progress: Rc<Progress>,
    staged: Vec<Staged>,
    index: HashMap<String, usize>,
    dirs: HashSet<String>,
    manifest: Option<Vec<u8>>,
    total: u64,
    /// Bytes of non-zero [`HOLE_BLOCK`]s so far: what extraction allocates.
    allocated: u64,
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
                if self.write {
                    let path = self.staging.join(dir);
                    DirBuilder::new().mode(0o755).create(&path).map_err(io_err("create directory", &path))?;
                }
                self.dirs.insert(dir.to_string());
            }
        }
        Ok(())
    }

    /// Copies one entry's data into a new file, leaving all-zero blocks as holes (only counts the blocks
    /// it would write when not writing); returns its BLAKE3 hex.
    fn write_file(&mut self, name: &str, size: u64, data: &mut impl Read) -> Result<String, PackError> {
        let path = self.staging.join(name);
        let file = if self.write {
            let file = OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path).map_err(|source| {
                if source.kind() == io::ErrorKind::AlreadyExists {
                    PackError::Duplicate(name.into())
                } else {
                    PackError::Io { step: "create entry file", path: path.clone(), source }
                }
            })?;
            Some(file)
        } else {
            None
        };
        let mut buf = std::mem::take(&mut self.buf);
        let mut hasher = blake3::Hasher::new();
        let mut offset = 0u64;
        loop {
            let n = fill(data, &mut buf).map_err(|e| self.stream_err(format!("reading entry {name:?}"), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            self.allocated += buf[..n].chunks(HOLE_BLOCK).filter(|b| !is_zero(b)).count() as u64 * HOLE_BLOCK as u64;
            if let Some(file) = &file {
                write_sparse_chunk(file, &buf[..n], offset).map_err(io_err("write entry file", &path))?;
            }
            offset += n as u64;
        }
        self.buf = buf;
        if offset != size {
            return Err(PackError::Truncated(format!("entry {name:?} ends after {offset} of {size} bytes")));
        }
        if let Some(file) = file {
            file.set_len(size).map_err(io_err("set length of entry file", &path))?;
            file.sync_all().map_err(io_err("sync entry file", &path))?;
        }
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
            if self.write {
                let path = self.staging.join(&entry.name);
                let meta = fs::symlink_metadata(&path).map_err(io_err("stat staged entry", &path))?;
                if !meta.is_file() || meta.len() != entry.size {
                    return Err(PackError::SizeMismatch { name, expected: entry.size, actual: meta.len() });
                }
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
