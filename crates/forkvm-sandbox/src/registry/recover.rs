//! Recovery after a crash: what a restarted daemon (and `forkvm sweep`) does so that the
//! registry agrees with what runs and what the store holds, whatever was killed with
//! `kill -9` and when (the daemon, its spawner, a VMM, a CLI mid-spawn).
//!
//! It is [`Registry::sweep`] (interrupted starts and restores settled, dead VMMs
//! salvaged), then two checks: every live sandbox is asked for its status over its
//! control socket (VMMs outlive the daemon), and archives in the store without a row
//! (the registry is in the run root, so a reboot forgets them) are recorded `archived`.

use super::{Registry, Swept};
use crate::state::{SandboxState, StateReason};
use forkvm_vmm::control::ControlClient;
use serde::Serialize;

/// What recovery did, by sandbox id.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Recovered {
    #[serde(flatten)]
    pub swept: Swept,
    /// Live sandboxes that answered on their control socket.
    pub reattached: Vec<String>,
    /// Live sandboxes whose VMM runs but does not answer (left running, logged).
    pub unresponsive: Vec<String>,
    /// Archives found in the store without a row, now recorded `archived`.
    pub adopted_archives: Vec<String>,
}

impl Registry {
    /// Settles the registry after a crash (see the module doc).
    pub fn recover(&self) -> Recovered {
        let swept = self.sweep();
        let mut out = Recovered { swept, ..Recovered::default() };
        for row in self.rows().into_iter().filter(|r| r.state.is_live()) {
            let answers = ControlClient::connect(&row.record.control_socket()).and_then(|mut c| c.status().map(|_| ()));
            match answers {
                Ok(()) => out.reattached.push(row.record.id),
                Err(e) => {
                    tracing::warn!(id = %row.record.id, %e, "a running sandbox does not answer on its control socket");
                    out.unresponsive.push(row.record.id);
                }
            }
        }
        out.adopted_archives = self.adopt_archives();
        out
    }

    /// Records every complete archive in the store that has no row as an archived
    /// sandbox (archived on an earlier boot: the registry lives in the run root); returns
    /// their ids.
    pub fn adopt_archives(&self) -> Vec<String> {
        let Some(root) = &self.store else { return Vec::new() };
        let store = forkvm_snapshot::Store::open(root);
        crate::archive::list(self, &store)
            .into_iter()
            .filter(|id| self.row(id).is_none() && self.adopt_archive(&store, id).is_ok())
            .collect()
    }

    /// Records archive `id` found in `store` without a row as an archived sandbox
    /// (reason `api`: archived by a call on an earlier boot).
    fn adopt_archive(&self, store: &forkvm_snapshot::Store, id: &str) -> Result<(), super::RegistryError> {
        // No row: nobody is archiving it, so a sealed archive left in `.partial` is
        // finished first.
        if let Err(e) = crate::archive::format::finish_partial(store, id) {
            tracing::warn!(sandbox = %id, error = %e, "finishing an interrupted archive failed");
        }
        let record = match crate::archive::archived_record(store, id).filter(|r| r.id == id) {
            Some(r) => r,
            None => self.new_record(id, super::Origin::default())?,
        };
        self.begin_in(&[&record], None, SandboxState::Archived)?;
        self.transition(id, &[SandboxState::Archived], SandboxState::Archived, Some(StateReason::Api))?;
        Ok(())
    }
}
