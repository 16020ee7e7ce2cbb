//! How an invocation ends: its outcome, the retention of what it leaves behind, pauses, and
//! the back-off between failed attempts.

use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;

use super::commands::EXPIRY;
use super::live::Live;
use super::model::effect::Effect;
use super::task::Partition;
use sluice_core::errors::CodedError;
use sluice_protocol::proto::{self, output_command_message};
use sluice_protocol::{Frame, MessageType};
use sluice_store::invocation::store::{self, Purge, Timer};
use sluice_store::invocation::{Failure, LastFailure, Outcome, Status, Target};
use sluice_store::storage::writer::WriteSet;

/// How long what a completed invocation leaves behind stays in the store, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retention {
    /// The record and outcome (`worker.completion-retention`), unless an idempotency key or a
    /// workflow keeps them (the record's own `retention_ms`).
    pub completion_ms: u64,
    /// The journal (`journal_retention`, at most `worker.max-journal-retention`).
    pub journal_ms: u64,
}

impl Partition {
    /// The retention of a completed invocation of `target`.
    pub(super) fn retention(&self, target: &Target) -> Retention {
        let worker = &self.outside.config.worker;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Retention {
            completion_ms: ms(worker.completion_retention.0),
            journal_ms: ms(self.outside.registry.journal_retention(
                &target.service,
                &target.handler,
                worker.max_journal_retention.0,
            )),
        }
    }
}

/// Fails `live`, which never started, with HTTP-like `code` and `error`: completed, its record
/// in `writes`, its slots and lock given back once that is stored. A deadline missed in its
/// queue (FLO0003) and an operator's bulk cancel (FLO0006) end an invocation this way.
pub(super) fn fail_unstarted(
    live: &mut Live,
    code: u16,
    error: &CodedError,
    retention: Retention,
    now: u64,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) -> Result<(), CodedError> {
    live.set_last_failure(None);
    complete(
        live,
        Outcome::Failure(Failure {
            code,
            message: error.to_string(),
        }),
        retention,
        now,
        writes,
        effects,
    );
    store::put_record(writes, live.record())?;
    effects.push(Effect::Settle(live.record().id));
    Ok(())
}

pub(super) fn complete(
    live: &mut Live,
    outcome: Outcome,
    retention: Retention,
    now: u64,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    live.set_status(Status::Completed);
    let took = now.saturating_sub(live.record().created_at_ms);
    let handles = super::service_metrics::of(&live.record().target.service);
    handles.invocation_duration.record(took as f64 / 1000.0);
    let (result, completed) = match outcome {
        Outcome::Value(_) => ("success", &handles.succeeded),
        Outcome::Failure(_) => ("failure", &handles.failed),
    };
    completed.increment(1);
    if let Some(trace) = crate::spans::trace_of(live.record()) {
        let mut attributes = crate::spans::attributes(live.record());
        attributes.push(opentelemetry::KeyValue::new("sluice.outcome", result));
        attributes.push(opentelemetry::KeyValue::new(
            "restate.invocation.attempts",
            i64::from(live.record().attempts),
        ));
        let target = &live.record().target;
        crate::spans::emit(crate::spans::Finished {
            name: format!("invocation {}/{}", target.service, target.handler),
            kind: opentelemetry::trace::SpanKind::Internal,
            trace_id: trace.trace_id,
            span_id: crate::spans::invocation_span(live.record().id),
            parent: Some(trace.span_id),
            start: crate::spans::at_ms(live.record().created_at_ms),
            end: std::time::SystemTime::now(),
            attributes,
            error: match &outcome {
                Outcome::Failure(f) => Some(format!("{} {}", f.code, f.message)),
                Outcome::Value(_) => None,
            },
        });
    }
    // What it spent is read from its whole journal (in memory here: an attempt, or the kill
    // that looked for its children, read it back) and stored with its completion.
    let cost = spent(live);
    live.set_outcome(outcome.clone(), cost);
    // Retained results (idempotency, workflows) leave memory and store on their expiry timer;
    // every other completed invocation through a purge row the purger works off.
    let kept = match live.record().retention_ms {
        Some(retained) => {
            let timer = Timer {
                at_ms: now.saturating_add(retained),
                invocation: live.record().id,
                completion: EXPIRY,
            };
            store::put_timer(writes, timer);
            effects.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
            retained
        }
        None => {
            let at = now.saturating_add(retention.completion_ms);
            store::put_purge(writes, at, live.record().id, Purge::Invocation);
            retention.completion_ms
        }
    };
    if retention.journal_ms < kept {
        let at = now.saturating_add(retention.journal_ms);
        store::put_purge(writes, at, live.record().id, Purge::Journal);
    }
    for caller in live.record().caller.iter().chain(&live.callers) {
        effects.push(Effect::CallResult(*caller, outcome.clone()));
    }
    // The journal is in the store; nothing in memory reads it again.
    live.journal = Vec::new();
    live.rested = 0;
    // It leaves memory once the batch commits and its waiters have their answer, a retained
    // result (idempotency, workflows) too: a repeat, an attach or a peek reads it from the
    // store, and its expiry timer purges it there. A client cannot pin outputs in memory for
    // the retention by sending idempotency keys.
    effects.push(Effect::Evict(live.record().id));
    effects.push(Effect::Notify(std::mem::take(&mut live.waiters), outcome));
}

/// What `live` spent by its handler's reports (`model/cost.rs`); a report that is not an amount
/// is said in the log, with what to send instead.
fn spent(live: &Live) -> Option<u64> {
    let spent = super::model::cost::spent(&live.journal);
    if spent.refused > 0 {
        tracing::warn!(
            invocation = %live.record().id,
            refused = spent.refused,
            first = ?spent.first_refused,
            "`{}` steps' results that are not amounts were not charged: return a JSON integer from 0 to 2^64-1 (a failed step charges nothing either)",
            super::model::cost::COST_RUN
        );
    }
    if spent.passed_over > 0 {
        tracing::warn!(
            invocation = %live.record().id,
            passed_over = spent.passed_over,
            "the invocation reported more than {} `{}` steps; the rest were not counted: report the cost once, summed",
            super::model::cost::MAX_REPORTS,
            super::model::cost::COST_RUN
        );
    }
    spent.total
}

pub(super) fn pause(live: &mut Live, failure: LastFailure) {
    tracing::warn!(
        invocation = %live.record().id,
        error.code = failure.code.as_deref().unwrap_or("-"),
        error = %failure.message,
        "invocation paused; resume it once the cause is fixed"
    );
    live.set_last_failure(Some(failure));
    live.set_status(Status::Paused);
    live.set_run_at(None);
}

/// Schedules the next attempt of `live` after a failed one, or, once `policy.max_attempts`
/// failed in a row, pauses it, or (`on-max-attempts = kill`) answers the failure it is to
/// complete with.
#[must_use]
pub(super) fn back_off(
    live: &mut Live,
    policy: &sluice_config::RetryPolicy,
    failure: LastFailure,
    requested: Option<Duration>,
    now: u64,
    effects: &mut Vec<Effect>,
) -> Option<Outcome> {
    tracing::warn!(
        invocation = %live.record().id,
        error.code = failure.code.as_deref().unwrap_or("-"),
        error = %failure.message,
        attempt = live.record().attempts,
        "attempt failed"
    );
    live.set_retry_count(live.record().retry_count.saturating_add(1));
    let attempts = policy.max_attempts.get();
    let exhausted = live.record().retry_count >= attempts;
    let killed = (exhausted && policy.on_max_attempts == sluice_config::OnMaxAttempts::Kill)
        .then(|| {
            Outcome::Failure(Failure {
                code: 500,
                message: format!(
                    "{} (gave up after {attempts} failed attempts: the retry policy's on-max-attempts is kill)",
                    failure.message
                ),
            })
        });
    live.set_last_failure(Some(failure));
    if killed.is_some() {
        tracing::warn!(
            invocation = %live.record().id,
            attempts,
            "invocation failed: its retry policy gives up after this many attempts (on-max-attempts = kill)"
        );
        return killed;
    }
    if exhausted {
        live.set_status(Status::Paused);
        live.set_run_at(None);
        return None;
    }
    let delay = retry_delay(policy, live.record().retry_count, requested);
    let at = now.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
    live.set_status(Status::BackingOff);
    live.set_run_at(Some(at));
    effects.push(Effect::WakeAt(live.record().id, at, None));
    None
}

/// Longest wait before a retry, whatever a deployment asks for (`Retry-After`,
/// `next_retry_delay`): a retry scheduled further out looks like a lost invocation.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// The wait before retry number `retry` (1 for the first): `initial × factor^(retry-1)`, at most
/// `max_interval`; or the delay the deployment asked for, at most [`MAX_RETRY_DELAY`]. Never
/// panics: the exponential is computed in floating point and clamped before it becomes a
/// `Duration` (after enough retries it is infinite).
pub(crate) fn retry_delay(
    policy: &sluice_config::RetryPolicy,
    retry: u32,
    requested: Option<Duration>,
) -> Duration {
    if let Some(requested) = requested {
        return requested.min(MAX_RETRY_DELAY);
    }
    let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
    let max = policy.max_interval.0;
    let secs =
        policy.initial_interval.0.as_secs_f64() * policy.exponentiation_factor.powi(exponent);
    Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
}

/// The outcome in the last Output command of the journal.
pub(super) fn last_output(journal: &[Frame]) -> Option<Outcome> {
    let frame = journal
        .iter()
        .rev()
        .find(|f| f.ty == MessageType::Output.id())?;
    let output = proto::OutputCommandMessage::decode(Bytes::clone(&frame.payload)).ok()?;
    Some(match output.result? {
        output_command_message::Result::Value(v) => Outcome::Value(v.content.to_vec()),
        output_command_message::Result::Failure(f) => Outcome::Failure(Failure {
            code: u16::try_from(f.code).unwrap_or(500),
            message: f.message,
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{MAX_RETRY_DELAY, retry_delay};
    use sluice_config::{FriendlyDuration, RetryPolicy};

    #[test]
    fn retry_delays_grow_to_the_cap_and_never_panic() {
        let policy = RetryPolicy::default();
        assert_eq!(retry_delay(&policy, 1, None), Duration::from_millis(500));
        assert_eq!(retry_delay(&policy, 2, None), Duration::from_secs(1));
        // Retry 66 of the defaults used to panic converting 2^65 × 0.5 s.
        for retry in [66, 75, 1_100, u32::MAX] {
            assert_eq!(retry_delay(&policy, retry, None), policy.max_interval.0);
        }
        let fast = RetryPolicy {
            initial_interval: FriendlyDuration::from_millis(1),
            max_interval: FriendlyDuration::from_secs(u64::MAX),
            ..RetryPolicy::default()
        };
        assert_eq!(retry_delay(&fast, 75, None), fast.max_interval.0);
        let odd = RetryPolicy {
            exponentiation_factor: f64::NAN,
            ..RetryPolicy::default()
        };
        assert_eq!(retry_delay(&odd, 3, None), odd.max_interval.0);
        // A deployment's own delay (Retry-After: 18446744073709551615) is capped.
        let huge = Some(Duration::from_secs(u64::MAX));
        assert_eq!(retry_delay(&policy, 1, huge), MAX_RETRY_DELAY);
        let small = Some(Duration::from_secs(3));
        assert_eq!(retry_delay(&policy, 1, small), Duration::from_secs(3));
    }
}
