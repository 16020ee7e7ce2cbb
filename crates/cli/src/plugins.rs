//! `sluice plugins …`

use std::path::PathBuf;

use clap::Subcommand;
use reqwest::Method;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::plugins::{ListPluginsResponse, PluginResponse};
use sluice_core::errors::CodedError;

/// `sluice plugins …`
#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// List loaded plugins in the order they run, with their calls, errors and latency.
    List,
    /// Load a plugin (a wasm component), or hot-swap the one of that name.
    Load {
        /// Its name.
        name: String,
        /// The `.wasm` file.
        file: PathBuf,
        /// `extract` or `match-rule`.
        #[arg(long)]
        hook: String,
        /// `fail` (refuse the request, 503) or `skip` (pass it through) when the plugin fails.
        #[arg(long)]
        on_error: Option<String>,
        /// Longest one call may run, e.g. `10ms`.
        #[arg(long)]
        deadline: Option<String>,
        /// Memory cap, e.g. `16 MiB`.
        #[arg(long)]
        memory_limit: Option<String>,
        /// Fuel per call.
        #[arg(long)]
        fuel: Option<u64>,
        /// Let an extract plugin see the caller's `x-sluice-api-key` and `authorization`
        /// headers (a plugin that verifies a bearer token needs them).
        #[arg(long)]
        credentials: bool,
        /// A config entry the plugin reads, `key=value`; repeat for more.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
    },
    /// Unload a plugin loaded through the admin API.
    Unload {
        /// Its name.
        name: String,
    },
}

fn query(cmd: &PluginsCommand) -> Result<String, CodedError> {
    let PluginsCommand::Load {
        hook,
        on_error,
        deadline,
        memory_limit,
        fuel,
        credentials,
        config,
        ..
    } = cmd
    else {
        return Ok(String::new());
    };
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("hook", hook);
    if let Some(v) = on_error {
        query.append_pair("on-error", v);
    }
    if let Some(v) = deadline {
        query.append_pair("deadline", v);
    }
    if let Some(v) = memory_limit {
        query.append_pair("memory-limit", v);
    }
    if let Some(v) = fuel {
        query.append_pair("fuel", &v.to_string());
    }
    if *credentials {
        query.append_pair("credentials", "true");
    }
    for entry in config {
        let (key, value) = entry.split_once('=').ok_or_else(|| {
            CodedError::uncoded(format!("--config '{entry}': write it as key=value"))
        })?;
        query.append_pair(&format!("config.{key}"), value);
    }
    Ok(query.finish())
}

fn row(p: &PluginResponse) -> Vec<String> {
    vec![
        p.name.clone(),
        p.hook.clone(),
        p.on_error.clone(),
        p.sha256.chars().take(12).collect(),
        p.metrics.calls.to_string(),
        p.metrics.errors.to_string(),
        format!("{}/{}", p.metrics.p50_us, p.metrics.p99_us),
    ]
}

const HEADER: [&str; 7] = [
    "NAME",
    "HOOK",
    "ON-ERROR",
    "SHA256",
    "CALLS",
    "ERRORS",
    "P50/P99 µs",
];

/// Runs a plugins command.
pub async fn run(cmd: &PluginsCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    let answer = match cmd {
        PluginsCommand::List => admin.call(Method::GET, "/plugins", None::<&()>).await?,
        PluginsCommand::Load { name, file, .. } => {
            let bytes = std::fs::read(file)
                .map_err(|e| CodedError::uncoded(format!("cannot read {}: {e}", file.display())))?;
            let path = format!("/plugins/{name}?{}", query(cmd)?);
            admin
                .call_bytes(Method::PUT, &path, bytes, "application/wasm")
                .await?
        }
        PluginsCommand::Unload { name } => {
            admin
                .call(Method::DELETE, &format!("/plugins/{name}"), None::<&()>)
                .await?
        }
    };
    if args.json {
        let json = match cmd {
            PluginsCommand::Unload { name } => serde_json::json!({"unloaded": name}),
            _ => answer.json,
        };
        table::print_json(&json);
        return Ok(());
    }
    match cmd {
        PluginsCommand::List => {
            let list: ListPluginsResponse = answer.parse()?;
            let rows: Vec<_> = list.plugins.iter().map(row).collect();
            print!("{}", table::render(&HEADER, &rows));
        }
        PluginsCommand::Load { .. } => {
            let plugin: PluginResponse = answer.parse()?;
            println!(
                "loaded {} ({}) sha256 {}",
                plugin.name, plugin.hook, plugin.sha256
            );
        }
        PluginsCommand::Unload { name } => println!("unloaded {name}"),
    }
    Ok(())
}
