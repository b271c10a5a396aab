//! What happens when a filter denies a call: the `SIGSYS` handler says which kind of
//! thread made which call, on stderr (a detached VMM's console log), and ends the whole
//! VMM process. Everything here is async-signal-safe: no allocation, no lock, only
//! `write` and `exit_group`, which every kind's filter allows.

use super::ThreadKind;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Exit status of a VMM process that a seccomp filter stopped.
pub const EXIT_SECCOMP_DENIED: i32 = 71;

/// The line a stopped VMM leaves in its console log starts with this (the daemon
/// counts the lines it finds).
pub const DENIED_MARKER: &str = "[forkvm] seccomp:";

static HANDLER: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The calling thread's kind (0: not yet narrowed). Const-initialized, so reading it
    /// in a signal handler allocates nothing.
    static KIND: Cell<u8> = const { Cell::new(0) };
    /// The calling thread's name, as far as it fits (NUL-padded), read the same way.
    static NAME: Cell<[u8; 16]> = const { Cell::new([0; 16]) };
}

pub(super) fn set_thread_kind(kind: ThreadKind) {
    KIND.with(|k| k.set(kind as u8));
    let mut name = [0u8; 16];
    if let Some(n) = std::thread::current().name() {
        let n = n.as_bytes();
        name[..n.len().min(16)].copy_from_slice(&n[..n.len().min(16)]);
    }
    NAME.with(|c| c.set(name));
}

fn thread_kind_name() -> &'static str {
    let kind = KIND.with(|k| k.get());
    ThreadKind::ALL.iter().find(|k| **k as u8 == kind).map_or("unnamed", |k| k.name())
}

pub(super) fn handler_installed() -> bool {
    HANDLER.load(Ordering::Acquire)
}

pub(super) fn install_handler() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is valid; the handler is an `extern "C"` function with
    // the SA_SIGINFO signature, and only async-signal-safe calls are made in it.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    HANDLER.store(true, Ordering::Release);
    Ok(())
}

/// Lets `SIGSYS` reach the calling thread. A thread that blocked it (a library that
/// masks every signal on its threads) would otherwise die of a denied call without a
/// word: the kernel kills a thread whose seccomp signal is blocked instead of running
/// the handler, so no line would say which call, and the daemon would not count it.
/// Async-signal-safe (the raw system call; the live-branch writer calls it after fork).
pub(super) fn unblock_sigsys() {
    // SAFETY: a sigset on the stack, initialised by sigemptyset/sigaddset before use;
    // rt_sigprocmask with the kernel's sigset size only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGSYS);
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_UNBLOCK, &set as *const libc::sigset_t, 0usize, 8usize);
    }
}

/// Why the process stops.
pub(super) enum Why {
    /// A filter denied system call `nr`.
    Denied(i64),
    /// A thread's filter could not be installed.
    Install,
}

/// Writes why to stderr and ends the process with [`EXIT_SECCOMP_DENIED`].
pub(super) fn die(kind: ThreadKind, why: Why) -> ! {
    set_thread_kind(kind);
    report_and_exit(why, None)
}

fn report_and_exit(why: Why, path: Option<*const u8>) -> ! {
    let mut line = Line::default();
    line.push(b"\n");
    line.push(DENIED_MARKER.as_bytes());
    line.push(b" a ");
    line.push(thread_kind_name().as_bytes());
    match why {
        Why::Denied(nr) => {
            line.push(b" thread");
            let name = NAME.with(|c| c.get());
            let len = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            if len > 0 {
                line.push(b" (");
                line.push(&name[..len]);
                line.push(b")");
            }
            line.push(b" made system call ");
            line.push_number(nr);
            if let Some(p) = path.filter(|p| !p.is_null()) {
                // The path the call named, as far as the line has room: the thread's own
                // memory, valid for the call it was passed to.
                line.push(b" on \"");
                for i in 0..48 {
                    // SAFETY: see above; reading stops at its NUL.
                    let b = unsafe { p.add(i).read() };
                    if b == 0 {
                        break;
                    }
                    line.push(&[if b.is_ascii_graphic() || b == b' ' { b } else { b'?' }]);
                }
                line.push(b"\"");
            }
            line.push(b", which its filter denies");
        }
        Why::Install => line.push(b" thread could not install its filter"),
    }
    line.push(b"; the VMM stops\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `line` outlives the call.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(EXIT_SECCOMP_DENIED)
    }
}

extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // For SIGSYS the kernel fills `siginfo._sigsys` { void *call_addr; int syscall;
    // unsigned arch; } after the 16-byte header: the call's number is the int at byte 24.
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let nr = unsafe { info.cast::<u8>().add(24).cast::<i32>().read_unaligned() };
    report_and_exit(Why::Denied(i64::from(nr)), path_argument(i64::from(nr), context))
}

/// The path a denied `open`/`openat`-like call named, from the registers it was made
/// with (x86-64: the first argument in `rdi`, the second in `rsi`).
#[cfg(target_arch = "x86_64")]
fn path_argument(nr: i64, context: *mut libc::c_void) -> Option<*const u8> {
    let reg = match nr {
        libc::SYS_open | libc::SYS_stat | libc::SYS_lstat | libc::SYS_access | libc::SYS_readlink => libc::REG_RDI,
        libc::SYS_openat | libc::SYS_newfstatat | libc::SYS_faccessat | libc::SYS_readlinkat | libc::SYS_openat2 => {
            libc::REG_RSI
        }
        _ => return None,
    };
    // SAFETY: for an SA_SIGINFO handler the kernel passes a valid ucontext_t.
    let gregs = unsafe { (*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    Some(gregs[reg as usize] as *const u8)
}

#[cfg(not(target_arch = "x86_64"))]
fn path_argument(_nr: i64, _context: *mut libc::c_void) -> Option<*const u8> {
    None
}

/// A fixed buffer a line is built in without allocating.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Default for Line {
    fn default() -> Line {
        Line { buf: [0; 256], len: 0 }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_number(&mut self, n: i64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = n.unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if n < 0 {
            self.push(b"-");
        }
        self.push(&digits[i..]);
    }
}
