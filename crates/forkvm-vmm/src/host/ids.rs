//! A sandbox's own user and group ids, which its VMM takes as it confines itself.
//!
//! Why: VMMs of one spawner share a jail (`host::jail`), so without ids of their own
//! they would all be root without capabilities, the owner of every file in the store
//! and of every other sandbox's run directory. Under its sandbox's uid a VMM owns its
//! run directory and nothing else; the files it reads from the store it opened before
//! (`host::preopen`). The registry hands each sandbox a uid from [`SANDBOX_ID_RANGE`]
//! that no other live sandbox has; a fork of a running sandbox shares its source's
//! (it is born from that VMM, already under its uid). The gid is the same number.

use std::ops::Range;

/// The ids sandboxes get: 65536 ids from 0x7FFC0000 (2147221504), below systemd's
/// "foreign" range (0x7FFE0000, used by image builds) and forkvm's client gid, and above
/// the ranges systemd gives users, dynamic users and containers.
pub const SANDBOX_ID_RANGE: Range<u32> = 0x7FFC_0000..0x7FFD_0000;

/// One sandbox's uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxIds {
    pub uid: u32,
    pub gid: u32,
}

impl SandboxIds {
    /// The ids of sandbox uid `uid` (its gid is the same number).
    pub fn of(uid: u32) -> SandboxIds {
        SandboxIds { uid, gid: uid }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("becoming uid {uid} / gid {gid}: {step}: {source}")]
pub struct IdsError {
    uid: u32,
    gid: u32,
    step: &'static str,
    source: std::io::Error,
}

/// Makes the calling process (single-threaded: ids are per thread in the kernel, the C
/// library's set*id calls set them on every thread) `ids` alone: no supplementary group,
/// real, effective and saved ids all the sandbox's. Its capabilities go with uid 0.
pub fn become_sandbox(ids: SandboxIds) -> Result<(), IdsError> {
    let err = |step| IdsError { uid: ids.uid, gid: ids.gid, step, source: std::io::Error::last_os_error() };
    // SAFETY: setgroups with an empty list reads no memory.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(err("dropping supplementary groups"));
    }
    // SAFETY: plain integer arguments.
    if unsafe { libc::setresgid(ids.gid, ids.gid, ids.gid) } != 0 {
        return Err(err("setting the gids"));
    }
    // SAFETY: plain integer arguments.
    if unsafe { libc::setresuid(ids.uid, ids.uid, ids.uid) } != 0 {
        return Err(err("setting the uids"));
    }
    Ok(())
}
