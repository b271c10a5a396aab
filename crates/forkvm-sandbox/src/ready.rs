//! Making a started sandbox ready: every start path ends here. Its agent is waited for
//! (bounded pings, since a guest just restored drops connections made before its vsock
//! reset), the guest is given its own identity (id, hostname, clock, entropy: clones never
//! share RNG state), its row moves to `running`, and the first ready child of an image
//! teaches that image's memory playbook what it touched.
//!
//! A batch is all or nothing: when one sandbox fails to become ready, every sandbox of
//! the batch is stopped.

use crate::guest::AGENT_PORT;
use crate::registry::{Registry, SandboxRecord};
use crate::start::host_random;
use crate::start::SpawnError;
use forkvm_proto::{AgentClient, IdentityRequest};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a spawned sandbox's agent may take to answer (emulated guest kernels).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one readiness ping may wait for the agent. Right after a restore the guest
/// resets its vsock transport, and a connection made just before it processed the reset
/// is dropped on the guest side without a word to the host: without a limit, that ping
/// would wait forever. Generous, for guests whose kernel code is emulated and busy.
pub const PING_LIMIT: Duration = Duration::from_secs(10);

/// How long each attempt to apply the identity may wait for the agent: the first as a
/// readiness ping (a dropped connection is found quickly), the later ones longer.
const IDENTITY_LIMITS: [Duration; 3] = [PING_LIMIT, Duration::from_secs(30), Duration::from_secs(90)];

/// Waits until the agent behind the vsock socket `uds` answers a ping.
pub fn wait_for_agent(uds: &Path, timeout: Duration, alive: &dyn Fn() -> Option<String>) -> Result<(), Option<String>> {
    let probe = AgentClient::vsock_uds_within(uds, AGENT_PORT, PING_LIMIT);
    let deadline = Instant::now() + timeout;
    loop {
        if probe.ping().is_ok() {
            return Ok(());
        }
        if let Some(why) = alive() {
            return Err(Some(why));
        }
        if Instant::now() > deadline {
            return Err(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A running, re-identified sandbox and a client for its agent.
#[derive(Debug)]
pub struct SpawnedSandbox {
    pub record: SandboxRecord,
    pub client: AgentClient<UnixStream>,
    /// From the start of the call to this sandbox's identity being applied.
    pub ready_ms: f64,
}

/// The last lines of a console log, for error messages (its last 16 KiB only: a
/// guest decides how much it prints).
pub fn console_tail(record: &SandboxRecord) -> String {
    let tail = forkvm_vmm::devices::console_log::read_tail(&record.console(), 16 << 10);
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Gives a restored guest its own identity: id, hostname `sb-<id>`, the host's wall
/// clock, and fresh host entropy (credited, and the guest CRNG reseeded).
pub fn apply_identity(client: &AgentClient<UnixStream>, id: &str) -> Result<(), forkvm_proto::ClientError> {
    let now_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    client
        .identity(&IdentityRequest {
            sandbox_id: id.to_string(),
            hostname: format!("sb-{id}"),
            wall_clock_unix_ns: now_ns,
            entropy: host_random(64),
        })
        .map(|_| ())
}

/// Threads that wait for agents and apply identities in parallel (the guests boot
/// concurrently; each identity costs a vsock round trip through the guest kernel).
const READY_WORKERS: usize = 16;

/// Waits for one pending sandbox's agent and re-identifies it.
fn make_ready(
    registry: &Registry,
    record: &SandboxRecord,
    started: Instant,
    timeout: Duration,
) -> Result<SpawnedSandbox, SpawnError> {
    let client = AgentClient::vsock_uds(record.vsock(), AGENT_PORT);
    let pid = record.pid;
    // Its DNS, served from here under the policy its row holds (whoever made its VMM),
    // before anyone can use it.
    let policy = registry.row(&record.id).and_then(|row| row.record.network).or_else(|| record.network.clone());
    crate::network::attach::attach(&record.id, pid, policy.as_ref(), record.forked_from.as_deref())?;
    let gone = || (!crate::registry::vmm_alive(pid)).then(|| "exited".to_string());
    if let Err(why) = wait_for_agent(&record.vsock(), timeout, &gone) {
        return Err(SpawnError::NotReady {
            id: record.id.clone(),
            pid,
            exited: why.is_some(),
            console: console_tail(record),
        });
    }
    // Bounded and retried for the same reason as the readiness ping: a connection made
    // before the guest processed its transport reset is dropped silently. Each retry
    // waits longer: a guest that is merely slow (ten forks at once on a small, busy host,
    // its kernel code emulated) must not be cut off. Applying the identity twice is
    // harmless (the second wins).
    for (attempt, limit) in IDENTITY_LIMITS.iter().enumerate() {
        let bounded = AgentClient::vsock_uds_within(record.vsock(), AGENT_PORT, *limit);
        match apply_identity(&bounded, &record.id) {
            Ok(()) => break,
            Err(e) if attempt + 1 < IDENTITY_LIMITS.len() && !matches!(e, forkvm_proto::ClientError::Agent(_)) => {
                tracing::warn!(id = %record.id, %e, "applying the identity failed; retrying");
            }
            Err(source) => return Err(SpawnError::Identity { id: record.id.clone(), source }),
        }
    }
    Ok(SpawnedSandbox { record: record.clone(), client, ready_ms: started.elapsed().as_secs_f64() * 1e3 })
}

/// Waits for every started sandbox's agent and re-identifies it, in parallel. On
/// failure, every sandbox of the batch is killed: a spawn gives all of them or none.
/// Needs no single-threaded caller.
pub fn finish(
    registry: &Registry,
    pending: Vec<SandboxRecord>,
    started: Instant,
) -> Result<Vec<SpawnedSandbox>, SpawnError> {
    finish_within(registry, pending, started, READY_TIMEOUT)
}

/// [`finish`] with another limit on each agent's first answer (a cold boot needs more).
pub fn finish_within(
    registry: &Registry,
    pending: Vec<SandboxRecord>,
    started: Instant,
    timeout: Duration,
) -> Result<Vec<SpawnedSandbox>, SpawnError> {
    let results = crate::parallel::map(&pending, READY_WORKERS, |r| make_ready(registry, r, started, timeout));
    let mut out = Vec::new();
    let mut failure = None;
    for r in results {
        match r {
            Some(Ok(s)) => out.push(s),
            Some(Err(e)) => {
                failure.get_or_insert(e);
            }
            None => {
                failure.get_or_insert(SpawnError::Worker);
            }
        }
    }
    if failure.is_none() {
        let ids: Vec<&str> = out.iter().map(|s: &SpawnedSandbox| s.record.id.as_str()).collect();
        if let Err(e) = registry.mark_ready(&ids) {
            failure = Some(e.into());
        }
    }
    if let Some(e) = failure {
        for r in &pending {
            let _ = crate::verbs::kill_record(registry, r);
        }
        return Err(e);
    }
    Ok(out)
}

/// Teaches the spawn's memory playbook what its first ready sandbox touched (one per
/// spawn: the children of one image touch the same pages), now and again after its
/// first call (`memory_playbook::learn_after_first_call`). Best effort: a failure is
/// logged, the sandboxes stand.
pub fn learn_memory(playbook: Option<&Path>, ready: &[SpawnedSandbox]) {
    let (Some(path), Some(first)) = (playbook, ready.first()) else { return };
    if let Err(e) = crate::memory_playbook::record(&first.record, path) {
        tracing::warn!(sandbox = %first.record.id, error = %e, "recording the memory playbook failed");
    }
    if let Err(e) = crate::memory_playbook::arm_first_call(&first.record, path) {
        tracing::warn!(sandbox = %first.record.id, error = %e, "arming the memory playbook's first-call recording failed");
    }
}
