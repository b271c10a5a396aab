//! The `vmstate.bin` container: a small fixed header around an opaque payload.
//!
//! The payload (the encoded VM state) is produced elsewhere; this module only
//! makes sure that what we read back is exactly what we wrote, written by a
//! format we understand, and not absurdly large. `vmstate.bin` is untrusted
//! input, so every field of the header is checked before the payload is used.
//!
//! Layout (all integers little-endian):
//!
//! | offset | size | field                         |
//! |--------|------|-------------------------------|
//! | 0      | 8    | magic `b"FKVMSTAT"`           |
//! | 8      | 4    | format version (u32)          |
//! | 12     | 4    | CRC32 of the payload (u32)    |
//! | 16     | 8    | payload length in bytes (u64) |
//! | 24     | n    | payload                       |

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Magic bytes at the start of every `vmstate.bin`.
pub const VMSTATE_MAGIC: [u8; 8] = *b"FKVMSTAT";

/// Format version of the `vmstate.bin` payload written by this build.
///
/// Compatibility rule: a reader accepts exactly the versions it knows (today
/// only this one). Any change to the encoded VmState layout, however small,
/// bumps this number. Files with any other version — older or newer — are
/// refused with [`ContainerError::UnsupportedVersion`]; they are never
/// misread as the current layout.
///
/// History: 1 — first format; 2 — `DevicesState` gains the virtio-mmio transports;
/// 3 — `BlockState` gains a layered disk's sealed layer ids.
pub const VMSTATE_FORMAT_VERSION: u32 = 3;

/// Largest payload accepted when reading (64 MiB). VM state (registers,
/// irqchip, device state) is tiny; anything bigger is corrupt or hostile.
pub const VMSTATE_MAX_BYTES: u64 = 64 << 20;

/// Size of the fixed header that precedes the payload.
pub const VMSTATE_HEADER_LEN: usize = 8 + 4 + 4 + 8;

/// Why a `vmstate.bin` could not be read, decoded or written.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// The file is shorter than its header claims (or than the header itself).
    #[error("vmstate.bin: truncated (expected {expected} bytes, found {actual}): the file is incomplete or corrupt")]
    Truncated {
        /// Bytes required.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The file has bytes after the declared payload.
    #[error("vmstate.bin: {extra} unexpected trailing bytes after the {declared}-byte payload: the file is corrupt")]
    TrailingBytes {
        /// Payload length declared in the header.
        declared: u64,
        /// Number of extra bytes.
        extra: u64,
    },
    /// The file does not start with [`VMSTATE_MAGIC`].
    #[error("vmstate.bin: bad magic {found:02x?} (expected \"FKVMSTAT\"): not a forkvm VM state file")]
    BadMagic {
        /// The first 8 bytes of the file.
        found: [u8; 8],
    },
    /// The file was written with a format version this build does not know.
    #[error("vmstate.bin: format version {found} is not supported (this build reads version {supported}): re-create the snapshot with this forkvm version")]
    UnsupportedVersion {
        /// Version stored in the file.
        found: u32,
        /// Version this build supports.
        supported: u32,
    },
    /// The declared or actual size exceeds [`VMSTATE_MAX_BYTES`].
    #[error("vmstate.bin: {size} bytes exceeds the {max}-byte limit: the file is corrupt")]
    TooLarge {
        /// Size found (declared payload length or file size).
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The payload checksum does not match the header.
    #[error("vmstate.bin: checksum mismatch (stored {expected:#010x}, computed {actual:#010x}): the file is corrupt")]
    CrcMismatch {
        /// CRC32 stored in the header.
        expected: u32,
        /// CRC32 computed over the payload.
        actual: u32,
    },
    /// The file does not exist.
    #[error("vmstate.bin missing: {0} does not exist")]
    Missing(PathBuf),
    /// Reading the file's metadata failed.
    #[error("vmstate.bin: cannot stat {path}: {source}")]
    StatFile {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Opening or reading the file failed.
    #[error("vmstate.bin: cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// Creating, writing or syncing the file failed.
    #[error("vmstate.bin: cannot write {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
}

/// Wraps `payload` in the `vmstate.bin` container (header + payload).
pub fn encode_vmstate(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(VMSTATE_HEADER_LEN + payload.len());
    out.extend_from_slice(&VMSTATE_MAGIC);
    out.extend_from_slice(&VMSTATE_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Validates a whole `vmstate.bin` image and returns its payload.
///
/// Checks, in order: header length, magic, version, declared length against
/// [`VMSTATE_MAX_BYTES`], actual length against declared length, CRC32.
pub fn decode_vmstate(bytes: &[u8]) -> Result<&[u8], ContainerError> {
    if bytes.len() < VMSTATE_HEADER_LEN {
        return Err(ContainerError::Truncated { expected: VMSTATE_HEADER_LEN as u64, actual: bytes.len() as u64 });
    }
    let (header, payload) = bytes.split_at(VMSTATE_HEADER_LEN);
    let magic: [u8; 8] = field(header, 0);
    let version = u32::from_le_bytes(field(header, 8));
    let stored_crc = u32::from_le_bytes(field(header, 12));
    let declared = u64::from_le_bytes(field(header, 16));

    if magic != VMSTATE_MAGIC {
        return Err(ContainerError::BadMagic { found: magic });
    }
    if version != VMSTATE_FORMAT_VERSION {
        return Err(ContainerError::UnsupportedVersion { found: version, supported: VMSTATE_FORMAT_VERSION });
    }
    if declared > VMSTATE_MAX_BYTES {
        return Err(ContainerError::TooLarge { size: declared, max: VMSTATE_MAX_BYTES });
    }
    let actual = payload.len() as u64;
    if actual < declared {
        return Err(ContainerError::Truncated {
            expected: VMSTATE_HEADER_LEN as u64 + declared,
            actual: bytes.len() as u64,
        });
    }
    if actual > declared {
        return Err(ContainerError::TrailingBytes { declared, extra: actual - declared });
    }
    let computed = crc32fast::hash(payload);
    if computed != stored_crc {
        return Err(ContainerError::CrcMismatch { expected: stored_crc, actual: computed });
    }
    Ok(payload)
}

/// Copies the `N` header bytes starting at `at` into an array.
fn field<const N: usize>(header: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

/// Reads and validates `vmstate.bin` at `path`, returning the payload.
///
/// The file size is checked against the cap before anything is read, so a
/// huge or hostile file never gets loaded into memory.
pub fn read_vmstate_file(path: &Path) -> Result<Vec<u8>, ContainerError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ContainerError::Missing(path.to_path_buf())),
        Err(source) => return Err(ContainerError::StatFile { path: path.to_path_buf(), source }),
    };
    let max_file = VMSTATE_MAX_BYTES + VMSTATE_HEADER_LEN as u64;
    if meta.len() > max_file {
        return Err(ContainerError::TooLarge { size: meta.len(), max: VMSTATE_MAX_BYTES });
    }
    let read_err = |source| ContainerError::ReadFile { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(read_err)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bound the read too, in case the file grows after the stat.
    file.take(max_file + 1).read_to_end(&mut bytes).map_err(read_err)?;
    decode_vmstate(&bytes).map(<[u8]>::to_vec)
}

/// Writes `payload` wrapped in the container to `path` and fsyncs the file.
pub fn write_vmstate_file(path: &Path, payload: &[u8]) -> Result<(), ContainerError> {
    let write_err = |source| ContainerError::WriteFile { path: path.to_path_buf(), source };
    let mut file = File::create(path).map_err(write_err)?;
    file.write_all(&encode_vmstate(payload)).map_err(write_err)?;
    file.sync_all().map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_u32(bytes: &mut [u8], at: usize, v: u32) {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn round_trip_returns_identical_payload() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let bytes = encode_vmstate(&payload);
        assert_eq!(bytes.len(), VMSTATE_HEADER_LEN + payload.len());
        assert_eq!(&bytes[..8], b"FKVMSTAT");
        assert_eq!(decode_vmstate(&bytes).unwrap(), &payload[..]);
    }

    #[test]
    fn empty_payload_round_trips() {
        let bytes = encode_vmstate(&[]);
        assert_eq!(decode_vmstate(&bytes).unwrap(), &[] as &[u8]);
    }

    #[test]
    fn short_header_is_truncated() {
        let err = decode_vmstate(b"FKVM").unwrap_err();
        assert!(matches!(err, ContainerError::Truncated { expected: 24, actual: 4 }));
    }

    #[test]
    fn bad_magic_is_refused() {
        let mut bytes = encode_vmstate(b"abc");
        bytes[0] = b'X';
        let err = decode_vmstate(&bytes).unwrap_err();
        assert!(matches!(err, ContainerError::BadMagic { .. }));
        assert!(err.to_string().contains("not a forkvm VM state file"));
    }

    #[test]
    fn other_versions_are_refused() {
        for v in [0, VMSTATE_FORMAT_VERSION - 1, VMSTATE_FORMAT_VERSION + 1, u32::MAX] {
            let mut bytes = encode_vmstate(b"abc");
            set_u32(&mut bytes, 8, v);
            let err = decode_vmstate(&bytes).unwrap_err();
            assert!(matches!(
                err,
                ContainerError::UnsupportedVersion { found, supported: VMSTATE_FORMAT_VERSION } if found == v
            ));
        }
    }

    #[test]
    fn oversized_declared_length_is_refused_before_reading() {
        let mut bytes = encode_vmstate(b"abc");
        bytes[16..24].copy_from_slice(&(VMSTATE_MAX_BYTES + 1).to_le_bytes());
        let err = decode_vmstate(&bytes).unwrap_err();
        assert!(matches!(err, ContainerError::TooLarge { .. }));
    }

    #[test]
    fn truncated_payload_is_reported() {
        let bytes = encode_vmstate(b"hello world");
        let err = decode_vmstate(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(matches!(err, ContainerError::Truncated { expected: 35, actual: 32 }));
    }

    #[test]
    fn trailing_bytes_are_reported() {
        let mut bytes = encode_vmstate(b"hello");
        bytes.extend_from_slice(b"xx");
        let err = decode_vmstate(&bytes).unwrap_err();
        assert!(matches!(err, ContainerError::TrailingBytes { declared: 5, extra: 2 }));
    }

    #[test]
    fn flipped_payload_bit_fails_crc() {
        let mut bytes = encode_vmstate(b"hello world");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let err = decode_vmstate(&bytes).unwrap_err();
        assert!(matches!(err, ContainerError::CrcMismatch { .. }));
        let msg = err.to_string();
        assert!(msg.starts_with("vmstate.bin: checksum mismatch (stored 0x"), "{msg}");
        assert!(msg.ends_with("the file is corrupt"), "{msg}");
    }

    #[test]
    fn file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstate.bin");
        write_vmstate_file(&path, b"payload bytes").unwrap();
        assert_eq!(read_vmstate_file(&path).unwrap(), b"payload bytes");
    }

    #[test]
    fn missing_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstate.bin");
        let err = read_vmstate_file(&path).unwrap_err();
        assert!(matches!(&err, ContainerError::Missing(p) if p == &path));
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn oversized_file_is_refused_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstate.bin");
        let f = File::create(&path).unwrap();
        f.set_len(VMSTATE_MAX_BYTES + VMSTATE_HEADER_LEN as u64 + 1).unwrap();
        let err = read_vmstate_file(&path).unwrap_err();
        assert!(matches!(err, ContainerError::TooLarge { .. }));
    }

    #[test]
    fn corrupt_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstate.bin");
        let mut bytes = encode_vmstate(b"payload");
        bytes[VMSTATE_HEADER_LEN] ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let err = read_vmstate_file(&path).unwrap_err();
        assert!(matches!(err, ContainerError::CrcMismatch { .. }));
    }
}
