//! forkvm's benchmarks, one module per capability, each printing one JSON object of what
//! it measured (medians of several runs, ratios measured in one run, the machine).
//! `forkvm bench <name>` runs them: the CLI holds only the dispatch, this crate the
//! measuring, and `util` what they share (medians, the machine, scratch directories).

use clap::Subcommand;

mod api;
mod archive;
mod boot;
mod branch;
mod build;
mod chain;
mod checkpoint;
mod density;
mod disk;
mod disk_fork;
mod e2b;
mod files;
mod fork;
mod fork_running;
mod forkd;
mod guard;
mod lazy;
mod lineage;
mod mcp;
mod memory;
mod net;
mod oci;
mod procs;
pub mod procstat;
pub mod remote;
mod seccomp;
mod spawn;
pub mod util;
mod vector;
mod volume;
mod watch;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Fork N children from a snapshot of a warmed test guest, against N cold boots.
    Fork(fork::BenchForkArgs),
    /// A running sandbox forked into N children, for each N: source pause, host CPU and
    /// PSS per child, time to every child's first answer.
    ForkRunning(fork_running::BenchForkRunningArgs),
    /// Linux sandbox readiness (cold boot, restore) and agent round trips.
    Boot(boot::BenchBootArgs),
    /// BRANCH pause windows, full vs live, while the guest dirties memory.
    Branch(branch::BenchBranchArgs),
    /// N Linux sandboxes from a tag until each answered an eval, against cold boots.
    Spawn(spawn::BenchSpawnArgs),
    /// N live Linux sandboxes at once (1,000 by default), spawned in batches: host CPU a
    /// child, host memory and idle CPU with all N idle, and nothing left after the kill.
    Density(density::BenchDensityArgs),
    /// A spawn's host-side cost per child against the ceilings of `bench/guard.json`:
    /// exits 1 when a figure is over its ceiling in two runs (a regression).
    Guard(guard::BenchGuardArgs),
    /// The REST API's overhead: spawn of N, exec and eval round trips, REST vs library.
    Api(api::BenchApiArgs),
    /// Diff-snapshot chains: spawn cost per depth, bytes on disk, pack/unpack throughput.
    Chain(chain::BenchChainArgs),
    /// Chains through object storage: push and pull throughput, dedup of a second tag,
    /// first command from a remote against from the local store (docs/object-storage.md).
    Remote(remote::BenchRemoteArgs),
    /// Continuous disk snapshots: steady-state cost against the guest's write rate.
    DiskSnapshot(disk::BenchDiskArgs),
    /// Lazy restore from a disk snapshot: eager vs lazy vs lazy + prefetch playbook (host side).
    LazyRestore(lazy::BenchLazyArgs),
    /// Disk-only fork, restore → first exec: eager vs lazy vs lazy + playbook (guest side).
    DiskFork(disk_fork::BenchDiskForkArgs),
    /// Spawn → ready → first exec without and with the memory playbook, warm and cold cache.
    MemoryPrefetch(memory::BenchMemoryArgs),
    /// Encrypted archive and unarchive, against a plaintext branch and a restore from it.
    Archive(archive::BenchArchiveArgs),
    /// Saving the guest's vector state: CPU template against CPU template (restore,
    /// exec, context switch, numpy), and whether processes keep their registers.
    VectorState(vector::BenchVectorArgs),
    /// The VMM's seccomp filters: install cost per thread kind and per VMM, and an ioctl
    /// through them, seccompiler's chain layout against the call-number tree.
    Seccomp(seccomp::BenchSeccompArgs),
    /// A sandbox's network: namespace and tap setup cost (host), and ICMP round trips and
    /// TCP throughput each way between a guest and its namespace.
    Net(net::BenchNetArgs),
    /// E2B compatibility's cost: create and first command through E2B's own SDK against
    /// forkvm's SDK, in one run (docs/e2b.md).
    E2b(e2b::BenchE2bArgs),
    /// The MCP server's cost: list, exec and spawn+kill through `forkvm mcp` (stdio)
    /// against REST, in one run (docs/mcp.md).
    Mcp(mcp::BenchMcpArgs),
    /// forkd compatibility's own costs: a full branch against one with `measure_diff`,
    /// workspace create, suspend and resume, in one run (docs/forkd-compat.md).
    Forkd(forkd::BenchForkdArgs),
    /// Watching a directory through the agent: arm and stop, a change's event latency,
    /// and a burst of changes from one guest command (guest side).
    Watch(watch::BenchWatchArgs),
    /// Background processes and terminals through the agent: start against exec, first
    /// output, a keystroke's echo on a terminal, output throughput (guest side).
    Procs(procs::BenchProcsArgs),
    /// Large files and trees through the daemon: upload, download, the guest's SHA-256,
    /// tar out and in (MiB/s), and the daemon's and the agent's memory meanwhile.
    Files(files::BenchFilesArgs),
    /// What the web console's data costs the daemon: the lineage graph, the lists and a
    /// usage sample over a parent with N forked children (host-side).
    Lineage(lineage::BenchLineageArgs),
    /// Templates from OCI images: import and build against the busybox builder, unpack
    /// throughput, and the blob bytes a second image on the same base shares (host side).
    Oci(oci::BenchOciArgs),
    /// Volumes: create, spawn with one (rw, ro) against without, the writer's kill and
    /// take-in, a volume snapshot (host and guest side).
    Volume(volume::BenchVolumeArgs),
    /// Checkpoints and rewind: the pause and bytes stored per checkpoint of an idle and of
    /// a memory-writing sandbox, and a rewind in place against a spawn from the tag.
    Checkpoint(checkpoint::BenchCheckpointArgs),
    /// Dockerfile builds: every step run, none run (all cached), and after changing one
    /// COPY'd file (guest side: each step is a fork, guest work and a diff branch).
    Build(build::BenchBuildArgs),
}

/// Runs benchmark `cmd`; returns the process's exit code.
pub fn run(cmd: BenchCommand) -> anyhow::Result<i32> {
    match cmd {
        BenchCommand::Fork(a) => fork::run(a),
        BenchCommand::Density(a) => density::run(a),
        BenchCommand::Guard(a) => guard::run(a),
        BenchCommand::ForkRunning(a) => fork_running::run(a),
        BenchCommand::VectorState(a) => vector::run(a),
        BenchCommand::Seccomp(a) => seccomp::run(a),
        BenchCommand::Net(a) => net::run(a),
        BenchCommand::E2b(a) => e2b::run(a),
        BenchCommand::Mcp(a) => mcp::run(a),
        BenchCommand::Forkd(a) => forkd::run(a),
        BenchCommand::Watch(a) => watch::run(a),
        BenchCommand::Procs(a) => procs::run(a),
        BenchCommand::Files(a) => files::run(a),
        BenchCommand::Lineage(a) => lineage::run(a),
        BenchCommand::Oci(a) => oci::run(a),
        BenchCommand::Volume(a) => volume::run(a),
        BenchCommand::Build(a) => build::run(a),
        BenchCommand::Checkpoint(a) => checkpoint::run(a),
        BenchCommand::Boot(a) => boot::run(a),
        BenchCommand::Branch(a) => branch::run(a),
        BenchCommand::Spawn(a) => spawn::run(a),
        BenchCommand::Api(a) => api::run(a),
        BenchCommand::Chain(a) => chain::run(a),
        BenchCommand::Remote(a) => remote::run(a),
        BenchCommand::DiskSnapshot(a) => disk::run(a),
        BenchCommand::LazyRestore(a) => lazy::run(a),
        BenchCommand::DiskFork(a) => disk_fork::run(a),
        BenchCommand::MemoryPrefetch(a) => memory::run(a),
        BenchCommand::Archive(a) => archive::run(a),
    }
}
