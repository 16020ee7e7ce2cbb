//! How a partition moves an invocation along: submit, attempt, journal what the deployment
//! sent, resolve run proposals and sleeps, retry failures with back-off, complete.

use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;

use super::{Effect, Event, Live, Partition};
use crate::clock::now_ms;
use crate::errors::{Code, CodedError};
use crate::ids::InvocationId;
use crate::invocation::store::{self, Timer};
use crate::invocation::{Failure, LastFailure, Outcome, Status};
use crate::invoker::attempt::failure_code;
use crate::invoker::{Attempt, AttemptError, AttemptRequest, Ending};
use crate::protocol::message::Kind;
use crate::protocol::proto::{
    self, notification_template, output_command_message, propose_run_completion_message,
};
use crate::protocol::{Frame, Message, MessageType, ProtocolVersion};
use crate::registry::Address;
use crate::storage::writer::WriteSet;

impl Partition {
    pub(super) fn apply(
        &mut self,
        event: Event,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        match event {
            Event::Submit {
                record,
                input,
                reply,
            } => {
                let id = record.id;
                store::put_record(writes, &record)?;
                store::put_entry(writes, id, 0, &input);
                match record.run_at_ms {
                    Some(at) if record.status == Status::Scheduled => {
                        effects.push(Effect::WakeAt(id, at, None))
                    }
                    _ => effects.push(Effect::Attempt(id)),
                }
                self.live.insert(id, Live::new(record, vec![input]));
                effects.push(Effect::Ack(reply));
            }
            Event::Await { id, reply } => match self.live.get_mut(&id) {
                Some(live) => match &live.record.outcome {
                    Some(outcome) => effects.push(Effect::Notify(vec![reply], outcome.clone())),
                    None => live.waiters.push(reply),
                },
                None => drop(reply),
            },
            Event::AttemptDone { id, result } => self.attempt_done(id, result, writes, effects)?,
            Event::Wake { id, completion } => self.wake(id, completion, writes, effects),
        }
        Ok(())
    }

    fn wake(
        &mut self,
        id: InvocationId,
        completion: Option<Timer>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.record.status == Status::Completed {
            return;
        }
        if let Some(timer) = completion {
            store::delete_timer(writes, timer);
            let done = Message::SleepCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(timer.completion)),
                result: Some(notification_template::Result::Void(proto::Void {})),
            });
            append(live, writes, done.to_frame(false));
        }
        if live.running {
            live.completed_while_running = true;
        } else {
            effects.push(Effect::Attempt(id));
        }
    }

    fn attempt_done(
        &mut self,
        id: InvocationId,
        result: Result<Attempt, AttemptError>,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let retry = self.config.worker.invoker.retry_policy.clone();
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(());
        };
        live.running = false;
        live.record.attempts += 1;
        let mut again = std::mem::take(&mut live.completed_while_running);
        match result {
            Ok(attempt) => {
                for (message, _) in attempt.messages {
                    again |= journal_message(live, writes, message, effects);
                }
                match attempt.ending {
                    Ending::End => {
                        let outcome =
                            last_output(&live.journal).unwrap_or(Outcome::Value(Vec::new()));
                        live.record.status = Status::Completed;
                        live.record.outcome = Some(outcome.clone());
                        live.record.run_at_ms = None;
                        effects.push(Effect::Notify(std::mem::take(&mut live.waiters), outcome));
                    }
                    Ending::Suspended(_) => {
                        live.record.retry_count = 0;
                        live.record.status = Status::Suspended;
                        if again {
                            effects.push(Effect::Attempt(id));
                        }
                    }
                    Ending::Failed(error) => {
                        let delay = error.next_retry_delay.map(Duration::from_millis);
                        let failure =
                            LastFailure::new(Some(failure_code(&error)), error.message.clone());
                        back_off(live, &retry, failure, delay, effects);
                    }
                }
            }
            Err(e) => {
                let failure = LastFailure::new(e.error.code, e.error.message.clone());
                back_off(live, &retry, failure, e.retry_after, effects);
            }
        }
        store::put_record(writes, &live.record)
    }

    /// Starts an attempt of `id` on its (pinned) deployment.
    pub(super) fn start_attempt(&mut self, id: InvocationId) {
        let enable_v7 = self.config.experimental_enable_protocol_v7;
        let invoker = self.config.worker.invoker.clone();
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        if live.running || live.record.status == Status::Completed {
            return;
        }
        let target = live.record.target.clone();
        let deployment = match live.record.deployment {
            Some(pinned) => self.registry.deployment(pinned).ok(),
            None => self.registry.service(&target.service).ok().map(|(_, d)| d),
        };
        let request = deployment.and_then(|d| {
            let version = match live.record.protocol {
                Some(pinned) => ProtocolVersion::from_number(pinned)?,
                None => ProtocolVersion::pick(
                    d.min_protocol_version,
                    d.max_protocol_version,
                    enable_v7,
                )?,
            };
            let Address::Http {
                uri, use_http_11, ..
            } = &d.address
            else {
                return None;
            };
            live.record.deployment = Some(d.id);
            live.record.protocol = Some(version.number());
            Some(AttemptRequest {
                uri: uri.parse().ok()?,
                use_http_11: *use_http_11,
                additional_headers: d.additional_headers.clone(),
                service: target.service.clone(),
                handler: target.handler.clone(),
                key: target.key.clone(),
                invocation_id: id,
                protocol: version,
                journal: live.journal.clone(),
                state: Vec::new(),
                partial_state: true,
                random_seed: live.record.random_seed,
                retry_count: live.record.retry_count,
                abort_timeout: invoker.abort_timeout.0,
                message_size_limit: usize::try_from(invoker.message_size_limit.0)
                    .unwrap_or(usize::MAX),
            })
        });
        let tx = self.tx.clone();
        live.running = true;
        live.record.status = Status::Running;
        let client = self.client.clone();
        tokio::spawn(async move {
            let result = match request {
                Some(request) => client.run(&request).await,
                None => Err(AttemptError::from(CodedError::new(
                    Code::RT0011,
                    format!(
                        "no usable deployment for service '{}' (none registered, removed, or out of protocol range)",
                        target.service
                    ),
                ))),
            };
            let _ = tx.send(Event::AttemptDone { id, result }).await;
        });
    }
}

fn append(live: &mut Live, writes: &mut WriteSet, frame: Frame) {
    let index = u32::try_from(live.journal.len()).expect("journals are shorter than 2^32");
    store::put_entry(writes, live.record.id, index, &frame);
    live.journal.push(frame);
}

/// Journals one message of an attempt; true when it resolved something (a run proposal), so
/// the invocation should attempt again.
fn journal_message(
    live: &mut Live,
    writes: &mut WriteSet,
    message: Message,
    effects: &mut Vec<Effect>,
) -> bool {
    let kind = MessageType::from_id(message.type_id()).map(MessageType::kind);
    match &message {
        Message::ProposeRunCompletion(proposal) => {
            let result = match &proposal.result {
                Some(propose_run_completion_message::Result::Value(v)) => {
                    notification_template::Result::Value(proto::Value { content: v.clone() })
                }
                Some(propose_run_completion_message::Result::Failure(f)) => {
                    notification_template::Result::Failure(f.clone())
                }
                None => notification_template::Result::Void(proto::Void {}),
            };
            let done = Message::RunCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(
                    proposal.result_completion_id,
                )),
                result: Some(result),
            });
            append(live, writes, done.to_frame(false));
            return true;
        }
        Message::Sleep(sleep) => {
            let timer = Timer {
                at_ms: sleep.wake_up_time,
                invocation: live.record.id,
                completion: sleep.result_completion_id,
            };
            store::put_timer(writes, timer);
            effects.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
        }
        _ => {}
    }
    if kind == Some(Kind::Command) || matches!(message, Message::Custom { .. }) {
        append(live, writes, message.to_frame(false));
    }
    false
}

fn back_off(
    live: &mut Live,
    policy: &crate::config::RetryPolicy,
    failure: LastFailure,
    requested: Option<Duration>,
    effects: &mut Vec<Effect>,
) {
    tracing::warn!(
        invocation = %live.record.id,
        error.code = failure.code.as_deref().unwrap_or("-"),
        error = %failure.message,
        attempt = live.record.attempts,
        "attempt failed"
    );
    live.record.retry_count += 1;
    live.record.last_failure = Some(failure);
    if live.record.retry_count >= policy.max_attempts.get() {
        live.record.status = Status::Paused;
        live.record.run_at_ms = None;
        return;
    }
    let exponent = i32::try_from(live.record.retry_count - 1).unwrap_or(i32::MAX);
    let computed = policy
        .initial_interval
        .0
        .mul_f64(policy.exponentiation_factor.powi(exponent))
        .min(policy.max_interval.0);
    let delay = requested.unwrap_or(computed);
    let at = now_ms() + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    live.record.status = Status::BackingOff;
    live.record.run_at_ms = Some(at);
    effects.push(Effect::WakeAt(live.record.id, at, None));
}

/// The outcome in the last Output command of the journal.
fn last_output(journal: &[Frame]) -> Option<Outcome> {
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
