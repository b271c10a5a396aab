//! An upload's body hashed as it streams to the agent, and checked against the SHA-256
//! the client named (`?sha256=`) before the agent may commit it: at the body's end a
//! digest that differs is a read error, so the agent never gets the `End` frame that
//! would rename its temporary file into place, and a file upload leaves nothing. (An
//! unpack applies entries as they come: a tar upload refused so may have left the
//! entries before the end; the refusal says so.) The digest is answered either way
//! (`FileWritten.sha256`).

use crate::error::ApiError;
use sha2::{Digest, Sha256};
use std::io::Read;

/// The `sha256` of a query, checked: 64 hex digits (answered in lowercase).
pub fn expected_sha256(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    match raw {
        None => Ok(None),
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(Some(h.to_ascii_lowercase())),
        Some(h) => Err(ApiError::bad_request(format!("sha256 {h:?} is not 64 hex digits"))),
    }
}

/// A reader that hashes what passes through it and refuses to end on a wrong digest.
pub struct CheckedBody<R> {
    inner: R,
    hasher: Option<Sha256>,
    expected: Option<String>,
    digest: Option<String>,
    /// What a refusal leaves, for its message.
    left: &'static str,
}

impl<R> std::fmt::Debug for CheckedBody<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedBody").field("expected", &self.expected).field("digest", &self.digest).finish()
    }
}

impl<R> CheckedBody<R> {
    /// `left` says what a refused upload leaves behind ("nothing was written").
    pub fn new(inner: R, expected: Option<String>, left: &'static str) -> CheckedBody<R> {
        CheckedBody { inner, hasher: Some(Sha256::new()), expected, digest: None, left }
    }

    /// The body's digest, once it was read to its end.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The refusal when the body was read to its end with another digest than asked.
    pub fn mismatch(&self) -> Option<ApiError> {
        let (got, want) = (self.digest.as_deref()?, self.expected.as_deref()?);
        (got != want).then(|| {
            ApiError::bad_request(format!("the body's sha256 is {got}, not the {want} asked for: {}", self.left))
        })
    }
}

impl<R: Read> Read for CheckedBody<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        match (&mut self.hasher, n) {
            (Some(h), 0) => {
                let hex: String = std::mem::take(h).finalize().iter().map(|b| format!("{b:02x}")).collect();
                self.hasher = None;
                self.digest = Some(hex);
                if self.mismatch().is_some() {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the body's sha256 differs"));
                }
            }
            (Some(h), n) => h.update(&buf[..n]),
            (None, _) => {}
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HI: &str = "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4";

    #[test]
    fn a_body_ends_only_with_the_digest_asked_for() {
        let mut ok = CheckedBody::new(&b"hi"[..], Some(HI.into()), "nothing");
        let mut out = Vec::new();
        ok.read_to_end(&mut out).unwrap();
        assert_eq!((out.as_slice(), ok.digest()), (&b"hi"[..], Some(HI)));
        assert!(ok.mismatch().is_none());
        let mut bad = CheckedBody::new(&b"ho"[..], Some(HI.into()), "nothing");
        assert!(bad.read_to_end(&mut Vec::new()).is_err(), "the end is an error: the agent commits nothing");
        assert!(bad.mismatch().unwrap().message.contains(HI));
        let mut unasked = CheckedBody::new(&b"hi"[..], None, "nothing");
        unasked.read_to_end(&mut Vec::new()).unwrap();
        assert_eq!(unasked.digest(), Some(HI));
    }

    #[test]
    fn an_asked_digest_is_64_hex_digits() {
        assert_eq!(expected_sha256(Some(&HI.to_uppercase())).unwrap().as_deref(), Some(HI));
        assert_eq!(expected_sha256(None).unwrap(), None);
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(65)] {
            assert!(expected_sha256(Some(bad)).is_err(), "{bad}");
        }
    }
}
