//! Background prefetch (a playbook replayed by a few threads) and eager materialisation.
//!
//! Prefetch threads take extents from one shared list in playbook order (an atomic
//! cursor), skip extents already local or being fetched by anyone else (a foreground
//! read never waits for a prefetch thread except on the one extent that thread is
//! fetching), persist the cache every [`PERSIST_EVERY_EXTENTS`] fills and once when
//! the last thread ends, and stop between two extents when asked.

use super::{Caller, Got, Playbook, VaultLayer, PERSIST_EVERY_EXTENTS};
use crate::vault::VaultError;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a prefetch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefetchReport {
    /// Extents of the playbook found in the map and not local when it started.
    pub planned: u64,
    /// Extents it fetched.
    pub fetched: u64,
    /// Extents it found local or in flight elsewhere by the time it got to them.
    pub skipped: u64,
    /// Fetches or persists that failed (the extents stay missing; reads retry them).
    pub errors: u64,
    /// Whether it was stopped before the end of the list.
    pub stopped: bool,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    cursor: AtomicUsize,
    running: AtomicUsize,
    fetched: AtomicU64,
    skipped: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

/// A running prefetch. Dropping it stops it (between two extents) and waits.
#[derive(Debug)]
pub struct Prefetcher {
    shared: Arc<Shared>,
    planned: usize,
    handles: Vec<JoinHandle<()>>,
}

impl Prefetcher {
    /// Whether every thread has ended.
    pub fn is_finished(&self) -> bool {
        self.shared.running.load(Ordering::Acquire) == 0
    }

    /// The first error a thread met, if any (as text: the extent is retried by reads).
    pub fn first_error(&self) -> Option<String> {
        self.shared.first_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Waits for the whole playbook to be replayed.
    pub fn wait(mut self) -> PrefetchReport {
        self.join()
    }

    /// Stops after the extents in flight and waits for the threads.
    pub fn stop(mut self) -> PrefetchReport {
        self.shared.stop.store(true, Ordering::Release);
        self.join()
    }

    fn join(&mut self) -> PrefetchReport {
        for h in self.handles.drain(..) {
            // A panicking thread has already reset its extent (FetchGuard).
            let _ = h.join();
        }
        let s = &self.shared;
        PrefetchReport {
            planned: self.planned as u64,
            fetched: s.fetched.load(Ordering::Relaxed),
            skipped: s.skipped.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            stopped: s.cursor.load(Ordering::Relaxed) < self.planned && s.stop.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.join();
    }
}

impl VaultLayer {
    /// Replays `playbook` in the background on `threads` threads (at least 1): fetches
    /// its extents in order, skipping those already local. Returns at once.
    pub fn prefetch(self: &Arc<Self>, playbook: &Playbook, threads: usize) -> Prefetcher {
        let list: Vec<usize> =
            self.extents_for(playbook.blocks()).into_iter().filter(|&i| !self.filled_at(i)).collect();
        let planned = list.len();
        let list = Arc::new(list);
        let shared = Arc::new(Shared::default());
        let n = threads.max(1).min(planned.max(1));
        shared.running.store(n, Ordering::Release);
        let handles = (0..n)
            .map(|k| {
                let (layer, list, shared) = (Arc::clone(self), Arc::clone(&list), Arc::clone(&shared));
                std::thread::Builder::new()
                    .name(format!("vault-prefetch-{k}"))
                    .spawn(move || worker(&layer, &list, &shared))
                    .unwrap_or_else(|e| panic!("spawning a prefetch thread: {e}"))
            })
            .collect();
        Prefetcher { shared, planned, handles }
    }

    /// Fetches every extent not yet local on `threads` threads (at least 1), waiting for
    /// any another thread is fetching, then persists. Returns the first error.
    pub fn materialize_all(&self, threads: usize) -> Result<(), VaultError> {
        let list: Vec<usize> = (0..self.extent_count()).filter(|&i| !self.filled_at(i)).collect();
        let cursor = AtomicUsize::new(0);
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..threads.max(1).min(list.len().max(1)) {
                s.spawn(|| loop {
                    let k = cursor.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = list.get(k) else { break };
                    if let Err(e) = self.ensure(i, Caller::Materialize) {
                        failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
                        cursor.store(list.len(), Ordering::Relaxed);
                        break;
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            return Err(e);
        }
        self.persist()
    }

    fn filled_at(&self, i: usize) -> bool {
        self.lock_state().fill[i] == super::Fill::Filled
    }
}

fn worker(layer: &VaultLayer, list: &[usize], shared: &Shared) {
    let note_error = |e: VaultError| {
        shared.errors.fetch_add(1, Ordering::Relaxed);
        shared.first_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e.to_string());
    };
    while !shared.stop.load(Ordering::Acquire) {
        let k = shared.cursor.fetch_add(1, Ordering::Relaxed);
        let Some(&i) = list.get(k) else { break };
        match layer.ensure(i, Caller::Prefetch) {
            Ok(Got::Fetched) => {
                shared.fetched.fetch_add(1, Ordering::Relaxed);
                if layer.unpersisted() >= PERSIST_EVERY_EXTENTS {
                    layer.persist().unwrap_or_else(note_error);
                }
            }
            Ok(_) => {
                shared.skipped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => note_error(e),
        }
    }
    if shared.running.fetch_sub(1, Ordering::AcqRel) == 1 {
        layer.persist().unwrap_or_else(note_error);
    }
}
