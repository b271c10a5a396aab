//! Building the kernel for a key and publishing it into the cache (steps: module doc of
//! [`super`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::fragment::{parse_config, parse_fragment, verify_config};
use super::key::{kernel_key, source_version, KernelPaths, RECIPE_VERSION};
use super::progress::{Change, Counter, ESTIMATED_CC_LINES};
use super::{cache_dir, BuildEvent, Flavour, KernelError, PATCHES, SOURCE_TARBALL};

/// The directory the tarball unpacks to.
const SOURCE_DIR: &str = "linux-source-6.1";

/// Everything a build depends on. [`BuildPlan::current`] is the project's kernel; tests and
/// experiments can point at another cache, tarball or fragment.
#[derive(Debug, Clone)]
pub struct BuildPlan {
    /// Cache root (the kernel goes under `<cache>/kernel/`).
    pub cache: PathBuf,
    /// The `linux-source-6.1` tarball.
    pub tarball: PathBuf,
    pub fragment: String,
    /// (file name, text), applied in order.
    pub patches: Vec<(String, String)>,
    /// Version of the source package (part of the key).
    pub source_version: String,
    /// `make -j` (default: the number of CPUs available to this process).
    pub jobs: usize,
}

impl BuildPlan {
    /// The project's (UP) kernel: the embedded fragment and patches, the installed
    /// `linux-source-6.1`, the cache from [`cache_dir`].
    pub fn current() -> Result<Self, KernelError> {
        BuildPlan::flavour(Flavour::Up)
    }

    /// [`BuildPlan::current`] for a flavour.
    pub fn flavour(flavour: Flavour) -> Result<Self, KernelError> {
        Ok(BuildPlan {
            cache: cache_dir(),
            tarball: PathBuf::from(SOURCE_TARBALL),
            fragment: flavour.fragment(),
            patches: PATCHES.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect(),
            source_version: source_version()?,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    }

    pub fn key(&self) -> String {
        let patches: Vec<(&str, &str)> = self.patches.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
        kernel_key(&self.fragment, &patches, &self.source_version)
    }

    pub fn paths(&self) -> KernelPaths {
        KernelPaths::new(&self.cache, &self.key())
    }
}

/// The project's kernel if it is already in the cache (never builds).
pub fn cached_kernel() -> Result<Option<PathBuf>, KernelError> {
    let vmlinux = BuildPlan::current()?.paths().vmlinux();
    Ok(vmlinux.is_file().then_some(vmlinux))
}

/// The project's kernel, `<cache>/kernel/<key>/vmlinux`, built first if it is not cached.
/// Building takes minutes (6–15 on two cores); `progress` hears about each step.
pub fn ensure_kernel(progress: &mut dyn FnMut(BuildEvent)) -> Result<PathBuf, KernelError> {
    ensure_kernel_at(&BuildPlan::current()?, progress)
}

/// [`ensure_kernel`] for a flavour.
pub fn ensure_kernel_flavour(flavour: Flavour, progress: &mut dyn FnMut(BuildEvent)) -> Result<PathBuf, KernelError> {
    ensure_kernel_at(&BuildPlan::flavour(flavour)?, progress)
}

/// [`ensure_kernel`] for an explicit plan.
pub fn ensure_kernel_at(plan: &BuildPlan, progress: &mut dyn FnMut(BuildEvent)) -> Result<PathBuf, KernelError> {
    let paths = plan.paths();
    if paths.vmlinux().is_file() {
        progress(BuildEvent::Cached { path: paths.vmlinux() });
        return Ok(paths.vmlinux());
    }
    if !plan.tarball.is_file() {
        return Err(KernelError::NoSource { path: plan.tarball.clone() });
    }
    let fragment = parse_fragment(&plan.fragment)?;
    mkdir_all(paths.root())?;
    let _lock = Lock::take(&paths.lock_file(), progress)?;
    // Another process may have built it while we waited for the lock.
    if paths.vmlinux().is_file() {
        progress(BuildEvent::Cached { path: paths.vmlinux() });
        return Ok(paths.vmlinux());
    }

    let start = Instant::now();
    let build = paths.build_dir();
    if build.exists() {
        fs::remove_dir_all(&build).map_err(|source| KernelError::CacheDir { path: build.clone(), source })?;
    }
    mkdir_all(&build)?;
    tracing::info!(key = paths.key(), dir = %build.display(), "building guest kernel");

    // Extract.
    progress(BuildEvent::Extracting { tarball: plan.tarball.clone() });
    let log = paths.log("extract");
    let mut tar = Command::new("tar");
    tar.arg("-xJf").arg(&plan.tarball).arg("-C").arg(&build);
    let src = build.join(SOURCE_DIR);
    if !run_logged(&mut tar, "tar", &log)? || !src.join("Makefile").is_file() {
        return Err(KernelError::Extract { tarball: plan.tarball.clone(), log });
    }

    // Patch.
    let log = paths.log("patch");
    let patch_dir = build.join("patches");
    mkdir_all(&patch_dir)?;
    for (i, (name, text)) in plan.patches.iter().enumerate() {
        progress(BuildEvent::Patching { name: name.clone(), index: i + 1, count: plan.patches.len() });
        let file = patch_dir.join(name);
        write_file(&file, text.as_bytes())?;
        let mut cmd = Command::new("patch");
        cmd.args(["-p1", "--forward", "--batch", "-i"]).arg(&file).current_dir(&src);
        if !run_logged(&mut cmd, "patch", &log)? {
            return Err(KernelError::Patch { patch: name.clone(), log });
        }
    }

    // Configure and verify.
    progress(BuildEvent::Configuring);
    let log = paths.log("config");
    let fragment_file = build.join("forkvm.config");
    write_file(&fragment_file, plan.fragment.as_bytes())?;
    let mut merge = Command::new("sh");
    merge.args(["scripts/kconfig/merge_config.sh", "-m", ".config"]).arg(&fragment_file);
    let steps: [(&str, Command); 3] = [
        ("make tinyconfig", make(&src, &["tinyconfig"])),
        ("merge_config.sh -m", merge),
        ("make olddefconfig", make(&src, &["olddefconfig"])),
    ];
    for (step, mut cmd) in steps {
        cmd.current_dir(&src);
        if !run_logged(&mut cmd, step.split(' ').next().unwrap_or(step), &log)? {
            return Err(KernelError::Configure { step: step.to_string(), log });
        }
    }
    let config_path = src.join(".config");
    let config = fs::read_to_string(&config_path)
        .map_err(|_| KernelError::Configure { step: "read .config".to_string(), log: log.clone() })?;
    let mismatches = verify_config(&fragment, &parse_config(&config));
    if !mismatches.is_empty() {
        return Err(KernelError::ConfigDropped { mismatches, config: config_path });
    }

    // Compile.
    let log = paths.log("make");
    let compiled = compile(&src, plan.jobs.max(1), &log, start, progress)?;
    let vmlinux = src.join("vmlinux");
    if !is_elf(&vmlinux) {
        return Err(KernelError::NoVmlinux { path: vmlinux, log });
    }

    // Publish.
    let seconds = start.elapsed().as_secs_f64();
    publish(plan, &paths, &src, seconds, compiled)?;
    if let Err(e) = fs::remove_dir_all(&build) {
        tracing::warn!(dir = %build.display(), error = %e, "could not remove the kernel build tree");
    }
    tracing::info!(key = paths.key(), seconds, "guest kernel built");
    progress(BuildEvent::Done { path: paths.vmlinux(), seconds });
    Ok(paths.vmlinux())
}

/// `make ARCH=x86_64 <args>` in `src`, with an environment that cannot redirect it.
fn make(src: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("make");
    cmd.arg("ARCH=x86_64").args(args).current_dir(src);
    scrub_env(&mut cmd);
    cmd
}

/// Remove variables that would change what kbuild does (a parent make's jobserver, a
/// cross compiler, an output directory) and pin the locale of its messages.
fn scrub_env(cmd: &mut Command) {
    for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "CROSS_COMPILE", "KBUILD_OUTPUT", "KCONFIG_CONFIG"]
    {
        cmd.env_remove(var);
    }
    cmd.env("LC_ALL", "C").env("KBUILD_BUILD_USER", "forkvm").env("KBUILD_BUILD_HOST", "forkvm");
}

/// `nice -n 10 make -j<jobs> vmlinux`, progress from its output; returns the `CC` count.
fn compile(
    src: &Path,
    jobs: usize,
    log: &Path,
    start: Instant,
    progress: &mut dyn FnMut(BuildEvent),
) -> Result<u64, KernelError> {
    let mut log_file = open_log(log)?;
    let stderr = log_file.try_clone().map_err(|source| KernelError::WriteFile { path: log.to_path_buf(), source })?;
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "10", "make", "ARCH=x86_64", &format!("-j{jobs}"), "vmlinux"]).current_dir(src);
    scrub_env(&mut cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|source| KernelError::Spawn { tool: "nice make".to_string(), source })?;
    let mut counter = Counter::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            // A full log is not worth failing the build over.
            let _ = writeln!(log_file, "{line}");
            let elapsed = start.elapsed();
            match counter.feed(&line) {
                Change::Compiled => progress(BuildEvent::Compiling {
                    done: counter.compiled,
                    estimated_total: ESTIMATED_CC_LINES,
                    elapsed,
                }),
                Change::LinkStarted => progress(BuildEvent::Linking { elapsed }),
                Change::Nothing => {}
            }
        }
    }
    let status = child.wait().map_err(|source| KernelError::Spawn { tool: "make".to_string(), source })?;
    let _ = writeln!(log_file, "# make exited: {status}; {} CC lines", counter.compiled);
    if !status.success() {
        return Err(KernelError::Compile { log: log.to_path_buf() });
    }
    Ok(counter.compiled)
}

/// Move the result into `<key>.tmp-<pid>/` and rename that to `<key>/`.
fn publish(plan: &BuildPlan, paths: &KernelPaths, src: &Path, seconds: f64, compiled: u64) -> Result<(), KernelError> {
    let staging = paths.staging_dir();
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KernelError::Publish { path, source }
    };
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(err(&staging))?;
    }
    fs::create_dir_all(&staging).map_err(err(&staging))?;
    fs::rename(src.join("vmlinux"), staging.join("vmlinux")).map_err(err(&staging.join("vmlinux")))?;
    fs::copy(src.join(".config"), staging.join("config")).map_err(err(&staging.join("config")))?;
    let built_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let info = serde_json::json!({
        "key": paths.key(),
        "recipe_version": RECIPE_VERSION,
        "source_package_version": plan.source_version,
        "patches": plan.patches.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "build_seconds": seconds,
        "compiled_files": compiled,
        "jobs": plan.jobs,
        "built_at_unix": built_at,
    });
    let json = serde_json::to_vec_pretty(&info).unwrap_or_default();
    fs::write(staging.join("build.json"), json).map_err(err(&staging.join("build.json")))?;
    let dir = paths.dir();
    match fs::rename(&staging, &dir) {
        Ok(()) => Ok(()),
        // Published by someone who did not take the lock; theirs is as good as ours.
        Err(_) if paths.vmlinux().is_file() => {
            let _ = fs::remove_dir_all(&staging);
            Ok(())
        }
        Err(source) => Err(KernelError::Publish { path: dir, source }),
    }
}

/// Run `cmd` with stdout and stderr appended to `log`; Ok(false) if it exited non-zero.
fn run_logged(cmd: &mut Command, tool: &str, log: &Path) -> Result<bool, KernelError> {
    let mut out = open_log(log)?;
    let _ = writeln!(out, "$ {cmd:?}");
    let err = out.try_clone().map_err(|source| KernelError::WriteFile { path: log.to_path_buf(), source })?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|source| KernelError::WriteFile { path: log.to_path_buf(), source })?)
        .stderr(err)
        .status()
        .map_err(|source| KernelError::Spawn { tool: tool.to_string(), source })?;
    let _ = writeln!(out, "# exited: {status}");
    Ok(status.success())
}

fn open_log(log: &Path) -> Result<File, KernelError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|source| KernelError::WriteFile { path: log.to_path_buf(), source })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), KernelError> {
    fs::write(path, bytes).map_err(|source| KernelError::WriteFile { path: path.to_path_buf(), source })
}

fn mkdir_all(path: &Path) -> Result<(), KernelError> {
    fs::create_dir_all(path).map_err(|source| KernelError::CacheDir { path: path.to_path_buf(), source })
}

fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| io::Read::read_exact(&mut f, &mut magic)).is_ok() && magic == *b"\x7fELF"
}

/// An exclusive lock on `<key>.lock` (see [`crate::cache_lock`]).
#[derive(Debug)]
struct Lock {
    _lock: crate::cache_lock::CacheLock,
}

impl Lock {
    fn take(path: &Path, progress: &mut dyn FnMut(BuildEvent)) -> Result<Lock, KernelError> {
        let lock = crate::cache_lock::CacheLock::take(path, &mut || {
            progress(BuildEvent::Waiting { lock: path.to_path_buf() })
        })
        .map_err(|source| KernelError::Lock { path: path.to_path_buf(), source })?;
        Ok(Lock { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cache: &Path, tarball: &Path) -> BuildPlan {
        BuildPlan {
            cache: cache.to_path_buf(),
            tarball: tarball.to_path_buf(),
            fragment: "CONFIG_A=y\n".into(),
            patches: vec![("0001-x.patch".into(), "x".into())],
            source_version: "6.1.192-3".into(),
            jobs: 1,
        }
    }

    #[test]
    fn a_cached_kernel_is_returned_without_building() {
        let dir = tempfile::tempdir().unwrap();
        let p = plan(dir.path(), Path::new("/nonexistent/linux.tar.xz"));
        let paths = p.paths();
        fs::create_dir_all(paths.dir()).unwrap();
        fs::write(paths.vmlinux(), b"\x7fELF....").unwrap();
        let mut events = Vec::new();
        let got = ensure_kernel_at(&p, &mut |e| events.push(e)).unwrap();
        assert_eq!(got, dir.path().join("kernel").join(p.key()).join("vmlinux"));
        assert_eq!(events, vec![BuildEvent::Cached { path: got.clone() }]);
    }

    #[test]
    fn a_missing_tarball_says_what_to_install() {
        let dir = tempfile::tempdir().unwrap();
        let p = plan(dir.path(), &dir.path().join("missing.tar.xz"));
        let e = ensure_kernel_at(&p, &mut |_| {}).unwrap_err();
        assert!(matches!(e, KernelError::NoSource { .. }), "{e:?}");
        assert!(e.to_string().contains("apt-get install linux-source-6.1"), "{e}");
    }

    #[test]
    fn a_bad_fragment_fails_before_anything_is_extracted() {
        let dir = tempfile::tempdir().unwrap();
        let tarball = dir.path().join("linux.tar.xz");
        fs::write(&tarball, b"").unwrap();
        let mut p = plan(dir.path(), &tarball);
        p.fragment = "CONFIG_A=y\nnonsense\n".into();
        let e = ensure_kernel_at(&p, &mut |_| {}).unwrap_err();
        assert!(matches!(e, KernelError::FragmentSyntax { line: 2, .. }), "{e:?}");
        assert!(!p.paths().build_dir().exists());
    }

    #[test]
    fn elf_check_reads_the_magic() {
        let dir = tempfile::tempdir().unwrap();
        let (elf, text) = (dir.path().join("a"), dir.path().join("b"));
        fs::write(&elf, b"\x7fELF\x02\x01").unwrap();
        fs::write(&text, b"#!/bin/sh").unwrap();
        assert!(is_elf(&elf));
        assert!(!is_elf(&text));
        assert!(!is_elf(&dir.path().join("missing")));
    }
}
