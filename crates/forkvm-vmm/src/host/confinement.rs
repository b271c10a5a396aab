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
/// (in `jail`, if given; privileges dropped, as `ids` if given; seccomp filters on unless
/// `seccomp` is off) and reads its confinement from here while it waits (inside a jail it
/// has no `/proc`).
/// `forkvm doctor` shows it. The caller should be single-threaded or not mind that the
/// child copies only the calling thread.
pub fn probe(
    seccomp: super::seccomp::Seccomp,
    jail: Option<std::sync::Arc<super::jail::JailNamespaces>>,
    ids: Option<super::ids::SandboxIds>,
) -> Result<Confinement, String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let (mut report, report_w) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let owned = crate::zygote::Owned { seccomp, jail: jail.clone(), ids, ..Default::default() };
    let child_end = report_w.as_raw_fd();
    let fork = || {
        super::process::fork_and_run(false, || {
            let mut keep = vec![0, 1, 2, child_end];
            keep.extend(owned.jail_fds());
            super::process::close_fds_except(&keep);
            let text = match owned.enter() {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("error: {e}"),
            };
            // SAFETY: a buffer that outlives the calls, on our end of the pair; then
            // waits (until the parent closes its end) so it can be read from outside.
            unsafe {
                libc::write(child_end, text.as_ptr().cast(), text.len());
                let mut b = 0u8;
                libc::read(child_end, (&mut b as *mut u8).cast(), 1);
            }
            0
        })
    };
    let pid = super::jail::fork_into(jail.as_deref(), fork).map_err(|e| e.to_string())?;
    drop(report_w);
    let pid = pid.map_err(|e| format!("fork: {e}"))?;
    // One message (the child's one small write), then it waits for us to look.
    let mut buf = [0u8; 4096];
    let read = report.read(&mut buf);
    let text = String::from_utf8_lossy(&buf[..*read.as_ref().unwrap_or(&0)]).into_owned();
    let confinement = Confinement::of(pid);
    drop(report);
    let mut status = 0;
    // SAFETY: reaps the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    read.map_err(|e| format!("reading the probe's report: {e}"))?;
    match text.strip_prefix("error: ") {
        Some(e) => Err(e.to_string()),
        None if text == "ok" => confinement.ok_or_else(|| format!("reading /proc/{pid}")),
        None => Err(format!("the probe said {text:?}")),
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
        let c = probe(crate::host::seccomp::Seccomp::Enforce, None, None).unwrap();
        assert!(c.seccomp_on_every_thread() && c.no_new_privs && c.no_capabilities, "{c:?}");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let ids = crate::host::ids::SandboxIds::of(crate::host::ids::SANDBOX_ID_RANGE.start + 5);
            let c = probe(crate::host::seccomp::Seccomp::Enforce, None, Some(ids)).unwrap();
            assert_eq!((c.uid, c.gid), (ids.uid, ids.gid), "{c:?}");
            assert!(c.no_capabilities && c.no_new_privs && c.seccomp_on_every_thread(), "{c:?}");
        }
        let off = probe(crate::host::seccomp::Seccomp::Off, None, None).unwrap();
        assert_eq!(off.seccomp_filtered_threads, 0, "{off:?}");
    }
}
