//! The audit log: one JSON line per request, appended and never rewritten — time, peer,
//! method, path, status, latency, and the sandbox or tag the path names. The layer wraps
//! authentication, so refused requests are logged too. Rotation: move the file away and
//! send SIGHUP, or restart; the daemon reopens it (append mode) on SIGHUP.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Who is on the other end of a connection, attached to each request as an extension.
#[derive(Debug, Clone)]
pub struct Peer(pub String);

#[derive(Debug, Serialize)]
struct Entry<'a> {
    ts: String,
    peer: &'a str,
    method: &'a str,
    path: &'a str,
    status: u16,
    latency_us: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ua: Option<&'a str>,
}

/// Most refusal lines written per [`REFUSAL_WINDOW`]; the rest are counted and the
/// count is written with the next line that gets through.
pub const REFUSALS_PER_WINDOW: u32 = 20;
pub const REFUSAL_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    file: Arc<Mutex<File>>,
    refusals: Arc<Mutex<RefusalBudget>>,
}

/// The rate limit of refusal lines.
#[derive(Debug)]
struct RefusalBudget {
    window_start: Instant,
    written: u32,
    suppressed: u64,
}

impl RefusalBudget {
    /// Whether a line may be written now, and how many were suppressed before it.
    fn take(&mut self, now: Instant) -> Option<u64> {
        if now.duration_since(self.window_start) >= REFUSAL_WINDOW {
            self.window_start = now;
            self.written = 0;
        }
        if self.written >= REFUSALS_PER_WINDOW {
            self.suppressed += 1;
            return None;
        }
        self.written += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl AuditLog {
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let budget = RefusalBudget { window_start: Instant::now(), written: 0, suppressed: 0 };
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Arc::new(Mutex::new(file)),
            refusals: Arc::new(Mutex::new(budget)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reopens the file (after rotation).
    pub fn reopen(&self) -> std::io::Result<()> {
        let file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }

    /// A line for something the daemon did on its own, not for a request (e.g. a
    /// scheduled disk snapshot that failed): `{"ts", "peer": "forkvmd", "event",
    /// "sandbox", ...details}`.
    pub fn event(&self, event: &str, sandbox: Option<&str>, details: serde_json::Value) {
        let mut line = serde_json::json!({ "ts": rfc3339_now(), "peer": "forkvmd", "event": event });
        if let Some(id) = sandbox {
            line["sandbox"] = id.into();
        }
        if let (Some(out), serde_json::Value::Object(more)) = (line.as_object_mut(), details) {
            out.extend(more);
        }
        self.append(&line);
    }

    /// A line for a request the gate refused, unless more than [`REFUSALS_PER_WINDOW`]
    /// were written in this window (then it is only counted, in `suppressed` of the
    /// next line written).
    pub fn refused(&self, peer: &str, method: &str, path: &str, status: u16, reason: &str) {
        let Some(suppressed) = self.refusals.lock().unwrap_or_else(|p| p.into_inner()).take(Instant::now()) else {
            return;
        };
        // A refused request's path is attacker-chosen: bound what the log keeps of it.
        let path: String = path.chars().take(256).collect();
        let mut line = serde_json::json!({
            "ts": rfc3339_now(), "peer": peer, "method": method, "path": path, "status": status,
            "refused": reason,
        });
        if suppressed > 0 {
            line["suppressed"] = suppressed.into();
        }
        self.append(&line);
    }

    fn append(&self, e: &impl Serialize) {
        let Ok(mut line) = serde_json::to_vec(e) else { return };
        line.push(b'\n');
        // One write per line: O_APPEND keeps concurrent lines whole.
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = f.write_all(&line) {
            tracing::warn!(path = %self.path.display(), %err, "audit log write failed");
        }
    }
}

/// RFC 3339 UTC with milliseconds, now.
pub fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339_ms(now.as_millis() as u64)
}

/// RFC 3339 UTC with milliseconds of a Unix time in milliseconds.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let secs = (unix_ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, (rem % 3600) / 60, rem % 60, unix_ms % 1000)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The sandbox id or snapshot tag a path names.
fn subject(path: &str) -> (Option<&str>, Option<&str>) {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some("sandboxes"), Some(id)) => (Some(id), None),
        (Some("v1"), Some("snapshots"), Some(tag)) => (None, Some(tag)),
        _ => (None, None),
    }
}

/// Middleware writing one line per request.
pub async fn record(State(log): State<AuditLog>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let peer = req.extensions().get::<Peer>().map(|p| p.0.clone()).unwrap_or_else(|| "in-process".into());
    let ua = req.headers().get(axum::http::header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from);
    let resp = next.run(req).await;
    let (sandbox, tag) = subject(&path);
    log.append(&Entry {
        ts: rfc3339_now(),
        peer: &peer,
        method: &method,
        path: &path,
        status: resp.status().as_u16(),
        latency_us: started.elapsed().as_micros() as u64,
        sandbox,
        tag,
        ua: ua.as_deref(),
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert!(rfc3339_now().ends_with('Z'));
    }

    #[test]
    fn refusals_are_rate_limited() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(&dir.path().join("audit.log")).unwrap();
        for _ in 0..1000 {
            log.refused("1.2.3.4:5", "GET", "/v1/sandboxes", 401, "missing bearer token");
        }
        let lines = std::fs::read_to_string(log.path()).unwrap().lines().count();
        assert!(lines <= 2 * REFUSALS_PER_WINDOW as usize, "{lines} lines for 1000 refusals in a burst");
        let mut budget = RefusalBudget { window_start: Instant::now(), written: 0, suppressed: 0 };
        let t0 = budget.window_start;
        for _ in 0..REFUSALS_PER_WINDOW {
            assert_eq!(budget.take(t0), Some(0));
        }
        assert_eq!(budget.take(t0), None);
        assert_eq!(budget.take(t0), None);
        assert_eq!(budget.take(t0 + REFUSAL_WINDOW), Some(2));
    }

    #[test]
    fn subjects() {
        assert_eq!(subject("/v1/sandboxes/abc/exec"), (Some("abc"), None));
        assert_eq!(subject("/v1/snapshots/py/info"), (None, Some("py")));
        assert_eq!(subject("/v1/sandboxes"), (None, None));
    }
}
