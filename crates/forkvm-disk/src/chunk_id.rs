//! [`ChunkId`]: the name of a content-addressed chunk, the BLAKE3 hash of its
//! uncompressed bytes. Memory chunks (`forkvm_snapshot::chunk_store`) and a vault's
//! disk chunks (`vault::chunks`) are named the same way, so both use this one type.

use std::fmt;

/// The name of a chunk: the BLAKE3 hash of its uncompressed bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    /// The id of a chunk holding `data`.
    pub fn of(data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[usize::from(b >> 4)] as char);
            s.push(HEX[usize::from(b & 0xf)] as char);
        }
        s
    }

    /// Parses exactly 64 lowercase hex characters; anything else is [`BadChunkId`].
    pub fn from_hex(s: &str) -> Result<ChunkId, BadChunkId> {
        let bad = || BadChunkId(s.chars().take(80).collect());
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(bad());
        }
        let mut id = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = hex_digit(pair[0]).ok_or_else(bad)?;
            let lo = hex_digit(pair[1]).ok_or_else(bad)?;
            id[i] = (hi << 4) | lo;
        }
        Ok(ChunkId(id))
    }
}

/// The value of a lowercase hex digit.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({}…)", &self.to_hex()[..16])
    }
}

/// Text that is not 64 lowercase hex characters (the first 80 characters of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunk id {0:?}: expected 64 lowercase hex characters")]
pub struct BadChunkId(pub String);
