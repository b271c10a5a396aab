//! Template snapshots: a template booted once, agent ready and warm-up done, saved under
//! a content hash of what it was built from.
//!
//! Key = BLAKE3 of the kernel key, the image key, the boot configuration (memory,
//! vCPUs, command line, irqchip, CPU template and its kernel arguments) and the vmstate format
//! version; directory `<cache>/snapshots/<template>-<key>/`. Any input change makes a new
//! key, so a stale snapshot is never restored, and the cache is safe to delete.
//!
//! Before a template is snapshotted its guest must pass the vector-state guard
//! ([`crate::vector_guard`]): a guest whose kernel lets processes corrupt each other's
//! vector registers is refused, with the register class named.

use crate::artifacts::Artifacts;
use crate::guest::{cmdline, IRQCHIP};
use crate::start::in_process::boot_to_agent_with;
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::host::KvmUnavailable;
use forkvm_vmm::PreparedSnapshot;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum TemplateSnapshotError {
    #[error(transparent)]
    Kvm(#[from] KvmUnavailable),
    #[error("the template's network: {0}")]
    Network(#[from] crate::network::NetworkError),
    #[error("preparing {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("booting the template VM: {0}")]
    Boot(forkvm_vmm::BuildError),
    #[error("the template VM's agent did not answer within {0:?}; see the console log {1}")]
    AgentTimeout(Duration, PathBuf),
    #[error("the template VM stopped during boot ({0}); see the console log {1}")]
    Stopped(String, PathBuf),
    #[error("template warm-up `{code}` failed: {detail}")]
    Warmup { code: String, detail: String },
    #[error(transparent)]
    Start(#[from] crate::template_start::StartError),
    #[error("snapshotting the template VM: {0}")]
    Snapshot(forkvm_vmm::VmmError),
    #[error("template refused by the vector-state guard (CPU template {cpu}): {source}")]
    VectorState { cpu: CpuTemplate, source: crate::vector_guard::VectorGuardError },
}

/// Whether the vector-state guard may refuse the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorGuard {
    /// Refuse the snapshot when the check fails (every product path).
    Required,
    /// Run the check, record its report, snapshot anyway: only for benchmarks that
    /// measure the legacy `pvm-compat` profile against its replacement. Such snapshots
    /// get their own key, so a guarded lookup never finds them.
    ReportOnly,
}

/// A ready template snapshot and how to restore it.
#[derive(Debug, Clone)]
pub struct TemplateSnapshot {
    pub dir: PathBuf,
    pub key: String,
    pub artifacts: Artifacts,
    /// Seconds the cold boot took when this call had to make the snapshot.
    pub boot_seconds: Option<f64>,
    /// The snapshot read and checked once, shared by every sandbox restored from it.
    prepared: Arc<OnceLock<PreparedSnapshot>>,
}

/// Reading the template snapshot failed (shared by every sandbox that asks after).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PrepareError(String);

impl TemplateSnapshot {
    fn new(dir: PathBuf, key: String, artifacts: Artifacts, boot_seconds: Option<f64>) -> TemplateSnapshot {
        TemplateSnapshot { dir, key, artifacts, boot_seconds, prepared: Arc::default() }
    }

    /// The parsed, checked snapshot: `snapshot.json` and `vmstate.bin` are read and
    /// decoded on first use only, not per sandbox.
    pub fn prepared(&self) -> Result<&PreparedSnapshot, PrepareError> {
        if let Some(p) = self.prepared.get() {
            return Ok(p);
        }
        let p = forkvm_vmm::prepare(&self.dir).map_err(|e| PrepareError(e.to_string()))?;
        Ok(self.prepared.get_or_init(|| p))
    }
}

fn snapshot_key(a: &Artifacts, template: CpuTemplate, guard: VectorGuard) -> String {
    let mut config = format!(
        "mem={} irqchip={IRQCHIP} cpu={template} cpu-cmdline={} volume-slots={} cmdline={}",
        a.mem_mib,
        template.linux_cmdline(),
        crate::source::VOLUME_SLOTS,
        cmdline(a)
    );
    if guard == VectorGuard::ReportOnly {
        config.push_str(" unguarded");
    }
    // Absent for one vCPU, so one-vCPU keys stay what they were before vCPUs counted.
    if a.vcpus != 1 {
        config.push_str(&format!(" vcpus={}", a.vcpus));
    }
    let mut h = blake3::Hasher::new();
    for part in [
        a.kernel_key.as_str(),
        a.image.key.as_str(),
        &forkvm_image::rootfs::scratch_key(),
        config.as_str(),
        &forkvm_snapshot::VMSTATE_FORMAT_VERSION.to_string(),
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex()[..32].to_string()
}

/// The template snapshot for `artifacts`, booting and snapshotting it if missing.
pub fn ensure_template_snapshot(artifacts: Artifacts) -> Result<TemplateSnapshot, TemplateSnapshotError> {
    ensure_template_snapshot_with(artifacts, CpuTemplate::for_this_host(), VectorGuard::Required)
}

/// [`ensure_template_snapshot`] under a given CPU template and guard policy.
pub fn ensure_template_snapshot_with(
    artifacts: Artifacts,
    cpu: CpuTemplate,
    guard: VectorGuard,
) -> Result<TemplateSnapshot, TemplateSnapshotError> {
    let key = snapshot_key(&artifacts, cpu, guard);
    let dir = artifacts.cache.join("snapshots").join(format!("{}-{key}", artifacts.image.name));
    if forkvm_snapshot::SnapshotDir::open(&dir).is_ok() {
        return Ok(TemplateSnapshot::new(dir, key, artifacts, None));
    }
    // One boot per template snapshot: others wait here, then find its result.
    let lock_path = artifacts.cache.join("snapshots").join(format!(".{}-{key}.lock", artifacts.image.name));
    let _lock = forkvm_image::cache_lock::CacheLock::take(
        &lock_path,
        &mut || tracing::info!(template = %artifacts.image.name, "another process is booting this template; waiting"),
    )
    .map_err(|source| TemplateSnapshotError::Io { path: lock_path.clone(), source })?;
    if forkvm_snapshot::SnapshotDir::open(&dir).is_ok() {
        return Ok(TemplateSnapshot::new(dir, key, artifacts, None));
    }
    let work = artifacts.cache.join("snapshots").join(format!(".boot-{}-{}", artifacts.image.name, std::process::id()));
    let started = Instant::now();
    let (mut vmm, client, _console) = boot_to_agent_with(&artifacts, &work, cpu)?;
    // Before the warm-up, so the snapshot's last guest activity is the warm-up's.
    let vector_state = crate::vector_guard::run(&client, crate::vector_guard::PROCESSES, crate::vector_guard::SWITCHES);
    match (vector_state, guard) {
        (Ok(report), _) if report.failures().is_empty() => {}
        (Ok(report), VectorGuard::ReportOnly) => {
            tracing::warn!(cpu = %cpu, failures = %report.describe_failures(), "vector-state check failed (report only)")
        }
        (Ok(report), VectorGuard::Required) => {
            let source = crate::vector_guard::VectorGuardError::Corrupted(Box::new(report));
            return Err(TemplateSnapshotError::VectorState { cpu, source });
        }
        (Err(source), _) => return Err(TemplateSnapshotError::VectorState { cpu, source }),
    }
    if let Some(code) = &artifacts.image.warmup_eval {
        let warm = |detail: String| TemplateSnapshotError::Warmup { code: code.clone(), detail };
        let r = client.eval(code).map_err(|e| warm(e.to_string()))?;
        if let forkvm_proto::EvalOutcome::Exception { .. } = r.outcome {
            return Err(warm(format!("{:?}", r.outcome)));
        }
    }
    let service = crate::template_start::start_service(&client, &artifacts.image)?;
    if artifacts.image.start.is_some() {
        tracing::info!(template = %artifacts.image.name, seconds = service.as_secs_f64(), "the template's service is ready");
    }
    let boot_seconds = started.elapsed().as_secs_f64();
    // Snapshot under a temporary tag, then move into place (another process may race us:
    // the first complete snapshot wins, the other is discarded).
    let tmp_snap = work.join("snapshot");
    vmm.snapshot(&tmp_snap).map_err(TemplateSnapshotError::Snapshot)?;
    vmm.stop();
    drop(vmm);
    if std::fs::rename(&tmp_snap, &dir).is_err() && forkvm_snapshot::SnapshotDir::open(&dir).is_err() {
        return Err(TemplateSnapshotError::Io {
            path: dir,
            source: std::io::Error::other("could not publish the template snapshot"),
        });
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(TemplateSnapshot::new(dir, key, artifacts, Some(boot_seconds)))
}
