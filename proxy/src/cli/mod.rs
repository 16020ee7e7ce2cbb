//! Command-line interface: `serve` and the admin subcommands. `main.rs` parses; this runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use sluice_cli::{
    explain, invocations, plugins, queues, registry, rules, sql, subscriptions, weights,
};
use sluice_config::{self as config, Overrides};
use sluice_core::errors::{Code, CodedError};

/// Ingress proxy with flow control and a durable runtime for Restate-SDK deployments.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: ingress and admin listeners over the store in `data-dir`.
    Serve(ServeArgs),
    /// Print what an error code means (e.g. `sluice explain RT0024`).
    Explain(explain::ExplainArgs),
    /// Register, list, describe and remove deployments (admin API client).
    Deployments {
        /// What to do.
        #[command(subcommand)]
        command: registry::DeploymentsCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// List and describe invocations (admin API client).
    Invocations {
        /// What to do.
        #[command(subcommand)]
        command: invocations::InvocationsCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// Set, list, disable, enable and delete flow-control rules (admin API client).
    Rules {
        /// What to do.
        #[command(subcommand)]
        command: rules::RulesCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// List, set and unset weight overrides: a counter's share under contention, beating its
    /// rule's weight (admin API client).
    Weights {
        /// What to do.
        #[command(subcommand)]
        command: weights::WeightsCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// List, pause and resume scheduler queues (admin API client).
    Queues {
        /// What to do.
        #[command(subcommand)]
        command: queues::QueuesCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// Load, hot-swap, list and unload policy plugins (admin API client).
    Plugins {
        /// What to do.
        #[command(subcommand)]
        command: plugins::PluginsCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// Create, list, describe and delete Kafka subscriptions (admin API client).
    Subscriptions {
        /// What to do.
        #[command(subcommand)]
        command: subscriptions::SubscriptionsCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
    /// Run SQL over the system tables (`POST /query`), e.g. `sluice sql "SELECT * FROM sys_user_limits"`.
    Sql(sql::SqlArgs),
    /// List and describe services (admin API client).
    Services {
        /// What to do.
        #[command(subcommand)]
        command: registry::ServicesCommand,
        /// Admin URL and output format.
        #[command(flatten)]
        admin: registry::AdminArgs,
    },
}

/// Flags of `sluice serve`; each is also a config key (and so an environment variable).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of the store (`data-dir`, `SERVICE_DATA_DIR`).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Ingress listen address (`ingress.bind`, `SERVICE_INGRESS__BIND`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub ingress_bind: Option<String>,
    /// Admin listen address (`admin.bind`, `SERVICE_ADMIN__BIND`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub admin_bind: Option<String>,
    /// `human` or `json` (`log-format`, `SERVICE_LOG_FORMAT`).
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub dump_config: bool,
}

/// Runs a parsed command line; the exit code says how it went.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => report(serve(args)),
        Command::Explain(args) => report(explain::run(&args)),
        Command::Deployments { command, admin } => {
            report(block_on(registry::deployments(&command, &admin)))
        }
        Command::Services { command, admin } => {
            report(block_on(registry::services(&command, &admin)))
        }
        Command::Invocations { command, admin } => {
            report(block_on(invocations::run(&command, &admin)))
        }
        Command::Rules { command, admin } => report(block_on(rules::run(&command, &admin))),
        Command::Plugins { command, admin } => report(block_on(plugins::run(&command, &admin))),
        Command::Queues { command, admin } => report(block_on(queues::run(&command, &admin))),
        Command::Weights { command, admin } => report(block_on(weights::run(&command, &admin))),
        Command::Sql(args) => report(block_on(sql::run(&args))),
        Command::Subscriptions { command, admin } => {
            report(block_on(subscriptions::run(&command, &admin)))
        }
    }
}

/// Admin commands are one request or two: a current-thread runtime is plenty.
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

fn serve(args: ServeArgs) -> Result<(), CodedError> {
    let overrides = Overrides {
        data_dir: args.data_dir,
        ingress_bind: args.ingress_bind,
        admin_bind: args.admin_bind,
        log_format: args.log_format,
    };
    let config = config::load(args.config.as_deref(), std::env::vars(), &overrides)?;
    if args.dump_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    let clock_offset = match std::env::var(sluice_core::clock::OFFSET_ENV) {
        Ok(text) => {
            sluice_core::clock::parse_offset(&text).map_err(|e| CodedError::new(Code::RT0002, e))?
        }
        Err(std::env::VarError::NotPresent) => 0,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(CodedError::new(
                Code::RT0002,
                format!("{} is not UTF-8 text", sluice_core::clock::OFFSET_ENV),
            ));
        }
    };
    crate::logging::init(config.log_format, &config.log_level);
    if clock_offset != 0 {
        // Before anything reads the clock: stored times, windows and timers all follow it.
        sluice_core::clock::set_offset_ms(clock_offset);
        tracing::warn!(
            offset_ms = clock_offset,
            "the wall clock is moved by {} ({clock_offset} ms): every stored and compared time follows it",
            sluice_core::clock::OFFSET_ENV
        );
    }
    crate::server::serve(config)
}

/// One line on stderr; exit 2 for configuration errors (like a usage error), 1 otherwise.
fn report(result: Result<(), CodedError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            if err.code == Some(Code::RT0002) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
