//! Token buckets that cap what a device does for its guest per second: bytes and
//! requests. A disk's host I/O is buffered, which cgroup v1 cannot throttle, and a guest
//! reading entropy in a loop costs the host `getrandom` calls; without a cap one sandbox
//! could take the host's disk or CPU from its neighbours.
//!
//! A bucket holds up to one second of its rate and refills continuously. A request is
//! admitted once the bucket holds its size (or, for a request larger than the bucket,
//! once the bucket is full), and its whole size is taken, so a large request leaves a
//! debt that later requests wait out: the rate holds on average whatever the sizes.
//! A request that is not admitted stays in the virtqueue; the device asks for a
//! deferred pass ([`crate::devices::deferred`]) at the time the bucket will admit it.

use crate::devices::deferred::Deferral;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

/// Whether the driver posted requests on `queue` that its device has not taken yet.
pub fn queue_has_pending(queue: &Queue, mem: &GuestMemoryMmap) -> bool {
    queue.avail_idx(mem, std::sync::atomic::Ordering::Acquire).is_ok_and(|idx| idx.0 != queue.next_avail())
}

/// The caps of one device; `None`: no cap on that measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_sec: Option<u64>,
}

impl RateLimit {
    /// Whether it caps anything.
    pub fn is_limited(&self) -> bool {
        self.bytes_per_sec.is_some() || self.ops_per_sec.is_some()
    }
}

/// One measure's bucket.
#[derive(Debug, Clone)]
struct TokenBucket {
    /// Tokens per second (at least 1).
    rate: u64,
    /// What the bucket holds now; negative while a large request's debt is paid off.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: u64, now: Instant) -> TokenBucket {
        let rate = rate.max(1);
        TokenBucket { rate, tokens: rate as f64, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.rate as f64);
        self.last = now;
    }

    /// How long until the bucket admits a request of `n` (zero: it does now).
    fn wait(&self, n: u64) -> Duration {
        let need = n.min(self.rate) as f64;
        if self.tokens >= need {
            Duration::ZERO
        } else {
            // A little past the point where it holds enough, so the retry is admitted.
            Duration::from_secs_f64((need - self.tokens) / self.rate as f64 + 1e-4)
        }
    }
}

/// A device's buckets.
#[derive(Debug, Clone)]
pub struct Limiter {
    bytes: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl Limiter {
    /// The buckets of `limit`, full; `None` when it caps nothing.
    pub fn new(limit: RateLimit, now: Instant) -> Option<Limiter> {
        limit.is_limited().then(|| Limiter {
            bytes: limit.bytes_per_sec.map(|r| TokenBucket::new(r, now)),
            ops: limit.ops_per_sec.map(|r| TokenBucket::new(r, now)),
        })
    }

    /// Admits one request of `bytes` (taking its tokens) when every bucket holds enough,
    /// or says how long until they all will (taking nothing).
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for (b, n) in [(&mut self.bytes, bytes), (&mut self.ops, 1)] {
            if let Some(b) = b {
                b.refill(now);
                wait = wait.max(b.wait(n));
            }
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(b) = &mut self.bytes {
            b.tokens -= bytes as f64;
        }
        if let Some(b) = &mut self.ops {
            b.tokens -= 1.0;
        }
        Ok(())
    }
}

impl Limiter {
    /// Takes `bytes` from the byte bucket, for a request admitted before its size was
    /// known (a received frame: admitted with `admit(0)`, charged once read). The debt
    /// is waited out by the next [`admit`](Self::admit).
    pub fn charge(&mut self, bytes: u64, now: Instant) {
        if let Some(b) = &mut self.bytes {
            b.refill(now);
            b.tokens -= bytes as f64;
        }
    }
}

/// A device's rate limit and the passes it owes: what the block and rng devices share.
#[derive(Debug, Default)]
pub struct Throttle {
    limiter: Option<Limiter>,
    deferral: Option<Deferral>,
    paused: bool,
    /// A pass is owed: one was due while the VM was paused, or before a deferral was set.
    owed: bool,
    /// Requests held back so far.
    held: u64,
}

impl Throttle {
    pub fn new(limit: RateLimit) -> Throttle {
        Throttle { limiter: Limiter::new(limit, Instant::now()), ..Throttle::default() }
    }

    pub fn is_limited(&self) -> bool {
        self.limiter.is_some()
    }

    /// How many requests it held back so far.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Whether a request of `bytes` may be served now; if not, a pass is asked for when
    /// it may (the caller leaves the request in its queue).
    pub fn admit(&mut self, bytes: u64) -> bool {
        let Some(l) = &mut self.limiter else { return true };
        match l.admit(bytes, Instant::now()) {
            Ok(()) => true,
            Err(wait) => {
                self.held += 1;
                self.ask(Instant::now() + wait);
                false
            }
        }
    }

    fn ask(&mut self, when: Instant) {
        match &self.deferral {
            Some(d) => d.at(when),
            None => self.owed = true,
        }
    }

    /// Where passes are asked for from now on, starting with one at once: for one owed
    /// so far, or for requests a restored queue still holds.
    pub fn set_deferral(&mut self, deferral: Deferral) {
        self.deferral = Some(deferral);
        self.owed = false;
        self.ask(Instant::now());
    }

    /// Whether a deferred pass may run now: not while the VM is paused (the pass is
    /// owed until it resumes).
    pub fn may_run(&mut self) -> bool {
        self.owed |= self.paused;
        !self.paused
    }

    pub fn pause(&mut self) {
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.paused = false;
        if std::mem::take(&mut self.owed) {
            self.ask(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(bytes: Option<u64>, ops: Option<u64>, now: Instant) -> Limiter {
        Limiter::new(RateLimit { bytes_per_sec: bytes, ops_per_sec: ops }, now).unwrap()
    }

    #[test]
    fn nothing_capped_is_no_limiter() {
        assert!(Limiter::new(RateLimit::default(), Instant::now()).is_none());
    }

    #[test]
    fn ops_are_admitted_up_to_one_second_then_at_the_rate() {
        let t0 = Instant::now();
        let mut l = limiter(None, Some(4), t0);
        for _ in 0..4 {
            assert_eq!(l.admit(0, t0), Ok(()));
        }
        let wait = l.admit(0, t0).unwrap_err();
        assert!(wait >= Duration::from_millis(250) && wait <= Duration::from_millis(251), "empty bucket: {wait:?}");
        // A quarter second later, one more.
        let t1 = t0 + Duration::from_millis(251);
        assert_eq!(l.admit(0, t1), Ok(()));
        let wait = l.admit(0, t1).unwrap_err();
        assert!(wait >= Duration::from_millis(240) && wait <= Duration::from_millis(260), "{wait:?}");
    }

    #[test]
    fn a_request_larger_than_the_bucket_passes_and_its_debt_is_waited_out() {
        let t0 = Instant::now();
        let mut l = limiter(Some(1000), None, t0);
        assert_eq!(l.admit(3000, t0), Ok(()), "a full bucket admits a large request");
        let wait = l.admit(1, t0).unwrap_err();
        assert!(wait >= Duration::from_millis(2000) && wait <= Duration::from_millis(2010), "{wait:?}");
        assert!(l.admit(1, t0 + Duration::from_millis(1990)).is_err());
        assert_eq!(l.admit(1, t0 + Duration::from_millis(2010)), Ok(()));
    }

    #[test]
    fn the_average_rate_holds_over_many_requests() {
        // 64 KiB requests against 1 MiB/s for a simulated 10 s: about 10 MiB admitted
        // (plus the first second's burst).
        let t0 = Instant::now();
        let mut l = limiter(Some(1 << 20), Some(1000), t0);
        let mut now = t0;
        let mut admitted = 0u64;
        while now < t0 + Duration::from_secs(10) {
            match l.admit(64 << 10, now) {
                Ok(()) => admitted += 64 << 10,
                Err(wait) => now += wait,
            }
        }
        let mib = admitted as f64 / f64::from(1 << 20);
        assert!((10.0..=11.1).contains(&mib), "{mib} MiB in 10 s at 1 MiB/s");
    }

    #[test]
    fn a_refused_request_takes_nothing_from_either_bucket() {
        let t0 = Instant::now();
        let mut l = limiter(Some(100), Some(1), t0);
        assert_eq!(l.admit(10, t0), Ok(()));
        // The ops bucket is empty: refused, and the bytes bucket keeps its 90.
        assert!(l.admit(10, t0).is_err());
        assert_eq!(l.bytes.as_ref().map(|b| b.tokens), Some(90.0));
        assert_eq!(l.ops.as_ref().map(|b| b.tokens), Some(0.0));
    }
}
