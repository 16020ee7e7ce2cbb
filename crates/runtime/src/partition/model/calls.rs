//! Calls between handlers. A Call or OneWayCall command becomes a child invocation whose id
//! derives from the caller's id and the command's index, so submitting it again (after a
//! restart lost the hand-over) finds the same invocation instead of running it twice. The
//! caller gets the child's id at once and, for a Call, its result when it completes.

use bytes::Bytes;

use crate::discovery::ServiceType;
use crate::registry::Registry;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_flow::scope::parse_request;
use sluice_flow::{LimitKey, Priority};
use sluice_protocol::message::Kind;
use sluice_protocol::proto::{self, notification_template};
use sluice_protocol::{Frame, Message, MessageType, ProtocolVersion};
use sluice_store::invocation::new::{Identity, NewInvocation};
use sluice_store::invocation::{Caller, InvocationRecord, Target};

/// A child invocation to hand to its partition.
#[derive(Debug)]
pub struct Child {
    /// Its record.
    pub record: InvocationRecord,
    /// Its Input entry.
    pub input: Frame,
}

/// Resolves a call's target the way the ingress does, except that private services are
/// callable (they exist for exactly this).
fn resolve(
    registry: &Registry,
    service: &str,
    handler: &str,
    key: &str,
) -> Result<Target, CodedError> {
    let (found, deployment) = registry.service(service).map_err(|_| {
        CodedError::new(
            Code::RT0018,
            format!(
                "service '{service}' not found, make sure to register the service before calling it"
            ),
        )
    })?;
    let exists = deployment.handler(service, handler).is_some();
    if !exists {
        return Err(CodedError::new(
            Code::RT0018,
            format!(
                "the service '{service}' exists, but the handler '{handler}' was not found, check that the handler exists in the latest registered service version"
            ),
        ));
    }
    let key = match (found.ty, key.is_empty()) {
        (ServiceType::Service, true) => None,
        (ServiceType::Service, false) => {
            return Err(CodedError::new(
                Code::RT0017,
                format!("a key was provided, but the callee '{service}' is a Service"),
            ));
        }
        (_, _) => Some(key.to_owned()),
    };
    Ok(Target {
        service: service.to_owned(),
        handler: handler.to_owned(),
        key,
    })
}

/// 128-bit FNV-1a: stable across builds, so a child's id is the same after a restart.
fn derive_uuid(caller: InvocationId, index: u32) -> u128 {
    let mut hash: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for byte in caller.to_bytes().into_iter().chain(index.to_be_bytes()) {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    hash
}

/// What a call or a one-way call command names, alike for both.
struct CallParts<'a> {
    scope: Option<&'a str>,
    limit_key: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    headers: &'a Vec<proto::Header>,
    service: &'a String,
    handler: &'a String,
    key: &'a String,
    parameter: &'a Bytes,
    /// The notification that tells the caller the child's id.
    notify: u32,
    /// When a one-way call is to run, ms (0: now).
    invoke_time: u64,
    /// The completion a call's result goes to (none for a one-way call).
    result: Option<u32>,
}

impl<'a> CallParts<'a> {
    /// `None` for a message that is no call.
    fn of(message: &'a Message) -> Option<Self> {
        Some(match message {
            Message::Call(c) => CallParts {
                scope: c.scope.as_deref(),
                limit_key: c.limit_key.as_deref(),
                idempotency_key: c.idempotency_key.as_deref(),
                headers: &c.headers,
                service: &c.service_name,
                handler: &c.handler_name,
                key: &c.key,
                parameter: &c.parameter,
                notify: c.invocation_id_notification_idx,
                invoke_time: 0,
                result: Some(c.result_completion_id),
            },
            Message::OneWayCall(c) => CallParts {
                scope: c.scope.as_deref(),
                limit_key: c.limit_key.as_deref(),
                idempotency_key: c.idempotency_key.as_deref(),
                headers: &c.headers,
                service: &c.service_name,
                handler: &c.handler_name,
                key: &c.key,
                parameter: &c.parameter,
                notify: c.invocation_id_notification_idx,
                invoke_time: c.invoke_time,
                result: None,
            },
            _ => return None,
        })
    }
}

/// The child a call command (at command index `index` of `caller`) creates, and the
/// notification telling the caller its id. `None` for messages that are not calls.
pub fn child_of(
    registry: &Registry,
    inherit_scope: bool,
    caller_record: &InvocationRecord,
    index: u32,
    message: &Message,
    now: u64,
) -> Option<Result<(Child, u32), CodedError>> {
    let caller = caller_record.id;
    let call = CallParts::of(message)?;
    // V6 commands have no fields for them: their headers carry them (the fields win).
    let header = |name: &str| {
        call.headers
            .iter()
            .find(|h| h.key.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    };
    let (scope, limit_key) = match (call.scope, call.limit_key) {
        (None, None) => (
            header(sluice_flow::SCOPE_HEADER),
            header(sluice_flow::LIMIT_KEY_HEADER),
        ),
        named => named,
    };
    if call.idempotency_key == Some("") {
        return Some(Err(CodedError::new(
            Code::RT0017,
            "a call carries an empty idempotency key: give it a non-empty key, or none",
        )));
    }
    // A call's scope and limit key are checked like the ingress checks them, after what it
    // inherits from its caller.
    let (scope, limit_key) = inherited(inherit_scope, caller_record, scope, limit_key);
    let (scope, limit_key) = match parse_request(scope, limit_key) {
        Ok(classified) => classified,
        Err(e) => return Some(Err(e)),
    };
    let headers_named = call
        .headers
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()));
    let priority = match Priority::from_headers(headers_named) {
        Ok(priority) => priority,
        Err(e) => return Some(Err(CodedError::new(Code::RT0024, e.to_string()))),
    };
    Some(
        resolve(registry, call.service, call.handler, call.key).map(|target| {
            // With an idempotency key the child is whichever invocation that key names (another
            // caller may have started it); without, one derived from this command.
            let (identity, retention) = match call.idempotency_key {
                Some(ik) => (
                    Identity::Idempotent(ik.to_owned()),
                    Some(registry.idempotency_retention(&target.service, &target.handler)),
                ),
                None => (
                    Identity::Derived {
                        uuid: derive_uuid(caller, index),
                        partition: None,
                    },
                    None,
                ),
            };
            let mut new = NewInvocation::new(target, identity)
                .in_scope(scope, limit_key)
                .with_priority(priority)
                .with_trace(crate::spans::trace_for_child(caller_record));
            new.retention = retention;
            new.caller = call.result.map(|completion| Caller {
                id: caller,
                completion,
            });
            new.run_at_ms = (call.invoke_time > now).then_some(call.invoke_time);
            let record = new.into_record(now);
            let input = Message::Input(proto::InputCommandMessage {
                headers: call.headers.clone(),
                value: Some(proto::Value {
                    content: Bytes::clone(call.parameter),
                }),
                name: String::new(),
            })
            .to_frame(false);
            (Child { record, input }, call.notify)
        }),
    )
}

/// The scope and limit key a call runs under: what the handler named, or, when it named no
/// scope and `inherit` is on (`flow.inherit-scope`), its caller's scope with the handler's own
/// limit key if it named one, else the caller's. A scope the handler names comes with only the
/// limit key it names: the caller's key belongs to the caller's scope.
fn inherited<'a>(
    inherit: bool,
    caller: &'a InvocationRecord,
    scope: Option<&'a str>,
    limit_key: Option<&'a str>,
) -> (Option<&'a str>, Option<&'a str>) {
    let named_key = limit_key.filter(|k| !k.is_empty());
    match (scope, &caller.scope) {
        (None, Some(caller_scope)) if inherit => (
            Some(caller_scope.as_str()),
            named_key.or(caller.limit_key.as_ref().map(LimitKey::as_str)),
        ),
        _ => (scope, limit_key),
    }
}

/// The children the calls in `journal` create, to hand over again after a restart (the
/// partitions that own them ignore the ones they have).
pub fn children_in(
    registry: &Registry,
    inherit_scope: bool,
    record: &InvocationRecord,
    journal: &[Frame],
    now: u64,
) -> Vec<Child> {
    let version = record
        .protocol
        .and_then(ProtocolVersion::from_number)
        .unwrap_or(ProtocolVersion::V5);
    let mut index = 0;
    let mut out = Vec::new();
    for frame in journal {
        if MessageType::from_id(frame.ty).map(MessageType::kind) != Some(Kind::Command) {
            continue;
        }
        if let Ok(message) = Message::decode(frame, version)
            && let Some(Ok((child, _))) =
                child_of(registry, inherit_scope, record, index, &message, now)
        {
            out.push(child);
        }
        index += 1;
    }
    out
}

/// The notification carrying a child's id to its caller.
pub fn id_notification(completion: u32, child: InvocationId) -> Message {
    Message::CallInvocationIdCompletion(proto::NotificationTemplate {
        id: Some(notification_template::Id::CompletionId(completion)),
        result: Some(notification_template::Result::InvocationId(
            child.to_string(),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_ids_are_stable_and_distinct_per_command() {
        let caller = InvocationId::generate(7);
        assert_eq!(derive_uuid(caller, 3), derive_uuid(caller, 3));
        assert_ne!(derive_uuid(caller, 3), derive_uuid(caller, 4));
        assert_ne!(
            derive_uuid(caller, 3),
            derive_uuid(InvocationId::generate(7), 3)
        );
    }

    #[test]
    fn a_call_naming_no_scope_inherits_its_callers_unless_turned_off() {
        use sluice_flow::Scope;
        let target = Target {
            service: "S".into(),
            handler: "h".into(),
            key: None,
        };
        let caller = NewInvocation::new(target, Identity::Fresh)
            .in_scope(
                Some(Scope::parse("acme").unwrap()),
                Some(LimitKey::parse("gold").unwrap()),
            )
            .into_record(0);
        let unscoped = NewInvocation::new(caller.target.clone(), Identity::Fresh).into_record(0);
        assert_eq!(
            inherited(true, &caller, None, None),
            (Some("acme"), Some("gold"))
        );
        assert_eq!(
            inherited(true, &caller, None, Some("silver")),
            (Some("acme"), Some("silver")),
            "its own limit key wins"
        );
        assert_eq!(
            inherited(true, &caller, Some("other"), None),
            (Some("other"), None),
            "its own scope comes without the caller's key"
        );
        assert_eq!(inherited(false, &caller, None, None), (None, None));
        assert_eq!(inherited(true, &unscoped, None, None), (None, None));
    }
}
