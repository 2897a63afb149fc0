//! Where the coordinator reads the time.
//!
//! Two clocks matter. Wall-clock milliseconds go into the store (a lease's due time, a retry's
//! backoff, an event's time) and are compared across coordinators, so in production they are
//! the system's. Instants measure what one process waits for (a task's timeout, a silent
//! worker, a queue wait); they are Tokio's, which is the monotonic clock unless a test pauses
//! it.
//!
//! [`Clock::following_tokio`] derives wall time from Tokio's clock too, so a test under
//! `tokio::time::pause()` moves both at once: leases, backoffs and timeouts then run in virtual
//! time, without sleeping for real and without depending on how busy the machine is.

use std::time::{SystemTime, UNIX_EPOCH};

pub use tokio::time::Instant;

/// The coordinator's source of wall-clock time; cheap to copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    /// `None`: the system clock. Otherwise the wall time at an instant, advanced with Tokio's
    /// clock from there.
    following: Option<(SystemTime, Instant)>,
}

impl Clock {
    /// The system clock: what every coordinator in production uses.
    pub fn system() -> Self {
        Self::default()
    }

    /// Wall time that starts at the system's and advances only with Tokio's clock, for tests
    /// that pause it.
    pub fn following_tokio() -> Self {
        Self {
            following: Some((SystemTime::now(), Instant::now())),
        }
    }

    /// Now, as wall-clock time.
    pub fn now(&self) -> SystemTime {
        match self.following {
            None => SystemTime::now(),
            Some((wall, origin)) => wall + origin.elapsed(),
        }
    }

    /// Milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        millis(self.now())
    }
}

fn millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_clock_following_tokio_moves_with_paused_time_only() {
        let clock = Clock::following_tokio();
        let start = clock.now_ms();
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert_eq!(clock.now_ms() - start, 3_600_000);
    }

    #[test]
    fn the_system_clock_is_the_wall_clock() {
        let before = millis(SystemTime::now());
        let now = Clock::system().now_ms();
        assert!(now >= before && now - before < 60_000, "{now} vs {before}");
    }
}
