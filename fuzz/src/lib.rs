//! Shared harness for forkvm's fuzz targets (`fuzz_targets/*.rs`).
//!
//! What lives here: a byte cursor that never runs out ([`Bytes`]), a per-process scratch
//! directory ([`scratch`]), and the virtqueue harness the three virtio targets share
//! ([`virtq`]): guest memory, split virtqueues laid out from the fuzz input, and an encoder
//! ([`virtq::Builder`]) that `examples/gen_seeds.rs` uses to write inputs that parse.
//!
//! Nothing here is fuzzed code: it only turns bytes into the calls a guest, a peer or a
//! snapshot file would make. See `docs/fuzzing.md` for what each target covers.

pub mod virtq;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Reads fixed-size fields from the fuzz input; past the end every read is zero, so a
/// short input is still a complete (if boring) case and no length check can fail.
#[derive(Debug, Clone)]
pub struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, at: 0 }
    }

    /// `n` bytes (fewer at the end of the input).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.at = start.saturating_add(n);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        self.at = self.data.len();
        &self.data[start..]
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// `N` bytes, zero-padded past the end of the input.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let got = self.take(N);
        out[..got.len()].copy_from_slice(got);
        out
    }

    /// Whether everything has been read.
    pub fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }
}

/// A directory private to this fuzzing process: `$TMPDIR/forkvm-fuzz-<pid>`, never in
/// the repository. libFuzzer ends a process with `_exit`, so nothing removes it then;
/// instead each process removes the directories of processes that are gone.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.strip_prefix("forkvm-fuzz-")).and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = tmp.join(format!("forkvm-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("harness: creating the scratch dir");
        dir
    })
}

/// A fresh, empty directory `name` under [`scratch`] (whatever was there is removed).
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = scratch().join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("harness: cannot clear {}: {e}", dir.display()),
    }
    std::fs::create_dir_all(&dir).expect("harness: creating a work dir");
    dir
}

/// Every path under `dir` (not following links), relative to `dir`, sorted.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path.clone());
            }
            out.push(path.strip_prefix(dir).unwrap_or(&path).to_path_buf());
        }
    }
    out.sort();
    out
}

/// The chunks the `page_map` target's store holds, so seeds can reference chunks that
/// exist: 1, 2 and 16 pages of distinct patterns.
pub fn page_map_chunks() -> Vec<Vec<u8>> {
    [1usize, 2, 16]
        .iter()
        .enumerate()
        .map(|(k, &pages)| (0..pages * 4096).map(|i| (i as u8).wrapping_mul(31) ^ (k as u8 + 1)).collect())
        .collect()
}

/// Vault manifest files as `vault::manifest::encode` writes them (format in
/// `crates/forkvm-snapshot/src/vault/mod.rs`), so the `chunk_index` target and the seeds
/// can put arbitrary JSON behind a valid authentication tag.
pub mod vault_seal {
    use chacha20poly1305::aead::{Aead, KeyInit, Payload};
    use chacha20poly1305::{XChaCha20Poly1305, XNonce};

    /// The sandbox key of the harness's vault.
    pub const KEY: [u8; 32] = [7; 32];
    /// `vault/crypto.rs`: the AEAD sub-key's derivation context.
    pub const AEAD_CONTEXT: &str = "forkvm vault 2026 aead key v1";
    pub const MANIFEST_MAGIC: &[u8; 8] = b"FKVMVSN1";

    /// The manifest file of snapshot `seq` holding `json`.
    pub fn seal_manifest(json: &[u8], seq: u64) -> Vec<u8> {
        let key = blake3::derive_key(AEAD_CONTEXT, &KEY);
        let cipher = XChaCha20Poly1305::new((&key).into());
        let nonce = [9u8; 24];
        let aad = [&MANIFEST_MAGIC[..], &seq.to_le_bytes()].concat();
        let ct =
            cipher.encrypt(XNonce::from_slice(&nonce), Payload { msg: json, aad: &aad }).expect("harness: sealing");
        [&MANIFEST_MAGIC[..], &nonce, &ct].concat()
    }
}

/// Whether `FORKVM_FUZZ_DEBUG` is set: targets then print what a run did (device
/// counters, parse results), to check by hand that a seed reaches what it is meant to:
/// `FORKVM_FUZZ_DEBUG=1 fuzz/target/<host>/release/<target> <input file>`.
pub fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("FORKVM_FUZZ_DEBUG").is_some())
}
