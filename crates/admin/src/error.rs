//! The admin error answer: `{"message": "[CODE] …", "restate_code": "CODE" | null}`, always JSON.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use sluice_core::errors::{AdminErrorBody, Code, CodedError};
use sluice_runtime::registry::RegistryError;

/// An admin failure with its HTTP status.
#[derive(Debug, Clone)]
pub struct AdminError {
    /// The status answered.
    pub status: StatusCode,
    /// Code and message.
    pub error: CodedError,
}

impl AdminError {
    /// A failure with a catalogue code, answered with the code's status.
    pub fn coded(code: Code, message: impl Into<String>) -> Self {
        Self {
            status: code.http_status(),
            error: CodedError::new(code, message),
        }
    }

    /// A failure with a catalogue code, answered with another status than the code's (a
    /// status the reference server answers for that case, such as 425 Too Early).
    pub fn with_status(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        Self {
            status,
            error: CodedError::new(code, message),
        }
    }
}

impl From<RegistryError> for AdminError {
    fn from(err: RegistryError) -> Self {
        match err {
            RegistryError::NotFound(message) => Self::coded(Code::ADM0003, message),
            RegistryError::Coded(error) => error.into(),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        (self.status, Json(AdminErrorBody::from(&self.error))).into_response()
    }
}
