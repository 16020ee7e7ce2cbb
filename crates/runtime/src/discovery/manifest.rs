//! The endpoint manifest a deployment answers on `/discover` (manifest versions v1–v4), and its
//! validation: names, types, handler shapes, protocol range and mode.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use sluice_core::errors::{Code, CodedError};
use sluice_protocol::ProtocolVersion;

/// The manifest content types Sluice accepts, v1 to v4, in the `accept` header's order.
pub const MANIFEST_CONTENT_TYPES: [&str; 4] = [
    "application/vnd.restate.endpointmanifest.v1+json",
    "application/vnd.restate.endpointmanifest.v2+json",
    "application/vnd.restate.endpointmanifest.v3+json",
    "application/vnd.restate.endpointmanifest.v4+json",
];

/// How attempts talk to the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProtocolMode {
    /// Both directions stream in one HTTP/2 exchange.
    BidiStream,
    /// One request, one response per attempt.
    RequestResponse,
}

/// A service's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServiceType {
    /// Stateless handlers.
    Service,
    /// Keyed, with state and exclusive/shared handlers.
    VirtualObject,
    /// Keyed, with one `run` per key and durable promises.
    Workflow,
}

/// A handler's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HandlerType {
    /// One at a time per object key; may write state.
    Exclusive,
    /// Concurrent; reads state only.
    Shared,
    /// The workflow's `run` handler.
    Workflow,
}

/// What input a handler accepts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputRules {
    /// A body is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Accept-style content type (wildcards allowed); absent with `{}` means no body allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// JSON schema of the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
}

/// What output a handler produces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputRules {
    /// Content type of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Send the content type even for an empty output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_content_type_if_empty: Option<bool>,
    /// JSON schema of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
}

/// Options a service or handler may set (manifest v2–v4); durations in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Options {
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation: Option<String>,
    /// Free key/values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// v3
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactivity_timeout: Option<u64>,
    /// v3
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_timeout: Option<u64>,
    /// v3
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_retention: Option<u64>,
    /// v3; not on workflow handlers
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_retention: Option<u64>,
    /// v3; workflow handlers only
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_completion_retention: Option<u64>,
    /// v3
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_lazy_state: Option<bool>,
    /// v3
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_private: Option<bool>,
    /// v4
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_initial_interval: Option<u64>,
    /// v4
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_max_interval: Option<u64>,
    /// v4
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_max_attempts: Option<u64>,
    /// v4
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_exponentiation_factor: Option<f64>,
    /// v4: `PAUSE` or `KILL`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_on_max_attempts: Option<String>,
}

/// One handler of a service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandlerManifest {
    /// Its name.
    pub name: String,
    /// Its type; defaults by service type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ty: Option<HandlerType>,
    /// Input rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputRules>,
    /// Output rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputRules>,
    /// Options.
    #[serde(flatten)]
    pub options: Options,
}

impl HandlerManifest {
    /// The handler type in force: the declared one, else the service type's default. A plain
    /// service's handlers have none: the Java SDK (2.4) declares them `SHARED`, which the
    /// reference server accepts and reads as a service handler.
    pub fn effective_type(&self, service: ServiceType) -> Option<HandlerType> {
        match service {
            ServiceType::Service => None,
            ServiceType::VirtualObject => self.ty.or(Some(HandlerType::Exclusive)),
            ServiceType::Workflow => self.ty.or(Some(HandlerType::Workflow)),
        }
    }
}

/// What a deployment (or one of its services) declares it can take; Sluice enforces it at the
/// edge. `{"concurrency": N}`: at most N attempts run on it at once (on each node),
/// 1 ≤ N ≤ [`MAX_DECLARED_CONCURRENCY`]. Read strictly: an object only (not `[]`), no field
/// but `concurrency`, so a typo is refused at registration rather than silently unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestLimits {
    /// Attempts running at once; absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<std::num::NonZeroU32>,
}

/// The largest concurrency a manifest may declare (far above what one deployment takes, far
/// below the gates' "unlimited").
pub const MAX_DECLARED_CONCURRENCY: u32 = 1_000_000;

impl<'de> Deserialize<'de> for ManifestLimits {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            concurrency: Option<std::num::NonZeroU32>,
        }

        struct ObjectOnly;

        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = ManifestLimits;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object like {\"concurrency\": 10}")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let fields =
                    Fields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                if let Some(n) = fields.concurrency
                    && n.get() > MAX_DECLARED_CONCURRENCY
                {
                    return Err(serde::de::Error::custom(format_args!(
                        "limits.concurrency {n} is over {MAX_DECLARED_CONCURRENCY}; leave it out for no limit"
                    )));
                }
                Ok(ManifestLimits {
                    concurrency: fields.concurrency,
                })
            }
        }

        deserializer.deserialize_map(ObjectOnly)
    }
}

/// One service of a deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceManifest {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: ServiceType,
    /// Its handlers.
    pub handlers: Vec<HandlerManifest>,
    /// Its own limits on this deployment, beside the deployment's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ManifestLimits>,
    /// Options.
    #[serde(flatten)]
    pub options: Options,
}

/// What `/discover` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Bidi or request/response; required by Sluice.
    #[serde(default)]
    pub protocol_mode: Option<ProtocolMode>,
    /// Lowest service protocol version the SDK speaks.
    pub min_protocol_version: i32,
    /// Highest service protocol version the SDK speaks.
    pub max_protocol_version: i32,
    /// v4, Lambda only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambda_compression: Option<String>,
    /// The services.
    pub services: Vec<ServiceManifest>,
    /// What the whole deployment can take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ManifestLimits>,
}

fn bad(message: String) -> CodedError {
    CodedError::new(
        Code::META0013,
        format!("received a bad response from the SDK: {message}"),
    )
}

/// `^([a-zA-Z]|_[a-zA-Z0-9])[a-zA-Z0-9._-]*$` for services (`extra` = ".-"), handlers without ".-".
fn valid_name(name: &str, extra: &str) -> bool {
    let bytes = name.as_bytes();
    let head_ok = match bytes {
        [b'_', second, ..] => second.is_ascii_alphanumeric(),
        [first, ..] => first.is_ascii_alphabetic(),
        [] => false,
    };
    let rest = if bytes.first() == Some(&b'_') {
        bytes.get(2..).unwrap_or_default()
    } else {
        bytes.get(1..).unwrap_or_default()
    };
    head_ok
        && rest
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || extra.as_bytes().contains(b))
}

/// Names deployments may not use: they collide with Sluice's and Restate's own routes.
pub fn is_reserved_service_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("restate") || lower.starts_with("sluice") || lower == "openapi"
}

impl Manifest {
    /// Parses and checks a manifest body.
    pub fn parse(body: &[u8]) -> Result<Self, CodedError> {
        let manifest: Manifest = serde_json::from_slice(body).map_err(|e| {
            // serde's message can quote values of the body: both are cut short.
            bad(format!(
                "the manifest cannot be decoded: {}. Discovery response: {}",
                super::excerpt::excerpt(e.to_string().as_bytes()),
                super::excerpt::excerpt(body)
            ))
        })?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Checks everything serde cannot: mode, range, names, handler types.
    pub fn validate(&self) -> Result<(), CodedError> {
        if self.protocol_mode.is_none() {
            return Err(bad("missing protocol mode (protocolMode)".into()));
        }
        let (min, max) = (self.min_protocol_version, self.max_protocol_version);
        if min < 1 || min > max {
            return Err(bad(format!(
                "invalid protocol version range [{min}, {max}]"
            )));
        }
        if !ProtocolVersion::acceptable_for_discovery(min, max) {
            return Err(CodedError::new(
                Code::META0012,
                format!(
                    "unsupported service protocol versions: [{min}, {max}]. Supported versions by this runtime are [{}, {}]; upgrade the SDK of the deployment",
                    ProtocolVersion::MIN,
                    ProtocolVersion::MAX
                ),
            ));
        }
        let mut services = HashSet::new();
        for service in &self.services {
            if !valid_name(&service.name, ".-") {
                return Err(bad(format!("invalid service name '{}'", service.name)));
            }
            if is_reserved_service_name(&service.name) {
                return Err(CodedError::new(
                    Code::META0005,
                    format!(
                        "service name '{}' is reserved (names starting with 'restate' or 'sluice', and 'openapi'): rename the service",
                        service.name
                    ),
                ));
            }
            if !services.insert(service.name.as_str()) {
                return Err(bad(format!("service '{}' is listed twice", service.name)));
            }
            self.validate_handlers(service)?;
        }
        Ok(())
    }

    fn validate_handlers(&self, service: &ServiceManifest) -> Result<(), CodedError> {
        let mut handlers = HashSet::new();
        for handler in &service.handlers {
            let at = format!("handler '{}/{}'", service.name, handler.name);
            if !valid_name(&handler.name, "") {
                return Err(bad(format!("invalid {at} name")));
            }
            if !handlers.insert(handler.name.as_str()) {
                return Err(bad(format!("{at} is listed twice")));
            }
            let allowed = matches!(
                (
                    service.ty,
                    handler.ty.or(handler.effective_type(service.ty))
                ),
                (ServiceType::Service, None | Some(HandlerType::Shared))
                    | (
                        ServiceType::VirtualObject,
                        Some(HandlerType::Exclusive | HandlerType::Shared)
                    )
                    | (
                        ServiceType::Workflow,
                        Some(HandlerType::Workflow | HandlerType::Shared)
                    )
            );
            if !allowed {
                return Err(bad(format!(
                    "{at} has type {:?}, which a {:?} cannot have",
                    handler.ty, service.ty
                )));
            }
        }
        let runs = service
            .handlers
            .iter()
            .filter(|h| h.effective_type(service.ty) == Some(HandlerType::Workflow))
            .count();
        if service.ty == ServiceType::Workflow && runs != 1 {
            return Err(bad(format!(
                "workflow '{}' must have exactly one WORKFLOW handler, it has {runs}",
                service.name
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(json: serde_json::Value) -> Result<Manifest, CodedError> {
        Manifest::parse(json.to_string().as_bytes())
    }

    fn greeter() -> serde_json::Value {
        serde_json::json!({
            "protocolMode": "BIDI_STREAM",
            "minProtocolVersion": 5,
            "maxProtocolVersion": 7,
            "services": [
                {"name": "Greeter", "ty": "SERVICE", "handlers": [
                    {"name": "greet", "input": {"required": false, "contentType": "application/json"},
                     "output": {"contentType": "application/json"}, "documentation": "says hi"}
                ], "inactivityTimeout": 60000},
                {"name": "Counter", "ty": "VIRTUAL_OBJECT", "handlers": [
                    {"name": "add"}, {"name": "get", "ty": "SHARED"}
                ]},
                {"name": "Signup", "ty": "WORKFLOW", "handlers": [
                    {"name": "run"}, {"name": "status", "ty": "SHARED"}
                ]}
            ]
        })
    }

    #[test]
    fn a_real_shaped_manifest_parses() {
        let m = manifest(greeter()).unwrap();
        assert_eq!(m.protocol_mode, Some(ProtocolMode::BidiStream));
        assert_eq!(m.services.len(), 3);
        let greet = &m.services[0].handlers[0];
        assert_eq!(greet.options.documentation.as_deref(), Some("says hi"));
        assert_eq!(m.services[0].options.inactivity_timeout, Some(60_000));
        let counter = &m.services[1];
        assert_eq!(
            counter.handlers[0].effective_type(counter.ty),
            Some(HandlerType::Exclusive)
        );
    }

    #[test]
    fn a_service_handler_declared_shared_is_a_service_handler() {
        // As the Java SDK 2.4 declares every handler of a plain service.
        let mut json = greeter();
        json["services"][0]["handlers"][0]["ty"] = "SHARED".into();
        let m = manifest(json).unwrap();
        let greeter = &m.services[0];
        assert_eq!(greeter.handlers[0].effective_type(greeter.ty), None);
    }

    #[test]
    fn declared_limits_are_read_strictly() {
        let with = |limits: serde_json::Value| {
            let mut json = greeter();
            json["limits"] = limits.clone();
            json["services"][0]["limits"] = limits;
            manifest(json)
        };
        let ok = with(serde_json::json!({"concurrency": 10})).unwrap();
        assert_eq!(
            ok.services[0]
                .limits
                .and_then(|l| l.concurrency)
                .map(|n| n.get()),
            Some(10)
        );
        assert!(
            with(serde_json::json!({})).unwrap().services[0]
                .limits
                .unwrap()
                .concurrency
                .is_none()
        );
        for (bad, says) in [
            (serde_json::json!([]), "an object"),
            (serde_json::json!([10]), "an object"),
            (serde_json::json!({"concurency": 10}), "unknown field"),
            (serde_json::json!({"concurrency": 0}), "nonzero"),
            (serde_json::json!({"concurrency": "10"}), "invalid type"),
            (
                serde_json::json!({"concurrency": 4_294_967_295u64}),
                "over 1000000",
            ),
        ] {
            let err = with(bad.clone()).unwrap_err();
            assert_eq!(err.code, Some(Code::META0013), "{bad}: {err}");
            assert!(err.message.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn missing_protocol_mode_is_meta0013() {
        let mut json = greeter();
        json.as_object_mut().unwrap().remove("protocolMode");
        let err = manifest(json).unwrap_err();
        assert_eq!(err.code, Some(Code::META0013));
        assert!(err.message.contains("missing protocol mode"), "{err}");
    }

    #[test]
    fn an_old_protocol_range_is_meta0012() {
        let mut json = greeter();
        json["minProtocolVersion"] = 1.into();
        json["maxProtocolVersion"] = 3.into();
        let err = manifest(json).unwrap_err();
        assert_eq!(err.code, Some(Code::META0012));
        assert!(err.message.contains("[1, 3]"), "{err}");
    }

    #[test]
    fn reserved_names_are_meta0005() {
        let mut json = greeter();
        json["services"][0]["name"] = "restateAdmin".into();
        assert_eq!(manifest(json).unwrap_err().code, Some(Code::META0005));
    }

    #[test]
    fn shape_errors_are_meta0013() {
        for (path, value) in [
            (("services", 0, "name"), serde_json::json!("9lives")),
            (("services", 1, "ty"), serde_json::json!("ACTOR")),
        ] {
            let mut json = greeter();
            json[path.0][path.1][path.2] = value;
            assert_eq!(manifest(json).unwrap_err().code, Some(Code::META0013));
        }
        let mut json = greeter();
        json["services"][0]["handlers"][0]["ty"] = "EXCLUSIVE".into();
        let err = manifest(json).unwrap_err();
        assert!(err.message.contains("which a Service cannot have"), "{err}");
        let mut json = greeter();
        json["services"][2]["handlers"][1]["ty"] = "WORKFLOW".into();
        assert!(
            manifest(json)
                .unwrap_err()
                .message
                .contains("exactly one WORKFLOW handler")
        );
        assert!(Manifest::parse(b"not json").is_err());
    }

    #[test]
    fn names() {
        assert!(valid_name("Greeter", ".-"));
        assert!(valid_name("_a.b-c", ".-"));
        assert!(!valid_name("_", ".-"));
        assert!(!valid_name("a.b", ""));
        assert!(!valid_name("", ""));
        assert!(is_reserved_service_name("RestateX") && is_reserved_service_name("openapi"));
    }
}
