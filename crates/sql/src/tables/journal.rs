//! `sys_journal`: every journal entry, with the columns the reference's CLI reads to draw an
//! invocation's progress (`restate invocations describe`): an entry's name, whether a command
//! that waits for an answer has it (`completed`), the invocation a call started and its target,
//! when a sleep wakes, which promise a promise command names. The columns beyond the payload's
//! length come from decoding each entry as the protocol's message of its type; an entry that
//! does not decode keeps them null (the journal is the deployment's, read as hostile input).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    BooleanBuilder, StringBuilder, TimestampMillisecondBuilder, UInt32Builder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use prost::Message as _;

use super::{QuerySources, Reader, batch, read_store, reader, schema, timestamp};
use sluice_core::ids::InvocationId;
use sluice_protocol::MessageType;
use sluice_protocol::proto::{self, notification_template};
use sluice_store::invocation::store as invocations;

pub(super) fn journal_schema() -> SchemaRef {
    schema(vec![
        ("id", DataType::Utf8, false),
        ("index", DataType::UInt32, false),
        ("entry_type", DataType::Utf8, false),
        ("entry_type_id", DataType::UInt32, false),
        ("payload_length", DataType::UInt64, false),
        ("name", DataType::Utf8, true),
        ("completed", DataType::Boolean, true),
        ("invoked_id", DataType::Utf8, true),
        ("invoked_target", DataType::Utf8, true),
        ("sleep_wakeup_at", timestamp(), true),
        ("promise_name", DataType::Utf8, true),
    ])
}

/// One entry as the table shows it, before the notifications of its invocation are matched.
#[derive(Debug, Default, PartialEq, Eq)]
struct Entry {
    id: Option<InvocationId>,
    index: u32,
    ty: u16,
    length: usize,
    name: Option<String>,
    /// A command's result completion id: `completed` is whether its notification is there.
    awaits: Option<u32>,
    /// A call's invocation id notification index.
    invoked_by: Option<u32>,
    invoked_target: Option<String>,
    sleep_wakeup_at: Option<u64>,
    promise_name: Option<String>,
    /// A notification: its completion id, and the invocation id it carries (a call's).
    notifies: Option<(u32, Option<String>)>,
}

/// `Service/handler`, or `Service/key/handler` for a keyed one.
fn target(service: &str, key: &str, handler: &str) -> String {
    if key.is_empty() {
        format!("{service}/{handler}")
    } else {
        format!("{service}/{key}/{handler}")
    }
}

fn named(name: String) -> Option<String> {
    (!name.is_empty()).then_some(name)
}

/// What the table shows of one entry's payload.
fn entry(id: InvocationId, index: u32, ty: u16, payload: &[u8]) -> Entry {
    let mut entry = Entry {
        id: Some(id),
        index,
        ty,
        length: payload.len(),
        ..Entry::default()
    };
    let Some(kind) = MessageType::from_id(ty) else {
        return entry;
    };
    // Decoded from the lent bytes: nothing is copied, a large value included.
    match kind {
        MessageType::Call => {
            if let Ok(m) = proto::CallCommandMessage::decode(payload) {
                entry.invoked_target = Some(target(&m.service_name, &m.key, &m.handler_name));
                entry.invoked_by = Some(m.invocation_id_notification_idx);
                entry.awaits = Some(m.result_completion_id);
                entry.name = named(m.name);
            }
        }
        MessageType::OneWayCall => {
            if let Ok(m) = proto::OneWayCallCommandMessage::decode(payload) {
                entry.invoked_target = Some(target(&m.service_name, &m.key, &m.handler_name));
                entry.invoked_by = Some(m.invocation_id_notification_idx);
                entry.awaits = Some(m.invocation_id_notification_idx);
                entry.name = named(m.name);
            }
        }
        MessageType::Sleep => {
            if let Ok(m) = proto::SleepCommandMessage::decode(payload) {
                entry.sleep_wakeup_at = Some(m.wake_up_time);
                entry.awaits = Some(m.result_completion_id);
                entry.name = named(m.name);
            }
        }
        MessageType::Run => {
            if let Ok(m) = proto::RunCommandMessage::decode(payload) {
                entry.awaits = Some(m.result_completion_id);
                entry.name = named(m.name);
            }
        }
        MessageType::GetPromise | MessageType::PeekPromise => {
            if let Ok(m) = proto::GetPromiseCommandMessage::decode(payload) {
                entry.promise_name = Some(m.key);
                entry.awaits = Some(m.result_completion_id);
                entry.name = named(m.name);
            }
        }
        MessageType::CompletePromise => {
            if let Ok(m) = proto::CompletePromiseCommandMessage::decode(payload) {
                entry.promise_name = Some(m.key);
                entry.awaits = Some(m.result_completion_id);
                entry.name = named(m.name);
            }
        }
        _ if (0x8000..0xFC00).contains(&ty) => {
            if let Ok(n) = proto::NotificationTemplate::decode(payload)
                && let Some(notification_template::Id::CompletionId(completion)) = n.id
            {
                let invoked = match n.result {
                    Some(notification_template::Result::InvocationId(id)) => Some(id),
                    _ => None,
                };
                entry.notifies = Some((completion, invoked));
            }
        }
        _ => {}
    }
    entry
}

fn scan(db: &redb::Database) -> Result<Vec<Entry>, sluice_core::errors::CodedError> {
    invocations::scan_journal_with(db, entry)
}

pub(super) fn journal(sources: &Arc<QuerySources>) -> Reader {
    reader(sources, |sources| async move {
        let entries = read_store(&sources, scan).await?;
        // What each invocation's notifications answered: completion ids, and the invocation
        // ids calls were given.
        let mut done: HashSet<(InvocationId, u32)> = HashSet::new();
        let mut started: HashMap<(InvocationId, u32), String> = HashMap::new();
        for e in &entries {
            if let (Some(id), Some((completion, invoked))) = (e.id, &e.notifies) {
                done.insert((id, *completion));
                if let Some(invoked) = invoked {
                    started.insert((id, *completion), invoked.clone());
                }
            }
        }
        let (mut id, mut entry_type) = (StringBuilder::new(), StringBuilder::new());
        let (mut index, mut type_id) = (UInt32Builder::new(), UInt32Builder::new());
        let mut length = UInt64Builder::new();
        let (mut name, mut invoked_id, mut invoked_target, mut promise_name) = (
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
            StringBuilder::new(),
        );
        let mut completed = BooleanBuilder::new();
        let mut wakes = TimestampMillisecondBuilder::new().with_timezone("UTC");
        for e in entries {
            let Some(invocation) = e.id else { continue };
            id.append_value(invocation.to_string());
            index.append_value(e.index);
            entry_type.append_value(MessageType::from_id(e.ty).map_or("Unknown", |t| t.name()));
            type_id.append_value(u32::from(e.ty));
            length.append_value(e.length as u64);
            name.append_option(e.name);
            completed.append_option(e.awaits.map(|c| done.contains(&(invocation, c))));
            invoked_id.append_option(e.invoked_by.and_then(|c| started.get(&(invocation, c))));
            invoked_target.append_option(e.invoked_target);
            wakes.append_option(
                e.sleep_wakeup_at
                    .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            );
            promise_name.append_option(e.promise_name);
        }
        batch(
            &journal_schema(),
            vec![
                Arc::new(id.finish()),
                Arc::new(index.finish()),
                Arc::new(entry_type.finish()),
                Arc::new(type_id.finish()),
                Arc::new(length.finish()),
                Arc::new(name.finish()),
                Arc::new(completed.finish()),
                Arc::new(invoked_id.finish()),
                Arc::new(invoked_target.finish()),
                Arc::new(wakes.finish()),
                Arc::new(promise_name.finish()),
            ],
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::Message;

    fn id() -> InvocationId {
        InvocationId::from_bytes([7; 24])
    }

    fn look(message: &Message) -> Entry {
        let frame = message.to_frame(false);
        entry(id(), 1, frame.ty, &frame.payload)
    }

    #[test]
    fn commands_say_what_they_wait_for_and_whom_they_call() {
        let call = look(&Message::Call(proto::CallCommandMessage {
            service_name: "Counter".into(),
            handler_name: "add".into(),
            key: "k1".into(),
            invocation_id_notification_idx: 3,
            result_completion_id: 4,
            name: "count".into(),
            ..Default::default()
        }));
        assert_eq!(call.invoked_target.as_deref(), Some("Counter/k1/add"));
        assert_eq!((call.invoked_by, call.awaits), (Some(3), Some(4)));
        assert_eq!(call.name.as_deref(), Some("count"));
        let sleep = look(&Message::Sleep(proto::SleepCommandMessage {
            wake_up_time: 1_795_339_885_659,
            result_completion_id: 5,
            name: String::new(),
        }));
        assert_eq!(sleep.sleep_wakeup_at, Some(1_795_339_885_659));
        assert_eq!(sleep.name, None);
        let notified = look(&Message::CallInvocationIdCompletion(
            proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(3)),
                result: Some(notification_template::Result::InvocationId(
                    "inv_1abc".into(),
                )),
            },
        ));
        assert_eq!(notified.notifies, Some((3, Some("inv_1abc".into()))));
    }

    #[test]
    fn an_entry_that_does_not_decode_keeps_its_columns_null() {
        let frame = Message::Call(proto::CallCommandMessage::default()).to_frame(false);
        let broken = entry(id(), 2, frame.ty, &[0xff, 0xff, 0xff]);
        assert_eq!(
            broken,
            Entry {
                id: Some(id()),
                index: 2,
                ty: frame.ty,
                length: 3,
                ..Entry::default()
            }
        );
    }
}
