//! The vault's encrypted chunk files, `<root>/chunks/<2 hex>/<64 hex>` (format in [`super`]).
//!
//! Why this exists: blocks are stored once per distinct content (within one vault),
//! encrypted and authenticated, under names that reveal nothing without the key. A
//! chunk read back is authenticated (AEAD with its name in the AAD, so a file moved
//! to another name is refused), decompressed under a cap, and re-hashed.

use super::crypto::{self, SubKeys, NONCE_LEN, TAG_LEN};
use super::fsutil::{self, is_temp_name};
use super::{io_err, VaultError};
use crate::chunk_id::ChunkId;
use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// First bytes of a chunk file.
pub const CHUNK_MAGIC: [u8; 8] = *b"FKVMVCH1";
/// Largest chunk plaintext: one 64 KiB window.
pub const MAX_CHUNK_PLAIN: usize = 64 * 1024;
/// zstd level.
const ZSTD_LEVEL: i32 = 3;
/// The chunks directory's and fan-outs' mode: searchable by the uid of a VMM that holds
/// the directory open, listable by no one but the owner.
const SHARED_DIR_MODE: u32 = 0o711;
/// A chunk file's mode (encrypted bytes; the vault directory above is `0700`).
const CHUNK_MODE: u32 = 0o644;

/// The chunks directory of a vault, with the keys to read and write it.
#[derive(Debug, Clone)]
pub(crate) struct Chunks {
    dir: PathBuf,
    /// `dir`, opened when the vault was (see the module doc).
    dir_fd: Arc<OwnedFd>,
    keys: SubKeys,
    /// Chunk files read and decrypted by [`Chunks::get`] (successfully or not).
    reads: Arc<AtomicU64>,
}

/// What [`Chunks::put`] did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Put {
    pub(crate) name: ChunkId,
    /// False when a chunk of that name existed (nothing written).
    pub(crate) new: bool,
    /// Size of the chunk file.
    pub(crate) bytes: u64,
}

impl Chunks {
    /// Opens the chunks directory of the vault at `root` (which must exist) and brings
    /// it to the sharing rule of the module doc.
    pub(crate) fn open(root: &Path, keys: SubKeys) -> Result<Chunks, VaultError> {
        let dir = root.join("chunks");
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&dir)
            .map_err(io_err("opening the chunks directory", &dir))?;
        let chunks = Chunks { dir, dir_fd: Arc::new(OwnedFd::from(file)), keys, reads: Arc::default() };
        chunks.share()?;
        Ok(chunks)
    }

    /// Brings a vault written before the sharing rule (module doc) to it: every fan-out
    /// `0711` and chunk `0644`, then the chunks directory `0711`, whose mode so says
    /// the walk is done. Nothing to do (one `fstat`) once it is, or for a caller that
    /// does not own the vault (it could not have written chunks either).
    pub(crate) fn share(&self) -> Result<(), VaultError> {
        let dir = std::fs::File::from(self.dir_fd.try_clone().map_err(io_err("sharing", &self.dir))?);
        let meta = dir.metadata().map_err(io_err("checking the mode of", &self.dir))?;
        // SAFETY: geteuid has no preconditions.
        if meta.mode() & 0o7777 == SHARED_DIR_MODE || meta.uid() != unsafe { libc::geteuid() } {
            return Ok(());
        }
        for fanout in self.fanouts()? {
            set_mode(&fanout, SHARED_DIR_MODE)?;
            for entry in fs::read_dir(&fanout).map_err(io_err("listing chunk directory", &fanout))? {
                let entry = entry.map_err(io_err("listing chunk directory", &fanout))?;
                if entry.file_type().is_ok_and(|t| t.is_file()) {
                    set_mode(&entry.path(), CHUNK_MODE)?;
                }
            }
        }
        set_mode(&self.dir, SHARED_DIR_MODE)
    }

    /// The keyed hash naming a chunk holding `plain`.
    pub(crate) fn name_of(&self, plain: &[u8]) -> ChunkId {
        ChunkId(*blake3::keyed_hash(&self.keys.name, plain).as_bytes())
    }

    pub(crate) fn path_of(&self, name: &ChunkId) -> PathBuf {
        let hex = name.to_hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    fn aad(name: &ChunkId) -> [u8; 40] {
        let mut aad = [0u8; 40];
        aad[..8].copy_from_slice(&CHUNK_MAGIC);
        aad[8..].copy_from_slice(&name.0);
        aad
    }

    /// Stores `plain` unless a chunk of its name exists. Complete under its name when
    /// this returns, durable after [`Chunks::sync`]. `die_before_rename` leaves the
    /// temp file and fails, as a writer killed at that moment would (tests).
    pub(crate) fn put(&self, plain: &[u8], die_before_rename: bool) -> Result<Put, VaultError> {
        let name = self.name_of(plain);
        let path = self.path_of(&name);
        if let Ok(meta) = fs::symlink_metadata(&path) {
            if meta.is_file() {
                return Ok(Put { name, new: false, bytes: meta.len() });
            }
        }
        let packed = zstd::bulk::compress(plain, ZSTD_LEVEL).map_err(io_err("compressing chunk", &path))?;
        let (nonce, ct) = crypto::seal(&self.keys.aead, &Self::aad(&name), &packed, &path)?;
        let mut file = Vec::with_capacity(8 + NONCE_LEN + ct.len());
        file.extend_from_slice(&CHUNK_MAGIC);
        file.extend_from_slice(&nonce);
        file.extend_from_slice(&ct);
        let fanout = fsutil::parent_of(&path);
        if !fanout.is_dir() {
            fsutil::create_dir(fanout, SHARED_DIR_MODE)?;
            // Whatever the umask left.
            set_mode(fanout, SHARED_DIR_MODE)?;
        }
        let tmp = fsutil::temp_path(&path);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(CHUNK_MODE)
            .open(&tmp)
            .map_err(io_err("creating chunk temp file", &tmp))?;
        let written = f
            .set_permissions(fs::Permissions::from_mode(CHUNK_MODE))
            .and_then(|()| io::Write::write_all(&mut f, &file));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("writing chunk temp file", &tmp)(e));
        }
        drop(f);
        if die_before_rename {
            return Err(VaultError::Fault("killed while writing a chunk"));
        }
        fs::rename(&tmp, &path).map_err(io_err("renaming chunk into place", &path))?;
        Ok(Put { name, new: true, bytes: file.len() as u64 })
    }

    /// Reads chunk `name`, which must decrypt to exactly `len` bytes whose keyed hash
    /// is `name`.
    pub(crate) fn get(&self, name: &ChunkId, len: usize) -> Result<Vec<u8>, VaultError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let path = self.path_of(name);
        let corrupt = |reason: String| VaultError::Corrupt { path: path.clone(), reason };
        if len == 0 || len > MAX_CHUNK_PLAIN {
            return Err(corrupt(format!("chunk {name} asked for as {len} bytes")));
        }
        let cap = (8 + NONCE_LEN + TAG_LEN + zstd::zstd_safe::compress_bound(MAX_CHUNK_PLAIN)) as u64;
        let bytes = match self.read_capped(name, cap) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(corrupt(format!("chunk {name} is missing")));
            }
            Err(e) => return Err(io_err("reading chunk", &path)(e)),
            Ok(bytes) if bytes.len() as u64 > cap => {
                return Err(corrupt(format!("chunk {name} is larger than the {cap}-byte cap")));
            }
            Ok(bytes) => bytes,
        };
        if bytes.len() < 8 + NONCE_LEN + TAG_LEN || bytes[..8] != CHUNK_MAGIC {
            return Err(corrupt(format!("chunk {name}: not a vault chunk (short or bad magic)")));
        }
        let packed = crypto::open(&self.keys.aead, &bytes[8..8 + NONCE_LEN], &Self::aad(name), &bytes[8 + NONCE_LEN..])
            .ok_or_else(|| corrupt(format!("chunk {name} fails authentication (tampered, moved or wrong key)")))?;
        let plain = zstd::bulk::decompress(&packed, len)
            .map_err(|e| corrupt(format!("chunk {name} does not decompress to at most {len} bytes: {e}")))?;
        if plain.len() != len {
            return Err(corrupt(format!("chunk {name} holds {} bytes, expected {len}", plain.len())));
        }
        if self.name_of(&plain) != *name {
            return Err(corrupt(format!("chunk {name}: content does not hash to its name")));
        }
        Ok(plain)
    }

    /// Up to `cap + 1` bytes of chunk `name`, opened from the directory descriptor
    /// (module doc) without following a link.
    fn read_capped(&self, name: &ChunkId, cap: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let hex = name.to_hex();
        let rel = std::ffi::CString::new(format!("{}/{hex}", &hex[..2]).as_bytes()).expect("hex has no NUL");
        // SAFETY: openat with a descriptor `dir_fd` keeps open and a NUL-terminated path;
        // the returned descriptor is owned by the File below.
        let fd = unsafe {
            libc::openat(self.dir_fd.as_raw_fd(), rel.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { fs::File::from_raw_fd(fd) };
        let mut bytes = Vec::new();
        file.take(cap + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Chunk reads so far (every [`Chunks::get`], failed ones included).
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Size of chunk `name`'s file (0 if missing).
    pub(crate) fn stored_size(&self, name: &ChunkId) -> u64 {
        fs::symlink_metadata(self.path_of(name)).map_or(0, |m| m.len())
    }

    /// Makes every chunk written so far durable: one `syncfs` of the vault's filesystem.
    pub(crate) fn sync(&self) -> Result<(), VaultError> {
        // SAFETY: syncfs only reads the descriptor, which `self` keeps open for the call.
        if unsafe { libc::syncfs(self.dir_fd.as_raw_fd()) } != 0 {
            return Err(io_err("syncfs of chunks directory", &self.dir)(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Removes temp files left by killed writers. Call only under the exclusive lock,
    /// when no writer can be running. Returns how many were removed.
    pub(crate) fn remove_temps(&self) -> Result<u64, VaultError> {
        let mut removed = 0;
        for fanout in self.fanouts()? {
            for entry in fs::read_dir(&fanout).map_err(io_err("listing chunk directory", &fanout))? {
                let entry = entry.map_err(io_err("listing chunk directory", &fanout))?;
                if entry.file_name().to_str().is_some_and(is_temp_name) {
                    fs::remove_file(entry.path()).map_err(io_err("removing stale temp file", &entry.path()))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Deletes every chunk not in `live` (under the exclusive lock). Returns the
    /// number removed, the space they occupied (`st_blocks * 512`) and the number kept.
    pub(crate) fn gc(&self, live: &HashSet<ChunkId>) -> Result<(u64, u64, u64), VaultError> {
        let (mut removed, mut bytes, mut kept) = (0, 0, 0);
        for fanout in self.fanouts()? {
            for entry in fs::read_dir(&fanout).map_err(io_err("listing chunk directory", &fanout))? {
                let entry = entry.map_err(io_err("listing chunk directory", &fanout))?;
                let Some(name) = entry.file_name().to_str().and_then(|n| ChunkId::from_hex(n).ok()) else {
                    continue;
                };
                if live.contains(&name) {
                    kept += 1;
                    continue;
                }
                let path = entry.path();
                let size = fs::symlink_metadata(&path).map_or(0, |m| m.blocks() * 512);
                fs::remove_file(&path).map_err(io_err("removing unreferenced chunk", &path))?;
                removed += 1;
                bytes += size;
            }
            // Fails (harmlessly) unless the directory is now empty.
            let _ = fs::remove_dir(&fanout);
        }
        Ok((removed, bytes, kept))
    }

    /// The `<2 hex>` fan-out directories.
    fn fanouts(&self) -> Result<Vec<PathBuf>, VaultError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err("listing chunks directory", &self.dir))? {
            let entry = entry.map_err(io_err("listing chunks directory", &self.dir))?;
            let is_fanout = entry.file_name().to_str().is_some_and(|n| n.len() == 2);
            if is_fanout && entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), VaultError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("setting the mode of", path))
}
