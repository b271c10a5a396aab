//! Locks on a remote, so that collecting its unreferenced blocks never races a push.
//!
//! Why this exists: a push skips the blocks the remote holds already and writes its
//! manifest last. A collection that deleted such a block between the push's listing and
//! its manifest would leave a tag naming a block that is gone. So a push holds a
//! **shared** lock and a collection an **exclusive** one, as objects under `locks/`:
//!
//! 1. write our lock object, then list `locks/`;
//! 2. a fresh lock of the other side (exclusive for a shared lock; any other for an
//!    exclusive one) means someone got there first: remove ours and fail, naming it.
//!
//! Object stores are strongly consistent for a list after a write (S3 since 2020, GCS,
//! Azure, a directory), so of two lockers racing at least one sees the other, and at
//! worst both back off. A holder rewrites its object every [`REFRESH`]; a lock not
//! rewritten for [`STALE`] (by the store's clock, against this host's: keep them within
//! a few minutes of each other) is a crashed holder's and is ignored, and a holder that
//! could not refresh for longer than [`HELD_FOR`] stops before it commits anything.

use crate::{Remote, RemoteError};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a holder rewrites its lock object.
pub const REFRESH: Duration = Duration::from_secs(5 * 60);
/// A lock object not rewritten for this long is a crashed holder's.
pub const STALE: Duration = Duration::from_secs(30 * 60);
/// A holder whose last refresh is older than this no longer counts on its lock.
pub const HELD_FOR: Duration = Duration::from_secs(20 * 60);
/// Largest lock object read.
const MAX_LOCK_BYTES: usize = 4096;

pub use forkvm_api::remote::{LockInfo, LockKind};

fn prefix(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Shared => "shared",
        LockKind::Exclusive => "exclusive",
    }
}

fn kind_of_name(name: &str) -> Option<LockKind> {
    match name.split_once('-')?.0 {
        "shared" => Some(LockKind::Shared),
        "exclusive" => Some(LockKind::Exclusive),
        _ => None,
    }
}

/// What a lock object says (shown to whoever it stops).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LockBody {
    kind: LockKind,
    host: String,
    pid: u32,
    /// What holds it: `push TAG` or `gc`.
    purpose: String,
    since_unix_ms: u64,
}

/// A lock held on a remote; released (its object removed) when dropped.
pub struct RemoteLock<'a> {
    remote: &'a Remote,
    object: String,
    /// When the object was last written, and whether the holder is done.
    state: Arc<(Mutex<(Instant, bool)>, Condvar)>,
    refresher: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for RemoteLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLock").field("object", &self.object).finish()
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

impl<'a> RemoteLock<'a> {
    /// Takes a `kind` lock on `remote` for `purpose`, or fails naming the lock in the way.
    pub fn acquire(remote: &'a Remote, kind: LockKind, purpose: &str) -> Result<RemoteLock<'a>, RemoteError> {
        let mut nonce = [0u8; 8];
        getrandom::getrandom(&mut nonce).map_err(|e| RemoteError::Refused {
            url: remote.url().into(),
            object: "locks/".into(),
            reason: format!("naming a lock: {e}"),
        })?;
        let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("{}-{hex}", prefix(kind));
        let object = format!("locks/{name}");
        let body = LockBody {
            kind,
            host: hostname(),
            pid: std::process::id(),
            purpose: purpose.chars().take(200).collect(),
            since_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        remote.put(&object, bytes.clone())?;
        let state = Arc::new((Mutex::new((Instant::now(), false)), Condvar::new()));
        let mut lock = RemoteLock { remote, object, state, refresher: None };
        // `lock` removes our object if anything below fails.
        if let Some(other) = lock.conflict(kind, &name)? {
            let reason = match remote.get(&format!("locks/{other}")).ok().flatten() {
                Some(b) if b.len() <= MAX_LOCK_BYTES => match serde_json::from_slice::<LockBody>(&b) {
                    Ok(o) => format!("{} on host {:?} (pid {}) holds a lock", o.purpose, o.host, o.pid),
                    Err(_) => "an unreadable lock is there".into(),
                },
                _ => "a lock is there".into(),
            };
            return Err(RemoteError::Locked { url: remote.url().into(), object: format!("locks/{other}"), reason });
        }
        lock.refresher = Some(lock.spawn_refresher(bytes));
        Ok(lock)
    }

    /// A fresh lock other than ours that excludes a `kind` lock.
    fn conflict(&self, kind: LockKind, ours: &str) -> Result<Option<String>, RemoteError> {
        let now = SystemTime::now();
        for listed in self.remote.listing("locks")? {
            if listed.name == ours {
                continue;
            }
            let Some(theirs) = kind_of_name(&listed.name) else { continue };
            let age = now.duration_since(listed.modified).unwrap_or(Duration::ZERO);
            if age >= STALE {
                continue;
            }
            if kind == LockKind::Exclusive || theirs == LockKind::Exclusive {
                return Ok(Some(listed.name));
            }
        }
        Ok(None)
    }

    fn spawn_refresher(&self, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
        let (state, object) = (self.state.clone(), self.object.clone());
        // The refresher needs its own handle on the remote: it outlives no borrow of ours
        // because `Drop` joins it, but threads want 'static, so it reopens the URL.
        let url = self.remote.url().to_string();
        std::thread::Builder::new()
            .name("remote-lock".into())
            .spawn(move || {
                let Ok(remote) = Remote::open(&url) else { return };
                let (lock, wake) = &*state;
                let mut guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    // Released before this thread got here, or while it waited.
                    if guard.1 {
                        return;
                    }
                    let (g, _) = wake.wait_timeout(guard, REFRESH).unwrap_or_else(|p| p.into_inner());
                    guard = g;
                    if guard.1 {
                        return;
                    }
                    drop(guard);
                    let wrote = remote.put(&object, bytes.clone()).is_ok();
                    guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                    if wrote {
                        guard.0 = Instant::now();
                    }
                }
            })
            .expect("spawning the remote lock's refresher")
    }

    /// Fails unless the lock was refreshed recently enough to still count: call it just
    /// before committing (a push's manifest).
    pub fn check_held(&self) -> Result<(), RemoteError> {
        let last = self.state.0.lock().unwrap_or_else(|p| p.into_inner()).0;
        if last.elapsed() > HELD_FOR {
            return Err(RemoteError::Locked {
                url: self.remote.url().into(),
                object: self.object.clone(),
                reason: format!("our lock was not refreshed for {} s; not committing", last.elapsed().as_secs()),
            });
        }
        Ok(())
    }
}

impl Drop for RemoteLock<'_> {
    fn drop(&mut self) {
        let (lock, wake) = &*self.state;
        lock.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        wake.notify_all();
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
        let _ = self.remote.delete(&self.object);
    }
}

/// Every lock on `remote`, oldest first.
pub fn list_locks(remote: &Remote) -> Result<Vec<LockInfo>, RemoteError> {
    let now = SystemTime::now();
    let mut out = Vec::new();
    for listed in remote.listing("locks")? {
        let Some(kind) = kind_of_name(&listed.name) else { continue };
        let age = now.duration_since(listed.modified).unwrap_or(Duration::ZERO);
        let body = match remote.get(&format!("locks/{}", listed.name)) {
            Ok(Some(b)) if b.len() <= MAX_LOCK_BYTES => serde_json::from_slice::<LockBody>(&b).ok(),
            Ok(_) => None,
            Err(e) => return Err(e),
        };
        out.push(LockInfo {
            name: listed.name,
            kind,
            host: body.as_ref().map(|b| b.host.clone()),
            pid: body.as_ref().map(|b| b.pid),
            purpose: body.map(|b| b.purpose),
            age_s: age.as_secs(),
            stale: age >= STALE,
        });
    }
    out.sort_by(|a, b| b.age_s.cmp(&a.age_s).then_with(|| a.name.cmp(&b.name)));
    Ok(out)
}

/// Whether `name` is a lock object's name: `shared-` or `exclusive-` and 16 hex digits.
fn is_lock_name(name: &str) -> bool {
    let hex = name.split_once('-').map_or("", |(_, hex)| hex);
    kind_of_name(name).is_some() && hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Removes the lock `name` (as [`list_locks`] names it), for an operator who knows its
/// holder is gone: a push killed half-way leaves a lock that blocks collections until it
/// goes stale. Returns what the lock said. Breaking a live holder's lock lets a collection
/// race its push: the push's tag may then name a block that is gone.
pub fn break_lock(remote: &Remote, name: &str) -> Result<LockInfo, RemoteError> {
    if !is_lock_name(name) {
        return Err(RemoteError::BadLockName { url: remote.url().into(), name: name.chars().take(200).collect() });
    }
    let info = list_locks(remote)?
        .into_iter()
        .find(|l| l.name == name)
        .ok_or_else(|| RemoteError::NoLock { url: remote.url().into(), name: name.into() })?;
    remote.delete(&format!("locks/{name}"))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(dir: &std::path::Path) -> Remote {
        Remote::open(&format!("file://{}", dir.display())).unwrap()
    }

    #[test]
    fn pushes_share_and_a_collection_is_alone() {
        let dir = tempfile::tempdir().unwrap();
        let r = remote(dir.path());
        let a = RemoteLock::acquire(&r, LockKind::Shared, "push a").unwrap();
        let b = RemoteLock::acquire(&r, LockKind::Shared, "push b").unwrap();
        let err = RemoteLock::acquire(&r, LockKind::Exclusive, "gc").unwrap_err();
        assert!(matches!(err, RemoteError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("holds a lock"), "{err}");
        assert_eq!(r.list("locks").unwrap().len(), 2, "the refused lock's object is gone");
        drop((a, b));
        assert!(r.list("locks").unwrap().is_empty(), "released locks leave nothing");
        let gc = RemoteLock::acquire(&r, LockKind::Exclusive, "gc").unwrap();
        let err = RemoteLock::acquire(&r, LockKind::Shared, "push c").unwrap_err();
        assert!(err.to_string().contains("gc on host"), "{err}");
        assert!(RemoteLock::acquire(&r, LockKind::Exclusive, "gc 2").is_err());
        gc.check_held().unwrap();
        drop(gc);
        RemoteLock::acquire(&r, LockKind::Shared, "push d").unwrap();
    }

    #[test]
    fn a_stale_lock_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let r = remote(dir.path());
        r.put("locks/exclusive-0123456789abcdef", b"{}".to_vec()).unwrap();
        let path = dir.path().join("locks/exclusive-0123456789abcdef");
        let old = SystemTime::now() - STALE - Duration::from_secs(60);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
        let lock = RemoteLock::acquire(&r, LockKind::Shared, "push").unwrap();
        drop(lock);
        // A fresh one is not.
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(SystemTime::now()).unwrap();
        let err = RemoteLock::acquire(&r, LockKind::Shared, "push").unwrap_err();
        assert!(err.to_string().contains("unreadable lock"), "{err}");
    }

    #[test]
    fn locks_are_listed_and_broken_by_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let r = remote(dir.path());
        let held = RemoteLock::acquire(&r, LockKind::Shared, "push d1").unwrap();
        r.put("locks/exclusive-00000000000000ff", b"not json".to_vec()).unwrap();
        r.put("locks/README", b"someone else's".to_vec()).unwrap();
        let locks = list_locks(&r).unwrap();
        assert_eq!(locks.len(), 2, "{locks:?}");
        let ours = locks.iter().find(|l| l.kind == LockKind::Shared).unwrap();
        assert_eq!(ours.purpose.as_deref(), Some("push d1"));
        assert_eq!(ours.pid, Some(std::process::id()));
        assert!(!ours.stale);
        let odd = locks.iter().find(|l| l.kind == LockKind::Exclusive).unwrap();
        assert_eq!((odd.host.as_deref(), odd.purpose.as_deref()), (None, None));

        for bad in ["README", "../chunks/x", "shared-0123", "shared-0123456789abcdeg", "other-0123456789abcdef", ""] {
            let err = break_lock(&r, bad).unwrap_err();
            assert!(matches!(err, RemoteError::BadLockName { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("not a lock's name"), "{bad}: {err}");
        }
        let err = break_lock(&r, "exclusive-0123456789abcdef").unwrap_err();
        assert!(matches!(err, RemoteError::NoLock { .. }), "{err}");
        assert!(dir.path().join("locks/README").exists(), "nothing else removed");

        // A collection is refused while the push's lock is there, and runs once it is broken.
        break_lock(&r, "exclusive-00000000000000ff").unwrap();
        assert!(RemoteLock::acquire(&r, LockKind::Exclusive, "gc").is_err());
        let name = ours.name.clone();
        let broken = break_lock(&r, &name).unwrap();
        assert_eq!(broken.purpose.as_deref(), Some("push d1"));
        RemoteLock::acquire(&r, LockKind::Exclusive, "gc").unwrap();
        assert!(list_locks(&r).unwrap().is_empty());
        // The broken holder's release removes nothing of anyone else's.
        drop(held);
        assert!(dir.path().join("locks/README").exists());
    }
}
