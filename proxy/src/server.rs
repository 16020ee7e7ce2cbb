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
use sluice_runtime::partition::{Receivers, Runtime};
use sluice_runtime::registry::Registry;
use sluice_store::storage::Store;

/// How long pingora waits for its runtimes after our drain; nothing should be left by then.
const RUNTIME_STOP_SECS: u64 = 1;

/// Runs the server until a shutdown signal has been handled: the partitions and their store,
/// the cluster (in Kafka mode), the listeners, then the services each role adds to one pingora
/// server.
pub fn serve(config: Config) -> Result<(), CodedError> {
    raise_open_files_limit();
    let config = Arc::new(config);
    let (core, receivers) = Core::open(&config)?;
    // Checked before anything binds: a certificate that does not load stops the start.
    let listeners = Listeners::bind(&config, core.shards.len())?;

    let mut server = Server::new_with_opt_and_conf(None, server_conf(&config));
    server.bootstrap();

    let rules = Arc::new(Rules::load(Arc::clone(&core.store))?);
    interrupt_bulk_cancels(&core.store, &config)?;
    let node = Node {
        config: Arc::clone(&config),
        store: Arc::clone(&core.store),
        registry: Arc::clone(&core.registry),
        runtime: core.runtime.clone(),
        rules: Arc::clone(&rules),
        tls: listeners.deployment_tls,
    };
    let plugins = Arc::new(
        Plugins::new(Some(Arc::clone(&core.store)), Some(Arc::clone(&rules)))
            .limited_by(&config.plugin_limits),
    );
    plugins.start(&config.plugins)?;
    let kafka = Arc::new(Kafka::load(&node)?);
    if let Some(cluster) = &core.cluster {
        let tables = MetaTables {
            registry: Arc::clone(&core.registry),
            rules: Arc::clone(&rules),
            plugins: Arc::clone(&plugins),
            kafka: Arc::clone(&kafka),
        };
        cluster.on_meta(Box::new(move |changed| tables.reload(changed)));
    }
    let spans = crate::otlp::install(&config.tracing)?;
    let upkeep = add_upkeep(&mut server, &config, &kafka, &core.runtime)?;
    let ingress_state = add_partitions_and_ingress(
        &mut server,
        &core,
        &node,
        receivers,
        &plugins,
        listeners.ingress,
    )?;
    let admin_done = add_admin(
        &mut server,
        &core,
        &node,
        listeners.admin,
        listeners.ingress_endpoint.clone(),
        (upkeep, plugins, kafka),
    );
    server.add_service(background_service(
        "drain",
        DrainService {
            grace: config.shutdown_grace_period.0,
            ingress: Arc::clone(&ingress_state.in_flight),
            admin_done,
            store: Arc::clone(&core.store),
            spans,
        },
    ));

    // Before anything answers: a signal from then on drains.
    let signals = Signals::install();
    tracing::info!(
        ingress = %listeners.ingress_addr,
        admin = %listeners.admin_addr,
        ingress_endpoint = listeners.ingress_endpoint,
        data_dir = %config.data_dir.display(),
        "sluice is ready"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(signal_watch(&core, &config, signals)),
    });
    // Only reached when pingora's backstop fired before the drain finished.
    core.store.close();
    Ok(())
}

/// What ends the server: a signal (in cluster mode after the node's partitions are handed on,
/// within its session timeout and grace period), or a failure after `failure-exit-delay`.
fn signal_watch(core: &Core, config: &Config, signals: Signals) -> SignalWatch {
    SignalWatch {
        health: Arc::clone(core.store.health()),
        failure_exit_delay: config.failure_exit_delay.0,
        signals,
        hand_on: core.cluster.as_ref().map(|cluster| {
            let within = config
                .cluster
                .session_timeout
                .0
                .min(config.shutdown_grace_period.0);
            (Arc::clone(cluster), within)
        }),
    }
}

/// A bulk cancel this node was running when it stopped runs no more: its record says so.
fn interrupt_bulk_cancels(store: &Store, config: &Config) -> Result<(), CodedError> {
    let interrupted = sluice_store::operations::interrupt_bulk_cancels(
        store,
        &config.cluster.node_id,
        sluice_core::clock::now_ms(),
    )?;
    if interrupted > 0 {
        tracing::warn!(
            interrupted,
            "bulk cancels this node ran when it stopped are recorded as interrupted; what they canceled stays canceled"
        );
    }
    Ok(())
}

/// What the partitions stand on: the store, the runtime's handle, the cluster in Kafka mode,
/// the shard threads and the registry.
struct Core {
    config: Arc<Config>,
    store: Arc<Store>,
    runtime: Runtime,
    cluster: Option<Arc<sluice_kafka_log::Cluster>>,
    shards: Arc<sluice_runtime::shards::Shards>,
    registry: Arc<Registry>,
}

impl Core {
    /// Opens the store, joins the cluster (Kafka mode), starts the shards and loads the
    /// registry, with the hooks that keep the partitions' gates in step with it; with the
    /// receivers the partitions take their events from.
    fn open(config: &Arc<Config>) -> Result<(Self, Receivers), CodedError> {
        let log = sluice_store::storage::local::segments::Options {
            segment_bytes: config.worker.log_segment_size.0,
            truncate_damage: config.worker.truncate_damaged_log,
            ..Default::default()
        };
        // Rows keyed by this node's partition count, each partition's a range of its own: a
        // format-1 store is converted to it at once, one keyed by another count moved to it.
        let partitions = u32::from(config.worker.partitions.get());
        let store = Arc::new(Store::open_keyed(&config.data_dir, log, partitions)?);
        store.use_partitions(partitions)?;
        let partitions = usize::from(config.worker.partitions.get());
        let (runtime, receivers) = if let (true, Some(secret)) =
            (config.cluster.is_kafka(), config.cluster.secret.clone())
        {
            Runtime::placed(sluice_runtime::partition::placement::Placement::clustered(
                partitions, secret,
            ))
        } else {
            Runtime::new(partitions)
        };
        let cluster = if config.cluster.is_kafka() {
            Some(Arc::new(sluice_kafka_log::Cluster::join(
                config, &store, &runtime,
            )?))
        } else {
            None
        };
        // The threads that serve the ingress's connections, the partitions and their
        // deployments (`sluice_runtime::shards`).
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
            // A deployment's limit holds across the cluster: each node runs its partitions'
            // part, which moves with them (`sluice_flow::gates::Share`).
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
        let core = Self {
            config: Arc::clone(config),
            store,
            runtime,
            cluster,
            shards,
            registry,
        };
        Ok((core, receivers))
    }
}

/// Both doors' listeners, bound, with what serving them needs: TLS, the admin API's tokens,
/// and the addresses they answer on.
struct Listeners {
    ingress: IngressListeners,
    admin: AdminListener,
    deployment_tls: DeploymentTls,
    ingress_addr: SocketAddr,
    admin_addr: SocketAddr,
    ingress_endpoint: String,
}

/// The ingress's sockets (one per shard), its TLS and its address.
struct IngressListeners {
    sockets: Vec<TcpListener>,
    tls: Option<Arc<sluice_ingress::tls::IngressTls>>,
    addr: SocketAddr,
}

/// The admin API's socket, its tokens and its TLS.
struct AdminListener {
    socket: TcpListener,
    auth: admin::auth::AdminAuth,
    tls: Option<admin::tls::ListenerTls>,
}

impl Listeners {
    /// Loads the certificates and tokens (a bad one stops the start before anything binds),
    /// then binds the ingress (one socket per shard) and the admin listener.
    fn bind(config: &Config, shards: usize) -> Result<Self, CodedError> {
        let ingress_tls = sluice_ingress::tls::IngressTls::from_config(&config.ingress)?;
        let ingress_sockets = bind_for_shards(
            config.ingress.bind,
            shards,
            "ingress",
            "ingress.bind / --ingress-bind",
        )?;
        let admin_auth = admin::auth::AdminAuth::from_config(&config.admin)?;
        let deployment_tls = DeploymentTls::load(config.deployment_ca_file.as_deref())?;
        let admin_tls = admin::tls::acceptor(&config.admin)?;
        check_admin_exposure(config, &admin_auth)?;
        let admin_socket = bind(config.admin.bind, "admin", "admin.bind / --admin-bind")?;
        let ingress_addr = local_addr(&ingress_sockets[0])?;
        let admin_addr = local_addr(&admin_socket)?;
        let ingress_endpoint = match &config.ingress.advertised_endpoint {
            Some(endpoint) => endpoint.to_string(),
            None if ingress_tls.is_some() => format!("https://{ingress_addr}/"),
            None => format!("http://{ingress_addr}/"),
        };
        Ok(Self {
            ingress: IngressListeners {
                sockets: ingress_sockets,
                tls: ingress_tls,
                addr: ingress_addr,
            },
            admin: AdminListener {
                socket: admin_socket,
                auth: admin_auth,
                tls: admin_tls,
            },
            deployment_tls,
            ingress_addr,
            admin_addr,
            ingress_endpoint,
        })
    }
}

/// The metadata tables another node changed, reloaded into what this node keeps in memory.
struct MetaTables {
    registry: Arc<Registry>,
    rules: Arc<Rules>,
    plugins: Arc<Plugins>,
    kafka: Arc<Kafka>,
}

impl MetaTables {
    /// Reloads each group of `tables` once, whichever of its tables came.
    fn reload(&self, tables: &[&str]) {
        use sluice_store::schema::MetaGroup;
        let mut groups: Vec<MetaGroup> = Vec::new();
        for (_, group) in tables
            .iter()
            .filter_map(|t| sluice_store::schema::meta_table(t))
        {
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        let mut reloaded = Ok(());
        for group in groups {
            reloaded = reloaded.and(match group {
                MetaGroup::Registry => self.registry.reload(),
                MetaGroup::Rules => self.rules.reload(),
                MetaGroup::Plugins => self.plugins.reload_saved(),
                MetaGroup::Kafka => self.kafka.reload(),
                // Read from the store when asked: nothing to reload.
                MetaGroup::Operations => Ok(()),
            });
        }
        if let Err(e) = reloaded {
            tracing::error!(error.code = ?e.code, error = %e, "cannot reload metadata changed by the cluster");
        }
    }
}

/// What the upkeep services add for the admin API: the metrics recorder (when on) and the flow
/// charts' history (when kept).
struct Upkeep {
    metrics: Option<Arc<sluice_admin::scrape::Metrics>>,
    history: Option<Arc<sluice_admin::flow_history::FlowHistory>>,
}

/// Adds the background services that keep things up: the metrics' upkeep, the Kafka
/// subscriptions, the flow charts' samples.
fn add_upkeep(
    server: &mut Server,
    config: &Config,
    kafka: &Arc<Kafka>,
    runtime: &Runtime,
) -> Result<Upkeep, CodedError> {
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
    server.add_service(background_service("kafka", KafkaService(Arc::clone(kafka))));
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
    Ok(Upkeep { metrics, history })
}

/// Adds the partitions, the cluster (Kafka mode) and the ingress; the ingress's state (what
/// the drain waits on).
fn add_partitions_and_ingress(
    server: &mut Server,
    core: &Core,
    node: &Node,
    receivers: Receivers,
    plugins: &Arc<Plugins>,
    listeners: IngressListeners,
) -> Result<Arc<IngressState>, CodedError> {
    let config = &core.config;
    let ingress_state = Arc::new(IngressState {
        in_flight: Arc::default(),
        health: Arc::clone(core.store.health()),
        registry: Arc::clone(&core.registry),
        runtime: core.runtime.clone(),
        config: Arc::clone(config),
        plugins: Arc::clone(plugins),
        forwarder: sluice_runtime::replication::relay::Peers::new(),
        api_keys: sluice_ingress::api_keys::ApiKeys::from_config(&config.ingress)?,
        relayed: sluice_ingress::forward::relayed_clients(&config.ingress.connections),
    });
    server.add_service(background_service(
        "partitions",
        PartitionsService::new(
            node.clone(),
            receivers,
            core.cluster.as_ref().map(|cluster| cluster.leads()),
        ),
    ));
    if let Some(cluster) = &core.cluster {
        server.add_service(background_service(
            "cluster",
            crate::services::ClusterService(Arc::clone(cluster)),
        ));
    }
    let addr = listeners.addr;
    let ingress = IngressService::new(
        IngressApp::new(Arc::clone(&ingress_state)),
        listeners.sockets,
        Arc::clone(&core.shards),
        config.ingress.connections.clone(),
        listeners.tls,
    )
    .map_err(|e| bind_error("ingress", addr, "ingress.bind / --ingress-bind", &e))?;
    server.add_service(ingress);
    Ok(ingress_state)
}

/// Adds the admin API (telling clients the ingress is at `ingress_endpoint`); what tells the
/// drain it stopped.
fn add_admin(
    server: &mut Server,
    core: &Core,
    node: &Node,
    listener: AdminListener,
    ingress_endpoint: String,
    (upkeep, plugins, kafka): (Upkeep, Arc<Plugins>, Arc<Kafka>),
) -> watch::Receiver<bool> {
    let (done_tx, done_rx) = watch::channel(false);
    let state = AdminState::new(node, ingress_endpoint, plugins, kafka)
        .with_auth(listener.auth)
        .with_metrics(upkeep.metrics)
        .with_history(upkeep.history)
        .with_cluster(
            core.cluster
                .clone()
                .map(|cluster| cluster as Arc<dyn admin::ClusterReport>),
        );
    let router = admin::router(Arc::new(state));
    server.add_service(background_service(
        "admin",
        AdminService::new(
            listener.socket,
            router,
            core.config.admin.connections.clone(),
            done_tx,
        )
        .with_tls(listener.tls),
    ));
    done_rx
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
