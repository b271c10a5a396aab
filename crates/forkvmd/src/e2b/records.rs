//! What the E2B face keeps about the sandboxes it made, beside the registry row every
//! sandbox has: the template name the client asked for, the envd access token (the
//! same across pause and connect, as E2B's SDKs expect), metadata, sandbox-wide
//! environment variables, and the lifetime (`endAt`, and whether its end pauses or
//! kills). A table of the daemon's database, so a restarted daemon still serves them.
//!
//! A sandbox the E2B face did not make has no row here and is not shown through it.

use crate::db::{Db, DbError};
use rusqlite::{params, OptionalExtension};
use std::collections::BTreeMap;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS e2b_sandboxes (
  id TEXT PRIMARY KEY,
  template_id TEXT NOT NULL,
  access_token TEXT NOT NULL,
  metadata TEXT NOT NULL,
  env_vars TEXT NOT NULL,
  started_at_ms INTEGER NOT NULL,
  end_at_ms INTEGER NOT NULL,
  auto_pause INTEGER NOT NULL,
  cpu_count INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  disk_mb INTEGER NOT NULL
);
";

/// One sandbox the E2B face made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSandbox {
    pub id: String,
    /// The `templateID` the client sent (E2B's SDKs compare it, not our tag).
    pub template_id: String,
    /// `envdAccessToken`: every data-plane request for it must carry it.
    pub access_token: String,
    pub metadata: BTreeMap<String, String>,
    /// Set in every process the sandbox runs through envd.
    pub env_vars: BTreeMap<String, String>,
    pub started_at_ms: u64,
    /// When its lifetime ends (Unix ms).
    pub end_at_ms: u64,
    /// At the end: pause (`true`) or kill.
    pub auto_pause: bool,
    /// Its size, from its snapshot: vCPUs, guest memory and root disk.
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// A new access token: 32 random bytes, hex.
pub fn new_access_token() -> Result<String, std::io::Error> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| std::io::Error::other(format!("getrandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn map_json(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<E2bSandbox> {
    Ok(E2bSandbox {
        id: r.get(0)?,
        template_id: r.get(1)?,
        access_token: r.get(2)?,
        metadata: map_json(&r.get::<_, String>(3)?),
        env_vars: map_json(&r.get::<_, String>(4)?),
        started_at_ms: r.get::<_, i64>(5)? as u64,
        end_at_ms: r.get::<_, i64>(6)? as u64,
        auto_pause: r.get(7)?,
        cpu_count: r.get(8)?,
        memory_mb: r.get::<_, i64>(9)? as u64,
        disk_mb: r.get::<_, i64>(10)? as u64,
    })
}

const COLUMNS: &str =
    "id, template_id, access_token, metadata, env_vars, started_at_ms, end_at_ms, auto_pause, cpu_count, memory_mb, disk_mb";

/// Creates the table when it is missing.
pub fn create_table(db: &Db) -> Result<(), DbError> {
    db.conn().execute_batch(SCHEMA)?;
    Ok(())
}

pub fn insert(db: &Db, s: &E2bSandbox) -> Result<(), DbError> {
    let json = |m: &BTreeMap<String, String>| serde_json::to_string(m).unwrap_or_else(|_| "{}".into());
    db.conn().execute(
        &format!(
            "INSERT OR REPLACE INTO e2b_sandboxes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ),
        params![
            s.id,
            s.template_id,
            s.access_token,
            json(&s.metadata),
            json(&s.env_vars),
            s.started_at_ms as i64,
            s.end_at_ms as i64,
            s.auto_pause,
            s.cpu_count,
            s.memory_mb as i64,
            s.disk_mb as i64
        ],
    )?;
    Ok(())
}

pub fn get(db: &Db, id: &str) -> Result<Option<E2bSandbox>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM e2b_sandboxes WHERE id = ?1");
    Ok(db.conn().query_row(&sql, [id], row).optional()?)
}

pub fn all(db: &Db) -> Result<Vec<E2bSandbox>, DbError> {
    let mut stmt = db.conn().prepare(&format!("SELECT {COLUMNS} FROM e2b_sandboxes"))?;
    let rows = stmt.query_map([], row)?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub fn set_end(db: &Db, id: &str, end_at_ms: u64) -> Result<bool, DbError> {
    Ok(db.conn().execute("UPDATE e2b_sandboxes SET end_at_ms = ?2 WHERE id = ?1", params![id, end_at_ms as i64])? > 0)
}

pub fn delete(db: &Db, id: &str) -> Result<(), DbError> {
    db.conn().execute("DELETE FROM e2b_sandboxes WHERE id = ?1", [id])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_tokens_differ() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("state.db")).unwrap();
        create_table(&db).unwrap();
        create_table(&db).unwrap();
        let s = E2bSandbox {
            id: "abc".into(),
            template_id: "base".into(),
            access_token: new_access_token().unwrap(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            env_vars: [("A".to_string(), "1".to_string())].into(),
            started_at_ms: 1,
            end_at_ms: 2,
            auto_pause: true,
            cpu_count: 2,
            memory_mb: 512,
            disk_mb: 1024,
        };
        assert_eq!(s.access_token.len(), 64);
        assert_ne!(s.access_token, new_access_token().unwrap());
        insert(&db, &s).unwrap();
        assert_eq!(get(&db, "abc").unwrap(), Some(s.clone()));
        assert!(set_end(&db, "abc", 9).unwrap());
        assert!(!set_end(&db, "nope", 9).unwrap());
        assert_eq!(all(&db).unwrap()[0].end_at_ms, 9);
        delete(&db, "abc").unwrap();
        assert_eq!(get(&db, "abc").unwrap(), None);
    }
}
