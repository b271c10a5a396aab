//! The one rule for snapshot tags.
//!
//! A tag becomes a directory name under `<store>/snapshots/`, so it must never
//! be able to escape that directory or hide from listings. Every place that
//! accepts a tag (CLI, store, metadata) validates it with [`validate_tag`].

/// Longest accepted tag, in characters (all ASCII, so also bytes).
pub const TAG_MAX_LEN: usize = 128;

/// Which tag rule was broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// The tag is the empty string.
    #[error("invalid tag {0:?}: a tag must not be empty")]
    Empty(String),
    /// The tag is longer than [`TAG_MAX_LEN`].
    #[error("invalid tag {tag:?}: a tag is at most {max} characters, this one has {len}")]
    TooLong {
        /// The rejected tag.
        tag: String,
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The first character is not an ASCII letter or digit.
    #[error("invalid tag {0:?}: a tag must start with an ASCII letter or digit")]
    BadFirstChar(String),
    /// A character outside `[A-Za-z0-9._-]` appears.
    #[error("invalid tag {tag:?}: character {ch:?} is not allowed (use ASCII letters, digits, '.', '_' or '-')")]
    BadChar {
        /// The rejected tag.
        tag: String,
        /// The first offending character.
        ch: char,
    },
    /// The tag contains `..`.
    #[error("invalid tag {0:?}: a tag must not contain \"..\"")]
    DotDot(String),
    /// The tag ends in `.partial`, the suffix of snapshots being written.
    #[error("invalid tag {0:?}: the suffix \".partial\" is reserved for snapshots being written")]
    Reserved(String),
}

/// Checks `tag` against the tag rule: 1 to 128 characters, first an ASCII
/// letter or digit, the rest ASCII letters, digits, `.`, `_` or `-`, and no
/// `..` anywhere.
pub fn validate_tag(tag: &str) -> Result<(), TagError> {
    let mut chars = tag.chars();
    let Some(first) = chars.next() else {
        return Err(TagError::Empty(tag.to_string()));
    };
    let len = tag.chars().count();
    if len > TAG_MAX_LEN {
        return Err(TagError::TooLong { tag: tag.to_string(), len, max: TAG_MAX_LEN });
    }
    if !first.is_ascii_alphanumeric() {
        return Err(TagError::BadFirstChar(tag.to_string()));
    }
    if let Some(ch) = chars.find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(TagError::BadChar { tag: tag.to_string(), ch });
    }
    if tag.contains("..") {
        return Err(TagError::DotDot(tag.to_string()));
    }
    if tag.ends_with(".partial") {
        return Err(TagError::Reserved(tag.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_tags() {
        for tag in ["a", "base", "v1.2.3", "my_snap-01", "A9", "x.y_z-w"] {
            assert_eq!(validate_tag(tag), Ok(()), "{tag}");
        }
        assert_eq!(validate_tag(&"a".repeat(128)), Ok(()));
    }

    #[test]
    fn rejects_the_staging_suffix() {
        assert_eq!(validate_tag("t.partial"), Err(TagError::Reserved("t.partial".into())));
        assert_eq!(validate_tag("t.partial2"), Ok(()));
    }

    #[test]
    fn rejects_empty() {
        assert_eq!(validate_tag(""), Err(TagError::Empty(String::new())));
    }

    #[test]
    fn rejects_too_long() {
        let tag = "a".repeat(129);
        let err = validate_tag(&tag).unwrap_err();
        assert!(matches!(err, TagError::TooLong { len: 129, max: 128, .. }));
        assert!(err.to_string().contains("at most 128"));
    }

    #[test]
    fn rejects_path_traversal() {
        assert!(matches!(validate_tag("../x").unwrap_err(), TagError::BadFirstChar(_)));
        assert!(matches!(validate_tag("a/b").unwrap_err(), TagError::BadChar { ch: '/', .. }));
        assert!(matches!(validate_tag("a/../b").unwrap_err(), TagError::BadChar { ch: '/', .. }));
        assert!(matches!(validate_tag("a..b").unwrap_err(), TagError::DotDot(_)));
        assert!(matches!(validate_tag("/etc").unwrap_err(), TagError::BadFirstChar(_)));
    }

    #[test]
    fn rejects_hidden_and_leading_punctuation() {
        for tag in [".hidden", ".", "..", "-flag", "_x"] {
            assert!(matches!(validate_tag(tag).unwrap_err(), TagError::BadFirstChar(_)), "{tag}");
        }
    }

    #[test]
    fn rejects_unicode_nul_and_whitespace() {
        for (tag, ch) in [("caf\u{e9}", '\u{e9}'), ("a\0b", '\0'), ("a b", ' '), ("a\\b", '\\')] {
            assert_eq!(validate_tag(tag), Err(TagError::BadChar { tag: tag.to_string(), ch }), "{tag:?}");
        }
        assert!(matches!(validate_tag("\u{e9}a").unwrap_err(), TagError::BadFirstChar(_)));
    }

    #[test]
    fn message_escapes_the_tag() {
        let err = validate_tag("a\0b").unwrap_err().to_string();
        assert!(err.contains("\"a\\0b\""), "{err}");
    }
}
