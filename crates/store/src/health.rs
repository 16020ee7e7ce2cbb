//! Whether this process can still keep its promises. A store write that fails, or a partition
//! that stops, leaves memory ahead of (or behind) what is committed; from that moment nothing new
//! may be acknowledged. The first failure is recorded here: `/health` and `/ready` answer 503
//! with it, the ingress refuses new work with it, and the process shuts down and exits non-zero
//! so a supervisor restarts it and recovery rebuilds memory from what was committed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use sluice_core::errors::{Code, CodedError};

/// Exit status of a process that stopped because of a [`Health`] failure (sysexits' EX_IOERR).
pub const EXIT_FAILED: i32 = 74;

/// The process's health: ready once recovered, failed for good after the first failure.
#[derive(Debug, Default)]
pub struct Health {
    failure: OnceLock<CodedError>,
    ready: AtomicBool,
    changed: Notify,
}

impl Health {
    /// Records `error` as the reason this process stops accepting work. Only the first failure
    /// is kept (later ones are usually its consequences); returns whether this one was first.
    pub fn fail(&self, error: CodedError) -> bool {
        let first = self.failure.set(error.clone()).is_ok();
        if first {
            tracing::error!(
                error.code = ?error.code,
                error = %error,
                "sluice stops accepting work and shuts down: nothing more can be acknowledged safely"
            );
            self.changed.notify_waiters();
        }
        first
    }

    /// Why this process stopped accepting work, once it has.
    pub fn failure(&self) -> Option<&CodedError> {
        self.failure.get()
    }

    /// Marks start-up (recovery of every partition) as done.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Recovered and not failed: new work is accepted.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.failure().is_none()
    }

    /// Resolves with the failure once there is one.
    pub async fn failed(&self) -> &CodedError {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Register before checking so a failure recorded in between still wakes us.
            notified.as_mut().enable();
            if let Some(failure) = self.failure() {
                return failure;
            }
            notified.await;
        }
    }
}

/// The failure recorded when a store write fails: the store's message, under STO0001.
pub fn store_write_failed(detail: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::STO0001,
        format!(
            "the store could not be written ({detail}); nothing of that write was acknowledged, and sluice stops accepting work until it is restarted: free disk space or fix the data dir's filesystem, then let the supervisor restart it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_first_failure_is_kept_and_wakes_waiters() {
        let health = Arc::new(Health::default());
        assert!(!health.is_ready());
        health.set_ready();
        assert!(health.is_ready());
        let waiter = tokio::spawn({
            let health = Arc::clone(&health);
            async move { health.failed().await.clone() }
        });
        tokio::task::yield_now().await;
        assert!(health.fail(store_write_failed("No space left on device")));
        assert!(!health.fail(CodedError::new(Code::RT0006, "a consequence")));
        let seen = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(seen.code, Some(Code::STO0001));
        assert!(seen.message.contains("No space left"), "{seen}");
        assert!(!health.is_ready());
        assert_eq!(health.failure().unwrap().code, Some(Code::STO0001));
    }
}
