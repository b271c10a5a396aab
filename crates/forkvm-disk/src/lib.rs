//! forkvm's disks: layered disks (a base image under sealed layers and one writable
//! top, copy-on-write in 4 KiB blocks) and the encrypted vault their snapshots are kept
//! in (content-addressed chunks, sealed manifests, lazy restore with playbooks).
//!
//! Why its own crate: a sandbox's disks and its memory are saved differently (memory
//! in snapshot directories and chains, `forkvm-snapshot`; disks as layers and vault
//! snapshots, here) and share only the way a chunk is named ([`chunk_id::ChunkId`]).
//! `forkvm-snapshot` builds on this crate (a snapshot links its disk layers) and
//! re-exports it, so `forkvm_snapshot::vault` and `forkvm_snapshot::layered_disk` still
//! name the same modules.

pub mod chunk_id;
pub mod data_extents;
pub mod flock;
pub mod layered_disk;
pub mod malformed;
pub mod preopened;
#[cfg(test)]
mod test_rng;
pub mod vault;

pub use chunk_id::{BadChunkId, ChunkId};
pub use layered_disk::{Layer, LayerError, LayerId, LayerInfo, LayerStack, SealedLayer, StackStats};
