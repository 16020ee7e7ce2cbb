//! The `extract` hook: ingress requests run through the extract plugins in load order; each
//! may replace the scope and limit key or refuse the request. What a plugin sets is checked
//! like user input; a plugin that fails either refuses the request (PLG…) or is skipped.

use std::time::Instant;

use super::OnError;
use super::bindings::types;
use super::{Plugin, failure_error};
use sluice_core::errors::{Code, CodedError};
use sluice_flow::{LimitKey, Scope};

/// What the ingress knows of a request before validating it.
#[derive(Debug, Clone, Default)]
pub struct ExtractRequest {
    /// `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The raw query, without `?`.
    pub query: Option<String>,
    /// Names lower case.
    pub headers: Vec<(String, String)>,
    /// `(service, handler, key)` as parsed from the path.
    pub target: Option<(String, String, Option<String>)>,
    /// Scope so far.
    pub scope: Option<String>,
    /// Limit key so far.
    pub limit_key: Option<String>,
}

/// What the plugins decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extracted {
    /// Go on with this scope and limit key.
    Classified {
        /// The scope.
        scope: Option<String>,
        /// The limit key.
        limit_key: Option<String>,
    },
    /// Answer the client with this status and message.
    Rejected {
        /// 400-599.
        status: u16,
        /// Said to the client.
        message: String,
        /// The plugin that refused.
        plugin: String,
    },
}

/// Headers that carry the caller's credentials: a plugin sees them only when its spec asks
/// (`credentials = true`).
const CREDENTIALS: [&str; 2] = ["x-sluice-api-key", "authorization"];

/// Runs `request` through `plugins` (the extract ones, in order).
pub fn run(
    plugins: &[std::sync::Arc<Plugin>],
    request: ExtractRequest,
) -> Result<Extracted, CodedError> {
    let ExtractRequest {
        method,
        path,
        query,
        headers,
        target,
        mut scope,
        mut limit_key,
    } = request;
    let mut template = Some(types::Request {
        method,
        path,
        query,
        headers,
        target: target.map(|(service, handler, key)| types::Target {
            service,
            handler,
            key,
        }),
        scope: None,
        limit_key: None,
    });
    for (i, plugin) in plugins.iter().enumerate() {
        // The last plugin gets the request itself; earlier ones a copy.
        let mut request = if i + 1 == plugins.len() {
            template.take()
        } else {
            template.clone()
        }
        .expect("taken only for the last plugin");
        if !plugin.spec.credentials {
            request
                .headers
                .retain(|(name, _)| !CREDENTIALS.contains(&name.as_str()));
        }
        request.scope.clone_from(&scope);
        request.limit_key.clone_from(&limit_key);
        let answer = match plugin.breaker.check(&plugin.name) {
            // Not called while its breaker is open: its on-error applies at once.
            Err(open) => Err(open),
            Ok(()) => {
                let started = Instant::now();
                let answer = plugin
                    .compiled
                    .extract(request)
                    .map_err(|failure| failure_error(&plugin.name, &failure))
                    .and_then(|outcome| checked(&plugin.name, outcome));
                plugin
                    .metrics
                    .record(&plugin.name, "extract", started.elapsed(), answer.is_err());
                if plugin.breaker.record(answer.is_err()) {
                    tracing::warn!(plugin = %plugin.name, "plugin keeps failing: its breaker is open (plugin-limits.breaker-failures, breaker-cooldown)");
                }
                answer
            }
        };
        match answer {
            Ok(types::Outcome::Keep) => {}
            Ok(types::Outcome::Set(set)) => {
                if set.scope.is_some() {
                    scope = set.scope;
                }
                if set.limit_key.is_some() {
                    limit_key = set.limit_key;
                }
            }
            Ok(types::Outcome::Reject(rejection)) => {
                return Ok(Extracted::Rejected {
                    status: rejection.status,
                    message: rejection.message,
                    plugin: plugin.name.clone(),
                });
            }
            Err(e) if plugin.spec.on_error == OnError::Skip => {
                tracing::warn!(plugin = %plugin.name, error = %e, "plugin failed; skipped (on-error = skip)");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Extracted::Classified { scope, limit_key })
}

/// The outcome, when what it sets is valid input (PLG0004 otherwise).
fn checked(plugin: &str, outcome: types::Outcome) -> Result<types::Outcome, CodedError> {
    let bad = |why: String| {
        CodedError::new(
            Code::PLG0004,
            format!("plugin '{plugin}' answered an invalid result: {why}"),
        )
    };
    match &outcome {
        types::Outcome::Set(set) => {
            if let Some(scope) = &set.scope {
                Scope::parse(scope).map_err(|e| bad(e.message))?;
            }
            if let Some(key) = &set.limit_key {
                LimitKey::parse(key).map_err(|e| bad(e.message))?;
            }
        }
        types::Outcome::Reject(rejection) if !(400..=599).contains(&rejection.status) => {
            return Err(bad(format!(
                "reject status {} is not 400-599",
                rejection.status
            )));
        }
        _ => {}
    }
    Ok(outcome)
}
