//! `/plugins`: load (or hot-swap), list and unload policy plugins.

use std::collections::HashMap;
use std::sync::Arc;

use super::extract::{Path, Query};
use axum::extract::State;
use bytes::Bytes;
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
pub use sluice_api::plugins::{ListPluginsResponse, PluginResponse};
use sluice_core::errors::Code;
use sluice_plugins::{Hook, OnError, Plugin, PluginSpec, Source};

/// How the admin API shows `Plugin`.
pub fn plugin_response(plugin: &Plugin) -> PluginResponse {
    PluginResponse {
        name: plugin.name.clone(),
        hook: plugin.spec.hook.to_string(),
        on_error: plugin.spec.on_error.to_string(),
        sha256: plugin.sha256.clone(),
        size: plugin.size,
        source: plugin.source.name().to_owned(),
        deadline_ms: u64::try_from(plugin.spec.deadline.0.as_millis()).unwrap_or(u64::MAX),
        memory_limit: plugin.spec.memory_limit.0,
        fuel: plugin.spec.fuel,
        config: plugin.spec.config.clone(),
        credentials: plugin.spec.credentials,
        loaded_at_millis_since_epoch: plugin.loaded_at_ms,
        metrics: plugin.metrics.snapshot(),
    }
}

/// The spec a `PUT` describes in its query: `hook` (required), `on-error`, `deadline`,
/// `memory-limit`, `fuel`, `credentials`, and `config.<key>=<value>` for each config entry.
fn spec_of(
    query: &HashMap<String, String>,
    limits: &sluice_config::PluginLimits,
) -> Result<PluginSpec, AdminError> {
    let bad = |m: String| AdminError::coded(Code::PLG0001, m);
    let hook: Hook = query
        .get("hook")
        .ok_or_else(|| {
            bad("say which hook the plugin serves: ?hook=extract or ?hook=match-rule".into())
        })?
        .parse()
        .map_err(bad)?;
    let mut spec = PluginSpec::new(hook);
    for (key, value) in query {
        match key.as_str() {
            "hook" => {}
            "on-error" => spec.on_error = value.parse::<OnError>().map_err(bad)?,
            "deadline" => {
                spec.deadline = value
                    .parse()
                    .map_err(|e| bad(format!("invalid deadline '{value}': {e}")))?;
            }
            "memory-limit" => {
                spec.memory_limit = value
                    .parse()
                    .map_err(|e| bad(format!("invalid memory-limit '{value}': {e}")))?;
            }
            "fuel" => {
                spec.fuel = Some(value.parse().map_err(|_| {
                    bad(format!("invalid fuel '{value}': a whole number of units"))
                })?);
            }
            "credentials" => {
                spec.credentials = value
                    .parse()
                    .map_err(|_| bad(format!("invalid credentials '{value}': true or false")))?;
            }
            other => match other.strip_prefix("config.") {
                Some(name) if !name.is_empty() => {
                    spec.config.insert(name.to_owned(), value.clone());
                }
                _ => {
                    return Err(bad(format!(
                        "unknown parameter '{other}': use hook, on-error, deadline, memory-limit, fuel, credentials or config.<key>"
                    )));
                }
            },
        }
    }
    if spec.deadline.0.is_zero() {
        return Err(bad("deadline must be more than 0".into()));
    }
    if spec.deadline > limits.max_deadline {
        return Err(bad(format!(
            "deadline {} is over the server's maximum of {} (plugin-limits.max-deadline)",
            spec.deadline, limits.max_deadline
        )));
    }
    if spec.memory_limit > limits.max_memory {
        return Err(bad(format!(
            "memory-limit {} is over the server's maximum of {} (plugin-limits.max-memory)",
            spec.memory_limit, limits.max_memory
        )));
    }
    if spec.fuel.is_some_and(|f| f > limits.max_fuel) {
        return Err(bad(format!(
            "fuel is over the server's maximum of {} (plugin-limits.max-fuel)",
            limits.max_fuel
        )));
    }
    Ok(spec)
}

/// Loads plugin `name` from the wasm component in the body, or swaps it atomically (calls in
/// flight finish on the old version). On any error the old version stays.
#[utoipa::path(put, path = "/plugins/{name}", tag = "plugins", operation_id = "load_plugin",
    params(("name" = String, Path, description = "Plugin name"),
        ("hook" = String, Query, description = "`extract` or `match-rule`"),
        ("on-error" = Option<String>, Query, description = "`fail` (default) or `skip`"),
        ("deadline" = Option<String>, Query, description = "Per-call deadline, e.g. `10ms`"),
        ("memory-limit" = Option<String>, Query, description = "Memory cap, e.g. `16 MiB`"),
        ("fuel" = Option<u64>, Query, description = "Fuel per call"),
        ("credentials" = Option<bool>, Query, description = "`true`: an extract plugin also sees `x-sluice-api-key` and `authorization` (default `false`)")),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 200, body = PluginResponse), (status = 400, description = "PLG0001: not loadable; the old version stays."),
        (status = 409, description = "PLG0007: a config-file plugin, or a second match-rule plugin.")))]
pub async fn load(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Body,
) -> Result<Json<PluginResponse>, AdminError> {
    let spec = spec_of(&query, &state.config.plugin_limits)?;
    // Read here, not through the listener's default body limit (2 MiB): a plugin carrying a
    // language runtime is tens of MiB.
    let max = state.config.plugin_limits.max_size;
    let body = read_capped(body, max.as_usize()).await.map_err(|e| {
        AdminError::coded(
            Code::PLG0009,
            format!(
                "the plugin could not be read whole ({e}): the largest taken is plugin-limits.max-size ({max})"
            ),
        )
    })?;
    if body.is_empty() {
        return Err(AdminError::coded(
            Code::PLG0001,
            "the body is empty: send the plugin's .wasm component as the request body",
        ));
    }
    let plugins = Arc::clone(&state.plugins);
    // Compiling takes milliseconds to seconds: off the async threads.
    let plugin =
        tokio::task::spawn_blocking(move || plugins.load(&name, &body, spec, Source::Admin))
            .await
            .map_err(|e| AdminError::coded(Code::ADM0007, format!("plugin load stopped: {e}")))??;
    Ok(Json(plugin_response(&plugin)))
}

/// How long, and how many bytes past the cap, the rest of a refused body is read and dropped
/// before the refusal is answered. Closing a socket with unread bytes in it resets the
/// connection, and a client still sending sees a broken pipe instead of the 413 that says what
/// to fix; a client sending far more than this sees the reset.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);
const DRAIN_BYTES: usize = 64 << 20;

/// The body whole if it is at most `max` bytes; otherwise why not, after draining the rest
/// (bounded by [`DRAIN_BYTES`] and [`DRAIN_TIME`]).
async fn read_capped(body: axum::body::Body, max: usize) -> Result<Bytes, String> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut taken = bytes::BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("the body broke off: {e}"))?;
        if taken.len() + chunk.len() > max {
            let mut seen = taken.len() + chunk.len();
            drop(taken);
            let drain = async {
                while let Some(Ok(chunk)) = stream.next().await {
                    seen += chunk.len();
                    if seen > max + DRAIN_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(format!("it is over {max} bytes"));
        }
        taken.extend_from_slice(&chunk);
    }
    Ok(taken.freeze())
}

/// Every plugin, in the order they run, with its metrics.
#[utoipa::path(get, path = "/plugins", tag = "plugins", operation_id = "list_plugins",
    responses((status = 200, body = ListPluginsResponse)))]
pub async fn list(State(state): State<Arc<AdminState>>) -> Json<ListPluginsResponse> {
    let loaded = state.plugins.current();
    Json(ListPluginsResponse {
        plugins: loaded.all.iter().map(|p| plugin_response(p)).collect(),
    })
}

/// One plugin.
#[utoipa::path(get, path = "/plugins/{name}", tag = "plugins", operation_id = "get_plugin",
    params(("name" = String, Path, description = "Plugin name")),
    responses((status = 200, body = PluginResponse), (status = 404, description = "PLG0006")))]
pub async fn get(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Json<PluginResponse>, AdminError> {
    let plugin = state.plugins.get(&name).ok_or_else(|| {
        AdminError::coded(Code::PLG0006, format!("no plugin named '{name}' is loaded"))
    })?;
    Ok(Json(plugin_response(&plugin)))
}

/// Unloads a plugin loaded through this API.
#[utoipa::path(delete, path = "/plugins/{name}", tag = "plugins", operation_id = "unload_plugin",
    params(("name" = String, Path, description = "Plugin name")),
    responses((status = 204), (status = 404, description = "PLG0006"), (status = 409, description = "PLG0007: from the config file")))]
pub async fn unload(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, AdminError> {
    state.plugins.unload(&name)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_query_describes_the_spec() {
        let limits = sluice_config::PluginLimits::default();
        let spec = spec_of(
            &query(&[
                ("hook", "match-rule"),
                ("on-error", "skip"),
                ("deadline", "25ms"),
                ("memory-limit", "8 MiB"),
                ("fuel", "1000"),
                ("config.premium", "a,b"),
            ]),
            &limits,
        )
        .unwrap();
        assert_eq!(spec.hook, Hook::MatchRule);
        assert_eq!(spec.on_error, OnError::Skip);
        assert_eq!(spec.deadline.0, std::time::Duration::from_millis(25));
        assert_eq!(spec.memory_limit.0, 8 << 20);
        assert_eq!(spec.fuel, Some(1000));
        assert_eq!(spec.config["premium"], "a,b");
        let defaults = spec_of(&query(&[("hook", "extract")]), &limits).unwrap();
        assert_eq!(defaults, PluginSpec::new(Hook::Extract));
    }

    #[test]
    fn bad_queries_say_what_to_fix() {
        let limits = sluice_config::PluginLimits::default();
        let refused =
            |pairs: &[(&str, &str)]| spec_of(&query(pairs), &limits).unwrap_err().error.message;
        assert!(refused(&[]).contains("?hook=extract"));
        assert!(refused(&[("hook", "x")]).contains("unknown hook 'x'"));
        assert!(
            refused(&[("hook", "extract"), ("on-error", "maybe")]).contains("'fail' or 'skip'")
        );
        assert!(refused(&[("hook", "extract"), ("deadline", "soon")]).contains("invalid deadline"));
        assert!(refused(&[("hook", "extract"), ("deadline", "0ms")]).contains("more than 0"));
        assert!(refused(&[("hook", "extract"), ("fuel", "-1")]).contains("invalid fuel"));
        assert!(
            refused(&[("hook", "extract"), ("deadline", "1h")])
                .contains("plugin-limits.max-deadline")
        );
        assert!(
            refused(&[("hook", "extract"), ("memory-limit", "4 GiB")])
                .contains("plugin-limits.max-memory")
        );
        assert!(
            refused(&[("hook", "extract"), ("fuel", "99999999999999")])
                .contains("plugin-limits.max-fuel")
        );
        assert!(
            refused(&[("hook", "extract"), ("colour", "red")])
                .contains("unknown parameter 'colour'")
        );
        assert!(refused(&[("hook", "extract"), ("config.", "x")]).contains("unknown parameter"));
    }
}
