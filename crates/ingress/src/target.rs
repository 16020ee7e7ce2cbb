//! Resolving an invocation path against the registry: service, key and handler, with the
//! handler's input and output rules.

use super::error::IngressError;
use super::path::InvokePath;
use sluice_core::errors::Code;
use sluice_core::ids::DeploymentId;
use sluice_runtime::discovery::manifest::{InputRules, OutputRules};
use sluice_runtime::discovery::{HandlerType, ServiceType};
use sluice_runtime::registry::Registry;

/// A resolved handler to invoke.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Service name.
    pub service: String,
    /// Service type.
    pub service_type: ServiceType,
    /// Object or workflow key (keyed services only).
    pub key: Option<String>,
    /// Handler name.
    pub handler: String,
    /// Handler type (`None` for plain services).
    pub handler_type: Option<HandlerType>,
    /// What input the handler accepts.
    pub input: Option<InputRules>,
    /// What output it gives.
    pub output: Option<OutputRules>,
    /// Deployment of the service's latest revision.
    pub deployment: DeploymentId,
}

/// Whether a service is closed to the ingress: the admin API's override, else its manifest.
fn is_private(
    service: &sluice_runtime::registry::Service,
    options: &sluice_runtime::discovery::manifest::Options,
) -> bool {
    service
        .overrides
        .public
        .map(|public| !public)
        .unwrap_or(options.ingress_private.unwrap_or(false))
}

/// The services the ingress serves (what `/restate/health` lists): private ones are nobody's
/// business outside.
pub fn public_services(registry: &Registry) -> Vec<String> {
    registry
        .services()
        .into_iter()
        .filter(|(service, deployment)| {
            deployment
                .service(&service.name)
                .is_some_and(|manifest| !is_private(service, &manifest.options))
        })
        .map(|(service, _)| service.name.clone())
        .collect()
}

/// Resolves `path` to the latest registered revision of its service.
pub fn resolve(path: &InvokePath, registry: &Registry) -> Result<Target, IngressError> {
    let (service, deployment) = registry.service(&path.service).map_err(|_| {
        IngressError::coded(
            Code::RT0018,
            format!(
                "service '{}' not found, make sure to register the service before calling it",
                path.service
            ),
        )
    })?;
    let keyed = service.service_type_is_keyed();
    let (key, handler) = match (keyed, path.rest.as_slice()) {
        (false, [handler]) => (None, handler.clone()),
        (true, [key, handler]) => (Some(key.clone()), handler.clone()),
        _ => {
            return Err(IngressError::bad_request(format!(
                "bad path: '{}' is a {:?}, expected {}",
                path.service,
                service.ty,
                if keyed {
                    "/:object-name/:object-key/:handler (with a key)"
                } else {
                    "/:service-name/:handler (without a key)"
                }
            )));
        }
    };
    let manifest = deployment.service(&path.service).ok_or_else(|| {
        IngressError::coded(
            Code::RT0018,
            format!(
                "service '{}' has no definition on its deployment {}",
                path.service, deployment.id
            ),
        )
    })?;
    let Some(h) = manifest.handlers.iter().find(|h| h.name == handler) else {
        return Err(IngressError::coded(
            Code::RT0018,
            format!(
                "the service '{}' exists, but the handler '{handler}' was not found, check that the handler exists in the latest registered service version",
                path.service
            ),
        ));
    };
    if is_private(&service, &manifest.options) || h.options.ingress_private.unwrap_or(false) {
        return Err(IngressError::bad_request(format!(
            "the invoked service '{}' (handler '{handler}') is not public: only other handlers may call it",
            path.service
        )));
    }
    Ok(Target {
        service: path.service.clone(),
        service_type: service.ty,
        key,
        handler_type: h.effective_type(service.ty),
        handler,
        input: h.input.clone(),
        output: h.output.clone(),
        deployment: deployment.id,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::StatusCode;

    use super::*;
    use crate::path::Mode;
    use sluice_runtime::discovery::manifest::Manifest;
    use sluice_runtime::discovery::{Discovered, HttpVersion};
    use sluice_runtime::registry::Registration;
    use sluice_store::storage::Store;

    fn registry() -> (Registry, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let registry = Registry::load(store).unwrap();
        let manifest = Manifest::parse(
            serde_json::json!({
                "protocolMode": "BIDI_STREAM", "minProtocolVersion": 5, "maxProtocolVersion": 7,
                "services": [
                    {"name": "Greeter", "ty": "SERVICE", "handlers": [
                        {"name": "greet", "input": {"contentType": "application/json", "required": true}},
                        {"name": "internal", "ingressPrivate": true}
                    ]},
                    {"name": "Counter", "ty": "VIRTUAL_OBJECT", "handlers": [{"name": "add"}, {"name": "get", "ty": "SHARED"}]}
                ]
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let found = Discovered {
            manifest,
            manifest_version: 3,
            http_version: HttpVersion::Http2,
            sdk_version: None,
        };
        let registration = Registration::new("http://127.0.0.1:9080/");
        registry.register(found, registration, 0).unwrap();
        (registry, dir)
    }

    fn path(service: &str, rest: &[&str]) -> InvokePath {
        InvokePath {
            mode: Mode::Call,
            scope: None,
            service: service.into(),
            rest: rest.iter().map(|s| (*s).to_owned()).collect(),
            legacy: false,
        }
    }

    #[test]
    fn resolves_keyed_and_unkeyed_targets() {
        let (registry, _dir) = registry();
        let t = resolve(&path("Greeter", &["greet"]), &registry).unwrap();
        assert_eq!((t.key, t.handler_type), (None, None));
        assert_eq!(t.input.unwrap().required, Some(true));
        let t = resolve(&path("Counter", &["k1", "get"]), &registry).unwrap();
        assert_eq!(
            (t.key.as_deref(), t.handler_type),
            (Some("k1"), Some(HandlerType::Shared))
        );
    }

    #[test]
    fn unknown_targets_are_rt0018_404() {
        let (registry, _dir) = registry();
        let err = resolve(&path("Nope", &["x"]), &registry).unwrap_err();
        assert_eq!(
            (err.status, err.code),
            (StatusCode::NOT_FOUND, Some(Code::RT0018))
        );
        assert!(
            err.message.starts_with("service 'Nope' not found"),
            "{}",
            err.message
        );
        let err = resolve(&path("Greeter", &["nope"]), &registry).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0018));
        assert!(
            err.message.contains("handler 'nope' was not found"),
            "{}",
            err.message
        );
    }

    #[test]
    fn key_presence_follows_the_service_type() {
        let (registry, _dir) = registry();
        let err = resolve(&path("Counter", &["add"]), &registry).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("with a key"), "{}", err.message);
        let err = resolve(&path("Greeter", &["k", "greet"]), &registry).unwrap_err();
        assert!(err.message.contains("without a key"), "{}", err.message);
    }

    #[test]
    fn private_services_and_handlers_are_400() {
        let (registry, _dir) = registry();
        let err = resolve(&path("Greeter", &["internal"]), &registry).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("is not public"), "{}", err.message);
        assert!(public_services(&registry).contains(&"Counter".to_owned()));
        registry
            .modify_service("Counter", |o| o.public = Some(false))
            .unwrap();
        assert!(resolve(&path("Counter", &["k", "add"]), &registry).is_err());
        // The ingress's health lists only what it serves.
        assert!(!public_services(&registry).contains(&"Counter".to_owned()));
    }
}
