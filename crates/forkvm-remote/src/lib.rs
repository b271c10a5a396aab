//! Snapshot chains in object storage: `forkvm push` and `forkvm pull`.
//!
//! Why this exists: everything the store keeps lives on one host's disk. A remote (an
//! S3, GCS or Azure bucket, or a directory, through the `object_store` crate) lets any
//! host pull a template or branch another host pushed, moving only what it lacks.
//!
//! # Layout of a remote (`<url>/…`)
//!
//! | object | content |
//! |--------|---------|
//! | `chunks/<64 hex>` | one sealed block: [`ChunkSeal`] format (magic `FKVMSCH1`, nonce, XChaCha20-Poly1305 of the zstd block, the name as associated data) |
//! | `tags/<tag>` | the tag's sealed [`manifest::RemoteManifest`] (same format; its "name" is a hash of the tag) |
//! | `locks/<shared\|exclusive>-<16 hex>` | a running push's or collection's lock ([`lock`]) |
//! | `vaults/<sandbox id>/…` | a replicated sandbox ([`replicate`]) |
//!
//! A chain is written as the entries of a pack ([`forkvm_snapshot::chain::write_chain`]):
//! each file (a link's metadata, VM state and memory map, a disk image, a layer, a
//! memory chunk) is cut into 1 MiB blocks at 1 MiB-aligned offsets; all-zero blocks
//! (holes) are not stored. A block's name is the BLAKE3 hash of its bytes **keyed with
//! the remote key**: equal blocks are stored once across tags and hosts that share the
//! key, and names say nothing to whoever holds the bucket without it.
//!
//! # Keys
//!
//! A remote is sealed with a 32-byte **remote key** ([`key::RemoteKey`], default
//! `<keys dir>/remote.key`, 0600), which every host using the remote holds: the bucket
//! sees only ciphertext, and the hosts' vault keys never leave them. A block that
//! fails to open (another key, a flipped byte, an object moved to another name) and a
//! manifest that fails to open or names another tag are refused with an error naming
//! the object; pull also re-hashes every block, and the store's install step re-checks
//! every link's content hash before anything enters the store.
//!
//! # Crash safety and resumption
//!
//! A push lists the chunks the remote holds, uploads the missing ones (idempotent:
//! content-addressed), and writes the tag's manifest **last**: a push cut off at any
//! point leaves the previous manifest (or none), and the next push uploads only what
//! is still missing. Pushes hold a shared lock on the remote and a collection of unreferenced
//! blocks ([`gc`]) an exclusive one, so a block a push chose to reuse is never deleted
//! before its manifest names it. A pull stages everything in the store's staging directory and
//! installs the chain only once every block has arrived and checked out.

// Without the default `client` feature only the manifest is built (no object-store client):
// what the fuzz targets need.
#[cfg(feature = "client")]
mod atomic_file;
#[cfg(feature = "client")]
pub mod cache;
#[cfg(feature = "client")]
pub mod error;
#[cfg(feature = "client")]
pub mod gc;
#[cfg(feature = "client")]
pub mod key;
#[cfg(feature = "client")]
pub mod lazy;
#[cfg(feature = "client")]
pub mod lock;
pub mod manifest;
#[cfg(feature = "client")]
pub mod pull;
#[cfg(feature = "client")]
pub mod push;
#[cfg(feature = "client")]
pub mod remote;
#[cfg(feature = "client")]
pub mod replicate;
#[cfg(feature = "client")]
pub mod seen;
#[cfg(feature = "client")]
mod workers;

pub use forkvm_disk::vault::ChunkSeal;
#[cfg(feature = "client")]
pub use {
    cache::BlockCache,
    error::RemoteError,
    key::RemoteKey,
    pull::{pull, pull_lazy, PullReport},
    push::{push, PushReport},
    remote::Remote,
};

/// Size of a block, and the alignment of its offset in its file.
pub const BLOCK_BYTES: u64 = 1 << 20;
