//! Per-plugin call counts and latency, lock-free: a histogram of power-of-two buckets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use sluice_api::plugins::MetricsSnapshot;

/// Buckets: bucket `i` counts calls that took less than 2^(i+1) ns (the last one, the rest).
const BUCKETS: usize = 40;

/// Calls, errors and latency of one plugin.
#[derive(Debug)]
pub struct Metrics {
    calls: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Metrics {
    /// Records one call of `hook` of `plugin`, here and for `GET /metrics`.
    pub fn record(&self, plugin: &str, hook: &'static str, took: Duration, failed: bool) {
        use sluice_core::metrics as names;
        let outcome = if failed { "error" } else { "ok" };
        ::metrics::counter!(names::PLUGIN_CALLS, "plugin" => plugin.to_owned(), "hook" => hook, "outcome" => outcome)
            .increment(1);
        ::metrics::histogram!(names::PLUGIN_DURATION, "plugin" => plugin.to_owned(), "hook" => hook)
            .record(took);
        self.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        let bucket = (nanos.ilog2() as usize).min(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts and percentiles now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let percentile = |p: f64| {
            if total == 0 {
                return 0.0;
            }
            let rank = ((total as f64) * p).ceil() as u64;
            let mut seen = 0;
            for (i, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return (1u64 << (i + 1)) as f64 / 1000.0;
                }
            }
            f64::INFINITY
        };
        MetricsSnapshot {
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            p50_us: percentile(0.50),
            p99_us: percentile(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_buckets() {
        let metrics = Metrics::default();
        for _ in 0..99 {
            metrics.record("p", "extract", Duration::from_nanos(1_500), false);
        }
        metrics.record("p", "extract", Duration::from_millis(3), true);
        let snap = metrics.snapshot();
        assert_eq!((snap.calls, snap.errors), (100, 1));
        assert_eq!(
            snap.p50_us, 2.048,
            "1.5 µs falls in the bucket below 2048 ns"
        );
        assert_eq!(snap.p99_us, 2.048);
        metrics.record("p", "extract", Duration::from_millis(3), false);
        assert!(metrics.snapshot().p99_us > 3000.0);
    }
}
