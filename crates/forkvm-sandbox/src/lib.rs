//! Linux sandboxes: a guest kernel, a template's root filesystem and the forkvm agent,
//! booted once into a **template snapshot** and restored for every sandbox.
//!
//! A cold boot of a Linux guest takes tens of seconds on PVM hosts (guest kernel code is
//! emulated), a restore a fraction of a second. So the first use of a template boots it,
//! waits for the agent, runs the template's warm-up, and snapshots it under a content
//! hash of everything that went into it (kernel, image, boot configuration); every
//! sandbox after that is a copy-on-write restore, re-identified before anything runs.
//! This is the library the CLI's `run` and the daemon use.

pub mod archive;
pub mod artifacts;
pub mod branch_inbox;
pub mod build;
pub mod chain_ops;
pub mod checkpoint;
pub mod delete;
pub(crate) mod disk_grant;
pub mod disk_snapshots;
pub mod exec_view;
pub mod guest;
pub mod info;
pub mod memory_playbook;
pub mod network;
pub mod parallel;
pub mod process_view;
pub mod ready;
pub mod registry;
pub mod replication;
pub mod run_dir;
pub mod salvage;
pub mod sandbox_uid;
pub mod snapshot_view;
pub mod source;
pub mod start;
pub mod state;
pub mod tags;
pub mod template_snapshot;
pub mod template_start;
pub mod vector_guard;
pub mod verbs;
pub mod volumes;
pub mod watch_view;

pub use artifacts::{Artifacts, ArtifactsError};
pub use chain_ops::{branch_diff, snapshot_diff, ChainOpError, DiffStep, SnapshotDiffReport};
pub use delete::{delete, DeleteError, Deleted};
pub use ready::{finish, ReadyTrace, SpawnedSandbox};
pub use registry::{Registry, RegistryError, SandboxRecord};
pub use run_dir::RunDir;
pub use source::{SourceError, SpawnSource};
pub use start::in_process::{Sandbox, SandboxError};
pub use start::running::{fork_running, fork_running_as};
pub use start::snapshot::{spawn, spawn_with, start_vmms, start_vmms_with, SpawnTimings, StartedVmms};
pub use start::{SpawnError, SpawnOptions};
pub use state::{SandboxState, StateReason};
pub use tags::{check_tag_defaults, publish_template, PublishError};
pub use template_snapshot::{ensure_template_snapshot, TemplateSnapshot, TemplateSnapshotError};
pub use verbs::{branch, branch_to_dir_then, kill, kill_record, LifecycleError};
