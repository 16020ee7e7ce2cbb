//! How the partition wakes invocations at rest when something touches them (the resting part
//! itself, what rests and what follows it, is `parts/resting.rs`).

use super::model::events::Event;
use super::task::Partition;
use sluice_core::ids::InvocationId;

impl Partition {
    /// Makes the invocation `event` names live again if it is at rest. A wait for its outcome
    /// or a peek does not: a client attaching to a thousand resting sends must not bring their
    /// inputs back into memory (they wait at rest, `Resting::wait`).
    pub(super) fn rouse_for(&mut self, event: &Event) {
        if matches!(event, Event::Await { .. } | Event::Peek { .. }) {
            return;
        }
        if let Some(id) = event.invocation() {
            self.rouse(id);
        }
    }

    /// Makes `id` live again if it is at rest; it goes back to rest after the next dispatch if
    /// it still only waits.
    pub(super) fn rouse(&mut self, id: InvocationId) {
        match self.resting.wake(id, &self.outside.store) {
            None => {}
            Some(Ok(live)) => {
                self.live.insert(id, Box::new(live));
            }
            // Closed: shutting down; the store keeps it for the next start.
            Some(Err(_)) if self.outside.store.is_closed() => {}
            Some(Err(e)) => {
                // Its input is in the store or nowhere: a store that cannot give it back
                // cannot be trusted with anything more. It stays at rest; the restart
                // recovers it from the store.
                tracing::error!(invocation = %id, error.code = ?e.code, error = %e, "cannot wake a held invocation");
                self.outside.store.health().fail(e);
            }
        }
    }

    /// Puts the invocations queued (or delayed) since the last call to rest if they still wait.
    pub(super) fn rest_waiting(&mut self) {
        self.resting
            .put_waiting(&mut self.live, &self.outside.store);
    }
}
