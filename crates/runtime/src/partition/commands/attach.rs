//! Attach: a client waits for an invocation's outcome. It is answered at once with where the
//! outcome will come (after the commit that stores it), refused past
//! `worker.max-waiters-per-invocation` (SEC0008), or dropped for an unknown id. An invocation
//! at rest stays at rest: its waiters are kept beside it.

use tokio::sync::oneshot;

use super::super::model::effect::Effect;
use super::super::task::Partition;
use crate::errors::CodedError;
use crate::ids::InvocationId;
use crate::invocation::Outcome;

impl Partition {
    pub(in super::super) fn attach(
        &mut self,
        id: InvocationId,
        reply: oneshot::Sender<Result<oneshot::Receiver<Outcome>, CodedError>>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let (waiter, outcome) = tokio::sync::oneshot::channel();
        match self.live.get_mut(&id) {
            Some(live) => match &live.record.outcome {
                Some(done) => {
                    effects.push(Effect::Notify(vec![waiter], done.clone()));
                    let _ = reply.send(Ok(outcome));
                }
                None => {
                    let max = self.config.worker.max_waiters_per_invocation;
                    let _ = reply.send(live.wait(waiter, max).map(|()| outcome));
                }
            },
            // At rest: it has no outcome yet, and stays at rest.
            None if self.dormant.contains_key(&id) => {
                let max = self.config.worker.max_waiters_per_invocation;
                let _ = reply.send(self.wait_at_rest(id, waiter, max).map(|()| outcome));
            }
            // Completed invocations leave memory; their outcome is in the store.
            None => {
                if let Some(done) = self.stored(id)?.and_then(|r| r.outcome) {
                    effects.push(Effect::Notify(vec![waiter], done));
                    let _ = reply.send(Ok(outcome));
                }
            }
        }
        Ok(())
    }
}
