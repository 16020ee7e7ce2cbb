//! Queue pause: an operator pauses (or resumes) one scheduler queue. The pause is stored per
//! partition; the scheduler follows once it is (`Effect::PauseQueue`); an unknown queue is
//! answered false (after the commit of what came before, like every answer).

use tokio::sync::oneshot;

use super::super::model::answer::Answer;
use super::super::model::effect::Effect;
use sluice_flow::scheduler::Scheduler;
use sluice_store::storage::writer::WriteSet;

/// Pauses (or resumes) queue `queue` of partition `index`, which `scheduler` names.
pub(super) fn pause_queue(
    scheduler: &Scheduler,
    index: u32,
    queue: u32,
    pause: bool,
    reply: oneshot::Sender<bool>,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    let Some(key) = scheduler.queue_key(queue) else {
        effects.push(Effect::Answer(Answer::QueuePaused(reply, false)));
        return;
    };
    if pause {
        sluice_store::invocation::paused::pause(writes, index, &key);
    } else {
        sluice_store::invocation::paused::resume(writes, index, &key);
    }
    effects.push(Effect::PauseQueue(Box::new(key), pause));
    effects.push(Effect::Answer(Answer::QueuePaused(reply, true)));
}
