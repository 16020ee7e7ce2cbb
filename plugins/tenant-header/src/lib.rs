//! Scope from a tenant header, limit key from one or two more.

use std::sync::OnceLock;

use sluice_guest::{Classification, Outcome, Policy, Request, config, header, plugin, reject};

/// The config, read once per instance (it cannot change under a running instance: a new
/// config is a new load).
struct Settings {
    scope_header: String,
    l1_header: Option<String>,
    l2_header: Option<String>,
    require: bool,
}

fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| Settings {
        scope_header: config("scope-header").unwrap_or_else(|| "x-tenant".to_owned()),
        l1_header: config("l1-header"),
        l2_header: config("l2-header"),
        require: config("require").as_deref() == Some("true"),
    })
}

struct TenantHeader;

impl Policy for TenantHeader {
    fn extract(request: Request) -> Outcome {
        let settings = settings();
        let Some(tenant) = header(&request, &settings.scope_header) else {
            if settings.require {
                return reject(
                    400,
                    format!("missing tenant header '{}'", settings.scope_header),
                );
            }
            return Outcome::Keep;
        };
        let level = |name: &Option<String>| name.as_deref().and_then(|n| header(&request, n));
        let limit_key = match (level(&settings.l1_header), level(&settings.l2_header)) {
            (Some(l1), Some(l2)) => Some(format!("{l1}/{l2}")),
            (Some(l1), None) => Some(l1.to_owned()),
            (None, _) => None,
        };
        Outcome::Set(Classification {
            scope: Some(tenant.to_owned()),
            limit_key,
        })
    }
}

plugin!(TenantHeader);
