//! forkd's workspaces: `/v1/workspaces*`, a sandbox under a name that suspend archives
//! and resume restores (the same sandbox).

use crate::client::Client;
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::workspaces::{CreateWorkspaceRequest, SuspendWorkspaceRequest, WorkspaceInfo};
use hyper::Method;

fn workspace(name: &str) -> Result<Target, ClientError> {
    Target::new("/v1/workspaces").segment("workspace name", name)
}

impl Client {
    /// `GET /v1/workspaces`.
    pub fn list_workspaces(&self) -> Result<Vec<WorkspaceInfo>, ClientError> {
        self.call_json(Method::GET, "/v1/workspaces", None::<&()>, "workspace list")
    }

    /// `POST /v1/workspaces`: a sandbox spawned from `req.snapshot_tag`, under `req.name`.
    pub fn create_workspace(&self, req: &CreateWorkspaceRequest) -> Result<WorkspaceInfo, ClientError> {
        self.call_json(Method::POST, "/v1/workspaces", Some(req), "created workspace")
    }

    /// `GET /v1/workspaces/{name}`.
    pub fn get_workspace(&self, name: &str) -> Result<WorkspaceInfo, ClientError> {
        self.call_json(Method::GET, &workspace(name)?.build(), None::<&()>, "workspace")
    }

    /// `DELETE /v1/workspaces/{name}`: the workspace and its sandbox.
    pub fn delete_workspace(&self, name: &str) -> Result<(), ClientError> {
        self.call_empty(Method::DELETE, &workspace(name)?.build())
    }

    /// `POST /v1/workspaces/{name}/suspend`: its sandbox archived (memory, processes, disks).
    pub fn suspend_workspace(&self, name: &str) -> Result<WorkspaceInfo, ClientError> {
        let target = workspace(name)?.push("/suspend").build();
        self.call_json(Method::POST, &target, Some(&SuspendWorkspaceRequest::default()), "suspended workspace")
    }

    /// `POST /v1/workspaces/{name}/resume`: the same sandbox restored (a fresh one from
    /// the source tag when it was deleted behind the workspace's back).
    pub fn resume_workspace(&self, name: &str) -> Result<WorkspaceInfo, ClientError> {
        let target = workspace(name)?.push("/resume").build();
        self.call_json(Method::POST, &target, None::<&()>, "resumed workspace")
    }
}
