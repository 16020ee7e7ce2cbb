//! Read-only views of the scheduler for introspection (`sys_scheduler`, `sys_vqueues`).

use std::sync::Arc;

use super::{QueueId, QueueKey, Resource, Scheduler, State};
use crate::pattern::{Level, RulePattern};
use crate::rules::Limit;

/// What a queue is waiting for, as introspection shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockedOn {
    /// The virtual-object lock.
    Lock,
    /// The invoker's global concurrency slots.
    InvokerConcurrency,
    /// A user limit.
    LimitKeyConcurrency {
        /// The blocked level.
        level: Level,
        /// Its limit.
        limit: Limit,
        /// The rule that set it.
        rule: Option<Arc<RulePattern>>,
    },
}

/// Status of a queue for introspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSnapshot {
    /// The queue.
    pub id: QueueId,
    /// What it is for.
    pub key: QueueKey,
    /// Entries ready to run (resumed + new).
    pub queued: usize,
    /// Entries waiting for their run time.
    pub delayed: u32,
    /// `empty`, `ready`, `scheduled` or `blocked`.
    pub status: &'static str,
    /// Set when blocked.
    pub blocked_on: Option<BlockedOn>,
    /// When the current status began.
    pub since: u64,
}

impl Scheduler {
    /// Every live queue with its status.
    pub fn queues(&self) -> Vec<QueueSnapshot> {
        let invoker_full = self.slots.full();
        let mut out: Vec<QueueSnapshot> = self
            .queue_index
            .values()
            .map(|id| {
                let queue = self.queue(*id);
                let (status, blocked_on) = match &queue.state {
                    State::Idle if queue.delayed > 0 => ("scheduled", None),
                    State::Idle => ("empty", None),
                    State::Ready if invoker_full => {
                        ("blocked", Some(BlockedOn::InvokerConcurrency))
                    }
                    State::Ready => ("ready", None),
                    State::Parked(Resource::Lock(_), _) => ("blocked", Some(BlockedOn::Lock)),
                    State::Parked(Resource::Counter(_), why) => {
                        let why = why.as_ref().expect("counter parks carry their reason");
                        let on = BlockedOn::LimitKeyConcurrency {
                            level: why.level,
                            limit: why.limit,
                            rule: why.rule.clone(),
                        };
                        ("blocked", Some(on))
                    }
                };
                QueueSnapshot {
                    id: *id,
                    key: queue.key.clone(),
                    queued: queue.len(),
                    delayed: queue.delayed,
                    status,
                    blocked_on,
                    since: queue.since,
                }
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}
