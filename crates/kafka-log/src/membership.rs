//! Which partitions this node should lead: the assignment of the leaders topic's partitions by
//! the cluster's consumer group. Intent only: the log decides who leads (`leader.rs`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use tokio::sync::watch;

use super::Settings;

/// Reports each change of this node's assignment.
struct Assignments {
    desired: watch::Sender<BTreeSet<u32>>,
    topic: String,
    current: Mutex<BTreeSet<u32>>,
    /// A new assignment came: the standbys are computed again.
    assigned: AtomicBool,
}

impl ClientContext for Assignments {}

impl ConsumerContext for Assignments {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut current = super::lock(&self.current);
        let partitions = |list: &rdkafka::TopicPartitionList| -> Vec<u32> {
            list.elements_for_topic(&self.topic)
                .iter()
                .filter_map(|e| u32::try_from(e.partition()).ok())
                .collect()
        };
        // Cooperative (sticky) rebalancing: an assignment adds partitions, a revocation takes
        // some away, and partitions in neither stay where they are, led on without a pause.
        match rebalance {
            Rebalance::Assign(list) => current.extend(partitions(list)),
            Rebalance::Revoke(list) => {
                for p in partitions(list) {
                    current.remove(&p);
                }
            }
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "the cluster's group failed to rebalance");
                return;
            }
        }
        tracing::info!(partitions = ?*current, "the cluster's group assigned partitions");
        let _ = self.desired.send(current.clone());
        self.assigned.store(true, Ordering::Relaxed);
    }
}

/// How often the group is described again while nothing changed (a member that left
/// without a rebalance this node saw).
const DESCRIBE_EVERY: Duration = Duration::from_secs(5);

/// How soon a description is asked again while the group rebalances.
const DESCRIBE_AGAIN: Duration = Duration::from_millis(200);

/// Stays in the group until `stopping` turns true (or, first, `leaving`: the node hands its
/// partitions on before it drains); each assignment goes to `desired`, and the
/// partitions this node keeps (those it is assigned and those it stands by for, `standbys.rs`)
/// to `held` (`None` until the group was first described: everything is kept meanwhile).
pub(super) fn run(
    settings: &Settings,
    desired: &watch::Sender<BTreeSet<u32>>,
    held: &watch::Sender<Option<BTreeSet<u32>>>,
    stopping: &watch::Receiver<bool>,
    leaving: &AtomicBool,
) {
    let context = Assignments {
        desired: desired.clone(),
        topic: settings.leaders_topic.clone(),
        current: Mutex::default(),
        assigned: AtomicBool::new(false),
    };
    let created: Result<BaseConsumer<Assignments>, _> = settings
        .client
        .clone()
        .set("group.id", &settings.leaders_topic)
        // The group's description names each member by it (`standbys.rs`).
        .set("client.id", &settings.node)
        // Sticky: a node's loss moves only its partitions, and a node that joins takes about
        // its share from the others while the rest stay put. (Every node of a group must use
        // the same strategy: a release that used `roundrobin` is stopped whole before this
        // one starts, or its nodes cannot join the same group.)
        .set("partition.assignment.strategy", "cooperative-sticky")
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
    // What this node keeps; `None` until the group was first described.
    let mut keep: Option<BTreeSet<u32>> = None;
    let mut describe_at = Instant::now();
    while !*stopping.borrow() {
        if leaving.load(Ordering::Relaxed) {
            // Stopping: out of the group, so the others take every partition over now; this
            // node leads nothing more. The thread stays (its `desired` keeps the takeovers'
            // loop alive while the node still answers and forwards).
            consumer.unsubscribe();
            let _ = desired.send(BTreeSet::new());
            while !*stopping.borrow() {
                std::thread::sleep(Duration::from_millis(100));
            }
            return;
        }
        // Nobody writes the leaders topic: polling only keeps the membership alive.
        let _ = consumer.poll(Duration::from_millis(100));
        let context = consumer.context();
        let current = super::lock(&context.current).clone();
        if context.assigned.swap(false, Ordering::Relaxed) {
            // What it is assigned is kept at once; what it kept before stays until the group
            // is described again (keeping more than needed only costs store, and a partition
            // handed on is stood by for, often, by the node that led it).
            if let Some(keep) = &mut keep {
                keep.extend(&current);
            }
            describe_at = Instant::now();
        }
        if Instant::now() >= describe_at {
            describe_at = Instant::now() + DESCRIBE_EVERY;
            let standing_by = if settings.standbys == 0 {
                Some(BTreeSet::new())
            } else {
                match super::standbys::describe(
                    &consumer,
                    &settings.leaders_topic,
                    &settings.leaders_topic,
                    settings.partitions,
                ) {
                    Ok(Some(members)) => Some(super::standbys::standing_by(
                        &members,
                        settings.standbys,
                        &settings.node,
                    )),
                    Ok(None) => {
                        describe_at = Instant::now() + DESCRIBE_AGAIN;
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot tell which partitions this node stands by for");
                        None
                    }
                }
            };
            if let Some(standing_by) = standing_by {
                keep = Some(current.union(&standing_by).copied().collect());
            }
        }
        held.send_if_modified(|held| {
            if *held == keep {
                return false;
            }
            tracing::info!(partitions = ?keep, "this node keeps the partitions");
            held.clone_from(&keep);
            true
        });
    }
    // Leaving the group gives the partitions to the others at once.
    consumer.unsubscribe();
}
