//! Finding the memory cgroup of the calling process, from `/proc/self/mountinfo` and
//! `/proc/self/cgroup`.
//!
//! Kept apart from the group handling so the parsing can be tested with fake texts and a
//! fake tree. cgroup v2 wins when its unified hierarchy offers the memory controller to our
//! group; otherwise the v1 `memory` hierarchy is used. Hybrid hosts (systemd's default for
//! years, and the forkvm CI host) mount a cgroup2 without memory next to the v1 controllers.

use std::path::{Path, PathBuf};

use super::{CgroupError, CgroupVersion};

/// One cgroup-related line of mountinfo.
struct Mount {
    /// The path inside the hierarchy that is mounted (field 4): `/` unless it is a bind of a subtree.
    root: String,
    /// Where it is mounted (field 5).
    point: String,
}

/// The own cgroup directory (`<mount>/<own path>`) for the memory controller, with its version.
pub(super) fn own_memory_cgroup(
    mountinfo: &str,
    self_cgroup: &str,
    fs_prefix: &Path,
) -> Result<(CgroupVersion, PathBuf), CgroupError> {
    let mut checked = Vec::new();

    match find_mount(mountinfo, |fstype, _| fstype == "cgroup2") {
        None => checked.push("no cgroup2 mount in mountinfo".to_string()),
        Some(mount) => match own_dir(&mount, own_path(self_cgroup, None), fs_prefix) {
            Err(why) => checked.push(format!("cgroup2 at {}: {why}", mount.point)),
            Ok(dir) => {
                let controllers = dir.join("cgroup.controllers");
                match std::fs::read_to_string(&controllers) {
                    Ok(text) if text.split_whitespace().any(|c| c == "memory") => return Ok((CgroupVersion::V2, dir)),
                    Ok(_) => checked.push(format!("cgroup2: memory not listed in {}", controllers.display())),
                    Err(e) => checked.push(format!("cgroup2: cannot read {}: {e}", controllers.display())),
                }
            }
        },
    }

    match find_mount(mountinfo, |fstype, opts| fstype == "cgroup" && opts.split(',').any(|o| o == "memory")) {
        None => checked.push("no cgroup v1 mount with the memory controller in mountinfo".to_string()),
        Some(mount) => match own_dir(&mount, own_path(self_cgroup, Some("memory")), fs_prefix) {
            Err(why) => checked.push(format!("cgroup v1 memory at {}: {why}", mount.point)),
            Ok(dir) => return Ok((CgroupVersion::V1, dir)),
        },
    }

    Err(CgroupError::NoMemoryController { checked: checked.join("; ") })
}

/// Our own directory in the v1 hierarchy of `controller` (`cpu`, `pids`), if that
/// hierarchy is mounted and holds it.
pub(super) fn own_v1_dir(mountinfo: &str, self_cgroup: &str, fs_prefix: &Path, controller: &str) -> Option<PathBuf> {
    let mount = find_mount(mountinfo, |fstype, opts| fstype == "cgroup" && opts.split(',').any(|o| o == controller))?;
    own_dir(&mount, own_path(self_cgroup, Some(controller)), fs_prefix).ok()
}

/// The first mount whose filesystem type and super options satisfy `want`.
fn find_mount(mountinfo: &str, want: impl Fn(&str, &str) -> bool) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        // Fields 7.. are optional tags ended by "-"; then fstype, source, super options.
        let sep = 6 + fields.get(6..)?.iter().position(|f| *f == "-")?;
        let (fstype, opts) = (*fields.get(sep + 1)?, *fields.get(sep + 3)?);
        want(fstype, opts).then(|| Mount { root: unescape(fields[3]), point: unescape(fields[4]) })
    })
}

/// Our path in a hierarchy per `/proc/self/cgroup`: the v1 line listing `controller`, or
/// the v2 line (`0::`) when `controller` is `None`.
fn own_path<'a>(self_cgroup: &'a str, controller: Option<&str>) -> Option<&'a str> {
    self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            None => id == "0" && controllers.is_empty(),
            Some(c) => controllers.split(',').any(|x| x == c),
        };
        matches.then_some(path)
    })
}

/// Why a mount does not hold this process's own cgroup.
#[derive(Debug, thiserror::Error)]
enum NotOwn {
    #[error("no matching line in /proc/self/cgroup")]
    NoLine,
    #[error("own cgroup {own} is outside the mounted subtree {root}")]
    Outside { own: String, root: String },
    #[error("own cgroup directory {} does not exist", .0.display())]
    NoDir(PathBuf),
}

/// `<fs_prefix>/<mount point>/<own path relative to the mount's root>`, which must exist.
fn own_dir(mount: &Mount, own: Option<&str>, fs_prefix: &Path) -> Result<PathBuf, NotOwn> {
    let own = own.ok_or(NotOwn::NoLine)?;
    let rel = if mount.root == "/" {
        Some(own)
    } else {
        own.strip_prefix(mount.root.as_str()).filter(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let rel = rel.ok_or_else(|| NotOwn::Outside { own: own.to_string(), root: mount.root.clone() })?;
    let mut dir = fs_prefix.join(mount.point.trim_start_matches('/'));
    let rel = rel.trim_start_matches('/');
    if !rel.is_empty() {
        dir.push(rel); // pushing "" would add a trailing slash
    }
    if !dir.is_dir() {
        return Err(NotOwn::NoDir(dir));
    }
    Ok(dir)
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |acc, b| acc.wrapping_mul(8).wrapping_add(b - b'0')));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
