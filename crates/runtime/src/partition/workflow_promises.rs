//! Durable promises of workflows: Get waits until the promise is completed, Peek answers at
//! once, Complete settles it once (a second completion fails with 409). Promises belong to one
//! (workflow, key), whose run and shared handlers all live on this partition, so waiters are
//! partition-local; a completed promise is written in the same batch as the waiters'
//! notifications, so after a restart a waiter without its notification still waits.

use bytes::Bytes;

use super::model::effect::Effect;
use super::model::effect::PromiseKey;
use super::task::Partition;
use crate::discovery::ServiceType;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_protocol::message::Kind;
use sluice_protocol::proto::{self, complete_promise_command_message, notification_template};
use sluice_protocol::{Frame, Message, MessageType, ProtocolVersion};
use sluice_store::invocation::state::{self, Object, Promise};
use sluice_store::invocation::{Status, Target};
use sluice_store::storage::writer::WriteSet;

fn key_of(target: &Target, name: &str) -> Option<PromiseKey> {
    Some((target.service.clone(), target.key.clone()?, name.to_owned()))
}

fn object(key: &PromiseKey) -> Object<'_> {
    Object {
        scope: "",
        service: &key.0,
        key: &key.1,
    }
}

fn result_of(promise: &Promise) -> notification_template::Result {
    match promise {
        Promise::Value(v) => {
            notification_template::Result::Value(proto::Value { content: v.clone() })
        }
        Promise::Failure(code, message) => notification_template::Result::Failure(proto::Failure {
            code: u32::from(*code),
            message: message.clone(),
            metadata: Vec::new(),
        }),
    }
}

fn notification(
    make: fn(proto::NotificationTemplate) -> Message,
    completion: u32,
    result: notification_template::Result,
) -> Frame {
    make(proto::NotificationTemplate {
        id: Some(notification_template::Id::CompletionId(completion)),
        result: Some(result),
    })
    .to_frame(false)
}

/// Whether `message` is a promise command.
pub fn is_promise_command(message: &Message) -> bool {
    matches!(
        message,
        Message::GetPromise(_) | Message::PeekPromise(_) | Message::CompletePromise(_)
    )
}

impl Partition {
    /// Promise commands are only for workflows (RT0017 otherwise).
    pub(super) fn check_promise_target(&self, target: &Target) -> Result<(), CodedError> {
        let workflow = self
            .outside
            .registry
            .service(&target.service)
            .is_ok_and(|(s, _)| s.ty == ServiceType::Workflow);
        if workflow && target.key.is_some() {
            Ok(())
        } else {
            Err(CodedError::new(
                Code::RT0017,
                format!(
                    "'{}' used a durable promise: only Workflow services support them",
                    target.service
                ),
            ))
        }
    }

    /// A completed promise is committed: later reads find it in the store.
    pub(super) fn uncache_promise(&mut self, key: &PromiseKey) {
        self.promises.uncache(key);
    }

    fn lookup(&mut self, key: &PromiseKey) -> Result<Option<Promise>, CodedError> {
        if let Some(found) = self.promises.completed(key) {
            return Ok(Some(found));
        }
        // Committed: read from the store each time rather than kept in memory.
        self.outside
            .store
            .with_db(|db| state::promise(db, object(key), &key.2))?
    }

    /// Answers a promise command of `id` that was just journaled.
    pub(super) fn promise_command(
        &mut self,
        id: InvocationId,
        message: &Message,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Result<(), CodedError> {
        let Some(target) = self.live.get(&id).map(|l| l.record().target.clone()) else {
            return Ok(());
        };
        let (name, completion) = match message {
            Message::GetPromise(m) => (&m.key, m.result_completion_id),
            Message::PeekPromise(m) => (&m.key, m.result_completion_id),
            Message::CompletePromise(m) => (&m.key, m.result_completion_id),
            _ => return Ok(()),
        };
        let Some(key) = key_of(&target, name) else {
            return Ok(());
        };
        let found = self.lookup(&key)?;
        let answer = match (message, found) {
            (Message::GetPromise(_), Some(promise)) => notification(
                Message::GetPromiseCompletion,
                completion,
                result_of(&promise),
            ),
            (Message::GetPromise(_), None) => {
                self.promises.wait(key, id, completion);
                return Ok(());
            }
            (Message::PeekPromise(_), found) => notification(
                Message::PeekPromiseCompletion,
                completion,
                found.as_ref().map_or(
                    notification_template::Result::Void(proto::Void {}),
                    result_of,
                ),
            ),
            (Message::CompletePromise(_), Some(_)) => notification(
                Message::CompletePromiseCompletion,
                completion,
                notification_template::Result::Failure(proto::Failure {
                    code: 409,
                    message: format!("promise '{}' is already completed", key.2),
                    metadata: Vec::new(),
                }),
            ),
            (Message::CompletePromise(m), None) => {
                let promise = match &m.completion {
                    Some(complete_promise_command_message::Completion::CompletionValue(v)) => {
                        Promise::Value(v.content.clone())
                    }
                    Some(complete_promise_command_message::Completion::CompletionFailure(f)) => {
                        Promise::Failure(u16::try_from(f.code).unwrap_or(500), f.message.clone())
                    }
                    None => Promise::Value(Bytes::new()),
                };
                state::set_promise(writes, object(&key), &key.2, &promise);
                self.resolve_waiters(&key, &promise, writes, effects);
                // Kept in memory only until it is committed (reads meanwhile must see it).
                effects.push(Effect::UncachePromise(Box::new(key.clone())));
                self.promises.complete(key, promise);
                notification(
                    Message::CompletePromiseCompletion,
                    completion,
                    notification_template::Result::Void(proto::Void {}),
                )
            }
            _ => return Ok(()),
        };
        if let Some(live) = self.live.get_mut(&id) {
            super::journal::notify(live, writes, answer, completion, effects);
        }
        Ok(())
    }

    fn resolve_waiters(
        &mut self,
        key: &PromiseKey,
        promise: &Promise,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) {
        for (waiter, completion) in self.promises.take_waiters(key) {
            let Some(live) = self.live.get_mut(&waiter) else {
                continue;
            };
            if live.record().status == Status::Completed {
                continue;
            }
            let frame = notification(
                Message::GetPromiseCompletion,
                completion,
                result_of(promise),
            );
            super::journal::notify(live, writes, frame, completion, effects);
            if !live.running() && live.record().status != Status::Paused {
                effects.push(Effect::Attempt(waiter));
            }
        }
    }

    /// After a restart: the invocation waits again on every promise it asked for and has no
    /// answer to in its journal.
    pub(super) fn rewait_promises(
        &mut self,
        id: InvocationId,
        target: &Target,
        journal: &[Frame],
        version: Option<i32>,
    ) {
        let version = version
            .and_then(ProtocolVersion::from_number)
            .unwrap_or(ProtocolVersion::V5);
        for frame in journal {
            if MessageType::from_id(frame.ty).map(MessageType::kind) != Some(Kind::Command) {
                continue;
            }
            if let Ok(Message::GetPromise(get)) = Message::decode(frame, version)
                && !super::journal::has_completion(journal, get.result_completion_id)
                && let Some(key) = key_of(target, &get.key)
            {
                self.promises.wait(key, id, get.result_completion_id);
            }
        }
    }

    /// A workflow's retention ended: its promises go with it.
    pub(super) fn forget_promises(&mut self, target: &Target, writes: &mut WriteSet) {
        let Some(key) = target.key.as_deref() else {
            return;
        };
        let object = Object {
            scope: "",
            service: &target.service,
            key,
        };
        state::clear_promises(writes, object);
        state::clear_all(writes, object);
        self.promises.forget(&target.service, key);
    }
}
