//! The sandbox verbs on this host's registry and store, answering as the daemon would
//! (`forkvm_sandbox::info`, `snapshot_view`: the views the daemon builds its answers
//! from).

use super::{Backend, HostTimings, NewFrom, NotFound, Output, Started};
use anyhow::{anyhow, bail, Context, Result};
use forkvm_client::api::{
    ArchiveReport, BranchSandboxRequest, EvalResponse, ExecRequest, NetworkPolicy, SandboxInfo, SnapshotInfo,
    WatchEvent,
};
use forkvm_client::ExecExit;
use forkvm_sandbox::exec_view::{agent_request, exit_code, not_started};
use forkvm_sandbox::snapshot_view::tag_info;
use forkvm_sandbox::{info, Registry, SpawnSource, SpawnedSandbox, StateReason};
use forkvm_snapshot::Store;
use forkvm_vmm::vmm::BranchMode;

/// Why a policy flag is refused here: the process that serves a sandbox's DNS enforces
/// its names, and this one ends with the command.
const NETWORK_NEEDS_THE_DAEMON: &str = "network policies need the daemon (--daemon or FORKVM_DAEMON): a sandbox's \
     DNS, which enforces the names, is served by the process that answers for it";

pub struct Local {
    registry: Registry,
    store: Store,
}

impl Local {
    /// The default registry and store (`$FORKVM_RUN`, `$FORKVM_STORE`).
    pub fn open_default() -> Local {
        Local { registry: Registry::open_default(), store: Store::open_default() }
    }

    /// Sandbox `s` as the API shows it, from its row.
    fn info(&self, s: &SpawnedSandbox) -> Result<SandboxInfo> {
        let row = self
            .registry
            .row(&s.record.id)
            .with_context(|| format!("sandbox {} started but has no row", s.record.id))?;
        Ok(info::sandbox_info(&row))
    }

    /// The memory playbook's recording after a spawn's first call (`memory_playbook`).
    fn learn_after_first_call(&self, id: &str) {
        if let Some(r) = forkvm_sandbox::memory_playbook::pending_first_call(&self.registry, id) {
            forkvm_sandbox::memory_playbook::learn_after_first_call(&r);
        }
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
        self.learn_after_first_call(id);
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

    fn set_ttl(&self, _id: &str, _seconds: u64) -> Result<SandboxInfo> {
        bail!("ttl needs the daemon (--daemon or FORKVM_DAEMON): TTLs are kept and enforced by forkvmd")
    }

    fn set_network(&self, _id: &str, _policy: &NetworkPolicy) -> Result<SandboxInfo> {
        bail!("{NETWORK_NEEDS_THE_DAEMON}")
    }

    fn start(
        &self,
        from: NewFrom<'_>,
        n: usize,
        limits: &crate::limit_args::LimitArgs,
        network: Option<&NetworkPolicy>,
        volumes: &[forkvm_sandbox::volumes::VolumeMount],
    ) -> Result<Started> {
        if network.is_some() {
            bail!("{NETWORK_NEEDS_THE_DAEMON}");
        }
        let opts = limits.spawn_options();
        let (sandboxes, timings, source_pause_ms) = match from {
            NewFrom::Tag(tag) => {
                let source = SpawnSource::from_tag(&self.store, tag)?;
                if source.meta.default_network.is_some() {
                    bail!("tag {tag} carries a default network policy; {NETWORK_NEEDS_THE_DAEMON}");
                }
                let (s, t) = forkvm_sandbox::spawn_with(&self.registry, &source, n, &opts, volumes)?;
                (s, t, None)
            }
            NewFrom::Image(image) => {
                let template = forkvm_bench::util::template_snapshot(image, None)?;
                let source = SpawnSource::from_template(&template)?;
                let (s, t) = forkvm_sandbox::spawn_with(&self.registry, &source, n, &opts, volumes)?;
                (s, t, None)
            }
            NewFrom::Sandbox(id) => {
                if !volumes.is_empty() {
                    bail!(
                        "--volume is for spawns from a tag or template: a fork of a running sandbox keeps its volumes"
                    );
                }
                let (s, pause) = forkvm_sandbox::fork_running(&self.registry, id, n, &opts)?;
                (s, Default::default(), Some(pause))
            }
        };
        let host = HostTimings {
            prepare_ms: timings.prepare_ms,
            host_spawn_ms: timings.host_spawn_ms,
            memory_prefetch_pages: timings.memory_prefetch_pages,
            source_pause_ms,
        };
        let sandboxes = sandboxes.iter().map(|s| self.info(s)).collect::<Result<_>>()?;
        Ok(Started { sandboxes, host: Some(host) })
    }

    fn exec(&self, id: &str, req: &ExecRequest, out: &mut dyn FnMut(Output, &[u8])) -> Result<ExecExit> {
        let agent_req = agent_request(req)?;
        let client = forkvm_sandbox::verbs::agent(&self.registry, id)?;
        let stdin = req.stdin.as_deref().unwrap_or("").as_bytes();
        let mut src = stdin;
        let src: Option<&mut dyn std::io::Read> = if stdin.is_empty() { None } else { Some(&mut src) };
        // The agent calls one of the two at a time.
        let out = std::cell::RefCell::new(out);
        let ended = client.exec(&agent_req, src, &mut |c| (out.borrow_mut())(Output::Stdout, c), &mut |c| {
            (out.borrow_mut())(Output::Stderr, c)
        });
        let out = out.into_inner();
        let exit = match ended {
            Ok(st) => ExecExit {
                exit_code: exit_code(&st),
                signal: st.signal,
                timed_out: st.timed_out,
                duration_ms: st.duration_ms,
            },
            Err(e) => match not_started(&e) {
                Some((exit_code, why)) => {
                    out(Output::Stderr, why.as_bytes());
                    ExecExit { exit_code, signal: None, timed_out: false, duration_ms: 0 }
                }
                None => return Err(e).with_context(|| format!("exec in sandbox {id}")),
            },
        };
        self.learn_after_first_call(id);
        Ok(exit)
    }

    fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
        on_event: &mut dyn FnMut(WatchEvent) -> bool,
    ) -> Result<Option<String>> {
        let client = forkvm_sandbox::verbs::agent(&self.registry, id)?;
        let req = forkvm_proto::WatchRequest { path: path.into(), recursive };
        let what = || format!("watching {path} in sandbox {id}");
        let (stream, directories) = client.watch(&req).with_context(what)?;
        forkvm_sandbox::watch_view::relay(stream, directories, on_event).with_context(what)
    }

    fn sweep(&self) {
        // What dead sandboxes left goes too (their disk writes salvaged first), and an
        // archive from an earlier boot gets its row back.
        let _ = self.registry.sweep();
        let _ = self.registry.adopt_archives();
    }
}
