//! Queue pause: an operator pauses (or resumes) one scheduler queue. The pause is stored per
//! partition; the scheduler follows once it is (`Effect::PauseQueue`); an unknown queue is
//! answered false (after the commit of what came before, like every answer).

use tokio::sync::oneshot;

use super::super::model::answer::Answer;
use super::super::model::effect::Effect;
use super::super::task::Partition;
use crate::storage::writer::WriteSet;

impl Partition {
    pub(in super::super) fn pause_queue(
        &mut self,
        queue: u32,
        pause: bool,
        reply: oneshot::Sender<bool>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        let Some(key) = self.scheduler.queue_key(queue) else {
            effects.push(Effect::Answer(Answer::QueuePaused(reply, false)));
            return;
        };
        if pause {
            crate::invocation::paused::pause(writes, self.index, &key);
        } else {
            crate::invocation::paused::resume(writes, self.index, &key);
        }
        effects.push(Effect::PauseQueue(Box::new(key), pause));
        effects.push(Effect::Answer(Answer::QueuePaused(reply, true)));
    }
}
