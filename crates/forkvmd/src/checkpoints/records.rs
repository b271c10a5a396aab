//! What the daemon keeps about checkpoints, beside their snapshots in the store: each
//! sandbox's policy, the base its checkpoints are diffs over, the next number, and one
//! row per checkpoint (what took it, what ran just before it, what it cost). Tables of
//! the daemon's database, so a restarted daemon still lists and rewinds.

use crate::db::{Db, DbError};
use forkvm_api::{CheckpointInfo, CheckpointPolicy};
use rusqlite::{params, OptionalExtension};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS checkpoint_policies (
  sandbox_id TEXT PRIMARY KEY,
  every_seconds INTEGER,
  after_exec INTEGER NOT NULL,
  keep INTEGER NOT NULL,
  max_stored_mib INTEGER,
  max_age_seconds INTEGER,
  thin_after_seconds INTEGER,
  thin_every_seconds INTEGER,
  base_tag TEXT,
  next_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
  sandbox_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  tag TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  trigger TEXT NOT NULL,
  note TEXT,
  pause_ms REAL NOT NULL,
  pages INTEGER NOT NULL,
  bytes_stored INTEGER NOT NULL,
  disk_bytes_stored INTEGER NOT NULL DEFAULT 0,
  total_ms REAL NOT NULL,
  PRIMARY KEY (sandbox_id, seq)
);
";

/// Columns added after the tables first shipped: (table, column, its declaration).
const ADDED_COLUMNS: [(&str, &str, &str); 3] = [
    ("checkpoint_policies", "thin_after_seconds", "INTEGER"),
    ("checkpoint_policies", "thin_every_seconds", "INTEGER"),
    ("checkpoints", "disk_bytes_stored", "INTEGER NOT NULL DEFAULT 0"),
];

/// Creates the tables when they are missing, and adds the columns an older daemon's
/// tables lack.
pub fn create_tables(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    for (table, column, decl) in ADDED_COLUMNS {
        let has: bool = conn.query_row(
            &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
            [column],
            |r| r.get(0),
        )?;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
        }
    }
    Ok(())
}

/// A sandbox's checkpoint settings and counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyRow {
    pub policy: CheckpointPolicy,
    /// Fixed at its first checkpoint.
    pub base_tag: Option<String>,
    pub next_seq: u64,
}

pub fn policy(db: &Db, id: &str) -> Result<Option<PolicyRow>, DbError> {
    let row = db
        .conn()
        .query_row(
            "SELECT every_seconds, after_exec, keep, max_stored_mib, max_age_seconds, base_tag, next_seq,
               thin_after_seconds, thin_every_seconds
             FROM checkpoint_policies WHERE sandbox_id = ?1",
            [id],
            |r| {
                Ok(PolicyRow {
                    policy: CheckpointPolicy {
                        every_seconds: r.get::<_, Option<i64>>(0)?.map(|s| s as u64),
                        after_exec: r.get(1)?,
                        keep: r.get(2)?,
                        max_stored_mib: r.get::<_, Option<i64>>(3)?.map(|m| m as u64),
                        max_age_seconds: r.get::<_, Option<i64>>(4)?.map(|a| a as u64),
                        thin_after_seconds: r.get::<_, Option<i64>>(7)?.map(|a| a as u64),
                        thin_every_seconds: r.get::<_, Option<i64>>(8)?.map(|e| e as u64),
                    },
                    base_tag: r.get(5)?,
                    next_seq: r.get::<_, i64>(6)? as u64,
                })
            },
        )
        .optional()?;
    Ok(row)
}

/// Sets sandbox `id`'s policy (its base and numbering are kept).
pub fn set_policy(db: &Db, id: &str, p: &CheckpointPolicy) -> Result<(), DbError> {
    db.conn().execute(
        "INSERT INTO checkpoint_policies
           (sandbox_id, every_seconds, after_exec, keep, max_stored_mib, max_age_seconds,
            thin_after_seconds, thin_every_seconds, base_tag, next_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, 1)
         ON CONFLICT(sandbox_id) DO UPDATE SET
           every_seconds = ?2, after_exec = ?3, keep = ?4, max_stored_mib = ?5, max_age_seconds = ?6,
           thin_after_seconds = ?7, thin_every_seconds = ?8",
        params![
            id,
            p.every_seconds.map(|s| s as i64),
            p.after_exec,
            p.keep,
            p.max_stored_mib.map(|m| m as i64),
            p.max_age_seconds.map(|a| a as i64),
            p.thin_after_seconds.map(|a| a as i64),
            p.thin_every_seconds.map(|e| e as i64)
        ],
    )?;
    Ok(())
}

/// Takes the next checkpoint number of sandbox `id` and fixes its base to `base` if it
/// had none; returns the number and the base in force.
pub fn claim_seq(db: &Db, id: &str, base: &str) -> Result<(u64, String), DbError> {
    let c = db.conn();
    c.execute(
        "INSERT INTO checkpoint_policies (sandbox_id, every_seconds, after_exec, keep, base_tag, next_seq)
         VALUES (?1, NULL, 0, ?2, ?3, 1) ON CONFLICT(sandbox_id) DO NOTHING",
        params![id, CheckpointPolicy::default().keep, base],
    )?;
    c.execute(
        "UPDATE checkpoint_policies SET base_tag = ?2 WHERE sandbox_id = ?1 AND base_tag IS NULL",
        params![id, base],
    )?;
    let (seq, base): (i64, String) = c.query_row(
        "UPDATE checkpoint_policies SET next_seq = next_seq + 1 WHERE sandbox_id = ?1 RETURNING next_seq - 1, base_tag",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((seq as u64, base))
}

pub fn insert(db: &Db, c: &CheckpointInfo) -> Result<(), DbError> {
    db.conn().execute(
        "INSERT INTO checkpoints (sandbox_id, seq, tag, created_at_ms, trigger, note, pause_ms, pages, bytes_stored,
           total_ms, disk_bytes_stored)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            c.sandbox_id,
            c.seq as i64,
            c.tag,
            c.created_at_unix_ms as i64,
            c.trigger,
            c.note,
            c.pause_ms,
            c.pages as i64,
            c.bytes_stored as i64,
            c.total_ms,
            c.disk_bytes_stored as i64
        ],
    )?;
    Ok(())
}

/// Sandbox `id`'s checkpoints, oldest first.
pub fn list(db: &Db, id: &str) -> Result<Vec<CheckpointInfo>, DbError> {
    let mut st = db.conn().prepare(
        "SELECT sandbox_id, seq, tag, created_at_ms, trigger, note, pause_ms, pages, bytes_stored, total_ms,
           disk_bytes_stored
         FROM checkpoints WHERE sandbox_id = ?1 ORDER BY seq",
    )?;
    let rows = st
        .query_map([id], |r| {
            Ok(CheckpointInfo {
                sandbox_id: r.get(0)?,
                seq: r.get::<_, i64>(1)? as u64,
                tag: r.get(2)?,
                created_at_unix_ms: r.get::<_, i64>(3)? as u64,
                trigger: r.get(4)?,
                note: r.get(5)?,
                pause_ms: r.get(6)?,
                pages: r.get::<_, i64>(7)? as u64,
                bytes_stored: r.get::<_, i64>(8)? as u64,
                total_ms: r.get(9)?,
                disk_bytes_stored: r.get::<_, i64>(10)? as u64,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub fn delete(db: &Db, id: &str, seq: u64) -> Result<(), DbError> {
    db.conn().execute("DELETE FROM checkpoints WHERE sandbox_id = ?1 AND seq = ?2", params![id, seq as i64])?;
    Ok(())
}

/// Forgets sandbox `id`'s policy and checkpoints.
pub fn delete_all(db: &Db, id: &str) -> Result<(), DbError> {
    db.conn().execute("DELETE FROM checkpoints WHERE sandbox_id = ?1", [id])?;
    db.conn().execute("DELETE FROM checkpoint_policies WHERE sandbox_id = ?1", [id])?;
    Ok(())
}

/// Every sandbox the tables hold anything of.
pub fn sandboxes(db: &Db) -> Result<Vec<String>, DbError> {
    let mut st = db
        .conn()
        .prepare("SELECT sandbox_id FROM checkpoint_policies UNION SELECT sandbox_id FROM checkpoints ORDER BY 1")?;
    let rows = st.query_map([], |r| r.get(0))?.collect::<Result<Vec<String>, _>>()?;
    Ok(rows)
}

/// Sandboxes with a timer, and its period in seconds.
pub fn timed(db: &Db) -> Result<Vec<(String, u64)>, DbError> {
    let mut st = db
        .conn()
        .prepare("SELECT sandbox_id, every_seconds FROM checkpoint_policies WHERE every_seconds IS NOT NULL")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, seq: u64) -> CheckpointInfo {
        CheckpointInfo {
            sandbox_id: id.into(),
            seq,
            tag: format!("ckpt-{id}-{seq}"),
            created_at_unix_ms: 1000 + seq,
            trigger: "api".into(),
            note: Some(format!("step {seq}")),
            pause_ms: 1.5,
            pages: 10,
            bytes_stored: 4096,
            disk_bytes_stored: 1024,
            total_ms: 20.0,
        }
    }

    #[test]
    fn numbers_are_claimed_once_and_the_base_is_fixed_by_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(policy(&db, "a").unwrap(), None);
        assert_eq!(claim_seq(&db, "a", "py").unwrap(), (1, "py".into()));
        assert_eq!(claim_seq(&db, "a", "ckpt-a-1").unwrap(), (2, "py".into()), "the base stays");
        assert_eq!(claim_seq(&db, "b", "tiny").unwrap(), (1, "tiny".into()));
        let p = CheckpointPolicy {
            every_seconds: Some(5),
            after_exec: true,
            keep: 3,
            max_stored_mib: Some(64),
            max_age_seconds: Some(600),
            thin_after_seconds: Some(600),
            thin_every_seconds: Some(60),
        };
        set_policy(&db, "a", &p).unwrap();
        let row = policy(&db, "a").unwrap().unwrap();
        assert_eq!((row.policy, row.base_tag.as_deref(), row.next_seq), (p, Some("py"), 3));
        assert_eq!(timed(&db).unwrap(), vec![("a".to_string(), 5)]);
        set_policy(&db, "c", &CheckpointPolicy::default()).unwrap();
        assert_eq!(claim_seq(&db, "c", "py").unwrap(), (1, "py".into()), "a policy set first has no base yet");
        for seq in [1, 2] {
            insert(&db, &info("a", seq)).unwrap();
        }
        assert!(insert(&db, &info("a", 2)).is_err(), "a number is taken once");
        assert_eq!(list(&db, "a").unwrap(), vec![info("a", 1), info("a", 2)]);
        delete(&db, "a", 1).unwrap();
        assert_eq!(list(&db, "a").unwrap(), vec![info("a", 2)]);
        assert_eq!(sandboxes(&db).unwrap(), ["a", "b", "c"]);
        delete_all(&db, "a").unwrap();
        assert!(list(&db, "a").unwrap().is_empty() && policy(&db, "a").unwrap().is_none());
        assert_eq!(sandboxes(&db).unwrap(), ["b", "c"]);
    }

    #[test]
    fn an_older_daemons_tables_gain_the_new_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE checkpoint_policies (sandbox_id TEXT PRIMARY KEY, every_seconds INTEGER,
                   after_exec INTEGER NOT NULL, keep INTEGER NOT NULL, max_stored_mib INTEGER,
                   max_age_seconds INTEGER, base_tag TEXT, next_seq INTEGER NOT NULL);
                 CREATE TABLE checkpoints (sandbox_id TEXT NOT NULL, seq INTEGER NOT NULL, tag TEXT NOT NULL,
                   created_at_ms INTEGER NOT NULL, trigger TEXT NOT NULL, note TEXT, pause_ms REAL NOT NULL,
                   pages INTEGER NOT NULL, bytes_stored INTEGER NOT NULL, total_ms REAL NOT NULL,
                   PRIMARY KEY (sandbox_id, seq));
                 INSERT INTO checkpoint_policies VALUES ('a', NULL, 1, 4, NULL, NULL, 'py', 2);
                 INSERT INTO checkpoints VALUES ('a', 1, 'ckpt-a-1', 5, 'exec', NULL, 1.0, 3, 4096, 9.0);",
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        let row = policy(&db, "a").unwrap().unwrap();
        assert!(row.policy.after_exec && row.policy.thin_after_seconds.is_none() && row.next_seq == 2);
        let [old] = &list(&db, "a").unwrap()[..] else { panic!("one checkpoint") };
        assert_eq!((old.bytes_stored, old.disk_bytes_stored), (4096, 0));
        insert(&db, &info("a", 2)).unwrap();
        assert_eq!(list(&db, "a").unwrap()[1], info("a", 2));
        drop(db);
        Db::open(&path).expect("opening it again adds nothing twice");
    }
}
