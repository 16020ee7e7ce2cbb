//! Scope from a tenant header, limit key from one or two more.

use sluice_guest::{Classification, Outcome, Policy, Request, config, header, plugin, reject};

struct TenantHeader;

impl Policy for TenantHeader {
    fn extract(request: Request) -> Outcome {
        let scope_header = config("scope-header").unwrap_or_else(|| "x-tenant".to_owned());
        let Some(tenant) = header(&request, &scope_header) else {
            if config("require").as_deref() == Some("true") {
                return reject(400, format!("missing tenant header '{scope_header}'"));
            }
            return Outcome::Keep;
        };
        let level =
            |key: &str| config(key).and_then(|name| header(&request, &name).map(str::to_owned));
        let limit_key = match (level("l1-header"), level("l2-header")) {
            (Some(l1), Some(l2)) => Some(format!("{l1}/{l2}")),
            (Some(l1), None) => Some(l1),
            (None, _) => None,
        };
        Outcome::Set(Classification {
            scope: Some(tenant.to_owned()),
            limit_key,
        })
    }
}

plugin!(TenantHeader);
