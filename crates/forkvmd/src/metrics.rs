//! Prometheus metrics, rendered in the text exposition format (0.0.4). A handful of
//! counters and histograms behind one mutex: the daemon records a few events per
//! request, so contention is not a concern and no metrics framework is needed.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Histogram bucket upper bounds, in seconds (1 ms .. 5 min).
const BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, b) in BUCKETS.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// A metric name plus its sorted label pairs.
type Key = (&'static str, Vec<(&'static str, String)>);

#[derive(Debug, Default)]
struct Inner {
    counters: BTreeMap<Key, u64>,
    histograms: BTreeMap<Key, Histogram>,
    gauges: BTreeMap<Key, f64>,
}

/// The daemon's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Point-in-time values read when scraped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub sandboxes_active: usize,
    pub snapshots: usize,
    pub branches_in_flight: usize,
    pub branch_concurrency_cap: usize,
}

const HELP: &[(&str, &str, &str)] = &[
    ("forkvm_http_requests_total", "counter", "HTTP requests by route and status."),
    ("forkvm_http_request_duration_seconds", "histogram", "HTTP request latency by route."),
    ("forkvm_spawns_total", "counter", "Spawn calls (POST /v1/sandboxes, fork) by kind and outcome."),
    ("forkvm_sandboxes_spawned_total", "counter", "Sandboxes started by successful spawns."),
    ("forkvm_spawn_duration_seconds", "histogram", "Spawn call latency until every sandbox was ready, by kind."),
    ("forkvm_branches_total", "counter", "BRANCH calls by mode and outcome."),
    ("forkvm_branch_pause_seconds", "histogram", "Source pause window of successful BRANCH calls, by mode."),
    (
        "forkvm_disk_snapshots_total",
        "counter",
        "Disk snapshot attempts by trigger (schedule, api) and outcome (ok, unchanged, failed).",
    ),
    ("forkvm_disk_snapshot_written_bytes_total", "counter", "Encrypted chunk bytes disk snapshots wrote to the vault."),
    ("forkvm_disk_snapshot_duration_seconds", "histogram", "Disk snapshot latency (seal and write), by trigger."),
    ("forkvm_disk_snapshot_last_duration_seconds", "gauge", "Duration of the last disk snapshot attempt."),
    ("forkvm_disk_snapshot_last_success_unix", "gauge", "When a disk snapshot last succeeded (Unix seconds)."),
    ("forkvm_auto_pauses_total", "counter", "Sandboxes the daemon paused because they were idle (--idle-pause)."),
    ("forkvm_auto_resumes_total", "counter", "Sandboxes paused when idle that a call resumed."),
    ("forkvm_ttl_archives_total", "counter", "Archives made because a sandbox's TTL ran out, by outcome (ok, failed)."),
    ("forkvm_archives_total", "counter", "Archive attempts by reason (api, ttl) and outcome (ok or the error code)."),
    (
        "forkvm_vmm_seccomp_kills_total",
        "counter",
        "Sandboxes whose VMM a seccomp filter stopped (a denied system call; the console log names it).",
    ),
    ("forkvm_restores_total", "counter", "Restores of archived sandboxes by outcome (ok or the error code)."),
    ("forkvm_replications_total", "counter", "Disk snapshots shipped to the replication remote, by outcome."),
    ("forkvm_branch_replications_total", "counter", "Branches pushed to the replication remote, by outcome."),
    ("forkvm_replicated_bytes_total", "counter", "Bytes uploaded to the replication remote (vaults and branches)."),
    ("forkvm_remote_pushed_bytes_total", "counter", "Bytes POST /v1/remote/push uploaded to the daemon's remote."),
    ("forkvm_remote_pulled_bytes_total", "counter", "Bytes POST /v1/remote/pull fetched from the daemon's remote."),
    ("forkvm_replication_last_success_unix", "gauge", "When a disk snapshot was last replicated (Unix seconds)."),
];

impl Metrics {
    pub fn inc(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        self.add(name, labels, 1);
    }

    pub fn add(&self, name: &'static str, labels: &[(&'static str, &str)], n: u64) {
        let key = key(name, labels);
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()).counters.entry(key).or_default() += n;
    }

    pub fn observe(&self, name: &'static str, labels: &[(&'static str, &str)], seconds: f64) {
        let key = key(name, labels);
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).histograms.entry(key).or_default().observe(seconds);
    }

    /// Sets a gauge the daemon updates itself (not one read when scraped).
    pub fn set(&self, name: &'static str, labels: &[(&'static str, &str)], value: f64) {
        let key = key(name, labels);
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).gauges.insert(key, value);
    }

    /// The exposition text.
    pub fn render(&self, g: Gauges) -> String {
        let mut out = String::new();
        let gauges = [
            ("forkvm_sandboxes_active", "Running sandboxes.", g.sandboxes_active),
            ("forkvm_snapshots_total", "Snapshots in the store (ready or writing).", g.snapshots),
            ("forkvm_branches_in_flight", "BRANCH calls in progress.", g.branches_in_flight),
            ("forkvm_branch_concurrency_cap", "Most BRANCH calls at once.", g.branch_concurrency_cap),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let _ = writeln!(out, "# HELP forkvm_build_info forkvm version.\n# TYPE forkvm_build_info gauge");
        let _ = writeln!(out, "forkvm_build_info{{version=\"{}\",api=\"v1\"}} 1", env!("CARGO_PKG_VERSION"));
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((n, labels), v) in inner.counters.iter().filter(|((n, _), _)| n == name) {
                let _ = writeln!(out, "{n}{} {v}", render_labels(labels, None));
            }
            for ((n, labels), v) in inner.gauges.iter().filter(|((n, _), _)| n == name) {
                let _ = writeln!(out, "{n}{} {v}", render_labels(labels, None));
            }
            for ((n, labels), h) in inner.histograms.iter().filter(|((n, _), _)| n == name) {
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(out, "{n}_bucket{} {}", render_labels(labels, Some(&b.to_string())), h.counts[i]);
                }
                let _ = writeln!(out, "{n}_bucket{} {}", render_labels(labels, Some("+Inf")), h.count);
                let _ = writeln!(out, "{n}_sum{} {}", render_labels(labels, None), h.sum);
                let _ = writeln!(out, "{n}_count{} {}", render_labels(labels, None), h.count);
            }
        }
        out
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let mut l: Vec<(&'static str, String)> = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
    l.sort();
    (name, l)
}

fn render_labels(labels: &[(&'static str, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let m = Metrics::default();
        m.inc("forkvm_branches_total", &[("mode", "live"), ("outcome", "ok")]);
        m.inc("forkvm_branches_total", &[("outcome", "ok"), ("mode", "live")]);
        m.observe("forkvm_branch_pause_seconds", &[("mode", "live")], 0.003);
        m.observe("forkvm_branch_pause_seconds", &[("mode", "live")], 0.2);
        let text = m.render(Gauges { sandboxes_active: 3, ..Gauges::default() });
        assert!(text.contains("forkvm_sandboxes_active 3\n"));
        assert!(text.contains("forkvm_branches_total{mode=\"live\",outcome=\"ok\"} 2\n"), "{text}");
        assert!(text.contains("forkvm_branch_pause_seconds_bucket{mode=\"live\",le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("forkvm_branch_pause_seconds_bucket{mode=\"live\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("forkvm_branch_pause_seconds_count{mode=\"live\"} 2\n"));
        assert!(text.contains("forkvm_build_info{version=\""));
        assert!(text.contains("# TYPE forkvm_spawns_total counter"));
        m.set("forkvm_disk_snapshot_last_duration_seconds", &[], 0.25);
        let text = m.render(Gauges::default());
        assert!(text.contains("# TYPE forkvm_disk_snapshot_last_duration_seconds gauge\n"), "{text}");
        assert!(text.contains("\nforkvm_disk_snapshot_last_duration_seconds 0.25\n"), "{text}");
    }
}
