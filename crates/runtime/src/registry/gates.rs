//! The registry's side of the deployment gates: what each deployment declares, kept in step
//! with the deployments, and who is told after a change.

use std::sync::Arc;

use super::{Registry, State};
use sluice_flow::gates::{DeploymentLimits, Gates};
use sluice_flow::pacing::PacingConfig;

/// What runs after every change of the deployments.
pub(super) struct OnChange(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnChange")
    }
}

/// The limits the deployments of `state` declare, with the services each serves now.
pub(super) fn declared_limits(state: &State) -> Vec<DeploymentLimits> {
    state
        .deployments
        .values()
        .map(|d| DeploymentLimits {
            id: d.id.to_string(),
            concurrency: d
                .manifest
                .limits
                .and_then(|l| l.concurrency)
                .map(std::num::NonZeroU32::get),
            services: state
                .services
                .values()
                .filter(|s| s.deployment_id == d.id)
                .map(|s| {
                    let own = d
                        .service(&s.name)
                        .and_then(|m| m.limits)
                        .and_then(|l| l.concurrency)
                        .map(std::num::NonZeroU32::get);
                    (s.name.clone(), own)
                })
                .collect(),
        })
        .collect()
}

impl Registry {
    /// The deployments' gates, for the partitions' schedulers.
    pub fn gates(&self) -> &Arc<Gates> {
        &self.gates
    }

    /// Sets how deployments are paced after an outage (`worker.invoker.drain`).
    pub fn configure_pacing(&self, pacing: PacingConfig) {
        self.gates.configure(pacing);
        self.gates.sync(&declared_limits(&self.read()));
    }

    /// Calls `notify` after every change of the deployments (once set, it stays).
    pub fn on_change(&self, notify: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_change.set(OnChange(notify));
    }

    /// Keeps the gates in step after a change, and tells whoever asked.
    pub(super) fn changed(&self) {
        self.gates.sync(&declared_limits(&self.read()));
        if let Some(OnChange(notify)) = self.on_change.get() {
            notify();
        }
    }
}
