//! Who may use the admin listener: bearer tokens with a role, checked in constant time, and a
//! `Host` check against DNS rebinding. `GET /health` and `GET /ready` stay open so probes need
//! no secret.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, header};
use sha2::{Digest, Sha256};

use super::AdminError;
use sluice_config::{AdminConfig, AdminRole, AuthTokens, file_error};
use sluice_core::errors::{Code, CodedError};

/// The admin listener's access rules, built once at start-up.
#[derive(Debug, Default)]
pub struct AdminAuth {
    /// SHA-256 of each token with its role: comparing digests keeps the comparison's time
    /// independent of where a guess first differs, and of the token's length.
    tokens: Vec<([u8; 32], AdminRole)>,
    /// Host names answered besides IP addresses and `localhost`, lower-case.
    allowed_hosts: Vec<String>,
}

impl AdminAuth {
    /// The rules of `config`, with the tokens of `admin.auth-tokens-file` read now.
    pub fn from_config(config: &AdminConfig) -> Result<Self, CodedError> {
        let mut tokens = config.auth_tokens.0.clone();
        if let Some(path) = &config.auth_tokens_file {
            const KEY: &str = "admin.auth-tokens-file";
            let text = std::fs::read_to_string(path)
                .map_err(|e| file_error(KEY, path, format!("cannot read it: {e}")))?;
            let more = AuthTokens::parse_list(&text).map_err(|e| file_error(KEY, path, e))?;
            tokens.extend(more.0);
        }
        Ok(Self {
            tokens: tokens
                .iter()
                .map(|t| (digest(t.token.as_bytes()), t.role))
                .collect(),
            allowed_hosts: config
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        })
    }

    /// No token is configured: every request is let through (loopback only, or opted in).
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The role of `presented`, if it is one of the tokens. Every token is compared, and each
    /// comparison looks at every byte.
    fn role_of(&self, presented: &str) -> Option<AdminRole> {
        let wanted = digest(presented.as_bytes());
        let mut found = None;
        for (token, role) in &self.tokens {
            let diff = token
                .iter()
                .zip(wanted.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(*role);
            }
        }
        found
    }

    /// Whether `host` (a `Host` header or URI authority) is one this listener answers to.
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host);
        if name.is_empty() || name.parse::<IpAddr>().is_ok() || name == "localhost" {
            return true;
        }
        self.allowed_hosts.contains(&name)
    }

    /// Checks one request: the error to answer, or the request may go on.
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &http::HeaderMap,
        authority: Option<&str>,
    ) -> Result<(), AdminError> {
        // HTTP/2 names the host in `:authority` (the URI), HTTP/1.1 in `Host`: both are checked.
        let host = headers
            .get(header::HOST)
            .map(|host| host.to_str().unwrap_or_default());
        for named in host.into_iter().chain(authority) {
            if !self.host_allowed(named) {
                return Err(AdminError::coded(
                    Code::SEC0003,
                    format!(
                        "this admin listener does not answer to host '{}': add it to admin.allowed-hosts",
                        host_name(named)
                    ),
                ));
            }
        }
        // A browser page of another site may send simple requests (a body-less POST, a form) to
        // a local admin API without tokens; its `Origin` gives it away.
        if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
            && let Some(origin) = headers.get(header::ORIGIN)
        {
            let origin = origin.to_str().unwrap_or_default();
            let from = origin.split_once("://").map_or("", |(_, rest)| rest);
            let ours = host.or(authority).unwrap_or_default();
            if from.is_empty() || host_name(from) != host_name(ours) {
                return Err(AdminError::coded(
                    Code::SEC0003,
                    format!(
                        "a {method} from a page of another site ({origin}) is refused: the admin API takes changes only from its own pages and from clients that send no Origin"
                    ),
                ));
            }
        }
        let route = unversioned(path);
        let open_route = matches!(route, "/health" | "/ready") || super::dashboard::is_static(path);
        if self.is_open() || (open_route && *method == Method::GET) {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split_once(' ')
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            })
            .map(|(_, token)| token.trim());
        let Some(presented) = presented else {
            return Err(AdminError::coded(
                Code::SEC0001,
                "this admin API needs a token: send 'Authorization: Bearer <token>' (the CLI reads SLUICE_ADMIN_TOKEN)",
            ));
        };
        let Some(role) = self.role_of(presented) else {
            return Err(AdminError::coded(
                Code::SEC0001,
                "the bearer token matches none of the configured admin tokens",
            ));
        };
        let reads = matches!(*method, Method::GET | Method::HEAD)
            || (*method == Method::POST && route == "/query");
        if role == AdminRole::Read && !reads {
            return Err(AdminError::coded(
                Code::SEC0002,
                format!("a read token may not {method} {route}: it needs an admin token"),
            ));
        }
        Ok(())
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `host` without its port, lower-case; IPv6 literals keep no brackets.
fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `path` without a `/v2`…`/v4` prefix.
fn unversioned(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/v") else {
        return path;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest.as_bytes().get(digits) {
        Some(b'/') if digits > 0 => &rest[digits..],
        None if digits > 0 => "/",
        _ => path,
    }
}

/// The middleware: every admin request passes [`AdminAuth::check`] first.
pub async fn require(State(auth): State<Arc<AdminAuth>>, request: Request, next: Next) -> Response {
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    match auth.check(
        request.method(),
        request.uri().path(),
        request.headers(),
        authority.as_deref(),
    ) {
        Ok(()) => next.run(request).await,
        Err(error) => {
            let unauthenticated = error.error.code == Some(Code::SEC0001);
            let mut response = error.into_response();
            if unauthenticated {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-token-0123456789";
    const READ: &str = "read-token-0123456789";

    fn auth() -> AdminAuth {
        let config = AdminConfig {
            auth_tokens: AuthTokens::parse_list(&format!("admin:{ADMIN},read:{READ}")).unwrap(),
            allowed_hosts: vec!["Sluice.Example.com".into()],
            ..AdminConfig::default()
        };
        AdminAuth::from_config(&config).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    fn code(result: Result<(), AdminError>) -> Option<Code> {
        result.err().and_then(|e| e.error.code)
    }

    #[test]
    fn roles_decide_what_a_token_may_do() {
        let auth = auth();
        let admin = headers(&[("authorization", &format!("Bearer {ADMIN}"))]);
        let read = headers(&[("authorization", &format!("bearer {READ}"))]);
        assert_eq!(
            code(auth.check(&Method::PUT, "/limits/rules", &admin, None)),
            None
        );
        assert_eq!(
            code(auth.check(&Method::GET, "/v4/deployments", &read, None)),
            None
        );
        assert_eq!(
            code(auth.check(&Method::POST, "/v2/query", &read, None)),
            None
        );
        assert_eq!(
            code(auth.check(&Method::PUT, "/limits/rules", &read, None)),
            Some(Code::SEC0002)
        );
        assert_eq!(
            code(auth.check(&Method::POST, "/deployments", &read, None)),
            Some(Code::SEC0002)
        );
        assert_eq!(
            code(auth.check(&Method::GET, "/version", &headers(&[]), None)),
            Some(Code::SEC0001)
        );
        let wrong = headers(&[("authorization", "Bearer admin-token-0123456780")]);
        assert_eq!(
            code(auth.check(&Method::GET, "/version", &wrong, None)),
            Some(Code::SEC0001)
        );
        let basic = headers(&[("authorization", &format!("Basic {ADMIN}"))]);
        assert_eq!(
            code(auth.check(&Method::GET, "/version", &basic, None)),
            Some(Code::SEC0001)
        );
        assert_eq!(
            code(auth.check(&Method::GET, "/health", &headers(&[]), None)),
            None
        );
        assert_eq!(
            code(auth.check(&Method::GET, "/v3/health", &headers(&[]), None)),
            None
        );
        assert_eq!(
            code(auth.check(&Method::POST, "/health", &headers(&[]), None)),
            Some(Code::SEC0001)
        );
    }

    #[test]
    fn hosts_must_be_addresses_localhost_or_listed() {
        let auth = AdminAuth::default();
        for ok in [
            "127.0.0.1:9070",
            "localhost:9070",
            "[::1]:9070",
            "10.1.2.3",
            "LOCALHOST.",
        ] {
            assert_eq!(
                code(auth.check(&Method::GET, "/version", &headers(&[("host", ok)]), None)),
                None,
                "{ok}"
            );
        }
        assert_eq!(
            code(auth.check(
                &Method::GET,
                "/version",
                &headers(&[("host", "evil.example:9070")]),
                None
            )),
            Some(Code::SEC0003)
        );
        let listed = self::auth();
        let h = headers(&[
            ("host", "sluice.example.com:443"),
            ("authorization", &format!("Bearer {ADMIN}")),
        ]);
        assert_eq!(code(listed.check(&Method::GET, "/version", &h, None)), None);
        // HTTP/2 names the host in `:authority`, not `Host`.
        assert_eq!(
            code(auth.check(
                &Method::GET,
                "/version",
                &headers(&[]),
                Some("evil.example:9070")
            )),
            Some(Code::SEC0003)
        );
    }

    #[test]
    fn changes_from_another_site_s_pages_are_refused() {
        let open = AdminAuth::from_config(&AdminConfig::default()).unwrap();
        let from = |origin: &str| headers(&[("host", "127.0.0.1:9070"), ("origin", origin)]);
        // A page elsewhere posting a body-less request to a local admin API without tokens.
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1.evil.example:9070",
        ] {
            assert_eq!(
                code(open.check(&Method::POST, "/deployments", &from(origin), None)),
                Some(Code::SEC0003),
                "{origin}"
            );
        }
        // The dashboard (same origin), clients that send no Origin, and reads pass.
        let same = from("http://127.0.0.1:9070");
        assert_eq!(code(open.check(&Method::POST, "/query", &same, None)), None);
        let cli = headers(&[("host", "127.0.0.1:9070")]);
        assert_eq!(
            code(open.check(&Method::POST, "/deployments", &cli, None)),
            None
        );
        let read = from("http://evil.example");
        assert_eq!(
            code(open.check(&Method::GET, "/version", &read, None)),
            None
        );
    }

    #[test]
    fn version_prefixes_are_stripped_only_when_they_are_one() {
        assert_eq!(unversioned("/v4/query"), "/query");
        assert_eq!(unversioned("/v2"), "/");
        assert_eq!(unversioned("/version"), "/version");
        assert_eq!(unversioned("/v/query"), "/v/query");
    }
}
