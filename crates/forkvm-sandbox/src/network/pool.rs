//! Slots made ahead of time: linking a namespace to its uplink costs milliseconds (a
//! veth pair, addresses, the namespace's rules through `nft`), which a spawn must not pay
//! per child. A filler thread keeps [`POOL_ENV`] slots ready (16 by default, 0 for none)
//! at the lowest CPU priority, so it runs when spawns and guests leave a CPU free;
//! [`take`] hands out a ready one, or makes one on the spot when none is.
//!
//! The filler starts with the first [`take`] or with [`start`] (the daemon, at start-up),
//! and refills once takes have paused for a moment (a fan-out is not slowed by it).
//! A ready slot is a fresh namespace no sandbox has used: nothing in it to clean, and
//! dropping the pool (the process ending) removes it whole.

use super::{NetSlot, NetworkError};
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How many slots to keep ready (a number; 0 turns the pool off).
pub const POOL_ENV: &str = "FORKVM_NET_POOL";
const DEFAULT_READY: usize = 16;
/// Wait after a failed fill before the next try.
const RETRY: Duration = Duration::from_secs(2);
/// How long after the last [`take`] the filler waits before it makes slots again: a
/// fan-out takes its slots without the filler's work (its `nft` runs, namespaces) on
/// the CPUs it spawns on.
const QUIET: Duration = Duration::from_millis(250);

#[derive(Debug)]
struct Pool {
    ready: Mutex<VecDeque<NetSlot>>,
    wanted: Condvar,
    target: usize,
    filler: OnceLock<()>,
    /// When a slot was last taken.
    last_take: Mutex<Option<Instant>>,
}

fn shared() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let target = match std::env::var(POOL_ENV) {
            Ok(v) => v.trim().parse().unwrap_or_else(|_| {
                tracing::warn!(value = %v, "{POOL_ENV} is not a number: {DEFAULT_READY} slots kept ready");
                DEFAULT_READY
            }),
            Err(_) => DEFAULT_READY,
        };
        Pool {
            ready: Mutex::new(VecDeque::new()),
            wanted: Condvar::new(),
            target,
            filler: OnceLock::new(),
            last_take: Mutex::new(None),
        }
    })
}

/// Starts filling the pool (once per process).
pub fn start() {
    let pool = shared();
    if pool.target == 0 {
        return;
    }
    pool.filler.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("net-pool".into()).spawn(|| fill(shared()));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to fill the network pool: slots are made on demand");
        }
    });
}

/// A slot for one sandbox: a ready one, or one made now.
pub fn take() -> Result<NetSlot, NetworkError> {
    start();
    let pool = shared();
    *pool.last_take.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    let ready = pool.ready.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
    pool.wanted.notify_one();
    match ready {
        Some(slot) => Ok(slot),
        None => NetSlot::create(),
    }
}

/// How many slots the filler keeps ready ([`POOL_ENV`]).
pub fn target() -> usize {
    shared().target
}

/// How many slots are ready now.
pub fn ready() -> usize {
    shared().ready.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// The filler: makes a slot whenever fewer than the target are ready.
fn fill(pool: &Pool) {
    lowest_priority();
    loop {
        {
            let ready = pool.ready.lock().unwrap_or_else(|p| p.into_inner());
            let _unused = pool.wanted.wait_while(ready, |r| r.len() >= pool.target).unwrap_or_else(|p| p.into_inner());
        }
        let last_take = *pool.last_take.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(wait) = last_take.and_then(|t| QUIET.checked_sub(t.elapsed())) {
            std::thread::sleep(wait);
            continue;
        }
        match NetSlot::create() {
            Ok(slot) => pool.ready.lock().unwrap_or_else(|p| p.into_inner()).push_back(slot),
            Err(e) => {
                tracing::warn!(error = %e, "filling the network pool failed; trying again in {RETRY:?}");
                std::thread::sleep(RETRY);
            }
        }
    }
}

/// Nice 19 for the calling thread (Linux sets priority per thread).
fn lowest_priority() {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_ready_from_the_filler_and_each_is_a_namespace_of_its_own() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: sandbox networks need root");
            return;
        }
        // Never the host's network from a test: this binary's slots get no uplink.
        let _ = super::super::uplink::configure(super::super::uplink::Uplink::None);
        assert!(matches!(super::super::uplink::current(), Ok(super::super::uplink::Uplink::None)));
        let first = take().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while ready() < shared().target.min(4) {
            assert!(std::time::Instant::now() < deadline, "the filler made {} slots in 30 s", ready());
            std::thread::sleep(Duration::from_millis(20));
        }
        let taken: Vec<NetSlot> = (0..3).map(|_| take().unwrap()).collect();
        let inode = |s: &NetSlot| {
            use std::os::fd::AsRawFd;
            let meta = std::fs::metadata(format!("/proc/self/fd/{}", s.namespace().as_raw_fd())).unwrap();
            std::os::unix::fs::MetadataExt::ino(&meta)
        };
        let mut inodes: Vec<u64> = taken.iter().chain([&first]).map(inode).collect();
        inodes.sort();
        inodes.dedup();
        assert_eq!(inodes.len(), 4, "every slot is a namespace of its own");
    }
}
