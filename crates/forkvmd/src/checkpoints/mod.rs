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

/// Checkpoints running sandbox `id` now (blocking; the caller holds its lock).
pub fn take_locked(s: &AppState, id: &str, trigger: Trigger, note: Option<String>) -> Result<CheckpointInfo, ApiError> {
    running(s, id)?;
    let known_base = records::policy(&s.db(), id).map_err(db_err("reading its checkpoint policy"))?;
    let base = base_of(s, id, known_base.as_ref())?;
    let (seq, base) = records::claim_seq(&s.db(), id, &base).map_err(db_err("numbering the checkpoint"))?;
    let tag = tag_of(id, seq);
    let _claim =
        s.claim_tag(&tag).ok_or_else(|| ApiError::conflict(format!("checkpoint {tag:?} is being taken"), "writing"))?;
    let previous = records::list(&s.db(), id).unwrap_or_default().pop().map(|c| c.tag);
    let taken = forkvm_sandbox::checkpoint::take(&s.registry, &s.store, id, &base, &tag, previous.as_deref())?;
    let info = CheckpointInfo {
        sandbox_id: id.to_string(),
        seq,
        tag: tag.clone(),
        created_at_unix_ms: now_unix_ms(),
        trigger: trigger.as_str().to_string(),
        note,
        pause_ms: taken.pause_ms,
        pages: taken.pages,
        bytes_stored: taken.bytes_stored,
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

/// Sandbox `id`'s oldest checkpoints past its policy's bounds, removed (blocking). One a
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

/// The oldest checkpoints of `list` (oldest first) that `policy` does not keep at
/// `now_ms`: past `keep` of them, while the kept ones added more than `max_stored_mib`,
/// or older than `max_age_seconds`. The newest always stays.
fn past_bounds<'a>(
    list: &'a [CheckpointInfo],
    policy: &forkvm_api::CheckpointPolicy,
    now_ms: u64,
) -> &'a [CheckpointInfo] {
    let quota = policy.max_stored_mib.map_or(u64::MAX, |m| m.saturating_mul(1 << 20));
    let oldest_kept_ms = policy.max_age_seconds.map_or(0, |a| now_ms.saturating_sub(a.saturating_mul(1000)));
    let mut stored: u64 = list.iter().map(|c| c.bytes_stored).sum();
    let mut cut = 0;
    while cut + 1 < list.len()
        && (list.len() - cut > policy.keep as usize || stored > quota || list[cut].created_at_unix_ms < oldest_kept_ms)
    {
        stored -= list[cut].bytes_stored;
        cut += 1;
    }
    &list[..cut]
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
            tracing::info!(%tag, error = %e, "a checkpoint past its sandbox's keep stays");
            false
        }
    }
}

/// Removes what is kept about killed sandbox `id`'s checkpoints, and the snapshots
/// nothing else uses (blocking).
pub fn forget(s: &AppState, id: &str) {
    // Read first: the database's lock must not be held while snapshots are removed.
    let list = records::list(&s.db(), id).unwrap_or_default();
    for c in &list {
        remove_snapshot(s, &c.tag);
    }
    let _ = records::delete_all(&s.db(), id);
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
    s.blocking(move |s| take_locked(&s, &id, trigger, note)).await
}

/// After an exec or eval call on sandbox `id` (blocking, on the call's thread): a
/// checkpoint if its policy asks for one after every call. Taken before the call
/// answers, so the client's next call finds it made. A failure is logged, not the
/// call's.
pub fn after_call(s: &AppState, id: &str, kind: &str, text: &str) {
    let wanted = records::policy(&s.db(), id).ok().flatten().is_some_and(|p| p.policy.after_exec);
    if !wanted {
        return;
    }
    let lock = s.disk.sandbox_lock(id);
    let _held = lock.blocking_lock();
    if let Err(e) = take_locked(s, id, Trigger::Exec, Some(note_of_call(kind, text))) {
        tracing::warn!(sandbox_id = %id, error = %e.message, "a checkpoint after a call failed");
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
                        take_locked(&s, &id, Trigger::Interval, None)
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
    fn notes_are_bounded_and_name_the_call() {
        assert_eq!(note_of_call("exec", "echo hi\necho there"), "exec: echo hi");
        let long = note_of_call("eval", &"é".repeat(2000));
        assert!(long.len() <= forkvm_api::checkpoints::MAX_NOTE && long.ends_with("..."), "{}", long.len());
        assert!(check_note(&"x".repeat(1025)).is_err());
        assert!(check_note("a\0b").is_err());
        check_note("before rm -rf").unwrap();
    }
}
