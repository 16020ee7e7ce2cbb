//! The ingress path grammar: which operation a method and path ask for. Pure: whether a
//! `{key}` segment is expected is decided later, from the registered service type.
//!
//! Every operation is served under `/service/…` and its Restate alias `/restate/…`; invocations
//! also under the legacy `/{service}/[{key}/]{handler}[/send]`. Path segments are URL-decoded.

use http::Method;

use super::error::IngressError;

/// Call (wait for the output) or send (answer once accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200 with the output.
    Call,
    /// 202 once durable.
    Send,
}

/// An invocation request before its target is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvokePath {
    /// Call or send.
    pub mode: Mode,
    /// The scope from `/service/scope/{scope}/…`, not yet validated.
    pub scope: Option<String>,
    /// The service name.
    pub service: String,
    /// `[handler]` or `[key, handler]`; which one is valid depends on the service type.
    pub rest: Vec<String>,
    /// Came in on the legacy `/{service}/…` form.
    pub legacy: bool,
}

/// An operation of the ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// `GET /service/health`.
    Health,
    /// Call or send a handler.
    Invoke(InvokePath),
    /// `GET /service/attach/{id}` (wait) or `/service/output/{id}` (don't wait).
    ById {
        /// The invocation id text, not yet parsed.
        id: String,
        /// Wait for the output.
        attach: bool,
    },
    /// `POST /service/attach|output|lookup` with a target body.
    ByTarget {
        /// `attach`, `output` or `lookup`.
        action: TargetAction,
    },
    /// `GET /service/workflow/{name}/{key}/attach|output`.
    Workflow {
        /// Workflow name.
        name: String,
        /// Workflow key.
        key: String,
        /// Wait for the output.
        attach: bool,
    },
    /// `GET …/status` of one invocation, without waiting.
    Status(StatusQuery),
    /// `POST /service/status` with a target body, or a list of targets and ids.
    StatusOf,
    /// `POST /service/awakeables/{id}/resolve|reject`.
    Awakeable {
        /// The awakeable id text, not yet parsed.
        id: String,
        /// Resolve (true) or reject.
        resolve: bool,
    },
}

/// Which invocation a `…/status` path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusQuery {
    /// `/service/invocation/{id}/status`, `/service/status/{id}`.
    Id(String),
    /// `[/service/scope/{scope}]/service/workflow/{name}/{key}/status`: the workflow's run.
    Workflow {
        /// The scope the run was started in.
        scope: Option<String>,
        /// Workflow name.
        name: String,
        /// Workflow key.
        key: String,
    },
    /// `[/service/scope/{scope}]/service/invocation/{service}/[{key}/]{handler}/{idempotency-key}/status`.
    Idempotent {
        /// The scope it was called in.
        scope: Option<String>,
        /// Service name.
        service: String,
        /// Object key, for keyed services.
        key: Option<String>,
        /// Handler name.
        handler: String,
        /// The idempotency key it was called with.
        idempotency_key: String,
    },
}

/// What a target-body request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetAction {
    /// Wait for the output.
    Attach,
    /// The output if ready.
    Output,
    /// The invocation id.
    Lookup,
}

const EXPECTED: &str = "expected /service/call/:service/[:key/]:handler, /service/send/:service/[:key/]:handler, /service/scope/:scope/call|send/…, /service/attach/:invocation_id, /service/output/:invocation_id, /service/awakeables/:id/resolve|reject, /service/invocation/:invocation_id/status (and the other status forms) or /service/health";

fn bad_path(path: &str) -> IngressError {
    IngressError::bad_request(format!("bad path '{path}': {EXPECTED}"))
}

/// Splits and URL-decodes the segments of `path` (a trailing `/` is ignored).
fn segments(path: &str) -> Result<Vec<String>, IngressError> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    trimmed
        .split('/')
        .map(|s| {
            percent_decode(s).ok_or_else(|| {
                IngressError::bad_request(format!(
                    "bad path '{path}': segment '{s}' is not valid URL encoding"
                ))
            })
        })
        .collect()
}

fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            // Two hex digits, nothing else: `from_str_radix` alone would take a sign (`%+f`).
            let [hi, lo] = *bytes.get(i + 1..i + 3)? else {
                return None;
            };
            out.push(hex_value(hi)? << 4 | hex_value(lo)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|v| u8::try_from(v).ok())
}

fn invoke(mode: Mode, scope: Option<String>, rest: &[String], legacy: bool) -> Option<Operation> {
    let (service, rest) = rest.split_first()?;
    if rest.is_empty() || rest.len() > 2 || service.is_empty() || rest.iter().any(String::is_empty)
    {
        return None;
    }
    Some(Operation::Invoke(InvokePath {
        mode,
        scope,
        service: service.clone(),
        rest: rest.to_vec(),
        legacy,
    }))
}

/// The operation `method path` asks for.
pub fn parse(method: &Method, path: &str) -> Result<Operation, IngressError> {
    let parts = segments(path)?;
    let strs: Vec<&str> = parts.iter().map(String::as_str).collect();
    let get_or_post = *method == Method::GET || *method == Method::POST;
    let op = match strs.as_slice() {
        [prefix, rest @ ..] if matches!(*prefix, "service" | "restate") => {
            namespaced(rest, &parts[1..], method).ok_or_else(|| bad_path(path))?
        }
        [] | [_] => return Err(bad_path(path)),
        _ => {
            // Legacy: /{service}/[{key}/]{handler}[/send]
            let (mode, rest) = match parts.split_last() {
                Some((last, rest)) if last == "send" && rest.len() >= 2 => (Mode::Send, rest),
                _ => (Mode::Call, parts.as_slice()),
            };
            invoke(mode, None, rest, true).ok_or_else(|| bad_path(path))?
        }
    };
    let allowed = match &op {
        Operation::Health
        | Operation::ById { .. }
        | Operation::Workflow { .. }
        | Operation::Status(_) => *method == Method::GET,
        Operation::Invoke(_) => get_or_post,
        Operation::ByTarget { .. } | Operation::Awakeable { .. } | Operation::StatusOf => {
            *method == Method::POST
        }
    };
    if !allowed {
        return Err(IngressError::method_not_allowed(format!(
            "method {method} is not allowed on {path}"
        )));
    }
    Ok(op)
}

fn namespaced(rest: &[&str], owned: &[String], _method: &Method) -> Option<Operation> {
    let op = match rest {
        ["health"] => Operation::Health,
        ["call", ..] => return invoke(Mode::Call, None, &owned[1..], false),
        ["send", ..] => return invoke(Mode::Send, None, &owned[1..], false),
        ["scope", scope, "call", ..] => {
            return invoke(Mode::Call, Some((*scope).to_owned()), &owned[3..], false);
        }
        ["scope", scope, "send", ..] => {
            return invoke(Mode::Send, Some((*scope).to_owned()), &owned[3..], false);
        }
        ["scope", scope, rest @ .., "status"] => {
            return scoped_status(Some(scope), rest).map(Operation::Status);
        }
        ["invocation", id, "status"] | ["status", id] => {
            Operation::Status(StatusQuery::Id((*id).to_owned()))
        }
        ["status"] => Operation::StatusOf,
        [rest @ .., "status"] => return scoped_status(None, rest).map(Operation::Status),
        ["attach", id] => Operation::ById {
            id: (*id).to_owned(),
            attach: true,
        },
        ["output", id] => Operation::ById {
            id: (*id).to_owned(),
            attach: false,
        },
        ["invocation", id, action @ ("attach" | "output")] => Operation::ById {
            id: (*id).to_owned(),
            attach: *action == "attach",
        },
        ["attach"] => Operation::ByTarget {
            action: TargetAction::Attach,
        },
        ["output"] => Operation::ByTarget {
            action: TargetAction::Output,
        },
        ["lookup"] => Operation::ByTarget {
            action: TargetAction::Lookup,
        },
        ["workflow", name, key, action @ ("attach" | "output")] => Operation::Workflow {
            name: (*name).to_owned(),
            key: (*key).to_owned(),
            attach: *action == "attach",
        },
        ["awakeables" | "a", id, action @ ("resolve" | "reject")] => Operation::Awakeable {
            id: (*id).to_owned(),
            resolve: *action == "resolve",
        },
        _ => return None,
    };
    Some(op)
}

/// The status query of `workflow/{name}/{key}` or `invocation/{service}/[{key}/]{handler}/{idempotency-key}`
/// (what comes before `/status`), in `scope`.
fn scoped_status(scope: Option<&&str>, rest: &[&str]) -> Option<StatusQuery> {
    let scope = scope.map(|s| (*s).to_owned());
    let owned = |s: &&str| (*s).to_owned();
    match rest {
        ["workflow", name, key] => Some(StatusQuery::Workflow {
            scope,
            name: owned(name),
            key: owned(key),
        }),
        ["invocation", service, handler, idempotency_key] => Some(StatusQuery::Idempotent {
            scope,
            service: owned(service),
            key: None,
            handler: owned(handler),
            idempotency_key: owned(idempotency_key),
        }),
        ["invocation", service, key, handler, idempotency_key] => Some(StatusQuery::Idempotent {
            scope,
            service: owned(service),
            key: Some(owned(key)),
            handler: owned(handler),
            idempotency_key: owned(idempotency_key),
        }),
        _ => None,
    }
    .filter(|_| rest.iter().all(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn invoke_of(method: &Method, path: &str) -> InvokePath {
        match parse(method, path).unwrap() {
            Operation::Invoke(p) => p,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn invocation_forms() {
        let p = invoke_of(&Method::POST, "/service/call/Greeter/greet");
        assert_eq!(
            (p.mode, p.service.as_str(), p.rest.clone(), p.legacy),
            (Mode::Call, "Greeter", vec!["greet".to_owned()], false)
        );
        let p = invoke_of(&Method::POST, "/restate/send/Counter/k1/add/");
        assert_eq!(
            (p.mode, p.rest.clone()),
            (Mode::Send, vec!["k1".to_owned(), "add".to_owned()])
        );
        let p = invoke_of(&Method::GET, "/service/scope/acme/call/Greeter/greet");
        assert_eq!(p.scope.as_deref(), Some("acme"));
        let p = invoke_of(&Method::POST, "/Greeter/greet");
        assert!(p.legacy && p.mode == Mode::Call);
        let p = invoke_of(&Method::POST, "/Counter/my%20key/add/send");
        assert_eq!(
            (p.mode, p.rest.clone()),
            (Mode::Send, vec!["my key".to_owned(), "add".to_owned()])
        );
        // A handler may be called "send" on an unkeyed service only through the new API.
        let p = invoke_of(&Method::POST, "/service/call/Greeter/send");
        assert_eq!(p.rest, vec!["send".to_owned()]);
    }

    #[test]
    fn other_operations() {
        assert_eq!(
            parse(&Method::GET, "/service/health").unwrap(),
            Operation::Health
        );
        assert_eq!(
            parse(&Method::GET, "/restate/attach/inv_1x").unwrap(),
            Operation::ById {
                id: "inv_1x".into(),
                attach: true
            }
        );
        assert_eq!(
            parse(&Method::GET, "/restate/invocation/inv_1x/output").unwrap(),
            Operation::ById {
                id: "inv_1x".into(),
                attach: false
            }
        );
        assert_eq!(
            parse(&Method::POST, "/service/lookup").unwrap(),
            Operation::ByTarget {
                action: TargetAction::Lookup
            }
        );
        assert_eq!(
            parse(&Method::GET, "/service/workflow/Signup/u1/attach").unwrap(),
            Operation::Workflow {
                name: "Signup".into(),
                key: "u1".into(),
                attach: true
            }
        );
        assert_eq!(
            parse(&Method::POST, "/restate/a/sign_1abc/reject").unwrap(),
            Operation::Awakeable {
                id: "sign_1abc".into(),
                resolve: false
            }
        );
    }

    #[test]
    fn status_forms() {
        let id = |p| parse(&Method::GET, p).unwrap();
        for path in [
            "/restate/invocation/inv_1x/status",
            "/service/status/inv_1x",
        ] {
            assert_eq!(
                id(path),
                Operation::Status(StatusQuery::Id("inv_1x".into())),
                "{path}"
            );
        }
        assert_eq!(
            id("/restate/workflow/Signup/u1/status"),
            Operation::Status(StatusQuery::Workflow {
                scope: None,
                name: "Signup".into(),
                key: "u1".into()
            })
        );
        assert_eq!(
            id("/service/scope/acme/invocation/Counter/k/add/my%20key/status"),
            Operation::Status(StatusQuery::Idempotent {
                scope: Some("acme".into()),
                service: "Counter".into(),
                key: Some("k".into()),
                handler: "add".into(),
                idempotency_key: "my key".into()
            })
        );
        assert_eq!(
            id("/restate/invocation/Greeter/greet/k1/status"),
            Operation::Status(StatusQuery::Idempotent {
                scope: None,
                service: "Greeter".into(),
                key: None,
                handler: "greet".into(),
                idempotency_key: "k1".into()
            })
        );
        assert_eq!(
            parse(&Method::POST, "/restate/status").unwrap(),
            Operation::StatusOf
        );
        for (method, path, status) in [
            (Method::POST, "/restate/status/inv_1x", 405),
            (Method::GET, "/restate/status", 405),
            (Method::GET, "/restate/invocation/a/b/status", 400),
            (Method::GET, "/restate/workflow/Signup//status", 400),
            (Method::GET, "/restate/scope/acme/status", 400),
        ] {
            let err = parse(&method, path).unwrap_err();
            assert_eq!(err.status.as_u16(), status, "{method} {path}");
        }
    }

    #[test]
    fn bad_paths_and_methods() {
        for path in [
            "/",
            "/Greeter",
            "/service/call/Greeter",
            "/service/call",
            "/service/bogus/x",
            "/a/b/c/d",
            "/service/call/S/k/h/x",
        ] {
            let err = parse(&Method::POST, path).unwrap_err();
            assert_eq!(err.status.as_u16(), 400, "{path}");
            assert!(
                err.message.starts_with(&format!("bad path '{path}'")),
                "{}",
                err.message
            );
        }
        let err = parse(&Method::POST, "/service/health").unwrap_err();
        assert_eq!(err.status.as_u16(), 405);
        assert_eq!(
            parse(&Method::GET, "/service/lookup")
                .unwrap_err()
                .status
                .as_u16(),
            405
        );
        assert_eq!(
            parse(&Method::PUT, "/service/call/S/h")
                .unwrap_err()
                .status
                .as_u16(),
            405
        );
        for bad in ["/S/%+f/h", "/S/%-1/h", "/S/% f/h", "/S/%f/h", "/S/%ff/h"] {
            assert_eq!(
                parse(&Method::POST, bad).unwrap_err().status.as_u16(),
                400,
                "{bad}"
            );
        }
        assert_eq!(
            parse(&Method::POST, "/S/%zz/h")
                .unwrap_err()
                .status
                .as_u16(),
            400
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics(path in "(/[a-zA-Z0-9%_.~-]{0,6}){0,9}/?", post in any::<bool>()) {
            let method = if post { Method::POST } else { Method::GET };
            let _ = parse(&method, &path);
        }

        #[test]
        fn arbitrary_paths_never_panic(path in "\\PC{0,80}", post in any::<bool>()) {
            let method = if post { Method::POST } else { Method::GET };
            let _ = parse(&method, &path);
        }

        #[test]
        fn generated_invocations_parse_back(
            service in "[A-Z][a-zA-Z0-9]{0,8}",
            key in prop::option::of("[a-z0-9 ]{1,8}"),
            handler in "[a-z][a-zA-Z0-9]{0,8}",
            send in any::<bool>(),
        ) {
            let encoded_key = key.as_ref().map(|k| k.replace(' ', "%20"));
            let mut path = format!("/service/{}/{service}", if send { "send" } else { "call" });
            if let Some(k) = &encoded_key {
                path.push('/');
                path.push_str(k);
            }
            path.push('/');
            path.push_str(&handler);
            let p = invoke_of(&Method::POST, &path);
            let mut want = key.clone().into_iter().collect::<Vec<_>>();
            want.push(handler.clone());
            prop_assert_eq!(p.rest, want);
            prop_assert_eq!(p.mode, if send { Mode::Send } else { Mode::Call });
        }
    }
}
