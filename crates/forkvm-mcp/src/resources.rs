//! MCP resources: each running sandbox's console log and file tree, addressed as
//!
//! * `forkvm://sandboxes/{id}/console`: the end of its serial console (64 KiB);
//! * `forkvm://sandboxes/{id}/tree/{path}`: the files under `/{path}`, one per line
//!   (`/etc/ssl/` for a directory, `/etc/hostname 12` for a file with its size),
//!   `?depth=` levels down (1 to 3, default 1), at most [`MAX_TREE_ENTRIES`] lines.

use crate::daemon::{CallError, Daemon};
use crate::tools::describe;
use forkvm_api::FileEntry;
use percent_encoding::percent_decode_str;
use rmcp::model::{Resource, ResourceTemplate};
use rmcp::ErrorData;

/// Lines of a tree listing at most.
pub const MAX_TREE_ENTRIES: usize = 500;
const MAX_DEPTH: u32 = 3;

/// What a resource URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceRef {
    Console { id: String },
    Tree { id: String, path: String, depth: u32 },
}

/// The URI templates (`resources/templates/list`).
pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new("forkvm://sandboxes/{id}/console", "sandbox console")
            .with_description("The end (64 KiB) of a sandbox's serial console log: its kernel's and init's messages, and why it stopped if it did.")
            .with_mime_type("text/plain"),
        ResourceTemplate::new("forkvm://sandboxes/{id}/tree/{+path}", "sandbox file tree")
            .with_description("The files under /{path} in a sandbox, one per line (directories end in /, files show their size); add ?depth=2 or 3 to go deeper.")
            .with_mime_type("text/plain"),
    ]
}

/// The concrete resources of one sandbox (`resources/list`).
pub fn of_sandbox(id: &str) -> [Resource; 2] {
    [
        Resource::new(format!("forkvm://sandboxes/{id}/console"), format!("{id} console"))
            .with_description("The end of the sandbox's serial console log.")
            .with_mime_type("text/plain"),
        Resource::new(format!("forkvm://sandboxes/{id}/tree/"), format!("{id} files"))
            .with_description("The sandbox's top-level directories and files.")
            .with_mime_type("text/plain"),
    ]
}

fn bad_uri(uri: &str, why: &str) -> ErrorData {
    ErrorData::resource_not_found(format!("resource {uri:?}: {why}"), None)
}

/// Parses a forkvm resource URI.
pub fn parse(uri: &str) -> Result<ResourceRef, ErrorData> {
    let rest = uri.strip_prefix("forkvm://sandboxes/").ok_or_else(|| bad_uri(uri, "not a forkvm://sandboxes/ URI"))?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (id, what) = rest.split_once('/').ok_or_else(|| bad_uri(uri, "no /console or /tree/ after the id"))?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(bad_uri(uri, "the sandbox id must be ASCII letters, digits, - or _"));
    }
    let id = id.to_string();
    if what == "console" {
        if query.is_some() {
            return Err(bad_uri(uri, "the console takes no query"));
        }
        return Ok(ResourceRef::Console { id });
    }
    let encoded = match what.strip_prefix("tree") {
        Some("") => "",
        Some(p) if p.starts_with('/') => &p[1..],
        _ => return Err(bad_uri(uri, "expected /console or /tree/{path} after the id")),
    };
    let decoded = percent_decode_str(encoded).decode_utf8().map_err(|_| bad_uri(uri, "the path is not UTF-8"))?;
    if decoded.contains('\0') {
        return Err(bad_uri(uri, "the path contains a NUL byte"));
    }
    let path = format!("/{}", decoded.trim_end_matches('/'));
    let depth = match query {
        None => 1,
        Some(q) => match q.strip_prefix("depth=").and_then(|d| d.parse::<u32>().ok()) {
            Some(d) if (1..=MAX_DEPTH).contains(&d) => d,
            _ => return Err(bad_uri(uri, "the only query is depth=1, 2 or 3")),
        },
    };
    Ok(ResourceRef::Tree { id, path, depth })
}

fn daemon_error(uri: &str, e: &CallError) -> ErrorData {
    ErrorData::resource_not_found(format!("reading {uri}: {}", describe(e)), None)
}

/// The text of a resource.
pub async fn read(daemon: &Daemon, uri: &str) -> Result<String, ErrorData> {
    match parse(uri)? {
        ResourceRef::Console { id } => {
            daemon.call(move |c| c.console(&id, None)).await.map_err(|e| daemon_error(uri, &e))
        }
        ResourceRef::Tree { id, path, depth } => {
            let lines = daemon.call(move |c| tree(&path, depth, |dir| c.list_files(&id, dir))).await;
            lines.map(|l| l.join("\n")).map_err(|e| daemon_error(uri, &e))
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The listing of `root`, breadth first, `depth` levels down, at most
/// [`MAX_TREE_ENTRIES`] lines (a last line says when it stopped there).
pub fn tree<E>(
    root: &str,
    depth: u32,
    mut list: impl FnMut(&str) -> Result<Vec<FileEntry>, E>,
) -> Result<Vec<String>, E> {
    let mut lines = Vec::new();
    let mut level = vec![root.to_string()];
    for d in 0..depth {
        let mut next = Vec::new();
        for dir in &level {
            let mut entries = list(dir)?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for e in entries {
                if lines.len() == MAX_TREE_ENTRIES {
                    lines.push(format!("[stopped at {MAX_TREE_ENTRIES} entries; read a subdirectory's tree]"));
                    return Ok(lines);
                }
                let path = join(dir, &e.name);
                match e.file_type.as_str() {
                    "dir" => {
                        lines.push(format!("{path}/"));
                        if d + 1 < depth {
                            next.push(path);
                        }
                    }
                    "file" => lines.push(format!("{path} {}", e.size)),
                    other => lines.push(format!("{path} ({other})")),
                }
            }
        }
        level = next;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: &str, size: u64) -> FileEntry {
        FileEntry { name: name.into(), file_type: kind.into(), size, mode: 0o644, mtime_unix_ns: 0 }
    }

    #[test]
    fn uris_parse_to_console_and_tree() {
        assert_eq!(parse("forkvm://sandboxes/ab-1/console").unwrap(), ResourceRef::Console { id: "ab-1".into() });
        for (uri, path, depth) in [
            ("forkvm://sandboxes/ab/tree/", "/", 1),
            ("forkvm://sandboxes/ab/tree", "/", 1),
            ("forkvm://sandboxes/ab/tree/etc/ssl/?depth=2", "/etc/ssl", 2),
            ("forkvm://sandboxes/ab/tree/my%20dir", "/my dir", 1),
        ] {
            assert_eq!(parse(uri).unwrap(), ResourceRef::Tree { id: "ab".into(), path: path.into(), depth }, "{uri}");
        }
    }

    #[test]
    fn bad_uris_are_refused_with_a_reason() {
        for (uri, why) in [
            ("file:///etc/passwd", "not a forkvm"),
            ("forkvm://sandboxes/ab", "no /console"),
            ("forkvm://sandboxes/../x/console", "sandbox id"),
            ("forkvm://sandboxes/ab/logs", "expected /console"),
            ("forkvm://sandboxes/ab/treex", "expected /console"),
            ("forkvm://sandboxes/ab/tree/?depth=9", "depth="),
            ("forkvm://sandboxes/ab/tree/a%00b", "NUL"),
            ("forkvm://sandboxes/ab/console?x=1", "no query"),
        ] {
            let e = parse(uri).unwrap_err();
            assert!(e.message.contains(why), "{uri}: {}", e.message);
        }
    }

    #[test]
    fn a_tree_lists_breadth_first_to_its_depth_and_stops_at_the_cap() {
        let list = |dir: &str| -> Result<Vec<FileEntry>, ()> {
            Ok(match dir {
                "/" => vec![entry("etc", "dir", 0), entry("a", "file", 3), entry("l", "symlink", 0)],
                "/etc" => vec![entry("hostname", "file", 12), entry("ssl", "dir", 0)],
                other => panic!("listed {other} beyond the depth"),
            })
        };
        assert_eq!(tree("/", 1, list).unwrap(), ["/a 3", "/etc/", "/l (symlink)"]);
        assert_eq!(tree("/", 2, list).unwrap(), ["/a 3", "/etc/", "/l (symlink)", "/etc/hostname 12", "/etc/ssl/"]);
        let many = |_: &str| -> Result<Vec<FileEntry>, ()> {
            Ok((0..600).map(|i| entry(&format!("f{i:03}"), "file", 1)).collect())
        };
        let lines = tree("/big", 1, many).unwrap();
        assert_eq!(lines.len(), MAX_TREE_ENTRIES + 1);
        assert!(lines.last().unwrap().starts_with("[stopped at 500"));
    }
}
