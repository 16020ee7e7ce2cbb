//! A plugin that keeps failing is not called for a while: after `failures` failed calls in a
//! row its breaker opens for `cooldown`, and calls meanwhile get its `on-error` at once (PLG0010
//! when that is `fail`), without running or instantiating it. The first call after the cooldown
//! tries it again; one more failure opens the breaker again.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::clock::now_ms;
use sluice_core::errors::{Code, CodedError};

/// When a breaker opens and for how long (`plugin-limits.breaker-failures`,
/// `plugin-limits.breaker-cooldown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Failed calls in a row that open it (0: never).
    pub failures: u32,
    /// How long it stays open.
    pub cooldown: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: Duration::from_secs(10),
        }
    }
}

/// One plugin's breaker.
#[derive(Debug, Default)]
pub(crate) struct Breaker {
    settings: BreakerSettings,
    failed_in_a_row: AtomicU32,
    /// Until when it is open, ms since the epoch (0: closed).
    open_until_ms: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            ..Self::default()
        }
    }

    /// PLG0010 (with when to try again) while the breaker is open; `Ok` when the call may run.
    pub(crate) fn check(&self, plugin: &str) -> Result<(), CodedError> {
        self.check_at(plugin, now_ms())
    }

    fn check_at(&self, plugin: &str, now: u64) -> Result<(), CodedError> {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        if until <= now {
            return Ok(());
        }
        let left_ms = until - now;
        Err(CodedError::new(
            Code::PLG0010,
            format!(
                "plugin '{plugin}' failed {} calls in a row, so it is not called for {:?} (plugin-limits.breaker-cooldown); {} ms left",
                self.settings.failures, self.settings.cooldown, left_ms
            ),
        )
        .retry_after(left_ms.div_ceil(1000).max(1)))
    }

    /// Counts a call's outcome; the failure that makes `failures` in a row opens the breaker.
    pub(crate) fn record(&self, failed: bool) -> bool {
        self.record_at(failed, now_ms())
    }

    fn record_at(&self, failed: bool, now: u64) -> bool {
        if !failed {
            self.failed_in_a_row.store(0, Ordering::Relaxed);
            return false;
        }
        let threshold = self.settings.failures;
        if threshold == 0 {
            return false;
        }
        let in_a_row = self.failed_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row < threshold {
            return false;
        }
        // Half-open after the cooldown: one more failure is enough to open it again.
        self.failed_in_a_row.store(threshold - 1, Ordering::Relaxed);
        let cooldown = u64::try_from(self.settings.cooldown.as_millis()).unwrap_or(u64::MAX);
        self.open_until_ms
            .store(now.saturating_add(cooldown), Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_reopens_on_one_more_after_the_cooldown_and_closes_on_success()
    {
        let breaker = Breaker::new(BreakerSettings {
            failures: 3,
            cooldown: Duration::from_secs(10),
        });
        let t = 1_000_000;
        assert!(!breaker.record_at(true, t));
        assert!(!breaker.record_at(false, t), "a success resets the count");
        assert!(!breaker.record_at(true, t));
        assert!(!breaker.record_at(true, t));
        assert!(breaker.check_at("p", t).is_ok());
        assert!(breaker.record_at(true, t), "the third in a row opens it");
        let open = breaker.check_at("p", t + 1).unwrap_err();
        assert_eq!(open.code, Some(Code::PLG0010));
        assert_eq!(open.retry_after_s, Some(10));
        assert!(
            open.message.contains("plugin 'p' failed 3 calls in a row"),
            "{}",
            open.message
        );
        assert!(
            breaker.check_at("p", t + 10_000).is_ok(),
            "closed after the cooldown"
        );
        assert!(
            breaker.record_at(true, t + 10_000),
            "one more failure opens it again"
        );
        assert!(breaker.check_at("p", t + 10_001).is_err());
        assert!(!breaker.record_at(false, t + 20_000));
        assert!(
            !breaker.record_at(true, t + 20_000),
            "a success closed it for good"
        );
    }

    #[test]
    fn zero_failures_never_opens() {
        let breaker = Breaker::new(BreakerSettings {
            failures: 0,
            cooldown: Duration::from_secs(10),
        });
        for _ in 0..100 {
            assert!(!breaker.record_at(true, 5));
        }
        assert!(breaker.check_at("p", 5).is_ok());
    }
}
