//! The daemon's state in SQLite (WAL): sandboxes it started (and those it adopted),
//! snapshots with what only the daemon knows (branch mode, pause window), and branches
//! in flight. The run directories and the snapshot store stay the truth about what
//! exists; this database is what lets a restarted daemon tell an interrupted spawn or
//! branch from a finished one. Every write is one statement or one transaction, so a
//! `kill -9` at any point leaves a consistent file.

use forkvm_sandbox::SandboxState;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// The state in column `i` of a sandbox row; a name no [`SandboxState`] has is an
/// error naming it (the CHECK should make that impossible).
fn state_column(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<SandboxState> {
    let name: String = r.get(i)?;
    SandboxState::parse(&name).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown sandbox state {name:?}").into(),
        )
    })
}

/// 2: sandboxes may be `paused` or `archived` (or `restoring`), with a reason, a TTL,
/// the last activity in ms and when they were archived. A version 1 file is migrated in
/// one transaction when opened; an older forkvmd refuses a version 2 file.
const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  state TEXT NOT NULL CHECK (state IN ('starting', 'running', 'paused', 'archived', 'restoring')),
  op TEXT,
  pid INTEGER,
  template TEXT,
  snapshot_tag TEXT,
  forked_from TEXT,
  memory_limit_mib INTEGER,
  created_at_unix INTEGER NOT NULL,
  last_active_unix INTEGER NOT NULL,
  branch_count INTEGER NOT NULL DEFAULT 0,
  last_branch_tag TEXT,
  reason TEXT,
  ttl_seconds INTEGER,
  expires_at_unix_ms INTEGER,
  last_activity_unix_ms INTEGER NOT NULL DEFAULT 0,
  archived_at_unix_ms INTEGER
);
CREATE TABLE IF NOT EXISTS snapshots (
  tag TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  branched_from TEXT,
  template TEXT,
  mode TEXT,
  pause_ms REAL,
  created_at_unix INTEGER NOT NULL,
  memory_logical_bytes INTEGER NOT NULL DEFAULT 0,
  memory_physical_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS branches (
  op TEXT PRIMARY KEY,
  sandbox_id TEXT NOT NULL,
  tag TEXT,
  mode TEXT NOT NULL,
  wait INTEGER NOT NULL,
  started_at_unix INTEGER NOT NULL
);
";

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("state database {path}: {source}")]
    Open { path: String, source: rusqlite::Error },
    #[error("state database {path} has schema version {found}; this forkvmd knows {SCHEMA_VERSION}")]
    Version { path: String, found: i64 },
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
}

/// A sandbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRow {
    pub id: String,
    pub state: SandboxState,
    pub op: Option<String>,
    pub pid: Option<i32>,
    pub template: Option<String>,
    pub snapshot_tag: Option<String>,
    pub forked_from: Option<String>,
    pub memory_limit_mib: Option<u64>,
    pub created_at_unix: u64,
    pub last_active_unix: u64,
    pub branch_count: u32,
    pub last_branch_tag: Option<String>,
    /// Why it is in its state: `idle` (paused), `ttl` or `api` (archived).
    pub reason: Option<String>,
    pub ttl_seconds: Option<u64>,
    pub expires_at_unix_ms: Option<u64>,
    pub last_activity_unix_ms: u64,
    pub archived_at_unix_ms: Option<u64>,
}

/// Version 1 to 2: the `sandboxes` table is rebuilt with the wider state check and the
/// lifecycle columns (SQLite cannot alter a check), in one transaction.
const MIGRATE_1_TO_2: &str = "
CREATE TABLE sandboxes_v2 (
  id TEXT PRIMARY KEY,
  state TEXT NOT NULL CHECK (state IN ('starting', 'running', 'paused', 'archived', 'restoring')),
  op TEXT,
  pid INTEGER,
  template TEXT,
  snapshot_tag TEXT,
  forked_from TEXT,
  memory_limit_mib INTEGER,
  created_at_unix INTEGER NOT NULL,
  last_active_unix INTEGER NOT NULL,
  branch_count INTEGER NOT NULL DEFAULT 0,
  last_branch_tag TEXT,
  reason TEXT,
  ttl_seconds INTEGER,
  expires_at_unix_ms INTEGER,
  last_activity_unix_ms INTEGER NOT NULL DEFAULT 0,
  archived_at_unix_ms INTEGER
);
INSERT INTO sandboxes_v2 (id, state, op, pid, template, snapshot_tag, forked_from, memory_limit_mib,
  created_at_unix, last_active_unix, branch_count, last_branch_tag, last_activity_unix_ms)
  SELECT id, state, op, pid, template, snapshot_tag, forked_from, memory_limit_mib, created_at_unix,
    last_active_unix, branch_count, last_branch_tag, last_active_unix * 1000 FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_v2 RENAME TO sandboxes;
UPDATE meta SET value = '2' WHERE key = 'schema';
";

/// A snapshot row.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub tag: String,
    pub status: String,
    pub branched_from: Option<String>,
    pub template: Option<String>,
    pub mode: Option<String>,
    pub pause_ms: Option<f64>,
    pub created_at_unix: u64,
    pub memory_logical_bytes: u64,
    pub memory_physical_bytes: u64,
}

/// A branch in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRow {
    pub op: String,
    pub sandbox_id: String,
    pub tag: Option<String>,
    pub mode: String,
    pub wait: bool,
    pub started_at_unix: u64,
}

#[derive(Debug)]
pub struct Db {
    conn: Connection,
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let err = |source| DbError::Open { path: path.display().to_string(), source };
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        let found: Option<String> =
            conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).optional().map_err(err)?;
        match found.and_then(|v| v.parse::<i64>().ok()) {
            None => {
                conn.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION.to_string()],
                )
                .map_err(err)?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(1) => {
                let tx = conn.unchecked_transaction().map_err(err)?;
                tx.execute_batch(MIGRATE_1_TO_2).map_err(err)?;
                tx.commit().map_err(err)?;
            }
            Some(found) => return Err(DbError::Version { path: path.display().to_string(), found }),
        }
        Ok(Db { conn })
    }

    /// Inserts sandbox rows (`starting` ones are recorded before any process exists).
    pub fn insert_sandboxes(&mut self, rows: &[SandboxRow]) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        for r in rows {
            tx.execute(
                "INSERT INTO sandboxes (id, state, op, pid, template, snapshot_tag, forked_from, memory_limit_mib,
                   created_at_unix, last_active_unix, branch_count, last_branch_tag, reason, ttl_seconds,
                   expires_at_unix_ms, last_activity_unix_ms, archived_at_unix_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                params![
                    r.id,
                    r.state.as_str(),
                    r.op,
                    r.pid,
                    r.template,
                    r.snapshot_tag,
                    r.forked_from,
                    r.memory_limit_mib.map(|v| v as i64),
                    r.created_at_unix as i64,
                    r.last_active_unix as i64,
                    r.branch_count,
                    r.last_branch_tag,
                    r.reason,
                    r.ttl_seconds.map(|v| v as i64),
                    r.expires_at_unix_ms.map(|v| v as i64),
                    r.last_activity_unix_ms as i64,
                    r.archived_at_unix_ms.map(|v| v as i64)
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Marks sandboxes running with their VMM pids.
    pub fn mark_running(&mut self, pids: &[(String, i32)]) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        for (id, pid) in pids {
            tx.execute("UPDATE sandboxes SET state = 'running', pid = ?2 WHERE id = ?1", params![id, pid])?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn delete_sandboxes(&mut self, ids: &[String]) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        for id in ids {
            tx.execute("DELETE FROM sandboxes WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn sandboxes(&self) -> Result<Vec<SandboxRow>, DbError> {
        let mut st = self.conn.prepare(
            "SELECT id, state, op, pid, template, snapshot_tag, forked_from, memory_limit_mib, created_at_unix,
                    last_active_unix, branch_count, last_branch_tag, reason, ttl_seconds, expires_at_unix_ms,
                    last_activity_unix_ms, archived_at_unix_ms FROM sandboxes ORDER BY created_at_unix, id",
        )?;
        let rows = st.query_map([], |r| {
            Ok(SandboxRow {
                id: r.get(0)?,
                state: state_column(r, 1)?,
                op: r.get(2)?,
                pid: r.get(3)?,
                template: r.get(4)?,
                snapshot_tag: r.get(5)?,
                forked_from: r.get(6)?,
                memory_limit_mib: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                created_at_unix: r.get::<_, i64>(8)? as u64,
                last_active_unix: r.get::<_, i64>(9)? as u64,
                branch_count: r.get(10)?,
                last_branch_tag: r.get(11)?,
                reason: r.get(12)?,
                ttl_seconds: r.get::<_, Option<i64>>(13)?.map(|v| v as u64),
                expires_at_unix_ms: r.get::<_, Option<i64>>(14)?.map(|v| v as u64),
                last_activity_unix_ms: r.get::<_, i64>(15)? as u64,
                archived_at_unix_ms: r.get::<_, Option<i64>>(16)?.map(|v| v as u64),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Notes an API call that used sandbox `id` at `now_ms`.
    pub fn touch(&self, id: &str, now_ms: u64) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE sandboxes SET last_active_unix = ?2, last_activity_unix_ms = ?3 WHERE id = ?1",
            params![id, (now_ms / 1000) as i64, now_ms as i64],
        )?;
        Ok(())
    }

    /// Sets sandbox `id`'s state and reason (`None` clears it); `archived_at_unix_ms` is
    /// set for `archived` and cleared otherwise.
    pub fn set_state(&self, id: &str, state: SandboxState, reason: Option<&str>, now_ms: u64) -> Result<(), DbError> {
        let archived_at = (state == SandboxState::Archived).then_some(now_ms as i64);
        self.conn.execute(
            "UPDATE sandboxes SET state = ?2, reason = ?3, archived_at_unix_ms = ?4,
               pid = CASE WHEN ?2 = 'archived' THEN NULL ELSE pid END WHERE id = ?1",
            params![id, state.as_str(), reason, archived_at],
        )?;
        Ok(())
    }

    /// Sets sandbox `id`'s TTL (`None`: none) and when it runs out.
    pub fn set_ttl(&self, id: &str, ttl_seconds: Option<u64>, expires_at_unix_ms: Option<u64>) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE sandboxes SET ttl_seconds = ?2, expires_at_unix_ms = ?3 WHERE id = ?1",
            params![id, ttl_seconds.map(|v| v as i64), expires_at_unix_ms.map(|v| v as i64)],
        )?;
        Ok(())
    }

    /// Marks sandbox `id` running again (a restore) with its VMM pid.
    pub fn mark_restored(&self, id: &str, pid: i32, now_ms: u64) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE sandboxes SET state = 'running', reason = NULL, archived_at_unix_ms = NULL, pid = ?2,
               last_active_unix = ?3, last_activity_unix_ms = ?4 WHERE id = ?1",
            params![id, pid, (now_ms / 1000) as i64, now_ms as i64],
        )?;
        Ok(())
    }

    pub fn record_branch_of(&self, id: &str, tag: &str) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE sandboxes SET branch_count = branch_count + 1, last_branch_tag = ?2 WHERE id = ?1",
            params![id, tag],
        )?;
        Ok(())
    }

    pub fn upsert_snapshot(&self, s: &SnapshotRow) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT INTO snapshots (tag, status, branched_from, template, mode, pause_ms, created_at_unix,
               memory_logical_bytes, memory_physical_bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (tag) DO UPDATE SET status = excluded.status, branched_from = excluded.branched_from,
               template = excluded.template, mode = COALESCE(excluded.mode, snapshots.mode),
               pause_ms = COALESCE(excluded.pause_ms, snapshots.pause_ms), created_at_unix = excluded.created_at_unix,
               memory_logical_bytes = excluded.memory_logical_bytes,
               memory_physical_bytes = excluded.memory_physical_bytes",
            params![
                s.tag,
                s.status,
                s.branched_from,
                s.template,
                s.mode,
                s.pause_ms,
                s.created_at_unix as i64,
                s.memory_logical_bytes as i64,
                s.memory_physical_bytes as i64
            ],
        )?;
        Ok(())
    }

    pub fn delete_snapshot(&self, tag: &str) -> Result<(), DbError> {
        self.conn.execute("DELETE FROM snapshots WHERE tag = ?1", [tag])?;
        Ok(())
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, DbError> {
        let mut st = self.conn.prepare(
            "SELECT tag, status, branched_from, template, mode, pause_ms, created_at_unix, memory_logical_bytes,
                    memory_physical_bytes FROM snapshots ORDER BY tag",
        )?;
        let rows = st.query_map([], |r| {
            Ok(SnapshotRow {
                tag: r.get(0)?,
                status: r.get(1)?,
                branched_from: r.get(2)?,
                template: r.get(3)?,
                mode: r.get(4)?,
                pause_ms: r.get(5)?,
                created_at_unix: r.get::<_, i64>(6)? as u64,
                memory_logical_bytes: r.get::<_, i64>(7)? as u64,
                memory_physical_bytes: r.get::<_, i64>(8)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn insert_branch(&self, b: &BranchRow) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT INTO branches (op, sandbox_id, tag, mode, wait, started_at_unix) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![b.op, b.sandbox_id, b.tag, b.mode, b.wait, b.started_at_unix as i64],
        )?;
        Ok(())
    }

    pub fn set_branch_tag(&self, op: &str, tag: &str) -> Result<(), DbError> {
        self.conn.execute("UPDATE branches SET tag = ?2 WHERE op = ?1", params![op, tag])?;
        Ok(())
    }

    pub fn delete_branch(&self, op: &str) -> Result<(), DbError> {
        self.conn.execute("DELETE FROM branches WHERE op = ?1", [op])?;
        Ok(())
    }

    pub fn branches(&self) -> Result<Vec<BranchRow>, DbError> {
        let mut st =
            self.conn.prepare("SELECT op, sandbox_id, tag, mode, wait, started_at_unix FROM branches ORDER BY op")?;
        let rows = st.query_map([], |r| {
            Ok(BranchRow {
                op: r.get(0)?,
                sandbox_id: r.get(1)?,
                tag: r.get(2)?,
                mode: r.get(3)?,
                wait: r.get(4)?,
                started_at_unix: r.get::<_, i64>(5)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            state: SandboxState::Starting,
            op: Some("op1".into()),
            pid: None,
            template: Some("python".into()),
            snapshot_tag: Some("py".into()),
            forked_from: None,
            memory_limit_mib: Some(256),
            created_at_unix: 10,
            last_active_unix: 10,
            branch_count: 0,
            last_branch_tag: None,
            reason: None,
            ttl_seconds: None,
            expires_at_unix_ms: None,
            last_activity_unix_ms: 10_000,
            archived_at_unix_ms: None,
        }
    }

    #[test]
    fn sandboxes_snapshots_branches_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let mut db = Db::open(&path).unwrap();
            db.insert_sandboxes(&[row("a"), row("b")]).unwrap();
            db.mark_running(&[("a".into(), 42)]).unwrap();
            db.record_branch_of("a", "t1").unwrap();
            db.touch("a", 99_000).unwrap();
            db.upsert_snapshot(&SnapshotRow {
                tag: "t1".into(),
                status: "writing".into(),
                branched_from: Some("a".into()),
                template: None,
                mode: Some("live".into()),
                pause_ms: Some(3.5),
                created_at_unix: 5,
                memory_logical_bytes: 1,
                memory_physical_bytes: 0,
            })
            .unwrap();
            // A later update without mode/pause keeps what the branch recorded.
            db.upsert_snapshot(&SnapshotRow {
                tag: "t1".into(),
                status: "ready".into(),
                branched_from: Some("a".into()),
                template: None,
                mode: None,
                pause_ms: None,
                created_at_unix: 5,
                memory_logical_bytes: 1,
                memory_physical_bytes: 1,
            })
            .unwrap();
            db.insert_branch(&BranchRow {
                op: "b1".into(),
                sandbox_id: "a".into(),
                tag: None,
                mode: "live".into(),
                wait: true,
                started_at_unix: 7,
            })
            .unwrap();
            db.set_branch_tag("b1", "t2").unwrap();
            assert!(db.insert_sandboxes(&[row("a")]).is_err(), "duplicate id refused");
        }
        let mut db = Db::open(&path).unwrap();
        let s = db.sandboxes().unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].state.as_str(), s[0].pid, s[0].branch_count, s[0].last_active_unix),
            ("running", Some(42), 1, 99)
        );
        assert_eq!(s[1].state, SandboxState::Starting);
        let snaps = db.snapshots().unwrap();
        assert_eq!(
            (snaps[0].status.as_str(), snaps[0].mode.as_deref(), snaps[0].pause_ms),
            ("ready", Some("live"), Some(3.5))
        );
        assert_eq!(db.branches().unwrap()[0].tag.as_deref(), Some("t2"));
        db.delete_branch("b1").unwrap();
        db.delete_sandboxes(&["b".into()]).unwrap();
        db.delete_snapshot("t1").unwrap();
        assert!(db.branches().unwrap().is_empty());
        assert_eq!(db.sandboxes().unwrap().len(), 1);
        assert!(db.snapshots().unwrap().is_empty());
        let mode: String = db.conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }

    /// The CHECK of the sandboxes table lists exactly the states `SandboxState` has.
    #[test]
    fn the_state_check_is_the_enum() {
        let names: Vec<String> = SandboxState::ALL.iter().map(|s| format!("'{s}'")).collect();
        let check = format!("CHECK (state IN ({}))", names.join(", "));
        assert!(SCHEMA.contains(&check), "{check} not in the schema");
        assert!(MIGRATE_1_TO_2.contains(&check), "{check} not in the migration");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(Db::open(&path).unwrap());
        let c = Connection::open(&path).unwrap();
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema'", []).unwrap();
        drop(c);
        assert!(matches!(Db::open(&path), Err(DbError::Version { found: 99, .. })));
    }

    #[test]
    fn a_version_1_file_is_migrated_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema', '1');
             CREATE TABLE sandboxes (id TEXT PRIMARY KEY,
               state TEXT NOT NULL CHECK (state IN ('starting', 'running')), op TEXT, pid INTEGER,
               template TEXT, snapshot_tag TEXT, forked_from TEXT, memory_limit_mib INTEGER,
               created_at_unix INTEGER NOT NULL, last_active_unix INTEGER NOT NULL,
               branch_count INTEGER NOT NULL DEFAULT 0, last_branch_tag TEXT);
             INSERT INTO sandboxes VALUES ('old1', 'running', 'spawn-1', 7, 'python', 'py', NULL, NULL, 5, 6, 2, 't');",
        )
        .unwrap();
        drop(c);
        let db = Db::open(&path).unwrap();
        let rows = db.sandboxes().unwrap();
        assert_eq!((rows[0].id.as_str(), rows[0].pid, rows[0].branch_count), ("old1", Some(7), 2));
        assert_eq!((rows[0].last_activity_unix_ms, rows[0].reason.as_deref()), (6000, None));
        db.set_state("old1", SandboxState::Archived, Some("ttl"), 123).unwrap();
        db.set_ttl("old1", Some(2), Some(8000)).unwrap();
        drop(db);
        let db = Db::open(&path).unwrap();
        let r = &db.sandboxes().unwrap()[0];
        assert_eq!(
            (r.state.as_str(), r.reason.as_deref(), r.archived_at_unix_ms, r.pid),
            ("archived", Some("ttl"), Some(123), None)
        );
        assert_eq!((r.ttl_seconds, r.expires_at_unix_ms), (Some(2), Some(8000)));
        db.mark_restored("old1", 9, 200_000).unwrap();
        let r = &db.sandboxes().unwrap()[0];
        assert_eq!(
            (r.state.as_str(), r.reason.as_deref(), r.archived_at_unix_ms, r.pid),
            ("running", None, None, Some(9))
        );
    }
}
