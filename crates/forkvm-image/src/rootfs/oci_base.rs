//! OCI image bases (`base = "oci:sha256:<manifest>"`): the image's layers, unpacked in
//! order by the confined helper (`crate::oci::helper`) as root of the build's user
//! namespace, then our agent and files on top and `mkfs.ext4` in the same namespace
//! (`debian::finish_confined_tree`). Nothing of the image runs on the host.

use super::build::{require_mkfs, RootfsError, Staged};
use super::debian::finish_confined_tree;
use super::template::Template;
use super::userns::{prepare_build_dir, IdRange};
use crate::oci::{configured_store, helper::unpack_confined, resolve, Digest};
use std::path::{Path, PathBuf};

/// Files the build writes into every image: the image's own, if links, are removed
/// first (a link to `/run/...`, common for `resolv.conf`, must not be written through).
const OURS: &[&str] = &["etc/hostname", "etc/resolv.conf", "sbin/forkvm-agent"];

/// Builds the image of `manifest` with the template `t` into `<work>/rootfs.ext4`.
pub(crate) fn build_oci_image(
    manifest: &Digest,
    t: &Template,
    agent: &[u8],
    work: &Path,
) -> Result<Staged, RootfsError> {
    require_mkfs()?;
    let stage_err = |step: &str| {
        let (dir, step) = (work.to_path_buf(), step.to_string());
        move |source| RootfsError::Stage { dir, step, source }
    };
    let store = configured_store();
    let image = resolve(&store, manifest)?;
    let ids = IdRange::configured();
    let build = work.join("ns");
    prepare_build_dir(&build, ids).map_err(stage_err("preparing the build directory for the user namespace"))?;
    let exe = std::env::current_exe().map_err(stage_err("finding the forkvm binary to unpack the layers"))?;
    let layers: Vec<PathBuf> = image.layers.iter().map(|d| store.path(d)).collect();
    let stats = unpack_confined(&exe, &layers, ids, &build, &work.join("unpack.log"))?;
    tracing::info!(
        layers = layers.len(),
        files = stats.files,
        bytes = stats.bytes,
        whiteouts = stats.whiteouts,
        devices_skipped = stats.devices_skipped,
        xattrs_skipped = stats.xattrs_skipped,
        "unpacked the image"
    );
    let root = build.join("root");
    let tree = cap_std::fs::Dir::open_ambient_dir(&root, cap_std::ambient_authority())
        .map_err(stage_err("opening the unpacked tree"))?;
    for rel in OURS {
        if tree.symlink_metadata(rel).is_ok_and(|m| m.file_type().is_symlink()) {
            tree.remove_file(rel).map_err(stage_err(&format!("replacing the image's link {rel}")))?;
        }
    }
    finish_confined_tree(&build, agent, t, ids, work)
}
