//! `forkvm volume`: named ext4 disks that outlive sandboxes (`forkvm_sandbox::volumes`),
//! attached at spawn with `forkvm fork --volume NAME:/path[:rw|ro|cow]`; locally, or
//! through the daemon (`/v1/volumes*`) with `--daemon`.

use anyhow::Result;
use clap::{Args, Subcommand};
use forkvm_client::api::volumes::CreateVolumeRequest;
use forkvm_sandbox::volumes::{VolumeInfo, Volumes, DEFAULT_VOLUME_BYTES};
use forkvm_sandbox::Registry;
use forkvm_snapshot::Store;

#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(subcommand)]
    pub command: VolumeCommand,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Make a blank ext4 volume.
    Create {
        name: String,
        /// Its size, MiB (16 MiB to 1 TiB; the file is sparse: a blank volume takes a few MiB).
        #[arg(long, default_value_t = DEFAULT_VOLUME_BYTES >> 20)]
        size_mib: u64,
    },
    /// Every volume.
    Ls,
    /// One volume.
    Get { name: String },
    /// Remove a volume no live sandbox has attached.
    Rm { name: String },
    /// A new volume with FROM's data as of now (layers shared, nothing copied).
    Snapshot {
        from: String,
        /// The new volume's name.
        to: String,
    },
}

fn print(v: &[VolumeInfo], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
        return Ok(());
    }
    for v in v {
        let writer = v.writer.as_deref().unwrap_or("-");
        println!(
            "{}\t{} MiB\t{} layer(s)\t{:.1} MiB stored\twriter {writer}\treaders {}",
            v.name,
            v.size_bytes >> 20,
            v.layers,
            v.stored_bytes as f64 / f64::from(1 << 20),
            v.readers.len()
        );
    }
    Ok(())
}

pub fn run(a: VolumeArgs, remote: &crate::remote_cmd::RemoteArgs) -> Result<i32> {
    if let Some(c) = remote.client()? {
        match a.command {
            VolumeCommand::Create { name, size_mib } => {
                let req = CreateVolumeRequest { name, size_mib: Some(size_mib) };
                print(&[c.create_volume(&req)?], a.json)?
            }
            VolumeCommand::Ls => print(&c.list_volumes()?, a.json)?,
            VolumeCommand::Get { name } => print(&[c.get_volume(&name)?], a.json)?,
            VolumeCommand::Rm { name } => c.delete_volume(&name)?,
            VolumeCommand::Snapshot { from, to } => print(&[c.snapshot_volume(&from, &to)?], a.json)?,
        }
        return Ok(0);
    }
    let volumes = Volumes::of(&Store::open_default());
    let registry = Registry::open_default();
    match a.command {
        VolumeCommand::Create { name, size_mib } => {
            let bytes = size_mib.saturating_mul(1 << 20);
            print(&[volumes.create(&name, bytes)?], a.json)?
        }
        VolumeCommand::Ls => print(&volumes.list(&registry)?, a.json)?,
        VolumeCommand::Get { name } => print(&[volumes.get(&registry, &name)?], a.json)?,
        VolumeCommand::Rm { name } => volumes.remove(&registry, &name)?,
        VolumeCommand::Snapshot { from, to } => print(&[volumes.snapshot(&registry, &from, &to)?], a.json)?,
    }
    Ok(0)
}
