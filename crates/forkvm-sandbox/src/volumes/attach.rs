//! Attaching volumes to sandboxes at spawn: what is asked (`NAME:/mount[:mode]`), the
//! writer's lease, the volume put into a free slot of each child's devices, and the
//! mount in the guest once it answers.

use super::meta::BASE_FILE;
use super::{check_name, VolumeError, Volumes};
use crate::registry::Registry;
use crate::source::{volume_slot_id, VOLUME_SLOTS};
use forkvm_vmm::devices::attach::DeviceConfig;
use std::path::PathBuf;

pub use forkvm_api::volumes::{VolumeMode as AttachMode, VolumeMount};

/// Guest paths a volume may not be mounted on (or under).
const RESERVED: [&str; 4] = ["/proc", "/sys", "/dev", "/overlay"];
/// Longest mount path accepted.
const MAX_MOUNT_LEN: usize = 1024;

/// Parses `NAME:/mount/point[:rw|ro|cow]` (the CLI's `--volume`) and checks it.
pub fn parse_mount(s: &str) -> Result<VolumeMount, VolumeError> {
    let bad = |why: &str| VolumeError::Attach(format!("volume {s:?}: {why} (NAME:/mount/point[:rw|ro|cow])"));
    let mut parts = s.splitn(3, ':');
    let name = parts.next().unwrap_or_default().to_string();
    let mount = parts.next().ok_or_else(|| bad("no mount point"))?.to_string();
    let mode = match parts.next() {
        None | Some("rw") => AttachMode::Rw,
        Some("ro") => AttachMode::Ro,
        Some("cow") => AttachMode::Cow,
        Some(other) => return Err(bad(&format!("unknown mode {other:?}"))),
    };
    let m = VolumeMount { name, mount, mode };
    check_mount(&m)?;
    Ok(m)
}

/// `m`'s name and mount point against the rules (the mount point is a guest path:
/// absolute, plain, not `/` nor a system directory).
pub fn check_mount(m: &VolumeMount) -> Result<(), VolumeError> {
    check_name(&m.name)?;
    let (name, path) = (&m.name, &m.mount);
    let bad = |why: &str| VolumeError::Attach(format!("volume {name}: mount point {path:?} {why}"));
    if !path.starts_with('/') || path.len() > MAX_MOUNT_LEN || path.contains('\0') {
        return Err(bad(&format!("must be an absolute path of at most {MAX_MOUNT_LEN} bytes")));
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(bad("must not contain . or .."));
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(bad("is the root"));
    }
    if RESERVED.iter().any(|r| trimmed == *r || trimmed.starts_with(&format!("{r}/"))) {
        return Err(bad("is a system directory"));
    }
    Ok(())
}

/// Checks a spawn's volume list: each valid, at most [`VOLUME_SLOTS`], no volume or
/// mount point twice, a writer only for a single sandbox.
pub fn check_mounts(mounts: &[VolumeMount], n: usize) -> Result<(), VolumeError> {
    if mounts.len() > VOLUME_SLOTS {
        return Err(VolumeError::Attach(format!("{} volumes asked; a sandbox has {VOLUME_SLOTS} slots", mounts.len())));
    }
    for (i, m) in mounts.iter().enumerate() {
        check_mount(m)?;
        if mounts[..i].iter().any(|o| o.name == m.name) {
            return Err(VolumeError::Attach(format!("volume {} is asked twice", m.name)));
        }
        if mounts[..i].iter().any(|o| o.mount.trim_end_matches('/') == m.mount.trim_end_matches('/')) {
            return Err(VolumeError::Attach(format!("mount point {} is asked twice", m.mount)));
        }
        if m.mode == AttachMode::Rw && n != 1 {
            return Err(VolumeError::Attach(format!(
                "volume {} is asked writable for {n} sandboxes: one writer at a time (attach it ro or cow)",
                m.name
            )));
        }
    }
    Ok(())
}

/// A volume ready to go into a spawn's children: its layers as of the spawn and, for a
/// writer, the lease taken for the one child.
#[derive(Debug, Clone)]
pub struct Leased {
    pub mount: VolumeMount,
    base: PathBuf,
    sealed: Vec<PathBuf>,
    vol_dir: PathBuf,
}

impl Volumes {
    /// Takes what `mounts` need for sandboxes `ids` (whose registry rows exist: a lease
    /// without its sandbox's row is stale): each volume's layers (its stopped writers'
    /// taken in first) and, for a writer, its lease in the name of `ids[0]`.
    pub fn lease(
        &self,
        registry: &Registry,
        mounts: &[VolumeMount],
        ids: &[String],
    ) -> Result<Vec<Leased>, VolumeError> {
        check_mounts(mounts, ids.len())?;
        let mut out = Vec::new();
        for m in mounts {
            let _lock = self.lock(&m.name)?;
            let (mut meta, writer) = self.settled(registry, &m.name)?;
            let dir = self.root.join(&m.name);
            if m.mode == AttachMode::Rw {
                if let Some(writer) = writer {
                    return Err(VolumeError::Busy { name: m.name.clone(), writer });
                }
                meta.writer = Some(ids[0].clone());
                meta.write(&dir).map_err(super::io(&m.name, "writing the writer's lease"))?;
            }
            out.push(Leased {
                mount: m.clone(),
                base: dir.join(BASE_FILE),
                sealed: meta.layer_dirs(&dir),
                vol_dir: dir,
            });
        }
        Ok(out)
    }
}

/// Puts `leased` into free volume slots of `devices` (one child's, sandbox `id`, whose
/// VMM runs as `uid`): returns each volume's slot serial, in order.
pub fn apply(
    leased: &[Leased],
    devices: &mut DeviceConfig,
    id: &str,
    uid: Option<u32>,
) -> Result<Vec<String>, VolumeError> {
    let mut serials = Vec::new();
    for l in leased {
        let slot = (0..VOLUME_SLOTS)
            .map(volume_slot_id)
            .filter(|s| !serials.contains(s))
            .find_map(|s| devices.blocks.iter().position(|b| b.id == s && is_empty_slot(b)))
            .ok_or_else(|| {
                VolumeError::Attach(format!(
                    "the snapshot has no free volume slot for volume {} (made before volumes, or its slots are taken); \
                     make it again from its template",
                    l.mount.name
                ))
            })?;
        let b = &mut devices.blocks[slot];
        let layers = b.layers.as_mut().expect("an empty slot is layered");
        b.path = l.base.clone();
        b.read_only = l.mount.mode == AttachMode::Ro;
        layers.sealed = l.sealed.clone();
        if l.mount.mode == AttachMode::Rw {
            let wdir = l.vol_dir.join("writers").join(id);
            let name = &l.mount.name;
            std::fs::create_dir_all(&wdir).map_err(super::io(name, "creating the writer's directory"))?;
            // It and every directory on the VMM's way to it: writers/, the volume's,
            // volumes/ and the store's own.
            let volumes_root = l.vol_dir.parent().unwrap_or(&l.vol_dir);
            let store_root = volumes_root.parent().unwrap_or(volumes_root);
            for d in [&wdir, &l.vol_dir.join("writers"), &l.vol_dir, volumes_root, store_root] {
                crate::sandbox_uid::traversable(d).map_err(super::io(name, "opening the writer's directory"))?;
            }
            if let Some(uid) = uid {
                crate::sandbox_uid::own_tree(&wdir, uid, uid)
                    .map_err(super::io(name, "giving the writer's directory to its sandbox"))?;
            }
            layers.dir = wdir;
        }
        serials.push(b.id.clone());
    }
    Ok(serials)
}

/// Whether block device `b` is an empty volume slot (a layered disk of nothing).
fn is_empty_slot(b: &forkvm_vmm::devices::attach::BlockConfig) -> bool {
    let Some(l) = &b.layers else { return false };
    l.sealed.is_empty() && l.lazy.is_none() && std::fs::metadata(&b.path).is_ok_and(|m| m.len() == 0)
}

/// Mounts `mounts` (in slots `serials`) in every sandbox of a spawn; if one fails, every
/// one of them is killed (a spawn gives all it was asked for, or none; their rows go,
/// and with them a writer's lease).
pub fn mount_in_all(
    registry: &Registry,
    sandboxes: &[crate::SpawnedSandbox],
    mounts: &[VolumeMount],
    serials: &[String],
) -> Result<(), VolumeError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let mounted = sandboxes.iter().try_for_each(|s| mount_in_guest(&s.client, mounts, serials));
    if mounted.is_err() {
        for s in sandboxes {
            let _ = crate::verbs::kill_record(registry, &s.record);
        }
    }
    mounted
}

/// Mounts each volume of `mounts` (in slots `serials`) in the sandbox behind `client`.
pub fn mount_in_guest(
    client: &forkvm_proto::AgentClient<std::os::unix::net::UnixStream>,
    mounts: &[VolumeMount],
    serials: &[String],
) -> Result<(), VolumeError> {
    for (m, serial) in mounts.iter().zip(serials) {
        let req = forkvm_proto::MountVolumeRequest {
            serial: serial.clone(),
            path: m.mount.clone(),
            read_only: m.mode == AttachMode::Ro,
        };
        client
            .mount_volume(&req)
            .map_err(|e| VolumeError::Attach(format!("mounting volume {} at {}: {e}", m.name, m.mount)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_parse_and_bad_ones_are_refused_by_name() {
        let m = parse_mount("data:/mnt/data").unwrap();
        assert_eq!((m.name.as_str(), m.mount.as_str(), m.mode), ("data", "/mnt/data", AttachMode::Rw));
        assert_eq!(parse_mount("d:/x:ro").unwrap().mode, AttachMode::Ro);
        assert_eq!(parse_mount("d:/x:cow").unwrap().mode, AttachMode::Cow);
        for bad in
            ["data", "data:rel", "data:/", "data:/proc", "data:/sys/x", "data:/a/../b", "data:/x:rx", "../x:/m", ":/m"]
        {
            assert!(parse_mount(bad).is_err(), "{bad}");
        }
        let w = |n: &str, p: &str| VolumeMount { name: n.into(), mount: p.into(), mode: AttachMode::Rw };
        assert!(check_mounts(&[w("a", "/a")], 1).is_ok());
        assert!(check_mounts(&[w("a", "/a")], 2).is_err(), "one writer");
        assert!(check_mounts(&[w("a", "/a"), w("a", "/b")], 1).is_err(), "a volume twice");
        assert!(check_mounts(&[w("a", "/a"), w("b", "/a/")], 1).is_err(), "a mount point twice");
        let five: Vec<_> = (0..5).map(|i| w(&format!("v{i}"), &format!("/m{i}"))).collect();
        assert!(check_mounts(&five, 1).is_err(), "more than the slots");
    }

    #[test]
    fn only_a_sandboxs_own_writer_directory_counts_as_its_disk() {
        let store = std::path::Path::new("/s");
        assert!(super::super::is_writer_dir(store, std::path::Path::new("/s/volumes/data/writers/abc"), "abc"));
        assert!(!super::super::is_writer_dir(store, std::path::Path::new("/s/volumes/data/writers/abd"), "abc"));
        assert!(!super::super::is_writer_dir(store, std::path::Path::new("/s/volumes/data/layers/abc"), "abc"));
        assert!(!super::super::is_writer_dir(store, std::path::Path::new("/s/volumes/../x/writers/abc"), "abc"));
        assert!(!super::super::is_writer_dir(store, std::path::Path::new("/t/volumes/data/writers/abc"), "abc"));
    }
}
