//! The bearer token of TCP listeners (the Unix socket is guarded by its file mode and
//! peer check instead; `gate` checks the token). The token is read once at start;
//! comparison takes the same time whatever the guess (`subtle`), and a guess of a
//! different length is compared against a padded copy so its length leaks nothing either.

use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Shortest token accepted.
pub const MIN_TOKEN_BYTES: usize = 16;
const PLACEHOLDERS: &[&str] = &["REPLACE_ME", "CHANGE_ME", "CHANGEME", "changeme", "TODO"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token is {0} bytes; it must be at least {MIN_TOKEN_BYTES}")]
    TooShort(usize),
    #[error("the token is a placeholder ({0}...): generate one, e.g. `head -c 32 /dev/urandom | base64`")]
    Placeholder(&'static str),
    #[error("the token contains whitespace or control characters")]
    BadChars,
    #[error("reading the token file {path}: {detail}")]
    Read { path: String, detail: String },
}

/// A validated bearer token.
#[derive(Clone)]
pub struct Token(Arc<Vec<u8>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Checks a token: at least [`MIN_TOKEN_BYTES`], no placeholder, no whitespace.
    pub fn new(raw: &str) -> Result<Token, TokenError> {
        let t = raw.trim();
        if t.is_empty() {
            return Err(TokenError::Empty);
        }
        if let Some(p) = PLACEHOLDERS.iter().find(|p| t.starts_with(**p)) {
            return Err(TokenError::Placeholder(p));
        }
        if t.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort(t.len()));
        }
        if t.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(TokenError::BadChars);
        }
        Ok(Token(Arc::new(t.as_bytes().to_vec())))
    }

    /// Reads and checks the token in `path` (trimmed).
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| TokenError::Read { path: path.display().to_string(), detail: e.to_string() })?;
        Token::new(&raw)
    }

    /// Constant-time comparison with a presented token.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let want = self.0.as_slice();
        let mut padded = vec![0u8; want.len()];
        let n = presented.len().min(want.len());
        padded[..n].copy_from_slice(&presented[..n]);
        let same_len = subtle::Choice::from((presented.len() == want.len()) as u8);
        (padded.ct_eq(want) & same_len).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_rules() {
        assert_eq!(Token::new("").unwrap_err(), TokenError::Empty);
        assert_eq!(Token::new("short").unwrap_err(), TokenError::TooShort(5));
        assert!(matches!(Token::new("REPLACE_ME-0123456789abcdef"), Err(TokenError::Placeholder(_))));
        assert_eq!(Token::new("0123456789abcdef 01").unwrap_err(), TokenError::BadChars);
        assert!(Token::new("  0123456789abcdef\n").is_ok());
    }

    #[test]
    fn comparison() {
        let t = Token::new("0123456789abcdef").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b""));
        assert!(!format!("{t:?}").contains("0123"));
    }
}
