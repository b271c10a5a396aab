//! How a VMM process is confined, read back from `/proc` (its uid, capabilities,
//! `no_new_privs`, seccomp mode on every thread, namespaces, root), so that `forkvm
//! doctor`, the API (`GET /v1/sandboxes/{id}`) and the tests report what the kernel
//! enforces rather than what we meant to set.

use serde::{Deserialize, Serialize};

/// Namespaces whose identity `/proc/<pid>/ns/` shows.
const NAMESPACES: [&str; 6] = ["mnt", "pid", "net", "ipc", "uts", "user"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// Effective uid and gid.
    pub uid: u32,
    pub gid: u32,
    /// Its effective, permitted and ambient capability sets are empty (with
    /// `no_new_privs` nothing can refill them; a root VMM also empties its bounding set).
    pub no_capabilities: bool,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Threads of the process, and how many run under a seccomp filter (`Seccomp: 2`).
    pub threads: usize,
    pub seccomp_filtered_threads: usize,
    /// Namespaces the process does not share with the reader (the daemon).
    pub own_namespaces: Vec<String>,
    /// Its root directory, as the reader sees it.
    pub root: String,
}

impl Confinement {
    /// Reads process `pid`'s confinement; None when it is gone or unreadable.
    pub fn of(pid: i32) -> Option<Confinement> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.split_once(':').filter(|(k, _)| *k == name).map(|(_, v)| v.trim().to_string()))
        };
        let second = |name: &str| field(name).and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok());
        let empty = |name: &str| field(name).is_some_and(|v| u64::from_str_radix(&v, 16) == Ok(0));
        let (threads, seccomp_filtered_threads) = seccomp_threads(pid)?;
        let own_namespaces = NAMESPACES
            .iter()
            .filter(|ns| {
                let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok();
                let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
                theirs.is_some() && theirs != ours
            })
            .map(|ns| ns.to_string())
            .collect();
        Some(Confinement {
            uid: second("Uid")?,
            gid: second("Gid")?,
            no_capabilities: empty("CapEff") && empty("CapPrm") && empty("CapAmb"),
            no_new_privs: field("NoNewPrivs").as_deref() == Some("1"),
            threads,
            seccomp_filtered_threads,
            own_namespaces,
            root: std::fs::read_link(format!("/proc/{pid}/root")).ok()?.display().to_string(),
        })
    }

    /// Every thread runs under a seccomp filter.
    pub fn seccomp_on_every_thread(&self) -> bool {
        self.threads > 0 && self.seccomp_filtered_threads == self.threads
    }
}

/// What a VMM process gets on this host: forks a child that confines itself as a VMM does
/// (privileges dropped, seccomp filters on unless `seccomp` is off) and reads its own
/// confinement back. `forkvm doctor` shows it. The caller should be single-threaded or
/// not mind that the child copies only the calling thread.
pub fn probe(seccomp: super::seccomp::Seccomp) -> Result<Confinement, String> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let pid = super::process::fork_and_run(false, || {
        // SAFETY: the child's copy of the read end, closed once.
        unsafe { libc::close(fds[0]) };
        let owned = crate::zygote::Owned { seccomp, ..Default::default() };
        let report = match owned.enter(None) {
            Ok(_) => Confinement::of(std::process::id() as i32)
                .ok_or_else(|| "reading /proc/self".to_string())
                .and_then(|c| serde_json::to_string(&c).map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        let text = match report {
            Ok(json) => json,
            Err(e) => format!("error: {e}"),
        };
        // SAFETY: writes a buffer that outlives the call to the pipe's write end.
        unsafe { libc::write(fds[1], text.as_ptr().cast(), text.len()) };
        0
    });
    // SAFETY: the parent's copy of the write end, closed once.
    unsafe { libc::close(fds[1]) };
    // SAFETY: fds[0] is open and owned by nothing else.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let pid = pid.map_err(|e| format!("fork: {e}"))?;
    let mut text = String::new();
    let read = pipe.read_to_string(&mut text);
    let mut status = 0;
    // SAFETY: reaps the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    read.map_err(|e| format!("reading the probe's report: {e}"))?;
    match text.strip_prefix("error: ") {
        Some(e) => Err(e.to_string()),
        None => serde_json::from_str(&text).map_err(|e| format!("the probe said {text:?}: {e}")),
    }
}

/// (threads, threads with `Seccomp: 2`) of process `pid`.
fn seccomp_threads(pid: i32) -> Option<(usize, usize)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let (mut threads, mut filtered) = (0, 0);
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        threads += 1;
        if status.lines().any(|l| l.split_once(':').is_some_and(|(k, v)| k == "Seccomp" && v.trim() == "2")) {
            filtered += 1;
        }
    }
    Some((threads, filtered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_process_reads_as_unconfined_and_sharing_every_namespace() {
        let me = Confinement::of(std::process::id() as i32).unwrap();
        assert!(me.threads >= 1);
        assert_eq!(me.seccomp_filtered_threads, 0);
        assert!(me.own_namespaces.is_empty(), "{:?}", me.own_namespaces);
        assert_eq!(me.root, "/");
        assert!(Confinement::of(i32::MAX).is_none());
    }

    #[test]
    fn a_probe_child_confines_itself_as_a_vmm_does() {
        let c = probe(crate::host::seccomp::Seccomp::Enforce).unwrap();
        assert!(c.seccomp_on_every_thread() && c.no_new_privs && c.no_capabilities, "{c:?}");
        let off = probe(crate::host::seccomp::Seccomp::Off).unwrap();
        assert_eq!(off.seccomp_filtered_threads, 0, "{off:?}");
    }
}
