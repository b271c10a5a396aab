//! Request targets built from caller strings. Every id, tag and query value is
//! percent-encoded, so a sandbox id like `../snapshots/x` or a path with `&` or `#`
//! stays one path segment or one query value and can never reach another route.

use crate::error::ClientError;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986 unreserved characters is encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
/// In a query value `/` may stay as it is (it is common in file paths and harmless).
const QUERY: &AsciiSet = &SEGMENT.remove(b'/');

/// A path plus query under construction: `Target::new("/v1/sandboxes").segment("id", id)?`.
#[derive(Debug)]
pub(crate) struct Target {
    text: String,
    has_query: bool,
}

impl Target {
    pub(crate) fn new(base: &'static str) -> Target {
        Target { text: base.to_string(), has_query: false }
    }

    /// Appends `/<value>`, encoded. Refuses an empty value (it would address the
    /// collection, e.g. `GET /v1/sandboxes/` lists instead of failing) and encodes a
    /// value of only dots, which a path normaliser would treat as `.` or `..`.
    pub(crate) fn segment(mut self, what: &'static str, value: &str) -> Result<Target, ClientError> {
        debug_assert!(!self.has_query, "segments go before the query");
        if value.is_empty() {
            return Err(ClientError::InvalidArgument { what, value: String::new(), reason: "must not be empty" });
        }
        self.text.push('/');
        if value.bytes().all(|b| b == b'.') {
            self.text.push_str(&"%2E".repeat(value.len()));
        } else {
            self.text.extend(utf8_percent_encode(value, SEGMENT));
        }
        Ok(self)
    }

    /// Appends a fixed piece of path such as `/exec`.
    pub(crate) fn push(mut self, literal: &'static str) -> Target {
        self.text.push_str(literal);
        self
    }

    /// Appends `key=value` to the query, the value encoded.
    pub(crate) fn query(mut self, key: &'static str, value: &str) -> Target {
        self.text.push(if self.has_query { '&' } else { '?' });
        self.has_query = true;
        self.text.push_str(key);
        self.text.push('=');
        self.text.extend(utf8_percent_encode(value, QUERY));
        self
    }

    pub(crate) fn build(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str) -> String {
        Target::new("/v1/sandboxes").segment("sandbox id", id).unwrap().push("/exec").build()
    }

    #[test]
    fn plain_ids_are_unchanged() {
        assert_eq!(sandbox("sb-1a2b_c.d~e"), "/v1/sandboxes/sb-1a2b_c.d~e/exec");
    }

    #[test]
    fn ids_can_never_traverse() {
        assert_eq!(sandbox("../snapshots/x"), "/v1/sandboxes/..%2Fsnapshots%2Fx/exec");
        assert_eq!(sandbox(".."), "/v1/sandboxes/%2E%2E/exec");
        assert_eq!(sandbox("."), "/v1/sandboxes/%2E/exec");
        assert_eq!(sandbox("a?b#c d%"), "/v1/sandboxes/a%3Fb%23c%20d%25/exec");
        assert_eq!(sandbox("ü"), "/v1/sandboxes/%C3%BC/exec");
    }

    #[test]
    fn empty_ids_are_refused() {
        let e = Target::new("/v1/sandboxes").segment("sandbox id", "").unwrap_err();
        assert_eq!(e.to_string(), "sandbox id \"\": must not be empty");
    }

    #[test]
    fn query_values_are_encoded() {
        let t = Target::new("/v1/sandboxes")
            .segment("sandbox id", "x")
            .unwrap()
            .push("/files")
            .query("path", "/tmp/a b&c=d#e+f")
            .query("mode", "420")
            .build();
        assert_eq!(t, "/v1/sandboxes/x/files?path=/tmp/a%20b%26c%3Dd%23e%2Bf&mode=420");
    }
}
