//! `forkvm workspace`: forkd's named, long-lived sandboxes (`/v1/workspaces*`), daemon
//! only: the name → sandbox table lives in the daemon's database. Suspend archives the
//! sandbox (memory, processes, disks); resume brings the same sandbox back.

use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::{Args, Subcommand};
use forkvm_client::api::workspaces::{CreateWorkspaceRequest, WorkspaceInfo};

#[derive(Args, Debug)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    pub command: WorkspaceCommand,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum WorkspaceCommand {
    /// A sandbox spawned from a tag, under a name.
    Create {
        name: String,
        /// The snapshot to spawn it from.
        #[arg(long)]
        tag: String,
        /// Memory limit of its VMM, MiB.
        #[arg(long)]
        memory_limit_mib: Option<u64>,
    },
    /// Every workspace.
    Ls,
    /// One workspace.
    Get { name: String },
    /// Archive its sandbox (memory, processes, disks); the name keeps it.
    Suspend { name: String },
    /// Bring its sandbox back as it was (a fresh one from the tag if it was deleted).
    Resume { name: String },
    /// Delete the workspace and its sandbox (the tag stays).
    Rm { name: String },
}

fn print(ws: &[WorkspaceInfo], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(ws)?);
        return Ok(());
    }
    for w in ws {
        println!("{}\t{}\t{}\t{}", w.name, w.status, w.sandbox_id, w.source_snapshot_tag);
    }
    Ok(())
}

pub fn run(a: WorkspaceArgs, remote: &RemoteArgs) -> Result<i32> {
    let c = remote.required_client("forkvm workspace")?;
    match a.command {
        WorkspaceCommand::Create { name, tag, memory_limit_mib } => {
            let req = CreateWorkspaceRequest { name, snapshot_tag: tag, per_child_netns: false, memory_limit_mib };
            print(&[c.create_workspace(&req)?], a.json)?;
        }
        WorkspaceCommand::Ls => print(&c.list_workspaces()?, a.json)?,
        WorkspaceCommand::Get { name } => print(&[c.get_workspace(&name)?], a.json)?,
        WorkspaceCommand::Suspend { name } => print(&[c.suspend_workspace(&name)?], a.json)?,
        WorkspaceCommand::Resume { name } => print(&[c.resume_workspace(&name)?], a.json)?,
        WorkspaceCommand::Rm { name } => {
            c.delete_workspace(&name)?;
            if !a.json {
                println!("{name}: deleted");
            }
        }
    }
    Ok(0)
}
