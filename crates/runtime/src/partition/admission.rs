//! How a partition decides which invocation runs next: every attempt goes through the flow
//! core's scheduler, which holds exclusive handlers of one virtual object to one at a time (the
//! lock lives from first dispatch to completion, across suspensions; waiters are FIFO) and
//! bounds the attempts running at once. Permits are given back whenever an attempt ends.

use super::live::Live;
use super::model::phase::Run;
use super::task::Partition;
use crate::discovery::{HandlerType, ServiceType};
use crate::registry::Registry;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::{
    BlockedOn, EntryKind, IdleBound, Position, QueueKey, QueueStatus, RefusalReason,
};
use sluice_flow::{LimitKey, Measure, Scope};
use sluice_store::invocation::store::Timer;
use sluice_store::invocation::{InvocationRecord, Status};

/// The scheduler queue of `record`: scoped invocations count against their scope and limit
/// key; exclusive handlers of keyed services queue per object key and take its lock;
/// everything else queues per service.
pub(super) fn queue_key(registry: &Registry, record: &InvocationRecord) -> QueueKey {
    let target = &record.target;
    let exclusive = target.key.is_some()
        && registry
            .handler_kind(record.deployment, &target.service, &target.handler)
            .is_some_and(|(service, handler)| match service {
                ServiceType::VirtualObject => handler != Some(HandlerType::Shared),
                ServiceType::Workflow => handler == Some(HandlerType::Workflow),
                ServiceType::Service => false,
            });
    let scope = record.scope.clone();
    let limit_key = scope.as_ref().and(record.limit_key.clone());
    QueueKey {
        scope,
        limit_key,
        service: target.service.as_str().into(),
        object_key: exclusive
            .then(|| target.key.as_deref().map(Into::into))
            .flatten(),
        priority: record.priority.unwrap_or_default(),
    }
}

impl Live {
    /// Whether it was dispatched before (so it may hold its object's lock). Not its status:
    /// an invocation paused before it ever ran, then resumed, never took the lock, and taking
    /// it for one at a restart left the object's real holder queued behind it for ever. The
    /// pinned deployment is stored before an attempt's first journal entry.
    pub(super) fn started(&self) -> bool {
        self.lock.is_some() || self.record().attempts > 0 || self.record().deployment.is_some()
    }
}

impl Partition {
    /// Queues `id` for an attempt.
    pub(super) fn enqueue(&mut self, id: InvocationId) {
        self.enqueue_keyed(id, None);
    }

    /// Queues `id` for an attempt in queue `key` (computed here when `None`: a registry
    /// lookup a submission that already made one passes on).
    pub(super) fn enqueue_keyed(&mut self, id: InvocationId, key: Option<QueueKey>) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if matches!(live.run(), Run::Running(_) | Run::Queued { .. })
            || matches!(live.record().status, Status::Completed | Status::Paused)
        {
            return;
        }
        let kind = if live.started() {
            EntryKind::Resumed
        } else {
            EntryKind::New
        };
        let key = key.unwrap_or_else(|| queue_key(&self.outside.registry, live.record()));
        let now = self.outside.driver.now_ms();
        // An attempt whose ending is stored by now (this runs after commits, or for a new
        // invocation) gives its slots back before it queues again.
        if let Some(permit) = live.settle() {
            self.admission.scheduler.release(permit, now);
        }
        let queue = match kind {
            // A new invocation's wait is bounded by its request's deadline and the rules'
            // `max_wait`, counted from its arrival or the end of its delay: a restart that
            // queues it again keeps the same deadline.
            EntryKind::New => {
                let record = live.record();
                let since = record.created_at_ms.max(record.run_at_ms.unwrap_or(0));
                self.admission.scheduler.enqueue_with_deadline(
                    &key,
                    live.entry,
                    None,
                    record.deadline_ms,
                    since,
                    now,
                )
            }
            EntryKind::Resumed => Some(
                self.admission
                    .scheduler
                    .enqueue(&key, live.entry, kind, None, now),
            ),
        };
        // `None`: a rule's `on_full` dropped it; it stays out of every queue until
        // `settle_crowds`' wake-up ends it.
        if let Some(queue) = queue {
            live.set_run(Run::Queued { queue });
            self.resting.note_queued(id);
        }
        self.settle_crowds();
    }

    /// The queue a new invocation's flow-control rules are checked at: scoped ones that are
    /// not delayed (delayed invocations are not queued yet).
    pub(super) fn checked_queue(&self, record: &InvocationRecord) -> Option<QueueKey> {
        (record.scope.is_some() && record.status != Status::Scheduled)
            .then(|| queue_key(&self.outside.registry, record))
    }

    /// Why a flow-control rule refuses a new invocation in queue `key` (FLO0002): its counter's
    /// queue is full, or its rate or quota rejects; (FLO0005) its budget rejects; or (FLO0004)
    /// it would start a quota or budget use the partition has no room to keep.
    pub(super) fn flow_refusal(&mut self, key: &QueueKey) -> Option<CodedError> {
        let now = self.outside.driver.now_ms();
        let refused = self.admission.scheduler.refusal(key, now)?;
        let at = match (&key.scope, &key.limit_key) {
            (Some(scope), Some(limit_key)) => format!("scope '{scope}', limit key '{limit_key}'"),
            (Some(scope), None) => format!("scope '{scope}'"),
            _ => "its scope".to_owned(),
        };
        let rule = refused
            .rule
            .as_ref()
            .map_or_else(String::new, |r| format!(" (rule '{r}')"));
        let level = refused.level.as_str();
        // Each reason names its code: a new reason cannot slip in under another's.
        let (code, why) = match refused.why {
            RefusalReason::QueueFull { max_queued } => (
                Code::FLO0002,
                format!(
                    "the {level} queue of {at} already holds {max_queued} waiting invocations, its max_queued{rule}"
                ),
            ),
            RefusalReason::RateExceeded { rate } => (
                Code::FLO0002,
                format!(
                    "the {level} rate of {at} ({} with on_exceed = reject{rule}) has no token left",
                    rate.rate
                ),
            ),
            RefusalReason::QuotaExhausted { quota } => (
                Code::FLO0002,
                format!(
                    "the {level} quota of {at} ({quota} with on_exceed = reject{rule}) is used up until its next window"
                ),
            ),
            RefusalReason::BudgetExhausted { budget } => (
                Code::FLO0005,
                format!(
                    "the {level} budget of {at} ({budget} with on_exceed = reject{rule}) is spent, with what running calls hold reserved, until its next window"
                ),
            ),
            RefusalReason::IdleQuotasFull { bound } => {
                let kept = match bound {
                    IdleBound::Scope(max) => format!(
                        "its scope already keeps the use of {max} idle counters on this partition (flow.max-idle-quota-counters-per-scope)"
                    ),
                    IdleBound::Partition(max) => format!(
                        "this partition already keeps the use of {max} idle counters (flow.max-idle-quota-counters)"
                    ),
                };
                (
                    Code::FLO0004,
                    format!(
                        "the {level} counter of {at} has a quota or budget{rule} and has used none of it in this window, and {kept}"
                    ),
                )
            }
        };
        // Whole seconds, at least 1: what `Retry-After` can say.
        let retry = refused.retry_after_ms.div_ceil(1000).max(1);
        Some(CodedError::new(code, format!("{why}; retry after {retry} s")).retry_after(retry))
    }

    /// Takes a queued invocation out of the scheduler (it was paused or killed).
    pub(super) fn scheduler_forget(&mut self, id: InvocationId) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if let Some(queue) = live.run().queue() {
            live.set_run(Run::IDLE);
            self.admission
                .scheduler
                .remove(queue, live.entry, self.outside.driver.now_ms());
        }
    }

    /// Starts every attempt the scheduler admits now.
    pub(super) fn dispatch(&mut self) {
        self.refresh_rules();
        let now = self.outside.driver.now_ms();
        let admitted = self.admission.scheduler.poll_runnable(now);
        self.expire_queued(now);
        for admitted in admitted {
            let Some(id) = self.entries.holder(admitted.entry) else {
                self.admission.scheduler.release(admitted.permit, now);
                continue;
            };
            self.rouse(id);
            self.observe();
            let Some(live) = self.live.get_mut(&id) else {
                // Still at rest: reading its input back failed (the store closed for shutdown,
                // or failed and said so). The store keeps it; the next start queues it again.
                self.admission.scheduler.release(admitted.permit, now);
                continue;
            };
            live.lock = admitted.lock.or(live.lock);
            if live.run().queue().is_none() {
                // Taken out of its queue since (killed, paused): nothing to start.
                self.admission.scheduler.release(admitted.permit, now);
                continue;
            }
            live.set_run(Run::IDLE);
            let mut permit = admitted.permit;
            if let Some(reserved) = permit.take_reserved() {
                live.reserved = Some(reserved);
            }
            if admitted.kind == EntryKind::New {
                // From its arrival, or the end of its delay, to its start.
                let since = live
                    .record()
                    .created_at_ms
                    .max(live.record().run_at_ms.unwrap_or(0));
                self.admission
                    .scheduler
                    .record_wait(&permit, now.saturating_sub(since));
            }
            self.start_attempt(id, permit);
            self.observe();
        }
        // What counters used of their quotas, and of their burst budgets, goes with the
        // admissions that used it.
        for m in [Measure::Calls, Measure::Burst] {
            for (counter, used) in self.admission.scheduler.take_use_writes(m) {
                sluice_store::invocation::quotas::put(
                    &mut self.starting.pins,
                    m,
                    self.outside.index,
                    &counter,
                    used,
                );
            }
        }
        // What the attempts started write, in one set: awaited with the batches, so a failure
        // stops the partition like any other (`run_loop::adopt_detached`).
        if !self.starting.pins.is_empty() {
            let pins = std::mem::take(&mut self.starting.pins);
            self.starting
                .detached
                .push(self.outside.writer.commit(pins));
        }
        self.nudge_waiting_partitions();
        self.rest_waiting();
        self.observe();
    }

    /// Invocations the scheduler dropped past their deadline, never started: each is failed
    /// with FLO0003 by a wake-up in the next batch (the failure is a write, and this runs
    /// after a commit). Until then it is in no queue; a restart queues it again and it
    /// expires again.
    fn expire_queued(&mut self, now: u64) {
        for expired in self.admission.scheduler.take_expired() {
            let Some(id) = self.entries.holder(expired.entry) else {
                continue;
            };
            self.rouse(id);
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if live.run().queue() == Some(expired.queue) {
                live.set_run(Run::IDLE);
            }
            self.admission.missed_deadlines.insert(id, expired.deadline);
            self.wakes.push(std::cmp::Reverse((
                now,
                id,
                Some(Timer {
                    at_ms: now,
                    invocation: id,
                    completion: super::commands::QUEUE_DEADLINE,
                }),
            )));
        }
    }

    /// Partitions waiting for invoker slots this one gave back poll again.
    fn nudge_waiting_partitions(&mut self) {
        let waiting = self.admission.scheduler.take_nudges();
        if waiting != 0 {
            self.outside.driver.nudge(waiting, self.outside.index);
        }
    }

    /// After recovery: an invocation that ran before its restart holds its object's lock
    /// again, even while it waits suspended.
    pub(super) fn reclaim_lock(&mut self, id: InvocationId) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if !live.started() || live.record().status == Status::Completed {
            return;
        }
        let key = queue_key(&self.outside.registry, live.record());
        live.lock = self
            .admission
            .scheduler
            .hold(&key, live.entry, self.outside.driver.now_ms());
        // It may spend until it ends: it holds its reservations of its budgets again.
        live.reserved = self.admission.scheduler.reserve(&key);
    }

    /// The deployment ended the attempt of `id`: its permit goes to the next waiter now, before
    /// the end is stored; its object's lock waits for [`Self::settle`].
    pub(super) fn hand_on_slots(&mut self, id: InvocationId) {
        self.release_permit(id);
        self.nudge_waiting_partitions();
    }

    /// The attempt of `id` ended: its permit goes back; a completed invocation gives up its lock.
    /// Nothing while an attempt runs (an operator's resume or cancel of a running invocation
    /// settles it too): its permit bounds what runs at once until that attempt ends.
    pub(super) fn settle(&mut self, id: InvocationId) {
        self.release_permit(id);
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.record().status == Status::Completed
            && let Some(lock) = live.lock.take()
        {
            let entry = live.entry;
            self.admission
                .scheduler
                .unlock(lock, entry, self.outside.driver.now_ms());
        }
        self.nudge_waiting_partitions();
    }

    /// Gives back the permit of `id`'s ended attempt, if it still holds one (a running attempt
    /// keeps its slots until it ends).
    fn release_permit(&mut self, id: InvocationId) {
        if let Some(permit) = self.live.get_mut(&id).and_then(|live| live.settle()) {
            self.admission
                .scheduler
                .release(permit, self.outside.driver.now_ms());
        }
    }
}

/// Why a queued invocation has not started, for operators.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// Its queue's state.
    pub status: QueueStatus,
    /// Entries in its queue, itself included.
    pub queued: usize,
    /// Flow-control scope of the queue.
    pub scope: Option<Scope>,
    /// Limit key of the queue.
    pub limit_key: Option<LimitKey>,
    /// What holds the queue, when it is blocked.
    pub blocked_on: Option<BlockedOn>,
    /// Its place in its queue (1: next), the queue's recent drain rate and the ETA that gives.
    pub position: Option<Position>,
}

impl Partition {
    /// What the queued invocation `id` waits for; `None` when it is not queued.
    pub(super) fn waiting(&self, id: InvocationId) -> Option<Waiting> {
        let (queue, entry) = match self.live.get(&id) {
            Some(live) => (live.run().queue()?, live.entry),
            None => {
                let dormant = self.resting.peek(&id)?;
                (dormant.queue()?, dormant.entry())
            }
        };
        let now = self.outside.driver.now_ms();
        let snapshot = self
            .admission
            .scheduler
            .queues()
            .into_iter()
            .find(|q| q.id == queue)?;
        Some(Waiting {
            status: snapshot.status,
            queued: snapshot.queued,
            scope: snapshot.key.scope,
            limit_key: snapshot.key.limit_key,
            blocked_on: snapshot.blocked_on,
            position: self.admission.scheduler.position(queue, entry, now),
        })
    }
}
