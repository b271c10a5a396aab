//! Debian bases: mmdebstrap (minbase) with the template's packages, then pip, then
//! `mkfs.ext4 -d`, all as root of the build's user namespace (`userns.rs`), never as
//! host root.
//!
//! mmdebstrap rather than debootstrap because it is made for this: as root of a user
//! namespace it cannot `mknod`, so it bind-mounts the host's device nodes while the
//! build runs and leaves `/dev` empty (the agent mounts devtmpfs at boot). Its
//! customize hook runs pip in the finished tree with `/proc`, `/dev` and the host's
//! resolver set up, inside the same namespaces.

use super::build::{create_dirs_owned, stage_common, tree_size, Owner, RootfsError, Staged, DIRS};
use super::template::Template;
use super::userns::{prepare_build_dir, run_confined, IdRange, BUILD_DIR};
use std::path::Path;
use std::process::Command;

const MMDEBSTRAP: &str = "/usr/bin/mmdebstrap";
const MERGED_USR_HOOKS: &str = "/usr/share/mmdebstrap/hooks/merged-usr";

/// Builds the ext4 image of a Debian `suite` template into `<work>/rootfs.ext4`, with
/// the agent in it; returns its size. Logs are left in `work`.
pub(crate) fn build_debian_image(suite: &str, t: &Template, agent: &[u8], work: &Path) -> Result<Staged, RootfsError> {
    if !Path::new(MMDEBSTRAP).exists() {
        return Err(RootfsError::MissingTool { what: "mmdebstrap", path: MMDEBSTRAP, package: "mmdebstrap" });
    }
    super::build::require_mkfs()?;
    let ids = IdRange::configured();
    let stage_err = |step: &str| {
        let (dir, step) = (work.to_path_buf(), step.to_string());
        move |source| RootfsError::Stage { dir, step, source }
    };
    let build = work.join("ns");
    prepare_build_dir(&build, ids).map_err(stage_err("preparing the build directory for the user namespace"))?;
    let mut cmd = mmdebstrap_command(suite, t, &debian_mirror());
    run_confined("mmdebstrap", &mut cmd, ids, &build, &work.join("mmdebstrap.log"))?;

    let root = build.join("root");
    // Package caches are dead weight in a read-only image.
    let _ = std::fs::remove_dir_all(root.join("var/cache/apt/archives"));
    let _ = std::fs::remove_dir_all(root.join("var/lib/apt/lists"));
    finish_confined_tree(&build, agent, t, ids, work)
}

/// The common end of a build whose tree `<build>/root` was made in the user namespace
/// of `ids`: our directories and files go in as host root, owned by the range's root
/// so the guest sees 0; `mkfs.ext4` runs in the namespace (so it reads the tree's owners
/// as the guest will see them) into `<work>/rootfs.ext4`; the tree is removed.
pub(crate) fn finish_confined_tree(
    build: &Path,
    agent: &[u8],
    t: &Template,
    ids: IdRange,
    work: &Path,
) -> Result<Staged, RootfsError> {
    let stage_err = |step: &str| {
        let (dir, step) = (work.to_path_buf(), step.to_string());
        move |source| RootfsError::Stage { dir, step, source }
    };
    let root = build.join("root");
    let owner = Owner { uid: ids.host_base, gid: ids.host_base };
    let tree = cap_std::fs::Dir::open_ambient_dir(&root, cap_std::ambient_authority())
        .map_err(stage_err("opening the staged tree"))?;
    for d in DIRS {
        create_dirs_owned(&tree, Path::new(d), Some(owner)).map_err(stage_err("creating directories"))?;
    }
    let exec_user = stage_common(&root, agent, t, Some(owner))?;

    let size_mib = (tree_size(&root) * 5 / 4) / (1 << 20) + 16;
    let mut mkfs = super::build::mkfs_command(
        &Path::new(BUILD_DIR).join("root"),
        &Path::new(BUILD_DIR).join("rootfs.ext4"),
        size_mib,
    );
    run_confined("mkfs.ext4", &mut mkfs, ids, build, &work.join("mkfs.log"))?;
    // Made in the namespace, so checked before host root touches it: a regular file,
    // not a link the build left there (chown would follow it).
    let made = build.join("rootfs.ext4");
    if !std::fs::symlink_metadata(&made).map_err(stage_err("finding the image"))?.is_file() {
        return Err(stage_err("finding the image")(std::io::Error::other("not a regular file")));
    }
    let image = work.join("rootfs.ext4");
    std::fs::rename(&made, &image).map_err(stage_err("moving the image out of the build"))?;
    // The cached image is the host user's file, not the range's.
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    std::os::unix::fs::chown(&image, Some(uid), Some(gid)).map_err(stage_err("chown the image"))?;
    std::fs::remove_dir_all(build).map_err(stage_err("removing the staging tree"))?;
    Ok(Staged { size_bytes: size_mib << 20, exec_user })
}

/// mmdebstrap into `/tmp/root` (the build directory, as the namespace sees it), with
/// pip as a customize hook. Template names were checked to be plain (`template.rs`),
/// so single quotes hold each one in the hook's shell line.
fn mmdebstrap_command(suite: &str, t: &Template, mirror: &str) -> Command {
    let mut cmd = Command::new(MMDEBSTRAP);
    cmd.args(["--mode=unshare", "--variant=minbase", "--format=directory"]);
    // A merged /usr made by mmdebstrap's own hook, not by the `usrmerge` package (which
    // would pull perl into the image: 60 MB a python image does not need).
    if Path::new(MERGED_USR_HOOKS).is_dir() {
        cmd.arg(format!("--hook-dir={MERGED_USR_HOOKS}"));
    }
    if !t.packages.is_empty() {
        cmd.arg(format!("--include={}", t.packages.join(",")));
    }
    if !t.pip.is_empty() {
        let host_ca = Path::new(HOST_CA_BUNDLE).is_file();
        cmd.arg(format!("--customize-hook={}", pip_hook(t, host_ca)));
    }
    if let Some(user) = &t.user {
        cmd.arg(format!("--customize-hook={}", user_hook(user)));
    }
    // The host's environment means nothing in the tree (and `PIP_*`, `REQUESTS_CA_BUNDLE`
    // or `SSL_CERT_FILE` would name host paths there): the build gets a clean one, with
    // the host's proxy settings kept for apt and pip.
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C.UTF-8");
    for (k, v) in std::env::vars_os() {
        if PASSED_ENV.contains(&k.to_string_lossy().as_ref()) {
            cmd.env(k, v);
        }
    }
    cmd.arg(suite).arg(Path::new(BUILD_DIR).join("root")).arg(mirror);
    cmd
}

/// Environment variables a build keeps from the host: proxies.
const PASSED_ENV: &[&str] =
    &["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy", "ALL_PROXY"];

/// The host's CA bundle. pip in the tree trusts it (as apt on the host does), so builds
/// work behind a TLS-inspecting proxy whose CA the host trusts but Debian's bundle lacks.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The customize hook that pip-installs the template's requirements in the tree (`$1`).
fn pip_hook(t: &Template, host_ca: bool) -> String {
    let python = t.python.as_deref().unwrap_or("/usr/bin/python3");
    let quoted: Vec<String> = t.pip.iter().map(|p| format!("'{p}'")).collect();
    let pip = format!("chroot \"$1\" '{python}' -m pip install --break-system-packages --no-cache-dir");
    if !host_ca {
        return format!("{pip} {}", quoted.join(" "));
    }
    let ca = "/tmp/.forkvm-host-ca.pem";
    format!(
        "set -e; trap 'rm -f \"$1{ca}\"' EXIT; cp {HOST_CA_BUNDLE} \"$1{ca}\"; {pip} --cert {ca} {}",
        quoted.join(" ")
    )
}

/// The customize hook that adds the template's login user (its name was checked to be
/// plain, `template.rs`): a home, bash, and passwordless sudo when sudo is installed.
fn user_hook(user: &str) -> String {
    format!(
        "set -e; chroot \"$1\" useradd --create-home --shell /bin/bash '{user}'; \
         if chroot \"$1\" getent group sudo >/dev/null; then chroot \"$1\" usermod -aG sudo '{user}'; fi; \
         if [ -d \"$1/etc/sudoers.d\" ]; then echo '{user} ALL=(ALL:ALL) NOPASSWD: ALL' > \"$1/etc/sudoers.d/{user}\"; \
         chmod 0440 \"$1/etc/sudoers.d/{user}\"; fi"
    )
}

/// The Debian mirror apt uses on this host (deb822 or one-line sources), else deb.debian.org.
fn debian_mirror() -> String {
    let mut text = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    text.push_str(&std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default());
    text.lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("URIs:")
                .map(|u| u.split_whitespace().next().unwrap_or("").to_string())
                .or_else(|| {
                    l.strip_prefix("deb ")
                        .and_then(|r| r.split_whitespace().find(|w| w.starts_with("http")).map(String::from))
                })
                .filter(|u| u.starts_with("http") && !u.contains("security"))
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_runs_as_a_quoted_hook_in_the_tree() {
        let t = Template::parse(
            "name = \"p\"\nbase = \"debian:bookworm\"\npackages = [\"python3-pip\"]\npip = [\"numpy<2\"]\n\
             python = \"/usr/bin/python3\"",
        )
        .unwrap();
        let cmd = mmdebstrap_command("bookworm", &t, "http://deb.debian.org/debian");
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[0], "--mode=unshare");
        assert!(args.contains(&"--include=python3-pip".to_string()), "{args:?}");
        assert!(args.iter().any(|a| a.starts_with("--customize-hook=")), "{args:?}");
        assert_eq!(&args[args.len() - 3..], ["bookworm", "/tmp/root", "http://deb.debian.org/debian"]);
        let plain = "chroot \"$1\" '/usr/bin/python3' -m pip install --break-system-packages --no-cache-dir 'numpy<2'";
        assert_eq!(pip_hook(&t, false), plain);
        let with_ca = pip_hook(&t, true);
        assert!(with_ca.contains("--cert /tmp/.forkvm-host-ca.pem 'numpy<2'") && with_ca.contains("trap"), "{with_ca}");
    }
}
