//! A client for a sandbox's agent (exec, eval, files), after its state is checked.

use super::{call, check_ready, LifecycleError};
use crate::guest::AGENT_PORT;
use crate::registry::{now_unix_ms, Registry};
use crate::state::SandboxState;
use forkvm_proto::AgentClient;
use std::os::unix::net::UnixStream;

/// A client for the agent of running sandbox `id`. Its state is checked first: one the
/// daemon paused for idleness is resumed (as the daemon does before its own calls), one
/// still starting or being restored is refused naming its state; the call is noted as
/// activity.
pub fn agent(registry: &Registry, id: &str) -> Result<AgentClient<UnixStream>, LifecycleError> {
    let (r, state) = check_ready(registry, id)?;
    if state == Some(SandboxState::Paused) {
        call(&r, |c| c.resume())?;
        registry.transition(id, &[SandboxState::Paused], SandboxState::Running, None)?;
    }
    let _ = registry.touch(id, now_unix_ms());
    Ok(AgentClient::vsock_uds(r.vsock(), AGENT_PORT))
}
