//! `sluice queues …`: the schedulers' queues, and pausing or resuming one.

use clap::Subcommand;
use reqwest::Method;

use crate::client::AdminClient;
use crate::registry::AdminArgs;
use crate::table;
use sluice_api::vqueues::{ListVQueuesResponse, VQueueResponse};
use sluice_core::errors::CodedError;

/// `sluice queues …`
#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// List live queues: scope, limit key, service, priority, status, waiting entries.
    List {
        /// Only queues of this scope.
        #[arg(long)]
        scope: Option<String>,
        /// Only queues in this status (`ready`, `blocked`, `paused`, …).
        #[arg(long)]
        status: Option<String>,
    },
    /// Pause a queue: it keeps its entries and starts none until resumed (stored).
    Pause {
        /// Its id, e.g. `vq_0_12` (from `sluice queues list`).
        id: String,
    },
    /// Resume a paused queue.
    Resume {
        /// Its id.
        id: String,
    },
}

fn row(q: &VQueueResponse) -> Vec<String> {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    vec![
        q.id.clone(),
        dash(&q.scope),
        dash(&q.limit_key),
        q.service.clone(),
        dash(&q.object_key),
        q.priority.to_string(),
        q.status.clone(),
        dash(&q.blocked_on),
        q.queued.to_string(),
        q.scheduled.to_string(),
    ]
}

const HEADER: [&str; 10] = [
    "ID",
    "SCOPE",
    "LIMIT KEY",
    "SERVICE",
    "OBJECT",
    "PRIORITY",
    "STATUS",
    "WAITING ON",
    "QUEUED",
    "SCHEDULED",
];

/// Runs a queues command.
pub async fn run(cmd: &QueuesCommand, args: &AdminArgs) -> Result<(), CodedError> {
    let admin = AdminClient::from_env(&args.admin_url);
    match cmd {
        QueuesCommand::List { scope, status } => {
            // The node picks the scope's queues (the busiest 1,000 of them); the status here.
            let path = match scope {
                Some(scope) => {
                    let mut query = url::form_urlencoded::Serializer::new(String::new());
                    format!("/vqueues?{}", query.append_pair("scope", scope).finish())
                }
                None => "/vqueues".to_owned(),
            };
            let answer = admin.call(Method::GET, &path, None::<&()>).await?;
            let mut list: ListVQueuesResponse = answer.parse()?;
            list.vqueues
                .retain(|q| status.as_ref().is_none_or(|s| q.status == *s));
            if args.json {
                table::print_json(&serde_json::json!({"vqueues": list.vqueues}));
            } else {
                let rows: Vec<_> = list.vqueues.iter().map(row).collect();
                print!("{}", table::render(&HEADER, &rows));
            }
        }
        QueuesCommand::Pause { id } | QueuesCommand::Resume { id } => {
            let pause = matches!(cmd, QueuesCommand::Pause { .. });
            let op = if pause { "pause" } else { "resume" };
            admin
                .call(Method::POST, &format!("/vqueues/{id}/{op}"), None::<&()>)
                .await?;
            let done = if pause { "paused" } else { "resumed" };
            if args.json {
                table::print_json(&serde_json::json!({"id": id, "status": done}));
            } else {
                println!("queue {id} {done}");
            }
        }
    }
    Ok(())
}
