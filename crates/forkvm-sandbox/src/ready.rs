//! Making a started sandbox ready: every start path ends here. In one round trip its
//! agent is waited for and the guest is given its own identity (id, hostname, clock,
//! entropy: clones never share RNG state), in bounded attempts. Then its row moves to
//! `running`, and the first ready child of an image teaches that image's memory
//! playbook what it touched.
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

/// How long each attempt to apply the identity may wait for the agent, each longer than
/// the one before. The VMM holds a new connection back until the restored guest has
/// taken its vsock reset in, so a silent agent is a slow guest (a hundred restored at
/// once on two cores), not a dropped connection, and the first limit is not short.
const IDENTITY_LIMITS: [Duration; 3] = [Duration::from_secs(30), Duration::from_secs(60), Duration::from_secs(90)];

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
    /// Where that time went after its VMM started.
    pub trace: ReadyTrace,
}

/// How one sandbox became ready: the waiting for its agent, and the identity's round
/// trip with the agent's own part of it (the guest side a host cannot time).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReadyTrace {
    /// Identity attempts before the one answered (refused while the agent was not yet
    /// listening, or silent past their limit).
    pub retries: u32,
    /// From the start of the call to the attempt that was answered.
    pub answered_attempt_at_ms: f64,
    /// That attempt's round trip: connect, the guest's vsock path, the agent's work.
    pub identity_rtt_ms: f64,
    /// The agent's part of it, by step (older agents do not say).
    pub agent: Option<forkvm_proto::IdentityTimings>,
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
/// clock, fresh host entropy (credited, and the guest CRNG reseeded), and other fresh
/// bytes for the warm interpreter's generators.
pub fn apply_identity(
    client: &AgentClient<UnixStream>,
    id: &str,
) -> Result<forkvm_proto::IdentityApplied, forkvm_proto::ClientError> {
    let now_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    client.identity(&IdentityRequest {
        sandbox_id: id.to_string(),
        hostname: format!("sb-{id}"),
        wall_clock_unix_ns: now_ns,
        entropy: host_random(64),
        interpreter_seed: host_random(64),
    })
}

/// Whether a call failed for want of a working connection (refused while the agent is
/// not yet listening, reset while the guest starts): worth trying again, unlike an answer
/// the agent gave (an error, a rejected or unexpected frame).
fn connection_failed(e: &forkvm_proto::ClientError) -> bool {
    use forkvm_proto::{ClientError as E, FrameError as F};
    let dropped =
        |f: &F| matches!(f, F::Closed | F::ReadHeader(_) | F::ReadPayload(_) | F::Truncated { .. } | F::Write { .. });
    match e {
        E::Connect(_) | E::VsockConnect(_) => true,
        E::Send { source, .. } | E::Receive { source, .. } => dropped(source),
        _ => false,
    }
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
    // Its DNS, served from here under the policy its row holds (whoever made its VMM:
    // a daemon's spawner records none), before anyone can use it. A row that cannot be
    // read leaves the policy unknown, which is not an open one: the start fails.
    let policy = match registry.row(&record.id) {
        Some(row) => row.record.network,
        None => {
            let why = format!("sandbox {}'s row could not be read for its egress policy", record.id);
            return Err(crate::network::NetworkError::Unenforced(why).into());
        }
    };
    crate::network::attach::attach(&record.id, pid, policy.as_ref(), record.forked_from.as_deref())?;
    let gone = || (!crate::registry::vmm_alive(pid)).then(|| "exited".to_string());
    let not_ready =
        |exited: bool| SpawnError::NotReady { id: record.id.clone(), pid, exited, console: console_tail(record) };
    // The identity is the readiness probe too: one round trip through the guest's
    // kernel, not a ping and then the identity. Until the agent listens, a connection is
    // refused at once and tried again. Each attempt is bounded (a hung guest) and each
    // silent one waits longer: a guest that is merely slow (a hundred forks at once on a
    // small, busy host, its kernel code emulated) must not be cut off. Applying the
    // identity twice is harmless (the second wins).
    let deadline = Instant::now() + timeout;
    let mut silent = 0;
    let mut trace = ReadyTrace::default();
    loop {
        let bounded = AgentClient::vsock_uds_within(record.vsock(), AGENT_PORT, IDENTITY_LIMITS[silent]);
        let attempt = Instant::now();
        match apply_identity(&bounded, &record.id) {
            Ok(applied) => {
                trace.answered_attempt_at_ms = attempt.duration_since(started).as_secs_f64() * 1e3;
                trace.identity_rtt_ms = attempt.elapsed().as_secs_f64() * 1e3;
                trace.agent = applied.timings;
                break;
            }
            Err(e) if e.is_silent() && silent + 1 < IDENTITY_LIMITS.len() => {
                tracing::warn!(id = %record.id, %e, "applying the identity failed; retrying");
                silent += 1;
                trace.retries += 1;
            }
            Err(source) if source.is_silent() || !connection_failed(&source) => {
                return Err(SpawnError::Identity { id: record.id.clone(), source });
            }
            Err(_) => {
                if gone().is_some() {
                    return Err(not_ready(true));
                }
                if Instant::now() > deadline {
                    return Err(not_ready(false));
                }
                trace.retries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    Ok(SpawnedSandbox { record: record.clone(), client, ready_ms: started.elapsed().as_secs_f64() * 1e3, trace })
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

#[cfg(test)]
mod tests {
    use super::connection_failed;
    use forkvm_proto::{AgentError, ClientError, ErrorKind, FrameError};

    #[test]
    fn only_a_missing_or_dropped_connection_is_tried_again() {
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(connection_failed(&ClientError::Connect(io())));
        assert!(connection_failed(&ClientError::Receive { step: "identity", source: FrameError::Closed }));
        assert!(connection_failed(&ClientError::Receive { step: "identity", source: FrameError::ReadHeader(io()) }));
        // Answers the agent gave are final.
        assert!(!connection_failed(&ClientError::Agent(AgentError::new(ErrorKind::InvalidInput, "bad hostname"))));
        assert!(!connection_failed(&ClientError::Receive { step: "identity", source: FrameError::BadMagic(*b"xx") }));
        assert!(!connection_failed(&ClientError::Unexpected { step: "identity", got: "pong".into() }));
    }
}
