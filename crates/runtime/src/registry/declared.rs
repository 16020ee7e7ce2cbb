//! What a service or handler declares in its manifest (its kind, retentions, retry policy),
//! read as the operator's overrides, the pinned or latest deployment and the configured
//! defaults decide.

use std::time::Duration;

use super::Registry;
use crate::discovery::{HandlerType, ServiceType};
use sluice_core::ids::DeploymentId;

/// Default retention of results and workflows.
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Handler `name` of the service `manifest` describes.
fn handler_of<'a>(
    manifest: Option<&'a crate::discovery::manifest::ServiceManifest>,
    name: &str,
) -> Option<&'a crate::discovery::manifest::HandlerManifest> {
    manifest?.handlers.iter().find(|h| h.name == name)
}

/// An option `pick` reads as the handler declares it, else as its service does.
fn declared<'a, T>(
    service: Option<&'a crate::discovery::manifest::ServiceManifest>,
    handler: Option<&'a crate::discovery::manifest::HandlerManifest>,
    pick: impl Fn(&'a crate::discovery::manifest::Options) -> Option<T>,
) -> Option<T> {
    handler
        .and_then(|h| pick(&h.options))
        .or_else(|| service.and_then(|m| pick(&m.options)))
}

impl Registry {
    /// What kind of service and handler an invocation runs: as `pinned` (the deployment its
    /// first attempt chose) describes them, else as the latest deployment of the service does.
    /// A deployment registered later may change a handler's kind; a running invocation keeps
    /// the one it started with.
    pub fn handler_kind(
        &self,
        pinned: Option<DeploymentId>,
        service: &str,
        handler: &str,
    ) -> Option<(ServiceType, Option<HandlerType>)> {
        let deployment = match pinned.and_then(|id| self.deployment(id).ok()) {
            Some(deployment) => deployment,
            None => self.service(service).ok()?.1,
        };
        let service_ty = deployment.service(service)?.ty;
        let handler_ty = deployment.handler(service, handler).and_then(|h| h.ty);
        Some((service_ty, handler_ty))
    }

    /// How long an idempotent invocation's result is kept: the operator's service override,
    /// else the handler's, else the service's declared retention, else one day.
    pub fn idempotency_retention(&self, service: &str, handler: &str) -> Duration {
        let Ok((found, deployment)) = self.service(service) else {
            return DAY;
        };
        if let Some(retention) = found.overrides.idempotency_retention {
            return retention.0;
        }
        let manifest = deployment.service(service);
        declared(manifest, handler_of(manifest, handler), |o| {
            o.idempotency_retention
        })
        .map_or(DAY, Duration::from_millis)
    }

    /// The retry policy of `service`'s `handler`: each field the handler declares, else the
    /// service's, else `defaults` (`worker.invoker.retry-policy`). Declared values are held to
    /// what a policy can be: at least one attempt, intervals in milliseconds.
    pub fn retry_policy(
        &self,
        service: &str,
        handler: &str,
        defaults: &sluice_config::RetryPolicy,
    ) -> sluice_config::RetryPolicy {
        use sluice_config::{FriendlyDuration, OnMaxAttempts};
        let Ok((_, deployment)) = self.service(service) else {
            return defaults.clone();
        };
        let manifest = deployment.service(service);
        let handler = handler_of(manifest, handler);
        let mut policy = defaults.clone();
        if let Some(ms) = declared(manifest, handler, |o| o.retry_policy_initial_interval) {
            policy.initial_interval = FriendlyDuration::from_millis(ms);
        }
        if let Some(ms) = declared(manifest, handler, |o| o.retry_policy_max_interval) {
            policy.max_interval = FriendlyDuration::from_millis(ms);
        }
        if let Some(n) = declared(manifest, handler, |o| o.retry_policy_max_attempts) {
            let n = u32::try_from(n).unwrap_or(u32::MAX).max(1);
            policy.max_attempts = std::num::NonZeroU32::new(n).unwrap_or(policy.max_attempts);
        }
        if let Some(factor) = declared(manifest, handler, |o| o.retry_policy_exponentiation_factor)
        {
            policy.exponentiation_factor = factor;
        }
        if let Some(on) = declared(manifest, handler, |o| {
            o.retry_policy_on_max_attempts.as_deref()
        }) {
            policy.on_max_attempts = if on.eq_ignore_ascii_case("kill") {
                OnMaxAttempts::Kill
            } else {
                OnMaxAttempts::Pause
            };
        }
        policy
    }

    /// How long the journal of a completed invocation is kept: the operator's service override,
    /// else the handler's, else the service's declared retention, else one day; at most `max`
    /// (`worker.max-journal-retention`).
    pub fn journal_retention(&self, service: &str, handler: &str, max: Duration) -> Duration {
        let Ok((found, deployment)) = self.service(service) else {
            return DAY.min(max);
        };
        let manifest = deployment.service(service);
        found
            .overrides
            .journal_retention
            .map(|r| r.0)
            .or_else(|| {
                declared(manifest, handler_of(manifest, handler), |o| {
                    o.journal_retention
                })
                .map(Duration::from_millis)
            })
            .unwrap_or(DAY)
            .min(max)
    }

    /// How long a completed workflow run (with its state and promises) is kept: the operator's
    /// override, else the service's declared retention, else one day.
    pub fn workflow_retention(&self, service: &str) -> Duration {
        let Ok((found, deployment)) = self.service(service) else {
            return DAY;
        };
        if let Some(retention) = found.overrides.workflow_completion_retention {
            return retention.0;
        }
        deployment
            .service(service)
            .and_then(|m| m.options.workflow_completion_retention)
            .map_or(DAY, Duration::from_millis)
    }
}
