//! Wake: a time came. A sleep's timer completes its Sleep command; a delayed send or a
//! back-off is attempted; a completed invocation's retention expiry purges it (and a workflow
//! run's state and promises).

use super::super::journal::notify;
use super::super::live::Live;
use super::super::model::effect::Effect;
use super::super::task::Partition;
use sluice_core::clock::rfc3339;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scheduler::DeadlineCause;
use sluice_protocol::Message;
use sluice_protocol::proto::{self, notification_template};
use sluice_store::invocation::store::{self, Timer};
use sluice_store::invocation::{InvocationRecord, Status};
use sluice_store::storage::writer::WriteSet;

/// The completion id of a timer that ends a completed invocation's retention (Sleep
/// completions never use it: SDKs count completion ids up from 1).
pub(in super::super) const EXPIRY: u32 = u32::MAX;

/// The completion id of a wake-up that fails an invocation the scheduler dropped past its
/// deadline (never stored as a timer).
pub(in super::super) const QUEUE_DEADLINE: u32 = u32::MAX - 1;

impl Partition {
    pub(in super::super) fn wake(
        &mut self,
        id: InvocationId,
        completion: Option<Timer>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        if let Some(timer) = completion
            && timer.completion == EXPIRY
        {
            return self.expire(timer, writes);
        }
        if let Some(timer) = completion
            && timer.completion == QUEUE_DEADLINE
        {
            return self.miss_deadline(id, timer.at_ms, writes, effects);
        }
        if let Some(timer) = completion
            && timer.completion == super::super::crowds::CROWDED
        {
            return self.end_crowded(id, writes, effects);
        }
        let now = self.outside.driver.now_ms();
        if let Some(live) = self.live.get_mut(&id) {
            // A debounced run pushed back since this wake-up was armed waits for its new one.
            if completion.is_none()
                && live.record().status == Status::Scheduled
                && live.record().run_at_ms.is_some_and(|at| at > now)
            {
                return Ok(());
            }
            timer_fired(live, completion, writes, effects);
        }
        Ok(())
    }

    /// A retained result's time is up: the invocation is purged and its idempotency key free.
    fn expire(&mut self, timer: Timer, writes: &mut WriteSet) -> Result<(), CodedError> {
        store::delete_timer(writes, timer);
        let id = timer.invocation;
        // Completed invocations leave memory; one still there waits for its eviction.
        let record = match self.live.get(&id) {
            Some(live) => live.record().clone(),
            None => match self.stored(id)? {
                Some(record) => record,
                None => return Ok(()),
            },
        };
        if record.status != Status::Completed {
            return Ok(());
        }
        let workflow_run = self.is_workflow_run(&record);
        let target = record.target;
        store::delete_invocation(writes, id);
        if let Some(live) = self.live.remove(&id) {
            self.entries.remove(live.entry);
        }
        // A workflow run takes its key's state and promises with it.
        if workflow_run {
            self.forget_promises(&target, writes);
        }
        Ok(())
    }

    /// The scheduler dropped `id` past its deadline: unless it started or queued again
    /// meanwhile, it completes with 504 FLO0003, never started; its caller gets that.
    fn miss_deadline(
        &mut self,
        id: InvocationId,
        now: u64,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let Some(deadline) = self.admission.missed_deadlines.remove(&id) else {
            return Ok(());
        };
        let retention = match self.live.get(&id) {
            Some(live) => self.retention(&live.record().target),
            None => return Ok(()),
        };
        let live = self.live.get_mut(&id).expect("checked live");
        let waiting = matches!(live.record().status, Status::Pending | Status::Scheduled);
        if !waiting || live.started() || live.run().queue().is_some() {
            return Ok(());
        }
        let why = match &deadline.cause {
            DeadlineCause::Request => "its request's deadline".to_owned(),
            DeadlineCause::Rule { level, rule } => format!(
                "the max_wait of rule '{}' at its {} counter",
                rule.as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
                level.as_str()
            ),
        };
        let late = now.saturating_sub(deadline.at);
        let error = CodedError::new(
            Code::FLO0003,
            format!(
                "the invocation waited in its queue past {why} ({}, {late} ms ago) and was dropped without starting",
                rfc3339(deadline.at).unwrap_or_default()
            ),
        );
        super::super::ending::fail_unstarted(live, 504, &error, retention, now, writes, effects)
    }

    fn is_workflow_run(&self, record: &InvocationRecord) -> bool {
        let target = &record.target;
        self.outside
            .registry
            .handler_kind(record.deployment, &target.service, &target.handler)
            == Some((
                crate::discovery::ServiceType::Workflow,
                Some(crate::discovery::HandlerType::Workflow),
            ))
    }
}

/// `live`'s time came: a sleep's timer completes its Sleep command; a waiting invocation is
/// attempted (a delayed send, a back-off, a sleeper).
pub(in super::super) fn timer_fired(
    live: &mut Live,
    completion: Option<Timer>,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    if live.record().status == Status::Completed {
        return;
    }
    if let Some(timer) = completion {
        store::delete_timer(writes, timer);
        let done = Message::SleepCompletion(proto::NotificationTemplate {
            id: Some(notification_template::Id::CompletionId(timer.completion)),
            result: Some(notification_template::Result::Void(proto::Void {})),
        });
        notify(
            live,
            writes,
            done.to_frame(false),
            timer.completion,
            effects,
        );
    }
    if !live.running() && live.record().status != Status::Paused {
        effects.push(Effect::Attempt(live.record().id));
    }
}
