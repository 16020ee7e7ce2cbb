//! How the partition puts held invocations to rest and wakes them (the part itself, what a
//! resting invocation keeps, is `parts/dormant.rs`).

use super::model::events::Event;
use super::parts::dormant::Dormant;
use super::task::Partition;
use crate::errors::{Code, CodedError};
use crate::flow::Scope;
use crate::ids::InvocationId;
use crate::invocation::InvocationRecord;

impl Partition {
    /// Makes the invocation `event` names live again if it is at rest. A wait for its outcome
    /// or a peek does not: a client attaching to a thousand resting sends must not bring their
    /// inputs back into memory (they wait in [`Partition::wait_at_rest`]).
    pub(super) fn rouse_for(&mut self, event: &Event) {
        if matches!(event, Event::Await { .. } | Event::Peek { .. }) {
            return;
        }
        if let Some(id) = event.invocation() {
            self.rouse(id);
        }
    }

    /// Waits for the outcome of `id`, at rest, without waking it: the wait joins the
    /// invocation when it wakes. Waits whose requester left are pruned first; past `max` the
    /// wait is refused (SEC0008).
    pub(super) fn wait_at_rest(
        &mut self,
        id: InvocationId,
        waiter: tokio::sync::oneshot::Sender<crate::invocation::Outcome>,
        max: usize,
    ) -> Result<(), CodedError> {
        let waiters = self.waiting_at_rest.entry(id).or_default();
        if waiters.len() >= max || waiters.len() % 64 == 63 {
            waiters.retain(|w| !w.is_closed());
        }
        if waiters.len() >= max {
            return Err(CodedError::new(
                Code::SEC0008,
                format!(
                    "{} requests already wait for invocation {id}, the most worker.max-waiters-per-invocation allows",
                    waiters.len()
                ),
            )
            .retry_after(1));
        }
        waiters.push(waiter);
        Ok(())
    }

    /// Makes `id` live again if it is at rest; it goes back to rest after the next dispatch if
    /// it still only waits.
    pub(super) fn rouse(&mut self, id: InvocationId) {
        let Some(dormant) = self.dormant.get(&id) else {
            return;
        };
        match dormant.wake(id, &self.store, &self.held) {
            Ok(mut live) => {
                if let Some(dormant) = self.dormant.remove(&id) {
                    self.resting_bytes = self.resting_bytes.saturating_sub(dormant.footprint());
                }
                live.waiters
                    .extend(self.waiting_at_rest.remove(&id).unwrap_or_default());
                self.unhold(live.record.scope.clone());
                self.live.insert(id, Box::new(live));
                self.just_queued.push(id);
            }
            // Closed: shutting down; the store keeps it for the next start.
            Err(_) if self.store.is_closed() => {}
            Err(e) => {
                // Its input is in the store or nowhere: a store that cannot give it back
                // cannot be trusted with anything more. It stays at rest; the restart
                // recovers it from the store.
                tracing::error!(invocation = %id, error.code = ?e.code, error = %e, "cannot wake a held invocation");
                self.store.health().fail(e);
            }
        }
    }

    /// Puts the invocations queued (or delayed) since the last call to rest if they still wait.
    pub(super) fn rest_waiting(&mut self) {
        for id in self.just_queued.drain(..) {
            if !self.live.get(&id).is_some_and(|live| Dormant::fits(live)) {
                continue;
            }
            if let Some(live) = self.live.remove(&id) {
                let scope = live.record.scope.clone();
                let dormant = Dormant::of(*live, &self.store, &self.held);
                self.resting_bytes += dormant.footprint();
                self.dormant.insert(id, dormant);
                if let Some(scope) = scope {
                    *self.held_in_scope.entry(scope).or_default() += 1;
                }
            }
        }
    }

    fn unhold(&mut self, scope: Option<Scope>) {
        if let Some(scope) = scope
            && let Some(count) = self.held_in_scope.get_mut(&scope)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.held_in_scope.remove(&scope);
            }
        }
    }

    /// Why a new invocation must not be taken now (FLO0001): too many invocations held in all,
    /// or in its scope (a scope's invocations all live on its partition).
    pub(super) fn over_held_limits(&self, record: &InvocationRecord) -> Option<CodedError> {
        let worker = &self.config.worker;
        let total = self.held.count();
        if total >= worker.max_held_invocations {
            return Some(CodedError::new(
                Code::FLO0001,
                format!(
                    "{total} invocations are held, the most worker.max-held-invocations allows; retry later"
                ),
            ));
        }
        // Near the bound, the lowest priorities are shed first, so higher ones still get in.
        let priority = record.priority.unwrap_or_default().get();
        let bound = self
            .config
            .flow
            .shed_bound(worker.max_held_invocations, priority);
        if total >= bound {
            return Some(CodedError::new(
                Code::FLO0001,
                format!(
                    "{total} invocations are held: new work of priority {priority} is shed from {bound} held (flow.shed-from of worker.max-held-invocations {}); retry later or send with a higher priority",
                    worker.max_held_invocations
                ),
            ));
        }
        let scope = record.scope.as_ref()?;
        let in_scope = self.held_in_scope.get(scope).copied().unwrap_or(0);
        (in_scope >= worker.max_held_per_scope).then(|| {
            CodedError::new(
                Code::FLO0001,
                format!(
                    "{in_scope} invocations are held in scope '{scope}', the most worker.max-held-per-scope allows; retry later"
                ),
            )
        })
    }
}
