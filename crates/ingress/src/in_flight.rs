//! Requests the ingress is serving, counted so shutdown can wait for them to finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Counts requests being served so shutdown can wait for them.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    /// Marks one request as in flight until the guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(Arc::clone(self))
    }

    /// Requests in flight now.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no request is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Register before checking so a guard dropped in between still wakes us.
            notified.as_mut().enable();
            if self.current() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Keeps a request counted in its [`InFlight`].
#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wait_idle_returns_when_the_last_guard_drops() {
        let inflight = Arc::new(InFlight::default());
        inflight.wait_idle().await;
        let a = inflight.enter();
        let b = inflight.enter();
        assert_eq!(inflight.current(), 2);
        let waiter = tokio::spawn({
            let inflight = Arc::clone(&inflight);
            async move { inflight.wait_idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(inflight.current(), 0);
    }
}
