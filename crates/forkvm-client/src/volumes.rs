//! Volumes: `/v1/volumes*`, named ext4 disks that outlive sandboxes; a spawn attaches
//! them with `CreateSandboxRequest::volumes` (docs/volumes.md).

use crate::client::Client;
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::volumes::{CreateVolumeRequest, SnapshotVolumeRequest, VolumeInfo};
use hyper::Method;

fn volume(name: &str) -> Result<Target, ClientError> {
    Target::new("/v1/volumes").segment("volume name", name)
}

impl Client {
    /// `GET /v1/volumes`.
    pub fn list_volumes(&self) -> Result<Vec<VolumeInfo>, ClientError> {
        self.call_json(Method::GET, "/v1/volumes", None::<&()>, "volume list")
    }

    /// `POST /v1/volumes`: a blank ext4 volume.
    pub fn create_volume(&self, req: &CreateVolumeRequest) -> Result<VolumeInfo, ClientError> {
        self.call_json(Method::POST, "/v1/volumes", Some(req), "created volume")
    }

    /// `GET /v1/volumes/{name}`.
    pub fn get_volume(&self, name: &str) -> Result<VolumeInfo, ClientError> {
        self.call_json(Method::GET, &volume(name)?.build(), None::<&()>, "volume")
    }

    /// `DELETE /v1/volumes/{name}` (refused while a live sandbox has it attached).
    pub fn delete_volume(&self, name: &str) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &volume(name)?.build())
    }

    /// `POST /v1/volumes/{name}/snapshot`: a new volume `to` with its data as of now.
    pub fn snapshot_volume(&self, name: &str, to: &str) -> Result<VolumeInfo, ClientError> {
        let target = volume(name)?.push("/snapshot").build();
        self.call_json(Method::POST, &target, Some(&SnapshotVolumeRequest { to: to.to_string() }), "volume snapshot")
    }
}
