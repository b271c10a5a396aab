//! The build context: what a COPY or ADD takes from the directory the build was given,
//! and the tar stream that carries it into the build's sandbox.
//!
//! Sources are paths relative to the context root (a leading `/` means the root too),
//! `..` may not climb out of it, globs (`*`, `?`, `[...]`) match relative paths, and
//! `.dockerignore` leaves paths out as if they were not there. The links on a source's
//! way (its own name included) are followed only when the whole path resolves inside
//! the context; links found inside a copied directory are copied as links and never
//! followed. Nothing else of the host is read.
//!
//! Each selection has a digest of what it carries (names, kinds, modes, contents, link
//! targets; not mtimes), which is what the step's cache key depends on. The tar stream
//! checks every file against the content the digest was made from, so a file changed
//! between the two reads fails the step instead of being cached under the wrong key.

use super::ignore::IgnoreRules;
use super::tar_context::{TarIndex, TarKind};
use globset::GlobBuilder;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What one entry of a selection is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    File { size: u64, sha256: [u8; 32] },
    Dir,
    Symlink(PathBuf),
}

/// Where an entry's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file of this host's context directory.
    Host(PathBuf),
    /// A member of a staged context archive, its bytes at `offset`.
    Tar { file: Arc<PathBuf>, offset: u64 },
}

impl Source {
    /// The first `size` bytes (a host file is opened without following a link).
    pub fn open(&self, size: u64) -> io::Result<Box<dyn Read + Send>> {
        match self {
            Source::Host(p) => Ok(Box::new(open_nofollow(p)?.take(size))),
            Source::Tar { file, offset } => {
                let mut f = File::open(&**file)?;
                f.seek(io::SeekFrom::Start(*offset))?;
                Ok(Box::new(f.take(size)))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Host(p) => p.display().to_string(),
            Source::Tar { offset, .. } => format!("the context archive at byte {offset}"),
        }
    }
}

/// One path the copy makes, `name` relative to the destination directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub source: Source,
    pub kind: EntryKind,
    pub mode: u32,
    pub mtime: u64,
}

/// Where the build's files come from.
#[derive(Debug, Clone)]
pub enum Context {
    /// A directory of this host (a build from the CLI).
    Dir(PathBuf),
    /// A staged archive, indexed in place (a build through the daemon).
    Tar(Arc<TarIndex>),
}

impl Context {
    /// The directory, for a context that is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Context::Dir(d) => Some(d),
            Context::Tar(_) => None,
        }
    }

    /// A small file at the context's root (the Dockerfile, `.dockerignore`): its text, at
    /// most `limit` bytes, `None` when there is none.
    pub fn read_small(&self, name: &str, limit: u64) -> Result<Option<String>, String> {
        let bytes = match self {
            Context::Dir(d) => match open_nofollow(&d.join(name)) {
                Ok(f) => {
                    let mut v = Vec::new();
                    f.take(limit + 1).read_to_end(&mut v).map_err(|e| format!("reading {name}: {e}"))?;
                    Some(v)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(format!("reading {name}: {e}")),
            },
            Context::Tar(index) => index.read(name, limit + 1).map_err(|e| format!("reading {name}: {e}"))?,
        };
        let Some(bytes) = bytes else { return Ok(None) };
        if bytes.len() as u64 > limit {
            return Err(format!("{name} is over {limit} bytes"));
        }
        String::from_utf8(bytes).map(Some).map_err(|_| format!("{name} is not UTF-8 text"))
    }
}

/// What a COPY or ADD takes from the context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopySet {
    pub entries: Vec<Entry>,
    /// Local archives an ADD unpacks at the destination (where, its size, its hash).
    pub archives: Vec<(Source, u64, [u8; 32])>,
    /// Exactly one file and nothing else: the destination may name the file itself.
    pub single_file: bool,
    /// Hex SHA-256 of everything above that reaches the guest.
    pub digest: String,
}

/// Selects `sources` from `context`. `add` unpacks local tar archives (gzip-compressed
/// or not) instead of copying them.
pub fn select(context: &Context, ignore: &IgnoreRules, sources: &[String], add: bool) -> Result<CopySet, String> {
    for source in sources {
        if add && (source.contains("://") || source.starts_with("git@")) {
            return Err(format!("ADD {source}: URLs and git sources are not supported; download in a RUN step"));
        }
    }
    let at = match context {
        Context::Dir(root) => {
            Where::Dir(root.canonicalize().map_err(|e| format!("the build context {}: {e}", root.display()))?)
        }
        Context::Tar(index) => Where::Tar(index),
    };
    let mut set = CopySet::default();
    // Every name the context keeps, for glob sources; listed once.
    let mut all: Option<Vec<String>> = None;
    let mut files = 0;
    for source in sources {
        let rel = clean(source)?;
        let is_glob = rel.contains(['*', '?', '[']);
        let matched: Vec<String> = if is_glob {
            let glob = GlobBuilder::new(&rel)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("{source}: {e}"))?
                .compile_matcher();
            let names = match (&all, &at) {
                (Some(names), _) => names,
                (None, Where::Tar(index)) => {
                    all.insert(index.items.keys().filter(|n| !ignore.excludes(n)).cloned().collect())
                }
                (None, Where::Dir(root)) => all.insert(walk_names(root, ignore)?),
            };
            let m: Vec<String> = names.iter().filter(|p| glob.is_match(p.as_str())).cloned().collect();
            if m.is_empty() {
                return Err(format!("{source}: matches nothing in the build context"));
            }
            m
        } else {
            vec![rel]
        };
        let globbed = matched.len() != 1 || is_glob;
        for rel in &matched {
            if !rel.is_empty() && ignore.excludes(rel) {
                return Err(format!("{source}: not in the build context (left out by .dockerignore)"));
            }
            let file = match &at {
                Where::Tar(index) => add_tar_source(index, ignore, source, rel, add, &mut set)?,
                Where::Dir(root) => add_source(root, ignore, source, rel, add, &mut set)?,
            };
            if file && !globbed {
                files += 1;
            }
        }
    }
    set.single_file = sources.len() == 1 && files == 1 && set.entries.len() == 1;
    // One order for both kinds of context, each directory before what is in it.
    set.entries.sort_by(|a, b| a.name.split('/').cmp(b.name.split('/')));
    set.digest = digest(&set);
    Ok(set)
}

/// [`add_source`] for an indexed archive.
fn add_tar_source(
    index: &TarIndex,
    ignore: &IgnoreRules,
    source: &str,
    rel: &str,
    add: bool,
    set: &mut CopySet,
) -> Result<bool, String> {
    let resolved =
        if rel.is_empty() { String::new() } else { index.resolve(rel).map_err(|e| format!("{source}: {e}"))? };
    if !resolved.is_empty() && ignore.excludes(&resolved) {
        return Err(format!("{source}: resolves to {resolved}, left out by .dockerignore"));
    }
    let tar_source = |offset| Source::Tar { file: index.file.clone(), offset };
    let kind = if resolved.is_empty() { &TarKind::Dir } else { &index.items[&resolved].kind };
    match kind {
        TarKind::Dir => {
            let prefix = if resolved.is_empty() { String::new() } else { format!("{resolved}/") };
            for (name, item) in index.items.range(prefix.clone()..) {
                let Some(inner) = name.strip_prefix(&prefix) else { break };
                if inner.is_empty() || ignore.excludes(name) {
                    continue;
                }
                let (kind, source) = match &item.kind {
                    TarKind::Dir => (EntryKind::Dir, tar_source(0)),
                    TarKind::Symlink(t) => (EntryKind::Symlink(PathBuf::from(t)), tar_source(0)),
                    TarKind::File { offset, size } => {
                        let s = tar_source(*offset);
                        (EntryKind::File { size: *size, sha256: hash_reader(s.open(*size), name)? }, s)
                    }
                };
                set.entries.push(Entry { name: inner.to_string(), source, kind, mode: item.mode, mtime: item.mtime });
            }
            Ok(false)
        }
        TarKind::File { offset, size } => {
            let s = tar_source(*offset);
            let sha256 = hash_reader(s.open(*size), &resolved)?;
            if add && is_archive_reader(s.open(262), &resolved)? {
                set.archives.push((s, *size, sha256));
                return Ok(false);
            }
            let item = &index.items[&resolved];
            let name = rel.rsplit('/').next().unwrap_or_default().to_string();
            set.entries.push(Entry {
                name,
                source: s,
                kind: EntryKind::File { size: *size, sha256 },
                mode: item.mode,
                mtime: item.mtime,
            });
            Ok(true)
        }
        TarKind::Symlink(_) => Err(format!("{source}: a link that does not resolve")),
    }
}

/// A context made ready for selecting: a directory by its canonical path.
enum Where<'a> {
    Dir(PathBuf),
    Tar(&'a TarIndex),
}

/// `source` without `.` components or a leading `/`; refused if `..` climbs out.
fn clean(source: &str) -> Result<String, String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in source.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!("{source}: outside the build context"));
                }
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// Adds one source; whether it was a plain file (copied, not unpacked).
fn add_source(
    root: &Path,
    ignore: &IgnoreRules,
    source: &str,
    rel: &str,
    add: bool,
    set: &mut CopySet,
) -> Result<bool, String> {
    let joined = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
    // Every link on the way, the last component's included, is resolved and must stay
    // in the context: `COPY link/etc/passwd` with `link -> /` reads nothing of the host.
    std::fs::symlink_metadata(&joined).map_err(|_| format!("{source}: not found in the build context"))?;
    let host = joined.canonicalize().map_err(|e| format!("{source}: a link that does not resolve: {e}"))?;
    if !host.starts_with(root) {
        return Err(format!("{source}: a link that points outside the build context"));
    }
    if let Ok(in_context) = host.strip_prefix(root) {
        let in_context = in_context.to_string_lossy();
        if !in_context.is_empty() && ignore.excludes(&in_context) {
            return Err(format!("{source}: resolves to {in_context}, left out by .dockerignore"));
        }
    }
    let meta = std::fs::symlink_metadata(&host).map_err(|e| format!("{source}: {e}"))?;
    let name = rel.rsplit('/').next().unwrap_or_default().to_string();
    if meta.is_dir() {
        walk(&host, rel, "", ignore, &mut set.entries)?;
        Ok(false)
    } else if meta.is_file() {
        if add && is_archive_reader(open_nofollow(&host).map(|f| Box::new(f) as Box<dyn Read + Send>), source)? {
            set.archives.push((Source::Host(host.clone()), meta.len(), hash_file(&host)?));
            return Ok(false);
        }
        set.entries.push(entry(name, host, &meta)?);
        Ok(true)
    } else {
        Err(format!("{source}: not a file, directory or link"))
    }
}

/// Every path under `dir` (context path `rel`), named relative to `dir` after `prefix`.
fn walk(dir: &Path, rel: &str, prefix: &str, ignore: &IgnoreRules, out: &mut Vec<Entry>) -> Result<(), String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading {}: {e}", dir.display()))?;
    names.sort();
    for name in names {
        let name = name.into_string().map_err(|n| format!("{}: a name that is not UTF-8", Path::new(&n).display()))?;
        let context_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        if ignore.excludes(&context_rel) {
            continue;
        }
        let host = dir.join(&name);
        let meta = std::fs::symlink_metadata(&host).map_err(|e| format!("{context_rel}: {e}"))?;
        let entry_name = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        if !(meta.is_dir() || meta.is_file() || meta.file_type().is_symlink()) {
            return Err(format!("{context_rel}: not a file, directory or link"));
        }
        out.push(entry(entry_name.clone(), host.clone(), &meta)?);
        if meta.is_dir() {
            walk(&host, &context_rel, &entry_name, ignore, out)?;
        }
    }
    Ok(())
}

/// Every path of the context that `.dockerignore` keeps, for glob sources.
fn walk_names(root: &Path, ignore: &IgnoreRules) -> Result<Vec<String>, String> {
    let mut entries = Vec::new();
    walk(root, "", "", ignore, &mut entries)?;
    Ok(entries.into_iter().map(|e| e.name).collect())
}

fn entry(name: String, host: PathBuf, meta: &std::fs::Metadata) -> Result<Entry, String> {
    let kind = if meta.file_type().is_symlink() {
        EntryKind::Symlink(std::fs::read_link(&host).map_err(|e| format!("{name}: {e}"))?)
    } else if meta.is_dir() {
        EntryKind::Dir
    } else {
        EntryKind::File { size: meta.len(), sha256: hash_file(&host)? }
    };
    Ok(Entry { name, source: Source::Host(host), kind, mode: meta.mode() & 0o7777, mtime: meta.mtime().max(0) as u64 })
}

fn open_nofollow(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

fn hash_file(path: &Path) -> Result<[u8; 32], String> {
    hash_reader(open_nofollow(path).map(|f| Box::new(f) as Box<dyn Read + Send>), &path.display().to_string())
}

fn hash_reader(r: io::Result<Box<dyn Read + Send>>, what: &str) -> Result<[u8; 32], String> {
    let mut r = r.map_err(|e| format!("reading {what}: {e}"))?;
    let mut h = Sha256::new();
    io::copy(&mut r, &mut h).map_err(|e| format!("reading {what}: {e}"))?;
    Ok(h.finalize().into())
}

/// A tar archive, gzip-compressed or not, by its first bytes.
fn is_archive_reader(r: io::Result<Box<dyn Read + Send>>, what: &str) -> Result<bool, String> {
    let mut head = Vec::with_capacity(262);
    r.and_then(|r| r.take(262).read_to_end(&mut head)).map_err(|e| format!("reading {what}: {e}"))?;
    let n = head.len();
    Ok((n >= 2 && head[..2] == [0x1f, 0x8b]) || (n >= 262 && &head[257..262] == b"ustar"))
}

fn digest(set: &CopySet) -> String {
    let mut h = Sha256::new();
    h.update(b"forkvm-copy-v1\0");
    for e in &set.entries {
        h.update(e.name.as_bytes());
        h.update([0]);
        h.update(e.mode.to_le_bytes());
        match &e.kind {
            EntryKind::File { size, sha256 } => {
                h.update(b"f");
                h.update(size.to_le_bytes());
                h.update(sha256);
            }
            EntryKind::Dir => h.update(b"d"),
            EntryKind::Symlink(t) => {
                h.update(b"l");
                h.update(t.as_os_str().as_encoded_bytes());
                h.update([0]);
            }
        }
    }
    for (_, _, sha) in &set.archives {
        h.update(b"a");
        h.update(sha);
    }
    hex(&h.finalize())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes the selection's entries as a tar stream, each entry named `rename` when it is
/// the single file and a name is given, `mode` over every entry's own when given; root
/// owns everything (the guest side applies `--chown`). Fails if a file no longer has the
/// content it was selected with.
pub fn write_tar(set: &CopySet, rename: Option<&str>, mode: Option<u32>, out: impl Write) -> io::Result<()> {
    let mut tar = tar::Builder::new(out);
    tar.mode(tar::HeaderMode::Complete);
    for e in &set.entries {
        let name = match rename {
            Some(r) if set.single_file => r,
            _ => e.name.as_str(),
        };
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode.unwrap_or(e.mode));
        header.set_mtime(e.mtime);
        header.set_uid(0);
        header.set_gid(0);
        match &e.kind {
            EntryKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, name, io::empty())?;
            }
            EntryKind::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                tar.append_link(&mut header, name, target)?;
            }
            EntryKind::File { size, sha256 } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(*size);
                let file = e.source.open(*size)?;
                let mut checked = Checked { inner: file, hash: Sha256::new(), read: 0 };
                tar.append_data(&mut header, name, &mut checked)?;
                if checked.read != *size || <[u8; 32]>::from(checked.hash.finalize()) != *sha256 {
                    return Err(io::Error::other(format!(
                        "{} changed while the build read it; run the build again",
                        e.source.describe()
                    )));
                }
            }
        }
    }
    tar.into_inner()?.flush()
}

/// A reader that hashes what passes through it.
struct Checked<R> {
    inner: R,
    hash: Sha256,
    read: u64,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// An ADD archive's bytes (`size` of them) as a plain tar stream (gunzipped when
/// compressed).
pub fn archive_reader(source: &Source, size: u64) -> io::Result<Box<dyn Read + Send>> {
    let mut magic = Vec::with_capacity(2);
    source.open(2)?.read_to_end(&mut magic)?;
    let r = source.open(size)?;
    if magic == [0x1f, 0x8b] {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(r)))
    } else {
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("app/sub")).unwrap();
        std::fs::write(p.join("app/main.py"), "print(1)\n").unwrap();
        std::fs::write(p.join("app/sub/x.log"), "log").unwrap();
        std::fs::write(p.join("app/sub/data"), "data").unwrap();
        std::fs::write(p.join("a.txt"), "a").unwrap();
        std::fs::write(p.join("b.txt"), "b").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", p.join("app/out-link")).unwrap();
        std::os::unix::fs::symlink("/etc", p.join("escape")).unwrap();
        std::os::unix::fs::symlink("/", p.join("root-link")).unwrap();
        std::os::unix::fs::symlink("app", p.join("app-link")).unwrap();
        std::os::unix::fs::symlink("a.txt", p.join("inner-link")).unwrap();
        d
    }

    /// The context directory as a tar archive (links as links), indexed.
    fn as_tar(d: &Path, at: &Path) -> Context {
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all(".", d).unwrap();
        std::fs::write(at, b.into_inner().unwrap()).unwrap();
        Context::Tar(Arc::new(TarIndex::open(at).unwrap()))
    }

    #[test]
    fn a_context_archive_selects_what_its_directory_does() {
        let d = context();
        let t = tempfile::tempdir().unwrap();
        let tar = as_tar(d.path(), &t.path().join("ctx.tar"));
        let dir = Context::Dir(d.path().into());
        let ignore = IgnoreRules::parse("**/*.log\n").unwrap();
        for src in [".", "app", "/app/../a.txt", "*.txt", "app-link/main.py", "inner-link", "app/sub"] {
            let (a, b) = (
                select(&dir, &ignore, &[src.into()], false).unwrap(),
                select(&tar, &ignore, &[src.into()], false).unwrap(),
            );
            assert_eq!((names(&a), &a.digest, a.single_file), (names(&b), &b.digest, b.single_file), "{src}");
        }
        for src in ["escape", "escape/hostname", "root-link/etc/hostname", "app/sub/x.log", "nope", "../x"] {
            assert!(select(&tar, &ignore, &[src.into()], false).is_err(), "{src}");
        }
        let mut streamed = Vec::new();
        write_tar(&select(&tar, &ignore, &["app".into()], false).unwrap(), None, None, &mut streamed).unwrap();
        let mut files = Vec::new();
        for e in tar::Archive::new(&streamed[..]).entries().unwrap() {
            let mut e = e.unwrap();
            let mut text = String::new();
            if e.header().entry_type().is_file() {
                e.read_to_string(&mut text).unwrap();
                files.push((e.path().unwrap().to_string_lossy().into_owned(), text));
            }
        }
        assert_eq!(files, [("main.py".to_string(), "print(1)\n".to_string()), ("sub/data".into(), "data".into())]);
        assert_eq!(dir.read_small(".dockerignore", 10).unwrap(), None);
        assert_eq!(tar.read_small("a.txt", 10).unwrap().as_deref(), Some("a"));
        assert!(tar.read_small("app/main.py", 3).unwrap_err().contains("over 3 bytes"));
    }

    fn names(s: &CopySet) -> Vec<&str> {
        s.entries.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn sources_stay_in_the_context_and_ignored_paths_are_not_there() {
        let d = context();
        let ignore = IgnoreRules::parse("**/*.log\n").unwrap();
        let s = select(&Context::Dir(d.path().into()), &ignore, &["app".into()], false).unwrap();
        assert_eq!(names(&s), ["main.py", "out-link", "sub", "sub/data"]);
        assert_eq!(s.entries[1].kind, EntryKind::Symlink("/etc/hostname".into()), "links inside are copied as links");
        assert!(!s.single_file);
        let one = select(&Context::Dir(d.path().into()), &ignore, &["/app/../a.txt".into()], false).unwrap();
        assert!(one.single_file);
        assert_eq!(names(&one), ["a.txt"]);
        let globbed = select(&Context::Dir(d.path().into()), &ignore, &["*.txt".into()], false).unwrap();
        assert_eq!(names(&globbed), ["a.txt", "b.txt"]);
        let through = select(&Context::Dir(d.path().into()), &ignore, &["app-link/main.py".into()], false).unwrap();
        assert_eq!(names(&through), ["main.py"], "a link inside the context is followed");
        let linked = select(&Context::Dir(d.path().into()), &ignore, &["inner-link".into()], false).unwrap();
        assert_eq!(
            linked.entries[0].kind,
            select(&Context::Dir(d.path().into()), &ignore, &["a.txt".into()], false).unwrap().entries[0].kind
        );
        for (src, err) in [
            ("../x", "outside the build context"),
            ("escape", "points outside"),
            ("escape/hostname", "points outside"),
            ("root-link/etc/hostname", "points outside"),
            ("app-link/sub/x.log", "left out by .dockerignore"),
            ("app/sub/x.log", "left out by .dockerignore"),
            ("nope", "not found"),
            ("*.nope", "matches nothing"),
        ] {
            let e = select(&Context::Dir(d.path().into()), &ignore, &[src.into()], false).unwrap_err();
            assert!(e.contains(err), "{src}: {e}");
        }
        assert!(select(&Context::Dir(d.path().into()), &ignore, &["http://x/y".into()], true)
            .unwrap_err()
            .contains("URLs"));
    }

    #[test]
    fn the_digest_follows_content_not_mtimes_and_the_stream_checks_it() {
        let d = context();
        let ignore = IgnoreRules::default();
        let before = select(&Context::Dir(d.path().into()), &ignore, &["app".into()], false).unwrap();
        let f = d.path().join("app/main.py");
        let file = File::options().write(true).open(&f).unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(
            select(&Context::Dir(d.path().into()), &ignore, &["app".into()], false).unwrap().digest,
            before.digest
        );
        let mut tar = Vec::new();
        write_tar(&before, None, None, &mut tar).unwrap();
        let mut names = Vec::new();
        for e in tar::Archive::new(&tar[..]).entries().unwrap() {
            names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
        }
        assert_eq!(names, ["main.py", "out-link", "sub", "sub/data", "sub/x.log"]);
        std::fs::write(&f, "print(2)\n").unwrap();
        assert_ne!(
            select(&Context::Dir(d.path().into()), &ignore, &["app".into()], false).unwrap().digest,
            before.digest
        );
        let e = write_tar(&before, None, None, io::sink()).unwrap_err();
        assert!(e.to_string().contains("changed while the build read it"), "{e}");
    }
}
