//! forkd's workspaces as the daemon keeps them: a name bound to one sandbox and the tag
//! it was made from, in a table of the daemon's database. The sandbox's own state
//! (running, archived, gone) says the workspace's status; nothing else is stored, so
//! the two cannot disagree.

use crate::db::{Db, DbError};
use forkvm_sandbox::registry::SandboxRow;
use forkvm_sandbox::SandboxState;
use rusqlite::{params, OptionalExtension};

/// One workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRow {
    pub name: String,
    pub source_tag: String,
    pub sandbox_id: String,
    pub created_at_unix: u64,
    pub last_active_unix: u64,
}

/// What a workspace is now, from its sandbox's registry row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceStatus {
    Running,
    Suspended,
    /// Its sandbox was deleted behind its back (`DELETE /v1/sandboxes/{id}`).
    Stale,
}

impl WorkspaceStatus {
    pub fn of(sandbox: Option<&SandboxRow>) -> WorkspaceStatus {
        match sandbox.map(|r| r.state) {
            None => WorkspaceStatus::Stale,
            Some(SandboxState::Archived) => WorkspaceStatus::Suspended,
            Some(SandboxState::Starting | SandboxState::Running | SandboxState::Paused | SandboxState::Restoring) => {
                WorkspaceStatus::Running
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceStatus::Running => "running",
            WorkspaceStatus::Suspended => "suspended",
            WorkspaceStatus::Stale => "stale",
        }
    }
}

impl WorkspaceRow {
    /// Its API view, given its sandbox's registry row (absent: deleted).
    pub fn info(&self, sandbox: Option<&SandboxRow>) -> forkvm_api::WorkspaceInfo {
        let status = WorkspaceStatus::of(sandbox);
        forkvm_api::WorkspaceInfo {
            id: format!("ws-{}", self.sandbox_id.chars().take(16).collect::<String>()),
            name: self.name.clone(),
            source_snapshot_tag: self.source_tag.clone(),
            current_state_tag: None,
            status: status.as_str().into(),
            live_sandbox_id: (status == WorkspaceStatus::Running).then(|| self.sandbox_id.clone()),
            created_at_unix: self.created_at_unix,
            last_active_unix: self.last_active_unix,
            sandbox_id: self.sandbox_id.clone(),
        }
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkspaceRow> {
    Ok(WorkspaceRow {
        name: r.get(0)?,
        source_tag: r.get(1)?,
        sandbox_id: r.get(2)?,
        created_at_unix: r.get::<_, i64>(3)? as u64,
        last_active_unix: r.get::<_, i64>(4)? as u64,
    })
}

const COLUMNS: &str = "name, source_tag, sandbox_id, created_at_unix, last_active_unix";

/// Adds `w`; `false` when the name is taken.
pub fn insert(db: &Db, w: &WorkspaceRow) -> Result<bool, DbError> {
    let n = db.conn().execute(
        &format!("INSERT OR IGNORE INTO workspaces ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5)"),
        params![w.name, w.source_tag, w.sandbox_id, w.created_at_unix as i64, w.last_active_unix as i64],
    )?;
    Ok(n == 1)
}

pub fn get(db: &Db, name: &str) -> Result<Option<WorkspaceRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM workspaces WHERE name = ?1");
    Ok(db.conn().query_row(&sql, [name], row).optional()?)
}

/// Every workspace, by name.
pub fn all(db: &Db) -> Result<Vec<WorkspaceRow>, DbError> {
    let mut stmt = db.conn().prepare(&format!("SELECT {COLUMNS} FROM workspaces ORDER BY name"))?;
    let rows = stmt.query_map([], row)?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Binds workspace `name` to `sandbox_id` (a stale one's new sandbox), active `now`.
pub fn set_sandbox(db: &Db, name: &str, sandbox_id: &str, now: u64) -> Result<(), DbError> {
    db.conn().execute(
        "UPDATE workspaces SET sandbox_id = ?2, last_active_unix = ?3 WHERE name = ?1",
        params![name, sandbox_id, now as i64],
    )?;
    Ok(())
}

pub fn delete(db: &Db, name: &str) -> Result<(), DbError> {
    db.conn().execute("DELETE FROM workspaces WHERE name = ?1", [name])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_a_name_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        let w = WorkspaceRow {
            name: "dev".into(),
            source_tag: "py".into(),
            sandbox_id: "0123456789abcdef0123".into(),
            created_at_unix: 5,
            last_active_unix: 6,
        };
        assert!(insert(&db, &w).unwrap());
        assert!(!insert(&db, &WorkspaceRow { sandbox_id: "other".into(), ..w.clone() }).unwrap());
        assert_eq!(get(&db, "dev").unwrap(), Some(w.clone()));
        set_sandbox(&db, "dev", "fresh", 9).unwrap();
        assert_eq!(all(&db).unwrap()[0].sandbox_id, "fresh");
        let info = w.info(None);
        assert_eq!(
            (info.id.as_str(), info.status.as_str(), info.live_sandbox_id),
            ("ws-0123456789abcdef", "stale", None)
        );
        delete(&db, "dev").unwrap();
        assert_eq!(get(&db, "dev").unwrap(), None);
    }
}
