//! Graceful shutdown. SIGTERM and SIGINT both drain: the listeners stop accepting, in-flight
//! requests finish (up to `shutdown-grace-period`), the store is closed, and the process exits 0.
//! A [`Health`] failure drains the same way and exits with [`EXIT_FAILED`].
//!
//! Pingora's own graceful path always sleeps its whole grace period, even with nothing in flight;
//! so the drain is ours: [`DrainService`] waits for the work to finish and exits as soon as it has,
//! and pingora's period is only a backstop a little longer than ours.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::sync::watch;

use sluice_ingress::in_flight::InFlight;

use sluice_store::health::{EXIT_FAILED, Health};
use sluice_store::storage::Store;

/// Resolves once pingora has broadcast shutdown.
pub async fn shutdown_started(mut shutdown: ShutdownWatch) {
    // An error means the sender is gone, which also means shutdown.
    let _ = shutdown.wait_for(|down| *down).await;
}

/// SIGTERM and SIGINT, caught from the moment [`Signals::install`] returns: before the listeners
/// answer, so a signal sent as soon as the server is reachable drains it instead of killing it
/// (pingora asks for its signal watch only after its services run). A thread of its own keeps
/// catching them for the rest of the process (a second SIGINT during the drain is ignored).
pub struct Signals {
    first: std::sync::Mutex<Option<tokio::sync::oneshot::Receiver<&'static str>>>,
}

impl Signals {
    /// Installs the handlers; returns once they are in place.
    pub fn install() -> Self {
        let (installed_tx, installed) = std::sync::mpsc::channel();
        let (first_tx, first) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("sluice-signals".into())
            .spawn(move || {
                use tokio::signal::unix::{SignalKind, signal};
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the signal thread's runtime");
                runtime.block_on(async move {
                    let mut term =
                        signal(SignalKind::terminate()).expect("install SIGTERM handler");
                    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
                    let _ = installed_tx.send(());
                    let name = tokio::select! {
                        _ = term.recv() => "SIGTERM",
                        _ = int.recv() => "SIGINT",
                    };
                    let _ = first_tx.send(name);
                    loop {
                        tokio::select! {
                            _ = term.recv() => {}
                            _ = int.recv() => {}
                        }
                    }
                });
            })
            .expect("the signal thread starts");
        let _ = installed.recv();
        Self {
            first: std::sync::Mutex::new(Some(first)),
        }
    }

    /// The first signal's name; never resolves when asked a second time.
    async fn first(&self) -> &'static str {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        match first {
            Some(first) => first.await.unwrap_or("a signal"),
            None => std::future::pending().await,
        }
    }
}

/// Turns SIGTERM and SIGINT into pingora's graceful terminate (pingora alone would make SIGINT a
/// fast exit that drops in-flight requests), and so does a [`Health`] failure.
/// After a failure it waits `failure_exit_delay` (answering 503 meanwhile) before it shuts down.
pub struct SignalWatch {
    /// The process's health.
    pub health: Arc<Health>,
    /// `failure-exit-delay`.
    pub failure_exit_delay: Duration,
    /// The signals, caught since before the listeners answered.
    pub signals: Signals,
    /// Cluster mode: the node's cluster, whose partitions are handed on (at most the
    /// duration given) before a signal's drain starts.
    pub hand_on: Option<(Arc<sluice_kafka_log::Cluster>, Duration)>,
}

#[async_trait]
impl ShutdownSignalWatch for SignalWatch {
    async fn recv(&self) -> ShutdownSignal {
        let (name, signalled) = tokio::select! {
            name = self.signals.first() => (name, true),
            _ = async {
                self.health.failed().await;
                tokio::time::sleep(self.failure_exit_delay).await;
            } => ("a failure (see the error above)", false),
        };
        // A node asked to stop hands its partitions on while its listeners still answer; one
        // whose store failed does not (its partitions stopped already).
        if signalled && let Some((cluster, within)) = &self.hand_on {
            cluster.hand_on(*within).await;
        }
        tracing::info!(
            signal = name,
            "shutting down: no new connections, draining in-flight requests"
        );
        ShutdownSignal::GracefulTerminate
    }
}

/// Waits for in-flight work after shutdown starts, closes the store, and ends the process.
pub struct DrainService {
    /// Longest wait for in-flight work.
    pub grace: Duration,
    /// Ingress requests being served.
    pub ingress: Arc<InFlight>,
    /// Turns true once the admin listener has finished its connections.
    pub admin_done: watch::Receiver<bool>,
    /// Closed once drained.
    pub store: Arc<Store>,
    /// The span exporter, flushed once drained.
    pub spans: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

#[async_trait]
impl BackgroundService for DrainService {
    async fn start(&self, shutdown: ShutdownWatch) {
        shutdown_started(shutdown).await;
        let mut admin_done = self.admin_done.clone();
        let drained = async {
            let _ = admin_done.wait_for(|done| *done).await;
            self.ingress.wait_idle().await;
        };
        match tokio::time::timeout(self.grace, drained).await {
            Ok(()) => tracing::info!("drained"),
            Err(_) => tracing::warn!(
                in_flight = self.ingress.current(),
                grace = ?self.grace,
                "grace period elapsed; stopping with requests still in flight"
            ),
        }
        self.store.close();
        if let Some(spans) = self.spans.clone() {
            // Blocking (its own thread sends); bounded by the export timeout.
            let _ = tokio::task::spawn_blocking(move || crate::otlp::flush(&spans)).await;
        }
        // Pingora would now sleep out the rest of its fixed grace period; there is nothing left
        // to wait for, so end here.
        match self.store.health().failure() {
            Some(failure) => {
                tracing::error!(error.code = ?failure.code, error = %failure, status = EXIT_FAILED, "shutdown complete after a failure; exiting non-zero so a supervisor restarts sluice");
                std::process::exit(EXIT_FAILED);
            }
            None => {
                tracing::info!("shutdown complete");
                std::process::exit(0);
            }
        }
    }
}
