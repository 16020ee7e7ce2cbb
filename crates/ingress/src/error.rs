//! An ingress rejection: status, optional catalogue code, message; answered in the ingress shape.

use http::{Response, StatusCode};

use super::reply;
use sluice_core::errors::{Code, ErrorSource};

/// Why the ingress refuses a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressError {
    /// HTTP status.
    pub status: StatusCode,
    /// Catalogue code, when one applies.
    pub code: Option<Code>,
    /// What to fix.
    pub message: String,
    /// For a 429: when to try again, seconds (`Retry-After`; 1 when not known).
    pub retry_after_s: Option<u64>,
}

impl IngressError {
    /// 400 ING0001: the request cannot be read as the route takes it.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::coded(Code::ING0001, message)
    }

    /// 405 ING0004.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::coded(Code::ING0004, message)
    }

    /// 404 ING0002: no invocation matches what the request names.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::coded(Code::ING0002, message)
    }

    /// With a catalogue code and its status.
    pub fn coded(code: Code, message: impl Into<String>) -> Self {
        Self {
            status: code.http_status(),
            code: Some(code),
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// The answer in the ingress error shape.
    pub fn into_response(self) -> Response<Vec<u8>> {
        let mut resp = reply::error(self.status, self.code, ErrorSource::Ingress, &self.message);
        if let Some(secs) = self.retry_after_s
            && let Ok(value) = http::HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(http::header::RETRY_AFTER, value);
        }
        resp
    }
}

impl From<sluice_core::errors::CodedError> for IngressError {
    /// Answers with the code's own status (STO0001: 503).
    fn from(e: sluice_core::errors::CodedError) -> Self {
        Self {
            status: e
                .code
                .map_or(StatusCode::SERVICE_UNAVAILABLE, Code::http_status),
            code: e.code,
            message: e.message,
            retry_after_s: e.retry_after_s,
        }
    }
}
