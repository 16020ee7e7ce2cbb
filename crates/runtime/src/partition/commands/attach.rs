//! Attach: a client waits for an invocation's outcome. It is answered, after the commit of what
//! came before, with where the outcome will come (after the commit that stores it), refused past
//! `worker.max-waiters-per-invocation` (SEC0008), or dropped for an unknown id. An invocation
//! at rest stays at rest: its waiters are kept beside it.

use super::super::model::answer::{Answer, Attach};
use super::super::model::effect::Effect;
use super::super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;

impl Partition {
    pub(in super::super) fn attach(
        &mut self,
        id: InvocationId,
        reply: Attach,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let (waiter, outcome) = tokio::sync::oneshot::channel();
        let max = self.outside.config.worker.max_waiters_per_invocation;
        let waits = match self.live.get_mut(&id) {
            Some(live) => match &live.record().outcome {
                Some(done) => {
                    effects.push(Effect::Notify(vec![waiter], done.clone()));
                    Ok(())
                }
                None => live.wait(waiter, max),
            },
            // At rest: it has no outcome yet, and stays at rest.
            None if self.resting.contains(&id) => self.resting.wait(id, waiter, max),
            // Completed invocations leave memory; their outcome is in the store.
            None => match self.stored(id)?.and_then(|r| r.outcome) {
                Some(done) => {
                    effects.push(Effect::Notify(vec![waiter], done));
                    Ok(())
                }
                // Unknown: the wait is dropped.
                None => return Ok(()),
            },
        };
        effects.push(Effect::Answer(Answer::Attached(
            reply,
            waits.map(|()| outcome),
        )));
        Ok(())
    }
}
