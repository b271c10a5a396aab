//! A build context that arrived as a tar stream (the daemon's build route): indexed in
//! place, never unpacked, so no name from the body ever becomes a host path.
//!
//! The index holds each entry's kind, mode, mtime, size and, for a file, where its bytes
//! start in the staged archive. Names are cleaned (`./` dropped); an absolute name or one
//! with `..` refuses the whole context. Directories a name implies are directories even
//! when the archive does not list them. Links are resolved inside the index only: a
//! target that is absolute or climbs above the root points outside the context, as on
//! the host.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most entries a context may have.
pub const MAX_ENTRIES: usize = 1 << 20;
/// How many links a name may pass through.
const MAX_HOPS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarKind {
    File { offset: u64, size: u64 },
    Dir,
    Symlink(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarItem {
    pub kind: TarKind,
    pub mode: u32,
    pub mtime: u64,
}

/// The entries of a staged context archive, by cleaned name.
#[derive(Debug)]
pub struct TarIndex {
    pub file: Arc<PathBuf>,
    pub items: BTreeMap<String, TarItem>,
}

impl TarIndex {
    /// Writes the archive `src` (gzip-compressed or not) to `to` as a plain tar archive
    /// and indexes it there.
    pub fn stage(src: &mut dyn Read, to: &Path) -> Result<TarIndex, String> {
        let mut head = [0u8; 2];
        let mut n = 0;
        while n < 2 {
            match src.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return Err(format!("reading the context archive: {e}")),
            }
        }
        let mut chained = (&head[..n]).chain(src);
        let mut out = File::create(to).map_err(|e| format!("staging the context archive at {}: {e}", to.display()))?;
        let copied = if head[..n] == [0x1f, 0x8b] {
            io::copy(&mut flate2::read::MultiGzDecoder::new(chained), &mut out)
        } else {
            io::copy(&mut chained, &mut out)
        };
        copied.map_err(|e| format!("staging the context archive: {e}"))?;
        TarIndex::open(to)
    }

    /// Indexes the plain (uncompressed) tar archive at `file`.
    pub fn open(file: &Path) -> Result<TarIndex, String> {
        let f = File::open(file).map_err(|e| format!("the context archive: {e}"))?;
        let mut archive = tar::Archive::new(io::BufReader::new(f));
        let mut items = BTreeMap::new();
        let bad = |e: io::Error| format!("the context is not a tar archive: {e}");
        for entry in archive.entries().map_err(bad)? {
            let entry = entry.map_err(bad)?;
            if items.len() >= MAX_ENTRIES {
                return Err(format!("the context has more than {MAX_ENTRIES} entries"));
            }
            let raw = entry.path().map_err(bad)?.to_string_lossy().into_owned();
            let name = clean_name(&raw)?;
            let header = entry.header();
            let mode = header.mode().map_err(bad)? & 0o7777;
            let mtime = header.mtime().unwrap_or(0);
            let kind = match header.entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    TarKind::File { offset: entry.raw_file_position(), size: entry.size() }
                }
                tar::EntryType::Directory => TarKind::Dir,
                tar::EntryType::Symlink => {
                    // Runs of slashes as one (the tar crate reads a target of `/` as `//`).
                    let target = entry.link_name().map_err(bad)?.map(|t| collapse_slashes(&t.to_string_lossy()));
                    TarKind::Symlink(target.ok_or_else(|| format!("{name}: a link without a target"))?)
                }
                // Hard links, devices, FIFOs: not part of what a build copies.
                _ => continue,
            };
            if name.is_empty() {
                continue;
            }
            for parent in parents(&name) {
                items.entry(parent.to_string()).or_insert(TarItem { kind: TarKind::Dir, mode: 0o755, mtime });
            }
            items.insert(name, TarItem { kind, mode, mtime });
        }
        Ok(TarIndex { file: Arc::new(file.to_path_buf()), items })
    }

    /// `name` with every link on its way (its own included) resolved, or why not.
    pub fn resolve(&self, name: &str) -> Result<String, String> {
        let mut todo: Vec<String> = name.split('/').filter(|p| !p.is_empty()).rev().map(str::to_string).collect();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(part) = todo.pop() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    done.pop().ok_or("a link that points outside the build context")?;
                    continue;
                }
                _ => {}
            }
            done.push(part);
            let here = done.join("/");
            match self.items.get(&here).map(|i| &i.kind) {
                Some(TarKind::Symlink(target)) => {
                    hops += 1;
                    if hops > MAX_HOPS || target.starts_with('/') {
                        return Err("a link that points outside the build context".into());
                    }
                    done.pop();
                    todo.extend(target.split('/').filter(|p| !p.is_empty()).rev().map(str::to_string));
                }
                Some(_) => {}
                None => return Err("not found in the build context".into()),
            }
        }
        Ok(done.join("/"))
    }

    /// The bytes of file `name`, at most `limit` of them; `None` when there is no such file.
    pub fn read(&self, name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
        match self.items.get(name).map(|i| &i.kind) {
            Some(TarKind::File { offset, size }) => {
                let mut out = Vec::new();
                self.reader(*offset, (*size).min(limit))?.read_to_end(&mut out)?;
                Ok(Some(out))
            }
            _ => Ok(None),
        }
    }

    /// A reader of `size` bytes at `offset` of the archive.
    pub fn reader(&self, offset: u64, size: u64) -> io::Result<io::Take<File>> {
        let mut f = File::open(&*self.file)?;
        f.seek(SeekFrom::Start(offset))?;
        Ok(f.take(size))
    }
}

/// A member's name without `./`, leading or repeated slashes; refused if absolute after
/// that or with `..`.
fn clean_name(raw: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    for p in raw.split('/') {
        match p {
            "" | "." => {}
            ".." => return Err(format!("{raw:?}: a name with .. in the context archive")),
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

fn collapse_slashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

fn parents(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('/').map(move |(i, _)| &name[..i])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tar of `entries`: (name, Some(data)) files, (name/, None) dirs, (name@target) links.
    pub(crate) fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_mtime(7);
            if let Some((n, target)) = name.split_once('@') {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, n, target).unwrap();
            } else if let Some(d) = data {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(d.len() as u64);
                b.append_data(&mut h, name, *d).unwrap();
            } else {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, name, io::empty()).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn an_archive_is_indexed_in_place_and_its_links_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ctx.tar");
        let bytes = tar_of(&[
            ("./app/main.py", Some(b"print(1)\n")),
            ("app/sub/", None),
            ("link@app", None),
            ("up@../x", None),
            ("abs@/etc", None),
            ("loop@loop", None),
        ]);
        std::fs::write(&file, bytes).unwrap();
        let index = TarIndex::open(&file).unwrap();
        let names: Vec<&str> = index.items.keys().map(String::as_str).collect();
        assert_eq!(names, ["abs", "app", "app/main.py", "app/sub", "link", "loop", "up"]);
        assert_eq!(index.read("app/main.py", 100).unwrap().unwrap(), b"print(1)\n");
        assert_eq!(index.read("app/main.py", 5).unwrap().unwrap(), b"print");
        assert_eq!(index.resolve("link/main.py").unwrap(), "app/main.py");
        assert_eq!(index.resolve("app/sub/../main.py").unwrap(), "app/main.py");
        for bad in ["up", "abs/passwd", "loop", "nope", "../x"] {
            assert!(index.resolve(bad).is_err(), "{bad}");
        }
        let raw = {
            let mut v = tar_of(&[("aaaaaaa", Some(b"x"))]);
            v[..7].copy_from_slice(b"../evil");
            let mut h = tar::Header::from_byte_slice(&v[..512]).clone();
            h.set_cksum();
            v[..512].copy_from_slice(h.as_bytes());
            v
        };
        std::fs::write(&file, raw).unwrap();
        assert!(TarIndex::open(&file).unwrap_err().contains(".."));
        std::fs::write(&file, b"not a tar at all, but long enough to look at").unwrap();
        assert!(TarIndex::open(&file).is_err());

        // Staged from a gzip stream: the same index as from the plain archive.
        let plain = tar_of(&[("a/b.txt", Some(b"b"))]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &plain).unwrap();
        let gz = gz.finish().unwrap();
        let staged = TarIndex::stage(&mut &gz[..], &dir.path().join("staged.tar")).unwrap();
        assert_eq!(staged.read("a/b.txt", 10).unwrap().unwrap(), b"b");
        let staged = TarIndex::stage(&mut &plain[..], &dir.path().join("staged2.tar")).unwrap();
        assert_eq!(staged.items.len(), 2);
    }
}
