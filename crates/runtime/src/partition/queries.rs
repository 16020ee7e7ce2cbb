//! Reads of a partition, apart from its commands: they come on a channel of their own that the
//! run loop looks at first, so an admin read waits at most for the batch being applied, never
//! behind a burst of queued work. A query changes nothing and answers at once.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::admission;
use super::model::events::HeldLock;
use super::model::events::PartitionMetrics;
use super::model::events::QueuedEntry;
use super::model::events::StateMemory;
use super::model::phase::{self, State};
use super::task::Partition;
use sluice_core::ids::InvocationId;

/// A read of one partition.
#[derive(Debug)]
pub enum Query {
    /// The partition's flow-control counters.
    Counters {
        /// Which: of one scope, the busiest few, or all.
        view: sluice_flow::ReadView,
        /// Those, and how many matched (one page).
        reply: oneshot::Sender<Vec<sluice_flow::limiter::CounterPage>>,
    },
    /// The partition's counters summed by rule and level.
    Sums {
        /// Those sums (one).
        reply: oneshot::Sender<Vec<sluice_flow::limiter::FlowSums>>,
    },
    /// What `GET /metrics` reads of the partition.
    Metrics {
        /// Its gauges and counters.
        reply: oneshot::Sender<Vec<PartitionMetrics>>,
    },
    /// Why a queued invocation waits.
    Explain {
        /// The invocation.
        id: InvocationId,
        /// Its queue and what blocks it; `None` when not queued.
        reply: oneshot::Sender<Option<admission::Waiting>>,
    },
    /// Every invocation waiting in a scheduler queue of the partition.
    Queued {
        /// Every one, live or at rest.
        reply: oneshot::Sender<Vec<QueuedEntry>>,
    },
    /// How many invocations wait in the partition's scheduler queues (the rows `Queued` has).
    QueuedCount {
        /// Live or at rest.
        reply: oneshot::Sender<Vec<usize>>,
    },
    /// Every held object lock of the partition: scope, service, key, holder.
    Locks {
        /// Every lock.
        reply: oneshot::Sender<Vec<HeldLock>>,
    },
    /// The invocations a bulk cancel's filter may name (`model/bulk.rs`).
    CancelCandidates {
        /// Which invocations.
        filter: std::sync::Arc<super::model::bulk::CancelFilter>,
        /// Their ids.
        reply: oneshot::Sender<super::model::bulk::Batch>,
    },
    /// Calls of a service waiting in the partition's queues, per scope.
    Waiting {
        /// The service.
        service: String,
        /// How many, per scope.
        reply: oneshot::Sender<Vec<HashMap<Option<sluice_flow::Scope>, usize>>>,
    },
    /// Every scheduler queue of the partition, for introspection.
    Queues {
        /// Which: of one scope, the busiest few, or all.
        view: sluice_flow::ReadView,
        /// Those, and how many matched (one page).
        reply: oneshot::Sender<Vec<sluice_flow::scheduler::QueuePage>>,
    },
}

impl Partition {
    /// Invocations in memory and their bytes, per state. A live invocation in a combination
    /// no state names (a bug the simulator looks for) counts as `running`, never lost.
    fn memory_by_state(&self) -> Vec<StateMemory> {
        let mut by = [(0usize, 0u64); State::ALL.len()];
        let slot = |state: State| State::ALL.iter().position(|s| *s == state).unwrap_or(0);
        for live in self.live.values() {
            let state = phase::state_of(live.record().status, live.run()).unwrap_or(State::Running);
            let (n, bytes) = &mut by[slot(state)];
            *n += 1;
            *bytes += live.footprint();
        }
        // Kept as they come and go (`Resting`): a walk of millions at rest would stall the loop.
        by[slot(State::Resting)] = (self.resting.len(), self.resting.bytes());
        State::ALL
            .iter()
            .zip(by)
            .filter(|(state, _)| **state != State::Gone)
            .map(|(state, (invocations, bytes))| StateMemory {
                state: state.name(),
                invocations,
                bytes,
            })
            .collect()
    }

    /// Answers `query` from what the partition holds now (a caller that left is no error).
    pub(super) fn answer_query(&mut self, query: Query) {
        // A read answers as of now: what a token or a timer made admissible by now is admitted
        // first, so no read shows a free token beside a waiter that would take it (on a busy
        // box the loop may reach the query before the scheduler's timer).
        if self
            .admission
            .scheduler
            .next_timer()
            .is_some_and(|at| at <= self.outside.driver.now_ms())
        {
            self.dispatch();
        }
        match query {
            Query::Queued { reply } => {
                let queued = self
                    .live
                    .iter()
                    .filter_map(|(id, live)| {
                        Some(QueuedEntry {
                            queue: live.run().queue()?,
                            invocation: *id,
                            attempts: live.record().attempts,
                            created_at_ms: live.record().created_at_ms,
                            run_at_ms: live.record().run_at_ms,
                            deployment: live.record().deployment,
                        })
                    })
                    .chain(self.resting.iter().filter_map(|(id, d)| d.listed(*id)))
                    .collect();
                drop(reply.send(queued));
            }
            Query::QueuedCount { reply } => {
                let live = self
                    .live
                    .values()
                    .filter(|live| live.run().queue().is_some())
                    .count();
                let resting = self.resting.iter().filter(|(_, d)| d.waits()).count();
                drop(reply.send(vec![live + resting]));
            }
            Query::Locks { reply } => {
                let held = self
                    .admission
                    .scheduler
                    .held_locks()
                    .into_iter()
                    .filter_map(|(lock, entry, acquired_at_ms)| {
                        Some(HeldLock {
                            acquired_at_ms,
                            scope: lock.scope.map(|s| s.as_str().to_owned()),
                            service: lock.service.into(),
                            key: lock.object_key.into(),
                            holder: self.entries.holder(entry)?,
                        })
                    })
                    .collect();
                drop(reply.send(held));
            }
            Query::Waiting { service, reply } => {
                let waiting = self.admission.scheduler.waiting_by_scope(&service);
                drop(reply.send(vec![waiting]));
            }
            Query::Queues { view, reply } => drop(reply.send(vec![self.queues_with_stages(&view)])),
            Query::CancelCandidates { filter, reply } => {
                drop(reply.send(self.cancel_candidates(&filter)));
            }
            Query::Counters { view, reply } => {
                let now = self.outside.driver.now_ms();
                drop(reply.send(vec![self.admission.scheduler.counter_view(now, &view)]));
            }
            Query::Sums { reply } => {
                let now = self.outside.driver.now_ms();
                drop(reply.send(vec![self.admission.scheduler.flow_sums(now)]));
            }
            Query::Metrics { reply } => drop(reply.send(vec![PartitionMetrics {
                admissions: self.admission.scheduler.admissions(),
                expired: self.admission.scheduler.expired_counts(),
                paused_queues: self.admission.scheduler.paused().count(),
                held_invocations: self.resting.held().count(),
                held_bytes: self.resting.held().bytes(),
                states: self.memory_by_state(),
            }])),
            Query::Explain { id, reply } => drop(reply.send(self.waiting(id))),
        }
    }
}

impl Partition {
    /// Every queue of the scheduler, with the partition's own count of its invocations past
    /// the queue (running, suspended, paused, completed and still in memory) by the queue
    /// each would wait in.
    fn queues_with_stages(
        &self,
        view: &sluice_flow::ReadView,
    ) -> sluice_flow::scheduler::QueuePage {
        use sluice_store::invocation::Status;
        let mut page = self.admission.scheduler.queue_page(view);
        let queues = &mut page.queues;
        let by_key: std::collections::HashMap<_, usize> = queues
            .iter()
            .enumerate()
            .map(|(i, q)| (q.key.clone(), i))
            .collect();
        for live in self.live.values() {
            // Waiting ones are the queue's own count: no key to make for them.
            if matches!(live.record().status, Status::Pending | Status::Scheduled) {
                continue;
            }
            let key = admission::queue_key(&self.outside.registry, live.record());
            let Some(&i) = by_key.get(&key) else {
                continue;
            };
            let stages = &mut queues[i].stages;
            match live.record().status {
                Status::Running => stages.running += 1,
                Status::Suspended | Status::BackingOff => stages.suspended += 1,
                Status::Paused => stages.paused += 1,
                Status::Completed => stages.finished += 1,
                Status::Pending | Status::Scheduled => {}
            }
        }
        page
    }
}
