//! `sluice deployments …` and `sluice services …`.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use crate::client::{AdminClient, Answer};
use crate::table;
use sluice_api::deployments::DeploymentResponse;
use sluice_api::deployments::{ListDeploymentsResponse, RegisterDeploymentResponse};
use sluice_api::services::ListServicesResponse;
use sluice_api::services::ServiceMetadata;
use sluice_core::errors::CodedError;

/// `sluice deployments …`
#[derive(Debug, Subcommand)]
pub enum DeploymentsCommand {
    /// Discover an SDK endpoint and register its services.
    Register {
        /// Base URI of the endpoint, e.g. http://127.0.0.1:9080/
        uri: String,
        /// Header sent with discovery and every invocation, `name=value` (repeatable).
        #[arg(long = "header", value_name = "NAME=VALUE")]
        headers: Vec<String>,
        /// Replace a deployment registered at the same URI; accept a service type change.
        #[arg(long)]
        force: bool,
        /// Accept a service type change only.
        #[arg(long)]
        breaking: bool,
        /// Talk HTTP/1.1 to the endpoint (request/response mode).
        #[arg(long = "use-http1.1")]
        use_http_11: bool,
        /// Discover and check without registering.
        #[arg(long)]
        dry_run: bool,
    },
    /// List deployments.
    List,
    /// Show one deployment with its services.
    Describe {
        /// `dp_…`
        id: String,
    },
    /// Remove a deployment.
    Remove {
        /// `dp_…`
        id: String,
        /// Remove even with invocations pinned to it.
        #[arg(long)]
        force: bool,
    },
}

/// `sluice services …`
#[derive(Debug, Subcommand)]
pub enum ServicesCommand {
    /// List services.
    List,
    /// Show one service with its handlers.
    Describe {
        /// Service name.
        name: String,
    },
}

/// Flags every admin command takes.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Admin API base URL.
    #[arg(long, global = true, env = "SLUICE_ADMIN_URL", default_value = super::client::DEFAULT_ADMIN_URL)]
    pub admin_url: String,
    /// Print the admin API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

fn client(args: &AdminArgs) -> AdminClient {
    AdminClient::from_env(&args.admin_url)
}

fn show(
    args: &AdminArgs,
    answer: &Answer,
    human: impl FnOnce(&Answer) -> Result<String, CodedError>,
) -> Result<(), CodedError> {
    if args.json {
        table::print_json(&answer.json);
    } else {
        print!("{}", human(answer)?);
    }
    Ok(())
}

fn parse_headers(raw: &[String]) -> Result<BTreeMap<String, String>, CodedError> {
    raw.iter()
        .map(|h| {
            h.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    CodedError::uncoded(format!("invalid --header '{h}': write it as name=value"))
                })
        })
        .collect()
}

fn services_table(services: &[ServiceMetadata]) -> String {
    let rows: Vec<Vec<String>> = services
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.ty.clone(),
                s.revision.to_string(),
                s.handlers.len().to_string(),
                s.deployment_id.clone(),
            ]
        })
        .collect();
    table::render(
        &["SERVICE", "TYPE", "REVISION", "HANDLERS", "DEPLOYMENT"],
        &rows,
    )
}

/// Runs a deployments command.
pub async fn deployments(cmd: &DeploymentsCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = client(args);
    match cmd {
        DeploymentsCommand::Register {
            uri,
            headers,
            force,
            breaking,
            use_http_11,
            dry_run,
        } => {
            let body = json!({
                "uri": uri,
                "additional_headers": parse_headers(headers)?,
                "force": force,
                "breaking": breaking,
                "use_http_11": use_http_11,
                "dry_run": dry_run,
            });
            let answer = admin
                .call(Method::POST, "/deployments", Some(&body))
                .await?;
            show(args, &answer, |a| {
                let r: RegisterDeploymentResponse = a.parse()?;
                let verb = match (a.status.as_u16(), dry_run) {
                    (_, true) => "would register",
                    (201, _) => "registered",
                    _ => "already registered",
                };
                Ok(format!(
                    "{verb} {} (protocol {}..{}, {})\n{}",
                    r.id,
                    r.min_protocol_version,
                    r.max_protocol_version,
                    r.sdk_version.as_deref().unwrap_or("unknown SDK"),
                    services_table(&r.services)
                ))
            })
        }
        DeploymentsCommand::List => {
            let answer = admin.call(Method::GET, "/deployments", None::<&()>).await?;
            show(args, &answer, |a| {
                let list: ListDeploymentsResponse = a.parse()?;
                let rows: Vec<Vec<String>> = list
                    .deployments
                    .iter()
                    .map(|d| {
                        let services: Vec<String> = d
                            .services
                            .iter()
                            .map(|s| format!("{}@{}", s.name, s.revision))
                            .collect();
                        vec![
                            d.id.clone(),
                            d.uri.clone().or_else(|| d.arn.clone()).unwrap_or_default(),
                            d.protocol_type.clone().unwrap_or_default(),
                            services.join(","),
                        ]
                    })
                    .collect();
                Ok(table::render(&["ID", "ADDRESS", "MODE", "SERVICES"], &rows))
            })
        }
        DeploymentsCommand::Describe { id } => {
            let answer = admin
                .call(Method::GET, &format!("/deployments/{id}"), None::<&()>)
                .await?;
            show(args, &answer, |a| {
                let d: DeploymentResponse<ServiceMetadata> = a.parse()?;
                Ok(format!(
                    "id:        {}\naddress:   {}\nmode:      {} over {}\nprotocol:  {}..{}\nsdk:       {}\ncreated:   {}\n\n{}",
                    d.id,
                    d.uri.clone().or(d.arn.clone()).unwrap_or_default(),
                    d.protocol_type.unwrap_or_default(),
                    d.http_version.unwrap_or_default(),
                    d.min_protocol_version,
                    d.max_protocol_version,
                    d.sdk_version.unwrap_or_default(),
                    d.created_at,
                    services_table(&d.services)
                ))
            })
        }
        DeploymentsCommand::Remove { id, force } => {
            let answer = admin
                .call(
                    Method::DELETE,
                    &format!("/deployments/{id}?force={force}"),
                    None::<&()>,
                )
                .await?;
            show(args, &answer, |_| Ok(format!("removed {id}\n")))
        }
    }
}

/// Runs a services command.
pub async fn services(cmd: &ServicesCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = client(args);
    match cmd {
        ServicesCommand::List => {
            let answer = admin.call(Method::GET, "/services", None::<&()>).await?;
            show(args, &answer, |a| {
                let list: ListServicesResponse = a.parse()?;
                Ok(services_table(&list.services))
            })
        }
        ServicesCommand::Describe { name } => {
            let answer = admin
                .call(Method::GET, &format!("/services/{name}"), None::<&()>)
                .await?;
            show(args, &answer, |a| {
                let s: ServiceMetadata = a.parse()?;
                let rows: Vec<Vec<String>> = s
                    .handlers
                    .iter()
                    .map(|h| {
                        vec![
                            h.name.clone(),
                            h.ty.clone().unwrap_or_else(|| "-".to_owned()),
                            h.input_description.clone(),
                            h.output_description.clone(),
                            h.public.to_string(),
                        ]
                    })
                    .collect();
                Ok(format!(
                    "{} ({}, revision {}, deployment {})\n\n{}",
                    s.name,
                    s.ty,
                    s.revision,
                    s.deployment_id,
                    table::render(&["HANDLER", "TYPE", "INPUT", "OUTPUT", "PUBLIC"], &rows)
                ))
            })
        }
    }
}
