//! Which partitions this node should lead and keep: planned from the cluster group's members
//! (`assignment.rs`). Intent only: the log decides who leads (`leader.rs`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use tokio::sync::watch;

use super::{Settings, assignment};

/// What the group's own assignor gave this node, and that the group rebalanced (its
/// description is asked again at once).
struct Rebalanced {
    topic: String,
    assigned: Mutex<BTreeSet<u32>>,
    rebalanced: AtomicBool,
}

impl ClientContext for Rebalanced {}

impl ConsumerContext for Rebalanced {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let partitions = |list: &rdkafka::TopicPartitionList| -> Vec<u32> {
            list.elements_for_topic(&self.topic)
                .iter()
                .filter_map(|e| u32::try_from(e.partition()).ok())
                .collect()
        };
        let mut assigned = super::lock(&self.assigned);
        // Cooperative: an assignment adds partitions, a revocation takes some away.
        match rebalance {
            Rebalance::Assign(list) => assigned.extend(partitions(list)),
            Rebalance::Revoke(list) => {
                for p in partitions(list) {
                    assigned.remove(&p);
                }
            }
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "the cluster's group failed to rebalance");
            }
        }
        self.rebalanced.store(true, Ordering::Relaxed);
    }
}

/// Failed descriptions in a row, with none before that succeeded, after which the node leads
/// what the group's own assignor gives it (brokers that do not describe groups to it: no
/// `Describe` right on the group, or librdkafka's mock brokers).
const UNDESCRIBED: u32 = 3;

/// How often the group is described again while nothing changed (a member that left
/// without a rebalance this node saw; leaders that moved).
const DESCRIBE_EVERY: Duration = Duration::from_secs(1);

/// How soon a description is asked again while the group rebalances.
const DESCRIBE_AGAIN: Duration = Duration::from_millis(200);

/// Stays in the group until `stopping` turns true (or, first, `leaving`: the node hands its
/// partitions on before it drains). From each description of the group and the leaders
/// `current` knows (`None` until it knows every partition's), it plans who leads what
/// (`assignment.rs`): the partitions this node should lead go to `desired`, and those it keeps
/// (those and the ones it stands by for) to `held` (`None` until the first plan: everything
/// is kept meanwhile).
pub(super) fn run(
    settings: &Settings,
    current: &dyn Fn() -> Option<Vec<Option<String>>>,
    desired: &watch::Sender<BTreeSet<u32>>,
    held: &watch::Sender<Option<BTreeSet<u32>>>,
    stopping: &watch::Receiver<bool>,
    leaving: &AtomicBool,
) {
    let created: Result<BaseConsumer<Rebalanced>, _> = settings
        .client
        .clone()
        .set("group.id", &settings.leaders_topic)
        // The group's description names each member by it (`standbys.rs`).
        .set("client.id", &settings.node)
        // The group's assignment is not the plan (`assignment.rs`), only how the group holds
        // its members; cooperative, a member's coming or going pauses no other. (Every node
        // of a group must use the same strategy: a release that used `roundrobin` is stopped
        // whole before this one starts, or its nodes cannot join the same group.)
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
        .create_with_context(Rebalanced {
            topic: settings.leaders_topic.clone(),
            assigned: Mutex::default(),
            rebalanced: AtomicBool::new(false),
        });
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
    let mut describe_at = Instant::now();
    // Whether a description was had yet, and how many failed since.
    let (mut described, mut failed) = (false, 0);
    // Each partition's standbys under the last plan in force (what the nodes keep): a lost
    // node's partitions go to them (`assignment.rs`, rule 2).
    let mut stood_by: Vec<Vec<String>> = Vec::new();
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
        if consumer.context().rebalanced.swap(false, Ordering::Relaxed) {
            describe_at = Instant::now();
        }
        if Instant::now() < describe_at {
            continue;
        }
        describe_at = Instant::now() + DESCRIBE_EVERY;
        let members = match super::group::describe(
            &consumer,
            &settings.leaders_topic,
            &settings.leaders_topic,
            settings.partitions,
        ) {
            Ok(Some(members)) => members,
            Ok(None) => {
                tracing::debug!("the cluster's group is rebalancing: described again soon");
                describe_at = Instant::now() + DESCRIBE_AGAIN;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot describe the cluster's group");
                failed += 1;
                if !described && failed >= UNDESCRIBED {
                    // Leading what the group assigns, keeping every partition (`held` stays
                    // `None`): sticky still, but a lost node's partitions do not go to the
                    // nodes that stand by for them.
                    let assigned = super::lock(&consumer.context().assigned).clone();
                    lead(desired, &assigned, "the group assigns");
                }
                continue;
            }
        };
        (described, failed) = (true, 0);
        let Some(current) = current() else {
            tracing::debug!("the epochs topic is not read to its end yet: nothing planned");
            describe_at = Instant::now() + DESCRIBE_AGAIN;
            continue;
        };
        let plan = assignment::plan(&members, &current, &stood_by);
        if plan == current {
            stood_by = assignment::standbys(&plan, &members, settings.standbys);
        }
        let mine = assignment::leading(&plan, &settings.node);
        lead(desired, &mine, "planned");
        let mut kept = assignment::standing_by(&plan, &members, settings.standbys, &settings.node);
        kept.extend(mine);
        let keep = Some(kept);
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

/// Makes `partitions` the ones this node should lead (`how`: whose decision).
fn lead(desired: &watch::Sender<BTreeSet<u32>>, partitions: &BTreeSet<u32>, how: &str) {
    desired.send_if_modified(|desired| {
        if desired == partitions {
            return false;
        }
        tracing::info!(partitions = ?partitions, how, "this node leads the partitions");
        desired.clone_from(partitions);
        true
    });
}
