//! The `extract` plugins' turn: before the scope and limit key are validated, the loaded
//! extract plugins may replace them or refuse the request.

use http::StatusCode;
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::error::IngressError;
use super::path::InvokePath;
use sluice_plugins::{ExtractRequest, Extracted};

/// Scope and limit key after the plugins (unchanged when none is loaded): `scope` is what the
/// request asks for once its API key had its say, `limit_key` what it names. The plugins run
/// on their own threads (`plugin-limits.threads`); the request awaits them, its shard serves
/// others meanwhile.
pub(super) async fn classify(
    state: &IngressState,
    session: &ServerSession,
    path: &InvokePath,
    scope: Option<String>,
    limit_key: Option<String>,
) -> Result<(Option<String>, Option<String>), IngressError> {
    let request = || {
        let header = session.req_header();
        let target = match path.rest.as_slice() {
            [handler] => Some((path.service.clone(), handler.clone(), None)),
            [key, handler] => Some((path.service.clone(), handler.clone(), Some(key.clone()))),
            _ => None,
        };
        ExtractRequest {
            method: header.method.as_str().to_owned(),
            path: header.uri.path().to_owned(),
            query: header.uri.query().map(str::to_owned),
            headers: header
                .headers
                .iter()
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .collect(),
            target,
            scope: scope.clone(),
            limit_key: limit_key.clone(),
        }
    };
    let Some(extracting) = state.plugins.extract(request) else {
        return Ok((scope, limit_key));
    };
    match extracting.await {
        Ok(Extracted::Classified { scope, limit_key }) => Ok((scope, limit_key)),
        Ok(Extracted::Rejected {
            status,
            message,
            plugin,
        }) => Err(IngressError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            code: Some(sluice_core::errors::Code::PLG0008),
            message: format!("refused by plugin '{plugin}': {message}"),
            retry_after_s: None,
        }),
        Err(e) => Err(IngressError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: e.code,
            message: e.message,
            retry_after_s: e.retry_after_s,
        }),
    }
}
