//! Finding (and building, through `forkvm-image`) what a sandbox is made of: the guest
//! kernel, the static agent binary and a template's root filesystem image.

use forkvm_image::kernel::{ensure_kernel, BuildEvent, KernelError};
use forkvm_image::rootfs::{ensure_image, ensure_scratch_disk, BuiltImage, RootfsError};
use std::path::{Path, PathBuf};

/// Environment variable naming the static `forkvm-agent` binary to put in images.
pub const AGENT_BIN_ENV: &str = "FORKVM_AGENT_BIN";
/// Environment variable naming the directory of image templates.
pub const TEMPLATES_ENV: &str = "FORKVM_TEMPLATES";

#[derive(Debug, thiserror::Error)]
pub enum ArtifactsError {
    #[error("guest kernel: {0}")]
    Kernel(#[from] KernelError),
    #[error("image: {0}")]
    Image(#[from] RootfsError),
    #[error("no template {name:?} in {dir} (templates there: {known})")]
    UnknownTemplate { name: String, dir: PathBuf, known: String },
    #[error(
        "no static forkvm-agent binary: set {AGENT_BIN_ENV} or run crates/forkvm-agent/build-static.sh (looked at {0})"
    )]
    NoAgent(PathBuf),
}

/// Everything a template's sandboxes boot from.
#[derive(Debug, Clone)]
pub struct Artifacts {
    pub kernel: PathBuf,
    pub kernel_key: String,
    pub image: BuiltImage,
    /// The blank base of every sandbox's layered data disk.
    pub scratch: PathBuf,
    pub cache: PathBuf,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of image templates (`templates/` in the repository by default).
pub fn templates_dir() -> PathBuf {
    std::env::var_os(TEMPLATES_ENV).map(PathBuf::from).unwrap_or_else(|| repo_root().join("templates"))
}

/// The static agent binary: `$FORKVM_AGENT_BIN`, else the one `build-static.sh` builds.
pub fn agent_binary() -> Result<PathBuf, ArtifactsError> {
    let path = std::env::var_os(AGENT_BIN_ENV).map(PathBuf::from).unwrap_or_else(|| {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target"));
        target.join("x86_64-unknown-linux-gnu/release/forkvm-agent")
    });
    if path.is_file() {
        Ok(path)
    } else {
        Err(ArtifactsError::NoAgent(path))
    }
}

fn template_path(name: &str) -> Result<PathBuf, ArtifactsError> {
    let dir = templates_dir();
    let as_path = Path::new(name);
    if as_path.extension().is_some_and(|e| e == "toml") && as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let path = dir.join(format!("{name}.toml"));
    if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') && path.is_file() {
        return Ok(path);
    }
    let known = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    Err(ArtifactsError::UnknownTemplate { name: name.into(), dir, known })
}

impl Artifacts {
    /// Kernel and image for template `name` (a name in the templates directory, or a
    /// path to a `.toml`), built if missing; `progress` sees kernel build events.
    pub fn ensure(name: &str, progress: &mut dyn FnMut(BuildEvent)) -> Result<Artifacts, ArtifactsError> {
        let template = template_path(name)?;
        let cache = forkvm_image::kernel::cache_dir();
        let kernel = ensure_kernel(progress)?;
        let kernel_key =
            kernel.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let image = ensure_image(&template, &agent_binary()?, &cache)?;
        let scratch = ensure_scratch_disk(&cache)?;
        Ok(Artifacts { kernel, kernel_key, image, scratch, cache })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_templates_list_the_known_ones() {
        let e = template_path("no-such-template").unwrap_err().to_string();
        assert!(e.contains("tiny") && e.contains("python"), "{e}");
        assert!(template_path("../etc/passwd").is_err());
        assert!(template_path("tiny").is_ok());
    }
}
