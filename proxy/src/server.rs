//! `sluice serve`: opens the store, binds both listeners, runs them under one pingora server
//! and shuts down gracefully.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use tokio::sync::watch;

use crate::services::{KafkaService, PartitionsService};
use crate::shutdown::{DrainService, SignalWatch, Signals};
use sluice_admin::{self as admin, AdminService, AdminState};
use sluice_config::Config;
use sluice_core::errors::{Code, CodedError};
use sluice_ingress::{IngressApp, IngressService, IngressState};
use sluice_kafka::Kafka;
use sluice_plugins::Plugins;
use sluice_runtime::deployment_tls::DeploymentTls;
use sluice_runtime::limits::Rules;
use sluice_runtime::node::Node;
use sluice_runtime::partition::Runtime;
use sluice_runtime::registry::Registry;
use sluice_store::storage::Store;

/// How long pingora waits for its runtimes after our drain; nothing should be left by then.
const RUNTIME_STOP_SECS: u64 = 1;

/// Runs the server until a shutdown signal has been handled.
pub fn serve(config: Config) -> Result<(), CodedError> {
    raise_open_files_limit();
    let config = Arc::new(config);
    let log = sluice_store::storage::local::segments::Options {
        segment_bytes: config.worker.log_segment_size.0,
        truncate_damage: config.worker.truncate_damaged_log,
        ..Default::default()
    };
    let store = Arc::new(Store::open_with(&config.data_dir, log)?);
    let partitions = usize::from(config.worker.partitions.get());
    let (runtime, receivers) =
        if let (true, Some(secret)) = (config.cluster.is_kafka(), config.cluster.secret.clone()) {
            Runtime::placed(sluice_runtime::partition::placement::Placement::clustered(
                partitions, secret,
            ))
        } else {
            Runtime::new(partitions)
        };
    let cluster = if config.cluster.is_kafka() {
        Some(Arc::new(sluice_kafka_log::Cluster::join(
            &config, &store, &runtime,
        )?))
    } else {
        None
    };
    // The threads that serve the ingress's connections, the partitions and their deployments
    // (`sluice_runtime::shards`).
    let shards = sluice_runtime::shards::Shards::start(config.ingress.threads.get()).map_err(|e| {
        CodedError::new(
            Code::RT0002,
            format!("cannot start the shard threads: {e}; lower ingress.threads or raise the process's thread limit"),
        )
    })?;
    runtime.run_on(Arc::clone(&shards));
    let registry = Arc::new(Registry::load(Arc::clone(&store))?);
    {
        // A deployment's limits changed: queues waiting at its gate look again.
        let runtime = runtime.clone();
        registry.on_change(Box::new(move || runtime.nudge_all()));
    }
    if config.cluster.is_kafka() {
        // A deployment's limit holds across the cluster: each node runs its partitions' part,
        // which moves with them (`sluice_flow::gates::Share`).
        let (gates, nudge) = (Arc::clone(registry.gates()), runtime.clone());
        runtime.placement().on_led(Box::new(move |led| {
            gates.lead(led);
            nudge.nudge_all();
        }));
    }
    if let Some(migrated) = sluice_runtime::limits::migrate::migrate(&store)? {
        tracing::info!(
            in_flight = migrated.in_flight,
            "the store gained flow-control state; what was in flight runs on unchanged"
        );
    }
    let ignored = config.ignored_switches();
    if !ignored.is_empty() {
        tracing::warn!(
            settings = %ignored.join(", "),
            "ignoring retired settings: flow control, protocol V7 and scoped objects are always on; remove them from the configuration"
        );
    }
    // Checked before anything binds: a certificate that does not load stops the start.
    let ingress_tls = sluice_ingress::tls::IngressTls::from_config(&config.ingress)?;
    let ingress_listeners = bind_for_shards(
        config.ingress.bind,
        shards.len(),
        "ingress",
        "ingress.bind / --ingress-bind",
    )?;
    let admin_auth = admin::auth::AdminAuth::from_config(&config.admin)?;
    let deployment_tls = DeploymentTls::load(config.deployment_ca_file.as_deref())?;
    let admin_tls = admin::tls::acceptor(&config.admin)?;
    check_admin_exposure(&config, &admin_auth)?;
    let admin_listener = bind(config.admin.bind, "admin", "admin.bind / --admin-bind")?;
    let ingress_addr = local_addr(&ingress_listeners[0])?;
    let admin_addr = local_addr(&admin_listener)?;
    let ingress_endpoint = match &config.ingress.advertised_endpoint {
        Some(endpoint) => endpoint.to_string(),
        None if ingress_tls.is_some() => format!("https://{ingress_addr}/"),
        None => format!("http://{ingress_addr}/"),
    };

    let mut server = Server::new_with_opt_and_conf(None, server_conf(&config));
    server.bootstrap();

    let rules = Arc::new(Rules::load(Arc::clone(&store))?);
    let node = Node {
        config: Arc::clone(&config),
        store: Arc::clone(&store),
        registry: Arc::clone(&registry),
        runtime: runtime.clone(),
        rules: Arc::clone(&rules),
        tls: deployment_tls,
    };
    let plugins = Arc::new(
        Plugins::new(Some(Arc::clone(&store)), Some(Arc::clone(&rules)))
            .limited_by(&config.plugin_limits),
    );
    plugins.start(&config.plugins)?;
    let kafka = Arc::new(Kafka::load(&node)?);
    if let Some(cluster) = &cluster {
        let (registry, rules) = (Arc::clone(&registry), Arc::clone(&rules));
        let (plugins, kafka) = (Arc::clone(&plugins), Arc::clone(&kafka));
        cluster.on_meta(Box::new(move |tables| {
            use sluice_store::schema::MetaGroup;
            // Each group changed reloads once, whichever of its tables came.
            let mut groups: Vec<MetaGroup> = Vec::new();
            for (_, group) in tables.iter().filter_map(|t| sluice_store::schema::meta_table(t)) {
                if !groups.contains(&group) {
                    groups.push(group);
                }
            }
            let mut reloaded = Ok(());
            for group in groups {
                reloaded = reloaded.and(match group {
                    MetaGroup::Registry => registry.reload(),
                    MetaGroup::Rules => rules.reload(),
                    MetaGroup::Plugins => plugins.reload_saved(),
                    MetaGroup::Kafka => kafka.reload(),
                });
            }
            if let Err(e) = reloaded {
                tracing::error!(error.code = ?e.code, error = %e, "cannot reload metadata changed by the cluster");
            }
        }));
    }
    let spans = crate::otlp::install(&config.tracing)?;
    let metrics = if config.metrics.enabled {
        let metrics = sluice_admin::scrape::Metrics::install(&config.metrics)?;
        server.add_service(background_service(
            "metrics",
            crate::services::MetricsUpkeepService(Arc::clone(&metrics)),
        ));
        Some(metrics)
    } else {
        None
    };
    server.add_service(background_service(
        "kafka",
        KafkaService(Arc::clone(&kafka)),
    ));
    let history = config.flow.history_points().map(|(interval, points)| {
        let history = Arc::new(sluice_admin::flow_history::FlowHistory::new(
            interval, points,
        ));
        server.add_service(background_service(
            "flow-history",
            crate::services::FlowHistoryService(Arc::clone(&history), runtime.clone()),
        ));
        history
    });
    let ingress_state = Arc::new(IngressState {
        in_flight: Arc::default(),
        health: Arc::clone(store.health()),
        registry: Arc::clone(&registry),
        runtime: runtime.clone(),
        config: Arc::clone(&config),
        plugins: Arc::clone(&plugins),
        forwarder: sluice_runtime::replication::relay::Peers::new(),
        api_keys: sluice_ingress::api_keys::ApiKeys::from_config(&config.ingress)?,
    });
    server.add_service(background_service(
        "partitions",
        PartitionsService::new(
            node.clone(),
            receivers,
            cluster.as_ref().map(|cluster| cluster.leads()),
        ),
    ));
    if let Some(cluster) = &cluster {
        server.add_service(background_service(
            "cluster",
            crate::services::ClusterService(Arc::clone(cluster)),
        ));
    }
    let ingress = IngressService::new(
        IngressApp::new(Arc::clone(&ingress_state)),
        ingress_listeners,
        Arc::clone(&shards),
        config.ingress.connections.clone(),
        ingress_tls,
    )
    .map_err(|e| bind_error("ingress", ingress_addr, "ingress.bind / --ingress-bind", &e))?;
    server.add_service(ingress);

    let (admin_done_tx, admin_done_rx) = watch::channel(false);
    let admin_state = AdminState::new(&node, ingress_endpoint.clone(), plugins, kafka)
        .with_auth(admin_auth)
        .with_metrics(metrics)
        .with_history(history)
        .with_cluster(
            cluster
                .clone()
                .map(|cluster| cluster as Arc<dyn admin::ClusterReport>),
        );
    let router = admin::router(Arc::new(admin_state));
    server.add_service(background_service(
        "admin",
        AdminService::new(
            admin_listener,
            router,
            config.admin.connections.clone(),
            admin_done_tx,
        )
        .with_tls(admin_tls),
    ));
    server.add_service(background_service(
        "drain",
        DrainService {
            grace: config.shutdown_grace_period.0,
            ingress: Arc::clone(&ingress_state.in_flight),
            admin_done: admin_done_rx,
            store: Arc::clone(&store),
            spans,
        },
    ));

    // Before anything answers: a signal from then on drains.
    let signals = Signals::install();
    tracing::info!(
        ingress = %ingress_addr,
        admin = %admin_addr,
        ingress_endpoint,
        data_dir = %config.data_dir.display(),
        "sluice is ready"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(SignalWatch {
            health: Arc::clone(store.health()),
            failure_exit_delay: config.failure_exit_delay.0,
            signals,
            hand_on: cluster.as_ref().map(|cluster| {
                let within = config
                    .cluster
                    .session_timeout
                    .0
                    .min(config.shutdown_grace_period.0);
                (Arc::clone(cluster), within)
            }),
        }),
    });
    // Only reached when pingora's backstop fired before the drain finished.
    store.close();
    Ok(())
}

/// Raises the soft limit of open files to the hard limit: every connection is a descriptor, and
/// the connection caps (not a low default of 1,024) should be what bounds them.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open-files limit"),
            Err(e) => tracing::warn!(error = %e, soft, hard, "cannot raise the open-files limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open-files limit"),
    }
}

/// An admin listener reachable from other machines must have tokens, unless the operator says
/// otherwise in so many words.
fn check_admin_exposure(config: &Config, auth: &admin::auth::AdminAuth) -> Result<(), CodedError> {
    let bind = config.admin.bind;
    if !auth.is_open() || bind.ip().is_loopback() {
        return Ok(());
    }
    if config.admin.allow_unauthenticated {
        tracing::warn!(
            admin = %bind,
            "the admin API is served WITHOUT authentication on a non-loopback address (admin.allow-unauthenticated = true): anyone who reaches it can register deployments, load plugins and change rules"
        );
        return Ok(());
    }
    Err(CodedError::new(
        Code::RT0002,
        format!(
            "invalid configuration: the admin listener would be open to anyone on {bind}: configure admin.auth-tokens (or SERVICE_ADMIN__AUTH_TOKENS, or admin.auth-tokens-file), bind it to loopback, or set admin.allow-unauthenticated = true"
        ),
    ))
}

fn server_conf(config: &Config) -> ServerConf {
    let grace = config.shutdown_grace_period.0;
    ServerConf {
        threads: 1,
        // A backstop only: the drain service exits as soon as in-flight work is done.
        grace_period_seconds: Some(grace.as_secs() + 2),
        graceful_shutdown_timeout_seconds: Some(RUNTIME_STOP_SECS),
        ..ServerConf::default()
    }
}

/// A TCP socket for `addr` with `SO_REUSEADDR` (a restart must not wait out TIME_WAIT), as
/// pingora would make it.
fn new_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    Ok(socket)
}

/// A listening socket on `addr`.
fn bind(addr: SocketAddr, name: &str, key: &str) -> Result<TcpListener, CodedError> {
    let attempt = || -> std::io::Result<TcpListener> {
        let socket = new_socket(addr)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        Ok(socket.into())
    };
    attempt().map_err(|e| bind_error(name, addr, key, &e))
}

/// One listening socket per shard on `addr`, with `SO_REUSEPORT`, so the kernel spreads new
/// connections over the shards. The address is first bound once without it, which fails while
/// anything listens there (another Sluice among them: its sockets then refuse the probe too):
/// the option lets only this process's own shards share the port.
fn bind_for_shards(
    addr: SocketAddr,
    shards: usize,
    name: &str,
    key: &str,
) -> Result<Vec<TcpListener>, CodedError> {
    let attempt = || -> std::io::Result<Vec<TcpListener>> {
        // The probe: fails on a busy port, and fixes the port when `addr` asks for any.
        let probe = new_socket(addr)?;
        probe.bind(&addr.into())?;
        let bound = probe
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("not an internet address"))?;
        drop(probe);
        (0..shards.max(1))
            .map(|_| {
                let socket = new_socket(bound)?;
                socket.set_reuse_port(true)?;
                socket.bind(&bound.into())?;
                socket.listen(1024)?;
                Ok(socket.into())
            })
            .collect()
    };
    attempt().map_err(|e| bind_error(name, addr, key, &e))
}

fn bind_error(name: &str, addr: SocketAddr, key: &str, err: &std::io::Error) -> CodedError {
    CodedError::new(
        Code::RT0004,
        format!(
            "cannot bind the {name} listener on {addr}: {err}; free the port or choose another address with {key}"
        ),
    )
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, CodedError> {
    listener
        .local_addr()
        .map_err(|e| CodedError::new(Code::RT0004, format!("cannot read a bound address: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_admin::auth::AdminAuth;
    use sluice_config::AuthTokens;

    fn exposure(bind: &str, tokens: &str, allow: bool) -> Result<(), CodedError> {
        let mut config = Config::default();
        config.admin.bind = bind.parse().unwrap();
        config.admin.auth_tokens = AuthTokens::parse_list(tokens).unwrap();
        config.admin.allow_unauthenticated = allow;
        let auth = AdminAuth::from_config(&config.admin).unwrap();
        check_admin_exposure(&config, &auth)
    }

    #[test]
    fn only_loopback_may_go_without_tokens() {
        assert!(exposure("127.0.0.1:9070", "", false).is_ok());
        assert!(exposure("[::1]:9070", "", false).is_ok());
        let err = exposure("0.0.0.0:9070", "", false).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0002));
        assert!(err.message.contains("admin.auth-tokens"), "{}", err.message);
        assert!(exposure("0.0.0.0:9070", "admin:0123456789abcdef", false).is_ok());
        assert!(exposure("10.0.0.5:9070", "", true).is_ok());
    }
}
