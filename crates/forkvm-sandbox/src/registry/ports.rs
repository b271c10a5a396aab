//! A sandbox's exposed ports and their tokens, in the registry next to its row (table
//! `exposed_ports`; a trigger removes them with the row). A token is minted for one
//! sandbox and one port and never copied: a fork's child that keeps its source's ports
//! gets tokens of its own ([`Registry::expose_like`]), so a parent's token can never
//! route to a child. Tokens are compared in constant time. A port may be bound to a
//! key (DPoP: its thumbprint, `dpop_jkt`); a child keeps the binding (the same caller
//! holds the key) under its own token.

use super::{records::Records, Registry, RegistryError};
use rusqlite::{params, OptionalExtension};
use subtle::ConstantTimeEq;

/// What every token starts with (so a leaked one is recognisable by secret scanners).
pub const TOKEN_PREFIX: &str = "fvp_";

/// One exposed port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedPortRecord {
    pub port: u16,
    pub token: String,
    pub created_at_unix_ms: u64,
    /// The key thumbprint its token is bound to (DPoP); `None`: a bearer token.
    pub dpop_jkt: Option<String>,
}

impl ExposedPortRecord {
    /// Whether `presented` is this port's token (constant time in its contents).
    pub fn token_matches(&self, presented: &[u8]) -> bool {
        let want = self.token.as_bytes();
        want.len() == presented.len() && bool::from(want.ct_eq(presented))
    }

    /// As the API shows it, for sandbox `id`, its own origin under `ports_domain`.
    pub fn to_api(&self, id: &str, ports_domain: &str) -> forkvm_api::ExposedPort {
        forkvm_api::ExposedPort {
            port: self.port,
            path: forkvm_api::ports::port_path(id, self.port),
            token: self.token.clone(),
            created_at_unix_ms: self.created_at_unix_ms,
            dpop_jkt: self.dpop_jkt.clone(),
            host: forkvm_api::ports::port_host(id, self.port, ports_domain),
        }
    }
}

/// A new token: 32 bytes from the kernel's CSPRNG, hex, after [`TOKEN_PREFIX`].
fn new_token() -> Result<String, RegistryError> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| RegistryError::Io {
        path: "getrandom".into(),
        source: std::io::Error::other(format!("a port token's random bytes: {e}")),
    })?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{TOKEN_PREFIX}{hex}"))
}

fn port_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ExposedPortRecord> {
    Ok(ExposedPortRecord {
        port: r.get::<_, i64>(0)? as u16,
        token: r.get(1)?,
        created_at_unix_ms: r.get::<_, i64>(2)? as u64,
        dpop_jkt: r.get(3)?,
    })
}

impl Records {
    fn port_rows(&self, id: &str) -> Result<Vec<ExposedPortRecord>, RegistryError> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT port, token, created_at_unix_ms, dpop_jkt FROM exposed_ports WHERE sandbox_id = ?1 ORDER BY port",
            )?;
            let rows = st.query_map([id], port_row)?;
            rows.collect()
        })
    }
}

impl Registry {
    /// Exposes `port` of sandbox `id`, its token bound to key `dpop_jkt` if given: its
    /// record, with a new token, or the one it had if the port was exposed already (with
    /// the same binding; another is `PortBound`). `NotFound` when the sandbox has no row.
    pub fn expose(&self, id: &str, port: u16, dpop_jkt: Option<&str>) -> Result<ExposedPortRecord, RegistryError> {
        if port == 0 {
            return Err(RegistryError::BadPort(port));
        }
        let token = new_token()?;
        let now = super::now_unix_ms();
        self.records.with(|c| {
            c.prepare_cached(
                "INSERT OR IGNORE INTO exposed_ports (sandbox_id, port, token, created_at_unix_ms, dpop_jkt)
                   SELECT ?1, ?2, ?3, ?4, ?5 WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1)",
            )?
            .execute(params![id, port as i64, token, now as i64, dpop_jkt])
        })?;
        let found = self.exposed_port(id, port)?.ok_or_else(|| RegistryError::NotFound(id.to_string()))?;
        if found.dpop_jkt.as_deref() != dpop_jkt {
            return Err(RegistryError::PortBound { id: id.to_string(), port });
        }
        Ok(found)
    }

    /// Exposes, for sandbox `id`, the ports `source` has, each with a token of its own
    /// (a fork's child). Ports it has already keep theirs.
    pub fn expose_like(&self, id: &str, source: &str) -> Result<Vec<ExposedPortRecord>, RegistryError> {
        for p in self.records.port_rows(source)? {
            self.expose(id, p.port, p.dpop_jkt.as_deref())?;
        }
        self.exposed(id)
    }

    /// Sandbox `id`'s exposed ports, by port.
    pub fn exposed(&self, id: &str) -> Result<Vec<ExposedPortRecord>, RegistryError> {
        self.records.port_rows(id)
    }

    /// Port `port` of sandbox `id`, if exposed.
    pub fn exposed_port(&self, id: &str, port: u16) -> Result<Option<ExposedPortRecord>, RegistryError> {
        self.records.with(|c| {
            c.prepare_cached(
                "SELECT port, token, created_at_unix_ms, dpop_jkt FROM exposed_ports WHERE sandbox_id = ?1 AND port = ?2",
            )?
            .query_row(params![id, port as i64], port_row)
            .optional()
        })
    }

    /// Stops exposing `port` of sandbox `id` (its token stops working at once); whether
    /// it was exposed.
    pub fn unexpose(&self, id: &str, port: u16) -> Result<bool, RegistryError> {
        self.records.with(|c| {
            c.prepare_cached("DELETE FROM exposed_ports WHERE sandbox_id = ?1 AND port = ?2")?
                .execute(params![id, port as i64])
                .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Origin;

    fn registry_with(ids: &[&str]) -> (tempfile::TempDir, Registry) {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(dir.path());
        let records: Vec<_> = ids.iter().map(|id| reg.new_record(id, Origin::default()).unwrap()).collect();
        reg.begin(&records.iter().collect::<Vec<_>>(), None).unwrap();
        (dir, reg)
    }

    #[test]
    fn tokens_are_per_sandbox_and_port_and_go_with_the_sandbox() {
        let (_dir, reg) = registry_with(&["parent", "child"]);
        let a = reg.expose("parent", 8000, None).unwrap();
        assert!(a.token.starts_with(TOKEN_PREFIX) && a.token.len() == TOKEN_PREFIX.len() + 64, "{}", a.token);
        assert_eq!(reg.expose("parent", 8000, None).unwrap(), a, "exposing again keeps the token");
        assert!(matches!(reg.expose("parent", 8000, Some("k")), Err(RegistryError::PortBound { .. })));
        let b = reg.expose("parent", 9000, Some("jkt-of-a-key")).unwrap();
        assert_eq!(b.dpop_jkt.as_deref(), Some("jkt-of-a-key"));
        assert_ne!(a.token, b.token);
        let child = reg.expose_like("child", "parent").unwrap();
        assert_eq!(child.iter().map(|p| p.port).collect::<Vec<_>>(), [8000, 9000]);
        assert_eq!(child[1].dpop_jkt, b.dpop_jkt, "a child's port keeps its key binding");
        assert!(child.iter().all(|c| c.token != a.token && c.token != b.token), "a child's tokens are its own");
        assert!(a.token_matches(a.token.as_bytes()));
        assert!(!child[0].token_matches(a.token.as_bytes()));
        assert!(!a.token_matches(&a.token.as_bytes()[1..]));
        assert!(matches!(reg.expose("nobody", 80, None), Err(RegistryError::NotFound(_))));
        assert!(matches!(reg.expose("parent", 0, None), Err(RegistryError::BadPort(0))));
        assert!(reg.unexpose("parent", 9000).unwrap());
        assert!(!reg.unexpose("parent", 9000).unwrap());
        assert_eq!(reg.exposed("parent").unwrap(), [a]);
        reg.records.delete("parent", None).unwrap();
        assert_eq!(reg.exposed("parent").unwrap(), [], "a removed sandbox's ports go with it");
        assert_eq!(reg.exposed("child").unwrap().len(), 2);
    }
}
