//! Step timings for benchmarks and reports: a restore's steps (`status` reports them) and
//! a branch's pause window. Wall time and the calling thread's CPU time per step (wall
//! time includes waiting for a CPU when many VMs start at once; CPU time is the host-side
//! work).

use std::time::{Duration, Instant};

/// CPU time the calling thread has used (user + kernel, so KVM ioctls count).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[derive(Debug)]
pub struct PhaseTimer {
    last: Instant,
    started_cpu: Duration,
    last_cpu: Duration,
    /// Each step's name, wall time and CPU time.
    steps: Vec<(String, Duration, Duration)>,
}

impl PhaseTimer {
    pub fn new() -> PhaseTimer {
        let cpu = thread_cpu_time();
        PhaseTimer { last: Instant::now(), started_cpu: cpu, last_cpu: cpu, steps: Vec::new() }
    }

    /// Ends the step `name` (it began at the previous mark, or at `new`).
    pub fn mark(&mut self, name: &str) {
        let (now, cpu) = (Instant::now(), thread_cpu_time());
        self.steps.push((name.to_string(), now - self.last, cpu.saturating_sub(self.last_cpu)));
        (self.last, self.last_cpu) = (now, cpu);
    }

    /// Each step's wall time in `unit`s (1e3: milliseconds, 1e6: microseconds).
    pub fn steps(&self, unit: f64) -> Vec<(String, f64)> {
        self.steps.iter().map(|(n, d, _)| (n.clone(), d.as_secs_f64() * unit)).collect()
    }

    /// Each step's CPU time (this thread's) in `unit`s.
    pub fn cpu_steps(&self, unit: f64) -> Vec<(String, f64)> {
        self.steps.iter().map(|(n, _, c)| (n.clone(), c.as_secs_f64() * unit)).collect()
    }

    /// This thread's CPU time since `new`.
    pub fn cpu(&self) -> Duration {
        thread_cpu_time().saturating_sub(self.started_cpu)
    }
}

impl Default for PhaseTimer {
    fn default() -> Self {
        PhaseTimer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_follow_marks_and_cpu_time_grows() {
        let mut t = PhaseTimer::new();
        std::thread::sleep(Duration::from_millis(5));
        t.mark("sleep");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        t.mark("spin");
        let steps = t.steps(1e3);
        assert_eq!(steps.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["sleep", "spin"]);
        assert!(steps[0].1 >= 5.0, "{steps:?}");
        assert!(t.cpu() > Duration::ZERO);
        // Sleeping takes no CPU; spinning does, and the steps add up to the whole.
        let cpu = t.cpu_steps(1e3);
        assert!(cpu[0].1 < 2.0 && cpu[1].1 > 0.0, "{cpu:?}");
        let sum: f64 = cpu.iter().map(|(_, ms)| ms).sum();
        assert!(sum <= t.cpu().as_secs_f64() * 1e3 + 1e-6, "{cpu:?} against {:?}", t.cpu());
    }
}
