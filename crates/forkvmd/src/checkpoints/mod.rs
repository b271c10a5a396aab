//! Checkpoints and rewind in the daemon: when a sandbox is checkpointed (on request, on
//! a timer, after each exec/eval call), how many are kept, and putting a sandbox back to
//! one of them in place.
//!
//! A checkpoint is taken by `forkvm_sandbox::checkpoint::take` (a live diff branch over
//! the sandbox's base) under the sandbox's lock, the one disk snapshots, archive and
//! restore take, so none of them runs beside it; a rewind takes the same lock. The
//! snapshot is named `ckpt-<id>-<seq>` and listed with the other snapshots, so forking
//! children from a checkpoint is an ordinary spawn from its tag. Past `keep`, the
//! oldest checkpoint is removed (one a running sandbox was rewound to, or forked from,
//! stays until it is no longer used). Killing a sandbox removes its checkpoints.

pub mod records;

use crate::error::ApiError;
use crate::routes::sandboxes::running;
use crate::state::AppState;
use crate::views::{snapshot_info, snapshot_row};
use forkvm_api::{CheckpointInfo, CheckpointList, RewindReport, RewindRequest};
use forkvm_sandbox::registry::now_unix_ms;
use forkvm_sandbox::SandboxState;
use forkvm_snapshot::chain::{self, RemoveMode};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What took a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Api,
    Interval,
    Exec,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Api => "api",
            Trigger::Interval => "interval",
            Trigger::Exec => "exec",
        }
    }
}

fn db_err(step: &str) -> impl FnOnce(crate::db::DbError) -> ApiError + '_ {
    move |e| ApiError::internal(format!("{step}: {e}"))
}

/// The snapshot tag of sandbox `id`'s checkpoint `seq`.
pub fn tag_of(id: &str, seq: u64) -> String {
    format!("ckpt-{id}-{seq}")
}

/// Checks a note: bounded, one line of printable text is not required, but no NULs.
pub fn check_note(note: &str) -> Result<(), ApiError> {
    if note.len() > forkvm_api::checkpoints::MAX_NOTE {
        return Err(ApiError::bad_request(format!(
            "note is {} bytes; at most {} are kept",
            note.len(),
            forkvm_api::checkpoints::MAX_NOTE
        )));
    }
    if note.contains('\0') {
        return Err(ApiError::bad_request("note contains a NUL byte"));
    }
    Ok(())
}

/// A note from a call's text: its first line, cut to the bound on a character boundary.
pub fn note_of_call(kind: &str, text: &str) -> String {
    let first = text.lines().next().unwrap_or("");
    let mut note = format!("{kind}: {first}");
    let max = forkvm_api::checkpoints::MAX_NOTE;
    if note.len() > max {
        let mut cut = max - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note.replace('\0', "")
}

/// Checkpoints running sandbox `id` now (blocking; the caller holds its lock). `paused`
/// is called once the sandbox runs again, its state captured (see
/// `forkvm_sandbox::checkpoint::take`).
pub fn take_locked(
    s: &AppState,
    id: &str,
    trigger: Trigger,
    note: Option<String>,
    paused: &mut dyn FnMut(),
) -> Result<CheckpointInfo, ApiError> {
    running(s, id)?;
    let known_base = records::policy(&s.db(), id).map_err(db_err("reading its checkpoint policy"))?;
    let base = base_of(s, id, known_base.as_ref())?;
    let (seq, base) = records::claim_seq(&s.db(), id, &base).map_err(db_err("numbering the checkpoint"))?;
    let tag = tag_of(id, seq);
    let _claim =
        s.claim_tag(&tag).ok_or_else(|| ApiError::conflict(format!("checkpoint {tag:?} is being taken"), "writing"))?;
    let previous = records::list(&s.db(), id).unwrap_or_default().pop().map(|c| c.tag);
    let taken = forkvm_sandbox::checkpoint::take(&s.registry, &s.store, id, &base, &tag, previous.as_deref(), paused)?;
    let info = CheckpointInfo {
        sandbox_id: id.to_string(),
        seq,
        tag: tag.clone(),
        created_at_unix_ms: now_unix_ms(),
        trigger: trigger.as_str().to_string(),
        note,
        pause_ms: taken.pause_ms,
        pages: taken.pages,
        bytes_stored: taken.bytes_stored + taken.disk_bytes_stored,
        disk_bytes_stored: taken.disk_bytes_stored,
        total_ms: taken.total_ms,
    };
    records::insert(&s.db(), &info).map_err(db_err("recording the checkpoint"))?;
    if let Some(e) = s.store.entry(&tag) {
        let _ = s.db().upsert_snapshot(&snapshot_row(&snapshot_info(&s.store, &e, None)));
    }
    s.metrics.inc("forkvm_checkpoints_total", &[("trigger", trigger.as_str())]);
    s.metrics.observe("forkvm_checkpoint_pause_seconds", &[], taken.pause_ms / 1e3);
    let policy = known_base.map(|p| p.policy).unwrap_or_default();
    thin(s, id, &policy);
    Ok(info)
}

/// The snapshot sandbox `id`'s checkpoints are diffs over: the one its first checkpoint
/// fixed, else the tag it was spawned from (none for a fork of a running sandbox: an
/// error that says so).
pub fn base_of(s: &AppState, id: &str, known: Option<&records::PolicyRow>) -> Result<String, ApiError> {
    match known.and_then(|p| p.base_tag.clone()) {
        Some(b) => Ok(b),
        None => Ok(forkvm_sandbox::chain_ops::diff_parent(&s.registry, id)?),
    }
}

/// Sandbox `id`'s checkpoints past its policy's bounds, removed (blocking). One a
/// sandbox runs from (rewound to it, or forked from it) or that another snapshot depends
/// on stays.
pub fn thin(s: &AppState, id: &str, policy: &forkvm_api::CheckpointPolicy) {
    let list = records::list(&s.db(), id).unwrap_or_default();
    for c in past_bounds(&list, policy, now_unix_ms()) {
        if remove_snapshot(s, &c.tag) {
            let _ = records::delete(&s.db(), id, c.seq);
        }
    }
}

/// The checkpoints of `list` (oldest first, as they were taken) that `policy` does not
/// keep at `now_ms`, oldest first. First the thinning: of those older than
/// `thin_after_seconds`, only the newest of each `thin_every_seconds` of time stays.
/// Then, oldest first: past `keep` of them, while the kept ones added more than
/// `max_stored_mib`, or older than `max_age_seconds`. The newest always stays.
fn past_bounds<'a>(
    list: &'a [CheckpointInfo],
    policy: &forkvm_api::CheckpointPolicy,
    now_ms: u64,
) -> Vec<&'a CheckpointInfo> {
    let Some(newest) = list.len().checked_sub(1) else { return Vec::new() };
    let mut gone = vec![false; list.len()];
    if let (Some(after), Some(every)) = (policy.thin_after_seconds, policy.thin_every_seconds) {
        let thinned_before_ms = now_ms.saturating_sub(after.saturating_mul(1000));
        let stretch = |c: &CheckpointInfo| c.created_at_unix_ms / every.saturating_mul(1000).max(1);
        for i in 0..newest {
            let (this, next) = (&list[i], &list[i + 1]);
            gone[i] = next.created_at_unix_ms < thinned_before_ms && stretch(this) == stretch(next);
        }
    }
    let quota = policy.max_stored_mib.map_or(u64::MAX, |m| m.saturating_mul(1 << 20));
    let oldest_kept_ms = policy.max_age_seconds.map_or(0, |a| now_ms.saturating_sub(a.saturating_mul(1000)));
    let kept: Vec<&CheckpointInfo> = list.iter().zip(&gone).filter(|(_, g)| !**g).map(|(c, _)| c).collect();
    let mut count = kept.len();
    let mut stored: u64 = kept.iter().map(|c| c.bytes_stored).sum();
    for i in 0..newest {
        if gone[i] {
            continue;
        }
        let c = &list[i];
        if count <= policy.keep as usize && stored <= quota && c.created_at_unix_ms >= oldest_kept_ms {
            break;
        }
        gone[i] = true;
        count -= 1;
        stored -= c.bytes_stored;
    }
    list.iter().zip(gone).filter(|(_, g)| *g).map(|(c, _)| c).collect()
}

/// Removes checkpoint snapshot `tag` unless something still uses it; whether it is gone.
fn remove_snapshot(s: &AppState, tag: &str) -> bool {
    if !s.registry.spawned_from(tag).is_empty() {
        return false;
    }
    match chain::remove(&s.store, &s.cache, tag, RemoveMode::Refuse) {
        Ok(report) => {
            for t in &report.removed {
                let _ = s.db().delete_snapshot(t);
            }
            true
        }
        Err(forkvm_snapshot::chain::ChainError::Store(forkvm_snapshot::StoreError::NotFound { .. })) => {
            let _ = s.db().delete_snapshot(tag);
            true
        }
        Err(e) => {
            tracing::debug!(%tag, error = %e, "a checkpoint stays: it could not be removed (another snapshot depends on it?); tried again later");
            false
        }
    }
}

/// Removes killed sandbox `id`'s checkpoints (blocking): each snapshot nothing else uses
/// goes with its row; one a running child was forked from keeps its row, so the sweep
/// ([`sweep_orphans`]) removes it once that child is gone. The policy goes with the
/// last row. Returns whether nothing of `id` is left.
pub fn forget(s: &AppState, id: &str) -> bool {
    // Read first: the database's lock must not be held while snapshots are removed.
    let list = records::list(&s.db(), id).unwrap_or_default();
    let mut kept = 0;
    for c in &list {
        if remove_snapshot(s, &c.tag) {
            let _ = records::delete(&s.db(), id, c.seq);
        } else {
            kept += 1;
        }
    }
    kept == 0 && records::delete_all(&s.db(), id).is_ok()
}

/// Refuses (409) while a running sandbox was started from one of sandbox `id`'s
/// checkpoints: their memory is sealed with `id`'s key, which a purge shreds.
pub fn check_none_in_use(s: &AppState, id: &str) -> Result<(), ApiError> {
    let list = records::list(&s.db(), id).map_err(db_err("listing its checkpoints"))?;
    for c in &list {
        let users: Vec<String> = s.registry.spawned_from(&c.tag).into_iter().filter(|u| u != id).collect();
        if !users.is_empty() {
            return Err(ApiError::conflict(
                format!(
                    "sandbox {id}'s checkpoint {} is in use by {}: its memory is sealed with the key a purge \
                     shreds; kill those first, or delete without purge",
                    c.seq,
                    users.join(", ")
                ),
                "in_use",
            ));
        }
    }
    Ok(())
}

/// Forgets the checkpoints of every sandbox that no longer exists (blocking): killed
/// outside this daemon (the CLI's own `kill`), while it was down, or by its lifecycle;
/// and those [`forget`] kept for a child that has since gone. A sandbox whose lock is
/// held (a rewind, a kill, a checkpoint) is left for the next sweep. Run at start
/// (`reconcile`) and by the daemon's sweeper. Returns the ids whose checkpoints were
/// all removed.
pub fn sweep_orphans(s: &AppState) -> Vec<String> {
    let ids = match records::sandboxes(&s.db()) {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e, "listing the sandboxes with checkpoints");
            return Vec::new();
        }
    };
    let mut swept = Vec::new();
    for id in ids {
        let lock = s.disk.sandbox_lock(&id);
        let Ok(_held) = lock.try_lock() else { continue };
        if s.sandbox_row(&id).is_some() {
            continue;
        }
        if forget(s, &id) {
            swept.push(id);
        }
    }
    swept
}

/// Checkpoints sandbox `id` under its lock.
pub async fn checkpoint(
    s: &AppState,
    id: &str,
    trigger: Trigger,
    note: Option<String>,
) -> Result<CheckpointInfo, ApiError> {
    let lock = s.disk.sandbox_lock(id);
    let _held = lock.lock().await;
    let id = id.to_string();
    s.blocking(move |s| take_locked(&s, &id, trigger, note, &mut || {})).await
}

/// After an exec or eval call on sandbox `id` (blocking, on the call's thread): a
/// checkpoint if its policy asks for one after every call. The call answers once the
/// sandbox's state is captured (the checkpoint's pause, a few ms), before anything else
/// reaches the guest; its memory is written and compared on a thread of its own under
/// the sandbox's lock, which the list, a rewind and the next checkpoint wait for. A
/// failure is logged, not the call's.
pub fn after_call(s: &AppState, id: &str, kind: &str, text: &str) {
    let wanted = records::policy(&s.db(), id).ok().flatten().is_some_and(|p| p.policy.after_exec);
    if !wanted {
        return;
    }
    let (captured, wait) = std::sync::mpsc::channel::<()>();
    let (s, id, note) = (s.clone(), id.to_string(), note_of_call(kind, text));
    let taking = std::thread::Builder::new().name("checkpoint".into()).spawn(move || {
        let lock = s.disk.sandbox_lock(&id);
        let _held = lock.blocking_lock();
        let mut paused = || {
            let _ = captured.send(());
        };
        if let Err(e) = take_locked(&s, &id, Trigger::Exec, Some(note), &mut paused) {
            tracing::warn!(sandbox_id = %id, error = %e.message, "a checkpoint after a call failed");
        }
    });
    match taking {
        // Woken by the pause's end, or by the thread ending without one (a failure).
        Ok(_) => {
            let _ = wait.recv();
        }
        Err(e) => tracing::warn!(error = %e, "starting a checkpoint's thread failed"),
    }
}

/// The list of sandbox `id`'s checkpoints, with its policy.
pub fn list(s: &AppState, id: &str) -> Result<CheckpointList, ApiError> {
    let known = s.sandbox_row(id).is_some();
    let policy = records::policy(&s.db(), id).map_err(db_err("reading its checkpoint policy"))?;
    if !known {
        return Err(ApiError::not_found(format!("sandbox {id:?} not found")));
    }
    let checkpoints = records::list(&s.db(), id).map_err(db_err("listing its checkpoints"))?;
    let (policy, base_tag) = policy.map(|p| (p.policy, p.base_tag)).unwrap_or_default();
    Ok(CheckpointList { sandbox_id: id.to_string(), policy, base_tag, checkpoints })
}

/// The checkpoint a rewind asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RewindTarget {
    Seq(u64),
    /// The newest at least this many seconds old.
    Ago(f64),
}

impl RewindTarget {
    /// The target of a request (exactly one of `seq` and a finite, non-negative
    /// `ago_seconds`), checked before anything is looked up.
    pub fn of(req: &RewindRequest) -> Result<RewindTarget, ApiError> {
        match (req.seq, req.ago_seconds) {
            (Some(seq), None) => Ok(RewindTarget::Seq(seq)),
            (None, Some(ago)) if ago.is_finite() && ago >= 0.0 => Ok(RewindTarget::Ago(ago)),
            (None, Some(ago)) => Err(ApiError::bad_request(format!("ago_seconds must be 0 or more, got {ago}"))),
            _ => Err(ApiError::bad_request("name exactly one of seq and ago_seconds")),
        }
    }

    /// The checkpoint of `list` it names at `now_ms`.
    fn find(self, list: &[CheckpointInfo], now_ms: u64) -> Result<CheckpointInfo, ApiError> {
        let found = match self {
            RewindTarget::Seq(seq) => list.iter().find(|c| c.seq == seq),
            RewindTarget::Ago(ago) => {
                let cutoff = now_ms.saturating_sub((ago * 1e3) as u64);
                list.iter().rev().find(|c| c.created_at_unix_ms <= cutoff)
            }
        };
        found.cloned().ok_or_else(|| {
            let what = match self {
                RewindTarget::Seq(seq) => format!("no checkpoint {seq}"),
                RewindTarget::Ago(ago) => format!("no checkpoint is {ago} s old or older"),
            };
            ApiError::not_found(format!("{what} (kept: {})", seqs(list)))
        })
    }
}

fn seqs(list: &[CheckpointInfo]) -> String {
    match list {
        [] => "none".into(),
        _ => list.iter().map(|c| c.seq.to_string()).collect::<Vec<_>>().join(", "),
    }
}

/// Puts sandbox `id` back at a checkpoint, in place.
pub async fn rewind(s: &AppState, id: &str, target: RewindTarget) -> Result<RewindReport, ApiError> {
    let lock = s.disk.sandbox_lock(id);
    let _held = lock.lock().await;
    let id = id.to_string();
    let out = s
        .blocking(move |s| {
            let started = Instant::now();
            running(&s, &id)?;
            let list = records::list(&s.db(), &id).map_err(db_err("listing its checkpoints"))?;
            let checkpoint = target.find(&list, now_unix_ms())?;
            let spawner = s.spawner.clone().ok_or_else(|| ApiError::internal("this daemon has no spawner process"))?;
            let pending = spawner
                .start_rewind(&id, &checkpoint.tag)
                .map_err(|r| crate::spawner::refused(r, SandboxState::Restoring.as_str()))?;
            let stop_ms = pending.stop_ms;
            forkvm_sandbox::start::rewind::finish_rewind(&s.registry, pending, started)
                .map_err(|e| ApiError::new(e.code(), e.to_string()))?;
            s.touch(&id);
            Ok(RewindReport {
                sandbox_id: id.clone(),
                checkpoint,
                stop_ms,
                total_ms: started.elapsed().as_secs_f64() * 1e3,
            })
        })
        .await;
    let outcome = match &out {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    };
    s.metrics.inc("forkvm_rewinds_total", &[("outcome", outcome)]);
    out
}

/// How often the timer looks for checkpoints due.
const TICK: Duration = Duration::from_millis(250);

/// Takes the timed checkpoints as they come due, for as long as the daemon runs. A
/// paused sandbox is skipped (nothing in it changes), and one whose lock is held (a
/// checkpoint, snapshot or archive in progress) is tried at the next tick.
pub async fn schedule(s: AppState) {
    let mut last: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(TICK).await;
        let timed = match records::timed(&s.db()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "reading checkpoint timers");
                continue;
            }
        };
        last.retain(|id, _| timed.iter().any(|(t, _)| t == id));
        for (id, every) in timed {
            let due = last.get(&id).is_none_or(|t| t.elapsed() >= Duration::from_secs(every));
            let runs = s.sandbox_row(&id).is_some_and(|r| r.state == SandboxState::Running);
            if !due || !runs {
                continue;
            }
            let lock = s.disk.sandbox_lock(&id);
            let Ok(held) = lock.try_lock_owned() else { continue };
            last.insert(id.clone(), Instant::now());
            let out = s
                .blocking({
                    let id = id.clone();
                    move |s| {
                        let _held = held;
                        take_locked(&s, &id, Trigger::Interval, None, &mut || {})
                    }
                })
                .await;
            if let Err(e) = out {
                tracing::warn!(sandbox_id = %id, error = %e.message, "a timed checkpoint failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(seq: u64, at: u64) -> CheckpointInfo {
        CheckpointInfo {
            sandbox_id: "a".into(),
            seq,
            tag: tag_of("a", seq),
            created_at_unix_ms: at,
            trigger: "api".into(),
            note: None,
            pause_ms: 0.0,
            pages: 0,
            bytes_stored: 0,
            disk_bytes_stored: 0,
            total_ms: 0.0,
        }
    }

    #[test]
    fn a_rewind_names_one_checkpoint_by_number_or_age() {
        let list = [c(1, 10_000), c(2, 20_000), c(4, 30_000)];
        let pick = |seq, ago| RewindTarget::of(&RewindRequest { seq, ago_seconds: ago })?.find(&list, 40_000);
        assert_eq!(pick(Some(2), None).unwrap().seq, 2);
        let e = pick(Some(3), None).unwrap_err();
        assert!(e.message.contains("kept: 1, 2, 4"), "{}", e.message);
        assert_eq!(pick(None, Some(0.0)).unwrap().seq, 4);
        assert_eq!(pick(None, Some(10.0)).unwrap().seq, 4, "exactly 10 s old counts");
        assert_eq!(pick(None, Some(10.5)).unwrap().seq, 2);
        assert_eq!(pick(None, Some(30.0)).unwrap().seq, 1);
        assert_eq!(pick(None, Some(31.0)).unwrap_err().code, forkvm_api::ErrorCode::NotFound);
        for bad in [pick(None, None), pick(Some(1), Some(1.0)), pick(None, Some(-1.0)), pick(None, Some(f64::NAN))] {
            assert_eq!(bad.unwrap_err().code, forkvm_api::ErrorCode::BadRequest);
        }
        assert!(RewindTarget::Seq(1).find(&[], 0).unwrap_err().message.contains("none"));
    }

    #[test]
    fn the_oldest_go_past_the_count_or_the_bytes_and_the_newest_stays() {
        let list: Vec<_> = (1..=5).map(|seq| CheckpointInfo { bytes_stored: seq << 20, ..c(seq, seq) }).collect();
        let policy = |keep, max_stored_mib| forkvm_api::CheckpointPolicy { keep, max_stored_mib, ..Default::default() };
        let gone = |keep, mib| past_bounds(&list, &policy(keep, mib), 0).iter().map(|c| c.seq).collect::<Vec<_>>();
        assert_eq!(gone(5, None), Vec::<u64>::new());
        assert_eq!(gone(3, None), vec![1, 2]);
        assert_eq!(gone(1, None), vec![1, 2, 3, 4]);
        // 1+2+3+4+5 = 15 MiB: within 9 MiB only 4 and 5 fit.
        assert_eq!(gone(32, Some(15)), Vec::<u64>::new());
        assert_eq!(gone(32, Some(9)), vec![1, 2, 3]);
        assert_eq!(gone(32, Some(1)), vec![1, 2, 3, 4], "the newest stays even past the quota");
        assert_eq!(gone(2, Some(100)), vec![1, 2, 3]);
        assert!(past_bounds(&[], &policy(1, Some(1)), 0).is_empty());
        // A time window: checkpoint `seq` made at `seq` seconds.
        let timed: Vec<_> = (1..=5).map(|seq| c(seq, seq * 1000)).collect();
        let window = |secs| forkvm_api::CheckpointPolicy { max_age_seconds: Some(secs), ..Default::default() };
        let gone = |secs, now| past_bounds(&timed, &window(secs), now).iter().map(|c| c.seq).collect::<Vec<_>>();
        assert_eq!(gone(2, 5000), vec![1, 2], "made at 1 s and 2 s are older than 2 s at 5 s");
        assert_eq!(gone(10, 5000), Vec::<u64>::new());
        assert_eq!(gone(1, 60_000), vec![1, 2, 3, 4], "the newest stays, however old");
    }

    #[test]
    fn old_checkpoints_thin_to_one_per_stretch_of_time() {
        // One every 10 s for 30 minutes; past 10 minutes, one per minute.
        let list: Vec<_> = (0..180).map(|i| c(i + 1, i * 10_000)).collect();
        let policy = forkvm_api::CheckpointPolicy {
            keep: 256,
            thin_after_seconds: Some(600),
            thin_every_seconds: Some(60),
            ..Default::default()
        };
        let now = 1_800_000;
        let gone: Vec<u64> = past_bounds(&list, &policy, now).iter().map(|c| c.seq).collect();
        let kept: Vec<&CheckpointInfo> = list.iter().filter(|c| !gone.contains(&c.seq)).collect();
        let (old, recent): (Vec<&CheckpointInfo>, Vec<&CheckpointInfo>) =
            kept.iter().partition(|c| c.created_at_unix_ms < now - 600_000);
        assert_eq!(recent.len(), 60, "the last ten minutes stay whole");
        assert_eq!(old.len(), 20, "twenty minutes, one per minute");
        for pair in old.windows(2) {
            assert_eq!(pair[1].created_at_unix_ms - pair[0].created_at_unix_ms, 60_000, "{pair:?}");
        }
        assert!(old.iter().all(|c| c.created_at_unix_ms % 60_000 == 50_000), "each minute's newest stays");
        // A minute later, the minute that aged is thinned to its newest; what was thinned
        // before stays as it is.
        let again: Vec<CheckpointInfo> = kept.iter().map(|c| (*c).clone()).collect();
        let later: Vec<u64> = past_bounds(&again, &policy, now + 60_000).iter().map(|c| c.created_at_unix_ms).collect();
        assert_eq!(later, [1_200_000, 1_210_000, 1_220_000, 1_230_000, 1_240_000]);
        // With the count too: thinning first, then the oldest of what is left.
        let both = forkvm_api::CheckpointPolicy { keep: 50, ..policy.clone() };
        let gone_both = past_bounds(&list, &both, now);
        assert_eq!(list.len() - gone_both.len(), 50, "80 after thinning, then the 30 oldest");
        assert!(gone_both.windows(2).all(|p| p[0].seq < p[1].seq), "oldest first");
        // The newest stays even when it is old and shares a stretch with the one before.
        let two = [c(1, 0), c(2, 1000)];
        assert_eq!(past_bounds(&two, &policy, 10_000_000).iter().map(|c| c.seq).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn notes_are_bounded_and_name_the_call() {
        assert_eq!(note_of_call("exec", "echo hi\necho there"), "exec: echo hi");
        let long = note_of_call("eval", &"é".repeat(2000));
        assert!(long.len() <= forkvm_api::checkpoints::MAX_NOTE && long.ends_with("..."), "{}", long.len());
        assert!(check_note(&"x".repeat(1025)).is_err());
        assert!(check_note("a\0b").is_err());
        check_note("before rm -rf").unwrap();
    }
}
