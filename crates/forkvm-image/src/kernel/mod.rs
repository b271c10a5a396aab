//! The guest kernel: our own minimal Linux, built from Debian's `linux-source-6.1`
//! package and cached by content hash.
//!
//! Why our own kernel: PLATFORM.md, "Linux guests on these machines (measured)". Stock
//! kernels build virtio as modules, lack command-line virtio-mmio devices, boot far too
//! slowly under PVM's instruction emulator, and cannot run user space on PVM hosts without
//! the patch in `kernel/patches/`.
//!
//! The inputs live in the repository and are compiled into this crate:
//! * `kernel/forkvm.config` — the config fragment applied on top of `make tinyconfig`;
//! * `kernel/patches/*.patch` — applied in order with `patch -p1`.
//!
//! Two flavours are built from them ([`Flavour`]): `up`, the fragment as it is, for
//! one-vCPU guests, and `smp`, the same with SMP on, for guests with several. SMP costs a
//! one-vCPU guest about a third more emulated boot on PVM hosts (44 s against 33 s to
//! init, docs/benchmarks.md), so a one-vCPU sandbox keeps the UP kernel.
//!
//! [`kernel_key`] hashes them together with the `linux-source-6.1` package version and
//! [`RECIPE_VERSION`]; the kernel for a key lives at `<cache>/kernel/<key>/vmlinux`
//! ([`cache_dir`], [`KernelPaths`]). [`ensure_kernel`] returns that path, building it first
//! if it is missing. The build steps, in order:
//!
//! 1. take a lock on `<cache>/kernel/<key>.lock` (one build per key at a time);
//! 2. extract `/usr/src/linux-source-6.1.tar.xz` into `<cache>/kernel/<key>.build/`;
//! 3. apply the patches (`patch -p1 --forward --batch`);
//! 4. `make tinyconfig`, merge the fragment (`scripts/kconfig/merge_config.sh -m`),
//!    `make olddefconfig`, then verify that every line of the fragment survived;
//! 5. `nice make -j<cpus> vmlinux`, reporting progress from make's output;
//! 6. publish: move `vmlinux`, the final `.config` and `build.json` into a temporary
//!    directory, rename it to `<key>/`, remove the build tree.
//!
//! A failed step keeps `<key>.build/` (with one log per step) and the error names the log;
//! the next attempt starts that directory afresh.

mod build;
mod cmdline;
mod fragment;
mod key;
mod progress;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use build::{cached_kernel, ensure_kernel, ensure_kernel_at, ensure_kernel_flavour, BuildPlan};
pub use cmdline::base_cmdline;
pub use fragment::{parse_config, parse_fragment, verify_config, Mismatch, Setting, Value};
pub use key::{kernel_key, source_version, KernelPaths, RECIPE_VERSION};
pub use progress::ESTIMATED_CC_LINES;

/// The config fragment (`crates/forkvm-image/kernel/forkvm.config`).
pub const FRAGMENT: &str = include_str!("../../kernel/forkvm.config");

/// The line of [`FRAGMENT`] that the `smp` flavour replaces with [`SMP_SETTINGS`].
const UP_SETTING: &str = "# CONFIG_SMP is not set\n";
/// SMP on, up to 16 vCPUs, found through the MP table the VMM writes (there is no ACPI).
const SMP_SETTINGS: &str = "CONFIG_SMP=y\nCONFIG_NR_CPUS=16\nCONFIG_X86_MPPARSE=y\n";
/// Most vCPUs the `smp` kernel runs (its `CONFIG_NR_CPUS`).
pub const MAX_VCPUS: u8 = 16;

/// Which kernel a guest boots: one build each, each under its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// One vCPU: the fragment as it is.
    Up,
    /// Several vCPUs.
    Smp,
}

impl Flavour {
    /// The flavour a guest with `vcpus` vCPUs boots.
    pub fn for_vcpus(vcpus: u8) -> Flavour {
        if vcpus > 1 {
            Flavour::Smp
        } else {
            Flavour::Up
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavour::Up => "up",
            Flavour::Smp => "smp",
        }
    }

    /// The config fragment this flavour builds from.
    pub fn fragment(self) -> String {
        match self {
            Flavour::Up => FRAGMENT.to_string(),
            Flavour::Smp => FRAGMENT.replacen(UP_SETTING, SMP_SETTINGS, 1),
        }
    }
}

/// The guest patches as (file name, contents), applied in this order. A unit test checks
/// that this list matches `crates/forkvm-image/kernel/patches/`.
pub const PATCHES: &[(&str, &str)] = &[
    (
        "0001-x86-pvm-syscall-in-page-fault.patch",
        include_str!("../../kernel/patches/0001-x86-pvm-syscall-in-page-fault.patch"),
    ),
    ("0002-virtio-net-no-tx-watchdog.patch", include_str!("../../kernel/patches/0002-virtio-net-no-tx-watchdog.patch")),
    (
        "0003-hwrng-reader-stops-once-the-crng-is-seeded.patch",
        include_str!("../../kernel/patches/0003-hwrng-reader-stops-once-the-crng-is-seeded.patch"),
    ),
    (
        "0004-ipv4-deferrable-address-lifetime-check.patch",
        include_str!("../../kernel/patches/0004-ipv4-deferrable-address-lifetime-check.patch"),
    ),
    (
        "0005-x86-tsc-deferrable-sync-check.patch",
        include_str!("../../kernel/patches/0005-x86-tsc-deferrable-sync-check.patch"),
    ),
];

/// The Debian package the kernel is built from.
pub const SOURCE_PACKAGE: &str = "linux-source-6.1";

/// Where that package puts the source tarball.
pub const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";

/// What to install when the source or the tools are missing.
pub const APT_HINT: &str = "apt-get install linux-source-6.1 build-essential bc flex bison libelf-dev";

/// The cache root: `$FORKVM_CACHE` if set and not empty, else `$HOME/.cache/forkvm`
/// (else `<tmp>/forkvm-cache` when there is no `$HOME`).
pub fn cache_dir() -> PathBuf {
    cache_dir_from(std::env::var_os("FORKVM_CACHE"), std::env::var_os("HOME"))
}

/// [`cache_dir`] for given values of `$FORKVM_CACHE` and `$HOME`.
pub fn cache_dir_from(forkvm_cache: Option<std::ffi::OsString>, home: Option<std::ffi::OsString>) -> PathBuf {
    match (forkvm_cache, home) {
        (Some(c), _) if !c.is_empty() => PathBuf::from(c),
        (_, Some(h)) if !h.is_empty() => PathBuf::from(h).join(".cache").join("forkvm"),
        _ => std::env::temp_dir().join("forkvm-cache"),
    }
}

/// Progress of [`ensure_kernel`], in the order the steps happen.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildEvent {
    /// The kernel for this key is already in the cache; nothing is built.
    Cached { path: PathBuf },
    /// Another process is building this key; waiting for its lock.
    Waiting { lock: PathBuf },
    /// Extracting the source tarball.
    Extracting { tarball: PathBuf },
    /// Applying patch `name` (`index` of `count`, from 1).
    Patching { name: String, index: usize, count: usize },
    /// `make tinyconfig`, merging and verifying the fragment.
    Configuring,
    /// Compiling: `done` C files so far (make's `CC` lines) of about `estimated_total`
    /// (an estimate: `done` may pass it).
    Compiling { done: u64, estimated_total: u64, elapsed: Duration },
    /// Linking `vmlinux`.
    Linking { elapsed: Duration },
    /// Built and published at `path`; the whole build took `seconds`.
    Done { path: PathBuf, seconds: f64 },
}

/// Why the kernel could not be provided. Variants name the step; those with a `log` point
/// at the file holding the failed command's output (kept after the failure).
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel source {path} not found; install it with: {APT_HINT}")]
    NoSource { path: PathBuf },
    #[error("cannot read the version of package {SOURCE_PACKAGE} (dpkg-query: {detail}); install it with: {APT_HINT}")]
    SourceVersion { detail: String },
    #[error("cannot run `{tool}` ({source}); install the build tools with: {APT_HINT}")]
    Spawn { tool: String, source: std::io::Error },
    #[error("cache directory {path}: {source}")]
    CacheDir { path: PathBuf, source: std::io::Error },
    #[error("lock {path}: {source}")]
    Lock { path: PathBuf, source: std::io::Error },
    #[error("extracting {tarball} failed; log: {log}")]
    Extract { tarball: PathBuf, log: PathBuf },
    #[error("patch {patch} does not apply; log: {log}")]
    Patch { patch: String, log: PathBuf },
    #[error("`{step}` failed; log: {log}")]
    Configure { step: String, log: PathBuf },
    #[error("config fragment line {line}: cannot parse {text:?}")]
    FragmentSyntax { line: usize, text: String },
    #[error("the kernel config dropped {} fragment option(s): {}; final config: {config}", .mismatches.len(), mismatch_list(.mismatches))]
    ConfigDropped { mismatches: Vec<Mismatch>, config: PathBuf },
    #[error("`make vmlinux` failed; log: {log}")]
    Compile { log: PathBuf },
    #[error("the build produced no ELF vmlinux at {path}; log: {log}")]
    NoVmlinux { path: PathBuf, log: PathBuf },
    #[error("publishing the kernel to {path}: {source}")]
    Publish { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    WriteFile { path: PathBuf, source: std::io::Error },
}

impl KernelError {
    /// The log file of the failed step, if the step has one.
    pub fn log_path(&self) -> Option<&Path> {
        match self {
            KernelError::Extract { log, .. }
            | KernelError::Patch { log, .. }
            | KernelError::Configure { log, .. }
            | KernelError::Compile { log }
            | KernelError::NoVmlinux { log, .. } => Some(log),
            _ => None,
        }
    }
}

fn mismatch_list(m: &[Mismatch]) -> String {
    m.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn cache_dir_prefers_forkvm_cache_then_home() {
        let c = |a: Option<&str>, b: Option<&str>| cache_dir_from(a.map(OsString::from), b.map(OsString::from));
        assert_eq!(c(Some("/x/cache"), Some("/home/u")), PathBuf::from("/x/cache"));
        assert_eq!(c(None, Some("/home/u")), PathBuf::from("/home/u/.cache/forkvm"));
        assert_eq!(c(Some(""), Some("/home/u")), PathBuf::from("/home/u/.cache/forkvm"));
        assert_eq!(c(None, None), std::env::temp_dir().join("forkvm-cache"));
    }

    #[test]
    fn patch_list_matches_the_patches_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel/patches");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        on_disk.sort();
        let listed: Vec<String> = PATCHES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(listed, on_disk, "PATCHES must list every file in {} in order", dir.display());
        for (name, text) in PATCHES {
            assert_eq!(*text, std::fs::read_to_string(dir.join(name)).unwrap());
        }
    }

    #[test]
    fn shipped_fragment_parses_and_keeps_the_platform_options() {
        let s = parse_fragment(FRAGMENT).unwrap();
        let has = |name: &str, v: Value| s.iter().any(|x| x.name == name && x.value == v);
        for on in ["VIRTIO_MMIO", "VIRTIO_MMIO_CMDLINE_DEVICES", "VIRTIO_BLK", "VIRTIO_VSOCKETS", "EXT4_FS"] {
            assert!(has(on, Value::Yes), "{on} must be on");
        }
        for off in ["MODULES", "SMP", "PCI", "ACPI", "RANDOMIZE_BASE", "IA32_EMULATION", "JUMP_LABEL"] {
            assert!(has(off, Value::NotSet), "{off} must be off");
        }
    }

    #[test]
    fn the_smp_flavour_differs_only_in_smp() {
        let up = parse_fragment(&Flavour::Up.fragment()).unwrap();
        let smp = parse_fragment(&Flavour::Smp.fragment()).unwrap();
        let has = |s: &[Setting], name: &str, v: Value| s.iter().any(|x| x.name == name && x.value == v);
        assert!(has(&up, "SMP", Value::NotSet));
        assert!(has(&smp, "SMP", Value::Yes) && has(&smp, "X86_MPPARSE", Value::Yes));
        assert!(has(&smp, "NR_CPUS", Value::Other(MAX_VCPUS.to_string())));
        let pairs = |s: &[Setting]| s.iter().map(|x| (x.name.clone(), x.value.clone())).collect::<Vec<_>>();
        let (up, smp) = (pairs(&up), pairs(&smp));
        let only_up: Vec<_> = up.iter().filter(|x| !smp.contains(x)).map(|x| x.0.as_str()).collect();
        let only_smp: Vec<_> = smp.iter().filter(|x| !up.contains(x)).map(|x| x.0.as_str()).collect();
        assert_eq!(only_up, ["SMP"]);
        assert_eq!(only_smp, ["SMP", "NR_CPUS", "X86_MPPARSE"]);
        assert_eq!(Flavour::for_vcpus(1), Flavour::Up);
        assert_eq!(Flavour::for_vcpus(2), Flavour::Smp);
    }

    #[test]
    fn errors_name_their_log() {
        let e = KernelError::Compile { log: PathBuf::from("/c/kernel/k.build/make.log") };
        assert_eq!(e.log_path(), Some(Path::new("/c/kernel/k.build/make.log")));
        assert!(e.to_string().contains("/c/kernel/k.build/make.log"));
        let e = KernelError::NoSource { path: PathBuf::from(SOURCE_TARBALL) };
        assert!(e.to_string().contains("apt-get install linux-source-6.1 build-essential bc flex bison libelf-dev"));
    }
}
