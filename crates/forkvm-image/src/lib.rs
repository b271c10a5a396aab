//! forkvm guest images.
//!
//! * [`kernel`]: the guest kernel — built by the project from Debian's `linux-source-6.1`
//!   with the config fragment and patches under `crates/forkvm-image/kernel/`, cached by
//!   the content hash of those inputs, booted as an ELF `vmlinux`.
//! * [`rootfs`]: root filesystem images built from templates (DESIGN.md §3).
//! * [`oci`]: OCI images imported as template bases.

pub mod cache_lock;
pub mod dockerfile;
pub mod kernel;
pub mod oci;
pub mod progress;
pub mod rootfs;
