//! The daemon's own state in SQLite (WAL): snapshots with what only the daemon knows
//! (branch mode, pause window), branches in flight and forkd's workspaces
//! (`crate::workspaces`, a table older daemons ignore). Sandboxes are not here: they are
//! rows of the one registry every forkvm process shares (`forkvm_sandbox::registry`);
//! a file from an older forkvmd still has its `sandboxes` table, which the daemon merges
//! into the registry once ([`Db::legacy_sandboxes`], [`Db::drop_legacy_sandboxes`]).
//! The snapshot store stays the truth about what exists; this database is what lets a
//! restarted daemon tell an interrupted branch from a finished one. Every write is one
//! statement or one transaction, so a `kill -9` at any point leaves a consistent file.

use forkvm_sandbox::registry::{Origin, SandboxRow as RegistryRow};
use forkvm_sandbox::{Registry, SandboxState};
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

/// 3: no `sandboxes` table (they moved to the registry). Version 2 files keep theirs
/// until it is merged; a version 1 file is first brought to version 2 in one
/// transaction. An older forkvmd refuses a version 3 file.
const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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
CREATE TABLE IF NOT EXISTS workspaces (
  name TEXT PRIMARY KEY,
  source_tag TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  created_at_unix INTEGER NOT NULL,
  last_active_unix INTEGER NOT NULL
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

/// A sandbox row of a version 2 file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacySandboxRow {
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

impl LegacySandboxRow {
    /// The registry's row for this one (units: bytes and ms); `None` for an id the
    /// registry refuses.
    fn into_registry_row(self, registry: &Registry) -> Option<RegistryRow> {
        let origin = Origin {
            template: self.template,
            source_tag: self.snapshot_tag,
            forked_from: self.forked_from,
            memory_limit_bytes: self.memory_limit_mib.map(|m| m << 20),
            ..Origin::default()
        };
        let mut record = registry.new_record(&self.id, origin).ok()?;
        record.created_at_unix_ms = self.created_at_unix * 1000;
        record.pid = self.pid.unwrap_or(0);
        Some(RegistryRow {
            record,
            state: self.state,
            op: self.op,
            // A reason this forkvm does not know is dropped, not the row.
            reason: self.reason.as_deref().and_then(forkvm_sandbox::StateReason::parse),
            owner: None,
            last_activity_unix_ms: self.last_activity_unix_ms.max(self.last_active_unix * 1000),
            ttl_seconds: self.ttl_seconds,
            expires_at_unix_ms: self.expires_at_unix_ms,
            archived_at_unix_ms: self.archived_at_unix_ms,
            branch_count: self.branch_count,
            last_branch_tag: self.last_branch_tag,
        })
    }
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
        crate::checkpoints::records::create_tables(&conn).map_err(err)?;
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
            Some(SCHEMA_VERSION) | Some(2) => {}
            Some(1) => {
                let tx = conn.unchecked_transaction().map_err(err)?;
                tx.execute_batch(MIGRATE_1_TO_2).map_err(err)?;
                tx.commit().map_err(err)?;
            }
            Some(found) => return Err(DbError::Version { path: path.display().to_string(), found }),
        }
        Ok(Db { conn })
    }

    /// The connection, for the tables of a part of the daemon that keeps its own
    /// (`e2b::records`), which creates them with `CREATE TABLE IF NOT EXISTS`.
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The sandbox rows of a version 2 file (none in a version 3 one), as registry rows.
    pub fn legacy_sandboxes(&self, registry: &Registry) -> Result<Vec<RegistryRow>, DbError> {
        let has_table: bool = self.conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'",
            [],
            |r| r.get(0),
        )?;
        if !has_table {
            return Ok(Vec::new());
        }
        let mut st = self.conn.prepare(
            "SELECT id, state, op, pid, template, snapshot_tag, forked_from, memory_limit_mib, created_at_unix,
                    last_active_unix, branch_count, last_branch_tag, reason, ttl_seconds, expires_at_unix_ms,
                    last_activity_unix_ms, archived_at_unix_ms FROM sandboxes ORDER BY created_at_unix, id",
        )?;
        let rows = st.query_map([], |r| {
            Ok(LegacySandboxRow {
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
        let rows: Vec<LegacySandboxRow> = rows.collect::<Result<_, _>>()?;
        Ok(rows.into_iter().filter_map(|r| r.into_registry_row(registry)).collect())
    }

    /// Drops the `sandboxes` table of a version 2 file once its rows are merged into the
    /// registry, making it version 3 (one transaction).
    pub fn drop_legacy_sandboxes(&mut self) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        tx.execute_batch("DROP TABLE IF EXISTS sandboxes; UPDATE meta SET value = '3' WHERE key = 'schema';")?;
        tx.commit()?;
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

    #[test]
    fn snapshots_and_branches_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let db = Db::open(&path).unwrap();
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
        }
        let db = Db::open(&path).unwrap();
        let snaps = db.snapshots().unwrap();
        assert_eq!(
            (snaps[0].status.as_str(), snaps[0].mode.as_deref(), snaps[0].pause_ms),
            ("ready", Some("live"), Some(3.5))
        );
        assert_eq!(db.branches().unwrap()[0].tag.as_deref(), Some("t2"));
        db.delete_branch("b1").unwrap();
        db.delete_snapshot("t1").unwrap();
        assert!(db.branches().unwrap().is_empty());
        assert!(db.snapshots().unwrap().is_empty());
        let mode: String = db.conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        let tables: i64 =
            db.conn.query_row("SELECT count(*) FROM sqlite_master WHERE name = 'sandboxes'", [], |r| r.get(0)).unwrap();
        assert_eq!(tables, 0, "a new file has no sandboxes table: they are the registry's");
    }

    /// The CHECK of the version 2 table lists exactly the states `SandboxState` has.
    #[test]
    fn the_legacy_state_check_is_the_enum() {
        let names: Vec<String> = SandboxState::ALL.iter().map(|s| format!("'{s}'")).collect();
        let check = format!("CHECK (state IN ({}))", names.join(", "));
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

    /// An older daemon's file: version 1 is brought to 2, its rows become registry rows
    /// (units converted, lifecycle kept), and the table goes once merged.
    #[test]
    fn a_version_1_file_merges_into_the_registry() {
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
             INSERT INTO sandboxes VALUES ('old1', 'running', 'spawn-1', 7, 'python', 'py', NULL, 256, 5, 6, 2, 't');",
        )
        .unwrap();
        drop(c);
        let registry = Registry::open(dir.path().join("run"));
        let mut db = Db::open(&path).unwrap();
        let rows = db.legacy_sandboxes(&registry).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.id(), r.record.pid, r.state, r.branch_count), ("old1", 7, SandboxState::Running, 2));
        assert_eq!((r.record.memory_limit_bytes, r.record.created_at_unix_ms), (Some(256 << 20), 5000));
        assert_eq!((r.last_activity_unix_ms, r.record.source_tag.as_deref()), (6000, Some("py")));
        for r in &rows {
            registry.import(r).unwrap();
        }
        db.drop_legacy_sandboxes().unwrap();
        drop(db);
        let db = Db::open(&path).unwrap();
        assert!(db.legacy_sandboxes(&registry).unwrap().is_empty());
        let merged = registry.row("old1").unwrap();
        assert_eq!((merged.branch_count, merged.last_branch_tag.as_deref()), (2, Some("t")));
    }
}
