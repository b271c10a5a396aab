//! `.dockerignore`: which paths of the build context COPY and ADD never see.
//!
//! The rules are Docker's: one pattern per line, `#` comments, `!` for an exception;
//! a pattern is cleaned (a leading `/` or `./` and a trailing `/` mean nothing) and
//! matches a path relative to the context root, or any directory above it, so
//! `node_modules` leaves out everything under it; `*` and `?` stop at `/`, `**` crosses
//! directories; the last matching line decides. The globs are `globset`'s.

use globset::{GlobBuilder, GlobMatcher};

/// The file's rules, in order.
#[derive(Debug, Default)]
pub struct IgnoreRules {
    rules: Vec<(GlobMatcher, bool)>,
}

impl IgnoreRules {
    /// Parses the text of a `.dockerignore`; a pattern that is not a valid glob is refused
    /// with its line number.
    pub fn parse(text: &str) -> Result<IgnoreRules, String> {
        let mut rules = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (exception, pattern) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let pattern = clean(pattern);
            if pattern.is_empty() {
                return Err(format!(".dockerignore line {}: {line:?} has no pattern", n + 1));
            }
            let glob = GlobBuilder::new(&pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| format!(".dockerignore line {}: {line:?}: {e}", n + 1))?;
            rules.push((glob.compile_matcher(), exception));
        }
        Ok(IgnoreRules { rules })
    }

    /// Whether `path` (relative to the context root, `/`-separated) is left out.
    pub fn excludes(&self, path: &str) -> bool {
        let mut excluded = false;
        for (glob, exception) in &self.rules {
            if glob.is_match(path) || parents(path).any(|p| glob.is_match(p)) {
                excluded = !exception;
            }
        }
        excluded
    }
}

/// The directories above `path`, nearest last: `a/b/c` gives `a`, `a/b`.
fn parents(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

/// A pattern without `.` components, repeated or trailing slashes, or a leading `/`.
fn clean(pattern: &str) -> String {
    let parts: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_exceptions_and_parents_decide_as_docker_does() {
        let r = IgnoreRules::parse("# c\n\n/target/\n*.log\n!keep.log\ndocs/**/*.tmp\n./secret\n").unwrap();
        for p in ["target", "target/a/b", "x.log", "secret", "docs/a/b/c.tmp", "docs/c.tmp"] {
            assert!(r.excludes(p), "{p}");
        }
        for p in ["keep.log", "src/x.log", "src/target", "docs/a.txt", "secretive"] {
            assert!(!r.excludes(p), "{p}");
        }
        let r = IgnoreRules::parse("*\n!app\n").unwrap();
        assert!(r.excludes("Dockerfile"));
        assert!(!r.excludes("app") && !r.excludes("app/main.py"));
        assert!(IgnoreRules::parse("ok\n[\n").unwrap_err().contains("line 2"));
        assert!(IgnoreRules::parse("!\n").unwrap_err().contains("no pattern"));
    }
}
