//! The admin door: an axum router on the second listener, one module per operation group,
//! served unversioned and under `/v2`–`/v4`. `/openapi` is generated from the handlers'
//! annotations, so every route added with [`OpenApiRouter::routes`] shows up there. Beside the
//! routes: the Prometheus recorder `GET /metrics` renders ([`scrape`]) and the flow charts'
//! history ([`flow_history`]).

pub mod auth;
pub mod bulk_cancel;
pub mod counters;
mod dashboard;
pub mod deployments;
pub mod error;
mod every_leader;
mod extract;
pub mod flow_history;
mod health;
pub mod invocations;
pub mod json;
pub mod kafka;
pub mod limits;
pub mod plugins;
mod prometheus;
pub mod query;
pub mod resets;
mod restart;
pub mod scrape;
mod serve;
pub mod services;
pub mod shapes;
pub mod tls;
mod to_leader;
mod version;
mod view_params;
pub mod vqueues;
mod watched;
pub mod weights;

use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use axum::Router;
use axum::extract::{OriginalUri, State};
use axum::response::IntoResponse;
use axum::routing::any;
use http::Method;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::watch;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::AdminError;

use sluice_core::errors::Code;
use sluice_plugins::Plugins;
pub use version::{MAX_ADMIN_API_VERSION, MIN_ADMIN_API_VERSION, VersionInformation};

use sluice_config::Config;
use sluice_runtime::discovery::DiscoveryClient;
use sluice_runtime::limits::Rules;
use sluice_runtime::node::Node;
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::Registry;
use sluice_store::storage::Store;

pub use sluice_api::version::ClusterReport;

/// What admin handlers share.
#[derive(Debug)]
pub struct AdminState {
    /// The effective configuration.
    pub config: Arc<Config>,
    /// The ingress address reported by `/version`.
    pub ingress_endpoint: String,
    /// The store.
    pub store: Arc<Store>,
    /// Deployments and services.
    pub registry: Arc<Registry>,
    /// The partitions, for invocation control.
    pub runtime: Runtime,
    /// The flow-control rule book.
    pub rules: Arc<Rules>,
    /// Policy plugins.
    pub plugins: Arc<Plugins>,
    /// SQL over the system tables.
    pub query: sluice_sql::QueryEngine,
    /// Kafka clusters and subscriptions.
    pub kafka: Arc<sluice_kafka::Kafka>,
    /// Fetches endpoint manifests.
    pub discovery: DiscoveryClient,
    /// Who may call which route.
    pub auth: Arc<auth::AdminAuth>,
    /// The metrics recorder, when `metrics.enabled`.
    pub metrics: Option<Arc<crate::scrape::Metrics>>,
    /// The flow charts' history, when `flow.history` is on.
    pub history: Option<Arc<crate::flow_history::FlowHistory>>,
    /// This node's part of the cluster (cluster mode), shared with the SQL tables; set once
    /// the node has joined.
    pub cluster: Arc<OnceLock<Arc<dyn ClusterReport>>>,
    /// The generated OpenAPI document, set once the router is built.
    openapi: OnceLock<serde_json::Value>,
}

impl AdminState {
    /// State for a router over `node`, reaching `https://` deployments with what its TLS
    /// settings trust.
    pub fn new(
        node: &Node,
        ingress_endpoint: String,
        plugins: Arc<Plugins>,
        kafka: Arc<sluice_kafka::Kafka>,
    ) -> Self {
        let cluster: Arc<OnceLock<Arc<dyn ClusterReport>>> = Arc::default();
        let joined = Arc::clone(&cluster);
        let query = sluice_sql::QueryEngine::new(sluice_sql::QuerySources {
            cluster: Arc::new(move || joined.get().map(|cluster| cluster.view())),
            config: Arc::clone(&node.config),
            rules: Arc::clone(&node.rules),
            runtime: node.runtime.clone(),
            registry: Arc::clone(&node.registry),
            store: Arc::clone(&node.store),
        });
        use sluice_runtime::discovery::client::{ATTEMPTS, BACKOFF, TIMEOUT};
        Self {
            kafka,
            query,
            plugins,
            config: Arc::clone(&node.config),
            ingress_endpoint,
            store: Arc::clone(&node.store),
            registry: Arc::clone(&node.registry),
            runtime: node.runtime.clone(),
            rules: Arc::clone(&node.rules),
            discovery: DiscoveryClient::with_tls(&node.tls, ATTEMPTS, BACKOFF, TIMEOUT),
            auth: Arc::default(),
            metrics: None,
            history: None,
            cluster,
            openapi: OnceLock::new(),
        }
    }

    /// The same state serving `GET /metrics` from `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<crate::scrape::Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The same state answering `GET /limits/history` from `history`.
    pub fn with_history(mut self, history: Option<Arc<crate::flow_history::FlowHistory>>) -> Self {
        self.history = history;
        self
    }

    /// The same state reporting `cluster` (cluster mode).
    pub fn with_cluster(self, cluster: Option<Arc<dyn ClusterReport>>) -> Self {
        if let Some(cluster) = cluster {
            let _ = self.cluster.set(cluster);
        }
        self
    }

    /// The same state with `auth` guarding the listener.
    pub fn with_auth(mut self, auth: auth::AdminAuth) -> Self {
        self.auth = Arc::new(auth);
        self
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice admin API", description = "Deployments, services, invocations, flow-control rules and introspection."),
    tags(
        (name = "health", description = "Liveness and readiness"),
        (name = "cluster_health", description = "The cluster's name and members"),
        (name = "metrics", description = "Prometheus metrics"),
        (name = "version", description = "Version and features"),
        (name = "openapi", description = "This document"),
        (name = "deployment", description = "Deployments and discovery"),
        (name = "service", description = "Services"),
        (name = "service_handler", description = "Handlers"),
        (name = "invocation", description = "Invocations"),
        (name = "plugins", description = "Policy plugins (wasm components)"),
        (name = "introspection", description = "SQL over the system tables"),
        (name = "kafka_cluster", description = "Kafka clusters"),
        (name = "subscription", description = "Kafka subscriptions"),
        (name = "vqueue", description = "Scheduler queues: list, pause, resume"),
    )
)]
struct ApiDoc;

/// The admin router with every route, its versioned aliases and JSON fallbacks.
pub fn router(state: Arc<AdminState>) -> Router {
    let (api, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::health))
        .routes(routes!(health::ready))
        .routes(routes!(health::cluster_health))
        .routes(routes!(prometheus::metrics))
        .routes(routes!(version::version))
        .routes(routes!(openapi))
        .routes(routes!(deployments::create, deployments::list))
        .routes(routes!(
            deployments::get,
            deployments::update,
            deployments::replace,
            deployments::delete
        ))
        .routes(routes!(services::list))
        .routes(routes!(services::get, services::modify))
        .routes(routes!(services::modify_state))
        .routes(routes!(services::handlers))
        .routes(routes!(services::handler))
        .routes(routes!(services::openapi))
        .routes(routes!(invocations::list))
        .routes(routes!(bulk_cancel::bulk_cancel))
        .routes(routes!(invocations::get, invocations::delete))
        .routes(routes!(invocations::control))
        .routes(routes!(invocations::cancel))
        .routes(routes!(invocations::kill))
        .routes(routes!(invocations::purge))
        .routes(routes!(invocations::purge_journal))
        .routes(routes!(invocations::pause))
        .routes(routes!(invocations::resume))
        .routes(routes!(restart::restart_as_new))
        .routes(routes!(limits::upsert, limits::list))
        .routes(routes!(limits::bulk_delete))
        .routes(routes!(limits::apply))
        .routes(routes!(counters::counters))
        .routes(routes!(limits::deployment_gates))
        .routes(routes!(limits::history))
        .routes(routes!(resets::reset_quota))
        .routes(routes!(resets::reset_budget))
        .routes(routes!(resets::reset_burst))
        .routes(routes!(weights::list, weights::set))
        .routes(routes!(vqueues::list))
        .routes(routes!(vqueues::pause))
        .routes(routes!(vqueues::resume))
        .routes(routes!(query::query))
        .routes(routes!(kafka::create_cluster, kafka::list_clusters))
        .routes(routes!(
            kafka::get_cluster,
            kafka::update_cluster,
            kafka::delete_cluster
        ))
        .routes(routes!(
            kafka::create_subscription,
            kafka::list_subscriptions
        ))
        .routes(routes!(kafka::get_subscription, kafka::delete_subscription))
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::load, plugins::get, plugins::unload))
        .split_for_parts();
    let doc = serde_json::to_value(&doc).expect("the OpenAPI document serializes");
    let _ = state.openapi.set(doc);
    let auth = Arc::clone(&state.auth);
    let to_leader = to_leader::ToLeader::new(state.runtime.clone());
    let api = api
        .with_state(state)
        .method_not_allowed_fallback(method_not_allowed);

    let mut app = Router::new()
        .route("/v1", any(unsupported_version))
        .route("/v1/{*rest}", any(unsupported_version));
    for version in MIN_ADMIN_API_VERSION..=MAX_ADMIN_API_VERSION {
        app = app.nest(&format!("/v{version}"), api.clone());
    }
    app.merge(api)
        .merge(dashboard::routes())
        .fallback(not_found)
        // Inside authentication: a request is checked here before it is forwarded.
        .layer(axum::middleware::from_fn_with_state(
            to_leader,
            to_leader::forward,
        ))
        .layer(axum::middleware::from_fn_with_state(auth, auth::require))
}

/// The OpenAPI 3.1 document of this listener.
#[utoipa::path(get, path = "/openapi", tag = "openapi", operation_id = "openapi",
    responses((status = 200, description = "OpenAPI 3.1 JSON of the admin API.", content_type = "application/json")))]
async fn openapi(State(state): State<Arc<AdminState>>) -> json::Json<serde_json::Value> {
    json::Json(state.openapi.get().cloned().unwrap_or_default())
}

async fn unsupported_version() -> AdminError {
    AdminError::coded(
        Code::ADM0006,
        format!(
            "Unsupported Admin API version V1. This server supports versions between V{MIN_ADMIN_API_VERSION} and V{MAX_ADMIN_API_VERSION}."
        ),
    )
}

async fn not_found(method: Method, OriginalUri(uri): OriginalUri) -> impl IntoResponse {
    AdminError::coded(
        Code::ADM0003,
        format!("no admin route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> impl IntoResponse {
    AdminError::coded(
        Code::ADM0005,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// Serves the admin router on a listener bound before start-up (so bind errors surface early).
pub struct AdminService {
    listener: Mutex<Option<std::net::TcpListener>>,
    router: Router,
    limits: sluice_config::ConnectionLimits,
    tls: Option<sluice_listeners::certificates::ListenerTls>,
    done: watch::Sender<bool>,
}

impl AdminService {
    /// A service for `listener` with its connections bounded by `limits`; `done` turns true
    /// once its connections have drained.
    pub fn new(
        listener: std::net::TcpListener,
        router: Router,
        limits: sluice_config::ConnectionLimits,
        done: watch::Sender<bool>,
    ) -> Self {
        Self {
            listener: Mutex::new(Some(listener)),
            router,
            limits,
            tls: None,
            done,
        }
    }

    /// The same service answering over TLS only.
    pub fn with_tls(mut self, tls: Option<sluice_listeners::certificates::ListenerTls>) -> Self {
        self.tls = tls;
        self
    }
}

#[async_trait]
impl BackgroundService for AdminService {
    async fn start(&self, shutdown: ShutdownWatch) {
        // Whatever happens below, the drain must not wait for this listener forever.
        let _done = DoneOnDrop(&self.done);
        let std_listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(std_listener) = std_listener else {
            return;
        };
        // From here on SIGHUP reloads certificates and never ends the process, TLS or not.
        sluice_listeners::certificates::listen_for_hangups();
        if let Some(tls) = &self.tls {
            tokio::spawn(Arc::clone(&tls.certificate).watch(shutdown.clone()));
        }
        let listener = std_listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(std_listener));
        match listener {
            Ok(listener) => {
                serve::serve(
                    listener,
                    self.router.clone(),
                    self.limits.clone(),
                    self.tls.as_ref().map(|t| t.acceptor.clone()),
                    shutdown,
                )
                .await;
            }
            Err(e) => tracing::error!(error = %e, "admin listener failed"),
        }
    }
}

struct DoneOnDrop<'a>(&'a watch::Sender<bool>);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    fn app() -> (Router, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let config = Arc::new(Config::default());
        let registry = Arc::new(Registry::load(Arc::clone(&store)).unwrap());
        let (runtime, _receivers) = sluice_runtime::partition::Runtime::new(1);
        let rules = Arc::new(Rules::load(Arc::clone(&store)).unwrap());
        let node = Node {
            config,
            store,
            registry,
            runtime,
            rules: Arc::clone(&rules),
            tls: sluice_runtime::deployment_tls::DeploymentTls::default(),
        };
        let kafka = Arc::new(sluice_kafka::Kafka::load(&node).unwrap());
        let state = AdminState::new(
            &node,
            "http://127.0.0.1:8080/".into(),
            Arc::new(Plugins::new(None, Some(rules))),
            kafka,
        );
        (router(Arc::new(state)), dir)
    }

    async fn get(app: &Router, method: Method, path: &str) -> (StatusCode, Vec<u8>) {
        let resp = app
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status();
        (
            status,
            to_bytes(resp.into_body(), 1 << 22).await.unwrap().to_vec(),
        )
    }

    #[tokio::test]
    async fn versioned_prefixes() {
        let (app, _dir) = app();
        for path in ["/version", "/v2/version", "/v3/version", "/v4/version"] {
            let (status, body) = get(&app, Method::GET, path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["max_admin_api_version"], 4);
        }
        let (status, body) = get(&app, Method::GET, "/v1/version").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["message"],
            "[ADM0006] Unsupported Admin API version V1. This server supports versions between V2 and V4."
        );
        assert_eq!(body["restate_code"], "ADM0006");
        let (status, _) = get(&app, Method::GET, "/v5/version").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_answer_json() {
        let (app, _dir) = app();
        let (status, body) = get(&app, Method::GET, "/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["message"], "[ADM0003] no admin route for GET /nope");
        assert_eq!(body["restate_code"], "ADM0003");
        let (status, body) = get(&app, Method::DELETE, "/v4/version").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["message"],
            "[ADM0005] method DELETE is not allowed on /v4/version"
        );
        assert_eq!(body["restate_code"], "ADM0005");
    }

    #[tokio::test]
    async fn openapi_lists_every_route() {
        let (app, _dir) = app();
        let (status, body) = get(&app, Method::GET, "/openapi").await;
        assert_eq!(status, StatusCode::OK);
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in ["/health", "/version", "/openapi"] {
            assert!(doc["paths"][path].is_object(), "{path} missing from {doc}");
        }
        assert_eq!(doc["paths"]["/version"]["get"]["operationId"], "version");
    }

    /// `/deployments/{deployment}` and `/deployments/{id}` are the same route.
    fn shape(path: &str) -> String {
        path.split('/')
            .map(|seg| if seg.starts_with('{') { "{}" } else { seg })
            .collect::<Vec<_>>()
            .join("/")
    }

    #[tokio::test]
    async fn every_reference_route_exists() {
        let (app, _dir) = app();
        let (_, body) = get(&app, Method::GET, "/openapi").await;
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let ours: std::collections::HashSet<(String, String)> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, ops)| {
                let path = shape(path);
                ops.as_object()
                    .unwrap()
                    .keys()
                    .map(move |method| (method.to_ascii_uppercase(), path.clone()))
            })
            .collect();
        let reference: Vec<(&str, &str)> = include_str!("reference_routes.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_once(' ').unwrap())
            .collect();
        assert_eq!(reference.len(), 37, "the reference lists 37 operations");
        let missing: Vec<_> = reference
            .iter()
            .filter(|(method, path)| !ours.contains(&(method.to_string(), shape(path))))
            .collect();
        assert!(missing.is_empty(), "not routed: {missing:?}");
        // Listed is not enough: each answers something other than 404/405 "no route".
        for (method, path) in reference {
            let uri = path
                .replace("{invocation_id}", "inv_1")
                .replace('{', "x")
                .replace('}', "");
            let (status, body) = get(&app, method.parse().unwrap(), &uri).await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            let text = String::from_utf8_lossy(&body);
            assert!(!text.contains("no admin route"), "{method} {path}: {text}");
        }
    }
}
