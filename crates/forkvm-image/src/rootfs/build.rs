//! Building a template's root filesystem: stage a directory, then `mkfs.ext4 -d` it.
//!
//! busybox bases copy busybox-static and link its applets (no package manager runs);
//! Debian bases run mmdebstrap and pip as root of a user namespace, never host root
//! (`debian.rs`, `userns.rs`). Both get the static `forkvm-agent` as
//! `/sbin/forkvm-agent` and the empty mount points the agent uses (`/overlay`,
//! `/newroot`). The image is written under a temporary name and renamed into place, so a
//! crash never leaves a half image under a valid key.

use super::template::{Base, Template, TemplateError};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the builder changes what it puts into an image of that base.
fn builder_version(base: &Base) -> &'static str {
    match base {
        Base::Busybox => "rootfs-2-resolv",
        Base::Debian(_) => "rootfs-4-mmdebstrap-userns-resolv",
        Base::Oci(_) => "rootfs-oci-1",
    }
}
/// Every guest's `/etc/resolv.conf`: the gateway (172.16.0.1, forkvm-sandbox's
/// `network::GATEWAY_IP`).
pub const RESOLV_CONF: &str = "nameserver 172.16.0.1\noptions timeout:2 attempts:3\n";

/// Directories every image has (mount points of the agent and the kernel).
pub(crate) const DIRS: &[&str] = &[
    "bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "run", "root", "usr/bin", "usr/sbin", "var", "overlay",
    "newroot",
];

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error("reading the agent binary {path}: {source} (build it with crates/forkvm-agent/build-static.sh)")]
    Agent { path: PathBuf, source: std::io::Error },
    #[error("{what}: {path} is missing: install it with `apt-get install {package}`")]
    MissingTool { what: &'static str, path: &'static str, package: &'static str },
    #[error("staging the image in {dir}: {step}: {source}")]
    Stage { dir: PathBuf, step: String, source: std::io::Error },
    #[error("{step} failed ({status}); its output is in {log}")]
    Command { step: String, status: String, log: PathBuf },
    #[error("running {step}: {source}")]
    Spawn { step: String, source: std::io::Error },
    #[error("writing image metadata {path}: {source}")]
    Metadata { path: PathBuf, source: std::io::Error },
    #[error("{step}: image builds with a package manager need root, to run it as root of a user namespace mapped onto unprivileged ids")]
    NotRoot { step: String },
    #[error("{step}: setting up the build's user namespace: {source}")]
    UserNamespace { step: String, source: std::io::Error },
}

/// Who our own writes into a staged tree belong to on the host (the build's id range
/// when the tree is made in a user namespace); `None` keeps the writer's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// What a base's builder made in the work directory (`rootfs.ext4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Staged {
    pub size_bytes: u64,
    /// `[exec] user`, resolved to a name of the image's `/etc/passwd`.
    pub exec_user: Option<String>,
}

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltImage {
    pub name: String,
    pub key: String,
    pub rootfs: PathBuf,
    pub size_bytes: u64,
    /// The warm interpreter, if the template has one.
    pub python: Option<String>,
    pub warmup_eval: Option<String>,
    /// The template's login user, its `start` service's user.
    #[serde(default)]
    pub user: Option<String>,
    /// The template's `start` service and `ready` check (images built before they
    /// existed have neither).
    #[serde(default)]
    pub start: Option<String>,
    #[serde(default)]
    pub ready: Option<String>,
}

/// Content hash of everything an image is built from: the builder for `base`, the
/// template's text and the agent.
pub fn image_key(base: &Base, template_text: &str, agent: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    for part in [builder_version(base).as_bytes(), template_text.as_bytes(), agent] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().to_hex()[..32].to_string()
}

/// The image for `template` (whose source is `text`), built into `<cache>/images/` if
/// it is not there yet.
pub fn ensure_image(
    template: &Template,
    text: &str,
    agent_bin: &Path,
    cache: &Path,
) -> Result<BuiltImage, RootfsError> {
    let agent = std::fs::read(agent_bin).map_err(|source| RootfsError::Agent { path: agent_bin.into(), source })?;
    let key = image_key(&template.base, &super::template::image_text(text), &agent);
    let dir = cache.join("images").join(format!("{}-{key}", template.name));
    let meta_path = dir.join("image.json");
    let built = || {
        let img = serde_json::from_slice::<BuiltImage>(&std::fs::read(&meta_path).ok()?).ok()?;
        img.rootfs.exists().then_some(img)
    };
    if let Some(img) = built() {
        return Ok(img);
    }
    // One builder per image: others wait here, then find its result.
    let lock_path = cache.join("images").join(format!(".{}-{key}.lock", template.name));
    let _lock = crate::cache_lock::CacheLock::take(
        &lock_path,
        &mut || tracing::info!(image = %template.name, "another process is building this image; waiting"),
    )
    .map_err(|source| RootfsError::Stage {
        dir: lock_path.clone(),
        step: "taking the build lock".into(),
        source,
    })?;
    if let Some(img) = built() {
        return Ok(img);
    }
    let work = cache.join("images").join(format!(".{}-{key}.tmp", template.name));
    let _ = std::fs::remove_dir_all(&work);
    let stage_err = |step: &str| {
        let dir = work.clone();
        let step = step.to_string();
        move |source| RootfsError::Stage { dir, step, source }
    };
    std::fs::create_dir_all(&work).map_err(stage_err("creating the work directory"))?;
    let staged = match &template.base {
        Base::Busybox => build_busybox_image(&agent, template, &work)?,
        Base::Debian(suite) => super::debian::build_debian_image(suite, template, &agent, &work)?,
        Base::Oci(manifest) => super::oci_base::build_oci_image(manifest, template, &agent, &work)?,
    };
    let img = BuiltImage {
        name: template.name.clone(),
        key: key.clone(),
        rootfs: dir.join("rootfs.ext4"),
        size_bytes: staged.size_bytes,
        python: template.python.clone(),
        warmup_eval: template.warmup_eval.clone(),
        user: template.user.clone().or(staged.exec_user),
        start: template.start.clone(),
        ready: template.ready.clone(),
    };
    let json = serde_json::to_vec_pretty(&img).unwrap_or_default();
    std::fs::write(work.join("image.json"), json)
        .map_err(|source| RootfsError::Metadata { path: work.join("image.json"), source })?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&work, &dir).map_err(stage_err("publishing the image"))?;
    Ok(img)
}

/// Sets `path`'s permission bits. The builder's own writes set their modes explicitly:
/// forkvm runs with umask 077 (its files are its user's alone), but what goes into an
/// image must have the modes a guest expects.
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Creates `rel` and its missing parents in `tree`, each 0755 and owned by `owner`
/// (never following a link out).
pub(crate) fn create_dirs_owned(tree: &cap_std::fs::Dir, rel: &Path, owner: Option<Owner>) -> std::io::Result<()> {
    let mut at = PathBuf::new();
    for part in rel.components() {
        at.push(part);
        if !tree.exists(&at) {
            tree.create_dir(&at)?;
            tree.set_permissions(&at, cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(0o755)))?;
            if let Some(o) = owner {
                chown_fd(&tree.open_dir(&at)?.into_std_file(), o)?;
            }
        }
    }
    Ok(())
}

/// Gives the file `rel` in `tree` to `owner`, if one is set.
fn chown_file(tree: &cap_std::fs::Dir, rel: &str, owner: Option<Owner>) -> std::io::Result<()> {
    match owner {
        Some(o) => chown_fd(&tree.open(rel)?.into_std(), o),
        None => Ok(()),
    }
}

/// `fchownat(fd, "", AT_EMPTY_PATH)`: works on the `O_PATH` descriptors cap-std opens
/// directories with, where `fchown` does not.
fn chown_fd(file: &std::fs::File, o: Owner) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd and a NUL-terminated empty path.
    let ret = unsafe { libc::fchownat(file.as_raw_fd(), c"".as_ptr(), o.uid, o.gid, libc::AT_EMPTY_PATH) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs a build step's command with umask 022, so what it creates in the image gets the
/// modes it would anywhere else (forkvm itself runs with umask 077).
pub(crate) fn run(step: &str, cmd: &mut Command, log: &Path) -> Result<(), RootfsError> {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let out = cmd.output().map_err(|source| RootfsError::Spawn { step: step.into(), source })?;
    log_outcome(step, out, log)
}

/// Writes a finished step's output (stdout, then stderr) to `log`; a failure names the
/// step and the log.
pub(crate) fn log_outcome(step: &str, out: std::process::Output, log: &Path) -> Result<(), RootfsError> {
    let mut text = out.stdout;
    text.extend_from_slice(&out.stderr);
    let _ = std::fs::write(log, &text);
    if !out.status.success() {
        return Err(RootfsError::Command { step: step.into(), status: out.status.to_string(), log: log.into() });
    }
    Ok(())
}

/// A busybox image: staged and made into ext4 by forkvm itself (no package manager
/// runs), into `<work>/rootfs.ext4`; returns its size.
fn build_busybox_image(agent: &[u8], t: &Template, work: &Path) -> Result<Staged, RootfsError> {
    let staging = work.join("root");
    let stage_err = |step: &str| {
        let (dir, step) = (work.to_path_buf(), step.to_string());
        move |source| RootfsError::Stage { dir, step, source }
    };
    std::fs::create_dir_all(&staging).map_err(stage_err("creating the staging directory"))?;
    // The guest's `/`: its mode is the staging directory's, whatever our umask.
    set_mode(&staging, 0o755).map_err(stage_err("chmod the staging directory"))?;
    require_mkfs()?;
    stage_busybox(&staging)?;
    let exec_user = stage_common(&staging, agent, t, None)?;
    let size_mib = (tree_size(&staging) * 5 / 4) / (1 << 20) + 16;
    run("mkfs.ext4", &mut mkfs_command(&staging, &work.join("rootfs.ext4"), size_mib), &work.join("mkfs.log"))?;
    std::fs::remove_dir_all(&staging).map_err(stage_err("removing the staging tree"))?;
    Ok(Staged { size_bytes: size_mib << 20, exec_user })
}

fn stage_busybox(root: &Path) -> Result<(), RootfsError> {
    const BUSYBOX: &str = "/bin/busybox";
    let is_static = Command::new("file")
        .arg(BUSYBOX)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("statically linked"));
    if !Path::new(BUSYBOX).exists() || is_static.is_ok_and(|s| !s) {
        return Err(RootfsError::MissingTool { what: "a static busybox", path: BUSYBOX, package: "busybox-static" });
    }
    let err = |step: &str| {
        let (dir, step) = (root.to_path_buf(), step.to_string());
        move |source| RootfsError::Stage { dir, step, source }
    };
    let tree =
        cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(err("opening the tree"))?;
    for d in DIRS {
        create_dirs_owned(&tree, Path::new(d), None).map_err(err("creating directories"))?;
    }
    std::fs::copy(BUSYBOX, root.join("bin/busybox")).map_err(err("copying busybox"))?;
    set_mode(&root.join("bin/busybox"), 0o755).map_err(err("chmod busybox"))?;
    let list = Command::new(BUSYBOX).arg("--list-full").output().map_err(err("listing busybox applets"))?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|l| !l.is_empty() && !l.contains("..")) {
        let link = root.join(applet);
        if link.exists() || applet == "bin/busybox" {
            continue;
        }
        if let Some(parent) = Path::new(applet).parent() {
            create_dirs_owned(&tree, parent, None).map_err(err("creating applet directories"))?;
        }
        symlink("/bin/busybox", &link).map_err(err("linking busybox applets"))?;
    }
    for (path, text) in [("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")] {
        std::fs::write(root.join(path), text).map_err(err("writing /etc/passwd and /etc/group"))?;
        set_mode(&root.join(path), 0o644).map_err(err("chmod /etc/passwd and /etc/group"))?;
    }
    Ok(())
}

/// Writes the agent, the hostname and the template's files into the staged tree. Every
/// write resolves its path inside `root` (cap-std): a symbolic link in the tree that
/// points out of it (a package's absolute link, say) is refused, never followed onto
/// the host. Each file and directory it makes is `owner`'s. Writes the template's
/// `[exec]` defaults for the agent; returns their user, resolved to a name.
pub(crate) fn stage_common(
    root: &Path,
    agent: &[u8],
    t: &Template,
    owner: Option<Owner>,
) -> Result<Option<String>, RootfsError> {
    let err = |step: String| {
        let dir = root.to_path_buf();
        move |source| RootfsError::Stage { dir, step, source }
    };
    let tree = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority())
        .map_err(err("opening the staged tree".into()))?;
    tree.write("sbin/forkvm-agent", agent).map_err(err("installing the agent".into()))?;
    tree.set_permissions(
        "sbin/forkvm-agent",
        cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(0o755)),
    )
    .map_err(err("chmod the agent".into()))?;
    // Debug info is most of a release binary and useless in the guest; strip works on a
    // path, so it gets the one cap-std resolved (the agent file itself, not a link).
    let agent_path = root.join(tree.canonicalize("sbin/forkvm-agent").map_err(err("finding the agent".into()))?);
    let _ = Command::new("strip").arg("--strip-debug").arg(&agent_path).status();
    // strip writes a new file, so the owner is set after it.
    chown_file(&tree, "sbin/forkvm-agent", owner).map_err(err("chown the agent".into()))?;
    let file_mode = || cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(0o644));
    tree.write("etc/hostname", "forkvm\n").map_err(err("writing /etc/hostname".into()))?;
    tree.set_permissions("etc/hostname", file_mode()).map_err(err("chmod /etc/hostname".into()))?;
    chown_file(&tree, "etc/hostname", owner).map_err(err("chown /etc/hostname".into()))?;
    // The guest's resolver is its gateway, where every sandbox's namespace serves DNS
    // (forkvm-sandbox's network::dns); never the build host's resolver.
    tree.write("etc/resolv.conf", RESOLV_CONF).map_err(err("writing /etc/resolv.conf".into()))?;
    tree.set_permissions("etc/resolv.conf", file_mode()).map_err(err("chmod /etc/resolv.conf".into()))?;
    chown_file(&tree, "etc/resolv.conf", owner).map_err(err("chown /etc/resolv.conf".into()))?;
    for (path, content) in &t.files {
        let rel = path.trim_start_matches('/');
        if let Some(parent) = Path::new(rel).parent().filter(|p| !p.as_os_str().is_empty()) {
            create_dirs_owned(&tree, parent, owner).map_err(err(format!("creating the parent of {path}")))?;
        }
        tree.write(rel, content).map_err(err(format!("writing {path}")))?;
        tree.set_permissions(rel, file_mode()).map_err(err(format!("chmod {path}")))?;
        chown_file(&tree, rel, owner).map_err(err(format!("chown {path}")))?;
    }
    if t.exec.is_empty() {
        return Ok(None);
    }
    let user = match t.exec.user.as_deref() {
        Some(spec) => Some(super::exec_user::resolve(&tree, spec).map_err(|problem| RootfsError::Stage {
            dir: root.to_path_buf(),
            step: format!("[exec] user {spec:?}"),
            source: std::io::Error::other(problem),
        })?),
        None => None,
    };
    let file = forkvm_proto::exec_defaults::ExecDefaultsFile {
        env: t.exec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cwd: t.exec.cwd.clone(),
        user: user.clone(),
    };
    let rel = forkvm_proto::exec_defaults::EXEC_DEFAULTS_PATH.trim_start_matches('/');
    if let Some(parent) = Path::new(rel).parent() {
        create_dirs_owned(&tree, parent, owner).map_err(err("creating /etc/forkvm".into()))?;
    }
    let json = serde_json::to_vec_pretty(&file).unwrap_or_default();
    tree.write(rel, json).map_err(err("writing the exec defaults".into()))?;
    tree.set_permissions(rel, file_mode()).map_err(err("chmod the exec defaults".into()))?;
    chown_file(&tree, rel, owner).map_err(err("chown the exec defaults".into()))?;
    Ok(user)
}

pub(crate) fn tree_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => 4096 + tree_size(&e.path()),
                    Ok(m) if m.is_file() => m.len().div_ceil(4096) * 4096,
                    _ => 4096,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// `mkfs.ext4 -d`: an ext4 image of `size_mib` at `image` holding the tree `staging`,
/// owners as `mkfs` sees them.
pub(crate) fn require_mkfs() -> Result<(), RootfsError> {
    if !Path::new("/usr/sbin/mkfs.ext4").exists() && !Path::new("/sbin/mkfs.ext4").exists() {
        return Err(RootfsError::MissingTool { what: "mkfs.ext4", path: "/usr/sbin/mkfs.ext4", package: "e2fsprogs" });
    }
    Ok(())
}

pub(crate) fn mkfs_command(staging: &Path, image: &Path, size_mib: u64) -> Command {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-L", "forkvm-root", "-O", "^has_journal", "-E", "root_owner=0:0", "-d"])
        .arg(staging)
        .arg(image)
        .arg(format!("{size_mib}M"));
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_depends_on_template_and_agent() {
        let b = Base::Busybox;
        let k = image_key(&b, "name = \"a\"", b"agent");
        assert_eq!(k.len(), 32);
        assert_eq!(k, image_key(&b, "name = \"a\"", b"agent"));
        assert_ne!(k, image_key(&b, "name = \"b\"", b"agent"));
        assert_ne!(k, image_key(&b, "name = \"a\"", b"agent2"));
        assert_ne!(k, image_key(&Base::Debian("bookworm".into()), "name = \"a\"", b"agent"));
    }

    #[test]
    fn a_missing_agent_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let text = "name = \"t\"\nbase = \"busybox\"\n";
        let t = Template::parse(text).unwrap();
        let e = ensure_image(&t, text, Path::new("/nonexistent/agent"), dir.path()).unwrap_err().to_string();
        assert!(e.contains("build-static.sh"), "{e}");
    }

    #[test]
    fn template_files_never_follow_a_link_out_of_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let (root, host) = (dir.path().join("root"), dir.path().join("host"));
        for d in ["sbin", "etc", "usr/lib"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::create_dir_all(&host).unwrap();
        // What a package could leave in a staged tree: absolute links out of it, and a
        // relative one that climbs out.
        symlink(host.join("motd"), root.join("etc/motd")).unwrap();
        symlink(&host, root.join("etc/conf.d")).unwrap();
        symlink("../../../host", root.join("usr/lib/up")).unwrap();
        // A relative link that stays inside is followed.
        symlink("../usr/lib", root.join("etc/lib")).unwrap();
        let text = |files: &str| format!("name = \"t\"\nbase = \"busybox\"\n[files]\n{files}\n");
        for files in ["\"/etc/motd\" = \"pwned\"", "\"/etc/conf.d/x\" = \"pwned\"", "\"/usr/lib/up/x\" = \"pwned\""] {
            let t = Template::parse(&text(files)).unwrap();
            let e = stage_common(&root, b"agent", &t, None).unwrap_err().to_string();
            assert!(e.contains("staging the image"), "{files}: {e}");
            assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "{files} wrote onto the host");
        }
        let t = Template::parse(&text("\"/etc/lib/ok\" = \"fine\"")).unwrap();
        stage_common(&root, b"agent", &t, None).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("usr/lib/ok")).unwrap(), "fine");
        assert_eq!(std::fs::read(root.join("sbin/forkvm-agent")).unwrap(), b"agent");
    }
}
