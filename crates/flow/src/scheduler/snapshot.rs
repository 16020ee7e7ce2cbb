//! Read-only views of the scheduler for introspection (`sys_scheduler`, `sys_vqueues`).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use super::{QueueId, QueueKey, Resource, Scheduler, State};
use crate::ReadView;
use crate::pattern::{Level, RulePattern};
use crate::quota::Measure;
use crate::rate::RateLimit;
use crate::read_view::greatest;
use crate::rules::Limit;
use crate::scope::Scope;

/// A queue's state, as introspection shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueStatus {
    /// Nothing in it.
    Empty,
    /// Its entries wait only for their run time.
    Scheduled,
    /// Its turn comes: nothing holds it.
    Ready,
    /// Held (see [`BlockedOn`]).
    Blocked,
    /// Paused by an operator: entries kept, none dispatched.
    Paused,
}

impl QueueStatus {
    /// Its name in the admin API and SQL: `empty`, `scheduled`, `ready`, `blocked` or
    /// `paused`.
    pub const fn name(self) -> &'static str {
        match self {
            QueueStatus::Empty => "empty",
            QueueStatus::Scheduled => "scheduled",
            QueueStatus::Ready => "ready",
            QueueStatus::Blocked => "blocked",
            QueueStatus::Paused => "paused",
        }
    }
}

/// What a queue is waiting for, as introspection shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockedOn {
    /// The virtual-object lock.
    Lock,
    /// The invoker's global concurrency slots.
    InvokerConcurrency,
    /// An operator paused its queue.
    QueuePaused,
    /// A user limit.
    LimitKeyConcurrency {
        /// The blocked level.
        level: Level,
        /// Its limit.
        limit: Limit,
        /// The rule that set it.
        rule: Option<Arc<RulePattern>>,
    },
    /// A user quota, used up: the queue waits for its next window.
    Quota {
        /// The level of the counter whose quota is used up.
        level: Level,
        /// The quota.
        quota: crate::quota::Quota,
        /// When its next window starts, ms.
        resets_at_ms: u64,
        /// The rule that set it.
        rule: Option<Arc<RulePattern>>,
    },
    /// A user budget, spent (or held by the reservations of calls running): the queue waits
    /// for its next window, or for running calls to end.
    Budget {
        /// The level of the counter whose budget is used up.
        level: Level,
        /// The budget's amount per window.
        budget: crate::quota::Quota,
        /// When its next window starts, ms.
        resets_at_ms: u64,
        /// The rule that set it.
        rule: Option<Arc<RulePattern>>,
    },
    /// A user rate limit: the queue waits for a token.
    RateLimit {
        /// The level of the counter out of tokens.
        level: Level,
        /// Its rate.
        rate: RateLimit,
        /// When its next token is there, ms (for a queue behind others, the earliest).
        next_token_ms: u64,
        /// The rule that set it.
        rule: Option<Arc<RulePattern>>,
    },
    /// A deployment gate: the concurrency its manifest declares (for the deployment or the
    /// service), or its paced drain after an outage.
    DeploymentConcurrency {
        /// The deployment id, or `deployment/service` for a service's own limit.
        gate: String,
        /// What may run through it now (the declared limit, or the smaller drain window).
        limit: Option<u32>,
        /// Attempts running through it on this node.
        running: u32,
        /// Closed until then (ms) after the deployment answered `Retry-After`.
        closed_until_ms: Option<u64>,
    },
}

impl BlockedOn {
    /// Its name in the admin API and SQL: `lock`, `invoker-concurrency`,
    /// `queue-paused`, `limit-key-concurrency`, `rate-limit`, `quota`, `budget-exhausted` or
    /// `deployment-concurrency`.
    pub const fn name(&self) -> &'static str {
        match self {
            BlockedOn::Lock => "lock",
            BlockedOn::InvokerConcurrency => "invoker-concurrency",
            BlockedOn::QueuePaused => "queue-paused",
            BlockedOn::LimitKeyConcurrency { .. } => "limit-key-concurrency",
            BlockedOn::RateLimit { .. } => "rate-limit",
            BlockedOn::Quota { .. } => "quota",
            BlockedOn::Budget { .. } => "budget-exhausted",
            BlockedOn::DeploymentConcurrency { .. } => "deployment-concurrency",
        }
    }
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
    /// Its state.
    pub status: QueueStatus,
    /// Set when blocked.
    pub blocked_on: Option<BlockedOn>,
    /// When the current status began.
    pub since: u64,
    /// When it was created, and when entries last arrived and started.
    pub times: super::QueueTimes,
    /// Its invocations past the queue, by stage; the scheduler does not see them, so it leaves
    /// this empty and the partition counts them.
    pub stages: StageCounts,
    /// The mean gap between its recent dispatches, ms (`None` before it dispatched twice).
    pub drain_gap_ms: Option<u64>,
}

/// Invocations of one queue by stage, beside the ones waiting in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageCounts {
    /// Running an attempt.
    pub running: u64,
    /// Suspended (or backing off) between attempts.
    pub suspended: u64,
    /// Paused by an operator or out of attempts.
    pub paused: u64,
    /// Completed and still kept in memory.
    pub finished: u64,
}

/// What a queue read found.
#[derive(Debug, Clone, Default)]
pub struct QueuePage {
    /// Queues that matched the view's scope, before its limit.
    pub total: usize,
    /// Those returned, by id.
    pub queues: Vec<QueueSnapshot>,
}

impl Scheduler {
    /// Every live queue with its status.
    pub fn queues(&self) -> Vec<QueueSnapshot> {
        self.queue_page(&ReadView::ALL).queues
    }

    /// The live queues `view` asks for: of one scope, the `limit` holding the most (waiting,
    /// then scheduled), picked before any snapshot is built.
    pub fn queue_page(&self, view: &ReadView) -> QueuePage {
        let scope = view.scope.as_deref();
        let live = self
            .queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| Some((QueueId(i as u32), q.as_ref()?)))
            .filter(|(_, q)| {
                scope.is_none_or(|s| q.key.scope.as_ref().map(Scope::as_str) == Some(s))
            });
        let mut total = 0;
        let ids: Vec<QueueId> = match view.limit {
            None => live.inspect(|_| total += 1).map(|(id, _)| id).collect(),
            Some(limit) => {
                let busy = live
                    .inspect(|_| total += 1)
                    .map(|(id, q)| (q.len(), q.delayed, Reverse(id)));
                greatest(busy, limit)
                    .into_iter()
                    .map(|(_, _, Reverse(id))| id)
                    .collect()
            }
        };
        let mut queues: Vec<QueueSnapshot> =
            ids.into_iter().map(|id| self.queue_snapshot(id)).collect();
        queues.sort_by_key(|s| s.id);
        QueuePage { total, queues }
    }

    /// Calls of `service` waiting in the live queues, per scope: sums of the numbers each
    /// queue holds, with no queue's snapshot (a subscription's bound reads it often).
    pub fn waiting_by_scope(&self, service: &str) -> HashMap<Option<Scope>, usize> {
        let mut per_scope = HashMap::new();
        let live = self.queues.iter().flatten();
        for queue in live.filter(|q| *q.key.service == *service && q.len() > 0) {
            *per_scope.entry(queue.key.scope.clone()).or_insert(0) += queue.len();
        }
        per_scope
    }

    /// Queue `id` with its status.
    fn queue_snapshot(&self, id: QueueId) -> QueueSnapshot {
        let now = self.polled_at;
        let invoker_full = self.slots.full();
        let queue = self.queue(id);
        let (status, blocked_on) = match &queue.state {
            State::Idle if queue.delayed > 0 => (QueueStatus::Scheduled, None),
            State::Idle => (QueueStatus::Empty, None),
            State::Ready if invoker_full => {
                (QueueStatus::Blocked, Some(BlockedOn::InvokerConcurrency))
            }
            State::Ready => (QueueStatus::Ready, None),
            State::Paused => (QueueStatus::Paused, Some(BlockedOn::QueuePaused)),
            State::Parked(Resource::Lock(_), ..) => (QueueStatus::Blocked, Some(BlockedOn::Lock)),
            State::Parked(Resource::Counter(_), _, why) => {
                let why = why.as_ref().expect("counter parks carry their reason");
                let on = BlockedOn::LimitKeyConcurrency {
                    level: why.level,
                    limit: why.limit,
                    rule: why.rule.clone(),
                };
                (QueueStatus::Blocked, Some(on))
            }
            State::Parked(Resource::Token(_), _, why) => {
                let why = why.as_ref().expect("token parks carry their reason");
                let on = match (why.rate, why.quota) {
                    (Some((rate, next_token_ms)), _) => BlockedOn::RateLimit {
                        level: why.level,
                        rate,
                        next_token_ms,
                        rule: why.rule.clone(),
                    },
                    // `used_up` names gates only: a burst budget never holds a call back.
                    (None, Some((Measure::Calls | Measure::Burst, quota, resets_at_ms))) => {
                        BlockedOn::Quota {
                            level: why.level,
                            quota,
                            resets_at_ms,
                            rule: why.rule.clone(),
                        }
                    }
                    (None, Some((Measure::Cost, budget, resets_at_ms))) => BlockedOn::Budget {
                        level: why.level,
                        budget,
                        resets_at_ms,
                        rule: why.rule.clone(),
                    },
                    (None, None) => {
                        unreachable!("token parks carry a rate, a quota or a budget")
                    }
                };
                (QueueStatus::Blocked, Some(on))
            }
            State::Parked(Resource::Gate(gate), ..) => {
                let gate = self.gates.gate(*gate);
                let on = BlockedOn::DeploymentConcurrency {
                    gate: gate.name().to_owned(),
                    limit: gate.limit(),
                    running: gate.used(),
                    closed_until_ms: gate.closed_until(now),
                };
                (QueueStatus::Blocked, Some(on))
            }
        };
        QueueSnapshot {
            id,
            key: queue.key.clone(),
            queued: queue.len(),
            delayed: queue.delayed,
            status,
            blocked_on,
            since: queue.since,
            times: queue.times,
            stages: StageCounts::default(),
            drain_gap_ms: queue.drain.mean_gap_ms(),
        }
    }
}
