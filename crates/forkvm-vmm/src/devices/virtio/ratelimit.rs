//! Rate limiting for log lines a guest can trigger.
//!
//! A guest driver (buggy or hostile) can hit a bad register or post a malformed
//! descriptor chain millions of times a second; logging each one would turn the guest
//! into a disk-filling machine for the host. Each device and transport owns a
//! [`LogLimiter`] and asks it before logging anything guest-triggered; the count of
//! suppressed lines is reported with the next line that gets through.

use std::time::{Duration, Instant};

/// Lines allowed per window.
pub const DEFAULT_BURST: u32 = 10;
/// Length of a window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);

/// Allows at most `burst` log lines per `window`.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    burst: u32,
    window: Duration,
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(DEFAULT_BURST, DEFAULT_WINDOW)
    }
}

impl LogLimiter {
    pub fn new(burst: u32, window: Duration) -> LogLimiter {
        LogLimiter { burst, window, window_start: None, used: 0, suppressed: 0 }
    }

    /// Returns `Some(suppressed)` if a line may be logged now, where `suppressed` is the
    /// number of lines dropped since the last one that got through; `None` otherwise.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        let expired = self.window_start.is_none_or(|start| now.duration_since(start) >= self.window);
        if expired {
            self.window_start = Some(now);
            self.used = 0;
        }
        if self.used < self.burst {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_a_burst_and_reports_suppressed_lines() {
        let mut limiter = LogLimiter::new(2, Duration::from_millis(50));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
        assert_eq!(limiter.allow(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(limiter.allow(), Some(2));
    }
}
