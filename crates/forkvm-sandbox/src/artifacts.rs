//! Finding (and building, through `forkvm-image`) what a sandbox is made of: the guest
//! kernel, the static agent binary and a template's root filesystem image.

use forkvm_image::kernel::{ensure_kernel, BuildEvent, KernelError};
use forkvm_image::rootfs::{ensure_image, ensure_scratch_disk, BuiltImage, Catalog, CatalogError, RootfsError};
use std::path::{Path, PathBuf};

/// Environment variable naming the static `forkvm-agent` binary to put in images.
pub const AGENT_BIN_ENV: &str = "FORKVM_AGENT_BIN";
pub use forkvm_image::rootfs::catalog::TEMPLATES_ENV;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactsError {
    #[error("guest kernel: {0}")]
    Kernel(#[from] KernelError),
    #[error("image: {0}")]
    Image(#[from] RootfsError),
    #[error(transparent)]
    Template(Box<CatalogError>),
    #[error(
        "no static forkvm-agent binary: set {AGENT_BIN_ENV} or run crates/forkvm-agent/build-static.sh (looked at {0})"
    )]
    NoAgent(PathBuf),
}

impl From<CatalogError> for ArtifactsError {
    fn from(e: CatalogError) -> ArtifactsError {
        ArtifactsError::Template(Box::new(e))
    }
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

impl Artifacts {
    /// Kernel and image for the template called `name` in the configured catalog
    /// (never a path), built if missing; `progress` sees kernel build events.
    pub fn ensure(name: &str, progress: &mut dyn FnMut(BuildEvent)) -> Result<Artifacts, ArtifactsError> {
        let template = Catalog::configured().get(name)?;
        let cache = forkvm_image::kernel::cache_dir();
        let kernel = ensure_kernel(progress)?;
        let kernel_key =
            kernel.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let image = ensure_image(&template.template, &template.text, &agent_binary()?, &cache)?;
        let scratch = ensure_scratch_disk(&cache)?;
        Ok(Artifacts { kernel, kernel_key, image, scratch, cache })
    }
}
