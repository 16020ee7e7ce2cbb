//! Kafka clusters and subscriptions: records of a topic become invocations of a handler.
//! Clusters come from the config file (read-only) or the admin API; subscriptions from the
//! admin API. Both are stored; every subscription runs one consumer on the Kafka runtime.

mod consumer;
mod model;
pub mod properties;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

pub use model::{KafkaCluster, Subscription};
pub use sluice_config::kafka::ConfiguredCluster;

use sluice_core::clock::now_ms;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::SubscriptionId;
use sluice_runtime::node::Node;
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::Registry;
use sluice_store::storage::Store;

/// A running consumer: how to stop it, and the partitions backpressure paused.
type Running = (
    watch::Sender<bool>,
    consumer::PausedPartitions,
    consumer::Lag,
);

/// The clusters, the subscriptions and their running consumers.
pub struct Kafka {
    store: Arc<Store>,
    registry: Arc<Registry>,
    runtime: Runtime,
    clusters: Mutex<BTreeMap<String, KafkaCluster>>,
    subscriptions: Mutex<BTreeMap<SubscriptionId, Subscription>>,
    consumers: Mutex<HashMap<SubscriptionId, Running>>,
    /// Where consumers run, once the background service started.
    handle: OnceLock<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka").finish_non_exhaustive()
    }
}

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// No such cluster or subscription (404).
    #[error("{0}")]
    NotFound(String),
    /// It conflicts with what exists (409).
    #[error("{0}")]
    Conflict(String),
    /// Bad input (400; META0009 for subscriptions) or a storage failure.
    #[error("{0}")]
    Invalid(CodedError),
}

impl From<CodedError> for KafkaError {
    fn from(e: CodedError) -> Self {
        KafkaError::Invalid(e)
    }
}

fn not_found(what: &str, name: &str) -> KafkaError {
    KafkaError::NotFound(format!("The requested {what} '{name}' does not exist"))
}

impl Kafka {
    /// Loads the node's stored clusters and subscriptions and adds its config file's clusters.
    pub fn load(node: &Node) -> Result<Self, CodedError> {
        let store = Arc::clone(&node.store);
        let mut clusters = stored_clusters(&store)?;
        for c in &node.config.ingress.kafka_clusters {
            let mut properties = c.properties.clone();
            properties.insert("bootstrap.servers".into(), c.brokers.join(","));
            properties::check(&properties).map_err(|e| {
                CodedError::new(
                    Code::RT0002,
                    format!(
                        "invalid configuration: ingress.kafka-clusters '{}': {}",
                        c.name, e.message
                    ),
                )
            })?;
            clusters.insert(
                c.name.clone(),
                KafkaCluster {
                    name: c.name.clone(),
                    properties,
                    created_at_ms: now_ms(),
                    from_config: true,
                },
            );
        }
        let subscriptions = store::load::<Subscription>(&store, store::SUBSCRIPTIONS)?
            .into_iter()
            .map(|s| (s.id, s))
            .collect();
        Ok(Self {
            store,
            registry: Arc::clone(&node.registry),
            runtime: node.runtime.clone(),
            clusters: Mutex::new(clusters),
            subscriptions: Mutex::new(subscriptions),
            consumers: Mutex::new(HashMap::new()),
            handle: OnceLock::new(),
        })
    }

    /// Every cluster, by name.
    pub fn clusters(&self) -> Vec<KafkaCluster> {
        lock(&self.clusters).values().cloned().collect()
    }

    /// Cluster `name`.
    pub fn cluster(&self, name: &str) -> Result<KafkaCluster, KafkaError> {
        lock(&self.clusters)
            .get(name)
            .cloned()
            .ok_or_else(|| not_found("Kafka cluster", name))
    }

    /// Adds (or, with `replace`, changes the properties of) an admin-managed cluster.
    pub fn put_cluster(
        &self,
        name: &str,
        properties: BTreeMap<String, String>,
        replace: bool,
    ) -> Result<KafkaCluster, KafkaError> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(CodedError::uncoded(format!(
                "invalid Kafka cluster name '{name}': use [a-zA-Z0-9_.-]"
            ))
            .into());
        }
        properties::check(&properties)?;
        if !properties.contains_key("bootstrap.servers") {
            return Err(CodedError::uncoded(
                "the cluster's properties need 'bootstrap.servers' (host:port,…)",
            )
            .into());
        }
        let mut clusters = lock(&self.clusters);
        let cluster = match (clusters.get(name), replace) {
            (Some(c), _) if c.from_config => {
                return Err(KafkaError::Conflict(format!(
                    "Kafka cluster '{name}' comes from the config file: change it there"
                )));
            }
            (Some(_), false) => {
                return Err(KafkaError::Conflict(format!(
                    "Kafka cluster '{name}' already exists: PATCH /kafka-clusters/{name} changes it"
                )));
            }
            (None, true) => return Err(not_found("Kafka cluster", name)),
            (Some(old), true) => KafkaCluster {
                properties,
                ..old.clone()
            },
            (None, false) => KafkaCluster {
                name: name.to_owned(),
                properties,
                created_at_ms: now_ms(),
                from_config: false,
            },
        };
        store::put(&self.store, store::CLUSTERS, name, Some(&cluster))?;
        clusters.insert(name.to_owned(), cluster.clone());
        Ok(cluster)
    }

    /// Removes an admin-managed cluster; with subscriptions only when `force` (they go too).
    pub fn delete_cluster(&self, name: &str, force: bool) -> Result<(), KafkaError> {
        let cluster = self.cluster(name)?;
        if cluster.from_config {
            return Err(KafkaError::Conflict(format!(
                "Kafka cluster '{name}' comes from the config file: remove it there"
            )));
        }
        let using: Vec<SubscriptionId> = self
            .subscriptions()
            .into_iter()
            .filter(|s| s.cluster == name)
            .map(|s| s.id)
            .collect();
        if !using.is_empty() && !force {
            return Err(KafkaError::Conflict(format!(
                "Kafka cluster '{name}' has {} subscription(s): delete them first, or pass force=true to delete them with it",
                using.len()
            )));
        }
        for id in using {
            self.delete_subscription(id)?;
        }
        store::put::<KafkaCluster>(&self.store, store::CLUSTERS, name, None)?;
        lock(&self.clusters).remove(name);
        Ok(())
    }

    /// Every subscription.
    pub fn subscriptions(&self) -> Vec<Subscription> {
        lock(&self.subscriptions).values().cloned().collect()
    }

    /// Subscription `id`.
    pub fn subscription(&self, id: SubscriptionId) -> Result<Subscription, KafkaError> {
        lock(&self.subscriptions)
            .get(&id)
            .cloned()
            .ok_or_else(|| not_found("subscription", &id.to_string()))
    }

    /// The consumer group a subscription reads with: its `group.id` option, else its cluster's
    /// `group.id` property, else none of its own (each subscription then has its own group).
    fn group_of(&self, sub: &Subscription) -> Option<String> {
        sub.options.get("group.id").cloned().or_else(|| {
            lock(&self.clusters)
                .get(&sub.cluster)
                .and_then(|c| c.properties.get("group.id").cloned())
        })
    }

    /// Checks, stores and starts a subscription (META0009 on a bad source, sink or option).
    /// Idempotent: a subscription with the same source, sink and effective `group.id` is
    /// answered instead of a second one (whose consumer would deliver every record again);
    /// `false` then.
    pub fn create_subscription(
        &self,
        source: &str,
        sink: &str,
        options: BTreeMap<String, String>,
    ) -> Result<(Subscription, bool), KafkaError> {
        let sub = model::check(
            source,
            sink,
            options,
            |name| lock(&self.clusters).contains_key(name),
            &self.registry,
        )?;
        let group = self.group_of(&sub);
        let existing = self
            .subscriptions()
            .into_iter()
            .find(|s| s.source == sub.source && s.sink == sub.sink && self.group_of(s) == group);
        if let Some(existing) = existing {
            return Ok((existing, false));
        }
        store::put(
            &self.store,
            store::SUBSCRIPTIONS,
            &sub.id.to_string(),
            Some(&sub),
        )?;
        lock(&self.subscriptions).insert(sub.id, sub.clone());
        self.start_consumer(&sub);
        Ok((sub, true))
    }

    /// Stops and forgets a subscription.
    pub fn delete_subscription(&self, id: SubscriptionId) -> Result<(), KafkaError> {
        self.subscription(id)?;
        store::put::<Subscription>(&self.store, store::SUBSCRIPTIONS, &id.to_string(), None)?;
        lock(&self.subscriptions).remove(&id);
        if let Some((stop, _, _)) = lock(&self.consumers).remove(&id) {
            let _ = stop.send(true);
        }
        Ok(())
    }

    fn start_consumer(&self, sub: &Subscription) {
        let Some(handle) = self.handle.get() else {
            return;
        };
        let Ok(cluster) = self.cluster(&sub.cluster) else {
            tracing::error!(subscription = %sub.id, cluster = %sub.cluster, "the subscription's cluster is gone; not consuming");
            return;
        };
        let (stop, stopped) = watch::channel(false);
        let paused = consumer::PausedPartitions::default();
        let lag = consumer::Lag::default();
        lock(&self.consumers).insert(sub.id, (stop, Arc::clone(&paused), Arc::clone(&lag)));
        handle.spawn(consumer::run(
            sub.clone(),
            cluster.properties,
            self.runtime.clone(),
            paused,
            lag,
            stopped,
        ));
    }

    /// Each running subscription's paused Kafka partitions and its lag (records behind the
    /// end of its partitions, `None` until librdkafka has reported it), by subscription id.
    pub fn consumer_metrics(&self) -> Vec<(String, usize, Option<u64>)> {
        lock(&self.consumers)
            .iter()
            .map(|(id, (_, paused, lag))| {
                let lag = u64::try_from(lag.load(std::sync::atomic::Ordering::Relaxed)).ok();
                (id.to_string(), lock(paused).len(), lag)
            })
            .collect()
    }

    /// The Kafka partitions of subscription `id` paused because their sink's queue is full.
    pub fn paused_partitions(&self, id: SubscriptionId) -> Vec<i32> {
        lock(&self.consumers)
            .get(&id)
            .map(|(_, paused, _)| lock(paused).iter().copied().collect())
            .unwrap_or_default()
    }
}

/// The clusters the store holds whose properties pass the allow-list: a row another node
/// published (cluster mode) or an older version wrote is checked like a request to the admin
/// API, and one that fails is left out loudly, never handed to librdkafka.
fn stored_clusters(
    store: &Arc<sluice_store::storage::Store>,
) -> Result<BTreeMap<String, KafkaCluster>, CodedError> {
    Ok(store::load::<KafkaCluster>(store, store::CLUSTERS)?
        .into_iter()
        .filter(|c| match properties::check(&c.properties) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(cluster = %c.name, error.code = ?e.code, error = %e, "a stored Kafka cluster is not used: its properties are not allowed");
                false
            }
        })
        .map(|c| (c.name.clone(), c))
        .collect())
}

impl Kafka {
    /// Takes the clusters and subscriptions the store holds now (cluster mode: another node
    /// changed them): consumers of subscriptions gone stop, those of new ones start.
    pub fn reload(&self) -> Result<(), CodedError> {
        let stored = stored_clusters(&self.store)?;
        {
            let mut clusters = lock(&self.clusters);
            clusters.retain(|name, c| c.from_config || stored.contains_key(name));
            for (name, cluster) in stored {
                if !clusters.get(&name).is_some_and(|c| c.from_config) {
                    clusters.insert(name, cluster);
                }
            }
        }
        let subscriptions: BTreeMap<SubscriptionId, Subscription> =
            store::load::<Subscription>(&self.store, store::SUBSCRIPTIONS)?
                .into_iter()
                .map(|s| (s.id, s))
                .collect();
        let started: Vec<Subscription> = {
            let mut current = lock(&self.subscriptions);
            let mut consumers = lock(&self.consumers);
            consumers.retain(|id, (stop, _, _)| {
                let keep = subscriptions.contains_key(id);
                if !keep {
                    let _ = stop.send(true);
                }
                keep
            });
            let new = subscriptions
                .values()
                .filter(|s| !current.contains_key(&s.id))
                .cloned()
                .collect();
            *current = subscriptions;
            new
        };
        for sub in &started {
            self.start_consumer(sub);
        }
        Ok(())
    }

    /// Runs every subscription's consumer on the current tokio runtime (and the ones made later
    /// there too) until `stopping` turns true, then stops them.
    pub async fn run(&self, mut stopping: watch::Receiver<bool>) {
        if self.handle.set(tokio::runtime::Handle::current()).is_err() {
            return;
        }
        for sub in self.subscriptions() {
            self.start_consumer(&sub);
        }
        // An error means the sender is gone, which also means shutdown.
        let _ = stopping.wait_for(|down| *down).await;
        for (_, (stop, _, _)) in lock(&self.consumers).drain() {
            let _ = stop.send(true);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
