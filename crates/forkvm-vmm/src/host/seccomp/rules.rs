//! Each thread kind's allowed system calls, and the arguments some of them must have.
//!
//! Made from what the VMM's threads were seen to call across the test tiers (strace),
//! grouped by purpose. A call missing here stops the VMM with a line in its console log
//! naming the thread kind and the call's number; add it to the narrowest group that
//! explains it.

use super::kvm_ioctls::*;
use super::ThreadKind;
use libc::*;
use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
use std::collections::BTreeMap;

/// What a thread may do with one system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    /// Any arguments.
    Always,
    /// Only with the low 32 bits of argument `arg` equal to one of `values` (the kernel
    /// reads an `ioctl` request, a socket family or a signal as 32 bits). The order is the
    /// order of the checks: the hottest first (`KVM_RUN`).
    ArgIn { arg: u8, values: Vec<u32> },
    /// Only when one of seccompiler's rules matches.
    Rules(Vec<SeccompRule>),
    /// Never: the call fails with this errno instead of stopping the process (`clone3`,
    /// so that the C library falls back to `clone`, whose flags a filter can read).
    Errno(u32),
}

impl Call {
    /// The same permission in seccompiler's terms, which know only a filter's two
    /// actions: an [`Call::Errno`] call is allowed there, and [`no_clone3`]'s filter,
    /// stacked on it, answers it.
    pub(super) fn into_seccompiler(self) -> Vec<SeccompRule> {
        match self {
            Call::Always | Call::Errno(_) => vec![],
            Call::ArgIn { arg, values } => values
                .into_iter()
                .map(|v| rule(vec![cond(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(v))]))
                .collect(),
            Call::Rules(rules) => rules,
        }
    }
}

pub(super) type Rules = BTreeMap<i64, Call>;

/// `rules` in seccompiler's terms.
pub(super) fn into_seccompiler(rules: Rules) -> BTreeMap<i64, Vec<SeccompRule>> {
    rules.into_iter().map(|(nr, call)| (nr, call.into_seccompiler())).collect()
}

/// The Rust runtime on any thread: memory, locks, signals, time, thread exit, and
/// writing to stderr (a panic message, the SIGSYS report).
const RUNTIME: &[c_long] = &[
    SYS_brk,
    SYS_munmap,
    SYS_mremap,
    SYS_madvise,
    SYS_futex,
    SYS_get_robust_list,
    SYS_set_robust_list,
    SYS_rseq,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_sigaltstack,
    SYS_sched_getaffinity,
    SYS_sched_yield,
    SYS_clock_gettime,
    SYS_clock_nanosleep,
    SYS_nanosleep,
    SYS_gettid,
    SYS_getpid,
    SYS_getrandom,
    SYS_write,
    SYS_close,
    SYS_exit,
    SYS_exit_group,
    SYS_restart_syscall,
];

/// Files a VMM reads and writes: its disks and their layers, the snapshot it writes,
/// its run directory.
const FILES: &[c_long] = &[
    SYS_openat,
    SYS_read,
    SYS_readv,
    SYS_pread64,
    SYS_preadv,
    SYS_pwrite64,
    SYS_pwritev,
    SYS_writev,
    SYS_lseek,
    SYS_fsync,
    SYS_fdatasync,
    SYS_ftruncate,
    SYS_fallocate,
    SYS_fstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_fcntl,
    SYS_flock,
    SYS_getdents64,
    SYS_mkdir,
    SYS_mkdirat,
    SYS_rename,
    SYS_renameat,
    SYS_renameat2,
    SYS_linkat,
    SYS_unlink,
    SYS_unlinkat,
    SYS_rmdir,
    SYS_readlink,
    SYS_readlinkat,
    SYS_fchmod,
    SYS_copy_file_range,
];

/// Unix-socket traffic on sockets the thread already has (vsock connections, the
/// control socket, a console stream).
const STREAMS: &[c_long] = &[
    SYS_accept4,
    SYS_recvfrom,
    SYS_recvmsg,
    SYS_sendto,
    SYS_sendmsg,
    SYS_shutdown,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
    SYS_poll,
    SYS_ppoll,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_wait,
    SYS_epoll_pwait,
];

/// Opening and serving Unix sockets (plus `socket`, limited to `AF_UNIX` below).
const SOCKETS: &[c_long] = &[SYS_bind, SYS_listen, SYS_connect];

/// Building a VM and running a VMM process: descriptors, eventfds, limits, the
/// privilege drop a forked child repeats, session and scheduling, reaping children.
const PROCESS: &[c_long] = &[
    SYS_dup,
    SYS_dup2,
    SYS_dup3,
    SYS_close_range,
    SYS_pipe2,
    SYS_eventfd2,
    SYS_prlimit64,
    SYS_getrlimit,
    SYS_setsid,
    SYS_capget,
    SYS_capset,
    SYS_prctl,
    SYS_seccomp,
    SYS_rt_sigaction,
    SYS_sched_setscheduler,
    SYS_setpriority,
    SYS_wait4,
    SYS_waitid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_getppid,
    SYS_uname,
];

/// ioctls on /dev/kvm and a VM, made while building one (control threads only).
fn build_ioctls() -> Vec<u64> {
    vec![
        KVM_GET_API_VERSION(),
        KVM_CREATE_VM(),
        KVM_CHECK_EXTENSION(),
        KVM_GET_VCPU_MMAP_SIZE(),
        KVM_GET_SUPPORTED_CPUID(),
        KVM_GET_MSR_INDEX_LIST(),
        KVM_CREATE_VCPU(),
        KVM_SET_USER_MEMORY_REGION(),
        KVM_SET_TSS_ADDR(),
        KVM_SET_IDENTITY_MAP_ADDR(),
        KVM_CREATE_IRQCHIP(),
        KVM_CREATE_PIT2(),
        KVM_ENABLE_CAP(),
        KVM_GET_IRQCHIP(),
        KVM_SET_IRQCHIP(),
        KVM_GET_CLOCK(),
        KVM_SET_CLOCK(),
        KVM_GET_PIT2(),
        KVM_SET_PIT2(),
        KVM_SET_CPUID2(),
        KVM_GET_CPUID2(),
        KVM_SET_REGS(),
        KVM_SET_SREGS(),
        KVM_SET_MSRS(),
        KVM_SET_FPU(),
        KVM_SET_LAPIC(),
        KVM_SET_MP_STATE(),
        KVM_SET_VCPU_EVENTS(),
        KVM_SET_DEBUGREGS(),
        KVM_SET_XSAVE(),
        KVM_SET_XCRS(),
    ]
}

/// ioctls a vCPU thread makes on its vCPU: run it, read and write its state (a save on
/// pause, the emulator's fix-ups), translate addresses.
fn vcpu_ioctls() -> Vec<u64> {
    vec![
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_SET_REGS(),
        KVM_GET_SREGS(),
        KVM_SET_SREGS(),
        KVM_GET_MSRS(),
        KVM_SET_MSRS(),
        KVM_GET_FPU(),
        KVM_SET_FPU(),
        KVM_GET_LAPIC(),
        KVM_GET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_SET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_XSAVE(),
        KVM_SET_XSAVE(),
        KVM_GET_XCRS(),
        KVM_TRANSLATE(),
        KVM_KVMCLOCK_CTRL(),
    ]
}

/// ioctls any thread that raises interrupts or sets a socket non-blocking makes, and
/// those of a lazy restore's memory server.
fn device_ioctls() -> Vec<u64> {
    let mut ioctls = vec![KVM_IRQ_LINE(), KVM_SIGNAL_MSI(), FIONBIO, FIONREAD];
    // Lazy guest memory's serving thread: copies windows in, wakes, unregisters.
    ioctls.extend(crate::vstate::uffd::serving_ioctls());
    ioctls
}

/// ioctls on the network device's tap: checking a tap handed to the VMM (control
/// threads build devices) and setting its offloads (the net backend). Never `TUNSETIFF`
/// or `TUNSETVNETHDRSZ`: a VMM does not make or reshape interfaces.
fn tap_check_ioctls() -> Vec<u64> {
    vec![libc::TUNGETIFF, libc::TUNGETVNETHDRSZ]
}

fn tap_offload_ioctls() -> Vec<u64> {
    vec![libc::TUNSETOFFLOAD]
}

/// The live-branch writer process: positional writes of guest memory into its image,
/// sync, idle scheduling, exit.
const WRITER: &[c_long] = &[
    SYS_pwrite64,
    SYS_lseek,
    SYS_fsync,
    SYS_fdatasync,
    SYS_close_range,
    SYS_close,
    SYS_sched_setscheduler,
    SYS_clock_nanosleep,
    SYS_nanosleep,
    SYS_rt_sigreturn,
    SYS_write,
    SYS_exit,
    SYS_exit_group,
];

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, len, op, value).expect("argument index below 6")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a rule with conditions")
}

fn allow(rules: &mut Rules, calls: &[c_long]) {
    for &nr in calls {
        rules.insert(nr, Call::Always);
    }
}

/// `ioctl` only with one of `requests`, checked in this order.
fn allow_ioctls(rules: &mut Rules, requests: Vec<u64>) {
    let mut values: Vec<u32> = Vec::with_capacity(requests.len());
    for r in requests {
        let r = u32::try_from(r).expect("ioctl requests are 32 bits");
        if !values.contains(&r) {
            values.push(r);
        }
    }
    rules.insert(SYS_ioctl, Call::ArgIn { arg: 1, values });
}

/// `mmap` and `mprotect` only without `PROT_EXEC`: a VMM never makes code.
fn allow_memory(rules: &mut Rules) {
    let no_exec =
        || Call::Rules(vec![rule(vec![cond(2, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(PROT_EXEC as u64), 0)])]);
    rules.insert(SYS_mmap, no_exec());
    rules.insert(SYS_mprotect, no_exec());
}

/// Threads (the flags glibc's `pthread_create` passes to `clone` once `clone3` answers
/// ENOSYS) and plain forks (glibc's `fork`) — never a new namespace or a shared-memory
/// process.
fn allow_clone(rules: &mut Rules) {
    const THREAD: u64 = (CLONE_VM
        | CLONE_FS
        | CLONE_FILES
        | CLONE_SIGHAND
        | CLONE_THREAD
        | CLONE_SYSVSEM
        | CLONE_SETTLS
        | CLONE_PARENT_SETTID
        | CLONE_CHILD_CLEARTID) as u64;
    const FORK: u64 = (CLONE_CHILD_CLEARTID | CLONE_CHILD_SETTID | SIGCHLD) as u64;
    let flags = |v| rule(vec![cond(0, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, v)]);
    rules.insert(SYS_clone, Call::Rules(vec![flags(THREAD), flags(FORK)]));
    rules.insert(SYS_clone3, Call::Errno(ENOSYS as u32));
}

/// `socket` only for Unix sockets.
fn allow_unix_sockets(rules: &mut Rules) {
    rules.insert(SYS_socket, Call::ArgIn { arg: 0, values: vec![AF_UNIX as u32] });
    allow(rules, SOCKETS);
}

/// `tgkill` only with the vCPU kick signal or SIGABRT (a panic's abort).
fn allow_signals(rules: &mut Rules) {
    let values = vec![crate::vstate::vcpu::kick_signal() as u32, SIGABRT as u32];
    rules.insert(SYS_tgkill, Call::ArgIn { arg: 2, values });
}

/// What `kind` may call.
pub(super) fn allowed(kind: ThreadKind) -> Rules {
    let mut rules = Rules::new();
    match kind {
        ThreadKind::Control => {
            allow(&mut rules, RUNTIME);
            allow(&mut rules, FILES);
            allow(&mut rules, STREAMS);
            allow(&mut rules, PROCESS);
            allow_memory(&mut rules);
            allow_clone(&mut rules);
            allow_unix_sockets(&mut rules);
            allow_signals(&mut rules);
            // A vCPU thread's first: they are the calls made on every VM exit.
            let mut ioctls = vcpu_ioctls();
            ioctls.extend(device_ioctls());
            ioctls.extend(build_ioctls());
            ioctls.extend(tap_check_ioctls());
            // Threads inherit this filter under their own: what a device thread may
            // call, this allows too.
            ioctls.extend(tap_offload_ioctls());
            allow_ioctls(&mut rules, ioctls);
        }
        ThreadKind::Vcpu => {
            allow(&mut rules, RUNTIME);
            allow(&mut rules, FILES);
            allow(&mut rules, STREAMS);
            allow_memory(&mut rules);
            allow_signals(&mut rules);
            let mut ioctls = vcpu_ioctls();
            ioctls.extend(device_ioctls());
            allow_ioctls(&mut rules, ioctls);
        }
        ThreadKind::Device => {
            allow(&mut rules, RUNTIME);
            allow(&mut rules, STREAMS);
            allow(&mut rules, &[SYS_read, SYS_readv, SYS_fcntl, SYS_setpriority]);
            allow_memory(&mut rules);
            allow_unix_sockets(&mut rules);
            allow_signals(&mut rules);
            let mut ioctls = device_ioctls();
            ioctls.extend(tap_offload_ioctls());
            allow_ioctls(&mut rules, ioctls);
        }
        ThreadKind::Writer => allow(&mut rules, WRITER),
    }
    rules
}

/// The filter that answers `clone3` with ENOSYS (and lets everything else through), for
/// the one-chain layout only, which cannot say so in the control filter.
pub(super) fn no_clone3() -> Rules {
    let mut rules = Rules::new();
    rules.insert(SYS_clone3, Call::Always);
    rules
}
