//! Which partitions this node should lead and keep: planned from the cluster group's members
//! (`assignment.rs`). Intent only: the log decides who leads (`leader.rs`).

use std::collections::{BTreeMap, BTreeSet};
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

/// How long a node waits before it takes over a partition the plan gives it from another
/// member that still leads it (a node joined, or shares moved): that member sees the same plan
/// at its next description (within [`DESCRIBE_EVERY`]) and steps down first, so its calls in
/// flight end there instead of being fenced by the takeover. A dead or departed node's
/// partitions are taken at once.
const HAND_OVER: Duration = Duration::from_secs(2);

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
    let Some(consumer) = join_group(settings) else {
        return;
    };
    let mut planner = Planner::default();
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
        if consumer.context().rebalanced.swap(false, Ordering::Relaxed) {
            describe_at = Instant::now();
        }
        if Instant::now() >= describe_at {
            let again = planner.plan(&consumer, settings, current, desired, held);
            describe_at = Instant::now() + again;
        }
    }
    // Leaving the group gives the partitions to the others at once.
    consumer.unsubscribe();
}

/// Joins the cluster's group (`<prefix>leaders`) as a member named by the node id.
fn join_group(settings: &Settings) -> Option<BaseConsumer<Rebalanced>> {
    let created: Result<BaseConsumer<Rebalanced>, _> = settings
        .client
        .clone()
        .set("group.id", &settings.leaders_topic)
        // The group's description names each member by it (`group.rs`).
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
    let joined = created.and_then(|consumer| {
        consumer.subscribe(&[&settings.leaders_topic])?;
        Ok(consumer)
    });
    joined
        .map_err(|e| tracing::error!(error = %e, "cannot join the cluster's group"))
        .ok()
}

/// What planning remembers between descriptions of the group.
#[derive(Default)]
struct Planner {
    /// A description was had.
    described: bool,
    /// Descriptions failed since the last that succeeded.
    failed: u32,
    /// Each partition's standbys under the last plan in force (what the nodes keep): a lost
    /// node's partitions go to them (`assignment.rs`, rule 2).
    stood_by: Vec<Vec<String>>,
    /// Partitions the plan gives here from another member that still leads them, and since
    /// when ([`HAND_OVER`]).
    handed: BTreeMap<u32, Instant>,
}

impl Planner {
    /// Describes the group and plans from it: what this node should lead to `desired`, what
    /// it keeps to `held`. How soon to describe it again.
    fn plan(
        &mut self,
        consumer: &BaseConsumer<Rebalanced>,
        settings: &Settings,
        current: &dyn Fn() -> Option<Vec<Option<String>>>,
        desired: &watch::Sender<BTreeSet<u32>>,
        held: &watch::Sender<Option<BTreeSet<u32>>>,
    ) -> Duration {
        let topic = &settings.leaders_topic;
        let members = match super::group::describe(consumer, topic, topic, settings.partitions) {
            Ok(Some(members)) => members,
            Ok(None) => {
                tracing::debug!("the cluster's group is rebalancing: described again soon");
                return DESCRIBE_AGAIN;
            }
            Err(e) => {
                self.failed += 1;
                // Said once per run of failures, and once more when it leaves this node on
                // the group's assignment: brokers that never describe groups would otherwise
                // fill the log every second.
                if self.failed == 1 {
                    tracing::warn!(error = %e, "cannot describe the cluster's group; asking again every second");
                } else if !self.described && self.failed == UNDESCRIBED {
                    tracing::warn!(error = %e, "the brokers describe no group: this node leads what the group's own assignor gives it and keeps every partition");
                } else {
                    tracing::debug!(error = %e, "cannot describe the cluster's group");
                }
                if !self.described && self.failed >= UNDESCRIBED {
                    // Leading what the group assigns, keeping every partition (`held` stays
                    // `None`): sticky still, but a lost node's partitions do not go to the
                    // nodes that stand by for them.
                    let assigned = super::lock(&consumer.context().assigned).clone();
                    lead(desired, &assigned, "the group assigns");
                }
                return DESCRIBE_EVERY;
            }
        };
        (self.described, self.failed) = (true, 0);
        let Some(current) = current() else {
            tracing::debug!("the epochs topic is not read to its end yet: nothing planned");
            return DESCRIBE_AGAIN;
        };
        let plan = assignment::plan(&members, &current, &self.stood_by);
        let table = assignment::standbys(&plan, &members, settings.standbys);
        let mut mine = assignment::leading(&plan, &settings.node);
        let mut kept = assignment::standing_by(&table, &settings.node);
        kept.extend(&mine);
        if plan == current {
            self.stood_by = table;
        }
        let waiting = self.hand_over(&mut mine, &current, &members, &settings.node);
        lead(desired, &mine, "planned");
        let keep = Some(kept);
        held.send_if_modified(|held| {
            if *held == keep {
                return false;
            }
            tracing::info!(partitions = ?keep, "this node keeps the partitions");
            held.clone_from(&keep);
            true
        });
        waiting.map_or(DESCRIBE_EVERY, |left| left.min(DESCRIBE_EVERY))
    }

    /// Leaves out of `mine` the partitions another member still leads until [`HAND_OVER`]
    /// passed since the plan first gave them here; how long until the next is due.
    fn hand_over(
        &mut self,
        mine: &mut BTreeSet<u32>,
        current: &[Option<String>],
        members: &assignment::Members,
        node: &str,
    ) -> Option<Duration> {
        let led_by_another = |p: &u32| {
            current
                .get(*p as usize)
                .and_then(Option::as_deref)
                .is_some_and(|l| l != node && members.contains(l))
        };
        let now = Instant::now();
        self.handed
            .retain(|p, _| mine.contains(p) && led_by_another(p));
        let mut next: Option<Duration> = None;
        for p in mine.iter().copied().filter(led_by_another) {
            let since = *self.handed.entry(p).or_insert(now);
            let left = HAND_OVER.saturating_sub(now - since);
            if !left.is_zero() {
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        mine.retain(|p| {
            self.handed
                .get(p)
                .is_none_or(|since| now - *since >= HAND_OVER)
        });
        next
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_another_member_leads_is_taken_only_after_the_hand_over_time() {
        let members: assignment::Members = ["a", "b"].map(str::to_owned).into();
        // Partition 0 led by b (a member), 1 by c (gone), 2 by nobody, 3 here already.
        let current = [Some("b"), Some("c"), None, Some("a")].map(|l| l.map(str::to_owned));
        let mut planner = Planner::default();
        let mut mine = BTreeSet::from([0, 1, 2, 3]);
        let wait = planner.hand_over(&mut mine, &current, &members, "a");
        assert_eq!(mine, BTreeSet::from([1, 2, 3]));
        assert!(
            wait.is_some_and(|w| w <= HAND_OVER && !w.is_zero()),
            "{wait:?}"
        );
        // Its time passed: it is taken.
        planner.handed.insert(0, Instant::now() - HAND_OVER);
        let mut mine = BTreeSet::from([0, 1, 2, 3]);
        assert_eq!(planner.hand_over(&mut mine, &current, &members, "a"), None);
        assert_eq!(mine, BTreeSet::from([0, 1, 2, 3]));
        // No longer planned here: forgotten.
        let mut mine = BTreeSet::from([1]);
        planner.hand_over(&mut mine, &current, &members, "a");
        assert!(planner.handed.is_empty());
    }
}
