//! Kafka clusters and subscriptions as stored and shown, and how a subscription request is
//! checked (META0009 names the part at fault).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::SubscriptionId;
use sluice_runtime::discovery::HandlerType;
use sluice_runtime::discovery::manifest::ServiceType;
use sluice_runtime::registry::Registry;

/// A Kafka cluster Sluice may consume from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KafkaCluster {
    /// Its name, the authority of `kafka://<name>/<topic>`.
    pub name: String,
    /// librdkafka properties (`bootstrap.servers`, security settings, …).
    pub properties: BTreeMap<String, String>,
    /// When it was added, ms since the epoch.
    pub created_at_ms: u64,
    /// From the config file (read-only at runtime).
    #[serde(default)]
    pub from_config: bool,
}

/// A subscription: records of `topic` on `cluster` become invocations of `service/handler`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    /// `sub_…`.
    pub id: SubscriptionId,
    /// `kafka://<cluster>/<topic>`.
    pub source: String,
    /// `service://<service>/<handler>`.
    pub sink: String,
    /// Options (`scope`, `limit-key`, `auto.offset.reset`, …).
    pub options: BTreeMap<String, String>,
    /// Parsed source: cluster.
    pub cluster: String,
    /// Parsed source: topic.
    pub topic: String,
    /// Parsed sink: service.
    pub service: String,
    /// Parsed sink: handler.
    pub handler: String,
    /// The sink is keyed (virtual object): records need keys.
    pub keyed: bool,
}

fn invalid(message: String) -> CodedError {
    CodedError::new(Code::META0009, message)
}

/// Splits `<scheme>://<authority>/<path>`.
fn split_uri<'a>(uri: &'a str, scheme: &str, what: &str) -> Result<(&'a str, &'a str), CodedError> {
    let rest = uri.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")).ok_or_else(|| {
        invalid(format!(
            "invalid {what} URI '{uri}': must have a scheme segment, with supported schemes: [{scheme}]."
        ))
    })?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(invalid(format!(
            "invalid {what} URI '{uri}': the {} is missing",
            if scheme == "kafka" {
                "cluster name"
            } else {
                "service name"
            }
        )));
    }
    if path.is_empty() || path.contains('/') {
        return Err(invalid(format!(
            "invalid {what} URI '{uri}': write it as {scheme}://<{}>/<{}>",
            if scheme == "kafka" {
                "cluster"
            } else {
                "service"
            },
            if scheme == "kafka" {
                "topic"
            } else {
                "handler"
            },
        )));
    }
    Ok((authority, path))
}

/// Checks a subscription request against the clusters and the registry.
pub fn check(
    source: &str,
    sink: &str,
    options: BTreeMap<String, String>,
    cluster_exists: impl Fn(&str) -> bool,
    registry: &Registry,
) -> Result<Subscription, CodedError> {
    let (cluster, topic) = split_uri(source, "kafka", "source")?;
    if !cluster_exists(cluster) {
        return Err(invalid(format!(
            "invalid source URI '{source}': no Kafka cluster named '{cluster}' (add it with POST /kafka-clusters or [[ingress.kafka-clusters]])"
        )));
    }
    let (service, handler) = split_uri(sink, "service", "sink")?;
    let not_found = || {
        invalid(format!(
            "invalid sink URI '{sink}': cannot find service/handler specified in the sink URI."
        ))
    };
    let (svc, deployment) = registry.service(service).map_err(|_| not_found())?;
    let target = deployment.handler(service, handler).ok_or_else(not_found)?;
    let keyed = svc.ty != ServiceType::Service;
    if target.effective_type(svc.ty) == Some(HandlerType::Workflow) {
        return Err(invalid(format!(
            "invalid sink URI '{sink}': a workflow's run handler cannot be a subscription sink (each record would need its own workflow key); use a shared handler or a service"
        )));
    }
    if let Some(bound) = options.get("max-queued")
        && bound.parse::<u32>().map_or(true, |b| b == 0)
    {
        return Err(invalid(format!(
            "invalid option max-queued = '{bound}': a whole number of queued invocations, at least 1"
        )));
    }
    sluice_flow::scope::parse_request(
        options.get("scope").map(String::as_str),
        options.get("limit-key").map(String::as_str),
    )
    .map_err(|e| invalid(format!("invalid options: {}", e.message)))?;
    Ok(Subscription {
        id: SubscriptionId::new(),
        source: source.to_owned(),
        sink: sink.to_owned(),
        options,
        cluster: cluster.to_owned(),
        topic: topic.to_owned(),
        service: service.to_owned(),
        handler: handler.to_owned(),
        keyed,
    })
}
