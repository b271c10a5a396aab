//! Applying an image layer (a tar, gzip- or zstd-compressed or not) onto a root
//! directory, by the OCI layer rules: `.wh.<name>` removes `<name>` of the layers below,
//! `.wh..wh..opq` empties its directory of what the layers below put there, and a layer
//! never whites out its own entries.
//!
//! The layer is untrusted. Every entry's parent directory is resolved by `openat2` with
//! `RESOLVE_IN_ROOT`: a symbolic link in the tree (absolute or climbing with `..`) is
//! followed as if the root were `/`, so it can never lead out of it. The entry itself is
//! made with `*at` calls on that directory that never follow its last component, after
//! removing whatever was there (a file replaces a link; it is not written through it).
//! Names with `..` are refused. Device nodes are not made (the guest's `/dev` is the
//! kernel's devtmpfs); extended attributes are set where the kernel allows.
//!
//! In forkvm this runs as root of the build's user namespace (`helper.rs`), so the owners
//! it sets are the image's own ids (0..65536) and on the host they belong to the build's
//! unprivileged id range.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// What applying one layer did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApplyStats {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub whiteouts: u64,
    pub bytes: u64,
    /// Character and block devices left out (the guest's `/dev` is devtmpfs).
    pub devices_skipped: u64,
    /// Extended attributes the kernel refused (e.g. `trusted.*` without host privilege).
    pub xattrs_skipped: u64,
}

impl ApplyStats {
    pub fn add(&mut self, o: &ApplyStats) {
        self.files += o.files;
        self.directories += o.directories;
        self.symlinks += o.symlinks;
        self.hard_links += o.hard_links;
        self.whiteouts += o.whiteouts;
        self.bytes += o.bytes;
        self.devices_skipped += o.devices_skipped;
        self.xattrs_skipped += o.xattrs_skipped;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("reading the layer: {0}")]
    Read(#[source] io::Error),
    #[error("layer entry {entry:?}: {problem}")]
    Entry { entry: String, problem: String },
    #[error("layer entry {entry:?}: {step}: {source}")]
    Io { entry: String, step: &'static str, source: io::Error },
    #[error("the image unpacks to more than {limit} bytes")]
    TooBig { limit: u64 },
}

/// Applies the layer `blob` (compression detected from its first bytes) onto the
/// directory `root`; `budget` is how many more file bytes the image may hold.
pub fn apply_layer(root: &File, blob: impl Read, budget: &mut u64) -> Result<ApplyStats, ApplyError> {
    let mut reader = BufReader::with_capacity(1 << 16, blob);
    let head = reader.fill_buf().map_err(ApplyError::Read)?;
    let stream: Box<dyn Read> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(reader).map_err(ApplyError::Read)?)
    } else {
        Box::new(reader)
    };
    let mut archive = tar::Archive::new(stream);
    let mut layer = Layer { root, created: HashSet::new(), stats: ApplyStats::default(), budget };
    for entry in archive.entries().map_err(ApplyError::Read)? {
        layer.entry(entry.map_err(ApplyError::Read)?)?;
    }
    Ok(layer.stats)
}

struct Layer<'a> {
    root: &'a File,
    /// Paths this layer made (whiteouts and opaque markers never remove them).
    created: HashSet<String>,
    stats: ApplyStats,
    budget: &'a mut u64,
}

/// An entry's path as components under the root; `Err` for one that climbs with `..`.
fn components(raw: &Path) -> Result<Vec<&OsStr>, String> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err("its name climbs out of the image with '..'".into()),
            Component::Prefix(_) => return Err("its name is not a Unix path".into()),
        }
    }
    Ok(out)
}

fn join(parts: &[&OsStr]) -> String {
    parts.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/")
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `openat2(root, path, RESOLVE_IN_ROOT)`: the directory `path` with every symbolic link
/// on the way resolved inside `root`.
fn open_in_root(root: &File, path: &str) -> io::Result<File> {
    let path = if path.is_empty() { "." } else { path };
    let c = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // The kernel's `struct open_how` (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: a valid dirfd, a NUL-terminated path and an open_how of the size given.
    let fd =
        unsafe { libc::syscall(libc::SYS_openat2, root.as_raw_fd(), c.as_ptr(), &how, std::mem::size_of::<OpenHow>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd; nobody else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// How many dangling links one entry's parents may pass through.
const MAX_LINK_HOPS: usize = 40;

/// The directory `parts` under `root`, made (0755, root's) where missing.
fn make_dirs(root: &File, parts: &[&OsStr]) -> io::Result<File> {
    make_dirs_hops(root, parts.iter().map(|p| p.to_os_string()).collect(), 0)
}

fn make_dirs_hops(root: &File, parts: Vec<std::ffi::OsString>, hops: usize) -> io::Result<File> {
    let parts: Vec<&OsStr> = parts.iter().map(|p| p.as_os_str()).collect();
    let mut dir = open_in_root(root, "")?;
    for i in 0..parts.len() {
        let prefix = join(&parts[..=i]);
        dir = match open_in_root(root, &prefix) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let name = cstr(parts[i])?;
                // SAFETY: a valid dirfd and a NUL-terminated name.
                match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) }) {
                    Ok(()) => {}
                    // A link to a directory not made yet (`var/run -> /run`): make its
                    // target, inside the root as every link here is.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && hops < MAX_LINK_HOPS => {
                        let target = read_link_at(&dir, &name)?;
                        let base = if target.is_absolute() { Vec::new() } else { parts[..i].to_vec() };
                        make_dirs_hops(root, lexical_join(&base, &target), hops + 1)?;
                    }
                    Err(e) => return Err(e),
                }
                open_in_root(root, &prefix)?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(dir)
}

/// `base` joined with `target`, `..` taken lexically and never above the root.
fn lexical_join(base: &[&OsStr], target: &Path) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = base.iter().map(|p| p.to_os_string()).collect();
    for c in target.components() {
        match c {
            Component::Normal(p) => out.push(p.to_os_string()),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The target of the link `name` in `dir`.
fn read_link_at(dir: &File, name: &CString) -> io::Result<std::path::PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid dirfd, a NUL-terminated name and a buffer of the length given.
    let n = unsafe { libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(std::path::PathBuf::from(std::ffi::OsString::from_vec(buf)))
}

/// What is at `name` in `dir`, not following a link: `None` when nothing is.
fn kind_at(dir: &File, name: &CString) -> io::Result<Option<libc::mode_t>> {
    // SAFETY: all-zero bytes are a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid dirfd, a NUL-terminated name and a `stat` to fill.
    let ret = unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    match ret {
        0 => Ok(Some(st.st_mode & libc::S_IFMT)),
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::NotFound => Ok(None),
            e => Err(e),
        },
    }
}

/// Removes `name` from `dir` whatever it is (a directory with everything in it), never
/// following a link.
fn remove_at(dir: &File, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    match kind_at(dir, &c)? {
        None => Ok(()),
        Some(libc::S_IFDIR) => {
            let d = cap_std::fs::Dir::from_std_file(dir.try_clone()?);
            d.remove_dir_all(Path::new(name))
        }
        // SAFETY: a valid dirfd and a NUL-terminated name.
        Some(_) => check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }),
    }
}

impl Layer<'_> {
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ApplyError> {
        let raw = entry.path().map_err(ApplyError::Read)?.into_owned();
        let shown = raw.display().to_string();
        let entry_err = |problem: String| ApplyError::Entry { entry: shown.clone(), problem };
        let parts = components(&raw).map_err(entry_err)?;
        let Some((name, parents)) = parts.split_last() else { return Ok(()) };
        let io_err = |step: &'static str| {
            let entry = shown.clone();
            move |source| ApplyError::Io { entry, step, source }
        };
        let name_text = name.to_string_lossy();
        if let Some(hidden) = name_text.strip_prefix(WHITEOUT) {
            self.stats.whiteouts += 1;
            let parent = match open_in_root(self.root, &join(parents)) {
                Ok(p) => p,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_err("opening the whiteout's directory")(e)),
            };
            if name_text == OPAQUE {
                return self.make_opaque(&parent, parents).map_err(io_err("emptying an opaque directory"));
            }
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(entry_err(format!("whiteout {name_text:?} names nothing")));
            }
            let mut path = parents.to_vec();
            path.push(OsStr::new(hidden));
            if !self.created.contains(&join(&path)) {
                remove_at(&parent, OsStr::new(hidden)).map_err(io_err("removing a whited-out entry"))?;
            }
            return Ok(());
        }
        let parent = make_dirs(self.root, parents).map_err(io_err("making its parent directories"))?;
        let header = entry.header().clone();
        let uid =
            u32::try_from(header.uid().map_err(ApplyError::Read)?).map_err(|_| entry_err("uid over 32 bits".into()))?;
        let gid =
            u32::try_from(header.gid().map_err(ApplyError::Read)?).map_err(|_| entry_err("gid over 32 bits".into()))?;
        let mode = header.mode().map_err(ApplyError::Read)? & 0o7777;
        let mtime = header.mtime().unwrap_or(0) as i64;
        let c_name = cstr(name).map_err(io_err("its name"))?;
        let dfd = parent.as_raw_fd();
        let xattrs = pax_xattrs(&mut entry);
        match header.entry_type() {
            tar::EntryType::Directory => {
                if kind_at(&parent, &c_name).map_err(io_err("looking at what is there"))? != Some(libc::S_IFDIR) {
                    remove_at(&parent, name).map_err(io_err("removing what was there"))?;
                    // SAFETY: a valid dirfd and a NUL-terminated name.
                    check(unsafe { libc::mkdirat(dfd, c_name.as_ptr(), 0o700) }).map_err(io_err("mkdir"))?;
                }
                let dir =
                    open_at(&parent, &c_name, libc::O_RDONLY | libc::O_DIRECTORY).map_err(io_err("opening it"))?;
                self.finish_fd(&dir, uid, gid, mode, None, &xattrs).map_err(io_err("setting owner and mode"))?;
                self.stats.directories += 1;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = header.size().map_err(ApplyError::Read)?;
                if size > *self.budget {
                    return Err(ApplyError::TooBig { limit: crate::oci::MAX_IMAGE_BYTES });
                }
                remove_at(&parent, name).map_err(io_err("removing what was there"))?;
                let mut file = open_at(&parent, &c_name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)
                    .map_err(io_err("creating it"))?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut file).map_err(io_err("writing it"))?;
                *self.budget -= copied;
                self.stats.bytes += copied;
                self.finish_fd(&file, uid, gid, mode, Some(mtime), &xattrs)
                    .map_err(io_err("setting owner and mode"))?;
                self.stats.files += 1;
            }
            tar::EntryType::Symlink => {
                let target = link_target(&entry).map_err(entry_err)?;
                let c_target = cstr(target.as_os_str()).map_err(io_err("its target"))?;
                remove_at(&parent, name).map_err(io_err("removing what was there"))?;
                // SAFETY: NUL-terminated strings and a valid dirfd.
                check(unsafe { libc::symlinkat(c_target.as_ptr(), dfd, c_name.as_ptr()) })
                    .map_err(io_err("symlink"))?;
                // SAFETY: as above; AT_SYMLINK_NOFOLLOW changes the link itself.
                check(unsafe { libc::fchownat(dfd, c_name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
                    .map_err(io_err("chown"))?;
                self.stats.symlinks += 1;
            }
            tar::EntryType::Link => {
                let target = link_target(&entry).map_err(entry_err)?;
                let tparts = components(&target).map_err(|p| entry_err(format!("its link target: {p}")))?;
                let Some((tname, tparents)) = tparts.split_last() else {
                    return Err(entry_err("a hard link to the root".into()));
                };
                let tdir =
                    open_in_root(self.root, &join(tparents)).map_err(io_err("opening its target's directory"))?;
                let c_tname = cstr(tname).map_err(io_err("its target"))?;
                remove_at(&parent, name).map_err(io_err("removing what was there"))?;
                // SAFETY: valid dirfds and NUL-terminated names; flags 0 never follows a link.
                check(unsafe { libc::linkat(tdir.as_raw_fd(), c_tname.as_ptr(), dfd, c_name.as_ptr(), 0) })
                    .map_err(io_err("link"))?;
                self.stats.hard_links += 1;
            }
            tar::EntryType::Fifo => {
                remove_at(&parent, name).map_err(io_err("removing what was there"))?;
                // SAFETY: a valid dirfd and a NUL-terminated name.
                check(unsafe { libc::mknodat(dfd, c_name.as_ptr(), libc::S_IFIFO | 0o600, 0) })
                    .map_err(io_err("mkfifo"))?;
                // SAFETY: as above.
                check(unsafe { libc::fchownat(dfd, c_name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
                    .map_err(io_err("chown"))?;
                // SAFETY: as above.
                check(unsafe { libc::fchmodat(dfd, c_name.as_ptr(), mode, 0) }).map_err(io_err("chmod"))?;
                self.stats.files += 1;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                self.stats.devices_skipped += 1;
                return Ok(());
            }
            // Metadata entries the tar crate has already folded into the next entry.
            _ => return Ok(()),
        }
        self.created.insert(join(&parts));
        Ok(())
    }

    /// Removes everything in `dir` (the directory `parts`) that this layer did not make.
    fn make_opaque(&mut self, dir: &File, parts: &[&OsStr]) -> io::Result<()> {
        let d = cap_std::fs::Dir::from_std_file(dir.try_clone()?);
        for child in d.entries()? {
            let child = child?.file_name();
            let mut path = parts.to_vec();
            path.push(&child);
            if !self.created.contains(&join(&path)) {
                remove_at(dir, &child)?;
            }
        }
        Ok(())
    }

    /// Owner, then mode (a chown clears set-id bits), extended attributes, modification time.
    fn finish_fd(
        &mut self,
        file: &File,
        uid: u32,
        gid: u32,
        mode: u32,
        mtime: Option<i64>,
        xattrs: &[(CString, Vec<u8>)],
    ) -> io::Result<()> {
        let fd = file.as_raw_fd();
        // SAFETY: a valid fd.
        check(unsafe { libc::fchown(fd, uid, gid) })?;
        // SAFETY: a valid fd.
        check(unsafe { libc::fchmod(fd, mode) })?;
        for (key, value) in xattrs {
            // SAFETY: a valid fd, a NUL-terminated key and a buffer of the length given.
            let ret = unsafe { libc::fsetxattr(fd, key.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
            if ret != 0 {
                self.stats.xattrs_skipped += 1;
            }
        }
        if let Some(secs) = mtime {
            let t = libc::timespec { tv_sec: secs, tv_nsec: 0 };
            // SAFETY: a valid fd and two timespecs.
            check(unsafe { libc::futimens(fd, [t, t].as_ptr()) })?;
        }
        Ok(())
    }
}

/// A symbolic or hard link entry's target.
fn link_target<R: Read>(entry: &tar::Entry<'_, R>) -> Result<std::path::PathBuf, String> {
    match entry.link_name() {
        Ok(Some(t)) => Ok(t.into_owned()),
        Ok(None) => Err("a link to nothing".into()),
        Err(e) => Err(format!("its link target: {e}")),
    }
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, 0600)`.
fn open_at(dir: &File, name: &CString, flags: libc::c_int) -> io::Result<File> {
    // SAFETY: a valid dirfd and a NUL-terminated name.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The entry's `SCHILY.xattr.*` PAX records (how tar carries extended attributes).
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Vec<(CString, Vec<u8>)> {
    let Ok(Some(exts)) = entry.pax_extensions() else { return Vec::new() };
    exts.flatten()
        .filter_map(|e| {
            let key = e.key().ok()?.strip_prefix("SCHILY.xattr.")?;
            Some((CString::new(key).ok()?, e.value_bytes().to_vec()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
