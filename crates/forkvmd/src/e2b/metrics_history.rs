//! E2B's sandbox metrics over time (`GET /sandboxes/{id}/metrics?start=&end=`): every
//! [`PERIOD`] (E2B's bucket) each running E2B sandbox's VMM is sampled from its cgroup —
//! CPU time used and memory — and the last [`KEPT`] samples are kept in memory. CPU use
//! is a rate, so a sample's `cpuUsedPct` comes from the CPU time used since the sample
//! before it, over the wall time between them and the sandbox's vCPUs.
//!
//! The history lives in the daemon's memory: a restarted daemon starts a new one (E2B's
//! own is kept by its control plane; docs/e2b.md says what differs).

use super::wire::SandboxMetric;
use super::E2b;
use crate::audit::rfc3339_ms;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often sandboxes are sampled (E2B's 5 s buckets).
pub const PERIOD: Duration = Duration::from_secs(5);
/// Samples kept per sandbox: an hour of them.
pub const KEPT: usize = 720;

/// One reading of a sandbox's VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at_unix_ms: u64,
    /// CPU time its VMM has used, all threads, since it started.
    pub cpu_usage_usec: u64,
    pub memory_bytes: u64,
}

impl Sample {
    /// The reading of one usage sample of a sandbox's VMM.
    pub fn of(u: &forkvm_api::SandboxUsage) -> Sample {
        Sample { at_unix_ms: u.at_unix_ms, cpu_usage_usec: u.cpu_usage_usec, memory_bytes: u.memory_bytes }
    }
}

/// What E2B reports beside the samples: the sandbox's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub cpu_count: u32,
    pub mem_total: u64,
    pub disk_total: u64,
}

/// The samples of every E2B sandbox, newest last.
#[derive(Debug, Clone, Default)]
pub struct History {
    samples: Arc<Mutex<HashMap<String, VecDeque<Sample>>>>,
}

impl History {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Sample>>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds sandbox `id`'s sample; the oldest past [`KEPT`] goes.
    pub fn record(&self, id: &str, sample: Sample) {
        let mut all = self.lock();
        let kept = all.entry(id.to_string()).or_default();
        if kept.back().is_some_and(|last| last.at_unix_ms >= sample.at_unix_ms) {
            return;
        }
        kept.push_back(sample);
        while kept.len() > KEPT {
            kept.pop_front();
        }
    }

    /// Whether sandbox `id` has been sampled.
    pub fn has(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|k| !k.is_empty())
    }

    /// Drops the samples of sandboxes not in `running`.
    pub fn retain(&self, running: &[String]) {
        self.lock().retain(|id, _| running.iter().any(|r| r == id));
    }

    /// Sandbox `id`'s metrics taken from `start_s` to `end_s` (unix seconds, both
    /// included; absent: unbounded), oldest first. Its first sample has no CPU rate
    /// before it: it reports the CPU time used since the sandbox started is unknown, 0.
    pub fn series(&self, id: &str, start_s: Option<u64>, end_s: Option<u64>, sizes: Sizes) -> Vec<SandboxMetric> {
        let all = self.lock();
        let Some(kept) = all.get(id) else { return Vec::new() };
        let mut out = Vec::new();
        let mut before: Option<&Sample> = None;
        for s in kept {
            let secs = s.at_unix_ms / 1000;
            let within = start_s.is_none_or(|t| secs >= t) && end_s.is_none_or(|t| secs <= t);
            if within {
                out.push(metric(s, before, sizes));
            }
            before = Some(s);
        }
        out
    }
}

/// One E2B metric of `s`, with the CPU rate since `before`.
pub fn metric(s: &Sample, before: Option<&Sample>, sizes: Sizes) -> SandboxMetric {
    SandboxMetric {
        timestamp: rfc3339_ms(s.at_unix_ms),
        timestamp_unix: s.at_unix_ms / 1000,
        cpu_count: sizes.cpu_count,
        cpu_used_pct: before.map_or(0.0, |b| cpu_pct(b, s, sizes.cpu_count)),
        mem_used: s.memory_bytes.min(sizes.mem_total),
        mem_total: sizes.mem_total,
        mem_cache: 0,
        disk_used: 0,
        disk_total: sizes.disk_total,
    }
}

/// Percent of `cpus` CPUs used between two samples (0 to 100, two decimals).
fn cpu_pct(a: &Sample, b: &Sample, cpus: u32) -> f64 {
    let wall_usec = b.at_unix_ms.saturating_sub(a.at_unix_ms) * 1000;
    if wall_usec == 0 || cpus == 0 {
        return 0.0;
    }
    let used = b.cpu_usage_usec.saturating_sub(a.cpu_usage_usec) as f64;
    let pct = used / (wall_usec as f64 * f64::from(cpus)) * 100.0;
    (pct.clamp(0.0, 100.0) * 100.0).round() / 100.0
}

/// One pass: a sample of every running E2B sandbox; samples of the others dropped.
pub fn tick(e2b: &E2b) {
    let Ok(all) = super::records::all(&e2b.app.db()) else { return };
    let mut running = Vec::new();
    for rec in all {
        if super::control::seen(e2b, &rec.id) != super::control::Seen::Running {
            continue;
        }
        if let Ok((r, _)) = e2b.app.registry.lookup(&rec.id) {
            let u = crate::routes::usage::sample(&r);
            e2b.metrics_history.record(&rec.id, Sample::of(&u));
        }
        running.push(rec.id);
    }
    e2b.metrics_history.retain(&running);
}

/// Runs [`tick`] every [`PERIOD`] until the runtime stops.
pub async fn schedule(e2b: E2b) {
    let mut t = tokio::time::interval(PERIOD);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        let e = e2b.clone();
        let _ = tokio::task::spawn_blocking(move || tick(&e)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: Sizes = Sizes { cpu_count: 2, mem_total: 512 << 20, disk_total: 1 << 30 };

    fn at(secs: u64, cpu_usec: u64, mem: u64) -> Sample {
        Sample { at_unix_ms: secs * 1000, cpu_usage_usec: cpu_usec, memory_bytes: mem }
    }

    #[test]
    fn cpu_is_a_rate_between_samples_over_the_vcpus() {
        let h = History::default();
        h.record("a", at(100, 1_000_000, 64 << 20));
        // 5 s later, 2.5 s of CPU on 2 vCPUs: a quarter of them.
        h.record("a", at(105, 3_500_000, 80 << 20));
        h.record("a", at(110, 3_500_000, 1 << 40));
        let s = h.series("a", None, None, SIZES);
        assert_eq!(s.iter().map(|m| m.cpu_used_pct).collect::<Vec<_>>(), [0.0, 25.0, 0.0]);
        assert_eq!(s[1].mem_used, 80 << 20);
        assert_eq!(s[2].mem_used, SIZES.mem_total, "never more than the sandbox has");
        assert_eq!((s[0].timestamp_unix, s[0].timestamp.as_str()), (100, "1970-01-01T00:01:40.000Z"));
        assert_eq!((s[1].cpu_count, s[1].disk_total), (2, 1 << 30));
    }

    #[test]
    fn a_range_picks_samples_and_the_rate_still_uses_the_one_before() {
        let h = History::default();
        for i in 0..10 {
            h.record("a", at(100 + 5 * i, 500_000 * i, 1));
        }
        let s = h.series("a", Some(110), Some(120), SIZES);
        assert_eq!(s.iter().map(|m| m.timestamp_unix).collect::<Vec<_>>(), [110, 115, 120]);
        assert!(s.iter().all(|m| m.cpu_used_pct == 5.0), "0.5 s per 5 s on 2 vCPUs");
        assert!(h.series("a", Some(200), None, SIZES).is_empty());
        assert!(h.series("b", None, None, SIZES).is_empty());
        assert_eq!(h.series("a", None, Some(104), SIZES).len(), 1);
    }

    #[test]
    fn the_history_is_bounded_ordered_and_dropped_with_the_sandbox() {
        let h = History::default();
        for i in 0..(KEPT as u64 + 10) {
            h.record("a", at(i, 0, 0));
        }
        h.record("a", at(3, 0, 0));
        let s = h.series("a", None, None, SIZES);
        assert_eq!(s.len(), KEPT);
        assert_eq!(s[0].timestamp_unix, 10, "the oldest went; one out of order is not added");
        h.record("b", at(1, 0, 0));
        h.retain(&["b".to_string()]);
        assert!(h.series("a", None, None, SIZES).is_empty());
        assert_eq!(h.series("b", None, None, SIZES).len(), 1);
    }
}
