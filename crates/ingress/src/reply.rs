//! Building ingress answers: JSON bodies, the error shape and its headers.

use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use sluice_core::errors::{Code, ErrorSource, IngressErrorBody};

/// Header naming who produced an error (`ingress` or `invocation`).
pub const ERROR_SOURCE_HEADER: &str = "x-service-error-source";
/// Header carrying the catalogue code of an error.
pub const ERROR_CODE_HEADER: &str = "x-service-error-code";

/// A response with `body` serialized as JSON.
pub fn json(status: StatusCode, body: &impl Serialize) -> Response<Vec<u8>> {
    let bytes = serde_json::to_vec(body).expect("reply bodies serialize");
    bytes_with_type(status, bytes, HeaderValue::from_static("application/json"))
}

/// A response with raw bytes; pingora needs the length set to keep the connection reusable.
pub fn bytes_with_type(
    status: StatusCode,
    body: Vec<u8>,
    content_type: HeaderValue,
) -> Response<Vec<u8>> {
    let length = HeaderValue::from(body.len());
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CONTENT_LENGTH, length);
    resp
}

/// The ingress error answer, with its source header and, when coded, the code header.
pub fn error(
    status: StatusCode,
    code: Option<Code>,
    source: ErrorSource,
    message: &str,
) -> Response<Vec<u8>> {
    let body = IngressErrorBody {
        code: status.as_u16(),
        message,
        error_code: code,
        source,
    };
    let mut resp = json(status, &body);
    let headers = resp.headers_mut();
    headers.insert(
        ERROR_SOURCE_HEADER,
        HeaderValue::from_static(source.as_str()),
    );
    if let Some(code) = code {
        headers.insert(ERROR_CODE_HEADER, HeaderValue::from_static(code.as_str()));
    }
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        // Held invocations drain at the pace of their limits, and a partition that stopped
        // here (a failover, brokers refusing writes) is led again within seconds: a second is
        // a fair first wait. A refusal that knows better sets its own.
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// An error raised by the ingress itself with a catalogue code; status from the catalogue.
pub fn coded(code: Code, message: &str) -> Response<Vec<u8>> {
    error(
        code.http_status(),
        Some(code),
        ErrorSource::Ingress,
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coded_errors_carry_both_headers() {
        let resp = coded(Code::RT0024, "invalid scope 'a:b'");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(resp.headers()[ERROR_CODE_HEADER], "RT0024");
        assert_eq!(resp.headers()[ERROR_SOURCE_HEADER], "ingress");
        assert_eq!(
            resp.headers()[header::CONTENT_LENGTH],
            resp.body().len().to_string().as_str()
        );
        let body: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(body["error_code"], "RT0024");
        assert_eq!(body["code"], 400);
    }

    #[test]
    fn uncoded_errors_have_no_code_header() {
        let resp = error(
            StatusCode::NOT_FOUND,
            None,
            ErrorSource::Ingress,
            "not found",
        );
        assert!(resp.headers().get(ERROR_CODE_HEADER).is_none());
        let body: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(body["error_code"], serde_json::Value::Null);
    }
}
