//! Tagged snapshots: `/v1/snapshots` (list, create from a template, delete, info) and
//! snapshot chains (compact, pack, unpack). Packs stream in both directions, so a chain
//! of many GiB never sits in memory.

use crate::client::{decode, Client};
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::{CompactSnapshotRequest, CreateSnapshotRequest, SnapshotInfo, SnapshotInfoDetail, UnpackResponse};
use hyper::Method;
use std::io::{Read, Write};
use std::path::Path;

/// Largest reply to an unpack (a small JSON object).
const UNPACK_REPLY_LIMIT: usize = 1 << 20;

fn snapshot(tag: &str) -> Result<Target, ClientError> {
    Target::new("/v1/snapshots").segment("snapshot tag", tag)
}

impl Client {
    /// `GET /v1/snapshots`.
    pub fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, ClientError> {
        self.call_json(Method::GET, "/v1/snapshots", None::<&()>, "snapshot list")
    }

    /// `POST /v1/snapshots`: template `req.template`'s snapshot published as `req.tag`.
    /// The first build of a template can take minutes; later ones reuse it.
    pub fn create_snapshot(&self, req: &CreateSnapshotRequest) -> Result<SnapshotInfo, ClientError> {
        self.call_json(Method::POST, "/v1/snapshots", Some(req), "created snapshot")
    }

    /// `DELETE /v1/snapshots/{tag}`. A snapshot others are built on (a diff chain's
    /// parent) is refused (409, `state: has_dependents`) unless `cascade` (delete them
    /// too, at any depth) or `force` (delete it alone, leaving them unbootable); not both.
    pub fn delete_snapshot(&self, tag: &str, cascade: bool, force: bool) -> Result<(), ClientError> {
        let mut target = snapshot(tag)?;
        if cascade {
            target = target.query("cascade", "true");
        }
        if force {
            target = target.query("force", "true");
        }
        self.call_empty(Method::DELETE, &target.build())
    }

    /// `GET /v1/snapshots/{tag}/info`: sizes, lineage (ancestors, dependents,
    /// descendants) and whether it is bootable, also for a broken chain.
    pub fn snapshot_info(&self, tag: &str) -> Result<SnapshotInfoDetail, ClientError> {
        self.call_json(Method::GET, &snapshot(tag)?.push("/info").build(), None::<&()>, "snapshot info")
    }

    /// `POST /v1/snapshots/{tag}/compact`: the flat equivalent of `tag`'s chain as the
    /// new snapshot `to` (no parent; `branched_from` is `compact:<tag>`).
    pub fn compact_snapshot(&self, tag: &str, to: &str) -> Result<SnapshotInfo, ClientError> {
        let req = CompactSnapshotRequest { to: to.to_string() };
        self.call_json(Method::POST, &snapshot(tag)?.push("/compact").build(), Some(&req), "compacted snapshot")
    }

    /// `GET /v1/snapshots/{tag}/pack`: `tag`'s whole chain as a `.tar.zst` pack, written
    /// into `sink` as it arrives; returns its size.
    pub fn pack_snapshot(&self, tag: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.download(&snapshot(tag)?.push("/pack").build(), sink)
    }

    /// `POST /v1/snapshots/unpack` with the pack streamed from `src`: imports its chain
    /// (checked whole before anything enters the store).
    pub fn unpack_snapshot(&self, src: &mut dyn Read) -> Result<UnpackResponse, ClientError> {
        let reply = self.upload(Method::POST, "/v1/snapshots/unpack", "application/zstd", src, UNPACK_REPLY_LIMIT)?;
        decode(&reply, "unpack reply")
    }

    /// [`Client::unpack_snapshot`] from the pack file at `path`.
    pub fn unpack_snapshot_file(&self, path: &Path) -> Result<UnpackResponse, ClientError> {
        let mut file =
            std::fs::File::open(path).map_err(|source| ClientError::OpenFile { path: path.to_path_buf(), source })?;
        self.unpack_snapshot(&mut file)
    }
}
