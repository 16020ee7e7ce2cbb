//! Peek: where an invocation is, without waiting: its target and outcome, answered after the
//! commit of what came before (the outcome may belong to a batch still committing). An
//! invocation at rest stays at rest.

use tokio::sync::oneshot;

use super::super::answer::Answer;
use super::super::effect::Effect;
use super::super::task::Partition;
use crate::errors::CodedError;
use crate::ids::InvocationId;
use crate::invocation::{Outcome, Target};

impl Partition {
    pub(in super::super) fn peek(
        &mut self,
        id: InvocationId,
        reply: oneshot::Sender<Option<(Target, Option<Outcome>)>>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let seen = match (self.live.get(&id), self.dormant.get(&id)) {
            (Some(live), _) => Some((live.record.target.clone(), live.record.outcome.clone())),
            // At rest: never ran, no outcome; it stays at rest.
            (None, Some(resting)) => Some((resting.target(), None)),
            (None, None) => self.stored(id)?.map(|r| (r.target, r.outcome)),
        };
        effects.push(Effect::Answer(Answer::Peeked(reply, seen)));
        Ok(())
    }
}
