//! A typed client of the admin API for the CLI: the same shapes the server serialises.

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use sluice_core::errors::{AdminErrorBody, CodedError};

/// Where the admin API is, when no flag or `SLUICE_ADMIN_URL` says otherwise.
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9070";

/// Talks to one admin listener.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

/// A successful answer: its status and raw JSON (for `--json`).
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: StatusCode,
    /// Body as JSON (`null` when empty).
    pub json: serde_json::Value,
}

impl Answer {
    /// The body as a typed shape.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, CodedError> {
        serde_json::from_value(self.json.clone())
            .map_err(|e| CodedError::uncoded(format!("unexpected answer from the admin API: {e}")))
    }
}

impl AdminClient {
    /// A client of `base` sending the token of the environment: `SLUICE_ADMIN_TOKEN`, else the
    /// restate CLI's `RESTATE_AUTH_TOKEN`.
    pub fn from_env(base: &str) -> Self {
        let token = ["SLUICE_ADMIN_TOKEN", "RESTATE_AUTH_TOKEN"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|t| !t.is_empty()));
        Self::new(base, token)
    }

    /// A client of `base` (e.g. `http://127.0.0.1:9070`), sending `token` as a bearer token.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            token,
        }
    }

    /// Sends a request; admin errors come back with their code and message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Answer, CodedError> {
        let mut req = self.request(method, path);
        if let Some(body) = body {
            req = req.json(body);
        }
        self.send(req).await
    }

    /// Sends `bytes` as the body, of type `content_type`.
    pub async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        bytes: Vec<u8>,
        content_type: &str,
    ) -> Result<Answer, CodedError> {
        let req = self
            .request(method, path)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(bytes);
        self.send(req).await
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Posts `body` as JSON, asking for an answer of type `accept`, and answers the raw bytes
    /// of a successful answer (errors are read as the admin API's JSON error body).
    pub async fn post_raw(
        &self,
        path: &str,
        body: &impl Serialize,
        accept: &str,
    ) -> Result<bytes::Bytes, CodedError> {
        let req = self
            .request(Method::POST, path)
            .header(reqwest::header::ACCEPT, accept)
            .json(body);
        let (status, bytes) = self.exchange(req).await?;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(Self::refusal(status, &Self::json(&bytes)))
    }

    async fn exchange(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, bytes::Bytes), CodedError> {
        let resp = req.send().await.map_err(|e| {
            CodedError::uncoded(format!(
                "cannot reach the admin API at {}: {e}; is `sluice serve` running there? (set --admin-url or SLUICE_ADMIN_URL)",
                self.base
            ))
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| CodedError::uncoded(format!("cannot read the admin API's answer: {e}")))?;
        Ok((status, bytes))
    }

    fn json(bytes: &[u8]) -> serde_json::Value {
        if bytes.is_empty() {
            return serde_json::Value::Null;
        }
        serde_json::from_slice(bytes).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned())
        })
    }

    fn refusal(status: StatusCode, json: &serde_json::Value) -> CodedError {
        match serde_json::from_value::<AdminErrorBody>(json.clone()) {
            // The message already carries its `[CODE] ` prefix.
            Ok(body) => CodedError::uncoded(body.message),
            Err(_) => match json.get("message").and_then(|m| m.as_str()) {
                Some(message) => CodedError::uncoded(message.to_owned()),
                None => CodedError::uncoded(format!("the admin API answered {status}: {json}")),
            },
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Answer, CodedError> {
        let (status, bytes) = self.exchange(req).await?;
        let json = Self::json(&bytes);
        if status.is_success() {
            return Ok(Answer { status, json });
        }
        Err(Self::refusal(status, &json))
    }
}
