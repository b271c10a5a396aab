//! Where sandbox records are kept: one SQLite file, `<run root>/registry.db` (WAL, a
//! busy timeout), that every forkvm process on the host opens — the CLI, the daemon,
//! its spawner. A sandbox is one row: who it is, where it came from, its VMM while it
//! has one, and its lifecycle (state, reason, TTL, activity, branches). Every change is
//! one statement or one transaction, so a `kill -9` at any point leaves either the old
//! row or the new one, never half of either; a state change is a compare-and-set
//! ([`Records::transition`]).
//!
//! SQLite connections must not cross `fork()`: a child that used or closed its
//! parent's connection could corrupt the file. The spawner and every VMM are forks,
//! so a connection here belongs to the process that opened it; in any other process
//! it is never used, and is leaked rather than closed ([`ProcessConnection`]).

use super::row::{Owner, SandboxRow};
use super::{RecordedDisk, RegistryError, SandboxRecord};
use crate::state::{SandboxState, StateReason};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// File name of the registry database in the run root.
pub const REGISTRY_DB: &str = "registry.db";

/// Version of the table layout below; versions 1 (records without a lifecycle), 2
/// (without CPU and tasks limits), 3 (without I/O caps), 4 (without the sandbox's uid),
/// 5 (without its egress policy) and 6 (without exposed ports) are migrated when opened,
/// a newer one is refused by name.
const SCHEMA_VERSION: i64 = 8;

/// The `sandboxes` table of [`SCHEMA_VERSION`] (a macro, so that the schema and the
/// migration share one literal).
macro_rules! sandboxes_table {
    () => {
        "
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  state TEXT NOT NULL CHECK (state IN ('starting', 'running', 'paused', 'archived', 'restoring')),
  op TEXT,
  reason TEXT,
  owner_pid INTEGER,
  owner_started_unix_ms INTEGER,
  pid INTEGER,
  template TEXT,
  source_tag TEXT,
  forked_from TEXT,
  created_at_unix_ms INTEGER NOT NULL,
  memory_limit_bytes INTEGER,
  cgroup TEXT,
  disks TEXT NOT NULL DEFAULT '[]',
  last_activity_unix_ms INTEGER NOT NULL,
  ttl_seconds INTEGER,
  expires_at_unix_ms INTEGER,
  archived_at_unix_ms INTEGER,
  branch_count INTEGER NOT NULL DEFAULT 0,
  last_branch_tag TEXT,
  cpu_millis INTEGER,
  pids_max INTEGER,
  io_limits TEXT,
  uid INTEGER,
  network TEXT,
  vcpus INTEGER
);
"
    };
}

/// The `exposed_ports` table (`super::ports`): a sandbox's rows go with its own, in the
/// statement that removes it (a trigger), whichever process and path removes it.
macro_rules! ports_table {
    () => {
        "
CREATE TABLE IF NOT EXISTS exposed_ports (
  sandbox_id TEXT NOT NULL,
  port INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
  token TEXT NOT NULL,
  created_at_unix_ms INTEGER NOT NULL,
  dpop_jkt TEXT,
  PRIMARY KEY (sandbox_id, port)
);
CREATE TRIGGER IF NOT EXISTS exposed_ports_go_with_their_sandbox AFTER DELETE ON sandboxes
BEGIN
  DELETE FROM exposed_ports WHERE sandbox_id = OLD.id;
END;
"
    };
}

const SCHEMA: &str = concat!(
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    sandboxes_table!(),
    ports_table!()
);

/// Version 1 to the current one: each record becomes a `running` row (version 1 kept only
/// sandboxes whose VMM had started), in one transaction.
const MIGRATE_1: &str = concat!(
    "ALTER TABLE sandboxes RENAME TO sandboxes_v1;",
    sandboxes_table!(),
    "
INSERT INTO sandboxes (id, state, pid, template, source_tag, forked_from, created_at_unix_ms, memory_limit_bytes,
  cgroup, disks, last_activity_unix_ms)
  SELECT id, 'running', pid, template, source_tag, forked_from, created_at_unix_ms, memory_limit_bytes, cgroup, disks,
    created_at_unix_ms FROM sandboxes_v1;
DROP TABLE sandboxes_v1;
",
    ports_table!(),
    "UPDATE meta SET value = '7' WHERE key = 'schema';"
);

/// Version 2 to 3: the CPU and tasks limits a sandbox asked for (none: the defaults).
const MIGRATE_2_TO_3: &str = "
ALTER TABLE sandboxes ADD COLUMN cpu_millis INTEGER;
ALTER TABLE sandboxes ADD COLUMN pids_max INTEGER;
UPDATE meta SET value = '3' WHERE key = 'schema';
";

/// Version 3 to 4: the I/O caps a sandbox asked for (JSON `IoLimits`; none: no cap).
const MIGRATE_3_TO_4: &str = "
ALTER TABLE sandboxes ADD COLUMN io_limits TEXT;
UPDATE meta SET value = '4' WHERE key = 'schema';
";

/// Version 4 to 5: the uid the sandbox's VMM runs as (none: it has none of its own).
const MIGRATE_4_TO_5: &str = "
ALTER TABLE sandboxes ADD COLUMN uid INTEGER;
UPDATE meta SET value = '5' WHERE key = 'schema';
";

/// Version 5 to 6: the sandbox's egress policy (JSON `NetworkPolicy`; none: the default).
const MIGRATE_5_TO_6: &str = "
ALTER TABLE sandboxes ADD COLUMN network TEXT;
UPDATE meta SET value = '6' WHERE key = 'schema';
";

/// Version 6 to 7: the sandboxes' exposed ports.
const MIGRATE_6_TO_7: &str = concat!(ports_table!(), "UPDATE meta SET value = '7' WHERE key = 'schema';");

/// Version 7 to 8: the sandbox's vCPUs (none: one, as every sandbox had before).
const MIGRATE_7_TO_8: &str = "
ALTER TABLE sandboxes ADD COLUMN vcpus INTEGER;
UPDATE meta SET value = '8' WHERE key = 'schema';
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

/// The lifecycle columns a new row starts with.
pub(super) struct NewRow<'a> {
    pub state: SandboxState,
    pub op: Option<&'a str>,
    pub now_ms: u64,
}

impl Records {
    pub(super) fn at(root: &Path) -> Records {
        Records { path: root.join(REGISTRY_DB), conn: Mutex::new(None) }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> RegistryError {
        RegistryError::Db { path: self.path.clone(), source }
    }

    /// Runs `f` on this process's connection, opening it (and the file) if needed.
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, RegistryError> {
        let mut slot = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let me = std::process::id();
        if slot.as_ref().is_none_or(|c| c.pid != me) {
            // A parent's connection is dropped here, which leaks it (`Drop` above).
            *slot = Some(ProcessConnection { pid: me, conn: Some(self.open()?) });
        }
        let conn = slot.as_mut().and_then(|c| c.conn.as_mut()).expect("opened above");
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
            let found: Option<i64> = conn
                .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get::<_, String>(0))
                .optional()
                .or_else(|e| match e {
                    // A new file: no meta table yet.
                    rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.contains("no such table") => Ok(None),
                    e => Err(e),
                })?
                .and_then(|v| v.parse().ok());
            match found {
                None => {
                    conn.execute_batch(SCHEMA)?;
                    conn.execute(
                        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?1)",
                        [SCHEMA_VERSION.to_string()],
                    )?;
                    conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get::<_, String>(0))
                        .map(|v| v.parse().ok())
                }
                Some(1) => {
                    conn.execute_batch(&format!("BEGIN IMMEDIATE; {MIGRATE_1} COMMIT;"))?;
                    Ok(Some(SCHEMA_VERSION))
                }
                Some(2) | Some(3) | Some(4) | Some(5) | Some(6) | Some(7) => {
                    // Another process may have migrated between the read and the lock.
                    conn.execute_batch("BEGIN IMMEDIATE;")?;
                    let now: Option<String> =
                        conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).optional()?;
                    if now.as_deref() == Some("2") {
                        conn.execute_batch(MIGRATE_2_TO_3)?;
                    }
                    if matches!(now.as_deref(), Some("2") | Some("3")) {
                        conn.execute_batch(MIGRATE_3_TO_4)?;
                    }
                    if matches!(now.as_deref(), Some("2") | Some("3") | Some("4")) {
                        conn.execute_batch(MIGRATE_4_TO_5)?;
                    }
                    if matches!(now.as_deref(), Some("2") | Some("3") | Some("4") | Some("5")) {
                        conn.execute_batch(MIGRATE_5_TO_6)?;
                    }
                    if matches!(now.as_deref(), Some("2") | Some("3") | Some("4") | Some("5") | Some("6")) {
                        conn.execute_batch(MIGRATE_6_TO_7)?;
                    }
                    if matches!(now.as_deref(), Some("2") | Some("3") | Some("4") | Some("5") | Some("6") | Some("7")) {
                        conn.execute_batch(MIGRATE_7_TO_8)?;
                    }
                    conn.execute_batch("COMMIT;")?;
                    Ok(Some(SCHEMA_VERSION))
                }
                found => Ok(found),
            }
        };
        match setup().map_err(|e| self.err(e))? {
            Some(SCHEMA_VERSION) => Ok(conn),
            found => Err(RegistryError::Version { path: self.path.clone(), found: found.unwrap_or(-1) }),
        }
    }

    /// Inserts a row for each of `records` in `new.state`, owned by this process, in one
    /// transaction; an id that already has a row keeps it as it is (the daemon records
    /// its sandboxes before its spawner does).
    pub(super) fn begin(&self, records: &[&SandboxRecord], new: NewRow<'_>) -> Result<(), RegistryError> {
        let owner = Owner::this_process();
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT OR IGNORE INTO sandboxes (id, state, op, owner_pid, owner_started_unix_ms, template,
                       source_tag, forked_from, created_at_unix_ms, memory_limit_bytes, last_activity_unix_ms,
                       cpu_millis, pids_max, io_limits, network, vcpus)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                )?;
                for r in records {
                    st.execute(params![
                        r.id,
                        new.state.as_str(),
                        new.op,
                        owner.as_ref().map(|o| o.pid),
                        owner.as_ref().map(|o| o.started_unix_ms as i64),
                        r.template,
                        r.source_tag,
                        r.forked_from,
                        r.created_at_unix_ms as i64,
                        r.memory_limit_bytes.map(|b| b as i64),
                        new.now_ms as i64,
                        r.cpu_millis,
                        r.pids_max,
                        io_column(&r.io_limits),
                        network_column(&r.network),
                        r.vcpus,
                    ])?;
                }
            }
            tx.commit()
        })
    }

    /// Writes what `records` say about their VMMs (pid, cgroup, disks, origin) in one
    /// transaction. A row that exists keeps its state, lifecycle and creation time; one
    /// that does not is inserted `starting`, owned by this process.
    pub(super) fn put(&self, records: &[&SandboxRecord], now_ms: u64) -> Result<(), RegistryError> {
        let disks = records
            .iter()
            .map(|r| serde_json::to_string(&r.disks))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| RegistryError::Record { path: self.path.clone(), source })?;
        let owner = Owner::this_process();
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT INTO sandboxes (id, state, owner_pid, owner_started_unix_ms, pid, template, source_tag,
                       forked_from, created_at_unix_ms, memory_limit_bytes, cgroup, disks, last_activity_unix_ms,
                       cpu_millis, pids_max, io_limits, uid, network, vcpus)
                     VALUES (?1, ?13, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?14, ?15, ?16, ?17, ?18, ?19)
                     ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, template = excluded.template,
                       source_tag = excluded.source_tag, forked_from = excluded.forked_from,
                       memory_limit_bytes = excluded.memory_limit_bytes, cgroup = excluded.cgroup,
                       disks = excluded.disks, cpu_millis = excluded.cpu_millis, pids_max = excluded.pids_max,
                       io_limits = excluded.io_limits, uid = excluded.uid, vcpus = excluded.vcpus",
                )?;
                for (r, disks) in records.iter().zip(&disks) {
                    st.execute(params![
                        r.id,
                        owner.as_ref().map(|o| o.pid),
                        owner.as_ref().map(|o| o.started_unix_ms as i64),
                        (r.pid > 0).then_some(r.pid),
                        r.template,
                        r.source_tag,
                        r.forked_from,
                        r.created_at_unix_ms as i64,
                        r.memory_limit_bytes.map(|b| b as i64),
                        r.cgroup,
                        disks,
                        now_ms as i64,
                        SandboxState::Starting.as_str(),
                        r.cpu_millis,
                        r.pids_max,
                        io_column(&r.io_limits),
                        r.uid,
                        network_column(&r.network),
                        r.vcpus,
                    ])?;
                }
            }
            tx.commit()
        })
    }

    /// Gives each of `ids` (rows this process began) a uid from `range` that no other
    /// live sandbox has (`family`: that one, shared with the sandbox it was forked from),
    /// in one transaction, and returns them in order. A row that has one keeps it.
    pub(super) fn assign_uids(
        &self,
        ids: &[&str],
        range: std::ops::Range<u32>,
        family: Option<u32>,
    ) -> Result<Vec<u32>, RegistryError> {
        let exhausted = || RegistryError::NoFreeUid { first: range.start, count: range.len() };
        let assigned = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut taken: std::collections::BTreeSet<u32> = tx
                .prepare_cached("SELECT uid FROM sandboxes WHERE uid IS NOT NULL AND state != 'archived'")?
                .query_map([], |r| r.get::<_, u32>(0))?
                .collect::<rusqlite::Result<_>>()?;
            let mut out = Vec::with_capacity(ids.len());
            let mut next = range.start;
            for id in ids {
                let have: Option<u32> = tx
                    .prepare_cached("SELECT uid FROM sandboxes WHERE id = ?1")?
                    .query_row([id], |r| r.get(0))
                    .optional()?
                    .flatten();
                let uid = match (have, family) {
                    (Some(uid), _) | (None, Some(uid)) => uid,
                    (None, None) => {
                        while taken.contains(&next) {
                            next += 1;
                        }
                        if next >= range.end {
                            return Ok(None);
                        }
                        next
                    }
                };
                taken.insert(uid);
                tx.prepare_cached("UPDATE sandboxes SET uid = ?2 WHERE id = ?1")?.execute(params![id, uid])?;
                out.push(uid);
            }
            tx.commit()?;
            Ok(Some(out))
        })?;
        assigned.ok_or_else(exhausted)
    }

    /// Inserts `row` whole, or, when its sandbox has a row, sets the lifecycle columns
    /// from it and keeps the VMM's (an older daemon's own table, merged once).
    pub(super) fn import(&self, row: &SandboxRow) -> Result<(), RegistryError> {
        let r = &row.record;
        let disks = serde_json::to_string(&r.disks)
            .map_err(|source| RegistryError::Record { path: self.path.clone(), source })?;
        self.with(|c| {
            c.prepare_cached(
                "INSERT INTO sandboxes (id, state, op, reason, pid, template, source_tag, forked_from,
                   created_at_unix_ms, memory_limit_bytes, cgroup, disks, last_activity_unix_ms, ttl_seconds,
                   expires_at_unix_ms, archived_at_unix_ms, branch_count, last_branch_tag, cpu_millis, pids_max,
                   io_limits, uid, network, vcpus)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20,
                   ?21, ?22, ?23, ?24)
                 ON CONFLICT (id) DO UPDATE SET state = excluded.state, op = excluded.op, reason = excluded.reason,
                   last_activity_unix_ms = excluded.last_activity_unix_ms, ttl_seconds = excluded.ttl_seconds,
                   expires_at_unix_ms = excluded.expires_at_unix_ms, archived_at_unix_ms = excluded.archived_at_unix_ms,
                   branch_count = excluded.branch_count, last_branch_tag = excluded.last_branch_tag",
            )?
            .execute(params![
                r.id,
                row.state.as_str(),
                row.op,
                row.reason.map(StateReason::as_str),
                (r.pid > 0).then_some(r.pid),
                r.template,
                r.source_tag,
                r.forked_from,
                r.created_at_unix_ms as i64,
                r.memory_limit_bytes.map(|b| b as i64),
                r.cgroup,
                disks,
                row.last_activity_unix_ms as i64,
                row.ttl_seconds.map(|v| v as i64),
                row.expires_at_unix_ms.map(|v| v as i64),
                row.archived_at_unix_ms.map(|v| v as i64),
                row.branch_count,
                row.last_branch_tag,
                r.cpu_millis,
                r.pids_max,
                io_column(&r.io_limits),
                r.uid,
                network_column(&r.network),
                r.vcpus,
            ])
            .map(|_| ())
        })
    }

    /// Moves each of `ids` whose row is in one of `from` to `to` with `reason`, in one
    /// transaction; returns the ids that moved. Entering `archived` stamps the time and
    /// drops the VMM columns; entering a starting state makes this process the owner
    /// (whoever finds it still starting after this process died cleans up).
    pub(super) fn transition(
        &self,
        ids: &[&str],
        from: &[SandboxState],
        to: SandboxState,
        reason: Option<StateReason>,
        now_ms: u64,
    ) -> Result<Vec<String>, RegistryError> {
        let reason = reason.map(StateReason::as_str);
        let from_list: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        let from_json = serde_json::to_string(&from_list).expect("strings serialize");
        let owner = to.is_starting().then(Owner::this_process).flatten();
        let archived = to == SandboxState::Archived;
        self.with(|c| {
            let tx = c.transaction()?;
            let mut moved = Vec::new();
            {
                let mut st = tx.prepare_cached(
                    "UPDATE sandboxes SET state = ?2, reason = ?3,
                       owner_pid = ?4, owner_started_unix_ms = ?5,
                       archived_at_unix_ms = CASE WHEN ?6 THEN ?7 ELSE NULL END,
                       pid = CASE WHEN ?6 THEN NULL ELSE pid END,
                       cgroup = CASE WHEN ?6 THEN NULL ELSE cgroup END,
                       disks = CASE WHEN ?6 THEN '[]' ELSE disks END,
                       uid = CASE WHEN ?6 THEN NULL ELSE uid END,
                       last_activity_unix_ms = CASE WHEN ?9 THEN ?7 ELSE last_activity_unix_ms END
                     WHERE id = ?1 AND state IN (SELECT value FROM json_each(?8))",
                )?;
                for id in ids {
                    let n = st.execute(params![
                        id,
                        to.as_str(),
                        reason,
                        owner.as_ref().map(|o| o.pid),
                        owner.as_ref().map(|o| o.started_unix_ms as i64),
                        archived,
                        now_ms as i64,
                        from_json,
                        to == SandboxState::Running,
                    ])?;
                    if n == 1 {
                        moved.push(id.to_string());
                    }
                }
            }
            tx.commit()?;
            Ok(moved)
        })
    }

    /// Runs `sql` with `id` as `?1` and `args` after it; whether a row changed.
    pub(super) fn update(&self, sql: &str, id: &str, args: &[&dyn rusqlite::ToSql]) -> Result<bool, RegistryError> {
        let mut all: Vec<&dyn rusqlite::ToSql> = vec![&id];
        all.extend_from_slice(args);
        self.with(|c| c.prepare_cached(sql)?.execute(all.as_slice()).map(|n| n > 0))
    }

    /// Sandbox `id`'s row, with its run directory `run_dir`.
    pub(super) fn get(&self, id: &str, run_dir: &Path) -> Result<Option<SandboxRow>, RegistryError> {
        let row =
            self.with(|c| c.prepare_cached(&format!("{SELECT} WHERE id = ?1"))?.query_row([id], row_of).optional())?;
        row.map(|r| r.into_row(run_dir, &self.path)).transpose()
    }

    /// Every row, oldest first, each with its run directory from `run_dir`.
    pub(super) fn all(&self, run_dir: impl Fn(&str) -> PathBuf) -> Result<Vec<SandboxRow>, RegistryError> {
        let rows = self.with(|c| {
            let mut st = c.prepare_cached(&format!("{SELECT} ORDER BY created_at_unix_ms, id"))?;
            let rows = st.query_map([], row_of)?.collect::<rusqlite::Result<Vec<_>>>();
            rows
        })?;
        rows.into_iter()
            .map(|r| {
                let dir = run_dir(&r.id);
                r.into_row(&dir, &self.path)
            })
            .collect()
    }

    /// Removes sandbox `id`'s row if it is in one of `states` (all: `None`); whether it did.
    pub(super) fn delete(&self, id: &str, states: Option<&[SandboxState]>) -> Result<bool, RegistryError> {
        match states {
            None => self.update("DELETE FROM sandboxes WHERE id = ?1", id, &[]),
            Some(states) => {
                let list: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
                let json = serde_json::to_string(&list).expect("strings serialize");
                self.update(
                    "DELETE FROM sandboxes WHERE id = ?1 AND state IN (SELECT value FROM json_each(?2))",
                    id,
                    &[&json],
                )
            }
        }
    }
}

const SELECT: &str = "SELECT id, state, op, reason, owner_pid, owner_started_unix_ms, pid, template, source_tag,
  forked_from, created_at_unix_ms, memory_limit_bytes, cgroup, disks, last_activity_unix_ms, ttl_seconds,
  expires_at_unix_ms, archived_at_unix_ms, branch_count, last_branch_tag, cpu_millis, pids_max, io_limits, uid,
  network, vcpus FROM sandboxes";

/// A row as read, before its state and disks are decoded.
struct Row {
    id: String,
    state: String,
    op: Option<String>,
    reason: Option<String>,
    owner_pid: Option<i32>,
    owner_started_unix_ms: Option<i64>,
    pid: Option<i32>,
    template: Option<String>,
    source_tag: Option<String>,
    forked_from: Option<String>,
    created_at_unix_ms: i64,
    memory_limit_bytes: Option<i64>,
    cgroup: Option<String>,
    disks: String,
    last_activity_unix_ms: i64,
    ttl_seconds: Option<i64>,
    expires_at_unix_ms: Option<i64>,
    archived_at_unix_ms: Option<i64>,
    branch_count: i64,
    last_branch_tag: Option<String>,
    cpu_millis: Option<i64>,
    pids_max: Option<i64>,
    io_limits: Option<String>,
    uid: Option<u32>,
    network: Option<String>,
    vcpus: Option<u8>,
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        state: r.get(1)?,
        op: r.get(2)?,
        reason: r.get(3)?,
        owner_pid: r.get(4)?,
        owner_started_unix_ms: r.get(5)?,
        pid: r.get(6)?,
        template: r.get(7)?,
        source_tag: r.get(8)?,
        forked_from: r.get(9)?,
        created_at_unix_ms: r.get(10)?,
        memory_limit_bytes: r.get(11)?,
        cgroup: r.get(12)?,
        disks: r.get(13)?,
        last_activity_unix_ms: r.get(14)?,
        ttl_seconds: r.get(15)?,
        expires_at_unix_ms: r.get(16)?,
        archived_at_unix_ms: r.get(17)?,
        branch_count: r.get(18)?,
        last_branch_tag: r.get(19)?,
        cpu_millis: r.get(20)?,
        pids_max: r.get(21)?,
        io_limits: r.get(22)?,
        uid: r.get(23)?,
        network: r.get(24)?,
        vcpus: r.get(25)?,
    })
}

/// The `io_limits` column for caps `io`: none when nothing is capped.
fn io_column(io: &forkvm_api::IoLimits) -> Option<String> {
    io.asked().map(|io| serde_json::to_string(&io).unwrap_or_default())
}

/// The `network` column for `policy`: none for the default.
pub(super) fn network_column(policy: &Option<forkvm_api::NetworkPolicy>) -> Option<String> {
    policy.as_ref().filter(|p| !p.is_default()).map(|p| serde_json::to_string(p).unwrap_or_default())
}

/// A stored integer that is a count or a time: negative ones (never written) read as 0.
fn unsigned(v: i64) -> u64 {
    v.max(0) as u64
}

/// A stored 32-bit limit (only written from a `u32`).
fn limit32(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

impl Row {
    fn into_row(self, run_dir: &Path, db: &Path) -> Result<SandboxRow, RegistryError> {
        let disks: Vec<RecordedDisk> = serde_json::from_str(&self.disks)
            .map_err(|source| RegistryError::Record { path: db.to_path_buf(), source })?;
        let io_limits = match &self.io_limits {
            None => forkvm_api::IoLimits::default(),
            Some(json) => {
                serde_json::from_str(json).map_err(|source| RegistryError::Record { path: db.to_path_buf(), source })?
            }
        };
        let network = match &self.network {
            None => None,
            Some(json) => Some(
                serde_json::from_str(json)
                    .map_err(|source| RegistryError::Record { path: db.to_path_buf(), source })?,
            ),
        };
        let state = SandboxState::parse(&self.state)
            .ok_or_else(|| RegistryError::BadState { path: db.to_path_buf(), state: self.state.clone() })?;
        let reason = match self.reason.as_deref().map(|r| (r, StateReason::parse(r))) {
            None => None,
            Some((_, Some(r))) => Some(r),
            Some((r, None)) => return Err(RegistryError::BadState { path: db.to_path_buf(), state: r.to_string() }),
        };
        Ok(SandboxRow {
            record: SandboxRecord {
                id: self.id,
                pid: self.pid.unwrap_or(0),
                run_dir: run_dir.to_path_buf(),
                template: self.template,
                source_tag: self.source_tag,
                forked_from: self.forked_from,
                created_at_unix_ms: unsigned(self.created_at_unix_ms),
                memory_limit_bytes: self.memory_limit_bytes.map(unsigned),
                cpu_millis: self.cpu_millis.map(limit32),
                pids_max: self.pids_max.map(limit32),
                io_limits,
                cgroup: self.cgroup,
                disks,
                uid: self.uid,
                network,
                vcpus: self.vcpus.unwrap_or(1),
            },
            state,
            op: self.op,
            reason,
            owner: match (self.owner_pid, self.owner_started_unix_ms) {
                (Some(pid), Some(t)) => Some(Owner { pid, started_unix_ms: unsigned(t) }),
                _ => None,
            },
            last_activity_unix_ms: unsigned(self.last_activity_unix_ms),
            ttl_seconds: self.ttl_seconds.map(unsigned),
            expires_at_unix_ms: self.expires_at_unix_ms.map(unsigned),
            archived_at_unix_ms: self.archived_at_unix_ms.map(unsigned),
            branch_count: u32::try_from(unsigned(self.branch_count)).unwrap_or(u32::MAX),
            last_branch_tag: self.last_branch_tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CHECK lists exactly the states `SandboxState` has, in the schema and the migration.
    #[test]
    fn the_state_check_is_the_enum() {
        let names: Vec<String> = SandboxState::ALL.iter().map(|s| format!("'{s}'")).collect();
        let check = format!("CHECK (state IN ({}))", names.join(", "));
        assert!(SCHEMA.contains(&check), "{check} not in the schema");
        assert!(MIGRATE_1.contains(&check), "{check} not in the migration");
    }

    #[test]
    fn a_version_1_file_is_migrated_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = Connection::open(dir.path().join(REGISTRY_DB)).unwrap();
        c.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema', '1');
             CREATE TABLE sandboxes (id TEXT PRIMARY KEY, pid INTEGER NOT NULL, template TEXT, source_tag TEXT,
               forked_from TEXT, created_at_unix_ms INTEGER NOT NULL, memory_limit_bytes INTEGER, cgroup TEXT,
               disks TEXT NOT NULL DEFAULT '[]');
             INSERT INTO sandboxes VALUES ('old1', 7, 'python', 'py', NULL, 5000, 1048576, 'sb-old1', '[]');",
        )
        .unwrap();
        drop(c);
        let records = Records::at(dir.path());
        let rows = records.all(|id| dir.path().join(id)).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.record.id.as_str(), r.record.pid, r.state), ("old1", 7, SandboxState::Running));
        assert_eq!((r.record.memory_limit_bytes, r.last_activity_unix_ms), (Some(1 << 20), 5000));
        drop(records);
        let c = Connection::open(dir.path().join(REGISTRY_DB)).unwrap();
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema'", []).unwrap();
        drop(c);
        let err = Records::at(dir.path()).all(|id| dir.path().join(id)).unwrap_err();
        assert!(matches!(err, RegistryError::Version { found: 99, .. }), "{err}");
    }

    #[test]
    fn a_version_2_file_gains_the_cpu_and_tasks_limits_and_the_io_caps() {
        let dir = tempfile::tempdir().unwrap();
        let c = Connection::open(dir.path().join(REGISTRY_DB)).unwrap();
        c.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema', '2');
             CREATE TABLE sandboxes (id TEXT PRIMARY KEY, state TEXT NOT NULL, op TEXT, reason TEXT,
               owner_pid INTEGER, owner_started_unix_ms INTEGER, pid INTEGER, template TEXT, source_tag TEXT,
               forked_from TEXT, created_at_unix_ms INTEGER NOT NULL, memory_limit_bytes INTEGER, cgroup TEXT,
               disks TEXT NOT NULL DEFAULT '[]', last_activity_unix_ms INTEGER NOT NULL, ttl_seconds INTEGER,
               expires_at_unix_ms INTEGER, archived_at_unix_ms INTEGER, branch_count INTEGER NOT NULL DEFAULT 0,
               last_branch_tag TEXT);
             INSERT INTO sandboxes (id, state, pid, created_at_unix_ms, memory_limit_bytes, last_activity_unix_ms)
               VALUES ('old2', 'running', 7, 5000, 1048576, 6000);",
        )
        .unwrap();
        drop(c);
        let records = Records::at(dir.path());
        let rows = records.all(|id| dir.path().join(id)).unwrap();
        let r = &rows[0].record;
        assert_eq!(
            (r.id.as_str(), r.memory_limit_bytes, r.cpu_millis, r.pids_max, r.io_limits),
            ("old2", Some(1 << 20), None, None, forkvm_api::IoLimits::default())
        );
        // The new columns are written and read back.
        let mut again = r.clone();
        again.id = "new3".into();
        again.cpu_millis = Some(500);
        again.pids_max = Some(64);
        again.io_limits = forkvm_api::IoLimits { disk_bytes_per_sec: Some(1 << 20), ..Default::default() };
        again.network =
            Some(forkvm_api::NetworkPolicy { allow_internet: false, allow: vec!["pypi.org".into()], deny: Vec::new() });
        records.put(&[&again], 7000).unwrap();
        let rows = records.all(|id| dir.path().join(id)).unwrap();
        let back = rows.iter().find(|row| row.record.id == "new3").unwrap();
        assert_eq!((back.record.cpu_millis, back.record.pids_max), (Some(500), Some(64)));
        assert_eq!(back.record.io_limits, again.io_limits);
        assert_eq!(back.record.network, again.network);
        // The VMM's columns rewritten keep the policy (the daemon's row has it first).
        records.put(&[&SandboxRecord { network: None, ..again.clone() }], 7001).unwrap();
        let rows = records.all(|id| dir.path().join(id)).unwrap();
        assert_eq!(rows.iter().find(|row| row.record.id == "new3").unwrap().record.network, again.network);
        // The exposed ports' table came with the migration, and its rows go with their sandbox's.
        let ports = |records: &Records| {
            records.with(|c| c.query_row("SELECT COUNT(*) FROM exposed_ports", [], |r| r.get::<_, i64>(0))).unwrap()
        };
        records
            .with(|c| {
                c.execute(
                    "INSERT INTO exposed_ports VALUES ('new3', 80, 'fvp_x', 1, NULL), ('old2', 80, 'fvp_y', 1, 'k')",
                    [],
                )
            })
            .unwrap();
        records.delete("new3", None).unwrap();
        assert_eq!(ports(&records), 1);
        records.delete("old2", None).unwrap();
        assert_eq!(ports(&records), 0);
        // A second open finds the current version and migrates nothing.
        drop(records);
        assert_eq!(Records::at(dir.path()).all(|id| dir.path().join(id)).unwrap().len(), 0);
    }
}
