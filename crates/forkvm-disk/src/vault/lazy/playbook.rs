//! Prefetch playbooks: which extents restores of a disk needed first, in what order.
//!
//! Why this exists: a guest booting from a lazily restored disk reads the same few
//! MiB (kernel modules, libraries, its service's files) in much the same order every
//! time. A [`VaultLayer`](super::VaultLayer) records the first foreground touch of
//! each extent ([`Recording`]); merged over restores into a [`Playbook`], it is
//! replayed by [`VaultLayer::prefetch`](super::VaultLayer::prefetch) before and while
//! the guest boots. Entries are block indices (each extent's first block), so a
//! playbook stays meaningful across snapshots whose maps differ: an entry whose block
//! is no longer in the map is skipped.
//!
//! # Merge rule ([`Playbook::merge_with`], [`MergeRule`])
//!
//! Each entry keeps a 32-run history bitmask (bit 0 = the newest merged run) and the
//! mean time of its first touch. Merging one run's recording:
//! 1. every entry's history shifts by one; entries touched in the run set bit 0 and
//!    update their mean: `mean += (t - mean) / min(runs seen in history, 8)` (a plain
//!    mean over the first 8 runs, then a moving average that follows drift);
//! 2. extents touched for the first time join with that run's time;
//! 3. entries touched in none of the last `keep_runs` runs (this one included) are
//!    dropped;
//! 4. entries are ordered by mean first-touch time, then block, and cut to
//!    `max_entries` (the latest-needed go first).
//!
//! # File format (version 1, little-endian; untrusted input when loaded)
//!
//! | offset | size | field |
//! |--------|------|-------|
//! | 0      | 8    | magic `FKVMPLAY` |
//! | 8      | 4    | version (1) |
//! | 12     | 4    | flags, 0 |
//! | 16     | 8    | disk size in bytes (entries must be blocks of it) |
//! | 24     | 8    | runs merged so far |
//! | 32     | 8    | entry count (at most [`MAX_PLAYBOOK_ENTRIES`]) |
//! | 40     | 16·n | entries: block u64, mean first touch µs u32, history u32 (≠ 0) |
//! | end−4  | 4    | CRC-32 of every byte before it |
//!
//! Compatibility rule: a reader accepts exactly the versions it knows; any layout or
//! meaning change bumps the version. Loading checks the size cap before reading, the
//! exact length, the CRC, then every entry (in range, history non-zero, no duplicate).

use crate::layered_disk::{blocks_for, MAX_DISK_BYTES};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// First bytes of a playbook file.
pub const PLAYBOOK_MAGIC: [u8; 8] = *b"FKVMPLAY";
/// Format version of the playbook file (see the compatibility rule above).
pub const PLAYBOOK_VERSION: u32 = 1;
/// Most entries a playbook holds (and a recording keeps): 1 Mi extents, 64 GiB.
pub const MAX_PLAYBOOK_ENTRIES: usize = 1 << 20;
const HEADER_LEN: usize = 40;
const ENTRY_LEN: usize = 16;
const CRC_LEN: usize = 4;
/// Divisor cap of the running mean.
const MEAN_WINDOW: u64 = 8;

/// Why a playbook could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PlaybookError {
    /// A filesystem step failed.
    #[error("playbook {path}: {step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The bytes are not a valid playbook; nothing was loaded.
    #[error("playbook {path}: invalid: {reason}")]
    Invalid {
        /// The file (empty when decoding bytes).
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
}

/// One extent first touched by a foreground read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    /// The extent's first block.
    pub block: u64,
    /// Microseconds since the recording started (saturating).
    pub at_micros: u32,
}

/// The first foreground touches of one restore, in order, deduplicated by extent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recording {
    /// Touches in the order they happened.
    pub touches: Vec<Touch>,
}

/// One playbook entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaybookEntry {
    /// First block of the extent to fetch.
    pub block: u64,
    /// Mean first-touch time, µs after the start of a restore.
    pub mean_micros: u32,
    /// Bit `k` set: touched in the run merged `k` runs ago (bit 0 = newest).
    pub history: u32,
}

/// How [`Playbook::merge_with`] ages entries (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeRule {
    /// Drop entries touched in none of the last this many runs (1..=32).
    pub keep_runs: u32,
    /// Longest playbook (at most [`MAX_PLAYBOOK_ENTRIES`]).
    pub max_entries: usize,
}

impl Default for MergeRule {
    /// Entries survive 4 runs without a touch; at most 65 536 entries (4 GiB).
    fn default() -> MergeRule {
        MergeRule { keep_runs: 4, max_entries: 1 << 16 }
    }
}

/// An ordered list of extents to prefetch, improved by every restore merged into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Playbook {
    disk_size: u64,
    runs: u64,
    entries: Vec<PlaybookEntry>,
}

impl Playbook {
    /// An empty playbook for a `disk_size`-byte disk.
    pub fn new(disk_size: u64) -> Playbook {
        Playbook { disk_size, runs: 0, entries: Vec::new() }
    }

    /// A playbook holding one run.
    pub fn from_recording(disk_size: u64, observed: &Recording) -> Playbook {
        let mut p = Playbook::new(disk_size);
        p.merge(observed);
        p
    }

    /// The disk size it is for.
    pub fn disk_size(&self) -> u64 {
        self.disk_size
    }

    /// Runs merged so far.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// The entries, in prefetch order.
    pub fn entries(&self) -> &[PlaybookEntry] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The blocks to prefetch, in order.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|e| e.block)
    }

    /// [`Playbook::merge_with`] the default rule.
    pub fn merge(&mut self, observed: &Recording) {
        self.merge_with(observed, &MergeRule::default());
    }

    /// Merges one restore's recording (see the module doc for the rule). Touches of
    /// blocks past the disk's end are ignored; a block touched twice counts once.
    pub fn merge_with(&mut self, observed: &Recording, rule: &MergeRule) {
        let keep_mask = if rule.keep_runs >= 32 { u32::MAX } else { (1u32 << rule.keep_runs.max(1)) - 1 };
        let blocks = blocks_for(self.disk_size);
        let mut now: HashMap<u64, u32> = HashMap::with_capacity(observed.touches.len());
        for t in &observed.touches {
            if t.block < blocks {
                now.entry(t.block).or_insert(t.at_micros);
            }
        }
        for e in &mut self.entries {
            e.history <<= 1;
            if let Some(t) = now.remove(&e.block) {
                e.history |= 1;
                let n = u64::from(e.history.count_ones()).min(MEAN_WINDOW) as i64;
                let mean = i64::from(e.mean_micros);
                e.mean_micros = (mean + (i64::from(t) - mean) / n).clamp(0, i64::from(u32::MAX)) as u32;
            }
        }
        self.entries.retain(|e| e.history & keep_mask != 0);
        self.entries.extend(now.into_iter().map(|(block, t)| PlaybookEntry { block, mean_micros: t, history: 1 }));
        self.entries.sort_unstable_by_key(|e| (e.mean_micros, e.block));
        self.entries.truncate(rule.max_entries.min(MAX_PLAYBOOK_ENTRIES));
        self.runs += 1;
    }

    /// The file bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + ENTRY_LEN * self.entries.len() + CRC_LEN);
        out.extend_from_slice(&PLAYBOOK_MAGIC);
        out.extend_from_slice(&PLAYBOOK_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.disk_size.to_le_bytes());
        out.extend_from_slice(&self.runs.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.block.to_le_bytes());
            out.extend_from_slice(&e.mean_micros.to_le_bytes());
            out.extend_from_slice(&e.history.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and validates file bytes.
    pub fn decode(bytes: &[u8]) -> Result<Playbook, PlaybookError> {
        decode(bytes).map_err(|m| PlaybookError::Invalid { path: PathBuf::new(), reason: m.0 })
    }

    /// Writes the playbook to `path` atomically (temp file, fsync, rename, directory fsync).
    pub fn save(&self, path: &Path) -> Result<(), PlaybookError> {
        let io = |step| move |source| PlaybookError::Io { step, path: path.to_path_buf(), source };
        let mut name = path.file_name().map(std::ffi::OsString::from).unwrap_or_default();
        // Per process: two VMMs ending their recordings at once each write their own.
        name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(name);
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp).map_err(io("creating"))?;
        f.write_all(&self.encode()).and_then(|()| f.sync_all()).map_err(io("writing"))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io("renaming into place"))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing the directory"))
    }

    /// Merges one restore's recording into the playbook file at `path` and saves it:
    /// the file's playbook when it is one for a `disk_size`-byte disk, else a new one (a
    /// missing, unreadable or other-size file is replaced: a playbook is only a hint).
    /// Creates the parent directory. Returns the playbook as saved.
    pub fn merge_into_file(
        path: &Path,
        disk_size: u64,
        observed: &Recording,
        rule: &MergeRule,
    ) -> Result<Playbook, PlaybookError> {
        let mut book = Playbook::load(path)
            .ok()
            .filter(|b| b.disk_size() == disk_size)
            .unwrap_or_else(|| Playbook::new(disk_size));
        book.merge_with(observed, rule);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|source| PlaybookError::Io {
                step: "creating its directory",
                path: path.to_path_buf(),
                source,
            })?;
        }
        book.save(path)?;
        Ok(book)
    }

    /// Reads and validates the playbook at `path`, refusing files over the size cap
    /// before reading them.
    pub fn load(path: &Path) -> Result<Playbook, PlaybookError> {
        let io = |step| move |source| PlaybookError::Io { step, path: path.to_path_buf(), source };
        let cap = (HEADER_LEN + ENTRY_LEN * MAX_PLAYBOOK_ENTRIES + CRC_LEN) as u64;
        let file = File::open(path).map_err(io("opening"))?;
        let mut bytes = Vec::new();
        file.take(cap + 1).read_to_end(&mut bytes).map_err(io("reading"))?;
        if bytes.len() as u64 > cap {
            return Err(PlaybookError::Invalid {
                path: path.to_path_buf(),
                reason: format!("larger than the {cap}-byte cap"),
            });
        }
        decode(&bytes).map_err(|m| PlaybookError::Invalid { path: path.to_path_buf(), reason: m.0 })
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn decode(bytes: &[u8]) -> Result<Playbook, crate::malformed::Malformed> {
    if bytes.len() < HEADER_LEN + CRC_LEN {
        return Err(format!("{} bytes, shorter than a header and checksum", bytes.len()).into());
    }
    if bytes[..8] != PLAYBOOK_MAGIC {
        return Err(format!("not a playbook (magic {:02x?})", &bytes[..8]).into());
    }
    let version = le_u32(bytes, 8);
    if version != PLAYBOOK_VERSION {
        return Err(format!("format version {version}; this build reads version {PLAYBOOK_VERSION}").into());
    }
    let count = le_u64(bytes, 32);
    if count > MAX_PLAYBOOK_ENTRIES as u64 {
        return Err(format!("{count} entries, more than the cap of {MAX_PLAYBOOK_ENTRIES}").into());
    }
    let expected = HEADER_LEN + ENTRY_LEN * count as usize + CRC_LEN;
    if bytes.len() != expected {
        return Err(format!("{} bytes, its header implies {expected}: truncated or trailing data", bytes.len()).into());
    }
    let body = bytes.len() - CRC_LEN;
    let (stored, computed) = (le_u32(bytes, body), crc32fast::hash(&bytes[..body]));
    if stored != computed {
        return Err(format!("checksum {stored:#010x} stored, {computed:#010x} computed").into());
    }
    let flags = le_u32(bytes, 12);
    if flags != 0 {
        return Err(format!("unknown flags {flags:#x}").into());
    }
    let disk_size = le_u64(bytes, 16);
    if disk_size > MAX_DISK_BYTES {
        return Err(format!("disk size {disk_size} over the {MAX_DISK_BYTES}-byte cap").into());
    }
    let blocks = blocks_for(disk_size);
    let runs = le_u64(bytes, 24);
    let mut seen = std::collections::HashSet::with_capacity(count as usize);
    let mut entries = Vec::with_capacity(count as usize);
    for raw in bytes[HEADER_LEN..body].chunks_exact(ENTRY_LEN) {
        let e = PlaybookEntry { block: le_u64(raw, 0), mean_micros: le_u32(raw, 8), history: le_u32(raw, 12) };
        if e.block >= blocks {
            return Err(format!("entry block {} past the disk's {blocks} blocks", e.block).into());
        }
        if e.history == 0 {
            return Err(format!("entry block {} has an empty history", e.block).into());
        }
        if !seen.insert(e.block) {
            return Err(format!("entry block {} listed twice", e.block).into());
        }
        entries.push(e);
    }
    Ok(Playbook { disk_size, runs, entries })
}
