//! seccomp-bpf filters for a VMM process: each of its threads may make only the system
//! calls, and the ioctls, that its kind of work needs.
//!
//! A guest that takes over one of the VMM's threads through a device bug inherits what
//! that thread may do. The filters make that little: no `execve`, no network socket, no
//! `ptrace`, no mount, no new namespace, no executable memory, and on a vCPU or device
//! thread no new thread or process either (docs/security.md lists each kind's calls).
//!
//! How the filters are laid on ([`enforce`], [`enter_thread`]):
//! - The process-wide filter, [`ThreadKind::Control`], is installed on the VMM's only
//!   thread right after it dropped its privileges, before it builds its VM. Every thread
//!   it starts inherits it. It allows what building and serving a VM needs, because a
//!   fork of the running VM builds one in a child of a control thread.
//! - Each vCPU and device thread then adds its own, narrower filter as it starts, before
//!   it runs guest code or touches guest data. Filters stack: a call must pass all of a
//!   thread's filters.
//! - The live-branch writer, a forked copy of the VMM that only writes guest memory into
//!   an image, adds [`ThreadKind::Writer`] right after the fork; its program is compiled
//!   beforehand, so the fork path allocates nothing.
//! - `clone3` answers `ENOSYS` (in the control filter), so the C library falls back to
//!   `clone`, whose flags a filter can read: only a thread or a plain fork passes.
//!
//! Every program is laid out as a binary search on the call number ([`tree`]): the
//! kernel's cost of installing a filter grows with the path a call walks through it and
//! with its length, and a VMM installs four or five before it runs guest code.
//!
//! A call a filter denies raises `SIGSYS` (`SECCOMP_RET_TRAP`); [`denied`]'s handler
//! writes the thread's kind and the call's number to stderr, which is a detached VMM's
//! console log, and ends the whole process with [`EXIT_SECCOMP_DENIED`]. The daemon
//! counts such deaths (`forkvm_vmm_seccomp_kills_total`).

mod denied;
mod kvm_ioctls;
mod rules;
#[cfg(test)]
mod tests;
mod tree;

pub use denied::{DENIED_MARKER, EXIT_SECCOMP_DENIED};
pub use seccompiler::BpfProgram;

use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
use std::sync::OnceLock;

/// Whether a VMM process runs under its filters. Off only for debugging
/// (`--no-seccomp`): a VMM without them is a guest bug away from every system call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Seccomp {
    #[default]
    Enforce,
    Off,
}

/// What a thread of a VMM process does, and so which filter it runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ThreadKind {
    /// The main thread, control-socket threads, reapers: builds VMs, serves requests,
    /// writes snapshots, forks. The process-wide filter.
    Control = 1,
    /// Runs one vCPU: `KVM_RUN` and the device emulation that exits hand it (MMIO, disk
    /// reads and writes, interrupts).
    Vcpu = 2,
    /// Device backends and helpers off the vCPU threads: vsock, serial input, memory
    /// prefetch.
    Device = 3,
    /// The live-branch writer process: writes guest memory into an image and exits.
    Writer = 4,
}

impl ThreadKind {
    pub const ALL: [ThreadKind; 4] = [ThreadKind::Control, ThreadKind::Vcpu, ThreadKind::Device, ThreadKind::Writer];

    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Control => "control",
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Device => "device",
            ThreadKind::Writer => "writer",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("compiling the {kind} seccomp filter: {source}")]
    Compile { kind: &'static str, source: tree::TreeError },
    #[error("installing the {kind} seccomp filter: {source}")]
    Install { kind: &'static str, source: seccompiler::Error },
    #[error("installing the SIGSYS handler: {0}")]
    Handler(std::io::Error),
}

/// Every kind's compiled program, made once per VMM process (inherited by forks).
struct Programs {
    kinds: [BpfProgram; 4],
}

impl Programs {
    fn of(&self, kind: ThreadKind) -> &BpfProgram {
        &self.kinds[kind as usize - 1]
    }
}

static PROGRAMS: OnceLock<Programs> = OnceLock::new();

/// How a program is laid out: seccompiler's one chain of comparisons, or a binary search
/// on the call number ahead of short chains ([`tree`]). VMMs run the tree; the chain is
/// kept for `forkvm bench seccomp`, which measures what the tree saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Chain,
    Tree,
}

fn compile(
    kind: &'static str,
    layout: Layout,
    rules: rules::Rules,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let arch = TargetArch::x86_64;
    let program = match layout {
        Layout::Tree => tree::compile(rules, mismatch, matched, arch),
        Layout::Chain => SeccompFilter::new(rules::into_seccompiler(rules), mismatch, matched, arch)
            .and_then(BpfProgram::try_from)
            .map_err(tree::TreeError::from),
    };
    program.map_err(|source| SeccompError::Compile { kind, source })
}

/// `kind`'s program in `layout`.
pub fn program(kind: ThreadKind, layout: Layout) -> Result<BpfProgram, SeccompError> {
    compile(kind.name(), layout, rules::allowed(kind), SeccompAction::Trap, SeccompAction::Allow)
}

/// The programs a VMM process installs on itself, in order, in `layout`: the control
/// program; in the chain layout, which has a filter's two actions only, first a filter
/// that answers `clone3` with ENOSYS.
pub fn process_programs(layout: Layout) -> Result<Vec<BpfProgram>, SeccompError> {
    let control = program(ThreadKind::Control, layout)?;
    Ok(match layout {
        Layout::Tree => vec![control],
        Layout::Chain => {
            let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
            vec![compile("clone3", layout, rules::no_clone3(), SeccompAction::Allow, enosys)?, control]
        }
    })
}

fn programs() -> Result<&'static Programs, SeccompError> {
    if let Some(p) = PROGRAMS.get() {
        return Ok(p);
    }
    let mut kinds: [BpfProgram; 4] = Default::default();
    for kind in ThreadKind::ALL {
        kinds[kind as usize - 1] = program(kind, Layout::Tree)?;
    }
    Ok(PROGRAMS.get_or_init(|| Programs { kinds }))
}

/// Compiles every kind's program now, in a process that forks VMMs (a zygote), so that
/// its children only install them.
pub fn prepare() -> Result<(), SeccompError> {
    programs().map(|_| ())
}

/// Puts the calling process under its filters: compiles every kind's program, installs
/// the SIGSYS handler, then the [`ThreadKind::Control`] filter on the calling thread. Call it while the process has one thread, after it dropped its
/// privileges and before it builds its VM; from then on [`enter_thread`] narrows each
/// new thread.
///
/// In a process forked from a filtered one (a fork of the running VM) the filters are
/// already there, inherited: this does nothing.
pub fn enforce() -> Result<(), SeccompError> {
    if enforced() {
        return Ok(());
    }
    let programs = programs()?;
    keep_malloc_off_files();
    denied::install_handler().map_err(SeccompError::Handler)?;
    apply(ThreadKind::Control.name(), programs.of(ThreadKind::Control))?;
    denied::set_thread_kind(ThreadKind::Control);
    denied::unblock_sigsys();
    Ok(())
}

/// Keeps glibc's allocator from opening files on a filtered thread. Freeing memory at
/// the top of a thread's arena makes glibc shrink that arena's heap, and the first time
/// it does, it reads `/proc/sys/vm/overcommit_memory` (`check_may_shrink_heap`): an
/// `openat` a device thread's filter denies, which ended the whole VMM (a vsock backend
/// that had just passed a large file along, seconds into a sandbox's life). With the
/// trim threshold above any heap's size (64 MiB) no heap is ever shrunk, so that read
/// never happens; freed memory stays with its arena for the next allocation, and whole
/// heaps are still unmapped when they empty.
fn keep_malloc_off_files() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

fn apply(kind: &'static str, program: &BpfProgram) -> Result<(), SeccompError> {
    seccompiler::apply_filter(program).map_err(|source| SeccompError::Install { kind, source })
}

/// Sets `no_new_privs` and installs `program` on the calling thread: what a benchmark
/// times. A VMM goes through [`enforce`] and [`enter_thread`] instead.
pub fn install(kind: ThreadKind, program: &BpfProgram) -> Result<(), SeccompError> {
    apply(kind.name(), program)
}

/// Whether this process runs under its filters ([`enforce`] succeeded here or in the
/// process it was forked from).
pub fn enforced() -> bool {
    denied::handler_installed()
}

/// Narrows the calling thread to `kind`'s filter, if the process is filtered at all.
/// A thread that cannot be narrowed must not go on with the wider filter: this writes
/// why and ends the process, like a denied call.
pub fn enter_thread(kind: ThreadKind) {
    if !enforced() {
        return;
    }
    let Some(programs) = PROGRAMS.get() else { return };
    // Async-signal-safe: the live-branch writer calls this right after fork().
    // Before the narrower filter, which may not allow changing the mask (the writer's).
    denied::unblock_sigsys();
    let program = programs.of(kind);
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter };
    // SAFETY: seccomp(2) with a pointer to a `sock_fprog` that lives across the call
    // (built from a program that stays in a static); no memory is allocated.
    let rc =
        unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog as *const libc::sock_fprog) };
    if rc != 0 {
        denied::die(kind, denied::Why::Install);
    }
    denied::set_thread_kind(kind);
}
