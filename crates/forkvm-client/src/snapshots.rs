//! Tagged snapshots: `/v1/snapshots` (list, create from a template, delete, info).

use crate::client::Client;
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::{CreateSnapshotRequest, SnapshotInfo, SnapshotInfoDetail};
use hyper::Method;

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

    /// `DELETE /v1/snapshots/{tag}`. `cascade` also deletes snapshots that depend on it;
    /// `force` deletes it even while it is being written.
    pub fn delete_snapshot(&self, tag: &str, cascade: bool, force: bool) -> Result<(), ClientError> {
        let mut target = Target::new("/v1/snapshots").segment("snapshot tag", tag)?;
        if cascade {
            target = target.query("cascade", "true");
        }
        if force {
            target = target.query("force", "true");
        }
        self.call_empty(Method::DELETE, &target.build())
    }

    /// `GET /v1/snapshots/{tag}/info`.
    pub fn snapshot_info(&self, tag: &str) -> Result<SnapshotInfoDetail, ClientError> {
        let target = Target::new("/v1/snapshots").segment("snapshot tag", tag)?.push("/info").build();
        self.call_json(Method::GET, &target, None::<&()>, "snapshot info")
    }
}
