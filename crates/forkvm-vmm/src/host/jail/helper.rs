//! The helper that makes a jail: forked, it unshares the namespaces, builds the root and
//! waits until the parent has opened descriptors to them.

use super::*;

/// What the helper does, step by step; a failure reports the step and errno.
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
enum Step {
    Done = 0,
    Unshare,
    MakePrivate,
    OpenSource,
    MountTmpfs,
    MakeMountPoint,
    Bind,
    Remount,
    Hide,
    PivotRoot,
    DetachOldRoot,
    ReadOnlyRoot,
    HostName,
    ForkInit,
}

const STEPS: [&str; 14] = [
    "done",
    "unshare",
    "making the mounts private",
    "opening a path to bind",
    "mounting the jail's tmpfs",
    "making a mount point",
    "bind-mounting a path",
    "setting a bind's flags",
    "hiding a directory",
    "pivot_root",
    "detaching the old root",
    "making the root read-only",
    "setting the host name",
    "forking the pid namespace's init",
];

/// Everything the helper needs, allocated before the fork (the child of a
/// multi-threaded process must not allocate).
struct Plan {
    /// Where the tmpfs is mounted before the pivot (an existing directory).
    mount_point: CString,
    sources: Vec<CString>,
    /// Directories to make in the tmpfs, parents first.
    dirs: Vec<CString>,
    /// Per bind: its mount point in the tmpfs, whether it is a file, its flags.
    targets: Vec<(CString, bool, libc::c_ulong)>,
    hidden: Vec<CString>,
    proc_fd_paths: Vec<Vec<u8>>,
}

fn cstring(bytes: &[u8]) -> Result<CString, JailError> {
    CString::new(bytes).map_err(|_| JailError::Prepare(format!("a path holds a NUL byte: {bytes:?}")))
}

fn plan(layout: &JailLayout) -> Result<Plan, JailError> {
    let base = ["/mnt", "/tmp", "/run"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .ok_or_else(|| JailError::Prepare("no /mnt, /tmp or /run to build the jail's root on".into()))?;
    let inside = |p: &Path| -> Vec<u8> {
        let mut v = base.as_os_str().as_bytes().to_vec();
        v.extend_from_slice(p.as_os_str().as_bytes());
        v
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut targets = Vec::new();
    let mut sources = Vec::new();
    for b in &layout.binds {
        if !b.path.is_absolute() {
            return Err(JailError::Prepare(format!("{} is not an absolute path", b.path.display())));
        }
        let is_dir = b.path.is_dir();
        let parents =
            if is_dir { b.path.ancestors().collect::<Vec<_>>() } else { b.path.ancestors().skip(1).collect() };
        for a in parents.into_iter().rev().filter(|a| *a != Path::new("/")) {
            if !dirs.iter().any(|d| d == a) {
                dirs.push(a.to_path_buf());
            }
        }
        let mut flags = libc::MS_NOSUID;
        if is_dir {
            flags |= libc::MS_NODEV | libc::MS_NOEXEC;
        }
        if !b.writable {
            flags |= libc::MS_RDONLY;
        }
        targets.push((cstring(&inside(&b.path))?, !is_dir, flags));
        sources.push(cstring(b.path.as_os_str().as_bytes())?);
    }
    Ok(Plan {
        mount_point: cstring(base.as_os_str().as_bytes())?,
        dirs: dirs.iter().map(|d| cstring(&inside(d))).collect::<Result<_, _>>()?,
        hidden: layout.hidden.iter().map(|h| cstring(&inside(h))).collect::<Result<_, _>>()?,
        proc_fd_paths: (0..sources.len()).map(|_| Vec::with_capacity(32)).collect(),
        sources,
        targets,
    })
}

pub(super) fn make(layout: &JailLayout) -> Result<JailNamespaces, JailError> {
    let mut plan = plan(layout)?;
    let (report_r, report_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    let (release_r, release_w) = pipe()?;
    // SAFETY: the child only makes system calls on memory allocated before the fork
    // (`plan`) and leaves through `_exit` (its own child, the namespace's init, never
    // returns either).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(JailError::Helper { step: "fork".into(), source: std::io::Error::last_os_error() });
    }
    if pid == 0 {
        // SAFETY: this copy's ends that the helper does not use; closed once.
        unsafe {
            libc::close(report_r.as_raw_fd());
            libc::close(release_w.as_raw_fd());
            libc::close(go_w.as_raw_fd());
        }
        let (step, errno, init) = match build(&mut plan, release_r.as_raw_fd()) {
            Ok(init) => (Step::Done, 0, init),
            Err((step, errno)) => (step, errno, 0),
        };
        let mut msg = [0u8; 12];
        msg[..4].copy_from_slice(&(step as u32).to_le_bytes());
        msg[4..8].copy_from_slice(&errno.to_le_bytes());
        msg[8..].copy_from_slice(&init.to_le_bytes());
        // SAFETY: writes a local buffer to our pipe, waits on the other, exits.
        unsafe {
            libc::write(report_w.as_raw_fd(), msg.as_ptr().cast(), msg.len());
            let mut b = 0u8;
            libc::read(go_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(report_w);
    drop(go_r);
    drop(release_r);
    let mut msg = [0u8; 12];
    let got = read_full(&report_r, &mut msg);
    let result = if !got {
        Err(JailError::HelperLost)
    } else {
        let step = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes")) as usize;
        let errno = i32::from_le_bytes(msg[4..8].try_into().expect("4 bytes"));
        let init = i32::from_le_bytes(msg[8..].try_into().expect("4 bytes"));
        if step == Step::Done as usize {
            JailNamespaces::from_init(layout, init, release_w)
        } else {
            Err(JailError::Helper {
                step: STEPS.get(step).copied().unwrap_or("an unknown step").to_string(),
                source: std::io::Error::from_raw_os_error(errno),
            })
        }
    };
    drop(go_w);
    let mut status = 0;
    // SAFETY: reaps our own helper child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    result
}

/// In the helper child: system calls only. Returns the pid of the namespace's init
/// (its pid here, in the caller's pid namespace), which holds `release`'s read end.
fn build(plan: &mut Plan, release: RawFd) -> Result<libc::pid_t, (Step, i32)> {
    let check = |step: Step, rc: libc::c_int| if rc == 0 { Ok(()) } else { Err((step, errno())) };
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNET | libc::CLONE_NEWPID;
    // SAFETY: system calls on NUL-terminated strings that live in `plan` for the whole
    // call, and on descriptors this process opened.
    unsafe {
        check(Step::Unshare, libc::unshare(flags))?;
        let root = c"/";
        check(
            Step::MakePrivate,
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
        )?;
        // Open what to bind before the tmpfs may cover it.
        let mut fds = [0 as RawFd; 64];
        if plan.sources.len() > fds.len() {
            return Err((Step::OpenSource, libc::E2BIG));
        }
        for (i, s) in plan.sources.iter().enumerate() {
            let fd = libc::open(s.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if fd < 0 {
                return Err((Step::OpenSource, errno()));
            }
            fds[i] = fd;
            write_proc_fd_path(&mut plan.proc_fd_paths[i], fd);
        }
        let tmpfs = c"tmpfs";
        let opts = c"mode=0755,size=1m";
        check(
            Step::MountTmpfs,
            libc::mount(
                c"forkvm-jail".as_ptr(),
                plan.mount_point.as_ptr(),
                tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                opts.as_ptr().cast(),
            ),
        )?;
        // The mount points on the way to what a VMM reaches are passable by every uid
        // (a sandbox's uid goes through them to its run directory); umask 077 would
        // make them root's alone.
        libc::umask(0o022);
        for d in &plan.dirs {
            if libc::mkdir(d.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                return Err((Step::MakeMountPoint, errno()));
            }
        }
        for (i, (target, is_file, flags)) in plan.targets.iter().enumerate() {
            if *is_file {
                let fd = libc::open(target.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o600);
                if fd < 0 {
                    return Err((Step::MakeMountPoint, errno()));
                }
                libc::close(fd);
            }
            let src = plan.proc_fd_paths[i].as_ptr().cast();
            check(
                Step::Bind,
                libc::mount(src, target.as_ptr(), std::ptr::null(), libc::MS_BIND | libc::MS_REC, std::ptr::null()),
            )?;
            check(
                Step::Remount,
                libc::mount(
                    std::ptr::null(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_BIND | flags,
                    std::ptr::null(),
                ),
            )?;
        }
        let hidden_opts = c"mode=0000,size=4k";
        for h in &plan.hidden {
            check(
                Step::Hide,
                libc::mount(
                    c"forkvm-hidden".as_ptr(),
                    h.as_ptr(),
                    tmpfs.as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    hidden_opts.as_ptr().cast(),
                ),
            )?;
        }
        check(Step::PivotRoot, libc::chdir(plan.mount_point.as_ptr()))?;
        let dot = c".";
        check(Step::PivotRoot, libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int)?;
        check(Step::DetachOldRoot, libc::umount2(dot.as_ptr(), libc::MNT_DETACH))?;
        check(Step::DetachOldRoot, libc::chdir(root.as_ptr()))?;
        check(
            Step::ReadOnlyRoot,
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ),
        )?;
        let name = b"forkvm";
        check(Step::HostName, libc::sethostname(name.as_ptr().cast(), name.len()))?;
        // The first process in the new pid namespace is its init: every VMM is born in
        // the namespace after it, and all would die with it.
        match libc::fork() {
            -1 => Err((Step::ForkInit, errno())),
            0 => super::init::serve(release),
            init => Ok(init),
        }
    }
}

/// `/proc/self/fd/<fd>\0` into `buf` (whose capacity was reserved before the fork).
fn write_proc_fd_path(buf: &mut Vec<u8>, fd: RawFd) {
    buf.clear();
    buf.extend_from_slice(b"/proc/self/fd/");
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend(digits[..len].iter().rev());
    buf.push(0);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(JailError::Helper { step: "pipe".into(), source: std::io::Error::last_os_error() });
    }
    // SAFETY: both descriptors were just made and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn read_full(fd: &OwnedFd, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled tail of `buf`.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        } else {
            return false;
        }
    }
    true
}
