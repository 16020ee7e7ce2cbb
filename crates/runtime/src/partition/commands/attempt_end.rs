//! Attempt end: how the current attempt ended decides the invocation's next state: completed
//! with its outcome (an end, or a terminal failure), suspended (attempted again at once if a
//! completion or signal it waits on came while it ran), backing off for a retry, or paused
//! past its retries. When the deployment ended the attempt its slots go back at once; otherwise,
//! and the object's lock always, once this is stored (`Effect::Settle`).

use std::time::Duration;

use super::super::ending::{Retention, back_off, complete, last_output, pause};
use super::super::live::Live;
use super::super::model::effect::Effect;
use super::super::model::phase::Awaited;
use super::super::task::Partition;
use crate::invoker::attempt::failure_code;
use crate::invoker::{AttemptError, Ending};
use sluice_core::errors::CodedError;
use sluice_core::ids::InvocationId;
use sluice_core::metrics as names;
use sluice_protocol::proto;
use sluice_store::invocation::store;
use sluice_store::invocation::{Failure, LastFailure, Outcome, Status};
use sluice_store::storage::writer::WriteSet;

impl Partition {
    /// Records how attempt `attempt` of `id` ended; false when it was not the current one.
    pub(in super::super) fn attempt_done(
        &mut self,
        id: InvocationId,
        attempt: u32,
        result: Result<Ending, AttemptError>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, CodedError> {
        let now = self.outside.driver.now_ms();
        let Some(retention) = self
            .live
            .get(&id)
            .map(|l| self.retention(&l.record().target))
        else {
            return Ok(false);
        };
        let Some(closed) = self.close_attempt(id, attempt, result, writes, now) else {
            return Ok(false);
        };
        let handed_on = closed.handed_on;
        // Read only when the attempt failed: the service's and handler's declared policy over
        // the configured one.
        let (registry, defaults) = (
            &self.outside.registry,
            &self.outside.config.worker.invoker.retry_policy,
        );
        let retry = |target: &sluice_store::invocation::Target| {
            registry.retry_policy(&target.service, &target.handler, defaults)
        };
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(false);
        };
        next_state(live, closed, &retry, retention, now, writes, effects);
        // Waiting without an attempt, for however long: its journal rests in the store once
        // this is stored (`suspended.rs`).
        if matches!(
            live.record().status,
            Status::Suspended | Status::BackingOff | Status::Paused
        ) {
            self.journals_to_rest.push(id);
        }
        let stored = store::put_record(writes, live.record());
        // The deployment said the attempt is over (End, Suspension, Error): its handler no
        // longer runs, so its slots go to the next waiter now — `apply_batch`'s dispatch starts
        // it before this end is committed. A crash before that commit cannot let more than the
        // limit run: recovery re-admits every unfinished invocation, this one included, through
        // the scheduler. The object's lock stays until the commit (`Effect::Settle`): the next
        // holder must read this attempt's state. An attempt Sluice gave up on (a broken stream,
        // a timeout, a protocol violation) keeps its slots until the commit, as a handler may
        // still run in the deployment.
        if handed_on {
            self.hand_on_slots(id);
        }
        stored?;
        Ok(true)
    }

    /// Ends attempt `attempt` of `id` if it is the current one and runs: its journal saved,
    /// its duration and span recorded, what the deployment showed reported to its queue's
    /// pacing; how it ended (a protocol violation made its result), or `None`.
    fn close_attempt(
        &mut self,
        id: InvocationId,
        attempt: u32,
        result: Result<Ending, AttemptError>,
        writes: &mut WriteSet,
        now: u64,
    ) -> Option<Closed> {
        let live = self.live.get_mut(&id)?;
        if live.attempt != attempt {
            return None;
        }
        let ended = live.end()?;
        // An invocation never stored is stored now, whatever the attempt's end (its record
        // below): at the latest with its outcome, which its caller is told only after this
        // commit. Before the ending: a completion leaves no journal in memory.
        super::super::journal::save_journal(live, writes);
        live.count_attempt();
        crate::partition::service_metrics::of(&live.record().target.service)
            .attempt_duration
            .record(ended.started.elapsed());
        let fresh = ended.fresh;
        // The deployment itself ended the attempt (End, Suspension, Error).
        let handed_on = ended.violation.is_none() && result.is_ok();
        let result = match ended.violation {
            // A value no record can hold would be sent again on every retry: terminal.
            Some(violation) if violation.code == Some(sluice_core::errors::Code::CLU0005) => {
                Ok(Ending::Failed(proto::ErrorMessage {
                    code: 500,
                    message: format!("[CLU0005] {}", violation.message),
                    behavior: proto::ErrorBehavior::Fail as i32,
                    ..Default::default()
                }))
            }
            Some(violation) => Err(AttemptError::from(violation)),
            None => result,
        };
        if let Some((span, started)) = ended.span
            && let Some(trace) = crate::spans::trace_of(live.record())
        {
            let (ended, error) = match &result {
                Ok(Ending::End) => ("completed", None),
                Ok(Ending::Suspended(_)) => ("suspended", None),
                Ok(Ending::Failed(e)) => ("failed", Some(format!("[{}] {}", e.code, e.message))),
                Err(e) => ("failed", Some(e.error.to_string())),
            };
            crate::spans::child_of_invocation(
                live.record(),
                trace,
                &format!("attempt {}", live.record().attempts),
                span,
                (started, std::time::SystemTime::now()),
                vec![
                    opentelemetry::KeyValue::new(
                        "restate.invocation.attempt",
                        i64::from(live.record().attempts),
                    ),
                    opentelemetry::KeyValue::new("sluice.attempt.outcome", ended),
                ],
                error,
            );
        }
        // What the deployment showed paces its next attempts (only a hint, not state: it is
        // not stored, and a restart starts unpaced). An attempt whose request the deployment
        // answered told the drain so then (`AttemptAnswered`); its end says nothing more about
        // the deployment.
        if !ended.answered
            && let Some(permit) = live.run().permit()
        {
            let signal = match &result {
                Ok(_) => sluice_flow::pacing::Signal::Answered,
                Err(e) => e.signal(),
            };
            self.admission.scheduler.report(permit, signal, now);
        }
        Some(Closed {
            result,
            handed_on,
            fresh,
            signalled: ended.signalled,
        })
    }
}

/// How an attempt ended, as [`Partition::close_attempt`] found it.
struct Closed {
    result: Result<Ending, AttemptError>,
    /// The deployment itself ended the attempt (End, Suspension, Error).
    handed_on: bool,
    /// Completions that came while it ran.
    fresh: Vec<u32>,
    /// A signal came while it ran.
    signalled: bool,
}

/// What the end of `live`'s attempt makes of it: completed with its outcome, suspended
/// (attempted again at once when what it awaits came while it ran), paused, or backing off
/// for a retry under `retry`'s policy (completed once the retries are spent).
fn next_state(
    live: &mut Live,
    closed: Closed,
    retry: &dyn Fn(&sluice_store::invocation::Target) -> sluice_config::RetryPolicy,
    retention: Retention,
    now: u64,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    let Closed {
        result,
        fresh,
        signalled,
        ..
    } = closed;
    match result {
        Ok(Ending::End) => {
            let outcome = last_output(&live.journal).unwrap_or(Outcome::Value(Vec::new()));
            complete(live, outcome, retention, now, writes, effects);
        }
        Ok(Ending::Suspended(message)) => {
            live.set_retry_count(0);
            live.set_status(Status::Suspended);
            let awaited = Awaited::of(&message);
            if signalled
                || fresh
                    .iter()
                    .any(|c| awaited.completions.is_empty() || awaited.completions.contains(c))
            {
                effects.push(Effect::Attempt(live.record().id));
            }
            live.await_on(awaited);
        }
        Ok(Ending::Failed(error)) => {
            let failure = LastFailure::new(Some(failure_code(&error)), error.message.clone());
            if error.behavior != proto::ErrorBehavior::Fail as i32 {
                retried(&failure);
            }
            match proto::ErrorBehavior::try_from(error.behavior) {
                Ok(proto::ErrorBehavior::Pause) => pause(live, failure),
                Ok(proto::ErrorBehavior::Fail) => {
                    let code = u16::try_from(error.code).unwrap_or(500);
                    live.set_last_failure(Some(failure));
                    let outcome = Outcome::Failure(Failure {
                        code,
                        message: error.message,
                    });
                    complete(live, outcome, retention, now, writes, effects);
                }
                _ => {
                    let delay = error.next_retry_delay.map(Duration::from_millis);
                    if let Some(outcome) = back_off(
                        live,
                        &retry(&live.record().target),
                        failure,
                        delay,
                        now,
                        effects,
                    ) {
                        complete(live, outcome, retention, now, writes, effects);
                    }
                }
            }
        }
        Err(e) => {
            let failure = LastFailure::new(e.error.code, e.error.message.clone());
            retried(&failure);
            if let Some(outcome) = back_off(
                live,
                &retry(&live.record().target),
                failure,
                e.retry_after,
                now,
                effects,
            ) {
                complete(live, outcome, retention, now, writes, effects);
            }
        }
    }
}

/// Counts a failed attempt that is retried or paused, by its code.
fn retried(failure: &LastFailure) {
    let code = failure.code.clone().unwrap_or_default();
    metrics::counter!(names::ATTEMPT_RETRIES, "code" => code).increment(1);
}
