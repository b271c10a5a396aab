//! Root filesystem images built from templates, cached by content hash.
//!
//! An image is an ext4 file the guest mounts read-only as its root (shared by every
//! sandbox of the template); the agent, PID 1, puts an overlay over it whose writable
//! half is on the sandbox's own layered data disk (`scratch.rs`). The cache
//! key hashes the template text, the agent binary and the builder's version, so any
//! change to them builds a new image and old ones can be deleted at will.

pub mod build;
pub mod catalog;
mod debian;
mod exec_user;
mod oci_base;
pub mod scratch;
pub mod template;
pub mod userns;

pub use build::{ensure_image, image_key, BuiltImage, RootfsError};
pub use catalog::{Catalog, CatalogError, CatalogTemplate};
pub use scratch::{ensure_empty_slot, ensure_scratch_disk, scratch_key, SCRATCH_DISK_BYTES, SCRATCH_LABEL};
pub use template::{Base, Template, TemplateError};
