//! Pruning the build cache: the snapshots Dockerfile builds made for their steps
//! (`build-*`) pile up as Dockerfiles change, each one's memory and disk layers held
//! in the store. A prune removes the ones nothing needs: a step snapshot is kept while
//! a tag that is not a build's own sits on it in its chain (the tags builds published,
//! and anything else made over a step), while a sandbox runs from it or from one above
//! it, and, when asked, while it is recent. The rest go, leaves first, through the chain
//! library's own refusal to remove a snapshot something still depends on.
//!
//! A prune and the builds exclude each other: a build holds the build lock shared for
//! its whole run (its newest steps are not yet under any tag), a prune takes it
//! exclusively and is refused while a build runs rather than waiting on it.

use super::{BuildError, STEP_PREFIX};
use crate::registry::Registry;
use forkvm_api::{PruneBuildsReport, PruneBuildsRequest};
use forkvm_snapshot::chain::{self, RemoveMode};
use forkvm_snapshot::Store;
use std::collections::{BTreeMap, BTreeSet};

/// The lock builds hold shared and a prune exclusively.
const BUILDS_LOCK: &str = "builds.lock";

/// The build lock, shared: held by a build for its whole run.
pub(super) fn hold_for_build(store: &Store) -> Result<std::fs::File, BuildError> {
    lock(store, libc::LOCK_SH)
        .map_err(|e| BuildError::Lock(format!("taking the build lock in {}: {e}", lock_dir(store).display())))
}

fn lock_dir(store: &Store) -> std::path::PathBuf {
    store.root().join(super::STEP_LOCK_DIR)
}

fn lock(store: &Store, op: libc::c_int) -> std::io::Result<std::fs::File> {
    let dir = lock_dir(store);
    std::fs::create_dir_all(&dir)?;
    forkvm_snapshot::flock::lock_file(&dir.join(BUILDS_LOCK), op)
}

/// Why a prune did not run.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error("a build is running; prune when it has finished")]
    BuildRunning,
    #[error("the build lock: {0}")]
    Lock(std::io::Error),
    #[error("removing {tag}: {source}")]
    Remove { tag: String, source: Box<chain::ChainError> },
}

impl PruneError {
    pub fn code(&self) -> forkvm_api::ErrorCode {
        match self {
            PruneError::BuildRunning => forkvm_api::ErrorCode::Conflict,
            PruneError::Lock(_) | PruneError::Remove { .. } => forkvm_api::ErrorCode::Internal,
        }
    }
}

/// Removes (or, in a dry run, lists) the step snapshots nothing needs.
pub fn prune(registry: &Registry, store: &Store, req: &PruneBuildsRequest) -> Result<PruneBuildsReport, PruneError> {
    let _excluding_builds = match lock(store, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Err(PruneError::BuildRunning),
        Err(e) => return Err(PruneError::Lock(e)),
    };
    let entries = store.list();
    let parents: BTreeMap<String, Option<String>> =
        entries.iter().map(|e| (e.tag.clone(), e.meta.parent_tag.clone())).collect();
    let now_ms = crate::registry::now_unix_ms();
    let recent = |created_ms: u64| {
        req.older_than_seconds.is_some_and(|s| now_ms.saturating_sub(created_ms) < s.saturating_mul(1000))
    };
    // What must stay: the chains under tags that are not steps, under what sandboxes run
    // from, and recent steps (with their chains).
    let mut roots: Vec<String> = entries
        .iter()
        .filter(|e| !e.tag.starts_with(STEP_PREFIX) || recent(e.meta.created_at_unix_ms))
        .map(|e| e.tag.clone())
        .collect();
    roots.extend(registry.rows().into_iter().filter_map(|r| r.record.source_tag));
    let mut needed = BTreeSet::new();
    for root in roots {
        let mut at = Some(root);
        while let Some(tag) = at {
            if !needed.insert(tag.clone()) {
                break;
            }
            at = parents.get(&tag).cloned().flatten();
        }
    }
    let links: std::collections::HashMap<&str, &str> =
        parents.iter().filter_map(|(t, p)| Some((t.as_str(), p.as_deref()?))).collect();
    let steps: Vec<&String> = parents.keys().filter(|t| t.starts_with(STEP_PREFIX)).collect();
    let mut doomed: Vec<(usize, String)> =
        steps.iter().filter(|t| !needed.contains(**t)).map(|t| (chain::depth_in(&links, t), (*t).clone())).collect();
    // Leaves first: a link deeper in its chain before the link it sits on.
    doomed.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let kept = (steps.len() - doomed.len()) as u32;
    let cache = crate::source::assembled_cache();
    let mut report = PruneBuildsReport { removed: Vec::new(), kept, freed_bytes: 0, dry_run: req.dry_run };
    for (_, tag) in doomed {
        let bytes = chain::info(store, &tag).map(|i| i.physical_bytes + i.disk_bytes).unwrap_or(0);
        if !req.dry_run {
            chain::remove(store, &cache, &tag, RemoveMode::Refuse)
                .map_err(|source| PruneError::Remove { tag: tag.clone(), source: Box::new(source) })?;
        }
        report.freed_bytes += bytes;
        report.removed.push(tag);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prune_is_refused_while_a_build_holds_the_lock_and_runs_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store"));
        let registry = Registry::open(dir.path().join("run"));
        let req = PruneBuildsRequest { dry_run: true, older_than_seconds: None };
        let building = hold_for_build(&store).unwrap();
        let other_build = hold_for_build(&store).unwrap();
        assert!(matches!(prune(&registry, &store, &req), Err(PruneError::BuildRunning)));
        drop((building, other_build));
        let report = prune(&registry, &store, &req).unwrap();
        assert_eq!((report.removed.len(), report.kept, report.dry_run), (0, 0, true));
    }

    #[test]
    fn depth_counts_links_and_ends_on_a_cycle() {
        let chain = [("b", "a"), ("c", "b")].into_iter().collect();
        assert_eq!((chain::depth_in(&chain, "a"), chain::depth_in(&chain, "c")), (0, 2));
        let cycle = [("x", "y"), ("y", "x")].into_iter().collect();
        assert!(chain::depth_in(&cycle, "x") <= 3);
    }
}
