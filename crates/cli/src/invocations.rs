//! `sluice invocations …`

use clap::Subcommand;
use reqwest::Method;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::invocations::{
    BulkCancelRequest, BulkCancelResponse, InvocationResponse, ListInvocationsResponse,
    RestartAsNewResponse, WaitingResponse,
};
use sluice_core::errors::CodedError;

/// `sluice invocations …`
#[derive(Debug, Subcommand)]
pub enum InvocationsCommand {
    /// List invocations, newest first.
    List {
        /// Only this status (pending, scheduled, running, suspended, backing-off, paused, completed).
        #[arg(long)]
        status: Option<String>,
        /// Only this service.
        #[arg(long)]
        service: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one invocation.
    Describe {
        /// `inv_1…`
        id: String,
    },
    /// Cancel: the handler sees a terminal 409 "canceled" at its next await.
    Cancel {
        /// `inv_1…`
        id: String,
    },
    /// Kill: end it now; its caller gets 409 "killed".
    Kill {
        /// `inv_1…`
        id: String,
    },
    /// Purge a completed invocation: its record and journal are deleted.
    Purge {
        /// `inv_1…`
        id: String,
    },
    /// Purge a completed invocation's journal; its record and result stay.
    PurgeJournal {
        /// `inv_1…`
        id: String,
    },
    /// Start a completed invocation again as a new one: same target, input, scope and limit
    /// key, a new id (printed).
    RestartAsNew {
        /// `inv_1…`
        id: String,
        /// Keep journal entries up to this index (and their completions); 0 keeps the input.
        #[arg(long)]
        from: Option<u32>,
        /// With --from: `latest`, `keep` or a deployment id.
        #[arg(long)]
        deployment: Option<String>,
    },
    /// Pause: no more attempts until resumed.
    Pause {
        /// `inv_1…`
        id: String,
    },
    /// Resume a paused (or backing-off) invocation now.
    Resume {
        /// `inv_1…`
        id: String,
    },
    /// Cancel by filter what waits (pending), is delayed (scheduled) or is suspended: never
    /// started ones complete with 409 FLO0006 unrun, suspended ones get the cancel signal.
    /// Needs --scope or --service; each run is recorded in `sys_bulk_cancels`.
    BulkCancel {
        /// Only this scope.
        #[arg(long)]
        scope: Option<String>,
        /// Only this limit key or keys under it (needs --scope).
        #[arg(long)]
        limit_key: Option<String>,
        /// Only this service.
        #[arg(long)]
        service: Option<String>,
        /// Only this handler.
        #[arg(long)]
        handler: Option<String>,
        /// Only those created at or after (RFC 3339, or ms since the epoch).
        #[arg(long)]
        created_after: Option<String>,
        /// Only those created before (RFC 3339, or ms since the epoch).
        #[arg(long)]
        created_before: Option<String>,
        /// Only these statuses (pending, scheduled, suspended; repeat or comma-separate).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        /// Count what it names; cancel nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

impl InvocationsCommand {
    /// The control operation and its invocation, for the commands that are one.
    fn control(&self) -> Option<(&'static str, &str)> {
        Some(match self {
            Self::Cancel { id } => ("cancel", id),
            Self::Kill { id } => ("kill", id),
            Self::Purge { id } => ("purge", id),
            Self::PurgeJournal { id } => ("purge-journal", id),
            Self::Pause { id } => ("pause", id),
            Self::Resume { id } => ("resume", id),
            Self::List { .. }
            | Self::Describe { .. }
            | Self::RestartAsNew { .. }
            | Self::BulkCancel { .. } => return None,
        })
    }
}

/// Why a queued invocation waits, on one line: its queue's state and what holds it, its
/// place in line, and when it should start.
fn waiting_line(w: &WaitingResponse) -> String {
    let mut line = w.status.clone();
    if let Some(on) = &w.blocked_on {
        line.push_str(&format!(" on {on}"));
        if let Some(rule) = &w.rule {
            line.push_str(&format!(" (rule '{rule}')"));
        }
    }
    if let Some(position) = w.position {
        line.push_str(&format!(", position {position} of {}", w.queued));
    }
    match (w.eta_ms, w.drain_per_second) {
        (Some(ms), Some(rate)) => {
            line.push_str(&format!(", ETA {:.1} s at {rate:.1}/s", ms as f64 / 1000.0))
        }
        _ => line.push_str(", no ETA yet (its queue has not started two)"),
    }
    line
}

/// Runs an invocations command.
pub async fn run(cmd: &InvocationsCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    if let Some((op, id)) = cmd.control() {
        admin
            .call(
                Method::PATCH,
                &format!("/invocations/{id}/{op}"),
                None::<&()>,
            )
            .await?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"invocation_id": id, "operation": op})
            );
        } else {
            println!("{op}: {id}");
        }
        return Ok(());
    }
    let answer = ask(&admin, cmd).await?;
    if args.json {
        table::print_json(&answer.json);
        return Ok(());
    }
    match cmd {
        InvocationsCommand::List { .. } => {
            let list: ListInvocationsResponse = answer.parse()?;
            let rows: Vec<Vec<String>> = list
                .invocations
                .iter()
                .map(|i| {
                    vec![
                        i.id.clone(),
                        i.target.clone(),
                        i.status.clone(),
                        i.attempts.to_string(),
                        i.last_failure_error_code.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(&["ID", "TARGET", "STATUS", "ATTEMPTS", "LAST ERROR"], &rows)
            );
        }
        InvocationsCommand::Describe { .. } => print_described(&answer.parse()?),
        InvocationsCommand::RestartAsNew { id, .. } => {
            let restarted: RestartAsNewResponse = answer.parse()?;
            println!("restarted {id} as {}", restarted.new_invocation_id);
        }
        InvocationsCommand::BulkCancel { .. } => {
            let done: BulkCancelResponse = answer.parse()?;
            match &done.id {
                Some(id) => println!(
                    "{id}: canceled {} of {} named invocations",
                    done.cancelled, done.named
                ),
                None => println!("dry run: {} invocations named", done.named),
            }
        }
        _ => unreachable!("control commands returned above"),
    }
    Ok(())
}

/// Asks the admin API what `cmd` (a list, a description, a restart or a bulk cancel) asks.
async fn ask(
    admin: &AdminClient,
    cmd: &InvocationsCommand,
) -> Result<crate::client::Answer, CodedError> {
    Ok(match cmd {
        InvocationsCommand::List {
            status,
            service,
            limit,
        } => {
            let mut query: Vec<String> = vec![format!("limit={limit}")];
            query.extend(status.iter().map(|s| format!("status={s}")));
            query.extend(service.iter().map(|s| format!("service={s}")));
            admin
                .call(
                    Method::GET,
                    &format!("/invocations?{}", query.join("&")),
                    None::<&()>,
                )
                .await?
        }
        InvocationsCommand::Describe { id } => {
            admin
                .call(Method::GET, &format!("/invocations/{id}"), None::<&()>)
                .await?
        }
        InvocationsCommand::RestartAsNew {
            id,
            from,
            deployment,
        } => {
            let mut query: Vec<String> = from.iter().map(|f| format!("from={f}")).collect();
            query.extend(deployment.iter().map(|d| format!("deployment={d}")));
            admin
                .call(
                    Method::PATCH,
                    &format!("/invocations/{id}/restart-as-new?{}", query.join("&")),
                    None::<&()>,
                )
                .await?
        }
        InvocationsCommand::BulkCancel {
            scope,
            limit_key,
            service,
            handler,
            created_after,
            created_before,
            status,
            dry_run,
        } => {
            let request = BulkCancelRequest {
                scope: scope.clone(),
                limit_key: limit_key.clone(),
                service: service.clone(),
                handler: handler.clone(),
                created_after: created_after.clone(),
                created_before: created_before.clone(),
                statuses: (!status.is_empty()).then(|| status.clone()),
                dry_run: *dry_run,
            };
            admin
                .call(Method::POST, "/invocations/bulk-cancel", Some(&request))
                .await?
        }
        _ => unreachable!("control commands are not asked this way"),
    })
}

/// Prints an invocation's description, a field a line.
fn print_described(i: &InvocationResponse) {
    println!("id:          {}", i.id);
    println!("target:      {}", i.target);
    println!("status:      {}", i.status);
    println!(
        "attempts:    {} (retry count {})",
        i.attempts, i.retry_count
    );
    if let Some(d) = &i.deployment_id {
        println!(
            "deployment:  {d} (protocol V{})",
            i.protocol_version.unwrap_or_default()
        );
    }
    if let Some(f) = &i.last_failure {
        println!(
            "last error:  [{}] {f}",
            i.last_failure_error_code.as_deref().unwrap_or("-")
        );
    }
    if let Some(c) = &i.completion {
        println!("completion:  {c}");
    }
    println!("created:     {}", i.created_at);
    if let Some(w) = &i.waiting {
        println!("waiting:     {}", waiting_line(w));
    }
}
