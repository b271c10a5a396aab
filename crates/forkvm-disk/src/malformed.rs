//! [`Malformed`]: why bytes read back from disk or from a pack are not the format they
//! claim to be — the first check that failed, worded for a human. Decoders of untrusted
//! formats (page maps, playbooks, vault manifests, packed chains) return it, and their
//! callers wrap it with the file or object it came from.

/// The first failed check of a decoder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

impl From<String> for Malformed {
    fn from(reason: String) -> Malformed {
        Malformed(reason)
    }
}

impl From<&str> for Malformed {
    fn from(reason: &str) -> Malformed {
        Malformed(reason.to_string())
    }
}
