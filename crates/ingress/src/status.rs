//! `…/status`: where an invocation is, answered at once (attach and output wait or need the
//! outcome). One coarse stage, as the reference server answers it since 1.8: `created`
//! (accepted, not started: queued, held by flow control, or a delayed send), `started`
//! (running, suspended, backing off or paused) or `completed`, with the failure when it failed.
//! `POST /service/status` takes one target body (the reference's form) or a list of targets
//! and ids, up to `ingress.max-status-targets`.

use std::collections::HashMap;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::IngressState;
use super::api_keys::Binding;
use super::error::IngressError;
use super::invoke::with_ids;
use super::lookup::{TARGET_FORMS, TargetBody, checked_id, peek_status_for};
use super::path::StatusQuery;
use super::reply;
use sluice_core::ids::InvocationId;
use sluice_runtime::partition::Peek;
use sluice_runtime::partition::placement::Route;
use sluice_store::invocation::{Outcome, Status};

/// The lifecycle stage a status answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Accepted, not started yet.
    Created,
    /// Started and not finished.
    Started,
    /// Finished: succeeded, failed or killed.
    Completed,
}

impl Stage {
    /// The stage of an invocation in `status`.
    pub fn of(status: Status) -> Self {
        match status {
            Status::Pending | Status::Scheduled => Self::Created,
            Status::Running | Status::Suspended | Status::BackingOff | Status::Paused => {
                Self::Started
            }
            Status::Completed => Self::Completed,
        }
    }
}

/// A failed invocation's terminal error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusError {
    /// Its code (the handler's, or 409 when it was killed or canceled).
    pub code: u16,
    /// Its message.
    pub message: String,
}

/// What `GET …/status` answers (and, in cluster mode, what another node's answer is read as).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusBody {
    /// Where the invocation is.
    pub stage: Stage,
    /// The terminal error, only when it completed with a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StatusError>,
}

impl StatusBody {
    /// The status of what a peek saw.
    pub fn of(peek: &Peek) -> Self {
        let error = match &peek.outcome {
            Some(Outcome::Failure(failure)) if peek.status == Status::Completed => {
                Some(StatusError {
                    code: failure.code,
                    message: failure.message.clone(),
                })
            }
            _ => None,
        };
        Self {
            stage: Stage::of(peek.status),
            error,
        }
    }
}

fn not_found(id: InvocationId) -> IngressError {
    IngressError::not_found(format!(
        "invocation {id} not found (never existed, or purged)"
    ))
}

fn parse_id(text: &str) -> Result<InvocationId, IngressError> {
    text.parse()
        .map_err(|e| IngressError::bad_request(format!("bad invocation id '{text}': {e}")))
}

/// The invocation a status path names; a caller bound by its API key names its own scope's.
pub fn query_id(
    query: &StatusQuery,
    caller: Option<&Binding>,
) -> Result<InvocationId, IngressError> {
    let target = match query {
        StatusQuery::Id(id) => return parse_id(id),
        StatusQuery::Workflow { scope, name, key } => TargetBody::Workflow {
            workflow_name: name.clone(),
            workflow_key: key.clone(),
            scope: scope.clone(),
        },
        StatusQuery::Idempotent {
            scope,
            service,
            key,
            handler,
            idempotency_key,
        } => TargetBody::IdempotentInvocation {
            service: service.clone(),
            key: key.clone(),
            handler: handler.clone(),
            idempotency_key: idempotency_key.clone(),
            scope: scope.clone(),
        },
    };
    checked_id(target, caller)
}

/// `GET …/status` of the invocation `id` (run here).
pub async fn of_id(
    state: &IngressState,
    id: InvocationId,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let peek = peek_status_for(state, id, caller)
        .await?
        .ok_or_else(|| not_found(id))?;
    Ok(with_ids(
        reply::json(StatusCode::OK, &StatusBody::of(&peek)),
        id,
    ))
}

/// One entry of a `POST /service/status` list: a target body or an invocation id.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Entry {
    Id(String),
    Target(TargetBody),
}

/// One answer of a `POST /service/status` list, in the order asked.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ListedStatus {
    invocation_id: String,
    found: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    status: Option<StatusBody>,
}

/// What a `POST /service/status` body asks: one target (the reference's form), or a list.
pub enum StatusRequest {
    /// One invocation, answered as `GET …/status` answers it.
    One(InvocationId),
    /// A list, in the order asked.
    List(Vec<InvocationId>),
}

/// Reads a `POST /service/status` body in one pass: a target body, or a list of at most `max`
/// targets and ids (refused at entry `max + 1`, before the rest is read). Each is checked like a
/// call's scope and held to the caller's API key.
pub fn read_request(
    body: &[u8],
    max: usize,
    caller: Option<&Binding>,
) -> Result<StatusRequest, IngressError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let too_many = std::cell::Cell::new(false);
    let visitor = BodyVisitor {
        max,
        too_many: &too_many,
    };
    let parsed = serde::Deserializer::deserialize_any(&mut de, visitor)
        .and_then(|parsed| de.end().map(|()| parsed))
        .map_err(|e| {
            if too_many.get() {
                IngressError::bad_request(format!(
                    "more than {max} targets asked at once; ingress.max-status-targets allows {max}: split the list"
                ))
            } else {
                IngressError::bad_request(format!("bad status body: {e}; {LIST_FORMS}"))
            }
        })?;
    match parsed {
        Parsed::One(target) => checked_id(target, caller).map(StatusRequest::One),
        Parsed::List(entries) => entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                match entry {
                    Entry::Id(text) => parse_id(&text),
                    Entry::Target(target) => checked_id(target, caller),
                }
                .map_err(|e| IngressError {
                    message: format!("bad status entry {i}: {}", e.message),
                    ..e
                })
            })
            .collect::<Result<_, _>>()
            .map(StatusRequest::List),
    }
}

/// What a status body parses to, before its entries are checked.
enum Parsed {
    One(TargetBody),
    List(Vec<Entry>),
}

/// Reads a target body, or a list that is refused as soon as it grows past `max` (and says so
/// in `too_many`: serde's error carries only text).
struct BodyVisitor<'a> {
    max: usize,
    too_many: &'a std::cell::Cell<bool>,
}

impl<'de> serde::de::Visitor<'de> for BodyVisitor<'_> {
    type Value = Parsed;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a target body or a list of targets and invocation ids")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Parsed, A::Error> {
        let target = <TargetBody as Deserialize>::deserialize(
            serde::de::value::MapAccessDeserializer::new(map),
        )?;
        Ok(Parsed::One(target))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Parsed, A::Error> {
        let mut entries = Vec::new();
        while entries.len() < self.max {
            let i = entries.len();
            let entry = seq.next_element::<Entry>().map_err(|e| {
                serde::de::Error::custom(format_args!("entry {i}: {e}; {TARGET_FORMS}"))
            })?;
            match entry {
                Some(entry) => entries.push(entry),
                None => return Ok(Parsed::List(entries)),
            }
        }
        // At the bound: one more entry of any kind is one too many, and is not kept.
        match seq.next_element::<serde::de::IgnoredAny>()? {
            None => Ok(Parsed::List(entries)),
            Some(_) => {
                self.too_many.set(true);
                Err(serde::de::Error::custom("over ingress.max-status-targets"))
            }
        }
    }
}

const LIST_FORMS: &str =
    "send one target body, or a list of target bodies and invocation ids (\"inv_…\")";

/// `POST /service/status` with a list: each entry's status, in order; an unknown one is
/// `"found": false`. An id asked several times is looked up once. A node in cluster mode asks
/// the node leading an entry's partition with `asked`: the caller's API key, and the client
/// connection it came on.
pub async fn of_list(
    state: &IngressState,
    ids: Vec<InvocationId>,
    asked: &HeaderMap,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let mut seen: HashMap<InvocationId, Option<StatusBody>> = HashMap::with_capacity(ids.len());
    let mut answers = Vec::with_capacity(ids.len());
    for id in ids {
        let status = match seen.get(&id) {
            Some(status) => status.clone(),
            None => {
                let status = match state.runtime.route(id) {
                    Route::Here => peek_status_for(state, id, caller)
                        .await?
                        .map(|peek| StatusBody::of(&peek)),
                    route => elsewhere(state, id, route, asked).await?,
                };
                seen.insert(id, status.clone());
                status
            }
        };
        answers.push(ListedStatus {
            invocation_id: id.to_string(),
            found: status.is_some(),
            status,
        });
    }
    Ok(reply::json(StatusCode::OK, &answers))
}

/// The status of `id` from the node leading its partition (which holds it to the API key the
/// caller presented, as this node would).
async fn elsewhere(
    state: &IngressState,
    id: InvocationId,
    route: Route,
    asked: &HeaderMap,
) -> Result<Option<StatusBody>, IngressError> {
    let not_here = |why: String| {
        IngressError::coded(
            sluice_core::errors::Code::CLU0001,
            format!("the status of {id} is kept by another node: {why}; retry"),
        )
    };
    let Route::Elsewhere { ingress, .. } = route else {
        return Err(not_here("no node leads its partition right now".into()));
    };
    let answer = sluice_runtime::replication::relay::relay(
        state.runtime.placement(),
        state.forwarder.pick(),
        &ingress,
        Method::GET,
        &format!("/restate/status/{id}"),
        asked,
        Bytes::new(),
    )
    .await
    .map_err(not_here)?;
    match answer.status {
        StatusCode::OK => {
            let body: StatusBody = serde_json::from_slice(&answer.body)
                .map_err(|e| not_here(format!("it answered an unreadable status ({e})")))?;
            Ok(Some(body))
        }
        StatusCode::NOT_FOUND => Ok(None),
        // The other node refused the caller's key: so would this one.
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
            let message = body["message"].as_str().unwrap_or("refused").to_owned();
            Err(IngressError::coded(
                if answer.status == StatusCode::UNAUTHORIZED {
                    sluice_core::errors::Code::SEC0009
                } else {
                    sluice_core::errors::Code::SEC0010
                },
                message,
            ))
        }
        other => Err(not_here(format!("it answered {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::invocation::{Failure, Target};

    fn peek(status: Status, outcome: Option<Outcome>) -> Peek {
        Peek {
            target: Target {
                service: "S".into(),
                handler: "h".into(),
                key: None,
            },
            status,
            outcome,
            scope: None,
        }
    }

    #[test]
    fn every_status_has_its_stage() {
        let json = |p: &Peek| serde_json::to_value(StatusBody::of(p)).unwrap();
        for (status, stage) in [
            (Status::Pending, "created"),
            (Status::Scheduled, "created"),
            (Status::Running, "started"),
            (Status::Suspended, "started"),
            (Status::BackingOff, "started"),
            (Status::Paused, "started"),
        ] {
            assert_eq!(
                json(&peek(status, None)),
                serde_json::json!({"stage": stage})
            );
        }
        assert_eq!(
            json(&peek(
                Status::Completed,
                Some(Outcome::Value(b"1".to_vec()))
            )),
            serde_json::json!({"stage": "completed"})
        );
        let failed = peek(
            Status::Completed,
            Some(Outcome::Failure(Failure {
                code: 409,
                message: "killed".into(),
            })),
        );
        assert_eq!(
            json(&failed),
            serde_json::json!({"stage": "completed", "error": {"code": 409, "message": "killed"}})
        );
        // Another node's answer reads back as it was written.
        for p in [&failed, &peek(Status::Pending, None)] {
            let read: StatusBody = serde_json::from_value(json(p)).unwrap();
            assert_eq!(read, StatusBody::of(p));
        }
    }

    fn one(body: &[u8], caller: Option<&Binding>) -> Result<InvocationId, IngressError> {
        match read_request(body, 3, caller)? {
            StatusRequest::One(id) => Ok(id),
            StatusRequest::List(_) => panic!("a list"),
        }
    }

    fn list(body: &[u8]) -> Result<Vec<InvocationId>, IngressError> {
        match read_request(body, 3, None)? {
            StatusRequest::List(ids) => Ok(ids),
            StatusRequest::One(_) => panic!("one target"),
        }
    }

    const ID: &str = "inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T";

    #[test]
    fn bodies_name_one_target_or_a_list() {
        let body = format!(r#"{{"target":"invocation","invocationId":"{ID}"}}"#);
        assert_eq!(one(body.as_bytes(), None).unwrap().to_string(), ID);
        assert!(list(b"[]").unwrap().is_empty());
        let ids = list(format!(r#"["{ID}", {body}, "{ID}"]"#).as_bytes()).unwrap();
        assert_eq!(ids.len(), 3);
        for bad in [
            &b"{"[..],
            b"7",
            br#"{"target":"nope"}"#,
            br#"{"target":"workflow","workflowName":"W","workflowKey":"k","scope":"bad scope!"}"#,
            br#"[{"target":"invocation","invocationId":"inv_x"}]"#,
            b"[] []",
        ] {
            let err = read_request(bad, 3, None).err().expect("refused");
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{}", err.message);
        }
        let same = |scope: Option<&str>| {
            query_id(
                &StatusQuery::Workflow {
                    scope: scope.map(str::to_owned),
                    name: "W".into(),
                    key: "k".into(),
                },
                None,
            )
            .unwrap()
        };
        assert_ne!(same(None), same(Some("acme")), "a scope is part of the id");
    }

    #[test]
    fn a_list_past_its_bound_is_refused_at_the_first_entry_too_many() {
        let err = list(format!(r#"["{ID}","{ID}","{ID}","{ID}"]"#).as_bytes()).unwrap_err();
        assert!(
            err.message.contains("more than 3 targets"),
            "{}",
            err.message
        );
        // The entry past the bound is never read: what follows it may be anything.
        let err = list(format!(r#"["{ID}","{ID}","{ID}",0,"#).as_bytes()).unwrap_err();
        assert!(
            err.message.contains("more than 3 targets"),
            "{}",
            err.message
        );
        let err = list(br#"[0]"#).unwrap_err();
        assert!(err.message.contains("entry 0"), "{}", err.message);
    }

    #[test]
    fn a_bound_caller_names_targets_in_its_scope_only() {
        let alpha = Binding {
            scope: sluice_flow::Scope::parse("alpha").unwrap(),
            max_priority: sluice_flow::Priority::NORMAL,
            limit_key: None,
        };
        let target = |scope: &str| {
            format!(
                r#"{{"target":"idempotentInvocation","service":"S","handler":"h","idempotencyKey":"k"{scope}}}"#
            )
        };
        let named = one(target(r#","scope":"alpha""#).as_bytes(), Some(&alpha)).unwrap();
        let implied = one(target("").as_bytes(), Some(&alpha)).unwrap();
        assert_eq!(named, implied, "a key's holder may leave its scope out");
        assert_ne!(implied, one(target("").as_bytes(), None).unwrap());
        let other = one(target(r#","scope":"beta""#).as_bytes(), Some(&alpha)).unwrap_err();
        assert_eq!(other.code, Some(sluice_core::errors::Code::SEC0010));
    }
}
