//! Where sandbox records are kept: one SQLite file, `<run root>/registry.db` (WAL, a
//! busy timeout), that every forkvm process on the host opens — the CLI, the daemon,
//! its spawner. A record is one row, written in one statement, so a `kill -9` at any
//! point leaves either the old row or the new one, never half of either.
//!
//! SQLite connections must not cross `fork()`: a child that used or closed its
//! parent's connection could corrupt the file. The spawner and every VMM are forks,
//! so a connection here belongs to the process that opened it; in any other process
//! it is never used, and is leaked rather than closed ([`ProcessConnection`]).

use super::{RecordedDisk, RegistryError, SandboxRecord};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// File name of the registry database in the run root.
pub const REGISTRY_DB: &str = "registry.db";

/// Version of the table layout below; a file of another version is refused by name.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  pid INTEGER NOT NULL,
  template TEXT,
  source_tag TEXT,
  forked_from TEXT,
  created_at_unix_ms INTEGER NOT NULL,
  memory_limit_bytes INTEGER,
  cgroup TEXT,
  disks TEXT NOT NULL DEFAULT '[]'
);
";

/// A connection owned by the process that opened it (see the module doc).
#[derive(Debug)]
struct ProcessConnection {
    pid: u32,
    conn: Option<Connection>,
}

impl Drop for ProcessConnection {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            std::mem::forget(self.conn.take());
        }
    }
}

/// The records table of one run root, opened on first use in each process.
#[derive(Debug)]
pub(super) struct Records {
    path: PathBuf,
    conn: Mutex<Option<ProcessConnection>>,
}

impl Records {
    pub(super) fn at(root: &Path) -> Records {
        Records { path: root.join(REGISTRY_DB), conn: Mutex::new(None) }
    }

    fn err(&self, source: rusqlite::Error) -> RegistryError {
        RegistryError::Db { path: self.path.clone(), source }
    }

    /// Runs `f` on this process's connection, opening it (and the file) if needed.
    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, RegistryError> {
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let me = std::process::id();
        if slot.as_ref().is_none_or(|c| c.pid != me) {
            // A parent's connection is dropped here, which leaks it (`Drop` above).
            *slot = Some(ProcessConnection { pid: me, conn: Some(self.open()?) });
        }
        let conn = slot.as_ref().and_then(|c| c.conn.as_ref()).expect("opened above");
        f(conn).map_err(|e| self.err(e))
    }

    fn open(&self) -> Result<Connection, RegistryError> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| RegistryError::Io { path: dir.to_path_buf(), source })?;
        }
        let conn = Connection::open(&self.path).map_err(|e| self.err(e))?;
        let setup = || -> rusqlite::Result<Option<i64>> {
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.execute_batch(SCHEMA)?;
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?1)",
                [SCHEMA_VERSION.to_string()],
            )?;
            conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get::<_, String>(0))
                .optional()
                .map(|v| v.and_then(|v| v.parse().ok()))
        };
        match setup().map_err(|e| self.err(e))? {
            Some(SCHEMA_VERSION) => Ok(conn),
            found => Err(RegistryError::Version { path: self.path.clone(), found: found.unwrap_or(-1) }),
        }
    }

    /// Inserts or replaces `r`'s row.
    pub(super) fn put(&self, r: &SandboxRecord) -> Result<(), RegistryError> {
        let disks = serde_json::to_string(&r.disks)
            .map_err(|source| RegistryError::Record { path: self.path.clone(), source })?;
        self.with(|c| {
            // Cached: a spawn writes one record per child through this statement.
            c.prepare_cached(
                "INSERT OR REPLACE INTO sandboxes (id, pid, template, source_tag, forked_from, created_at_unix_ms,
                   memory_limit_bytes, cgroup, disks) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                r.id,
                r.pid,
                r.template,
                r.source_tag,
                r.forked_from,
                r.created_at_unix_ms as i64,
                r.memory_limit_bytes.map(|b| b as i64),
                r.cgroup,
                disks
            ])
            .map(|_| ())
        })
    }

    /// Sandbox `id`'s record, with its run directory `run_dir`.
    pub(super) fn get(&self, id: &str, run_dir: &Path) -> Result<Option<SandboxRecord>, RegistryError> {
        let row =
            self.with(|c| c.prepare_cached(&format!("{SELECT} WHERE id = ?1"))?.query_row([id], row_of).optional())?;
        row.map(|r| r.into_record(run_dir, &self.path)).transpose()
    }

    /// Every record, oldest first, each with its run directory from `run_dir`.
    pub(super) fn all(&self, run_dir: impl Fn(&str) -> PathBuf) -> Result<Vec<SandboxRecord>, RegistryError> {
        let rows = self.with(|c| {
            let mut st = c.prepare_cached(&format!("{SELECT} ORDER BY created_at_unix_ms, id"))?;
            let rows = st.query_map([], row_of)?.collect::<rusqlite::Result<Vec<_>>>();
            rows
        })?;
        rows.into_iter()
            .map(|r| {
                let dir = run_dir(&r.id);
                r.into_record(&dir, &self.path)
            })
            .collect()
    }

    /// Removes sandbox `id`'s row (nothing if there is none).
    pub(super) fn delete(&self, id: &str) -> Result<(), RegistryError> {
        self.with(|c| c.prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?.execute([id]).map(|_| ()))
    }
}

const SELECT: &str = "SELECT id, pid, template, source_tag, forked_from, created_at_unix_ms, memory_limit_bytes,
  cgroup, disks FROM sandboxes";

/// A row as read, before its disks are decoded.
struct Row {
    id: String,
    pid: i32,
    template: Option<String>,
    source_tag: Option<String>,
    forked_from: Option<String>,
    created_at_unix_ms: i64,
    memory_limit_bytes: Option<i64>,
    cgroup: Option<String>,
    disks: String,
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        pid: r.get(1)?,
        template: r.get(2)?,
        source_tag: r.get(3)?,
        forked_from: r.get(4)?,
        created_at_unix_ms: r.get(5)?,
        memory_limit_bytes: r.get(6)?,
        cgroup: r.get(7)?,
        disks: r.get(8)?,
    })
}

impl Row {
    fn into_record(self, run_dir: &Path, db: &Path) -> Result<SandboxRecord, RegistryError> {
        let disks: Vec<RecordedDisk> = serde_json::from_str(&self.disks)
            .map_err(|source| RegistryError::Record { path: db.to_path_buf(), source })?;
        Ok(SandboxRecord {
            id: self.id,
            pid: self.pid,
            run_dir: run_dir.to_path_buf(),
            template: self.template,
            source_tag: self.source_tag,
            forked_from: self.forked_from,
            created_at_unix_ms: self.created_at_unix_ms.max(0) as u64,
            memory_limit_bytes: self.memory_limit_bytes.map(|b| b.max(0) as u64),
            cgroup: self.cgroup,
            disks,
        })
    }
}
