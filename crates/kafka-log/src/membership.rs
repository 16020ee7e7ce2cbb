//! Which partitions this node should lead: the assignment of the leaders topic's partitions by
//! the cluster's consumer group. Intent only: the log decides who leads (`leader.rs`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use tokio::sync::watch;

use super::Settings;

/// Reports each new assignment.
struct Assignments {
    desired: watch::Sender<BTreeSet<u32>>,
    topic: String,
    current: Mutex<BTreeSet<u32>>,
}

impl ClientContext for Assignments {}

impl ConsumerContext for Assignments {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut current = super::lock(&self.current);
        match rebalance {
            Rebalance::Assign(list) => {
                // Eager assignment: the list is the whole new assignment.
                *current = list
                    .elements_for_topic(&self.topic)
                    .iter()
                    .filter_map(|e| u32::try_from(e.partition()).ok())
                    .collect();
            }
            // Eager rebalancing revokes everything before it assigns: the assignment that
            // follows says what to stop (fencing makes a late step-down safe).
            Rebalance::Revoke(_) => return,
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "the cluster's group failed to rebalance");
                return;
            }
        }
        tracing::info!(partitions = ?*current, "the cluster's group assigned partitions");
        let _ = self.desired.send(current.clone());
    }
}

/// Stays in the group until `stopping` turns true; each assignment goes to `desired`.
pub(super) fn run(
    settings: &Settings,
    desired: &watch::Sender<BTreeSet<u32>>,
    stopping: &watch::Receiver<bool>,
) {
    let context = Assignments {
        desired: desired.clone(),
        topic: settings.leaders_topic.clone(),
        current: Mutex::default(),
    };
    let created: Result<BaseConsumer<Assignments>, _> = settings
        .client
        .clone()
        .set("group.id", &settings.leaders_topic)
        .set("partition.assignment.strategy", "roundrobin")
        .set(
            "session.timeout.ms",
            settings.session_timeout.as_millis().to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            (settings.session_timeout.as_millis() / 4)
                .max(100)
                .to_string(),
        )
        .set("enable.auto.commit", "false")
        .create_with_context(context);
    let consumer = match created {
        Ok(consumer) => consumer,
        Err(e) => {
            tracing::error!(error = %e, "cannot join the cluster's group");
            return;
        }
    };
    if let Err(e) = consumer.subscribe(&[&settings.leaders_topic]) {
        tracing::error!(error = %e, "cannot join the cluster's group");
        return;
    }
    while !*stopping.borrow() {
        // Nobody writes the leaders topic: polling only keeps the membership alive.
        let _ = consumer.poll(Duration::from_millis(100));
    }
    // Leaving the group gives the partitions to the others at once.
    consumer.unsubscribe();
}
