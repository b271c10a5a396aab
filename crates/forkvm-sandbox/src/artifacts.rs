//! Finding (and building, through `forkvm-image`) what a sandbox is made of: the guest
//! kernel, the static agent binary and a template's root filesystem image.

use forkvm_image::kernel::{ensure_kernel_flavour, BuildEvent, Flavour, KernelError};
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
    #[error("a sandbox has 1 to {max} vCPUs, not {0}", max = forkvm_image::kernel::MAX_VCPUS)]
    Vcpus(u8),
    #[error(
        "no static forkvm-agent binary: set {AGENT_BIN_ENV}, install it as <prefix>/lib/forkvm/forkvm-agent beside \
         <prefix>/bin/forkvm, or run crates/forkvm-agent/build-static.sh (looked at {})",
        .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoAgent(Vec<PathBuf>),
}

impl From<CatalogError> for ArtifactsError {
    fn from(e: CatalogError) -> ArtifactsError {
        ArtifactsError::Template(Box::new(e))
    }
}

/// Everything a template's sandboxes boot from.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// The kernel for [`Artifacts::vcpus`] (its flavour: `forkvm_image::kernel::Flavour`).
    pub kernel: PathBuf,
    pub kernel_key: String,
    /// vCPUs the template's machine has: the template's `vcpus` (absent: 1) unless
    /// [`Artifacts::with_vcpus`] said otherwise.
    pub vcpus: u8,
    /// What the template itself asks for (its `vcpus`, absent: 1).
    pub template_vcpus: u8,
    /// Guest memory of the template's machine, MiB (its `memory_mib`, absent:
    /// `forkvm_image::rootfs::template::DEFAULT_MEMORY_MIB`).
    pub mem_mib: u32,
    pub image: BuiltImage,
    /// The blank base of every sandbox's layered data disk.
    pub scratch: PathBuf,
    /// The base of every empty volume slot (a file of no bytes).
    pub empty_slot: PathBuf,
    pub cache: PathBuf,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the static agent binary may be, in order: `$FORKVM_AGENT_BIN` (only that, if
/// set); an installed `<prefix>/lib/forkvm/forkvm-agent` beside `<prefix>/bin/forkvm`;
/// the one `build-static.sh` builds in the source tree this binary was built from.
pub fn agent_candidates() -> Vec<PathBuf> {
    if let Some(path) = std::env::var_os(AGENT_BIN_ENV) {
        return vec![PathBuf::from(path)];
    }
    let installed = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(|prefix| prefix.join("lib/forkvm/forkvm-agent")));
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target"));
    installed.into_iter().chain([target.join("x86_64-unknown-linux-gnu/release/forkvm-agent")]).collect()
}

/// The static agent binary: the first of [`agent_candidates`] that exists.
pub fn agent_binary() -> Result<PathBuf, ArtifactsError> {
    let candidates = agent_candidates();
    candidates.iter().find(|p| p.is_file()).cloned().ok_or(ArtifactsError::NoAgent(candidates))
}

impl Artifacts {
    /// Kernel and image for the template called `name` in the configured catalog
    /// (never a path), on the template's vCPUs, built if missing; `progress` sees kernel
    /// build events.
    pub fn ensure(name: &str, progress: &mut dyn FnMut(BuildEvent)) -> Result<Artifacts, ArtifactsError> {
        let template = Catalog::configured().get(name)?;
        let template_vcpus = template.template.vcpus.unwrap_or(1);
        let cache = forkvm_image::kernel::cache_dir();
        let kernel = ensure_kernel_flavour(Flavour::for_vcpus(template_vcpus), progress)?;
        let kernel_key = key_of(&kernel);
        let image = ensure_image(&template.template, &template.text, &agent_binary()?, &cache)?;
        let scratch = ensure_scratch_disk(&cache)?;
        let empty_slot = forkvm_image::rootfs::ensure_empty_slot(&cache)?;
        let mem_mib = template.template.memory_mib.unwrap_or(forkvm_image::rootfs::template::DEFAULT_MEMORY_MIB);
        Ok(Artifacts {
            kernel,
            kernel_key,
            vcpus: template_vcpus,
            template_vcpus,
            mem_mib,
            image,
            scratch,
            empty_slot,
            cache,
        })
    }

    /// The same template on `vcpus` vCPUs (none: the template's own count): with more
    /// than one, the SMP kernel (built if missing, minutes the first time).
    pub fn with_vcpus(
        self,
        vcpus: Option<u8>,
        progress: &mut dyn FnMut(BuildEvent),
    ) -> Result<Artifacts, ArtifactsError> {
        let vcpus = vcpus.unwrap_or(self.template_vcpus);
        if vcpus == 0 || vcpus > forkvm_image::kernel::MAX_VCPUS {
            return Err(ArtifactsError::Vcpus(vcpus));
        }
        if vcpus == self.vcpus {
            return Ok(self);
        }
        let kernel = ensure_kernel_flavour(Flavour::for_vcpus(vcpus), progress)?;
        Ok(Artifacts { kernel_key: key_of(&kernel), kernel, vcpus, ..self })
    }
}

/// A cached kernel's key: the name of its directory.
fn key_of(kernel: &Path) -> String {
    kernel.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
