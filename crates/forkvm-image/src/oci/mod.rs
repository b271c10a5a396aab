//! Templates from OCI images: what a user brings as a container image (an OCI layout,
//! an OCI archive or a `docker save` archive) becomes the root filesystem of a template.
//!
//! * [`import`]: the image's manifest, config and layers go into a [`BlobStore`] beside
//!   the template directory, each checked against its sha256 digest; images sharing base
//!   layers store them once.
//! * [`apply`]: one layer onto a root directory by the OCI rules (whiteouts, opaque
//!   directories, hard links), never writing outside the root whatever the layer holds.
//! * [`helper`]: the unpack runs as root of the build's user namespace, in a process of
//!   its own (forkvm re-executed), never as host root.
//! * [`defaults`]: the image config's Env, WorkingDir, User and Entrypoint/Cmd, as the
//!   template fields they become.
//! * [`template_file`]: the `<name>.toml` an imported image becomes.
//! * [`writer`]: images written from layers, for tests and benchmarks.
//!
//! The root filesystem is then made like every other template's (`rootfs::oci_base`).

pub mod apply;
pub mod defaults;
pub mod digest;
pub mod helper;
pub mod import;
pub mod store;
pub mod template_file;
pub mod writer;

pub use apply::{apply_layer, ApplyError, ApplyStats};
pub use digest::Digest;
pub use import::{import, resolve, Imported};
pub use store::BlobStore;

use std::path::PathBuf;

/// The most file bytes one image may unpack to.
pub const MAX_IMAGE_BYTES: u64 = 64 << 30;

/// Where imported images' blobs are kept: `<template directory>/oci`, beside the
/// templates that name them (deleting a template's image blobs breaks its rebuild, not
/// its built image or snapshots).
pub fn configured_store() -> BlobStore {
    BlobStore::new(crate::rootfs::catalog::default_dir().join("oci"))
}

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("image {path}: {problem}")]
    Source { path: PathBuf, problem: String },
    #[error("the image is not usable: {0}")]
    Invalid(String),
    #[error("blob {digest} is not in the image store {store}: {source} (import the image again with `forkvm template from-oci`)")]
    MissingBlob { digest: String, store: PathBuf, source: std::io::Error },
    #[error("a blob does not match its digest: expected {want}, the bytes hash to {got}")]
    DigestMismatch { want: String, got: String },
    #[error("image store {path}: {step}: {source}")]
    Store { step: &'static str, path: PathBuf, source: std::io::Error },
}
