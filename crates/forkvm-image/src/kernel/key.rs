//! The cache key of a kernel build and where the build for a key lives.
//!
//! The key is BLAKE3 over everything that decides the output: [`RECIPE_VERSION`], the
//! config fragment, each patch (name and text, in order) and the version of the
//! `linux-source-6.1` package. Each field is length-prefixed, so moving bytes between
//! fields changes the key. The compiler version is not part of it: a newer gcc builds the
//! same configuration.
//!
//! Layout under `<cache>/kernel/`:
//! ```text
//! <key>/vmlinux  <key>/config  <key>/build.json   published, never modified
//! <key>.build/                                    build tree + one log per step
//! <key>.tmp-<pid>/                                being published (renamed to <key>/)
//! <key>.lock                                      flock: one build per key at a time
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{KernelError, SOURCE_PACKAGE};

/// Bump when the build steps change in a way that changes the output (make target,
/// environment, tinyconfig base), so old cache entries are not reused.
pub const RECIPE_VERSION: u32 = 1;

/// The cache key: 32 hex digits (128 bits) of BLAKE3 over the build's inputs.
pub fn kernel_key(fragment: &str, patches: &[(&str, &str)], source_version: &str) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field("forkvm-kernel", &RECIPE_VERSION.to_le_bytes());
    field("fragment", fragment.as_bytes());
    field("patches", &(patches.len() as u64).to_le_bytes());
    for (name, text) in patches {
        field("patch-name", name.as_bytes());
        field("patch", text.as_bytes());
    }
    field("source-version", source_version.as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// The installed version of `linux-source-6.1`
/// (`dpkg-query -W -f='${Version}' linux-source-6.1`).
pub fn source_version() -> Result<String, KernelError> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", SOURCE_PACKAGE])
        .output()
        .map_err(|e| KernelError::SourceVersion { detail: e.to_string() })?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || version.is_empty() {
        let detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let detail = if detail.is_empty() { "package not installed".to_string() } else { detail };
        return Err(KernelError::SourceVersion { detail });
    }
    Ok(version)
}

/// The paths of one key's build under `<cache>/kernel/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPaths {
    root: PathBuf,
    key: String,
}

impl KernelPaths {
    /// Paths for `key` under the cache root `cache` (`<cache>/kernel/...`).
    pub fn new(cache: &Path, key: &str) -> Self {
        KernelPaths { root: cache.join("kernel"), key: key.to_string() }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// `<cache>/kernel`
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<cache>/kernel/<key>`: the published build.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.key)
    }

    /// `<cache>/kernel/<key>/vmlinux`
    pub fn vmlinux(&self) -> PathBuf {
        self.dir().join("vmlinux")
    }

    /// `<cache>/kernel/<key>.build`: source tree and logs while building.
    pub fn build_dir(&self) -> PathBuf {
        self.root.join(format!("{}.build", self.key))
    }

    /// `<cache>/kernel/<key>.build/<step>.log`
    pub fn log(&self, step: &str) -> PathBuf {
        self.build_dir().join(format!("{step}.log"))
    }

    /// `<cache>/kernel/<key>.tmp-<pid>`: staging directory renamed to [`Self::dir`].
    pub fn staging_dir(&self) -> PathBuf {
        self.root.join(format!("{}.tmp-{}", self.key, std::process::id()))
    }

    /// `<cache>/kernel/<key>.lock`
    pub fn lock_file(&self) -> PathBuf {
        self.root.join(format!("{}.lock", self.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P1: (&str, &str) = ("0001-a.patch", "--- a/x\n+++ b/x\n");
    const P2: (&str, &str) = ("0002-b.patch", "--- a/y\n+++ b/y\n");

    #[test]
    fn key_is_stable_and_well_formed() {
        let k = kernel_key("CONFIG_A=y\n", &[P1], "6.1.192-3");
        assert_eq!(k, kernel_key("CONFIG_A=y\n", &[P1], "6.1.192-3"));
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn key_changes_with_every_input() {
        let base = kernel_key("CONFIG_A=y\n", &[P1, P2], "6.1.192-3");
        let others = [
            kernel_key("CONFIG_A=y\nCONFIG_B=y\n", &[P1, P2], "6.1.192-3"),
            kernel_key("CONFIG_A=y\n", &[P1, ("0002-b.patch", "--- a/y\n+++ b/z\n")], "6.1.192-3"),
            kernel_key("CONFIG_A=y\n", &[P1, ("0002-c.patch", P2.1)], "6.1.192-3"),
            kernel_key("CONFIG_A=y\n", &[P2, P1], "6.1.192-3"),
            kernel_key("CONFIG_A=y\n", &[P1], "6.1.192-3"),
            kernel_key("CONFIG_A=y\n", &[P1, P2], "6.1.193-1"),
        ];
        for (i, k) in others.iter().enumerate() {
            assert_ne!(&base, k, "variant {i} must change the key");
        }
    }

    #[test]
    fn fields_do_not_run_into_each_other() {
        // The same bytes split differently between fragment and version.
        assert_ne!(kernel_key("CONFIG_A=y\n6", &[], ".1"), kernel_key("CONFIG_A=y\n", &[], "6.1"));
        // A patch's name and text are separate fields.
        assert_ne!(kernel_key("", &[("ab", "c")], "v"), kernel_key("", &[("a", "bc")], "v"));
    }

    #[test]
    fn cache_layout() {
        let p = KernelPaths::new(Path::new("/c"), "0123abcd");
        assert_eq!(p.key(), "0123abcd");
        assert_eq!(p.root(), Path::new("/c/kernel"));
        assert_eq!(p.dir(), PathBuf::from("/c/kernel/0123abcd"));
        assert_eq!(p.vmlinux(), PathBuf::from("/c/kernel/0123abcd/vmlinux"));
        assert_eq!(p.build_dir(), PathBuf::from("/c/kernel/0123abcd.build"));
        assert_eq!(p.log("make"), PathBuf::from("/c/kernel/0123abcd.build/make.log"));
        assert_eq!(p.lock_file(), PathBuf::from("/c/kernel/0123abcd.lock"));
        let staging = p.staging_dir();
        assert_eq!(staging.parent(), Some(Path::new("/c/kernel")));
        assert_eq!(staging.file_name().unwrap().to_str().unwrap(), format!("0123abcd.tmp-{}", std::process::id()));
    }
}
