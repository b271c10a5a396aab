//! forkvm: checkpoints of a running sandbox (memory and disks together) and rewinding it,
//! in place, to one of them (`/v1/sandboxes/{id}/checkpoints`, `/v1/sandboxes/{id}/rewind`).
//! A checkpoint is a snapshot tag too, so `POST /v1/sandboxes` with its `tag` forks
//! children from it.

use serde::{Deserialize, Serialize};

/// Most checkpoints a sandbox keeps (`keep`).
pub const MAX_KEEP: u32 = 256;
/// Longest checkpoint note accepted, in bytes.
pub const MAX_NOTE: usize = 1024;
/// Largest `max_stored_mib` (1 TiB).
pub const MAX_STORED_MIB: u64 = 1 << 20;
/// Longest `max_age_seconds` (a year).
pub const MAX_AGE_SECONDS: u64 = 365 * 86_400;
/// Shortest interval between automatic checkpoints, in seconds.
pub const MIN_EVERY_SECONDS: u64 = 1;

/// `POST /v1/sandboxes/{id}/checkpoints`: take one now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpointRequest {
    /// What the checkpoint is for (at most 1024 bytes), shown in the list.
    #[serde(default)]
    pub note: Option<String>,
}

/// When a sandbox is checkpointed by itself (`PUT /v1/sandboxes/{id}/checkpoints`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// Every this many seconds (at least 1), while it runs; `null`: no timer.
    #[serde(default)]
    pub every_seconds: Option<u64>,
    /// After every `exec` and `eval` call, before the next call starts; the checkpoint's
    /// note names the call.
    #[serde(default)]
    pub after_exec: bool,
    /// How many checkpoints are kept (1 to 256): the oldest goes first, except one a
    /// running sandbox was rewound to.
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// The most bytes, in MiB, the kept checkpoints may have added to the store, memory
    /// and disk layers (the sum of their `bytes_stored`): past it the oldest go first,
    /// the newest always stays. `null`: only `keep` bounds them.
    #[serde(default)]
    pub max_stored_mib: Option<u64>,
    /// Checkpoints older than this many seconds go (a time window), the newest always
    /// stays; checked whenever one is taken or the policy is set. `null`: no window.
    #[serde(default)]
    pub max_age_seconds: Option<u64>,
    /// Checkpoints older than this many seconds are thinned to one per
    /// `thin_every_seconds` (the newest of each such stretch of time stays): recent
    /// history dense, older history sparse. Given with `thin_every_seconds`; `null`:
    /// no thinning.
    #[serde(default)]
    pub thin_after_seconds: Option<u64>,
    /// With `thin_after_seconds`: the stretch of time one old checkpoint stands for.
    #[serde(default)]
    pub thin_every_seconds: Option<u64>,
}

fn default_keep() -> u32 {
    32
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every_seconds: None,
            after_exec: false,
            keep: default_keep(),
            max_stored_mib: None,
            max_age_seconds: None,
            thin_after_seconds: None,
            thin_every_seconds: None,
        }
    }
}

impl CheckpointPolicy {
    /// Checks the bounds; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.keep == 0 || self.keep > MAX_KEEP {
            return Err(format!("keep must be between 1 and {MAX_KEEP}, got {}", self.keep));
        }
        if let Some(s) = self.every_seconds.filter(|s| *s < MIN_EVERY_SECONDS || *s > 86_400) {
            return Err(format!("every_seconds must be between {MIN_EVERY_SECONDS} and 86400, got {s}"));
        }
        if let Some(m) = self.max_stored_mib.filter(|m| *m == 0 || *m > MAX_STORED_MIB) {
            return Err(format!("max_stored_mib must be between 1 and {MAX_STORED_MIB}, got {m}"));
        }
        if let Some(a) = self.max_age_seconds.filter(|a| *a == 0 || *a > MAX_AGE_SECONDS) {
            return Err(format!("max_age_seconds must be between 1 and {MAX_AGE_SECONDS}, got {a}"));
        }
        match (self.thin_after_seconds, self.thin_every_seconds) {
            (None, None) => {}
            (Some(after), Some(every)) => {
                if after == 0 || after > MAX_AGE_SECONDS {
                    return Err(format!("thin_after_seconds must be between 1 and {MAX_AGE_SECONDS}, got {after}"));
                }
                if !(2..=MAX_AGE_SECONDS).contains(&every) {
                    return Err(format!("thin_every_seconds must be between 2 and {MAX_AGE_SECONDS}, got {every}"));
                }
            }
            _ => return Err("thin_after_seconds and thin_every_seconds are given together".into()),
        }
        Ok(())
    }
}

/// One checkpoint of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CheckpointInfo {
    pub sandbox_id: String,
    /// Its number in the sandbox, from 1, never reused.
    pub seq: u64,
    /// Its snapshot tag: `POST /v1/sandboxes` with it forks children from it.
    pub tag: String,
    pub created_at_unix_ms: u64,
    /// What took it: `api`, `interval` or `exec`.
    pub trigger: String,
    /// The note given, or for `exec` the call that ran just before it.
    pub note: Option<String>,
    /// The guest's pause while it was taken.
    pub pause_ms: f64,
    /// Memory pages that differ from the sandbox's base snapshot.
    pub pages: u64,
    /// Bytes this checkpoint added to the store, memory and disk (what changed since the
    /// previous one; unchanged memory and disk layers are shared).
    pub bytes_stored: u64,
    /// Of `bytes_stored`, the disks' new sealed layers (blocks written since the
    /// previous checkpoint).
    #[serde(default)]
    pub disk_bytes_stored: u64,
    /// The whole checkpoint, writing and comparing its memory included.
    pub total_ms: f64,
}

/// `GET /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CheckpointList {
    pub sandbox_id: String,
    pub policy: CheckpointPolicy,
    /// The snapshot every checkpoint is a diff over (`null` before the first).
    pub base_tag: Option<String>,
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
}

/// `POST /v1/sandboxes/{id}/rewind`: exactly one of `seq` and `ago_seconds`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// The checkpoint to go back to.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The newest checkpoint taken at least this many seconds ago.
    #[serde(default)]
    pub ago_seconds: Option<f64>,
}

/// What a rewind did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RewindReport {
    pub sandbox_id: String,
    /// The checkpoint it is back at.
    pub checkpoint: CheckpointInfo,
    /// Stopping its VMM.
    pub stop_ms: f64,
    /// Until its agent answered from the checkpoint.
    pub total_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_names_the_field_it_refuses() {
        let ok = CheckpointPolicy { thin_after_seconds: Some(600), thin_every_seconds: Some(60), ..Default::default() };
        ok.validate().unwrap();
        CheckpointPolicy::default().validate().unwrap();
        let bad = [
            (CheckpointPolicy { keep: 0, ..Default::default() }, "keep"),
            (CheckpointPolicy { every_seconds: Some(0), ..Default::default() }, "every_seconds"),
            (CheckpointPolicy { max_stored_mib: Some(0), ..Default::default() }, "max_stored_mib"),
            (CheckpointPolicy { max_age_seconds: Some(0), ..Default::default() }, "max_age_seconds"),
            (CheckpointPolicy { thin_after_seconds: Some(60), ..Default::default() }, "together"),
            (CheckpointPolicy { thin_every_seconds: Some(60), ..Default::default() }, "together"),
            (CheckpointPolicy { thin_every_seconds: Some(1), ..ok.clone() }, "thin_every_seconds"),
            (CheckpointPolicy { thin_after_seconds: Some(0), ..ok.clone() }, "thin_after_seconds"),
        ];
        for (policy, field) in bad {
            let e = policy.validate().unwrap_err();
            assert!(e.contains(field), "{e} should name {field}");
        }
    }
}
