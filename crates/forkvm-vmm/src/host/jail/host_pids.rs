//! Host pids of VMMs that a jailed VMM forked (a fork of a running sandbox).
//!
//! A VMM in a jail lives in its pid namespace, so the pids it reports for the children it
//! forks are that namespace's. The daemon, which signals and watches VMMs by their pid in
//! its own namespace, translates them: a child of the source is listed in
//! `/proc/<source>/task/<tid>/children`, and its `NSpid` line gives both its pid here and
//! its pid in the namespace.

use std::collections::HashMap;

/// For each of `ns_pids` (children of the VMM whose pid here is `source`, as its own pid
/// namespace numbers them), its pid in ours; None for one that is not (any more) a child
/// of `source`. A source in our own pid namespace needs no translation.
pub fn host_pids_of_children(source: i32, ns_pids: &[i32]) -> Vec<Option<i32>> {
    let Some(levels) = ns_pid_line(source) else { return vec![None; ns_pids.len()] };
    if levels.len() < 2 {
        return ns_pids.iter().map(|p| Some(*p)).collect();
    }
    // A child is listed under the thread that forked it; if that thread ends (a control
    // connection's), its children move to another thread, and a scan that races the move
    // can miss them: scan again, briefly.
    let mut inner_to_host = HashMap::new();
    for _ in 0..SCANS {
        scan_children(source, &mut inner_to_host);
        if ns_pids.iter().all(|p| inner_to_host.contains_key(p)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    ns_pids.iter().map(|p| inner_to_host.get(p).copied()).collect()
}

/// How many times the children are scanned for one that is missing (2 ms apart).
const SCANS: usize = 50;

/// Adds every child of every thread of `source` to `inner_to_host`.
fn scan_children(source: i32, inner_to_host: &mut HashMap<i32, i32>) {
    let tasks = std::fs::read_dir(format!("/proc/{source}/task")).into_iter().flatten().flatten();
    for task in tasks {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else { continue };
        for host in children.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            if let Some(inner) = ns_pid_line(host).and_then(|l| l.last().copied()) {
                inner_to_host.insert(inner, host);
            }
        }
    }
}

/// Process `pid`'s pids from our namespace inward (`NSpid` of its status).
fn ns_pid_line(pid: i32) -> Option<Vec<i32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    Some(line.split_whitespace().filter_map(|p| p.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own children in our namespace translate to themselves; a pid that is not a
    /// child, and an unknown source, to nothing.
    #[test]
    fn children_in_our_own_namespace_keep_their_pids() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id() as i32;
        let got = host_pids_of_children(me, &[child.id() as i32]);
        assert_eq!(got, vec![Some(child.id() as i32)]);
        assert_eq!(host_pids_of_children(i32::MAX, &[1]), vec![None]);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
