//! One Sluice node below its listeners: the parts every door (ingress, admin, Kafka) and the
//! partitions share, built once at start-up.

use std::sync::Arc;

use tokio::sync::watch;

use crate::deployment_tls::DeploymentTls;
use crate::limits::Rules;
use crate::partition::spawning::{first_to_end, stopped_task};
use crate::partition::{Receivers, Runtime};
use crate::registry::Registry;
use sluice_config::Config;
use sluice_store::storage::Store;

/// The shared parts of a running node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Node {
    /// The process's configuration.
    pub config: Arc<Config>,
    /// The store everything durable lives in.
    pub store: Arc<Store>,
    /// Deployments and services.
    pub registry: Arc<Registry>,
    /// Where invocations are sent.
    pub runtime: Runtime,
    /// The rule book.
    pub rules: Arc<Rules>,
    /// What `https://` deployments are trusted with.
    pub tls: DeploymentTls,
}

impl Node {
    /// Recovers and runs the partitions of `receivers` (and the purger) until `stopping` turns
    /// true. Marks the store's health ready once every partition recovered; a recovery that
    /// fails, or a partition that ends while serving, fails it instead, because its invocations
    /// would otherwise sit behind a healthy `/health` forever.
    /// In cluster mode `leads` says which partitions this node leads (`docs/cluster.md`).
    pub async fn serve_partitions(
        &self,
        receivers: Receivers,
        stopping: watch::Receiver<bool>,
        leads: Option<Vec<crate::partition::Lead>>,
    ) {
        let health = Arc::clone(self.store.health());
        let mut stopped = stopping.clone();
        let handles = match self.runtime.spawn_with_rules(
            receivers,
            &self.store,
            &self.registry,
            &self.config,
            crate::partition::How {
                rules: Some(&self.rules),
                tls: &self.tls,
                leads,
            },
        ) {
            Ok(handles) => handles,
            // Shutdown closes the store under recovering partitions: what ends then is no failure.
            Err(_) if *stopping.borrow() => return,
            Err(e) => {
                // Some partitions would run and others not: the process stops instead
                // (start-up exits non-zero).
                tracing::error!(error.code = ?e.code, error = %e, "partitions failed to recover");
                health.fail(e);
                return;
            }
        };
        health.set_ready();
        tokio::select! {
            biased;
            // An error means the sender is gone, which also means shutdown.
            _ = stopped.wait_for(|down| *down) => {}
            (index, ended) = first_to_end(handles) => {
                if *stopping.borrow() {
                    return;
                }
                let task = if index < self.runtime.partition_count() {
                    format!("partition {index}")
                } else {
                    "the purger".to_owned()
                };
                health.fail(stopped_task(&task, ended));
            }
        }
    }
}
