//! The sandbox verbs on this host's registry and store, answering as the daemon would
//! (`forkvm_sandbox::info`, `snapshot_view`: the views the daemon builds its answers
//! from).

use super::{Backend, NotFound};
use anyhow::{anyhow, bail, Result};
use forkvm_client::api::{ArchiveReport, BranchSandboxRequest, EvalResponse, SandboxInfo, SnapshotInfo};
use forkvm_sandbox::snapshot_view::tag_info;
use forkvm_sandbox::{info, Registry, StateReason};
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::BranchMode;

pub struct Local {
    registry: Registry,
    store: Store,
}

impl Local {
    /// The default registry and store (`$FORKVM_RUN`, `$FORKVM_STORE`).
    pub fn open_default() -> Local {
        Local { registry: Registry::open_default(), store: Store::open_default() }
    }

    /// Snapshot `tag` as the API shows it, once a branch made it.
    fn made(&self, tag: &str, mode: &str, pause_ms: f64) -> Result<SnapshotInfo> {
        tag_info(&self.store, tag, Some(mode), Some(pause_ms))
            .ok_or_else(|| anyhow!("branch {tag:?} reported success but is not in the store"))
    }
}

impl Backend for Local {
    fn list(&self) -> Result<Vec<SandboxInfo>> {
        Ok(info::listed(&self.registry).iter().map(info::sandbox_info).collect())
    }

    fn delete(&self, id: &str, purge: bool) -> Result<()> {
        match forkvm_sandbox::delete(&self.registry, &self.store, id, purge)? {
            forkvm_sandbox::Deleted::Nothing => Err(NotFound(id.to_string()).into()),
            _ => Ok(()),
        }
    }

    fn eval(&self, id: &str, code: &str) -> Result<EvalResponse> {
        let client = forkvm_sandbox::verbs::agent(&self.registry, id)?;
        let r = client.eval(code)?;
        if let Some(r) = forkvm_sandbox::memory_playbook::pending_first_call(&self.registry, id) {
            forkvm_sandbox::memory_playbook::learn_after_first_call(&r);
        }
        Ok(info::eval_response(r))
    }

    fn branch(&self, id: &str, req: &BranchSandboxRequest) -> Result<SnapshotInfo> {
        let mode = req.mode.as_deref().unwrap_or("full");
        if !req.wait && mode != "live" {
            bail!("waiting for the snapshot can be skipped in live mode only (--no-wait)");
        }
        if req.parent_tag.is_some() && mode != "diff" {
            bail!("a parent tag applies to the diff mode");
        }
        let vmm_mode = match mode {
            "full" => BranchMode::Full,
            "live" => BranchMode::Live,
            "diff" => {
                let tag = match &req.tag {
                    Some(t) => t.clone(),
                    None => (1..)
                        .map(|n| format!("branch-{id}-{n}"))
                        .find(|t| self.store.check_free(t).is_ok())
                        .unwrap_or_default(),
                };
                let (_, pause_ms) =
                    forkvm_sandbox::branch_diff(&self.registry, &self.store, id, &tag, req.parent_tag.as_deref())?;
                return self.made(&tag, mode, pause_ms);
            }
            other => bail!("unknown mode {other:?} (expected full, live or diff)"),
        };
        let report = forkvm_sandbox::branch(&self.registry, &self.store, id, req.tag.as_deref(), vmm_mode, req.wait)?;
        self.made(&report.tag, mode, report.pause_ms)
    }

    fn archive(&self, id: &str) -> Result<ArchiveReport> {
        Ok(forkvm_sandbox::archive::archive(&self.registry, &self.store, id, StateReason::Api)?.to_api())
    }

    fn restore(&self, id: &str, ttl_seconds: Option<u64>) -> Result<SandboxInfo> {
        if ttl_seconds.is_some() {
            bail!("--ttl needs the daemon (--daemon or FORKVM_DAEMON): TTLs are enforced by forkvmd");
        }
        let s = forkvm_sandbox::start::restore::restore(&self.registry, &self.store, id)?;
        let row =
            self.registry.row(&s.record.id).ok_or_else(|| anyhow!("sandbox {id:?} restored but has no record"))?;
        Ok(info::sandbox_info(&row))
    }

    fn sweep(&self) {
        // What dead sandboxes left goes too (their disk writes salvaged first).
        let _ = self.registry.sweep();
    }
}
