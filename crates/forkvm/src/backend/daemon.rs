//! The sandbox verbs through forkvmd's REST API.

use super::Backend;
use crate::remote_cmd::Spinner;
use anyhow::Result;
use forkvm_client::api::{
    ArchiveReport, BranchSandboxRequest, EvalResponse, RestoreRequest, SandboxInfo, SnapshotInfo,
};
use forkvm_client::Client;

pub struct Daemon {
    client: Client,
}

impl Daemon {
    pub fn new(client: Client) -> Daemon {
        Daemon { client }
    }
}

impl Backend for Daemon {
    fn list(&self) -> Result<Vec<SandboxInfo>> {
        Ok(self.client.list_sandboxes()?)
    }

    fn delete(&self, id: &str, purge: bool) -> Result<()> {
        Ok(if purge { self.client.purge_sandbox(id) } else { self.client.kill_sandbox(id) }?)
    }

    fn eval(&self, id: &str, code: &str) -> Result<EvalResponse> {
        Ok(self.client.eval(id, code)?)
    }

    fn branch(&self, id: &str, req: &BranchSandboxRequest) -> Result<SnapshotInfo> {
        let _spinner = Spinner::start(format!("branching {id}"));
        Ok(self.client.branch(id, req)?)
    }

    fn archive(&self, id: &str) -> Result<ArchiveReport> {
        let _spinner = Spinner::start(format!("archiving {id}"));
        Ok(self.client.archive(id)?)
    }

    fn restore(&self, id: &str, ttl_seconds: Option<u64>) -> Result<SandboxInfo> {
        let _spinner = Spinner::start(format!("restoring {id}"));
        Ok(self.client.restore(id, &RestoreRequest { ttl_seconds })?)
    }
}
