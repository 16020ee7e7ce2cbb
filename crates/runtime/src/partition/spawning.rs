//! Starting the partitions: recovered and run on their shards (embedded), or each run while
//! this node leads it and recovered at each takeover (`Hosted`, cluster mode); the purger beside
//! them; and how a stopped task is reported.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::handle::{Receivers, Runtime};
use super::model::events::Event;
use super::task::Partition;
use crate::deployment_tls::DeploymentTls;
use crate::invoker::AttemptClient;
use crate::limits::Rules;
use crate::registry::Registry;
use sluice_config::Config;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_store::storage::Store;
use sluice_store::storage::view::Checkpoints;
use sluice_store::storage::writer::Writer;

impl Runtime {
    /// Recovers and runs every partition on the current tokio runtime, with an empty rule book,
    /// and the purger; its task is the last of the handles.
    pub fn spawn(
        &self,
        receivers: Receivers,
        store: &Arc<Store>,
        registry: &Arc<Registry>,
        config: &Arc<Config>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, CodedError> {
        let tls = DeploymentTls::load(config.deployment_ca_file.as_deref())?;
        let how = How {
            rules: None,
            tls: &tls,
            leads: None,
        };
        self.spawn_with_rules(receivers, store, registry, config, how)
    }

    /// [`Runtime::spawn`], following the rule book `how.rules` and reaching `https://` deployments
    /// with what `how.tls` trusts. With `how.leads` (cluster mode), partition `i` runs only while
    /// `leads[i]` holds the writer of its log (`docs/cluster.md`), and is recovered from the
    /// store each time it is taken over; events for it meanwhile are dropped (their senders see
    /// the partition gone).
    pub fn spawn_with_rules(
        &self,
        receivers: Receivers,
        store: &Arc<Store>,
        registry: &Arc<Registry>,
        config: &Arc<Config>,
        how: How<'_>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, CodedError> {
        let How { rules, tls, leads } = how;
        let _ = self.health.set(Arc::clone(store.health()));
        let _ = self.home.set(tokio::runtime::Handle::current());
        let n = self.senders.len() as u64;
        // One client per shard: a deployment connection's task runs on the shard that opened
        // it, and only that shard's attempts use it.
        let shards = self.shards.get().map_or(1, |shards| shards.len());
        let idle = config.worker.invoker.connection_idle_timeout.0;
        let clients: Vec<AttemptClient> =
            (0..shards).map(|_| AttemptClient::new(tls, idle)).collect();
        // Embedded, the local log is the truth and the store a view behind it; in cluster
        // mode each partition's Kafka log is, and this writer only applies what landed there.
        let writer = match leads {
            None => Writer::start_logged(Arc::clone(store), checkpoints(config)),
            Some(_) => Writer::start_view(Arc::clone(store), checkpoints(config)),
        };
        let shared = super::task::Shared::new(
            Arc::clone(store),
            writer.clone(),
            Arc::clone(registry),
            Arc::clone(config),
        );
        // Each shard's partitions share one gathering writer: what they queue in one turn of
        // the shard's loop reaches the writer's thread as one set (`gather.rs` in the store).
        let gathered: Vec<Writer> = (0..shards).map(|_| writer.gathering()).collect();
        let worker = &config.worker;
        let purging = Purging {
            store: Arc::clone(store),
            interval: worker.purge_interval.0,
            batch: usize::try_from(worker.purge_batch_size.get()).unwrap_or(usize::MAX),
            in_flight: usize::try_from(worker.cleanup_max_in_flight.get()).unwrap_or(usize::MAX),
        };
        let mut handles = Vec::new();
        let mut recovering = Vec::new();
        let mut leads = leads.map(Vec::into_iter);
        for (index, (rx, queries)) in receivers.0.into_iter().enumerate() {
            let driver = {
                let (runtime, client) = (self.clone(), clients[index % shards].clone());
                move || -> Box<dyn super::driver::Driver> {
                    Box::new(super::driver::TokioDriver::new(
                        runtime.clone(),
                        client.clone(),
                    ))
                }
            };
            let owns = move |id: InvocationId| (id.partition_key() % n) as usize == index;
            if let Some(lead) = leads.as_mut().and_then(Iterator::next) {
                let hosted = Hosted {
                    index: index as u32,
                    own: self.senders[index].clone(),
                    shared: shared.clone(),
                    rules: rules.cloned(),
                    purging: purging.clone(),
                };
                handles.push(self.home_of(index).spawn(hosted.run(
                    (rx, queries),
                    lead,
                    driver,
                    owns,
                )));
                continue;
            }
            let mut partition = Partition::new(
                index as u32,
                &shared.with_writer(gathered[index % shards].clone()),
                driver(),
            );
            if let Some(rules) = rules {
                partition.follow_rules(rules.subscribe());
            }
            recovering.push((index, partition, (rx, queries)));
        }
        let homes: Vec<tokio::runtime::Handle> = self
            .shards
            .get()
            .map(|shards| shards.handles().to_vec())
            .unwrap_or_default();
        for (partition, (rx, queries)) in
            super::recovery::recover_all(store, self.senders.len(), recovering, &homes)?
        {
            let index = partition.outside.index as usize;
            handles.push(self.home_of(index).spawn(async move {
                let (mut rx, mut queries) = (rx, queries);
                partition.run(&mut rx, &mut queries).await;
            }));
        }
        if leads.is_none() {
            handles.push(tokio::spawn(purging.run(writer, |_| true)));
        }
        Ok(handles)
    }
}

/// When the view behind the log is applied and made durable, as `config` says.
pub fn checkpoints(config: &Config) -> Checkpoints {
    Checkpoints {
        interval: config.worker.log_checkpoint_interval.0,
        bytes: config.worker.log_segment_size.0.saturating_mul(8),
        apply_delay: config.worker.log_apply_delay.0,
    }
}

/// How [`Runtime::spawn_with_rules`] runs the partitions.
pub struct How<'a> {
    /// The rule book to follow (none: an empty one).
    pub rules: Option<&'a Arc<Rules>>,
    /// What `https://` deployments are trusted with.
    pub tls: &'a DeploymentTls,
    /// Cluster mode: which partitions this node leads.
    pub leads: Option<Vec<Lead>>,
}

/// Cluster mode: the writer of a partition's log while this node leads it, `None` otherwise.
pub type Lead = tokio::sync::watch::Receiver<Option<Writer>>;

/// What the purger needs.
#[derive(Clone)]
struct Purging {
    store: Arc<Store>,
    interval: std::time::Duration,
    batch: usize,
    in_flight: usize,
}

impl Purging {
    fn run(
        self,
        writer: Writer,
        owns: impl Fn(InvocationId) -> bool + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pace = super::purge::Pace {
            interval: self.interval,
            batch: self.batch,
            in_flight: self.in_flight,
        };
        super::purge::run(self.store, writer, pace, owns)
    }
}

/// A partition of cluster mode: runs while led, recovered from the store at each takeover.
struct Hosted {
    index: u32,
    /// Its own channel: an event that arrives as it is taken over goes back in.
    own: mpsc::Sender<Event>,
    shared: super::task::Shared,
    rules: Option<Arc<Rules>>,
    purging: Purging,
}

impl Hosted {
    async fn run(
        self,
        (mut rx, mut queries): (mpsc::Receiver<Event>, mpsc::Receiver<super::queries::Query>),
        mut lead: Lead,
        driver: impl Fn() -> Box<dyn super::driver::Driver>,
        owns: impl Fn(InvocationId) -> bool + Clone + Send + Sync + 'static,
    ) {
        loop {
            let writer = loop {
                if let Some(writer) = lead.borrow_and_update().clone() {
                    break writer;
                }
                tokio::select! {
                    biased;
                    changed = lead.changed() => if changed.is_err() { return },
                    // Not led here: a read is answered by the leader (its sender sees the
                    // reply dropped and asks no further).
                    query = queries.recv() => if query.is_none() { return },
                    event = rx.recv() => match event {
                        None => return,
                        // Led from this very moment: it is the partition's.
                        Some(event) if lead.borrow().is_some() => {
                            let _ = self.own.try_send(event);
                        }
                        // Not led here: nobody answers it (the doors forward to the leader).
                        Some(_) => {}
                    },
                }
            };
            let mut partition = Partition::new(
                self.index,
                &self.shared.with_writer(writer.clone()),
                driver(),
            );
            if let Some(rules) = &self.rules {
                partition.follow_rules(rules.subscribe());
            }
            if let Err(e) = partition.recover(owns.clone()) {
                tracing::error!(partition = self.index, error.code = ?e.code, error = %e, "a partition taken over failed to recover");
                self.shared.store.health().fail(e);
                return;
            }
            tracing::info!(partition = self.index, "leading the partition");
            let purger = tokio::spawn(self.purging.clone().run(writer, owns.clone()));
            let stopped = tokio::select! {
                () = partition.run(&mut rx, &mut queries) => true,
                _ = lead.wait_for(Option::is_none) => false,
            };
            purger.abort();
            if stopped {
                if self.shared.store.health().failure().is_some() {
                    return;
                }
                // A write failed without failing the store: the log refused it (another node
                // took the partition over, CLU0001). That is a step-down, not a failure; the
                // log's writer says so once it has stopped.
                if lead.wait_for(Option::is_none).await.is_err() {
                    return;
                }
            }
            tracing::info!(partition = self.index, "stepped down from the partition");
        }
    }
}

/// Resolves when the first of `handles` ends, with its index and result.
pub(crate) async fn first_to_end(
    handles: Vec<tokio::task::JoinHandle<()>>,
) -> (usize, Result<(), tokio::task::JoinError>) {
    if handles.is_empty() {
        return std::future::pending().await;
    }
    let (ended, index, _) = futures_util::future::select_all(handles).await;
    (index, ended)
}

/// A partition task (or the purger) that ended while the process serves: its invocations would
/// sit behind a healthy `/health` forever, so the process stops and restarts from the store.
pub(crate) fn stopped_task(task: &str, ended: Result<(), tokio::task::JoinError>) -> CodedError {
    let why = match ended {
        Ok(()) => "it stopped after a failed write".to_owned(),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            format!("it panicked: {message}")
        }
        Err(e) => format!("it was cancelled: {e}"),
    };
    CodedError::new(
        Code::STO0001,
        format!("{task} stopped ({why}); sluice restarts from the store"),
    )
}
