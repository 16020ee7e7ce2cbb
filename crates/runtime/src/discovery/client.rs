//! `GET {uri}/discover`: HTTP/2 with prior knowledge for `http://` deployments, HTTP/1.1 when
//! registered with `use_http_11`. Failures map to META codes; transient ones are retried.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode, Version, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::excerpt::excerpt;
use super::manifest::{MANIFEST_CONTENT_TYPES, Manifest, ProtocolMode};
use crate::deployment_tls::{Connector, DeploymentTls};
use sluice_core::errors::{Code, CodedError};

/// Largest manifest read.
const MAX_MANIFEST_BYTES: usize = 16 * 1024 * 1024;

/// What to discover.
#[derive(Debug, Clone)]
pub struct DiscoveryRequest {
    /// The deployment's base URI (`http://host:port/prefix`).
    pub uri: url::Url,
    /// Sent with the request (and later with every invocation).
    pub additional_headers: BTreeMap<String, String>,
    /// Speak HTTP/1.1 instead of HTTP/2.
    pub use_http_11: bool,
}

/// The HTTP version a deployment was discovered over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/2 (prior knowledge over plain TCP).
    Http2,
    /// HTTP/1.1.
    Http11,
}

/// A successful discovery.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// The validated manifest.
    pub manifest: Manifest,
    /// Manifest format version (1–4) from the content type.
    pub manifest_version: u8,
    /// The HTTP version used.
    pub http_version: HttpVersion,
    /// `x-restate-server`, when sent.
    pub sdk_version: Option<String>,
}

/// Fetches manifests; one per process is enough (it pools connections).
#[derive(Debug, Clone)]
pub struct DiscoveryClient {
    h2: Client<Connector, Empty<Bytes>>,
    h1: Client<Connector, Empty<Bytes>>,
    attempts: u32,
    backoff: Duration,
    timeout: Duration,
}

impl Default for DiscoveryClient {
    fn default() -> Self {
        Self::new(ATTEMPTS, BACKOFF, TIMEOUT)
    }
}

/// Tries of one discovery.
pub const ATTEMPTS: u32 = 3;
/// Wait before the second try (doubling after).
pub const BACKOFF: Duration = Duration::from_millis(200);
/// Longest one try may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Why one attempt failed, and whether another may succeed.
enum Failure {
    Retry(CodedError),
    Final(CodedError),
}

fn unreachable(url: &str, why: impl std::fmt::Display) -> CodedError {
    CodedError::new(Code::META0003, format!("error when calling '{url}': {why}"))
}

/// An error with its causes, outermost first: hyper's own text ("client error (Connect)")
/// hides the reason a person can act on (refused, unknown certificate issuer, …).
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl DiscoveryClient {
    /// A client making up to `attempts` tries, `backoff` apart (doubling), each within `timeout`.
    pub fn new(attempts: u32, backoff: Duration, timeout: Duration) -> Self {
        Self::with_tls(&DeploymentTls::default(), attempts, backoff, timeout)
    }

    /// [`DiscoveryClient::new`], trusting what `tls` trusts for `https://` deployments.
    pub fn with_tls(
        tls: &DeploymentTls,
        attempts: u32,
        backoff: Duration,
        timeout: Duration,
    ) -> Self {
        Self {
            h2: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(tls.connector(Some(timeout), true)),
            h1: Client::builder(TokioExecutor::new()).build(tls.connector(Some(timeout), false)),
            attempts: attempts.max(1),
            backoff,
            timeout,
        }
    }

    /// Discovers a deployment.
    pub async fn discover(&self, req: &DiscoveryRequest) -> Result<Discovered, CodedError> {
        let url = discover_url(&req.uri)?;
        let mut delay = self.backoff;
        let mut attempt = 1;
        loop {
            match self.attempt(req, &url).await {
                Ok(found) => return Ok(found),
                Err(Failure::Retry(err)) if attempt < self.attempts => {
                    tracing::debug!(%url, attempt, error = %err, "discovery failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
                Err(Failure::Retry(err) | Failure::Final(err)) => return Err(err),
            }
        }
    }

    async fn attempt(&self, req: &DiscoveryRequest, url: &str) -> Result<Discovered, Failure> {
        let request = build_request(req, url).map_err(Failure::Final)?;
        let client = if req.use_http_11 { &self.h1 } else { &self.h2 };
        let response = match tokio::time::timeout(self.timeout, client.request(request)).await {
            Err(_) => {
                let why = format!("no answer within {:?}", self.timeout);
                return Err(Failure::Retry(unreachable(url, why)));
            }
            Ok(Err(e)) if e.is_connect() => {
                return Err(Failure::Retry(unreachable(url, chain(&e))));
            }
            Ok(Err(e)) if !req.use_http_11 && self.speaks_http11(req, url).await => {
                return Err(Failure::Final(CodedError::new(
                    Code::META0014,
                    format!(
                        "error when calling '{url}' over HTTP/2: {}; the server possibly supports only HTTP/1.1: register it with use_http_11 (CLI --use-http1.1)",
                        chain(&e)
                    ),
                )));
            }
            Ok(Err(e)) => return Err(Failure::Retry(unreachable(url, chain(&e)))),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let http_version = if response.version() == Version::HTTP_2 {
            HttpVersion::Http2
        } else {
            HttpVersion::Http11
        };
        let headers = response.headers().clone();
        let body = Limited::new(response.into_body(), MAX_MANIFEST_BYTES)
            .collect()
            .await
            .map_err(|e| Failure::Retry(unreachable(url, format!("cannot read the body: {e}"))))?
            .to_bytes();
        if !status.is_success() {
            return Err(status_failure(url, status, &body));
        }
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let Some(version) = MANIFEST_CONTENT_TYPES
            .iter()
            .position(|t| *t == content_type)
        else {
            return Err(Failure::Final(CodedError::new(
                Code::META0013,
                format!(
                    "received a bad response from the SDK: content type '{content_type}' is not an endpoint manifest type (expected application/vnd.restate.endpointmanifest.v1..v4+json); check that the URI points at the SDK endpoint"
                ),
            )));
        };
        let manifest = Manifest::parse(&body).map_err(Failure::Final)?;
        if manifest.protocol_mode == Some(ProtocolMode::BidiStream)
            && http_version == HttpVersion::Http11
        {
            return Err(Failure::Final(CodedError::new(
                Code::META0015,
                "the SDK reports itself as being in bidirectional protocol mode, but it was discovered over HTTP/1.1, which cannot carry it: serve it over HTTP/2 (register without use_http_11) or configure the SDK for request/response mode",
            )));
        }
        let sdk_version = headers
            .get("x-restate-server")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Discovered {
            manifest,
            manifest_version: u8::try_from(version + 1).expect("at most 4"),
            http_version,
            sdk_version,
        })
    }

    /// Whether the endpoint answers HTTP/1.1, after HTTP/2 with prior knowledge failed on it.
    async fn speaks_http11(&self, req: &DiscoveryRequest, url: &str) -> bool {
        let Ok(request) = build_request(req, url) else {
            return false;
        };
        matches!(
            tokio::time::timeout(self.timeout, self.h1.request(request)).await,
            Ok(Ok(_))
        )
    }
}

fn status_failure(url: &str, status: StatusCode, body: &[u8]) -> Failure {
    if status == StatusCode::NOT_FOUND {
        return Failure::Final(unreachable(
            url,
            "got status code '404'. Make sure the provided URI has the correct path: the SDK must serve /discover under it",
        ));
    }
    let err = unreachable(
        url,
        format!(
            "got status code '{}'. Body: {}",
            status.as_u16(),
            excerpt(body)
        ),
    );
    match status.as_u16() {
        408 | 429 | 500 | 502 | 503 | 504 => Failure::Retry(err),
        _ => Failure::Final(err),
    }
}

/// `{uri}/discover`, keeping the URI's own path as prefix and its query.
pub fn discover_url(uri: &url::Url) -> Result<String, CodedError> {
    match uri.scheme() {
        "http" | "https" => {}
        other => {
            return Err(CodedError::new(
                Code::META0003,
                format!("cannot reach '{uri}': scheme '{other}' is not http or https"),
            ));
        }
    }
    let mut url = uri.clone();
    let path = format!("{}/discover", uri.path().trim_end_matches('/'));
    url.set_path(&path);
    Ok(url.to_string())
}

fn build_request(req: &DiscoveryRequest, url: &str) -> Result<Request<Empty<Bytes>>, CodedError> {
    let mut builder = Request::get(url).header(header::ACCEPT, MANIFEST_CONTENT_TYPES.join(", "));
    if req.use_http_11 {
        builder = builder.version(Version::HTTP_11);
    }
    for (name, value) in &req.additional_headers {
        let name = HeaderName::try_from(name.as_str()).map_err(|e| {
            CodedError::new(
                Code::META0003,
                format!("invalid additional header name '{name}': {e}"),
            )
        })?;
        let value = HeaderValue::try_from(value.as_str()).map_err(|e| {
            CodedError::new(
                Code::META0003,
                format!("invalid value of additional header '{name}': {e}"),
            )
        })?;
        builder = builder.header(name, value);
    }
    builder
        .body(Empty::new())
        .map_err(|e| unreachable(url, format!("cannot build the request: {e}")))
}

#[cfg(test)]
mod tests;
