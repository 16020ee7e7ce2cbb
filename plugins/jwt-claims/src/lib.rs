//! Scope and limit key from the claims of a bearer JWT, its HS256 signature verified with a
//! configured secret; a bad signature, a malformed token or an expired one is answered 401.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use sluice_guest::{Classification, Outcome, Policy, Request, config, header, plugin, reject};

struct JwtClaims;

impl Policy for JwtClaims {
    fn extract(request: Request) -> Outcome {
        let token = header(&request, "authorization").and_then(|v| v.strip_prefix("Bearer "));
        let Some(token) = token else {
            if config("require").as_deref() == Some("false") {
                return Outcome::Keep;
            }
            return reject(401, "missing bearer token (Authorization: Bearer <jwt>)");
        };
        let Some(secret) = config("secret") else {
            return reject(500, "jwt-claims is loaded without a 'secret'");
        };
        let claims = match verify(token.trim(), secret.as_bytes()) {
            Ok(claims) => claims,
            Err(why) => return reject(401, format!("invalid token: {why}")),
        };
        let claim = |key: &str, default: &str| {
            let name = config(key).unwrap_or_else(|| default.to_owned());
            claims.get(&name).and_then(Value::as_str).map(str::to_owned)
        };
        Outcome::Set(Classification {
            scope: claim("scope-claim", "tenant"),
            limit_key: claim("limit-key-claim", "tier"),
        })
    }
}

/// The claims of `token` when its HS256 signature matches `secret` and it has not expired.
fn verify(token: &str, secret: &[u8]) -> Result<serde_json::Map<String, Value>, String> {
    let mut parts = token.split('.');
    let (Some(head), Some(body), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not three dot-separated parts".into());
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| "bad base64url".to_owned())
    };
    let header: Value = serde_json::from_slice(&decode(head)?).map_err(|_| "header is not JSON")?;
    if header.get("alg").and_then(Value::as_str) != Some("HS256") {
        return Err("only alg HS256 is accepted".into());
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| "bad secret")?;
    mac.update(head.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    // Constant-time comparison inside `verify_slice`.
    mac.verify_slice(&decode(signature)?)
        .map_err(|_| "bad signature")?;
    let claims: serde_json::Map<String, Value> =
        serde_json::from_slice(&decode(body)?).map_err(|_| "claims are not a JSON object")?;
    if let Some(exp) = claims.get("exp").and_then(Value::as_u64)
        && sluice_guest::now_ms() / 1000 >= exp
    {
        return Err("expired".into());
    }
    Ok(claims)
}

plugin!(JwtClaims);
