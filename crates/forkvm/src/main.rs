//! `forkvm`: the command-line interface. Thin: parses, calls the library, prints.

mod archive_cmd;
mod backend;
mod build_cmd;
mod chain_cmd;
mod checkpoint_cmd;
mod daemon_cmd;
mod daemon_e2b_args;
mod disk_cmd;
mod doctor;
mod fork_cmd;
mod image_cmd;
mod limit_args;
mod mcp_cmd;
mod network_cmd;
mod object_store_cmd;
mod ports_cmd;
mod proc_cmd;
mod remote_cmd;
mod run_cmd;
mod sandbox_cmd;
mod shell_cmd;
mod snapshot_cmd;
mod template_cmd;
mod vm_cmd;
mod volume_cmd;
mod workspace_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "forkvm", version, about = "microVM sandboxes that fork in milliseconds")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    remote: remote_cmd::RemoteArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot a VM in this process and run it until it stops.
    Boot(vm_cmd::BootArgs),
    /// Restore a VM from a snapshot directory in this process and run it.
    Restore(vm_cmd::RestoreArgs),
    /// Talk to a running VMM over its control socket.
    Ctl(vm_cmd::CtlArgs),
    /// Start N child VMs from one snapshot (copy-on-write memory); they keep running.
    Fork(fork_cmd::ForkArgs),
    /// Benchmarks; each prints one JSON object.
    #[command(subcommand)]
    Bench(forkvm_bench::BenchCommand),
    /// Tagged snapshots: create from a template, list, delete, sweep.
    Snapshot(snapshot_cmd::SnapshotArgs),
    /// Running sandboxes.
    Ps(sandbox_cmd::PsArgs),
    /// Stop sandboxes (nothing of them remains: process, sockets, cgroup, files).
    Kill(sandbox_cmd::KillArgs),
    /// Clean up after sandboxes whose VMM stopped (salvage their disk writes, then remove
    /// their run directories and cgroups), undo starts whose starter was killed, record
    /// archives that have no record, and remove what dead snapshot writers left. Reads
    /// (`ps`, the API's GETs) never do this; the daemon sweeps every 5 s by itself.
    Sweep(sandbox_cmd::SweepArgs),
    /// Run a command in a running sandbox.
    Exec(sandbox_cmd::ExecArgs),
    /// Evaluate Python in a running sandbox's warm interpreter.
    Eval(sandbox_cmd::EvalArgs),
    /// Print a directory's changes in a running sandbox, one JSON line each, as they happen.
    Watch(sandbox_cmd::WatchArgs),
    /// Background processes of a sandbox: start, ls, logs, input, kill.
    Proc(proc_cmd::ProcArgs),
    /// A terminal in a sandbox (a login shell, or CMD): Ctrl-] detaches, it runs on.
    Shell(shell_cmd::ShellArgs),
    /// Back to a sandbox's background process on this terminal (`forkvm shell`'s, or any).
    Attach(shell_cmd::AttachArgs),
    /// Snapshot a running sandbox under a new tag (full or live).
    Branch(sandbox_cmd::BranchArgs),
    /// Run one command in a fresh Linux sandbox and exit with its status.
    Run(run_cmd::RunArgs),
    /// Guest kernel and images.
    Image(image_cmd::ImageArgs),
    /// Templates from what users bring: `forkvm template from-oci IMAGE --name NAME`.
    Template(template_cmd::TemplateArgs),
    /// Check what this host can run.
    Doctor(doctor::DoctorArgs),
    /// Spawn from a tag, run commands, and save what changed as a diff snapshot over it.
    #[command(name = "snapshot-diff")]
    SnapshotDiff(chain_cmd::SnapshotDiffArgs),
    /// A snapshot's chain: depth, parent, ancestors, dependents, sizes.
    #[command(name = "snapshot-info")]
    SnapshotInfo(chain_cmd::SnapshotInfoArgs),
    /// Delete a snapshot (refused while others are built on it; --cascade, --force).
    Rmi(chain_cmd::RmiArgs),
    /// Flatten a chain head into a new snapshot without a parent.
    #[command(name = "snapshot-compact")]
    SnapshotCompact(chain_cmd::CompactArgs),
    /// Write a snapshot's whole chain to one hash-checked .tar.zst (signed with --sign).
    Pack(chain_cmd::PackArgs),
    /// Import a pack into the store (every entry checked before anything is written;
    /// with --trust, only packs signed by those keys).
    Unpack(chain_cmd::UnpackArgs),
    /// Make an ed25519 key pair for signing packs: PATH (secret, 0600) and PATH.pub.
    #[command(name = "pack-keygen")]
    PackKeygen(chain_cmd::PackKeygenArgs),
    /// Push a snapshot's chain to object storage (sealed blocks; only what the remote lacks).
    Push(object_store_cmd::PushArgs),
    /// Bring a tag's chain from object storage into the store (only what this host lacks).
    Pull(object_store_cmd::PullArgs),
    /// Make the 32-byte key that seals a remote's blocks (shared by its hosts).
    #[command(name = "remote-keygen")]
    RemoteKeygen(object_store_cmd::RemoteKeygenArgs),
    /// Ship a sandbox's disk snapshots (its vault), key and template to a remote now.
    Replicate(object_store_cmd::ReplicateArgs),
    /// Bring a sandbox's replicated disk snapshots from a remote and boot the newest
    /// (a disk-only fork; --no-start only brings them).
    #[command(name = "restore-sandbox")]
    RestoreSandbox(object_store_cmd::RestoreSandboxArgs),
    /// List the tags pushed to a remote.
    #[command(name = "remote-tags")]
    RemoteTags(object_store_cmd::RemoteTagsArgs),
    /// Remove a tag from a remote (its blocks stay until remote-gc).
    #[command(name = "remote-rm")]
    RemoteRm(object_store_cmd::RemoteRmArgs),
    /// Delete the blocks no tag on a remote names (under the remote's exclusive lock).
    #[command(name = "remote-gc")]
    RemoteGc(object_store_cmd::RemoteGcArgs),
    /// List the locks on a remote: who holds each (a push or a collection) and since when.
    #[command(name = "remote-locks")]
    RemoteLocks(object_store_cmd::RemoteTagsArgs),
    /// Remove a lock a dead holder left on a remote (a push killed half-way blocks
    /// remote-gc until its lock goes stale, 30 min).
    #[command(name = "remote-unlock")]
    RemoteUnlock(object_store_cmd::RemoteUnlockArgs),
    /// Run forkvmd, the REST controller (Unix socket; optionally TCP with a token, TLS).
    Daemon(Box<daemon_cmd::DaemonArgs>),
    /// Take an encrypted, incremental snapshot of a sandbox's disks now.
    DiskSnapshot(disk_cmd::DiskSnapshotArgs),
    /// List a sandbox's disk snapshots.
    DiskSnapshots(disk_cmd::DiskSnapshotsArgs),
    /// Write one of a sandbox's disk snapshots out as a raw disk image.
    DiskExport(disk_cmd::DiskExportArgs),
    /// Boot a new sandbox on a copy of a sandbox's disk snapshot (a disk-only fork).
    DiskFork(disk_cmd::DiskForkArgs),
    /// Move a sandbox to the store (memory, disks, processes) and stop its VMM.
    Archive(archive_cmd::ArchiveArgs),
    /// Bring an archived sandbox back, as it was.
    Unarchive(archive_cmd::UnarchiveArgs),
    /// List archived sandboxes.
    Archives(archive_cmd::ArchivesArgs),
    /// Checkpoint a running sandbox now, memory and disks (daemon only).
    Checkpoint(checkpoint_cmd::CheckpointArgs),
    /// List a sandbox's checkpoints; set when it is checkpointed by itself (daemon only).
    Checkpoints(checkpoint_cmd::CheckpointsArgs),
    /// Put a running sandbox back at one of its checkpoints, in place (daemon only).
    Rewind(checkpoint_cmd::RewindArgs),
    /// Set a sandbox's time to live (daemon only): archived, never deleted, when it ends.
    Ttl(archive_cmd::TtlArgs),
    /// Set where a sandbox may connect to (daemon only), from now on.
    Network(network_cmd::NetworkCmdArgs),
    /// Reach a sandbox's guest port through the daemon, by URL and a token of its own.
    Expose(ports_cmd::ExposeArgs),
    /// List a sandbox's exposed ports and their tokens.
    Ports(ports_cmd::PortsArgs),
    /// Stop exposing a sandbox's port (its token stops working).
    Unexpose(ports_cmd::UnexposeArgs),
    /// Forward a local TCP port to a sandbox's guest port, through the daemon.
    #[command(name = "port-forward")]
    PortForward(ports_cmd::PortForwardArgs),
    /// Volumes: named ext4 disks that outlive sandboxes, attached with `fork --volume`.
    Volume(volume_cmd::VolumeArgs),
    /// forkd's workspaces: a sandbox under a name, suspended and resumed by it (daemon only).
    Workspace(workspace_cmd::WorkspaceArgs),
    /// Serve forkvm's sandboxes to an agent over MCP (stdio, or streamable HTTP with a
    /// token), through the daemon.
    Mcp(mcp_cmd::McpArgs),
    /// The daemon's spawner process: only forkvmd starts it.
    #[command(name = "__spawner", hide = true)]
    Spawner(daemon_cmd::SpawnerArgs),
}

/// The error and its causes, skipping a cause whose text the message already contains
/// (library errors often print their source inline).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn main() {
    // forkvm re-executed to unpack an image's layers in a build's user namespace
    // (forkvm_image::oci::helper): before anything else, with the umask the build set.
    if std::env::args_os().nth(1).is_some_and(|a| a == forkvm_image::oci::helper::HELPER_ARG) {
        std::process::exit(forkvm_image::oci::helper::helper_main());
    }
    // Everything forkvm writes (memory images, disks, chunks, the daemon's database and
    // audit log, sockets) is its user's alone; image builds set the modes a guest
    // expects explicitly (`forkvm_image::rootfs::build`).
    // SAFETY: umask cannot fail and touches no memory.
    unsafe { libc::umask(0o077) };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FORKVM_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    let remote = &cli.remote;
    let result = match cli.command {
        Command::Boot(a) => vm_cmd::boot(a),
        Command::Restore(a) => vm_cmd::restore(a),
        Command::Ctl(a) => vm_cmd::ctl(a),
        Command::Fork(a) => fork_cmd::run(a, remote),
        Command::Bench(a) => forkvm_bench::run(a),
        Command::Run(a) => run_cmd::run(a),
        Command::Snapshot(a) => snapshot_cmd::run(a, remote),
        Command::Ps(a) => sandbox_cmd::ps(a, remote),
        Command::Kill(a) => sandbox_cmd::kill(a, remote),
        Command::Sweep(a) => sandbox_cmd::sweep(a),
        Command::Exec(a) => sandbox_cmd::exec(a, remote),
        Command::Watch(a) => sandbox_cmd::watch(a, remote),
        Command::Proc(a) => proc_cmd::run(a, remote),
        Command::Shell(a) => shell_cmd::shell(a, remote),
        Command::Attach(a) => shell_cmd::attach(a, remote),
        Command::Eval(a) => sandbox_cmd::eval(a, remote),
        Command::Branch(a) => sandbox_cmd::branch(a, remote),
        Command::Image(a) => image_cmd::run(a),
        Command::Template(a) => template_cmd::run(a, remote),
        Command::Doctor(a) => doctor::run(a),
        Command::Daemon(a) => daemon_cmd::run(*a),
        Command::SnapshotDiff(a) => chain_cmd::snapshot_diff(a, remote),
        Command::SnapshotInfo(a) => chain_cmd::snapshot_info(a, remote),
        Command::Rmi(a) => chain_cmd::rmi(a, remote),
        Command::SnapshotCompact(a) => chain_cmd::compact(a, remote),
        Command::Pack(a) => chain_cmd::pack(a, remote),
        Command::Unpack(a) => chain_cmd::unpack(a, remote),
        Command::PackKeygen(a) => chain_cmd::pack_keygen(a),
        Command::Push(a) => object_store_cmd::push(a),
        Command::Pull(a) => object_store_cmd::pull(a),
        Command::RemoteKeygen(a) => object_store_cmd::keygen(a),
        Command::RemoteTags(a) => object_store_cmd::tags(a),
        Command::RemoteRm(a) => object_store_cmd::rm(a),
        Command::RemoteGc(a) => object_store_cmd::gc(a),
        Command::RemoteLocks(a) => object_store_cmd::locks(a),
        Command::RemoteUnlock(a) => object_store_cmd::unlock(a),
        Command::Replicate(a) => object_store_cmd::replicate(a),
        Command::RestoreSandbox(a) => object_store_cmd::restore_sandbox(a, remote),
        Command::DiskSnapshot(a) => disk_cmd::snapshot(a, remote),
        Command::DiskSnapshots(a) => disk_cmd::list(a, remote),
        Command::DiskExport(a) => disk_cmd::export(a, remote),
        Command::DiskFork(a) => disk_cmd::fork(a, remote),
        Command::Archive(a) => archive_cmd::archive(a, remote),
        Command::Unarchive(a) => archive_cmd::unarchive(a, remote),
        Command::Archives(a) => archive_cmd::list(a, remote),
        Command::Ttl(a) => archive_cmd::ttl(a, remote),
        Command::Checkpoint(a) => checkpoint_cmd::checkpoint(a, remote),
        Command::Checkpoints(a) => checkpoint_cmd::checkpoints(a, remote),
        Command::Rewind(a) => checkpoint_cmd::rewind(a, remote),
        Command::Network(a) => network_cmd::run(a, remote),
        Command::Expose(a) => ports_cmd::expose(a, remote),
        Command::Ports(a) => ports_cmd::list(a, remote),
        Command::Unexpose(a) => ports_cmd::unexpose(a, remote),
        Command::PortForward(a) => ports_cmd::port_forward(a, remote),
        Command::Mcp(a) => mcp_cmd::run(a, remote),
        Command::Workspace(a) => workspace_cmd::run(a, remote),
        Command::Volume(a) => volume_cmd::run(a, remote),
        Command::Spawner(a) => daemon_cmd::spawner(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("forkvm: {}", error_chain(&e));
            std::process::exit(1);
        }
    }
}
