//! `sha256:<hex>` content digests, parsed strictly: a digest from an image's JSON names a
//! file in the blob store, so it must be exactly 64 lower-case hex digits and nothing a
//! path could be made of.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Read, Write};

/// A sha256 content digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`; anything else is `None`.
    pub fn parse(text: &str) -> Option<Digest> {
        let hex = text.strip_prefix("sha256:")?;
        Digest::from_hex(hex)
    }

    /// The digest with these 64 lower-case hex digits.
    pub fn from_hex(hex: &str) -> Option<Digest> {
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then(|| Digest(hex.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(hex(&Sha256::digest(bytes)))
    }

    /// The 64 hex digits (a file name in the store).
    pub fn hex(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies `from` into `to`, hashing what passes; returns the digest and the length.
pub fn copy_hashed(from: &mut dyn Read, to: &mut dyn Write) -> io::Result<(Digest, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n])?;
        len += n as u64;
    }
    Ok((Digest(hex(&hasher.finalize())), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_sha256_digests_parse() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(Digest::parse(&good).unwrap().to_string(), good);
        for bad in [
            "sha256:".to_string(),
            format!("sha512:{}", "ab".repeat(32)),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha256:{}/", "ab".repeat(32)),
            format!("sha256:../{}", "ab".repeat(31)),
            format!("sha256:{}", "ab".repeat(33)),
        ] {
            assert_eq!(Digest::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn hashing_while_copying_matches_the_digest_of_the_bytes() {
        let data = b"hello, layer".repeat(10_000);
        let mut out = Vec::new();
        let (d, n) = copy_hashed(&mut &data[..], &mut out).unwrap();
        assert_eq!((d, n, out.len()), (Digest::of(&data), data.len() as u64, data.len()));
        assert_eq!(Digest::of(b"").hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
